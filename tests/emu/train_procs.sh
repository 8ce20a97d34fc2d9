#!/bin/sh
# train_procs.sh NTPC PYTHON — `ntpc train --backend cuda --rank env` on the emulated GPU, one
# process per rank (RANK, LOCAL_RANK and WORLD_SIZE as torchrun sets them; the NCCL id through
# NTP_NCCL_ID_FILE; the emulator's NCCL between the processes over shared memory), against the
# CPU run of the same steps: two replicas of 4 GPUs (tests/plans/byte_gpt_two4.ntp),
# - uninterrupted: every process prints the CPU run's losses, and the parameters that rank 0's
#   process writes (gathered from every process's slices through NCCL) are the CPU run's;
# - GPU 3 failing before step 2 (--fail-at 2:3): its process kills itself (SIGKILL, status 137);
#   the 7 others notice it through NCCL (the emulator fails an operation that waits for a dead
#   process: ncclRemoteError), abort their communicators, shrink the world across the processes
#   (ncclCommShrink; with NTP_NCCL_NO_SHRINK=1 a new unique id through the file and
#   ncclCommInitRank), re-plan, take the state from the surviving replicas (merged across their
#   processes through NCCL) and take step 2 again with the same batch: the CPU run's losses and
#   parameters; and GPU 6's process killed before step 3 as well; and a plan whose only copy of some
#   state was on the killed GPU, which goes back to the checkpoint that rank 0's process wrote;
#   and the distributed optimizer (ZeRO-2, redundancy 2) losing a process: no checkpoint read; and
#   pipeline stages losing a process (the stage cut again, the state from the other replica), and
#   a whole stage (its replica dropped, the processes left out stopping).
# fp32 within 1e-5 (AdamW's eps 1e-4, as in train.sh). Run by CTest with the emulator's environment.
set -u
ntpc=$1 py=$2
tmp=$(mktemp -d) && { [ -n "${KEEP_TMP:-}" ] || trap 'rm -rf "$tmp"' EXIT; }
here=$(dirname "$0")
fail=0
. "$here/train_data.sh" # the token file and the options every run shares
gpt="examples/byte_gpt.ntp -D B=2 -D S=16 -D D=64 -D H=8"
plan=tests/plans/byte_gpt_two4.ntp

steps() { grep '^step *[0-9]*/' "$1" | sed 's/  [0-9]* tokens\/s$//'; }

# losses REF LOG: LOG's three step lines against REF's, within 1e-5 of the loss
losses() {
  awk 'NR == FNR { a[FNR] = $4; n = FNR; next }
       { d = a[FNR] - $4; if (d < 0) d = -d; if (d > 1e-5 * a[FNR]) bad = 1; m = FNR }
       END { exit bad || m != n || n != 3 }' "$1" "$2"
}

if ! "$ntpc" train $gpt $common --save-params "$tmp/cpu.st" >"$tmp/cpu.out" 2>&1; then
  echo "[FAIL] the CPU run: ntpc train exited $?"
  cat "$tmp/cpu.out"
  exit 1
fi
steps "$tmp/cpu.out" >"$tmp/cpu.log"

# procs NAME W ARGS...: W processes, rank r's output in NAME.r.out, "r status" lines in NAME.status
procs() {
  name=$1 w=$2
  shift 2
  id="$tmp/$name.id"
  r=0
  while [ $r -lt "$w" ]; do
    RANK=$r LOCAL_RANK=$r WORLD_SIZE=$w NTP_NCCL_ID_FILE="$id" \
      "$ntpc" train "$@" $common --rank env --save-params "$tmp/$name.st" >"$tmp/$name.$r.out" 2>&1 &
    eval "pid_$r=\$!"
    r=$((r + 1))
  done
  : >"$tmp/$name.status"
  r=0
  while [ $r -lt "$w" ]; do
    eval "p=\$pid_$r"
    wait "$p"
    echo "$r $?" >>"$tmp/$name.status"
    rm -f /dev/shm/ntp-emu-nccl-"$p"-* /tmp/ntp-emu-nccl-"$p"-* # a killed process's fabric is never unlinked
    r=$((r + 1))
  done
}

# check NAME DEAD [IDLE]: every process but those of DEAD ("3 6"; -1: none) exited 0 and printed the
# CPU run's losses; DEAD's died by SIGKILL; IDLE's ("0 1") exited 0 when the survivors' plan left them out
check() {
  name=$1 dead=" $2 " idle=" ${3:-} "
  while read -r r st; do
    if [ "${dead#* $r }" != "$dead" ]; then
      [ "$st" = 137 ] || { echo "[FAIL] $name: the process of GPU $r exited $st, not 137 (SIGKILL)"; fail=1; }
      continue
    fi
    if [ "${idle#* $r }" != "$idle" ]; then
      [ "$st" = 0 ] && grep -q "GPU $r is idle in the survivors' plan" "$tmp/$name.$r.out" ||
        { echo "[FAIL] $name: the process of GPU $r (idle) exited $st"; cat "$tmp/$name.$r.out"; fail=1; }
      continue
    fi
    if [ "$st" != 0 ]; then
      echo "[FAIL] $name: the process of rank $r exited $st"
      cat "$tmp/$name.$r.out"
      fail=1
      continue
    fi
    steps "$tmp/$name.$r.out" >"$tmp/$name.$r.log"
    losses "$tmp/cpu.log" "$tmp/$name.$r.log" || {
      echo "[FAIL] $name: rank $r's losses differ from the CPU run's"
      paste "$tmp/cpu.log" "$tmp/$name.$r.log"
      fail=1
    }
  done <"$tmp/$name.status"
  printf '%s: ' "$name"
  "$py" "$here/compare_params.py" "$tmp/cpu.st" "$tmp/$name.st" 1e-5 || fail=1
}

procs procs8 8 $gpt --plan $plan --backend cuda
sed -n '/^backend/p;/^step/p' "$tmp/procs8.0.out"
check procs8 -1
[ $fail = 0 ] && echo "procs8: 8 processes, one rank each, give the CPU run's losses (every process) and parameters"

for how in shrink initid; do
  [ $how = initid ] && export NTP_NCCL_NO_SHRINK=1
  procs kill_$how 8 $gpt --plan $plan --backend cuda --fail-at 2:3
  echo "kill_$how: GPU 3's process:"
  grep '^step' "$tmp/kill_$how.3.out"
  echo "kill_$how: rank 0's process:"
  grep -E '^(step|  communicators|  resumed)|ntp-emu: error' "$tmp/kill_$how.0.out"
  check kill_$how 3
  want='communicators: [0-9]* aborted (ncclCommAbort.*the world shrunk to 7 ranks (ncclCommShrink across the processes)'
  [ $how = initid ] && want='communicators: [0-9]* aborted (ncclCommAbort.*over the 7 ranks (ncclCommInitRank from a new unique id: NTP_NCCL_NO_SHRINK=1)'
  for r in 0 1 2 4 5 6 7; do
    out="$tmp/kill_$how.$r.out"
    grep -q 'NCCL reports a lost peer' "$out" || { echo "[FAIL] kill_$how: rank $r did not notice the lost peer through NCCL"; fail=1; }
    grep -q "$want" "$out" || { echo "[FAIL] kill_$how: rank $r did not say its communicators were aborted and the world made again ($how)"; fail=1; }
    grep -q '(no checkpoint read)' "$out" || { echo "[FAIL] kill_$how: rank $r took no hand-over from the surviving replicas"; fail=1; }
  done
done
unset NTP_NCCL_NO_SHRINK
# two failures, one after the other: GPU 3's process before step 2, GPU 6's before step 3 (the
# second shrink is of the survivors' world, the second hand-over from the 7-GPU plan's replicas)
procs kill2 8 $gpt --plan $plan --backend cuda --fail-at 2:3,3:6
grep -E '^(step|  communicators|  resumed)' "$tmp/kill2.0.out"
check kill2 "3 6"
for r in 0 1 2 4 5 7; do
  n=$(grep -c '(no checkpoint read)' "$tmp/kill2.$r.out")
  [ "$n" = 2 ] || { echo "[FAIL] kill2: rank $r took $n hand-overs, not 2"; fail=1; }
done
# pipeline stages (two replicas of two stages of two GPUs): GPU 3's process killed before step 2,
# the replica's last stage one GPU short with its layers cut again, the state from the other replica
procs ppkill 8 $gpt --plan tests/plans/byte_gpt_pp_two4.ntp --backend cuda --fail-at 2:3
grep -E '^(step|  communicators|  resumed)' "$tmp/ppkill.0.out"
check ppkill 3
for r in 0 1 2 4 5 6 7; do
  grep -q '(no checkpoint read)' "$tmp/ppkill.$r.out" || { echo "[FAIL] ppkill: rank $r took no hand-over from the other replica"; fail=1; }
done
# a whole stage's processes killed (GPUs 2 and 3): their replica is dropped, the processes of GPUs 0
# and 1 stop (idle in the survivors' plan: the shrunk world is split without them), the other
# replica goes on with the CPU run's losses and parameters (written by the new rank 0's process)
procs ppdrop 8 $gpt --plan tests/plans/byte_gpt_pp_two4.ntp --backend cuda --fail-at 2:2,2:3
grep -E '^(step|  communicators|  resumed|  GPU)' "$tmp/ppdrop.0.out" "$tmp/ppdrop.4.out"
check ppdrop "2 3" "0 1"
# the distributed optimizer across processes (ZeRO-2, each part of the state on both replicas of
# (4, 3)): GPU 5's process killed before step 2, its parts taken from their other owners' processes
procs zero 7 $gpt --plan tests/plans/byte_gpt_zero2_43.ntp --backend cuda --fail-at 2:5
grep -E '^(step|  the distributed|  resumed)' "$tmp/zero.0.out"
check zero 5
for r in 0 1 2 3 4 6; do
  grep -q '(no checkpoint read)' "$tmp/zero.$r.out" || { echo "[FAIL] zero: rank $r took no hand-over from the other owners"; fail=1; }
done
# the 7-GPU plan holds the embedding and the head once: GPU 3's process killed before step 3, the
# only copies of some state are gone, and the 6 survivors go back to the step-2 checkpoint (written
# by rank 0's process from the state every process gathered; each process reads its own boxes)
procs ckpt7 7 $gpt --plan examples/plans/byte_gpt_7.ntp --backend cuda --fail-at 3:3 --checkpoint "$tmp/ck7" \
  --checkpoint-every 1
grep -E '^(step|  communicators|  the only)' "$tmp/ckpt7.0.out"
check ckpt7 3
for r in 0 1 2 4 5 6; do
  grep -q 'back to the checkpoint of step 2' "$tmp/ckpt7.$r.out" || { echo "[FAIL] ckpt7: rank $r did not go back to the step-2 checkpoint"; fail=1; }
done

# victim NAME V VENV EXTRA ARGS...: 8 processes as procs does, but rank V's runs with the environment
# VENV ("NTP_EMU_NCCL_KILL=1": killed by the emulated NCCL as its stream reaches its first operation on
# a group's communicator, before it posts it) and without EXTRA (the survivors' --fail-at); a watchdog
# kills every process still running after 90 s. NAME.status as procs writes it; NAME.took the seconds
# until every process but V's had exited, after which V's (stopped) is killed.
victim() {
  name=$1 v=$2 venv=$3 extra=$4
  shift 4
  id="$tmp/$name.id"
  r=0 t0=$(date +%s)
  while [ $r -lt 8 ]; do
    if [ $r = "$v" ]; then
      env RANK=$r LOCAL_RANK=$r WORLD_SIZE=8 NTP_NCCL_ID_FILE="$id" $venv \
        "$ntpc" train "$@" $common --rank env >"$tmp/$name.$r.out" 2>&1 &
    else
      RANK=$r LOCAL_RANK=$r WORLD_SIZE=8 NTP_NCCL_ID_FILE="$id" \
        "$ntpc" train "$@" $extra $common --rank env --save-params "$tmp/$name.st" >"$tmp/$name.$r.out" 2>&1 &
    fi
    eval "pid_$r=\$!"
    r=$((r + 1))
  done
  while :; do # until every process but the victim's has exited, or the watchdog
    alive=0 r=0
    while [ $r -lt 8 ]; do
      eval "p=\$pid_$r"
      [ $r != "$v" ] && kill -0 "$p" 2>/dev/null && [ "$(awk '{print $3}' /proc/"$p"/stat 2>/dev/null)" != Z ] && alive=1
      r=$((r + 1))
    done
    [ $alive = 0 ] && break
    [ $(($(date +%s) - t0)) -ge 90 ] && { echo "[FAIL] $name: the others took 90 s to exit (a hang)"; fail=1; break; }
    sleep 0.2
  done
  echo $(($(date +%s) - t0)) >"$tmp/$name.took"
  r=0
  while [ $r -lt 8 ]; do
    eval "p=\$pid_$r"
    kill -KILL "$p" 2>/dev/null # the victim (stopped), and anything the watchdog caught
    r=$((r + 1))
  done
  : >"$tmp/$name.status"
  r=0
  while [ $r -lt 8 ]; do
    eval "p=\$pid_$r"
    wait "$p"
    echo "$r $?" >>"$tmp/$name.status"
    rm -f /dev/shm/ntp-emu-nccl-"$p"-* /tmp/ntp-emu-nccl-"$p"-*
    r=$((r + 1))
  done
}

# items 16 and 17 of issue 24: GPU 3's process killed inside its first all-reduce on its tensor-
# parallel group's communicator (ranks 0-3). The survivors' operations on it never complete (the
# emulated NCCL, as NCCL: no call fails); ranks 0-2 see the loss only by polling that group's
# communicator, the others when the first survivors abort theirs; all fail over in step 1.
victim midcoll 3 NTP_EMU_NCCL_KILL=1 "--fail-at 1:3" $gpt --plan $plan --backend cuda
grep -E '^(step|  communicators)|NTP_EMU_NCCL' "$tmp/midcoll.3.out" "$tmp/midcoll.0.out"
check midcoll 3
for r in 0 1 2; do
  grep -q "NCCL reports a lost peer (.*on rank $r's communicator of ranks {0,1,2,3} (ncclCommGetAsyncError))" \
    "$tmp/midcoll.$r.out" || { echo "[FAIL] midcoll: rank $r did not see the lost peer on its tensor-parallel group's communicator"; fail=1; }
done
# ... and GPU 2's process stopped there (SIGSTOP: alive, silent): no NCCL error ever comes. With
# NTP_NCCL_TIMEOUT=3 the others give up within seconds, each with a message, instead of waiting for
# ever; nobody fails over (no --fail-at: nothing says which GPU is gone)
NTP_NCCL_TIMEOUT=3 victim stop 2 NTP_EMU_NCCL_STOP=1 "" $gpt --plan $plan --backend cuda
took=$(cat "$tmp/stop.took")
echo "stop: the 7 others exited $took s after the start"
while read -r r st; do
  [ "$r" = 2 ] && continue
  [ "$st" = 1 ] || { echo "[FAIL] stop: the process of rank $r exited $st, not 1"; cat "$tmp/stop.$r.out"; fail=1; }
  grep -q 'made no progress for 3 s (NTP_NCCL_TIMEOUT)\|NCCL reports .* (ncclCommGetAsyncError)' "$tmp/stop.$r.out" ||
    { echo "[FAIL] stop: rank $r exited without naming the timeout or NCCL's error"; cat "$tmp/stop.$r.out"; fail=1; }
done <"$tmp/stop.status"
grep -h 'error' "$tmp/stop.0.out" "$tmp/stop.1.out" | head -2
[ "$took" -le 60 ] || { echo "[FAIL] stop: the others took $took s"; fail=1; }
[ $fail = 0 ] && echo "train_procs.sh (emulated GPU, a process per rank): all checks passed"
exit $fail
