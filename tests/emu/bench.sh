#!/bin/sh
# bench.sh — the GPU benchmarks cannot rot: bench/gpu_all.sh --quick runs every one of them at toy
# dims on the emulated GPU (calibration, cost model error, GPT-2 forward with NVRTC cold and
# warm, the kernel ratios); then, with the emulator showing no GPU at all (NTP_EMU_GPUS=0), each
# script and bench_kernels prints its "no GPU" line and exits 0.
set -u
build=$1
fail() { echo "bench.sh: FAIL: $*" >&2; exit 1; }
out=$(mktemp -d) && trap 'rm -rf "$out"' EXIT
NTP_NO_BUILD=1 NTP_BUILD_DIR=$build NTP_GPU_ALL_OUT=$out bash bench/gpu_all.sh --quick >"$out/all.log" 2>&1 ||
  { tail -40 "$out/all.log" >&2; fail "gpu_all.sh --quick exited non-zero"; }
for row in "ntp / PyTorch eager" "GEMMs / bare cuBLASLt" "layernorm / copy bandwidth" "host us per layer, graphs" \
           "NVRTC whole model, warm" "cost model median error"; do
  grep -q "^$row" "$out/all.log" || fail "the summary lacks '$row'"
done
for row in "GEMMs / bare cuBLASLt" "layernorm / copy bandwidth" "host us per layer, graphs" "NVRTC whole model, warm" \
           "cost model median error"; do
  grep "^$row" "$out/all.log" | grep -q "not measured" && fail "'$row' was not measured on the emulated GPU"
done
export NTP_EMU_GPUS=0
for s in gpu_all.sh bench_gpt2_cuda.sh cost_model_error.sh; do
  NTP_NO_BUILD=1 NTP_BUILD_DIR=$build bash "bench/$s" >"$out/none.log" 2>&1
  rc=$?
  [ $rc -eq 0 ] || { cat "$out/none.log" >&2; fail "$s without a GPU: exit $rc"; }
  grep -q "no GPU: " "$out/none.log" || { cat "$out/none.log" >&2; fail "$s without a GPU: no 'no GPU' line"; }
done
"$build/bench/bench_kernels" >"$out/none.log" 2>&1
rc=$?
[ $rc -eq 0 ] || fail "bench_kernels without a GPU: exit $rc"
grep -q "^bench_kernels: no GPU: " "$out/none.log" || fail "bench_kernels without a GPU: no 'no GPU' line"
echo "bench.sh: ok"
