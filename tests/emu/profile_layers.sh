#!/bin/sh
# profile_layers.sh NTPC — per-layer device times (NTP_CUDA_PROFILE=layers) on the emulated GPU:
# `ntpc run --backend cuda` prints one "layer NAME SECONDS" line per layer of the model, in
# order, then "layer (model) ..."; every layer's time is positive and their sum is at most the
# forward's device time; the outputs still match the CPU reference (the step list launched
# step by step instead of as a graph). Without the variable nothing is printed.
set -u
ntpc=$1
fail() { echo "profile_layers.sh: FAIL: $*" >&2; exit 1; }
dims="-D B=1 -D S=8 -D D=32 -D H=2 -D L=2 -D V=64"
# shellcheck disable=SC2086
out=$(NTP_CUDA_PROFILE=layers "$ntpc" run examples/gpt2.ntp --backend cuda --iters 1 $dims) || fail "ntpc run exited $?"
names=$(echo "$out" | sed -n 's/^layer \([^ ]*\) .*/\1/p' | tr '\n' ' ')
want="embed blk.0.ln1 blk.0.attn blk.0.ln2 blk.0.mlp blk.1.ln1 blk.1.attn blk.1.ln2 blk.1.mlp ln_f head (model) "
[ "$names" = "$want" ] || fail "layer lines: '$names', expected '$want'"
fwd=$(echo "$out" | sed -n 's/^backend cuda.* forward \([0-9.]*\) ms.*/\1/p')
echo "$out" | awk -v fwd="$fwd" '
  /^layer / && $2 != "(model)" { if (!($3 > 0)) { print "layer " $2 " has time " $3; bad = 1 } sum += $3 }
  END { if (sum * 1e3 > fwd * 1.01 + 0.001) { print "layers sum to " sum * 1e3 " ms, the forward took " fwd " ms"; bad = 1 } exit bad }' ||
  fail "layer times"
echo "$out" | grep -q "MISMATCH" && fail "outputs differ from the CPU reference while profiling"
# shellcheck disable=SC2086
"$ntpc" run examples/gpt2.ntp --backend cuda --iters 0 $dims | grep -q "^layer " && fail "layer lines without NTP_CUDA_PROFILE"
echo "profile_layers.sh: ok"
