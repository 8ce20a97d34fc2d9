#!/bin/sh
# pipeline_cli.sh NTPC — `ntpc plan` with pipeline stages (the 3D search; docs/planner.md, "Pipelines"):
#  - forced stages and micro-batches on a small fp32 model: the plan says 'micro_batches M;',
#    'schedule zb-h1;' (zero bubble, chosen over 1F1B; --schedule 1f1b forces that) and its stages,
#    `ntpc check` accepts it, and `ntpc train` under it gives the unsharded run's losses;
#  - left to the planner, GPT-3 (4 blocks) on 16 A100s trains in stages, the report shows the stages,
#    the step's parts and the MFU; at 1024 GPUs (Megatron's batch of 1536) the plan has replicas of
#    the pipeline, is checked on one replica, and is written;
#  - '-' writes the plan or the picture alone on stdout; the picture shows the training state, the
#    GPUs a --fail lost, and labels that do not overlap;
#  - --stages 1 is the flat search; bad --stages / --micro-batches are usage errors (exit 2); a cap
#    nothing fits is exit 1 with no file written.
# Run from the source root. Exit 0 when every check holds.
ntpc=${1:?usage: pipeline_cli.sh NTPC}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/../check.sh" # check NAME EXIT CMD..., expect_text NAME TEXT, ok, bad

bg="examples/byte_gpt.ntp -D B=8 -D S=16 -D D=32 -D H=4 -D L=2"
files() { echo -o "$tmp/$1.ntp" --svg "$tmp/$1.svg"; }
python3 tools/make_tokens.py "$tmp/docs.bin" --text README.md >/dev/null || bad "make_tokens failed"

# --- forced: 2 stages, 4 micro-batches; the plan trains as the unsharded model does ---
# shellcheck disable=SC2046,SC2086
check forced 0 "$ntpc" plan $bg --world 8 --train --stages 2 --micro-batches 4 $(files forced)
expect_text forced "x 2 stages x"
expect_text forced "4 micro-batches of 2 rows per replica, ZB-H1"
expect_text forced "compiler check: the training program (forward, backward, gradient sync) compiles for 8 ranks"
if grep -q '^  micro_batches 4;$' "$tmp/forced.ntp" && grep -q '^  schedule zb-h1;$' "$tmp/forced.ntp" &&
  [ "$(grep -c 'stage .* ranks' "$tmp/forced.ntp")" -ge 2 ]; then ok
else bad "forced: the plan lacks its micro_batches, schedule or stage lines"; cat "$tmp/forced.ntp"; fi
# the schedule forced: 1F1B (no schedule line); a schedule the search does not price is a usage error
# shellcheck disable=SC2046,SC2086
check forced-1f1b 0 "$ntpc" plan $bg --world 8 --train --stages 2 --micro-batches 4 --schedule 1f1b $(files f1b)
expect_text forced-1f1b "4 micro-batches of 2 rows per replica, 1F1B"
if ! grep -q 'schedule' "$tmp/f1b.ntp"; then ok; else bad "forced-1f1b: the plan names a schedule"; fi
# shellcheck disable=SC2086
check schedule-bad 2 "$ntpc" plan $bg --world 8 --train --schedule gpipe
expect_text schedule-bad "--schedule expects 1f1b, zb-h1 or auto (the search prices those), got 'gpipe'"
# shellcheck disable=SC2086
check forced-check 0 "$ntpc" check $bg --plan "$tmp/forced.ntp" --train
train() { # the per-step losses of three steps
  # shellcheck disable=SC2086
  "$ntpc" train $bg --data "$tmp/docs.bin" --steps 3 --init-std 0.02 "$@" | sed -n 's/^step *[0-9/]* *loss \([0-9.]*\).*/\1/p' | tr '\n' ' '
}
ref=$(train) pp=$(train --plan "$tmp/forced.ntp")
echo "losses unsharded: $ref; staged plan: $pp"
if [ -n "$ref" ] && python3 -c "import sys; a, b = sys.argv[1].split(), sys.argv[2].split(); sys.exit(not (len(a) == len(b) == 3 and all(abs(float(x) - float(y)) <= 1e-5 * abs(float(x)) for x, y in zip(a, b))))" "$ref" "$pp"
then ok; else bad "the staged plan's losses ($pp) differ from the unsharded run's ($ref)"; fi

# a plan with rules of one pipeline (its last stage one GPU short) trains as the unsharded model does
uneven=$(train --plan tests/plans/byte_gpt_pp_uneven7.ntp)
echo "losses with pipelines of 4 and 3 GPUs: $uneven"
same3() { # same3 A B: three losses each, within 1e-5 of each other (fp32 sums in another order)
  python3 -c "import sys; a, b = sys.argv[1].split(), sys.argv[2].split(); sys.exit(not (len(a) == len(b) == 3 and all(abs(float(x) - float(y)) <= 1e-5 * abs(float(x)) for x, y in zip(a, b))))" "$1" "$2"
}
if [ -n "$uneven" ] && same3 "$ref" "$uneven"; then ok; else bad "pipeline rules: losses ($uneven) differ from $ref"; fi

# --fail on a staged plan: the survivors keep their stages; a replica one GPU short is cut again, one
# that lost a whole stage is dropped; the plan checks and trains as the unsharded model does
pp8="--plan tests/plans/byte_gpt_pp_two4.ntp --train"
# shellcheck disable=SC2086
check fail-staged 0 "$ntpc" plan $bg $pp8 --fail 3 -o "$tmp/surv.ntp"
expect_text fail-staged "7 of 8 GPUs survive; rank r of the plan is physical GPU: 0 1 2 4 5 6 7"
expect_text fail-staged "compiler check: the survivors' training program compiles for 7 ranks"
surv=$(train --plan "$tmp/surv.ntp")
if same3 "$ref" "$surv"; then ok; else bad "the survivors' staged plan: losses ($surv) differ from $ref"; fi
# shellcheck disable=SC2086
check fail-stage-gone 0 "$ntpc" plan $bg $pp8 --fail 2,3 -o "$tmp/surv2.ntp"
expect_text fail-stage-gone "6 of 8 GPUs survive, 4 run (a replica that lost a whole stage is dropped, its other GPUs idle); rank r of the plan is physical GPU: 4 5 6 7"
if [ "$(grep -c '^  pipeline .*{$' "$tmp/surv2.ntp")" = 1 ]; then ok; else bad "fail-stage-gone: the replica that lost a stage is not dropped"; fi

# --- chosen by the planner: GPT-3's blocks on 16 A100s go into stages ---
g3="examples/gpt3_175b_train.ntp -D L=4 --gpu a100 --train"
# shellcheck disable=SC2046,SC2086
check auto 0 "$ntpc" plan $g3 --world 16 $(files auto)
expect_text auto "stage  layers"
expect_text auto "x the slowest stage"
expect_text auto "MFU"
expect_text auto "without stages (the flat search): step"
if grep -q '^  micro_batches ' "$tmp/auto.ntp"; then ok; else bad "auto: no stages chosen"; cat "$tmp/out"; fi
# shellcheck disable=SC2046,SC2086
check flat 0 "$ntpc" plan $g3 --world 16 --stages 1 $(files flat)
if grep -q 'micro_batches\|stage ' "$tmp/flat.ntp"; then bad "--stages 1 wrote stages"; else ok; fi

# --- 1024 GPUs at Megatron's batch: replicas of a pipeline, checked on one ---
# shellcheck disable=SC2046
check w1024 0 "$ntpc" plan examples/gpt3_175b_train.ntp --gpu a100 --world 1024 --train -D B=1536 $(files w1024)
expect_text w1024 "compiler check of one pipeline replica"
if [ "$(grep -c '^  pipeline {$' "$tmp/w1024.ntp")" -ge 2 ]; then ok; else bad "w1024: no pipeline replicas"; head -20 "$tmp/w1024.ntp"; fi

# --- outputs: '-' is stdout (the report then on stderr); the picture's memory panel ---
# shellcheck disable=SC2086
"$ntpc" plan $bg --world 8 --train --svg - -o "$tmp/dash.ntp" >"$tmp/dash.svg" 2>"$tmp/dash.err"; rc=$?
if [ $rc -eq 0 ] && head -1 "$tmp/dash.svg" | grep -q '^<?xml' && grep -q "predicted step time" "$tmp/dash.err" &&
   ! grep -q "predicted step time" "$tmp/dash.svg"; then ok; else bad "--svg -: the picture is not alone on stdout (exit $rc)"; fi
# shellcheck disable=SC2086
"$ntpc" plan $bg --world 8 -o - >"$tmp/dash2.ntp" 2>/dev/null
if head -3 "$tmp/dash2.ntp" | grep -q '^plan '; then ok; else bad "-o -: no plan on stdout"; head -3 "$tmp/dash2.ntp"; fi
check two-dashes 2 "$ntpc" plan examples/byte_gpt.ntp --world 8 -o - --svg -
expect_text two-dashes "only one of -o, --svg and --layer-times can be '-' (stdout)"
if grep -q "training state" "$tmp/dash.svg"; then ok; else bad "the training plan's picture shows no training state"; fi
# shellcheck disable=SC2046
check fail-svg 0 "$ntpc" plan examples/gpt3_175b.ntp --world 16 --gpu h200 --fail 3,9 $(files fail)
if grep -q "GPU 3: failed" "$tmp/fail.svg" && grep -q "GPU 9: failed" "$tmp/fail.svg"; then ok
else bad "the --fail picture does not mark GPUs 3 and 9"; fi
# the axis labels of every panel at least 10 px apart (64 GPUs: the degrees 1..64, 64 memory bars)
# shellcheck disable=SC2046
check labels 0 "$ntpc" plan examples/gpt3_175b_train.ntp -D L=8 --gpu a100 --world 64 --train --stages 1 $(files labels)
if python3 - "$tmp/labels.svg" <<'PY'
import re, sys
s = open(sys.argv[1]).read()
pts = [(float(x), float(y)) for x, y in re.findall(r'<text x="([0-9.]+)" y="([0-9.]+)" font-size="10"', s)]
close = [(a, b) for i, a in enumerate(pts) for b in pts[i + 1:]
         if (a[0] == b[0] and abs(a[1] - b[1]) < 10) or (a[1] == b[1] and abs(a[0] - b[0]) < 14)]
print("overlapping labels:", close[:4]) if close else None
sys.exit(1 if close else 0)
PY
then ok; else bad "labels overlap in the picture"; fi

# --- errors ---
usage() { name=$1 msg=$2; shift 2
  # shellcheck disable=SC2086
  check "$name" 2 "$ntpc" plan $bg --world 8 -o "$tmp/u.ntp" --svg "$tmp/u.svg" "$@"
  expect_text "$name" "$msg"
}
usage stages-0 "--stages expects 1 to 128 or auto, got '0'" --stages 0
usage stages-x "--stages expects 1 to 128 or auto, got 'x'" --stages x
usage mb-0 "--micro-batches expects 1 to 4096 or auto, got '0'" --micro-batches 0
usage pinned "--stages and --micro-batches need pipelines: a --plan's rules or --fail keep the flat search" --stages 2 --plan "$tmp/forced.ntp"
# shellcheck disable=SC2046,SC2086
check nostructure 1 "$ntpc" plan $bg --world 7 --stages 3 $(files nos)
expect_text nostructure "no pipeline structure for 7 GPUs: stage GPUs (dividing them, at most 8 a node) x stages (at most the 6 layers, as --stages says)"
# shellcheck disable=SC2046,SC2086
check nofit 1 "$ntpc" plan $bg --world 8 --train --mem-cap 0.0001 $(files nofit)
expect_text nofit "does not fit: the smallest plan needs"
if [ -e "$tmp/nofit.ntp" ]; then bad "nofit: a plan file was written"; else ok; fi

echo "pipeline_cli.sh: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
