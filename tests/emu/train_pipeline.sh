#!/bin/sh
# train_pipeline.sh NTPC PYTHON — pipelined training on the emulated GPU trains as the CPU does:
# byte_gpt in two stages (tp 2, then tp (1, 1)) with 4 micro-batches, under 1F1B, GPipe and ZB-H1
# with every rank on one GPU (loopback), 1F1B through NCCL (a GPU per rank: the stage boundary's
# activations and gradients as grouped send/recv), and with one process per rank (the launcher's
# RANK/LOCAL_RANK); each run's 3 losses and its trained parameters against the unsharded CPU run's
# (fp32: 1e-5). Run by CTest with the emulator's environment (tests/emu/CMakeLists.txt).
set -u
ntpc=$1 py=$2
tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
here=$(dirname "$0")
fail=0
. "$here/train_data.sh" # the token file and the options every run shares
. "$here/train_runs.sh" # train NAME ARGS..., same REF NAME LOSS_TOL PARAM_TOL [FLOOR]

gpt="examples/byte_gpt.ntp -D B=4 -D S=16 -D D=64 -D H=8"
pp="--plan tests/plans/byte_gpt_pp2.ntp --micro-batches 4"
train cpu $gpt || exit 1
for s in 1f1b gpipe zb-h1; do
  train "loop_$s" $gpt $pp --schedule $s --backend cuda --loopback && same cpu "loop_$s" 1e-5 1e-5
done
train nccl_1f1b $gpt $pp --backend cuda && same cpu nccl_1f1b 1e-5 1e-5

# one process per rank: each runs its own rank's steps of the schedule
r=0
while [ $r -lt 4 ]; do
  RANK=$r LOCAL_RANK=$r WORLD_SIZE=4 NTP_NCCL_ID_FILE="$tmp/id" \
    "$ntpc" train $gpt $pp --backend cuda --rank env $common --save-params "$tmp/procs.st" >"$tmp/proc.$r.out" 2>&1 &
  eval "pid_$r=\$!"
  r=$((r + 1))
done
r=0
while [ $r -lt 4 ]; do
  eval "p=\$pid_$r"
  if ! wait "$p"; then
    echo "[FAIL] the process of rank $r failed"
    cat "$tmp/proc.$r.out"
    fail=1
  fi
  rm -f /dev/shm/ntp-emu-nccl-"$p"-* /tmp/ntp-emu-nccl-"$p"-*
  r=$((r + 1))
done
if [ $fail = 0 ]; then # the processes' losses (rank 0's lines) and the parameters they saved
  grep '^step *[0-9]*/' "$tmp/proc.0.out" | sed 's/  [0-9]* tokens\/s$//' >"$tmp/procs.log"
  same cpu procs 1e-5 1e-5
fi
exit $fail
