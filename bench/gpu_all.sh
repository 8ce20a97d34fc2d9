#!/usr/bin/env bash
# bench/gpu_all.sh — every GPU benchmark in one prepared command, for a session with a few minutes
# of GPU time (tests/gpu/README.md):
#   1. ntpc calibrate: the local GPU's profile (kept: OUT/calibrated.prof);
#   2. bench/cost_model_error.sh with that profile: predicted against measured layer times;
#   3. bench/bench_gpt2_cuda.sh: GPT-2 124M forward (B=8 S=1024 bf16), NVRTC cold and warm,
#      ntp / PyTorch eager and ntp / torch.compile;
#   4. bench_kernels: GEMMs / bare cuBLASLt, fused kernels / copy bandwidth, host us per layer
#      with and without CUDA graphs;
# then the issue's targets beside what was measured. Each step's whole output is in OUT/STEP.log;
# a step that fails is reported and the others still run.
#
#   bench/gpu_all.sh            about 3-5 minutes on an H200 (a cold NVRTC cache: +1 min)
#   bench/gpu_all.sh --quick    toy dims and quick calibration (the emulated GPU's check, seconds)
#
# Environment: NTP_GPU_ALL_OUT (default build/gpu_all), NTP_GPU_ALL_TIMEOUT (seconds per step,
# default 420), NTP_BUILD_DIR, NTP_NO_BUILD=1, NTP_BENCH_PYTHON (an interpreter with torch).
# Exit status: 0 every step ran (or no GPU: one line says so); 1 a step failed; 2 build failure.
set -u
BENCH=gpu_all
QUICK=0
[ "${1:-}" = --quick ] && QUICK=1
# shellcheck source=bench/bench_lib.sh
. "$(dirname "$0")/bench_lib.sh"
bench_probe
OUT=${NTP_GPU_ALL_OUT:-$BUILD/gpu_all}
mkdir -p "$OUT" || exit 2
TO=${NTP_GPU_ALL_TIMEOUT:-420}
export NTP_NO_BUILD=1 NTP_BUILD_DIR=$BUILD # built once, above
failed=0
step() { # NAME COMMAND...: runs it, output to the screen and OUT/NAME.log
  local name=$1 rc
  shift
  echo
  echo "=================== $name"
  timeout "$TO" "$@" 2>&1 | tee "$OUT/$name.log"
  rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || { echo "gpu_all: step $name FAILED (exit $rc)"; failed=1; }
}

quick=()
if [ $QUICK = 1 ]; then
  quick=(--quick)
  export NTP_BENCH_DEFS="-D B=1 -D S=16 -D D=64 -D H=2 -D L=2 -D V=256"
  export NTP_BENCH_B=1 NTP_BENCH_S=16 NTP_BENCH_D=64 NTP_BENCH_H=2 NTP_BENCH_L=2 NTP_BENCH_V=256
  export NTP_BENCH_ITERS=1 NTP_BENCH_E2E_ITERS=1
fi
gpus=() # collectives over every visible GPU; on the emulated GPU over 2 of its 8
[ $EMU = 0 ] || gpus=(--gpus 2)
step calibrate "$NTPC" calibrate "${quick[@]}" "${gpus[@]}" -o "$OUT/calibrated.prof"
[ -f "$OUT/calibrated.prof" ] && export NTP_BENCH_PROFILE=$OUT/calibrated.prof
step cost_model bench/cost_model_error.sh
step gpt2 bench/bench_gpt2_cuda.sh
step kernels "$BUILD/bench/bench_kernels" "${quick[@]}"

# the issue's targets beside what was measured
get() { sed -n "s/^$1=//p" "$OUT/$2.log" 2>/dev/null | tail -1; }
row() { echo "$1|${2:-not measured}|$3"; }
echo
echo "=================== summary (logs and the profile in $OUT)"
{
  echo "target|measured|goal"
  echo "-|-|-"
  row "ntp / PyTorch eager" "$(sed -n 's/^ntp \/ PyTorch eager *| *\([^|]*\)|.*/\1/p' "$OUT/gpt2.log" | sed 's/ *$//')" "<= 0.70"
  row "ntp / torch.compile" "$(sed -n 's/^ntp \/ torch.compile *| *\([^|]*\)|.*/\1/p' "$OUT/gpt2.log" | sed 's/ *$//')" "<= 0.95"
  row "GEMMs / bare cuBLASLt (worst shape)" "$(get gemm_ratio_worst kernels)" ">= 0.98"
  row "layernorm / copy bandwidth" "$(get kernel_ratio_0 kernels)" ">= 0.85"
  row "elementwise / copy bandwidth" "$(get kernel_ratio_1 kernels)" ">= 0.85"
  row "host us per layer, graphs" "$(get host_us_per_layer_graphs kernels)" "<= 5"
  row "host us per layer, no graphs" "$(get host_us_per_layer_nographs kernels)" "(for comparison)"
  row "NVRTC whole model, cold" "$(sed -n 's/^create (NVRTC cache cold): \([0-9.]* ms\).*/\1/p' "$OUT/gpt2.log")" "< 2 s"
  row "NVRTC whole model, warm" "$(sed -n 's/.*; warm: \([0-9.]* ms\).*/\1/p' "$OUT/gpt2.log")" "< 20 ms"
  row "cost model median error" "$(sed -n 's/^cost model: median relative error \([0-9.]*%\).*/\1/p' "$OUT/cost_model.log")" "<= 10%"
} | bench_table
[ $QUICK = 0 ] || echo "(--quick: toy dims; the figures check the pipeline, not the targets)"
[ $EMU = 0 ] || echo "(emulated GPU: the numbers mean nothing)"
exit $failed
