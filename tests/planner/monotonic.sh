#!/bin/sh
# monotonic.sh NTPC — more GPUs never need more memory per GPU for the same model and batch
# (issue 28: the smallest training plan of GPT-3 175B needed 9.85 GiB per GPU at 64 GPUs and 19.19 at
# 128, because beyond 64 ranks the search's 255 states held no recomputed placement).
# The smallest plan's memory is what `ntpc plan` reports when nothing fits (--mem-cap 0.001): it is
# read at growing worlds and must never grow. Run from the source root. Exit 0 when it holds.
ntpc=${1:?usage: monotonic.sh NTPC}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/../check.sh" # check NAME EXIT CMD..., expect_text NAME TEXT, ok, bad

prev=""
for w in 8 16 32 48 64 72; do
  check "w$w" 1 "$ntpc" plan examples/gpt3_175b_train.ntp -D L=4 --gpu a100 --world $w --train \
    --mem-cap 0.001 -o "$tmp/p.ntp" --svg "$tmp/p.svg"
  need=$(sed -n 's/.*the smallest plan needs \([0-9.]*\) GiB per GPU.*/\1/p' "$tmp/out")
  if [ -z "$need" ]; then bad "w$w: no 'smallest plan needs N GiB' line"; cat "$tmp/out"; continue; fi
  echo "world $w: the smallest plan needs $need GiB per GPU"
  if [ -n "$prev" ] && awk -v a="$need" -v b="$prev" 'BEGIN { exit !(a > b) }'; then
    bad "world $w needs $need GiB per GPU, more than the $prev GiB of a smaller world"
  else ok; fi
  prev=$need
  [ -e "$tmp/p.ntp" ] && bad "w$w: a plan file was written though nothing fits"
done
echo "monotonic.sh: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
