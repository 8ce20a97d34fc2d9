#!/usr/bin/env bash
# bench/cost_model_error.sh — the planner's cost model against the GPU: the predicted time of every
# layer (`ntpc plan --profile P --layer-times`) beside its measured device time (the runtime's
# per-layer CUDA events, NTP_CUDA_PROFILE=layers, through bench_model's direct driver: no CPU
# reference), and the median and largest relative error |predicted - measured| / measured.
#
#   bench/cost_model_error.sh       GPT-2 124M, B=8 S=1024, one GPU, a profile calibrated first
#
# A layer of the plan is the planner's: its kernels and the ops that follow it up to the next
# planned layer (a norm is priced with the layer before it), so each norm's measured time is
# added to the planned layer before it. Model-level steps are shown apart, not in the errors.
# Target (issue 15): median <= 10% with a calibrated profile.
#
# Environment: NTP_BENCH_PROFILE (a profile file; default: `ntpc calibrate` now, --quick on the
# emulated GPU or with NTP_BENCH_QUICK=1), NTP_BENCH_MODEL (examples/gpt2.ntp), NTP_BENCH_DEFS
# (-D options, default "-D B=8 -D S=1024"), NTP_BENCH_ITERS (forwards, default 3), NTP_BUILD_DIR,
# NTP_NO_BUILD=1. Exit status: 0 measured, or no GPU (a line says so); 1 a step failed; 2 build.
set -u
BENCH=cost_model_error
# shellcheck source=bench/bench_lib.sh
. "$(dirname "$0")/bench_lib.sh"
bench_probe
MODEL=${NTP_BENCH_MODEL:-examples/gpt2.ntp}
read -r -a DEFS <<<"${NTP_BENCH_DEFS:--D B=8 -D S=1024}"
ITERS=${NTP_BENCH_ITERS:-3}

PROF=${NTP_BENCH_PROFILE:-}
if [ -z "$PROF" ]; then
  PROF=$W/local.prof
  quick=()
  [ "$EMU" = 1 ] || [ "${NTP_BENCH_QUICK:-0}" = 1 ] && quick=(--quick)
  "$NTPC" calibrate "${quick[@]}" --gpus 1 -o "$PROF" >"$W/cal.log" 2>&1 || { cat "$W/cal.log" >&2; bench_fail "ntpc calibrate"; }
fi
"$NTPC" plan "$MODEL" "${DEFS[@]}" --world 1 --profile "$PROF" --layer-times "$W/pred.txt" -o "$W/plan.ntp" \
  --svg "$W/plan.svg" >"$W/plan.log" 2>&1 || { cat "$W/plan.log" >&2; bench_fail "ntpc plan --layer-times"; }
bench_build_direct "$W/bench_direct" || bench_fail "building the direct driver"
NTP_CUDA_PROFILE=layers "$W/bench_direct" --ntp "$MODEL" "${DEFS[@]}" --backend cuda --iters "$ITERS" >"$W/meas.txt" 2>&1 ||
  { cat "$W/meas.txt" >&2; bench_fail "the profiled forwards"; }

echo "== cost model error: $MODEL ${DEFS[*]}, one GPU; profile $(sed -n 's/^name //p' "$PROF") ($PROF)"
awk -v out="$W/rows" '
  FNR == 1 { file++ }
  file == 1 && $1 == "layer" { if ($2 == "(model)") { pmodel = $3; next } order[++np] = $2; pred[$2] = $3; planned[$2] = 1; next }
  file == 2 && $1 == "layer" {
    if ($2 == "(model)") { mmodel = $3; next }
    if ($2 in planned) cur = $2
    if (cur == "") pending += $3; else meas[cur] += $3 + pending
    if (cur != "") pending = 0
  }
  END {
    printf "layer|predicted|measured|error\n-|-|-|-\n" > out
    n = 0
    for (i = 1; i <= np; i++) {
      l = order[i]
      if (!(meas[l] > 0)) { printf "%s|%.4f ms|not measured|-\n", l, pred[l] * 1e3 >> out; continue }
      e = (pred[l] - meas[l]) / meas[l]; a = e < 0 ? -e : e
      err[++n] = a
      if (a > worst) { worst = a; wl = l }
      printf "%s|%.4f ms|%.4f ms|%+.1f%%\n", l, pred[l] * 1e3, meas[l] * 1e3, 100 * e >> out
    }
    printf "(model level)|%.4f ms|%.4f ms|not counted\n", pmodel * 1e3, mmodel * 1e3 >> out
    for (i = 2; i <= n; i++) for (j = i; j > 1 && err[j - 1] > err[j]; j--) { t = err[j]; err[j] = err[j - 1]; err[j - 1] = t }
    med = n == 0 ? 0 : n % 2 ? err[(n + 1) / 2] : (err[n / 2] + err[n / 2 + 1]) / 2
    if (n == 0) { print "no layer measured" > "/dev/stderr"; exit 1 }
    printf "cost model: median relative error %.1f%%, max %.1f%% (%s) over %d layers (target: median <= 10%%)\n", 100 * med, 100 * worst, wl, n
  }' "$W/pred.txt" "$W/meas.txt" >"$W/summary" || bench_fail "no layer measured (see $W/meas.txt)"
bench_table <"$W/rows"
cat "$W/summary"
exit 0
