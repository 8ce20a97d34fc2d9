#!/bin/sh
# zero_cli.sh NTPC — `ntpc plan --train` with the distributed optimizer (docs/planner.md, "Training"):
#  - --zero 0 reproduces the planner's figures from before ZeRO was priced (the lines below are what
#    ntpc plan printed then, for the same commands), and writes no optimizer statement;
#  - the plan written with ZeRO says 'optimizer zero Z redundancy K domain D;' and ntpc check accepts
#    it, and the compiler's report agrees with the planner on the failures;
#    the report names the stage, the memory with and without sharding, the sync and the failures;
#  - bad --zero / --redundancy values are usage errors (exit 2, one line naming the option).
# The flat search (--stages 1: no pipeline stages) is what these figures price.
# Run from the source root. Exit 0 when every check holds.
ntpc=${1:?usage: zero_cli.sh NTPC}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/../check.sh" # check NAME EXIT CMD..., expect_text NAME TEXT, ok, bad

bg="examples/byte_gpt.ntp"
files() { echo -o "$tmp/$1.ntp" --svg "$tmp/$1.svg"; }

# --- zero 0: the figures from before (ntpc plan at 1f8be35, the same commands) ---
# shellcheck disable=SC2046
check old-8 0 "$ntpc" plan $bg --stages 1 --world 8 --gpu h200 --train --zero 0 $(files old8)
expect_text old-8 "predicted step time (training: forward, backward, gradient sync): 715.9 us = compute 616.4 us + communication 99.5 us; 715225 tokens/s (512 tokens per step)"
expect_text old-8 "memory per GPU: parameters 471.2 KiB + activations 348.5 KiB + training state 3.7 MiB = 4.5 MiB of 131.32 GiB"
if grep -q optimizer "$tmp/old8.ntp"; then bad "old-8: --zero 0 wrote an optimizer statement"; else ok; fi
# shellcheck disable=SC2046
check old-tight 0 "$ntpc" plan $bg --stages 1 -D B=8 -D S=64 --world 4 --gpu h100 --train --mem-cap 0.004 --zero 0 $(files oldt)
expect_text old-tight "predicted step time (training: forward, backward, gradient sync): 866.8 us = compute 756.6 us + communication 110.2 us; 590706 tokens/s (512 tokens per step)"
expect_text old-tight "memory per GPU: parameters 487.5 KiB + activations 684.5 KiB + training state 2.8 MiB = 3.9 MiB of 4.1 MiB"

# --- ZeRO chosen where memory binds: faster than zero 0, and said in the plan and the report ---
# shellcheck disable=SC2046
check auto-tight 0 "$ntpc" plan $bg --stages 1 -D B=8 -D S=64 --world 4 --gpu h100 --train --mem-cap 0.004 $(files autot)
expect_text auto-tight "optimizer stages searched: zero 0 866.8 us;"
expect_text auto-tight "optimizer: zero 2 redundancy 1: the optimizer state and gradients of each element sharded over its replicas"
expect_text auto-tight "training state per GPU: gradients"
expect_text auto-tight "failures: one GPU: needs the checkpoint"
if grep -q '^  optimizer zero 2 redundancy 1 domain 8;$' "$tmp/autot.ntp"; then ok; else bad "auto-tight: no optimizer line"; cat "$tmp/autot.ntp"; fi
check auto-tight-check 0 "$ntpc" check $bg -D B=8 -D S=64 --plan "$tmp/autot.ntp"

# --- forced: zero 1 redundancy 2 over two nodes of 4: one GPU and one node survive ---
# shellcheck disable=SC2046
check forced 0 "$ntpc" plan $bg --stages 1 -D B=8 --world 8 --nodes-of 4 --gpu h200 --train --zero 1 --redundancy 2 $(files forced)
expect_text forced "optimizer: zero 1 redundancy 2:"
if grep -q '^  optimizer zero 1 redundancy 2 domain 4;$' "$tmp/forced.ntp"; then ok; else bad "forced: no optimizer line"; cat "$tmp/forced.ntp"; fi
if grep -q "^optimizer stages searched" "$tmp/out"; then bad "forced: searched other stages"; else ok; fi
check forced-check 0 "$ntpc" check $bg -D B=8 --plan "$tmp/forced.ntp"
# the compiler places the copies as the planner priced them: its report says a node's loss reads no checkpoint
check forced-report 0 "$ntpc" report $bg -D B=8 --plan "$tmp/forced.ntp" --train
expect_text forced-report "training state per GPU (ZeRO-1: AdamW's state on 2 owners of each part of every parameter; failure domains of 4 GPUs)"
expect_text forced-report "a failure domain's loss: every element keeps a copy elsewhere, no checkpoint read"
# the plan read back keeps its optimizer statement (as the planner keeps a --plan's other rules)
# shellcheck disable=SC2046
check keep 0 "$ntpc" plan $bg -D B=8 --plan "$tmp/forced.ntp" --gpu h200 --train $(files keep)
expect_text keep "optimizer: zero 1 redundancy 2:"

# --- usage errors: exit 2, the option named on one line ---
usage() {
  name=$1 text=$2
  shift 2
  check "$name" 2 "$ntpc" plan $bg --world 4 -o "$tmp/u.ntp" --svg "$tmp/u.svg" "$@"
  expect_text "$name" "ntpc plan: error: $text"
  if [ "$(grep -c 'error:' "$tmp/out")" -eq 1 ]; then ok; else bad "$name: more than one error line"; fi
  if [ -e "$tmp/u.ntp" ]; then bad "$name: wrote a plan"; else ok; fi
}
usage zero-3 "--zero expects 0, 1, 2 or auto, got '3'" --train --zero 3
usage zero-word "--zero expects 0, 1, 2 or auto, got 'two'" --train --zero two
usage red-0 "--redundancy expects GPUs per optimizer shard (1 to 64) or auto, got '0'" --train --zero 1 --redundancy 0
usage red-neg "--redundancy expects GPUs per optimizer shard (1 to 64) or auto, got '-1'" --train --redundancy -1
usage red-zero0 "--redundancy shards the optimizer's state: it needs --zero 1 or 2" --train --zero 0 --redundancy 2
usage zero-fwd "--zero and --redundancy price the optimizer of a training step: they need --train" --zero 1
usage domain-0 "--domain-size expects GPUs per failure domain, got '0'" --train --domain-size 0

echo "zero_cli.sh: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
