#!/bin/sh
# cli.sh NTPC — the command line's contract: exit codes, messages, outputs written whole or not at all.
set -u
ntpc=$1
tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/check.sh"
toy="-D B=2 -D S=16 -D D=64 -D H=4 -D V=256 -D L=2"

check help 0 "$ntpc" --help;                     expect_text help "usage: ntpc"
check version 0 "$ntpc" --version;               expect_text version "ntpc 0."
check no-args 2 "$ntpc";                         expect_text no-args "no input file"
check unknown-option 2 "$ntpc" --frobnicate x;   expect_text unknown-option "unknown option '--frobnicate'"
check bad-define 2 "$ntpc" check examples/gpt2.ntp -D S;        expect_text bad-define "NAME=VALUE"
check bad-define-value 2 "$ntpc" check examples/gpt2.ntp -D S=x; expect_text bad-define-value "must be an integer"
check missing-file 2 "$ntpc" check /nonexistent.ntp;  expect_text missing-file "cannot open '/nonexistent.ntp'"
check no-command 2 "$ntpc" examples/gpt2.ntp;         expect_text no-command "nothing to do"
check bad-emit 2 "$ntpc" examples/gpt2.ntp --emit=bogus; expect_text bad-emit "unknown --emit kind 'bogus'"
check cuda-backend-unknown 2 "$ntpc" run examples/gpt2.ntp --backend tpu $toy; expect_text cuda-backend-unknown "unknown backend 'tpu' (expected cpu or cuda)"
check loopback-cpu 2 "$ntpc" run examples/gpt2.ntp --loopback $toy; expect_text loopback-cpu "--loopback is an option of a backend with devices"
check check-ok 0 "$ntpc" check examples/gpt2.ntp;    expect_text check-ok "model gpt2: 51 layers"
check unknown-define 1 "$ntpc" check examples/gpt2.ntp -D SS=4; expect_text unknown-define "did you mean 'S'?"
check define-applies 0 "$ntpc" examples/gpt2.ntp --emit=ir -D S=128 -D L=1; expect_text define-applies "input tokens : i32[8, 128]"
check define-follows 0 "$ntpc" examples/gpt2.ntp --emit=ir -D D=64 -D H=4 -D L=1; expect_text define-follows "dim F = 256"

# errors in the input: exit 1, compiler-style location, no partial output file
check bad-input 1 "$ntpc" tests/errors/several_errors.ntp --emit=ir -o "$tmp/bad.ir"
expect_text bad-input "tests/errors/several_errors.ntp:6:21: error:"
expect_text bad-input "3 errors generated."
if [ -e "$tmp/bad.ir" ] || ls "$tmp"/bad.ir.tmp* >/dev/null 2>&1; then fail=$((fail + 1)); echo "[FAIL] partial output left"; else pass=$((pass + 1)); fi

# -o writes exactly what stdout would show
check emit-o 0 "$ntpc" examples/gpt2.ntp --emit=ir $toy -o "$tmp/g.ir"
"$ntpc" examples/gpt2.ntp --emit=ir $toy >"$tmp/g2.ir"
if cmp -s "$tmp/g.ir" "$tmp/g2.ir"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "[FAIL] -o differs from stdout"; fi
check emit-o-bad-dir 2 "$ntpc" examples/gpt2.ntp --emit=ir $toy -o /nonexistent/dir/x.ir
check tokens 0 "$ntpc" examples/gpt2.ntp --emit=tokens; expect_text tokens "'model'"
check ast 0 "$ntpc" examples/gpt2.ntp --emit=ast;       expect_text ast "repeat L as blk"

# run prints each output with shape, checksum and values; --dump writes a manifest
check run 0 "$ntpc" run examples/gpt2.ntp $toy --dump "$tmp/dump"
expect_text run "output logits : bf16[2, 16, 256]  sum="
if [ -s "$tmp/dump/manifest.tsv" ] && grep -q "^param	embed.wte	bf16	256,64	" "$tmp/dump/manifest.tsv"; then
  pass=$((pass + 1)); else fail=$((fail + 1)); echo "[FAIL] --dump manifest"; fi

# plans: the active plan is marked; a plan for another model is an error
check plan 0 "$ntpc" examples/gpt2.ntp --emit=ir $toy --plan examples/plans/gpt2_degraded7.ntp
expect_text plan "# active"
printf 'plan p for other {\n  world 2;\n  * tp 2;\n}\n' >"$tmp/other.ntp"
check plan-other-model 1 "$ntpc" check examples/gpt2.ntp --plan "$tmp/other.ntp"
expect_text plan-other-model "is for model 'other', which is not defined"
check plan-name-missing 1 "$ntpc" check examples/gpt2.ntp --plan-name nope
expect_text plan-name-missing "no plan named 'nope'"

# several models in one file: --model picks one
printf 'model a { dim N = 4; input x : fp32[N]; output y = x * 2; }\nmodel b { dim N = 3; input x : fp32[N]; output y = exp(x); }\n' >"$tmp/two.ntp"
check model-pick 0 "$ntpc" run "$tmp/two.ntp" --model b; expect_text model-pick "y : fp32[3]"
check model-missing 1 "$ntpc" check "$tmp/two.ntp" --model c; expect_text model-missing "no model named 'c'"

# sharding: simulated ranks compared with the unsharded run; report; one rank's program
toyw="-D B=8 -D S=16 -D D=64 -D H=8 -D V=250 -D L=2"
check run-world 0 "$ntpc" run examples/gpt2.ntp --world 8 $toyw
expect_text run-world "backend cpu (simulated): 8 ranks"
expect_text run-world "vs unsharded: max relative error"
expect_text run-world ") ok"
check report 0 "$ntpc" report examples/gpt2.ntp --plan examples/plans/gpt2_mixed8.ntp $toyw
expect_text report "placement blk.0.attn: groups (5, 3) rows [0:5) [5:8)"
expect_text report "totals per step (forward)"
check emit-rank 0 "$ntpc" examples/gpt2.ntp --emit=rank:7 --plan examples/plans/gpt2_mixed8.ntp $toyw
expect_text emit-rank "rank 7 of 8 (gpt2)"
check emit-rank-bad 2 "$ntpc" examples/gpt2.ntp --emit=rank:8 --plan examples/plans/gpt2_mixed8.ntp $toyw
expect_text emit-rank-bad "no such rank"
check world-zero 2 "$ntpc" run examples/gpt2.ntp --world 0
check world-conflict 1 "$ntpc" run examples/gpt2.ntp --plan examples/plans/gpt2_mixed8.ntp --world 4 $toyw
expect_text world-conflict "plan sets world 8, but --world is 4"
check world-too-small 1 "$ntpc" run examples/gpt2.ntp --world 2 $toyw
expect_text world-too-small "TP degree 8 is larger than the world (2 ranks)"
# 'tp auto' is resolved by the planner wherever a plan is read, and says what it chose: the same
# placements as 'ntpc plan' writes for that plan and profile
check tp-auto 0 "$ntpc" run examples/gpt2.ntp --plan examples/plans/gpt2_auto.ntp $toyw
expect_text tp-auto "examples/plans/gpt2_auto.ntp:8:20: note: 'tp auto': the planner chose"
expect_text tp-auto "vs unsharded: max relative error 0"
printf 'plan a for gpt2 {\n  world 5;\n  * tp auto, batch (1, 2);\n}\n' >"$tmp/autobatch.ntp"
check tp-auto-batch 0 "$ntpc" check examples/gpt2.ntp --plan "$tmp/autobatch.ntp" -D L=1
expect_text tp-auto-batch "warning: batch shares are ignored with 'tp auto': the planner chooses them"
check tp-auto-gpu 2 "$ntpc" check examples/gpt2.ntp --plan examples/plans/gpt2_auto.ntp --gpu tpu
expect_text tp-auto-gpu "unknown GPU 'tpu'"
for gpu in h100 a100; do
  for w in 8 3; do
    printf 'plan a for gpt2 {\n  world %d;\n  * tp auto;\n}\n' $w >"$tmp/auto$w.ntp"
    check tp-auto-report-$gpu-$w 0 "$ntpc" report examples/gpt2.ntp --plan "$tmp/auto$w.ntp" --gpu $gpu -D L=2
    grep '^placement' "$tmp/out" >"$tmp/auto.placements"
    check tp-auto-plan-$gpu-$w 0 "$ntpc" plan examples/gpt2.ntp --plan "$tmp/auto$w.ntp" --gpu $gpu -D L=2 \
      -o "$tmp/chosen.ntp" --svg "$tmp/chosen.svg"
    check tp-auto-chosen-$gpu-$w 0 "$ntpc" report examples/gpt2.ntp --plan "$tmp/chosen.ntp" -D L=2
    grep '^placement' "$tmp/out" >"$tmp/plan.placements"
    if cmp -s "$tmp/auto.placements" "$tmp/plan.placements"; then pass=$((pass + 1)); else
      fail=$((fail + 1)); echo "[FAIL] tp-auto-same-$gpu-$w: 'tp auto' and 'ntpc plan' chose differently"
      diff "$tmp/auto.placements" "$tmp/plan.placements" | sed 's/^/    /'; fi
  done
done
# the pipeline: --dump-after prints a pass's result as it completes; an unknown pass is a usage error
check dump-after 0 "$ntpc" check examples/gpt2.ntp --plan examples/plans/gpt2_auto.ntp --dump-after=place,autoplan,memplan -D L=1
expect_text dump-after "# ---- after place ----"
expect_text dump-after "blk.0.attn: groups (8) batch (8), tp auto"
expect_text dump-after "# ---- after autoplan ----"
expect_text dump-after "# ---- after memplan ----"
check dump-after-sema 0 "$ntpc" check examples/gpt2.ntp --dump-after=sema -D L=1
expect_text dump-after-sema "layer blk.0.attn = attention"
check dump-after-bogus 2 "$ntpc" check examples/gpt2.ntp --dump-after=sema,bogus
expect_text dump-after-bogus "no pass 'bogus' with a dump (passes: parse, sema, grad, place, autoplan, shard, memplan, codegen, image)"
check seed-negative 2 "$ntpc" run examples/gpt2.ntp --seed -1

# plan patterns with numeric ranges: the range beats blk.*, a single name beats the range
printf 'plan r for gpt2 {\n  world 4;\n  * tp 1;\n  blk.*.mlp tp 2;\n  blk.{0..1}.mlp tp 4;\n  blk.1.mlp tp 2;\n}\n' >"$tmp/range.ntp"
check plan-range 0 "$ntpc" report examples/gpt2.ntp --plan "$tmp/range.ntp" -D B=4 -D S=8 -D D=32 -D H=4 -D V=64 -D L=3
expect_text plan-range "placement blk.0.mlp: groups (4)"
expect_text plan-range "placement blk.1.mlp: groups (2, 2)"
expect_text plan-range "placement blk.2.mlp: groups (2, 2)"
printf 'plan r for gpt2 {\n  world 2;\n  blk.{7..9}.mlp tp 2;\n}\n' >"$tmp/range2.ntp"
check plan-range-none 1 "$ntpc" check examples/gpt2.ntp --plan "$tmp/range2.ntp" -D L=3
expect_text plan-range-none "rule 'blk.{7..9}.mlp' matches no layer"

# parameters: save the default initialisation, load it back (unsharded and every rank by slices)
check save-params 0 "$ntpc" run examples/gpt2.ntp $toyw --seed 5 --save-params "$tmp/p.safetensors"
grep '^output' "$tmp/out" >"$tmp/a"
check load-params 0 "$ntpc" run examples/gpt2.ntp $toyw --seed 5 --params "$tmp/p.safetensors" --plan examples/plans/gpt2_mixed8.ntp
grep '^output' "$tmp/out" | head -1 >"$tmp/b"
if cmp -s "$tmp/a" "$tmp/b"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "[FAIL] loaded parameters give other outputs"; fi
expect_text load-params ") ok"
check load-params-wrong-model 1 "$ntpc" run examples/llama_block.ntp -D B=2 -D S=16 -D D=64 -D H=8 --params "$tmp/p.safetensors"
expect_text load-params-wrong-model "parameter 'norm1.g' is not in the file"
printf 'junk' >"$tmp/bad.safetensors"
check load-params-bad-file 1 "$ntpc" run examples/gpt2.ntp $toyw --params "$tmp/bad.safetensors"
expect_text load-params-bad-file "not a safetensors file"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
