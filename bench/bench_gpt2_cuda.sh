#!/usr/bin/env bash
# bench/bench_gpt2_cuda.sh — GPT-2 124M forward on one GPU: B=8, S=1024, bf16 storage.
#
#   bench/bench_gpt2_cuda.sh              about a minute on an H100/H200-class machine
#
# What it measures (none of it runs the CPU reference, which `ntpc run --backend cuda` always
# does — 2.3 TFLOP at ~2.5 GFLOP/s, some 15 minutes for this model at this size):
#   1. the model library: `ntpc examples/gpt2.ntp -o gpt2.so` (codegen + the C compiler);
#   2. model creation through the library's C ABI (bench/bench_model.c, dlopen), with an empty
#      NVRTC cache (NTP_CACHE_DIR = a new temporary directory: every rank's kernels compiled),
#      then again with that cache warm (CUBINs loaded from disk);
#   3. forwards through the C ABI, host clock: end to end, including the copy of the 411M
#      logits (823 MB of bf16) to the host and their conversion on every call;
#   4. forwards through the runtime directly (bench_model built with -DNTP_BENCH_DIRECT against
#      libntpc/libntprt): the device time of the forward (CUDA events around the step list, what
#      `ntpc run --backend cuda` prints), and TFLOP/s from it.
#   5. GPT-2 in PyTorch on the same GPU, dims and dtype (bench/bench_torch.py: eager, and
#      torch.compile): ntp's device time / theirs, both measured in this run; without torch (or
#      without CUDA for it) the rows say why.
# Parameters get synthetic values once (ntp_model_set_param / ntp_cuda_set), so the timed
# forwards do not re-run the initialisation kernels.
#
# FLOPs of one forward (GEMMs only; biases, norms, softmax, GELU and the embedding gather are
# not counted), T = B*S tokens:
#     FLOPs = 2*T*(L*12*D^2 + D*V)  +  4*B*S^2*D*L
# The first term is 2 * (matmul parameters) * tokens: per block Q, K, V, O (4*D^2) and the MLP
# (2*D*F = 8*D^2), plus the tied head (D*V). The second is attention: Q K^T and P V, 2*S*S*D
# each per sequence and block, counted dense (the causal mask would halve the useful part) —
# the usual convention, e.g. nanoGPT's estimate_mfu (6N + 12*L*D*S per token for training =
# 3 x this forward). GPT-2 124M at B=8, S=1024: 2.024e12 + 0.309e12 = 2.333e12 FLOPs.
#
# Environment: NTP_BENCH_ITERS (timed forwards for the device time, default 5); NTP_BENCH_PYTHON
# (the interpreter with torch; default build/pyenv/bin/python when it imports torch, else python3);
# NTP_BENCH_E2E_ITERS (timed forwards through the C ABI, default 3: each one moves the logits to
# the host, seconds at this size); NTP_BENCH_B, _S, _D, _H, _L, _V (the dims, default 8, 1024, 768,
# 12, 12, 50257); NTP_BUILD_DIR (default build); NTP_NO_BUILD=1; NTP_BENCH_TIMEOUT (seconds per
# step, default 300); NTP_BENCH_BACKEND=cpu runs the same steps on the CPU backend (a check of
# this script at toy dims; no GPU needed, nothing measured).
# Exit status: 0 measured (or no GPU: a line says so, nothing is measured), 1 a step failed,
# 2 build failure.
set -u
ITERS=${NTP_BENCH_ITERS:-5}
E2E_ITERS=${NTP_BENCH_E2E_ITERS:-3}
B=${NTP_BENCH_B:-8}
S=${NTP_BENCH_S:-1024}
D=${NTP_BENCH_D:-768} L=${NTP_BENCH_L:-12} V=${NTP_BENCH_V:-50257} H=${NTP_BENCH_H:-12}
BACKEND=${NTP_BENCH_BACKEND:-cuda}
DEFS=(-D "B=$B" -D "S=$S" -D "D=$D" -D "H=$H" -D "L=$L" -D "V=$V")
STEP_TIMEOUT=${NTP_BENCH_TIMEOUT:-300}
T_START=$(date +%s.%N)

# the build, the GPU probe, the work directory W (bench/bench_lib.sh)
BENCH=bench
# shellcheck source=bench/bench_lib.sh
. "$(dirname "$0")/bench_lib.sh"
[ "$BACKEND" != cuda ] || bench_probe

CACHE=$W/nvrtc-cache
mkdir -p "$CACHE"
fail() { bench_fail "$@"; }
kv() { bench_kv "$@"; }
elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }'; }

FLOPS=$(awk -v B="$B" -v S="$S" -v D="$D" -v L="$L" -v V="$V" \
  'BEGIN { T = B * S; printf "%.6e", 2 * T * (L * 12 * D * D + D * V) + 4 * B * S * S * D * L }')

gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>/dev/null | head -1)
echo "== GPT-2 forward: B=$B S=$S D=$D H=$H L=$L V=$V, bf16 storage, fp32 math; backend $BACKEND; GPU: ${gpu:-none}"
echo "== FLOPs per forward (GEMMs, attention dense): $FLOPS"

# 1. the model library and the drivers
t=$(date +%s.%N)
timeout "$STEP_TIMEOUT" "$NTPC" examples/gpt2.ntp "${DEFS[@]}" -o "$W/gpt2.so" >"$W/lib.log" 2>&1 ||
  { cat "$W/lib.log" >&2; fail "ntpc -o gpt2.so"; }
lib_s=$(elapsed "$t")
nk=$("$NTPC" examples/gpt2.ntp "${DEFS[@]}" --emit=cuda | grep -c '__global__')
src_kb=$("$NTPC" examples/gpt2.ntp "${DEFS[@]}" --emit=cuda | wc -c | awk '{ printf "%.0f", $1 / 1024 }')
echo "model library: ${lib_s}s ($nk kernels, ${src_kb} KiB of CUDA C for NVRTC)"

CC=${CC:-cc}
"$CC" -std=c17 -O2 -Iruntime bench/bench_model.c -ldl -lm -o "$W/bench_model" 2>"$W/cc.log" ||
  { cat "$W/cc.log" >&2; fail "compiling bench/bench_model.c"; }
direct=1
bench_build_direct "$W/bench_model_direct" 2>"$W/cc2.log" || {
  direct=0
  echo "note: the direct driver did not build (device time not measured):" >&2
  head -5 "$W/cc2.log" >&2
}

# 2. creation: cold NVRTC cache, then warm
export NTP_CACHE_DIR=$CACHE
timeout "$STEP_TIMEOUT" "$W/bench_model" "$W/gpt2.so" --backend "$BACKEND" --create-only >"$W/cold.log" 2>&1 || { cat "$W/cold.log" >&2; fail "create (cold cache)"; }
cold=$(kv create_ms "$W/cold.log")
ncubin=$(find "$CACHE" -name '*.cubin' | wc -l)
cubin_kb=$(du -sk "$CACHE" | awk '{ print $1 }')
timeout "$STEP_TIMEOUT" "$W/bench_model" "$W/gpt2.so" --backend "$BACKEND" --create-only >"$W/warm.log" 2>&1 || { cat "$W/warm.log" >&2; fail "create (warm cache)"; }
warm=$(kv create_ms "$W/warm.log")
echo "create (NVRTC cache cold): ${cold} ms; warm: ${warm} ms ($ncubin CUBINs, ${cubin_kb} KiB in the cache)"

# 3. forwards through the C ABI (end to end)
timeout "$STEP_TIMEOUT" "$W/bench_model" "$W/gpt2.so" --backend "$BACKEND" --iters "$E2E_ITERS" --flops "$FLOPS" >"$W/abi.log" 2>&1 ||
  { cat "$W/abi.log" >&2; fail "forwards through the C ABI"; }
grep '^summary' "$W/abi.log" | sed 's/^summary/C ABI/'
e2e=$(kv forward_e2e_ms_mean "$W/abi.log")
e2e_min=$(kv forward_e2e_ms_min "$W/abi.log")
setp=$(kv set_params_ms "$W/abi.log")
nparams=$(sed -n 's/^model [^:]*: [0-9]* ranks, \([0-9]*\) params.*/\1/p' "$W/abi.log")
bad_abi=$(kv nonfinite_outputs "$W/abi.log")

# 4. device time (direct)
dev="" dev_min="" tf="" tf_best="" call=""
if [ $direct = 1 ]; then
  timeout "$STEP_TIMEOUT" "$W/bench_model_direct" --ntp examples/gpt2.ntp "${DEFS[@]}" --backend "$BACKEND" --iters "$ITERS" \
    --flops "$FLOPS" >"$W/direct.log" 2>&1 || { cat "$W/direct.log" >&2; fail "forwards through the runtime (direct)"; }
  grep '^summary' "$W/direct.log" | sed 's/^summary/direct/'
  dev=$(kv forward_ms_mean "$W/direct.log")
  dev_min=$(kv forward_ms_min "$W/direct.log")
  call=$(kv forward_call_ms_mean "$W/direct.log")
  tf=$(kv tflops "$W/direct.log")
  tf_best=$(kv tflops_best "$W/direct.log")
fi
tf_e2e=$(awk -v f="$FLOPS" -v ms="$e2e" 'BEGIN { if (ms > 0) printf "%.2f", f / (ms * 1e-3) / 1e12 }')

# 5. PyTorch on the same GPU, same dims and dtype, in this run: eager and torch.compile
# (bench/bench_torch.py; the interpreter: NTP_BENCH_PYTHON, else build/pyenv's, else python3)
PY=${NTP_BENCH_PYTHON:-}
if [ -z "$PY" ]; then
  PY=python3
  [ -x "$BUILD/pyenv/bin/python" ] && "$BUILD/pyenv/bin/python" -c 'import torch' 2>/dev/null && PY=$BUILD/pyenv/bin/python
fi
eager="" compiled="" torch_why=""
if [ "$BACKEND" = cuda ]; then
  timeout "$STEP_TIMEOUT" "$PY" bench/bench_torch.py "${DEFS[@]}" --iters "$ITERS" >"$W/torch.log" 2>&1
  trc=$?
  eager=$(kv eager_ms "$W/torch.log")
  compiled=$(kv compile_ms "$W/torch.log")
  torch_why=$(kv torch_missing "$W/torch.log")
  [ $trc -eq 0 ] || [ -n "$torch_why" ] || torch_why="bench_torch.py exited $trc: $(tail -1 "$W/torch.log")"
  [ -n "$compiled" ] || [ -n "$torch_why" ] || torch_why=$(kv compile_missing "$W/torch.log")
else
  torch_why="backend $BACKEND: no GPU run to compare with"
fi
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0 && b > 0) printf "%.3f", a / b }'; }
r_eager=$(ratio "$dev" "$eager")
r_comp=$(ratio "$dev" "$compiled")

echo
{
  echo "measure|value|how"
  echo "-|-|-"
  echo "model library build|${lib_s} s|ntpc examples/gpt2.ntp -o gpt2.so (codegen + cc)"
  echo "create, NVRTC cache cold|${cold} ms|ntp_model_create, empty NTP_CACHE_DIR: compiles every kernel"
  echo "create, NVRTC cache warm|${warm} ms|ntp_model_create again: CUBINs read from the cache"
  echo "set parameters|${setp} ms|ntp_model_set_param x ${nparams:-?} (host conversion + upload)"
  if [ $direct = 1 ]; then
    echo "forward, device time|${dev} ms (min ${dev_min})|CUDA events around the step list, mean of $ITERS after a warm-up"
    echo "throughput|${tf} TFLOP/s (best ${tf_best})|$FLOPS FLOPs / device time"
    echo "forward, runtime call|${call} ms|ntp_cuda_forward on the host clock (outputs assembled on the host)"
  else
    echo "forward, device time|not measured|the direct driver did not build"
  fi
  echo "forward, C ABI end to end|${e2e} ms (min ${e2e_min})|ntp_model_forward on the host clock, logits copied out, mean of $E2E_ITERS"
  echo "throughput, end to end|${tf_e2e} TFLOP/s|$FLOPS FLOPs / end-to-end time"
  if [ -n "$r_eager" ]; then
    echo "ntp / PyTorch eager|${r_eager} (${dev} / ${eager} ms)|device times, same GPU and run; target <= 0.70"
  else
    echo "ntp / PyTorch eager|not measured|${torch_why:-no ntp device time}"
  fi
  if [ -n "$r_comp" ]; then
    echo "ntp / torch.compile|${r_comp} (${dev} / ${compiled} ms)|device times, same GPU and run; target <= 0.95"
  else
    echo "ntp / torch.compile|not measured|${torch_why:-$(kv compile_missing "$W/torch.log" 2>/dev/null)}"
  fi
} | awk -F'|' '
  { for (i = 1; i <= NF; i++) { c[NR, i] = $i; if (length($i) > w[i]) w[i] = length($i) } n = NR }
  END { for (r = 1; r <= n; r++) { l = ""
          for (i = 1; i <= 3; i++) { x = c[r, i]; if (r == 2) { x = ""; for (k = 0; k < w[i]; k++) x = x "-" }
                                     l = l (i > 1 ? " | " : "") sprintf("%-" w[i] "s", x) }
          sub(/ +$/, "", l); print l } }'
echo
echo "GEMMs against bare cuBLASLt, kernels against the copy bandwidth, host time per layer: bench/bench_kernels"
echo "(bench/gpu_all.sh runs every benchmark)"
[ "${bad_abi:-0}" = 0 ] || echo "WARNING: $bad_abi non-finite output values (synthetic parameters)"
echo "total $(elapsed "$T_START") s"
exit 0
