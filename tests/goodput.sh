#!/bin/sh
# goodput.sh NTPC — `ntpc goodput` (docs/goodput.md): the paper's shape from the planner's own
# cost model (one stage of the 480B GPT on 32768 B200s in domains of 32, TP 32 x PP 4: dropping
# replicas loses about 10% at 0.1% failed, ntp under 3% up to 0.4%; ntp's live re-plan keeps its
# goodput where every restart-based policy loses its restarts), the spare domains each needs,
# per-layer plans' own gain, stragglers (ntp-3d's re-split recovers most of what they cost), the
# same run for the same seed, the picture written whole, and the command line's errors.
set -u
ntpc=$1
tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/check.sh"

check paper 0 "$ntpc" goodput examples/gpt_480b_stage.ntp --svg "$tmp/g.svg"
cp "$tmp/out" "$tmp/paper.out"
expect_text paper "TP 32: 256 replicas of 128 GPUs"
expect_text paper "long-run failed fraction 0.149%"
# the loss table: failed%, GPUs, then dp-drop uniform two-degree ntp-uni ntp ntp-3d (the first
# row of a fraction; the second, the spare domains)
row() { awk -v f="$1" '$1 == f { gsub("%", ""); print; exit }' "$tmp/paper.out"; }
spares() { awk -v f="$1" '$1 == f { n++ } $1 == f && n == 2 { print; exit }' "$tmp/paper.out"; }
within() { # within NAME VALUE LO HI
  if awk -v v="$2" -v lo="$3" -v hi="$4" 'BEGIN { exit !(v >= lo && v <= hi) }'; then pass=$((pass + 1)); else
    fail=$((fail + 1)); echo "[FAIL] $1: $2 not in [$3, $4]"; sed 's/^/    /' "$tmp/paper.out"; fi
}
set -- $(row 0.10%)
within "dp-drop at 0.1%" "$3" 8 16
within "ntp at 0.1%" "$7" 0 3
set -- $(row 0.40%)
within "ntp at 0.4%" "$7" 0 3
within "two-degree at 0.4%" "$5" 0 3
within "ntp-3d no worse than ntp at 0.4%" "$(awk -v a="$7" -v b="$8" 'BEGIN { print a - b }')" 0 100
set -- $(row 0.00%)
within "no loss without failures" "$(awk -v a="$3" -v b="$4" -v c="$5" -v d="$6" -v e="$7" -v f="$8" 'BEGIN { print a + b + c + d + e + f }')" 0 0
# spares at 0.1%: dropping replicas needs whole replicas (4 domains each) for every failure
set -- $(spares 0.10%)
within "dp-drop's spares at 0.1%" "$3" 64 200
within "ntp's spares at 0.1%" "$7" 0 16
# the run: ntp's goodput above every restart-based policy's, each policy's goodput below its throughput
good() { awk -v p="$1" '$1 == p && $2 ~ /%$/ { gsub("%", ""); print $3; exit }' "$tmp/paper.out"; }
thr() { awk -v p="$1" '$1 == p && $2 ~ /%$/ { gsub("%", ""); print $2; exit }' "$tmp/paper.out"; }
for p in dp-drop uniform two-degree; do
  within "ntp's goodput above $p's" "$(awk -v a="$(good ntp)" -v b="$(good $p)" 'BEGIN { print a - b }')" 5 100
  within "ntp-3d's goodput above $p's" "$(awk -v a="$(good ntp-3d)" -v b="$(good $p)" 'BEGIN { print a - b }')" 5 100
  within "$p: goodput below throughput" "$(awk -v a="$(thr $p)" -v b="$(good $p)" 'BEGIN { print a - b }')" 0.01 100
done
within "ntp's goodput" "$(good ntp)" 97 100
# the picture: whole, one curve a policy in each of its two charts
if [ "$(grep -c '<polyline' "$tmp/g.svg")" = 12 ] && tail -1 "$tmp/g.svg" | grep -q '</svg>'; then pass=$((pass + 1)); else
  fail=$((fail + 1)); echo "[FAIL] the SVG lacks its twelve curves or its end"; fi
expect_text paper "spare domains (of 32 GPUs) that keep the healthy throughput"

# the same seed, the same numbers; another seed, another run
# the restart's cost shown: the same run at 1, 5 and 15 minutes, ntp's lead growing with it
expect_text paper "the restart's cost (--restart-min, an input; 10 min above): goodput of the same run at"
lead() { awk -v m="$1" '$1 == m && $2 == "min" { gsub("[+]", "", $(NF - 1)); print $(NF - 1) }' "$tmp/paper.out"; }
l1=$(lead 1) l5=$(lead 5) l15=$(lead 15)
if [ -n "$l1" ] && awk -v a="$l1" -v b="$l5" -v c="$l15" 'BEGIN { exit !(a > 0 && a < b && b < c) }'; then ok; else
  bad "ntp's lead at 1, 5, 15 minutes a restart: '$l1' '$l5' '$l15' (positive and growing expected)"; fi
check again 0 "$ntpc" goodput examples/gpt_480b_stage.ntp --svg -
same_run() { [ "$(grep -v '^wrote\|took .* ms here' "$tmp/paper.out" | md5sum)" = "$(grep -v 'took .* ms here' "$tmp/out" | md5sum)" ]; }
if same_run; then pass=$((pass + 1)); else
  fail=$((fail + 1)); echo "[FAIL] the same seed gave another run"; fi
check seed2 0 "$ntpc" goodput examples/gpt_480b_stage.ntp --svg - --seed 2
if ! same_run; then pass=$((pass + 1)); else
  fail=$((fail + 1)); echo "[FAIL] seed 2 gave seed 1's run"; fi

# per-layer plans' own gain: 4 sequences a micro-batch, ntp (per layer) loses less than ntp-uni
check perlayer 0 "$ntpc" goodput examples/gpt_480b_stage.ntp -D B=4 -D S=4096 --svg - --days 7 --fractions 0.004
cp "$tmp/out" "$tmp/paper.out"
set -- $(row 0.40%)
within "ntp-uni's loss over ntp's at 0.4%, 4 sequences" "$(awk -v a="$6" -v b="$7" 'BEGIN { print a / b }')" 1.5 100
expect_text perlayer "a healthy group holding more"

# stragglers at about the published rate: the restart policies slowed ~1.3x, ntp-3d recovers >= 80%
check straggle 0 "$ntpc" goodput examples/gpt_480b_stage.ntp --stragglers 0.0002 --svg - --fractions 0
cp "$tmp/out" "$tmp/paper.out"
expect_text straggle "stragglers: 0.0002 slowdowns per GPU-day"
within "two-degree's throughput with stragglers" "$(thr two-degree)" 60 90
within "ntp-3d's throughput with stragglers" "$(thr ntp-3d)" 97 100
within "the straggler loss ntp-3d recovers" "$(awk -v a="$(thr two-degree)" -v b="$(thr ntp-3d)" 'BEGIN { print (b - a) / (100 - a) }')" 0.8 1

# a small cluster, whole micro-batches, a failed fraction given, the forward pass of a model without a loss
check small 0 "$ntpc" goodput examples/byte_gpt.ntp -D D=256 -D H=8 --gpus 512 --domain 8 --pp 2 --micro 8 \
  --failed-frac 0.004 --days 7 --gpu h100 --svg "$tmp/s.svg"
expect_text small "TP 8: 32 replicas of 16 GPUs, 8 micro-batches"
expect_text small "long-run failed fraction 0.400%"
check forward 0 "$ntpc" goodput examples/gpt2.ntp --forward --gpus 1024 --domain 8 --svg -
expect_text forward "forward step of a stage"
check no-loss 1 "$ntpc" goodput examples/gpt2.ntp --gpus 1024 --domain 8 --svg -
expect_text no-loss "needs a scalar loss"; expect_text no-loss "no training program (--forward"

# usage
check help 0 "$ntpc" goodput --help;           expect_text help "usage: ntpc goodput FILE"
check no-file 2 "$ntpc" goodput;               expect_text no-file "no model file"
check bad-tp 2 "$ntpc" goodput examples/byte_gpt.ntp --domain 8 --tp 3; expect_text bad-tp "must divide the domain"
check bad-pp 2 "$ntpc" goodput examples/byte_gpt.ntp --gpus 64 --domain 8 --pp 3; expect_text bad-pp "pipeline depth"
check bad-frac 2 "$ntpc" goodput examples/byte_gpt.ntp --failed-frac 2; expect_text bad-frac "--failed-frac expects"
check bad-list 2 "$ntpc" goodput examples/byte_gpt.ntp --fractions 0.1,,x; expect_text bad-list "--fractions expects"
check bad-repair 2 "$ntpc" goodput examples/byte_gpt.ntp --hw-repair-days 5-3; expect_text bad-repair "--hw-repair-days"
check whole 2 "$ntpc" goodput examples/byte_gpt.ntp --gpus 10.5; expect_text whole "whole numbers"
check layers 2 "$ntpc" goodput examples/byte_gpt.ntp --stage-layers 2.5; expect_text layers "whole numbers"
check slowf 2 "$ntpc" goodput examples/byte_gpt.ntp --slow-factor 0.5; expect_text slowf "--slow-factor expects"
check slowh 2 "$ntpc" goodput examples/byte_gpt.ntp --slow-h 5-1; expect_text slowh "--slow-h expects"
check strag 2 "$ntpc" goodput examples/byte_gpt.ntp --stragglers -1; expect_text strag "--stragglers expects"
check unknown 2 "$ntpc" goodput examples/byte_gpt.ntp --frob; expect_text unknown "unknown option '--frob'"
check bad-model 1 "$ntpc" goodput tests/errors/several_errors.ntp; expect_text bad-model "error:"
check no-svg-dir 2 "$ntpc" goodput examples/byte_gpt.ntp --gpus 64 --domain 8 --svg /nonexistent/dir/g.svg
if [ -e /nonexistent/dir/g.svg ]; then fail=$((fail + 1)); else pass=$((pass + 1)); fi

echo "goodput.sh: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
