#!/bin/sh
# train_epilogues.sh NTPC PYTHON — the backward's cuBLASLt epilogues (DGELU, DGELU_BGRAD, BGRADA,
# BGRADB) fire in `ntpc train --backend cuda` on the emulated GPU, and training equals the CPU
# run's: Linear -> GELU -> Linear with biases (tests/emu/models/train_epilogues.ntp) unsharded,
# at 2 ranks (the mlp's up projection column-wise, its down projection row-wise: a backward GEMM
# then reads a gradient after an all-reduce) on one GPU and through NCCL, in fp32 (losses and
# parameters within 1e-5, as emu.train) and bf16 (as emu.train: 1e-3, 5e-2 of at least 0.05;
# DGELU is not fused in bf16: it would skip the product's rounding); and a model where the GELU's
# gradient is a sum of two GEMMs, so that no DGELU may fire. The counts come from the NTP_VERBOSE
# line of the backend ("cuBLASLt: ... epilogues: NONE n BIAS n ...").
# Run by CTest with the emulator's environment (tests/emu/CMakeLists.txt).
set -u
ntpc=$1 py=$2
tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
here=$(dirname "$0")
fail=0
. "$here/train_data.sh" # the token file and the options every run shares

NTP_VERBOSE=1 # the backend prints its GEMMs: "cuBLASLt: ... epilogues: NONE n BIAS n ..."
export NTP_VERBOSE
shown=/^cuBLASLt:/p
. "$here/train_runs.sh" # train NAME ARGS..., same REF NAME LOSS_TOL PARAM_TOL [FLOOR]

# epilogues NAME EPILOGUE OP COUNT...: the run's GEMMs with that epilogue compare so (-ge 1, -eq 0)
epilogues() {
  name=$1
  shift
  while [ $# -ge 3 ]; do
    n=$(sed -n "s/^cuBLASLt:.* epilogues:.* $1 \([0-9]*\).*/\1/p" "$tmp/$name.out")
    if [ -z "$n" ] || ! [ "$n" "$2" "$3" ]; then
      echo "[FAIL] $name: ${n:-no} GEMMs with epilogue $1, expected $2 $3"
      fail=1
    fi
    shift 3
  done
}

m=tests/emu/models/train_epilogues.ntp
tp2="--plan tests/plans/train_epilogues_tp2.ntp"
train cpu $m
train cuda1 $m --backend cuda && same cpu cuda1 1e-5 1e-5
epilogues cuda1 DGELU_BGRAD -ge 1 BGRADA -ge 1 BGRADB -ge 1 GELU -eq 0 GELU_BIAS -eq 0
train loop2 $m $tp2 --backend cuda --loopback && same cpu loop2 1e-5 1e-5
epilogues loop2 DGELU -ge 1 BGRADA -ge 1 BGRADB -ge 1
train nccl2 $m $tp2 --backend cuda && same cpu nccl2 1e-5 1e-5
epilogues nccl2 DGELU -ge 1 BGRADA -ge 1 BGRADB -ge 1

# bf16: the same model; the bias gradients keep the unfused steps' rounding points, DGELU would not
sed 's/fp32/bf16/g; s/model train_epilogues/model train_epilogues_bf16/' $m >"$tmp/bf16.ntp"
sed 's/for train_epilogues/for train_epilogues_bf16/' tests/plans/train_epilogues_tp2.ntp >"$tmp/bf16_tp2.ntp"
train bf16_cpu "$tmp/bf16.ntp"
train bf16_cuda1 "$tmp/bf16.ntp" --backend cuda && same bf16_cpu bf16_cuda1 1e-3 5e-2 0.05
epilogues bf16_cuda1 BGRADA -ge 1 BGRADB -ge 1 DGELU -eq 0 DGELU_BGRAD -eq 0
train bf16_loop2 "$tmp/bf16.ntp" --plan "$tmp/bf16_tp2.ntp" --backend cuda --loopback && same bf16_cpu bf16_loop2 1e-3 5e-2 0.05
epilogues bf16_loop2 BGRADA -ge 1 BGRADB -ge 1 DGELU -eq 0 DGELU_BGRAD -eq 0

# the GELU's gradient has two GEMMs behind it: no DGELU, the CPU run's results all the same
n=tests/emu/models/train_no_epilogue.ntp
train none_cpu $n
train none_cuda1 $n --backend cuda && same none_cpu none_cuda1 1e-5 1e-5
epilogues none_cuda1 DGELU -eq 0 DGELU_BGRAD -eq 0 BGRADA -ge 1

[ $fail = 0 ] && echo "train_epilogues.sh (emulated GPU): all checks passed"
exit $fail
