#!/bin/sh
# train.sh NTPC PYTHON — `ntpc train --backend cuda` on the emulated GPU trains as the CPU does:
# 3 AdamW steps of a small GPT (fp32) unsharded, at 7 ranks in groups (4, 3) on one GPU
# (loopback, twice: the same bits in the launch order and in step order; and checkpointed at
# step 2, resumed: the same bits), two replicas of 4 losing a GPU before step 2 (--fail-at; on
# one GPU, and through NCCL with its communicators aborted and shrunk, or created again), at 8
# ranks with every layer its own way through NCCL (its overlap line showing more collectives with
# compute in flight than step order, and the same bits in step order), and
# of a bf16 GPT at 7 ranks, pipeline stages losing a GPU (loopback and NCCL), a whole stage (the
# replica dropped) and two GPUs packed into one replica (NCCL: the world split into the plan's order), and with the distributed optimizer (ZeRO-2, redundancy 2) on one GPU and
# through NCCL losing a GPU; each step's loss and the trained parameters are compared with the CPU
# run's (fp32 within 1e-5; bf16: losses within 1e-3, parameters within 5e-2 of at least 0.05,
# the parameters' scale: bf16 activations make a gradient that is within their rounding step move
# an element either way, by up to lr a step). AdamW's eps is 1e-4 here: a gradient that is
# round-off on both sides (a key bias's) would otherwise be normalised to a full-size step of
# either sign. The update runs on the GPUs (ntp_cuda_adamw), on the host in the CPU run.
# Run by CTest with the emulator's environment (tests/emu/CMakeLists.txt).
set -u
ntpc=$1 py=$2
tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
here=$(dirname "$0")
fail=0
. "$here/train_data.sh" # the token file and the options every run shares

. "$here/train_runs.sh" # train NAME ARGS..., same REF NAME LOSS_TOL PARAM_TOL [FLOOR]

gpt="examples/byte_gpt.ntp -D B=2 -D S=16 -D D=64 -D H=8"
train cpu $gpt &&
  train cuda1 $gpt --backend cuda && same cpu cuda1 1e-5 1e-5
train cuda7 $gpt --plan examples/plans/byte_gpt_7.ntp --backend cuda --loopback && same cpu cuda7 1e-5 1e-5
# determinism and the launch order: no kernel uses atomics, and the launch order only swaps steps
# that share no byte one of them writes (runtime/cuda/launch_order.h), so a second run in step order
# on one stream (NTP_CUDA_OVERLAP=0) gives the same bits
same_in_step_order() { # REF AGAIN ARGS...: AGAIN is REF's run once more in step order, bit for bit
  ref=$1 again=$2
  shift 2
  export NTP_CUDA_OVERLAP=0
  if train "$again" "$@" >/dev/null; then
    if cmp -s "$tmp/$ref.st" "$tmp/$again.st" && cmp -s "$tmp/$ref.log" "$tmp/$again.log"; then
      echo "$ref: again in step order (NTP_CUDA_OVERLAP=0): the same losses and parameters, bit for bit"
    else
      echo "[FAIL] $ref: the run in step order differs from the reordered one"
      fail=1
    fi
  fi
  unset NTP_CUDA_OVERLAP
}
same_in_step_order cuda7 cuda7b $gpt --plan examples/plans/byte_gpt_7.ntp --backend cuda --loopback
# a checkpoint of the GPUs' state (each rank's slices come down and are written in place) at step 2,
# resumed to step 3 on the GPUs: the straight run's parameters, bit for bit (a constant learning
# rate: the schedule's length is --steps)
ckc="$(echo "$common" | sed 's/--steps 3//') --min-lr-frac 1"
rsc=$(echo "$ckc" | sed 's/--init-std [0-9.]*//') # the checkpoint holds the parameters
c7="$gpt --plan examples/plans/byte_gpt_7.ntp --backend cuda --loopback"
if "$ntpc" train $c7 $ckc --steps 3 --save-params "$tmp/straight.st" >"$tmp/ck.out" 2>&1 &&
  "$ntpc" train $c7 $ckc --steps 2 --checkpoint "$tmp/ck" >>"$tmp/ck.out" 2>&1 &&
  "$ntpc" train $c7 $rsc --steps 3 --resume "$tmp/ck" --save-params "$tmp/resumed.st" >>"$tmp/ck.out" 2>&1 &&
  cmp -s "$tmp/straight.st" "$tmp/resumed.st"; then
  echo "cuda7: saved at step 2 and resumed, the straight run's parameters bit for bit"
else
  echo "[FAIL] cuda7: the checkpointed run differs from the straight one"
  cat "$tmp/ck.out"
  fail=1
fi
# a GPU fails before step 2 (--fail-at, all ranks on one GPU): the survivors' program on the
# emulated GPU takes the state from the surviving replicas' device memory; the CPU run's losses
# and parameters
train fail7 $gpt --plan tests/plans/byte_gpt_two4.ntp --backend cuda --loopback --fail-at 2:3 && same cpu fail7 1e-5 1e-5
grep -q '(no checkpoint read)' "$tmp/fail7.out" || { echo "[FAIL] fail7: no hand-over from the surviving replicas"; fail=1; }
export NTP_VERBOSE=1 # the overlap line: the launch order puts compute in flight with more collectives
train nccl8 $gpt --plan examples/plans/byte_gpt_mixed8.ntp --backend cuda && same cpu nccl8 1e-5 1e-5
unset NTP_VERBOSE
grep '^overlap:' "$tmp/nccl8.out"
sed -n 's/^overlap: \([0-9]*\) collectives with a consumer, \([0-9]*\) with compute in flight (was \([0-9]*\)), \([0-9]*\) launches between them and their consumers (was \([0-9]*\)).*/\1 \2 \3 \4 \5/p' \
  "$tmp/nccl8.out" | { read -r n now was ln lw && [ "$now" -gt "$was" ] && [ "$ln" -gt "$lw" ]; } ||
  { echo "[FAIL] nccl8: no overlap line, or the launch order did not put compute in flight with more collectives"; fail=1; }
# ... and in step order on one stream: the same bits, through NCCL too
same_in_step_order nccl8 nccl8_inorder $gpt --plan examples/plans/byte_gpt_mixed8.ntp --backend cuda
# the same failure through NCCL (a GPU per rank): on the survivors every communicator with GPU 3 in
# it is aborted and the world shrunk to the 7 (ncclCommShrink), or created again over their GPUs
# (NTP_NCCL_NO_SHRINK=1: ncclCommInitAll, as where libnccl has no ncclCommShrink); new rank r runs
# on physical GPU r's device. The emulator fails GPU 3 at the first abort (NTP_EMU_FAIL_GPUS): any
# later use of it (a read for the hand-over, a free, a destroy that would wait for it) is an
# error. The CPU run's losses and parameters.
NTP_EMU_FAIL_GPUS=3
export NTP_EMU_FAIL_GPUS
for how in shrink initall; do
  [ $how = initall ] && export NTP_NCCL_NO_SHRINK=1
  if train fail8_$how $gpt --plan tests/plans/byte_gpt_two4.ntp --backend cuda --fail-at 2:3; then
    grep -E '^  (communicators|resumed)' "$tmp/fail8_$how.out"
    same cpu fail8_$how 1e-5 1e-5
  fi
  want='communicators: [0-9]* aborted (ncclCommAbort.*the world shrunk to 7 ranks (ncclCommShrink)'
  [ $how = initall ] && want='communicators: [0-9]* aborted (ncclCommAbort.*over the 7 ranks (ncclCommInitAll: NTP_NCCL_NO_SHRINK=1)'
  grep -q "$want" "$tmp/fail8_$how.out" || { echo "[FAIL] fail8_$how: no line saying the communicators were aborted and the world made again ($how)"; fail=1; }
  grep -q '(no checkpoint read)' "$tmp/fail8_$how.out" || { echo "[FAIL] fail8_$how: no hand-over from the surviving replicas"; fail=1; }
  grep -q 'survivors keep their GPUs: 0 1 2 4 5 6 7$' "$tmp/fail8_$how.out" || { echo "[FAIL] fail8_$how: the survivors are not on their own GPUs"; fail=1; }
  ! grep 'ntp-emu: error' "$tmp/fail8_$how.out" || { echo "[FAIL] fail8_$how: the emulator reported an error"; fail=1; }
done
unset NTP_EMU_FAIL_GPUS NTP_NCCL_NO_SHRINK
# pipeline stages (two replicas of two stages of two GPUs) losing GPU 3, before step 2: the replica's
# last stage one GPU short, its layers cut again, the state from the other replica; on one GPU and
# through NCCL (shrunk)
pp="$gpt --plan tests/plans/byte_gpt_pp_two4.ntp --backend cuda"
train ppfail7 $pp --loopback --fail-at 2:3 && same cpu ppfail7 1e-5 1e-5
export NTP_EMU_FAIL_GPUS=3
train ppfail8 $pp --fail-at 2:3 && same cpu ppfail8 1e-5 1e-5
# a replica that lost a whole stage (GPUs 2 and 3) is dropped: NCCL's shrunk world is split into the
# survivors' plan's order without its idle GPUs 0 and 1 (ncclCommSplit, NCCL_SPLIT_NOCOLOR); three
# replicas losing GPUs 3 and 4 (12 emulated GPUs): the failures packed into one replica, GPU 1
# serving replica 1 as rank 2, the world split into that order
export NTP_EMU_FAIL_GPUS=2,3
train ppdrop8 $pp --fail-at 2:2,2:3 && same cpu ppdrop8 1e-5 1e-5
pk="examples/byte_gpt.ntp -D B=6 -D S=16 -D D=48 -D H=3"
export NTP_EMU_FAIL_GPUS=3,4 NTP_EMU_GPUS=12
train pkcpu $pk &&
  train pack12 $pk --plan tests/plans/byte_gpt_pp_three4.ntp --backend cuda --fail-at 2:3,2:4 && same pkcpu pack12 1e-5 1e-5
unset NTP_EMU_FAIL_GPUS NTP_EMU_GPUS
grep -q "then split into the survivors' plan's order (ncclCommSplit), its ranks on GPUs 4 5 6 7$" "$tmp/ppdrop8.out" ||
  { echo "[FAIL] ppdrop8: the survivors' world was not split without the idle GPUs"; cat "$tmp/ppdrop8.out"; fail=1; }
grep -q "its ranks on GPUs 0 2 1 5 6 7 8 9 10 11$" "$tmp/pack12.out" ||
  { echo "[FAIL] pack12: the failures were not packed"; cat "$tmp/pack12.out"; fail=1; }
# a repair: GPU 3 fails before step 2 and is back, replaced, before step 3 (the emulator then
# refuses anything made on it before: NTP_EMU_REPAIR_GPUS). Through NCCL the survivors' world grows
# by its rank (ncclCommGrow), or is made afresh (NTP_NCCL_NO_GROW=1); on one GPU; the newcomer's
# state from its replica, the CPU run's losses and parameters
export NTP_EMU_FAIL_GPUS=3 NTP_EMU_REPAIR_GPUS=3
train join8 $gpt --plan tests/plans/byte_gpt_two4.ntp --backend cuda --fail-at 2:3 --join-at 3:3 && same cpu join8 1e-5 1e-5
export NTP_NCCL_NO_GROW=1
train join8new $gpt --plan tests/plans/byte_gpt_two4.ntp --backend cuda --fail-at 2:3 --join-at 3:3 && same cpu join8new 1e-5 1e-5
unset NTP_EMU_FAIL_GPUS NTP_EMU_REPAIR_GPUS NTP_NCCL_NO_GROW
train join8lb $gpt --plan tests/plans/byte_gpt_two4.ntp --backend cuda --loopback --fail-at 2:3 --join-at 3:3 &&
  same cpu join8lb 1e-5 1e-5
grep -q 'GPU 3 back, repaired' "$tmp/join8.out" || { echo "[FAIL] join8: GPU 3 did not rejoin"; fail=1; }
grep -q 'the world communicator grown to 8 ranks (ncclCommGrow' "$tmp/join8.out" ||
  { echo "[FAIL] join8: the world did not grow"; fail=1; }
grep -q 'a new world of 8 ranks (ncclCommInitAll): NTP_NCCL_NO_GROW=1' "$tmp/join8new.out" ||
  { echo "[FAIL] join8new: no new world"; fail=1; }
for r in ppfail7 ppfail8; do
  grep -q '(no checkpoint read)' "$tmp/$r.out" || { echo "[FAIL] $r: no hand-over from the other replica"; fail=1; }
done
# the distributed optimizer (ZeRO-2, each part of the state on both replicas of (4, 3)): on one GPU,
# and through NCCL with GPU 5 failing before step 2, its parts then taken from their other owners
zero="$gpt --plan tests/plans/byte_gpt_zero2_43.ntp --backend cuda"
train zero7 $zero --loopback && same cpu zero7 1e-5 1e-5
export NTP_EMU_FAIL_GPUS=5
train zero7_fail $zero --fail-at 2:5 && same cpu zero7_fail 1e-5 1e-5
unset NTP_EMU_FAIL_GPUS
grep -q '(no checkpoint read)' "$tmp/zero7_fail.out" || { echo "[FAIL] zero7_fail: no hand-over from the other owners"; fail=1; }
bf16="tests/emu/models/train_bf16.ntp"
train bf16_cpu $bf16 &&
  train bf16_cuda7 $bf16 --plan tests/plans/train_bf16_w7.ntp --backend cuda --loopback && same bf16_cpu bf16_cuda7 1e-3 5e-2 0.05
grep -q 'backend cuda nccl: 8 ranks' "$tmp/nccl8.out" || { echo "[FAIL] the NCCL run did not say it ran 8 ranks through NCCL"; fail=1; }
[ $fail = 0 ] && echo "train.sh (emulated GPU): all checks passed"
exit $fail
