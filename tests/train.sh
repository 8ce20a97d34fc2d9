#!/bin/sh
# train.sh NTPC PYTHON — `ntpc train` on the CPU reference: the loss falls on real text (this
# repository's docs, byte-level), runs are bitwise deterministic, --dump writes every gradient,
# --params resumes from saved parameters, and bad input is a message with exit 1 or 2.
set -u
ntpc=$1 py=$2
tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/check.sh"

# the text: the example models' sources (as tests/emu/train_data.sh), not the docs, which every edit changes
check make-tokens 0 "$py" tools/make_tokens.py "$tmp/docs.bin" --text examples/byte_gpt.ntp examples/gpt2.ntp examples/llama_block.ntp
expect_text make-tokens "(byte-level, vocabulary 256)"
small="-D B=4 -D S=32"

# the loss starts at about ln 256 (the model family's initialisation, gpt2: a uniform guess over
# bytes) and falls well below it (the example models' sources: below 5.2, a margin under 5.55)
check train 0 "$ntpc" train examples/byte_gpt.ntp --data "$tmp/docs.bin" --steps 40 --lr 3e-3 --warmup 4 $small
cat "$tmp/out" | sed -n '1,4p;$p'
expect_text train "init: gpt2, std 0.02 (the model family's; --init to choose)"
first=$(sed -n 's/^step *1\/40  loss \([0-9.]*\).*/\1/p' "$tmp/out")
last=$(sed -n 's/^step *40\/40  loss \([0-9.]*\).*/\1/p' "$tmp/out")
if [ -n "$first" ] && [ -n "$last" ] && awk "BEGIN { exit !($first > 5.045 && $first < 6.045 && $last < 5.2) }"; then ok
else bad "the loss went from '$first' to '$last' (expected within 0.5 of ln 256 = 5.545, then below 5.2)"; fi

# --init: every scheme's draws, written with the step's learning rate 0 (the start itself): normal
# (68% within one standard deviation; uniform: 58%) at std 0.02, the residual outputs (wo, w_down) at
# 0.02 / sqrt(2 L) under gpt2 and megatron, biases 0, gains 1; the same numbers sharded any way;
# the comparison (the model's own) starts far above ln 256
initp() { # initp NAME ARGS...: the start's parameters into NAME.st
  n=$1; shift
  check "init-$n" 0 "$ntpc" train examples/byte_gpt.ntp --data "$tmp/docs.bin" --steps 1 $small --lr 0 --weight-decay 0 \
    --save-params "$tmp/init_$n.st" "$@"
}
initp gpt2
initp gpt2-plan --plan tests/plans/byte_gpt_two4.ntp
initp llama --init llama
initp uniform --init uniform --init-std 0.05
initp comparison --init comparison
l0=$(sed -n 's/^step *1\/1  loss \([0-9.]*\).*/\1/p' "$tmp/out")
if [ -n "$l0" ] && awk "BEGIN { exit !($l0 > 10) }"; then ok; else bad "--init comparison: first loss '$l0', expected far above ln 256"; fi
if "$py" - "$tmp" <<'PYEOF'; then ok; else bad "--init: the draws are not what the schemes say"; fi
import json, math, struct, sys
import numpy as np
shapes = {}
def read(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    head = json.loads(data[8:8 + n])
    shapes.update({k: v["shape"] for k, v in head.items() if k != "__metadata__"})
    return {k: np.frombuffer(data[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], "<f4")
            for k, v in head.items() if k != "__metadata__"}
t = sys.argv[1]
g, gp, ll, un = (read(f"{t}/init_{n}.st") for n in ("gpt2", "gpt2-plan", "llama", "uniform"))
bad = []
def near(name, x, std):
    s, within = float(x.std()), float(np.mean(np.abs(x) < x.std()))
    print(f"{name}: std {s:.5f} (want {std:.5f}), mean {float(x.mean()):+.5f}, within one std {within:.3f}")
    if abs(s / std - 1) > 0.05 or abs(float(x.mean())) > 0.1 * std: bad.append(name)
    return within
mats = [k for k in g if len(shapes[k]) >= 2]
for k in mats:
    want = 0.02 / math.sqrt(2 * 2) if k.endswith((".wo", ".w_down")) else 0.02
    w = near("gpt2 " + k, g[k], want)
    if not 0.66 < w < 0.71: bad.append("gpt2 normal " + k)
    near("llama " + k, ll[k], 0.02)
    if not 0.55 < near("uniform " + k, un[k], 0.05) < 0.61: bad.append("uniform " + k)
for k in g:
    if not np.array_equal(g[k], gp[k]): bad.append("sharded " + k)
    if len(shapes[k]) < 2 and not (np.all(g[k] == 0) or np.all(g[k] == 1)): bad.append("vector " + k)
print("bad:", bad)
sys.exit(1 if bad else 0)
PYEOF
# a Llama-shaped model (RMS norms) starts from llama's scheme, at ln 256 too
check init-llama 0 "$ntpc" train tests/numeric/train_llama.ntp --data "$tmp/docs.bin" --steps 1
expect_text init-llama "init: llama, std 0.02 (the model family's; --init to choose)"
l0=$(sed -n 's/^step *1\/1  loss \([0-9.]*\).*/\1/p' "$tmp/out")
if [ -n "$l0" ] && awk "BEGIN { exit !($l0 > 5.045 && $l0 < 6.045) }"; then ok; else bad "llama: first loss '$l0', expected within 0.5 of 5.545"; fi
check init-bad 2 "$ntpc" train examples/byte_gpt.ntp --data "$tmp/docs.bin" --steps 1 $small --init xavier
expect_text init-bad "--init xavier: expected gpt2, megatron, llama, uniform or comparison"
check init-and-params 2 "$ntpc" train examples/byte_gpt.ntp --data "$tmp/docs.bin" --steps 1 $small --init-std 0.02 --params README.md
expect_text init-and-params "give one"

# determinism: the same seed and data give bitwise-identical parameters and losses
check det-a 0 "$ntpc" train examples/byte_gpt.ntp --data "$tmp/docs.bin" --steps 6 --shuffle --seed 3 $small --save-params "$tmp/a.st"
grep '^step' "$tmp/out" | sed 's/  [0-9]* tokens\/s$//' >"$tmp/a.log"
check det-b 0 "$ntpc" train examples/byte_gpt.ntp --data "$tmp/docs.bin" --steps 6 --shuffle --seed 3 $small --save-params "$tmp/b.st"
grep '^step' "$tmp/out" | sed 's/  [0-9]* tokens\/s$//' >"$tmp/b.log"
if cmp -s "$tmp/a.st" "$tmp/b.st" && cmp -s "$tmp/a.log" "$tmp/b.log"; then ok; else bad "two runs with one seed differ"; fi
check det-c 0 "$ntpc" train examples/byte_gpt.ntp --data "$tmp/docs.bin" --steps 6 --shuffle --seed 4 $small --save-params "$tmp/c.st"
if cmp -s "$tmp/a.st" "$tmp/c.st"; then bad "another shuffle seed gives the same parameters"; else ok; fi

# sharded: 7 ranks in groups of 4 and 3 print the unsharded run's losses
check sharded 0 "$ntpc" train examples/byte_gpt.ntp --data "$tmp/docs.bin" --steps 6 --shuffle --seed 3 $small --plan examples/plans/byte_gpt_7.ntp
expect_text sharded "backend cpu (simulated): 7 ranks"
grep '^step' "$tmp/out" | sed 's/  [0-9]* tokens\/s$//' >"$tmp/s.log"
if awk 'NR == FNR { a[FNR] = $4; next } { d = a[FNR] - $4; if (d < 0) d = -d; if (d > 1e-5 * $4) bad = 1 } END { exit bad }' "$tmp/a.log" "$tmp/s.log"; then ok; else
  bad "the sharded losses differ from the unsharded ones"; paste "$tmp/a.log" "$tmp/s.log"; fi

# ntpc run --train: the sharded loss and every gradient against the unsharded ones, all ok
check run-train 0 "$ntpc" run examples/byte_gpt.ntp --train $small --plan examples/plans/byte_gpt_7.ntp
n_ok=$(grep -c 'vs unsharded: .* ok$' "$tmp/out")
if [ "$n_ok" -eq 37 ]; then ok; else bad "ntpc run --train: $n_ok of 37 outputs ok"; fi

# checkpoints: 3 steps saved, then resumed to 6, equal the 6 steps run straight, bitwise; resumed
# under a 7-rank plan, the same losses; a damaged state file is refused
ck="--data $tmp/docs.bin $small --shuffle --seed 2 --min-lr-frac 1 --lr 2e-3"
check ckpt-straight 0 "$ntpc" train examples/byte_gpt.ntp $ck --steps 6 --save-params "$tmp/straight.st"
grep '^step *[4-6]/' "$tmp/out" | sed 's/  [0-9]* tokens\/s$//' >"$tmp/straight.log"
check ckpt-save 0 "$ntpc" train examples/byte_gpt.ntp $ck --steps 3 --checkpoint "$tmp/ck"
expect_text ckpt-save "checkpoint: $tmp/ck at step 3"
check ckpt-resume 0 "$ntpc" train examples/byte_gpt.ntp $ck --steps 6 --resume "$tmp/ck" --save-params "$tmp/resumed.st"
expect_text ckpt-resume "resumed from $tmp/ck at step 3"
grep '^step' "$tmp/out" | sed 's/  [0-9]* tokens\/s$//' >"$tmp/resumed.log"
if cmp -s "$tmp/straight.log" "$tmp/resumed.log" && cmp -s "$tmp/straight.st" "$tmp/resumed.st"; then ok; else
  bad "a resumed run differs from the straight one"; paste "$tmp/straight.log" "$tmp/resumed.log"; fi
check ckpt-replan 0 "$ntpc" train examples/byte_gpt.ntp $ck --steps 6 --resume "$tmp/ck" --plan examples/plans/byte_gpt_7.ntp
grep '^step' "$tmp/out" | sed 's/  [0-9]* tokens\/s$//' >"$tmp/replan.log"
if awk 'NR == FNR { a[FNR] = $4; next } { d = a[FNR] - $4; if (d < 0) d = -d; if (d > 1e-5 * $4) bad = 1 } END { exit bad }' "$tmp/straight.log" "$tmp/replan.log"; then ok; else
  bad "resumed under another plan: other losses"; paste "$tmp/straight.log" "$tmp/replan.log"; fi
# a sharded run's checkpoint (each rank writes the elements it owns of its slices; nothing is
# gathered): resumed under the same plan, bitwise the straight sharded run; resumed unsharded,
# the unsharded losses
s7="--plan examples/plans/byte_gpt_7.ntp"
check ckpt7-straight 0 "$ntpc" train examples/byte_gpt.ntp $ck --steps 6 $s7 --save-params "$tmp/s7.st"
grep '^step *[4-6]/' "$tmp/out" | sed 's/  [0-9]* tokens\/s$//' >"$tmp/s7.log"
check ckpt7-save 0 "$ntpc" train examples/byte_gpt.ntp $ck --steps 3 $s7 --checkpoint "$tmp/ck7"
check ckpt7-resume 0 "$ntpc" train examples/byte_gpt.ntp $ck --steps 6 $s7 --resume "$tmp/ck7" --save-params "$tmp/r7.st"
grep '^step' "$tmp/out" | sed 's/  [0-9]* tokens\/s$//' >"$tmp/r7.log"
if cmp -s "$tmp/s7.log" "$tmp/r7.log" && cmp -s "$tmp/s7.st" "$tmp/r7.st"; then ok; else
  bad "a sharded run resumed from its own checkpoint differs from the straight one"; paste "$tmp/s7.log" "$tmp/r7.log"; fi
check ckpt7-unsharded 0 "$ntpc" train examples/byte_gpt.ntp $ck --steps 6 --resume "$tmp/ck7"
grep '^step' "$tmp/out" | sed 's/  [0-9]* tokens\/s$//' >"$tmp/u7.log"
if awk 'NR == FNR { a[FNR] = $4; next } { d = a[FNR] - $4; if (d < 0) d = -d; if (d > 1e-5 * $4) bad = 1 } END { exit bad }' "$tmp/straight.log" "$tmp/u7.log"; then ok; else
  bad "a sharded checkpoint resumed unsharded: other losses"; paste "$tmp/straight.log" "$tmp/u7.log"; fi
# killed during a save (NTP_FAILPOINT: the state file of step 4 written, the index not yet): the
# checkpoint of step 2 stays in force, and the run resumed from it ends with the straight losses
check ckpt-killed 137 env NTP_FAILPOINT=checkpoint:4 "$ntpc" train examples/byte_gpt.ntp $ck --steps 6 --checkpoint "$tmp/ckk" --checkpoint-every 2
check ckpt-after-kill 0 "$ntpc" train examples/byte_gpt.ntp $ck --steps 6 --resume "$tmp/ckk" --save-params "$tmp/k.st"
expect_text ckpt-after-kill "resumed from $tmp/ckk at step 2"
grep '^step *[4-6]/' "$tmp/out" | sed 's/  [0-9]* tokens\/s$//' >"$tmp/k.log"
if cmp -s "$tmp/straight.log" "$tmp/k.log" && cmp -s "$tmp/straight.st" "$tmp/k.st"; then ok; else
  bad "resumed after a kill in a save: not the straight run"; paste "$tmp/straight.log" "$tmp/k.log"; fi
printf 'X' | dd of="$tmp/ck/ckpt-3.safetensors" bs=1 seek=2000 conv=notrunc 2>/dev/null
check ckpt-damaged 1 "$ntpc" train examples/byte_gpt.ntp $ck --steps 6 --resume "$tmp/ck"
expect_text ckpt-damaged "(a damaged checkpoint)"
check ckpt-none 1 "$ntpc" train examples/byte_gpt.ntp $ck --steps 6 --resume "$tmp/nowhere"
expect_text ckpt-none "no checkpoint index"

# --fail-at: GPUs fail mid-run; the survivors re-plan, take the state from the surviving replicas
# and go on with the same batches: the uninterrupted run's losses and parameters. Where a failed GPU
# held the only copy, the run goes back to its checkpoint; without one, an error.
# (AdamW's eps 1e-4: see tests/equiv/train_compare.h, a key bias's round-off gradient)
fa="examples/byte_gpt.ntp --data $tmp/docs.bin $small --steps 6 --shuffle --seed 2 --eps 1e-4"
check fail-ref 0 "$ntpc" train $fa --save-params "$tmp/fref.st"
grep '^step' "$tmp/out" | sed 's/  [0-9]* tokens\/s$//' >"$tmp/fref.log"
same_losses() { # each step's last loss (a run that went back to a checkpoint took some steps twice)
  grep '^step *[0-9]*/' "$tmp/out" | awk '{ split($2, s, "/"); l[s[1]] = $4 } END { for (i = 1; i <= 6; i++) print "step", i, "loss", l[i] }' >"$tmp/f.log"
  if awk 'NR == FNR { a[FNR] = $4; next } { d = a[FNR] - $4; if (d < 0) d = -d; if (d > 1e-5 * $4 || $4 == "") bad = 1; n++ } END { exit bad || n != 6 }' "$tmp/fref.log" "$tmp/f.log"; then ok; else
    bad "$1: the losses differ from the uninterrupted run's"; paste "$tmp/fref.log" "$tmp/f.log"; fi
}
check fail-replica 0 "$ntpc" train $fa --plan tests/plans/byte_gpt_two4.ntp --fail-at 4:3 --save-params "$tmp/f1.st"
expect_text fail-replica "step    4: GPU 3 failed; the planner re-plans for the 7 survivors:"
expect_text fail-replica "(no checkpoint read)"
same_losses fail-replica
if "$py" tests/emu/compare_params.py "$tmp/fref.st" "$tmp/f1.st" 1e-5 >"$tmp/cmp" 2>&1; then ok; else
  bad "after a failure the parameters differ from the uninterrupted run's: $(cat "$tmp/cmp")"; fi
check fail-twice 0 "$ntpc" train $fa --plan tests/plans/byte_gpt_two4.ntp --fail-at 3:3,5:6
expect_text fail-twice "re-plans for the 6 survivors"
same_losses fail-twice
rm -rf "$tmp/fck"
check fail-ckpt 0 "$ntpc" train $fa --plan examples/plans/byte_gpt_7.ntp --fail-at 4:3 --checkpoint "$tmp/fck" --checkpoint-every 2
expect_text fail-ckpt "back to the checkpoint of step 2"
same_losses fail-ckpt
check fail-nockpt 1 "$ntpc" train $fa --plan examples/plans/byte_gpt_7.ntp --fail-at 4:3
expect_text fail-nockpt "no checkpoint to fall back on"
# pipeline stages (2 replicas x 2 stages x 2 GPUs, 2 micro-batches): GPU 3 lost (its stage one GPU
# short, the layers cut again), then GPU 4 (the other replica's first stage); the stages' state from
# the other replica; a single pipeline losing its only copies goes back to its checkpoint
ppf="--plan tests/plans/byte_gpt_pp_two4.ntp --micro-batches 2"
check fail-pp 0 "$ntpc" train $fa $ppf --fail-at 4:3 --save-params "$tmp/fpp.st"
expect_text fail-pp "pipeline batch "
expect_text fail-pp "(no checkpoint read)"
same_losses fail-pp
if "$py" tests/emu/compare_params.py "$tmp/fref.st" "$tmp/fpp.st" 1e-5 >"$tmp/cmp" 2>&1; then ok; else
  bad "after a stage's failure the parameters differ from the uninterrupted run's: $(cat "$tmp/cmp")"; fi
check fail-pp-twice 0 "$ntpc" train $fa $ppf --fail-at 3:3,5:4
expect_text fail-pp-twice "re-plans for the 6 survivors"
same_losses fail-pp-twice
# interleaved stages (two rank sets of two chunks a replica): the set one GPU short runs its two
# chunks as smaller groups, the cut kept, its replica fewer rows; the state from the other replica
check fail-pp-inter 0 "$ntpc" train $fa --plan tests/plans/byte_gpt_pp_inter8.ntp --fail-at 3:3
expect_text fail-pp-inter "      stage blk.0.ln2 .. blk.0.mlp ranks 2..2;"
expect_text fail-pp-inter "(no checkpoint read)"
same_losses fail-pp-inter
rm -rf "$tmp/fppck"
check fail-pp-ckpt 0 "$ntpc" train $fa --plan tests/plans/byte_gpt_pp2.ntp --fail-at 4:1 --checkpoint "$tmp/fppck" --checkpoint-every 2
expect_text fail-pp-ckpt "back to the checkpoint of step 2"
same_losses fail-pp-ckpt
# a replica that lost a whole stage is dropped, its other GPUs idle (the survivors' world leaves them
# out), and a repair brings it back; then three replicas losing a GPU each in two of them: the
# failures packed into one replica (GPU 1 moves to fill replica 1's hole) where the planner finds
# that faster (3 heads: a stage of 2 GPUs splits them 2/1; 1.3% more rows per unit of time), the
# state handed over as after any failure; with 12 heads and 48 rows packing gains 0.6%, under the 1%
# it must: each replica keeps its survivors
check fail-pp-drop 0 "$ntpc" train $fa $ppf --fail-at 2:2,2:3 --join-at 4:2
expect_text fail-pp-drop "// dropped: replica 0, a stage without a GPU; idle: GPU 0 GPU 1"
expect_text fail-pp-drop "step    4: GPU 2 back, repaired; the planner re-plans for the 7 GPUs:"
same_losses fail-pp-drop
cp "$tmp/fref.log" "$tmp/fref_fa.log"
pk="examples/byte_gpt.ntp --data $tmp/docs.bin -D B=24 -D S=32 -D D=96 -D H=3 --steps 6 --shuffle --seed 2 --eps 1e-4"
check pack-ref 0 "$ntpc" train $pk
grep '^step' "$tmp/out" | sed 's/  [0-9]* tokens\/s$//' >"$tmp/fref.log"
check pack 0 "$ntpc" train $pk --plan tests/plans/byte_gpt_pp_three4.ntp --fail-at 3:3,3:4
expect_text pack "// packed: GPU 1 of replica 0 serves replica 1's stage 0 as rank 2"
same_losses pack
check pack-plan 0 "$ntpc" plan examples/byte_gpt.ntp -D B=24 -D S=32 -D D=96 -D H=3 --train \
  --plan tests/plans/byte_gpt_pp_three4.ntp --fail 3,4 -o "$tmp/packed.ntp"
expect_text pack-plan "rank r of the plan is physical GPU: 0 2 1 5 6 7 8 9 10 11"
check pack-spread 0 "$ntpc" plan examples/byte_gpt.ntp -D B=48 -D S=32 -D D=96 -D H=12 --train -o "$tmp/spread.ntp" \
  --plan tests/plans/byte_gpt_pp_three4.ntp --fail 3,4
expect_text pack-spread "rank r of the plan is physical GPU: 0 1 2 5 6 7 8 9 10 11"
cp "$tmp/fref_fa.log" "$tmp/fref.log"
# --join-at: a failed GPU repaired and back: the planner returns to the healthy plan (or re-plans for
# the larger world while others are still down), the newcomer's state from the ranks that hold it;
# the uninterrupted run's losses and parameters
check join 0 "$ntpc" train $fa --plan tests/plans/byte_gpt_two4.ntp --fail-at 2:3 --join-at 4:3 --save-params "$tmp/fj.st"
expect_text join "step    4: GPU 3 back, repaired; the planner re-plans for the 8 GPUs:"
expect_text join "the healthy plan (tests/plans/byte_gpt_two4.ntp), every GPU back"
same_losses join
if "$py" tests/emu/compare_params.py "$tmp/fref.st" "$tmp/fj.st" 1e-5 >"$tmp/cmp" 2>&1; then ok; else
  bad "after a repair the parameters differ from the uninterrupted run's: $(cat "$tmp/cmp")"; fi
check join-partial 0 "$ntpc" train $fa $ppf --fail-at 2:3,3:6 --join-at 5:6
expect_text join-partial "step    5: GPU 6 back, repaired; the planner re-plans for the 7 GPUs:"
same_losses join-partial
check join-notdown 1 "$ntpc" train $fa --plan tests/plans/byte_gpt_two4.ntp --fail-at 2:3 --join-at 3:5
expect_text join-notdown "--join-at 3:5: GPU 5 is not down"
check join-usage 2 "$ntpc" train $fa --plan tests/plans/byte_gpt_two4.ntp --join-at 3:5
expect_text join-usage "--join-at brings back a GPU --fail-at failed: give --fail-at too"
# --slow: GPU 3 twice as slow (the run's timeline); found within 3 steps, the plan re-split around
# it (its groups cut, its rows to the others), the state moved live: at least 80% of what it cost
# recovered on the timeline, and the losses of the run without it
sl="examples/byte_gpt.ntp --data $tmp/docs.bin -D B=32 -D S=32 -D D=96 -D H=12 --steps 6 --shuffle --seed 2 --eps 1e-4"
check slow-ref 0 "$ntpc" train $sl
grep '^step' "$tmp/out" | sed 's/  [0-9]* tokens\/s$//' >"$tmp/fref.log"
check slow 0 "$ntpc" train $sl --plan tests/plans/byte_gpt_two4.ntp --slow 3:2
expect_text slow "step    3: GPU 3 is slow: 2.00x the median GPU's time per operation, 3 steps in a row"
expect_text slow "(no checkpoint read)"
same_losses slow
rec=$(sed -n 's/.* \([0-9-]*\)% of what the straggler cost recovered.*/\1/p' "$tmp/out")
if [ -n "$rec" ] && [ "$rec" -ge 80 ]; then ok; else bad "slow: $rec% of the straggler's cost recovered (at least 80 expected)"; fi
echo "slow: ${rec}% of the straggler's cost recovered on the timeline"
# --slow on a staged plan: the straggler's replica cut again around it (its stage fewer layers, its
# replica fewer rows), its stage without it, or its stage's GPUs split around it (the straggler a
# group of its own inside its stage, fewer rows), the fastest on the timeline: at least 80% of what
# it cost recovered (76% without the third way); then a failure and a repair whose re-plans keep
# cutting around it; the losses of the run without any of it
check slow-pp 0 "$ntpc" train $sl $ppf --slow 3:2
expect_text slow-pp "step    3: GPU 3 is slow: 2.00x"
expect_text slow-pp "  the fastest, its stage's GPUs split around it:"
same_losses slow-pp
rec=$(sed -n 's/.* \([0-9-]*\)% of what the straggler cost recovered.*/\1/p' "$tmp/out")
if [ -n "$rec" ] && [ "$rec" -ge 80 ]; then ok; else bad "slow-pp: $rec% of the straggler's cost recovered (at least 80 expected)"; fi
echo "slow-pp: ${rec}% of the straggler's cost recovered on the timeline (a staged plan)"
check slow-pp-fail 0 "$ntpc" train $sl $ppf --slow 3:2 --fail-at 4:6 --join-at 6:6
expect_text slow-pp-fail "step    4: GPU 6 failed; the planner re-plans for the 7 survivors:"
expect_text slow-pp-fail "step    6: GPU 6 back, repaired; the planner re-plans for the 8 GPUs:"
same_losses slow-pp-fail
# ... and after a failure: the survivors' plan (7 GPUs) re-split around the straggler
check slow-fail 0 "$ntpc" train $sl --plan tests/plans/byte_gpt_two4.ntp --fail-at 2:6 --slow 3:2
expect_text slow-fail "step    3: GPU 3 is slow: 2.00x"
expect_text slow-fail "    world 7;"
same_losses slow-fail
check slow-usage 2 "$ntpc" train $fa --plan tests/plans/byte_gpt_two4.ntp --slow 3:0.5
expect_text slow-usage "--slow 3:0.5: expected GPU:FACTOR"
check fail-usage 2 "$ntpc" train $fa --fail-at 4:1
expect_text fail-usage "--fail-at needs a sharded run"

# --params: training goes on from saved parameters (the loss starts where it was)
check resume 0 "$ntpc" train examples/byte_gpt.ntp --data "$tmp/docs.bin" --steps 2 $small --params "$tmp/a.st"
r1=$(sed -n 's/^step *1\/2  loss \([0-9.]*\).*/\1/p' "$tmp/out")
if [ -n "$r1" ] && awk "BEGIN { exit !($r1 < $first) }"; then ok; else bad "resumed loss '$r1' not below the first step's '$first'"; fi

# --dump: step 1's inputs, parameters, loss and a gradient per parameter
check dump 0 "$ntpc" train examples/byte_gpt.ntp --data "$tmp/docs.bin" --steps 1 $small --dump "$tmp/d"
nparams=$(grep -c '^param	' "$tmp/d/manifest.tsv" 2>/dev/null)
ngrads=$(grep -c '^output	grad\.' "$tmp/d/manifest.tsv" 2>/dev/null)
if [ "${nparams:-0}" -gt 0 ] && [ "${ngrads:-0}" -eq "$nparams" ] && grep -q '^output	loss	' "$tmp/d/manifest.tsv"; then ok; else
  bad "--dump: $nparams parameters, $ngrads gradients in the manifest"; cat "$tmp/d/manifest.tsv" 2>/dev/null | head; fi

# errors
check no-data 2 "$ntpc" train examples/byte_gpt.ntp;   expect_text no-data "--data TOKENS is required"
check bad-option 2 "$ntpc" train examples/byte_gpt.ntp --data x --frobnicate; expect_text bad-option "unknown option '--frobnicate'"
check bad-world 2 "$ntpc" train examples/byte_gpt.ntp --data x --world 0; expect_text bad-world "expected 1 to 4096 ranks"
check bad-lr 2 "$ntpc" train examples/byte_gpt.ntp --data x --lr -1; expect_text bad-lr "expected a number of 0 or more"
check not-tokens 1 "$ntpc" train examples/byte_gpt.ntp --data README.md; expect_text not-tokens "not an llm.c token file"
check no-loss 1 "$ntpc" train examples/gpt2.ntp --data "$tmp/docs.bin" -D B=1 -D S=8 -D D=16 -D H=2 -D V=256 -D L=1
expect_text no-loss "training needs a scalar loss output"
check small-vocab 1 "$ntpc" train examples/byte_gpt.ntp --data "$tmp/docs.bin" -D V=64 $small
expect_text small-vocab "outside the model's vocabulary of 64"
check too-short 1 "$ntpc" train examples/byte_gpt.ntp --data "$tmp/docs.bin" -D B=4096 -D S=128 --steps 1
expect_text too-short "a batch of 4096 x 128 needs"

# the C ABI of a training library: the same losses as ntpc train (a constant rate; the library
# starts from the model's own initialisation, --init comparison), and a forward that leaves the
# parameters as they are
check train-lib 0 "$ntpc" examples/byte_gpt.ntp $small --train --plan examples/plans/byte_gpt_7.ntp -o "$tmp/bg.so"
# NTP_TEST_CFLAGS: a sanitized build's flags (its runtime must come first in the program)
check train-abi-cc 0 ${CC:-cc} -std=c17 -Wall -Wextra -Werror ${NTP_TEST_CFLAGS:-} tests/unit/train_abi.c -Iruntime -ldl -lm -o "$tmp/train_abi"
check train-abi 0 "$tmp/train_abi" "$tmp/bg.so" "$tmp/docs.bin" 4 3e-3
expect_text train-abi "unchanged by a forward"
grep '^step' "$tmp/out" >"$tmp/abi.log"
check train-cli 0 "$ntpc" train examples/byte_gpt.ntp --data "$tmp/docs.bin" --steps 4 --lr 3e-3 --min-lr-frac 1 $small --plan examples/plans/byte_gpt_7.ntp --init comparison
grep '^step' "$tmp/out" | sed 's/  lr.*//' >"$tmp/cli.log"
if [ -s "$tmp/abi.log" ] && cmp -s "$tmp/abi.log" "$tmp/cli.log"; then ok; else
  bad "the library's train steps differ from ntpc train's"; paste "$tmp/abi.log" "$tmp/cli.log"; fi
# ntp_model_init: the library started as ntpc train starts by default (the model family's: gpt2)
check train-abi-init 0 "$tmp/train_abi" "$tmp/bg.so" "$tmp/docs.bin" 4 3e-3 cpu family
grep '^step' "$tmp/out" >"$tmp/abi_init.log"
check train-cli-init 0 "$ntpc" train examples/byte_gpt.ntp --data "$tmp/docs.bin" --steps 4 --lr 3e-3 --min-lr-frac 1 $small --plan examples/plans/byte_gpt_7.ntp
grep '^step' "$tmp/out" | sed 's/  lr.*//' >"$tmp/cli_init.log"
if [ -s "$tmp/abi_init.log" ] && cmp -s "$tmp/abi_init.log" "$tmp/cli_init.log" && ! cmp -s "$tmp/abi.log" "$tmp/abi_init.log"; then ok
else bad "ntp_model_init: the library's steps differ from ntpc train's default"; paste "$tmp/abi_init.log" "$tmp/cli_init.log"; fi
check train-abi-init-bad 1 "$tmp/train_abi" "$tmp/bg.so" "$tmp/docs.bin" 1 3e-3 cpu xavier
expect_text train-abi-init-bad "no initialisation 'xavier' (gpt2, megatron, llama, uniform or comparison)"

# a model with a loss makes a forward library too (its CUDA kernels include the loss's)
check loss-lib 0 "$ntpc" examples/byte_gpt.ntp $small -o "$tmp/m.so"
if [ -s "$tmp/m.so" ]; then ok; else bad "no model library was written"; fi

# the vocabulary-parallel loss: at 7 ranks with the head's vocabulary split 7 ways, each rank
# computes its rows' statistics (ce_stats) and the logits are never gathered; unsharded, the
# loss is cross_entropy itself
check vp-loss 0 "$ntpc" examples/byte_gpt.ntp $small --train --plan examples/plans/byte_gpt_7.ntp --emit=sharded-ir
n_stats=$(grep -c ' = ce_stats t' "$tmp/out")
n_ce=$(grep -c ' = cross_entropy t' "$tmp/out")
if [ "$n_stats" -eq 7 ] && [ "$n_ce" -eq 0 ] && grep -q ' = ce_mean t' "$tmp/out"; then ok; else
  bad "the sharded loss: $n_stats ce_stats steps (expected 7), $n_ce cross_entropy steps (expected 0)"; fi
check vp-loss-dp 0 "$ntpc" examples/byte_gpt.ntp $small --train --plan tests/plans/byte_gpt_dp4.ntp --emit=sharded-ir
if [ "$(grep -c ' = ce_stats t' "$tmp/out")" -eq 4 ] && ! grep -q ' = cross_entropy t' "$tmp/out"; then ok; else
  bad "four data-parallel replicas: the loss is not computed where the rows are"; fi
check vp-loss-whole 0 "$ntpc" examples/byte_gpt.ntp $small --train --world 1 --emit=sharded-ir
if grep -q ' = cross_entropy t' "$tmp/out" && ! grep -q ce_stats "$tmp/out"; then ok; else bad "one rank: the loss is not cross_entropy"; fi

# recompute: the same losses and parameters bit for bit as without it, a lower activation peak on
# the busiest rank
rca="--data $tmp/docs.bin --steps 3 --shuffle --seed 3 $small"
check rc-off 0 "$ntpc" train examples/byte_gpt.ntp $rca --plan examples/plans/byte_gpt_7.ntp --save-params "$tmp/rc0.st"
grep '^step' "$tmp/out" | sed 's/  [0-9]* tokens\/s$//' >"$tmp/rc0.log"
check rc-on 0 "$ntpc" train examples/byte_gpt.ntp $rca --plan tests/plans/byte_gpt_7_recompute.ntp --save-params "$tmp/rc1.st"
grep '^step' "$tmp/out" | sed 's/  [0-9]* tokens\/s$//' >"$tmp/rc1.log"
if cmp -s "$tmp/rc0.st" "$tmp/rc1.st" && cmp -s "$tmp/rc0.log" "$tmp/rc1.log"; then ok; else bad "recompute changed the training"; fi
# the largest activation peak over the ranks, in bytes
peak() {
  sed -n '/^totals per step/,/all ranks/p' "$tmp/out" | awk '$1 ~ /^[0-9]+$/ {
    v = $6; if ($7 == "KiB") v *= 1024; else if ($7 == "MiB") v *= 1048576; if (v > m) m = v } END { print m }'
}
check rc-report-off 0 "$ntpc" report examples/byte_gpt.ntp $small --train --plan examples/plans/byte_gpt_7.ntp
p0=$(peak)
check rc-report-on 0 "$ntpc" report examples/byte_gpt.ntp $small --train --plan tests/plans/byte_gpt_7_recompute.ntp
expect_text rc-report-on "recompute: 4 layers (blk.0.attn, blk.0.mlp, blk.1.attn, blk.1.mlp) run their forward again"
p1=$(peak)
if [ -n "$p0" ] && [ -n "$p1" ] && awk "BEGIN { exit !($p1 < $p0) }"; then ok; else
  bad "recompute: the largest activation peak $p1 bytes, without it $p0 (expected lower)"; fi
check rc-run 0 "$ntpc" run examples/byte_gpt.ntp --train $small --plan tests/plans/byte_gpt_7_recompute.ntp
n_ok=$(grep -c 'vs unsharded: .* ok$' "$tmp/out")
if [ "$n_ok" -eq 37 ]; then ok; else bad "ntpc run --train with recompute: $n_ok of 37 outputs ok"; fi

# ntpc plan --train: a training step's costs; the training program compiles under the plan (the flat search:
# --stages 1; pipelined plans are tests/planner/pipeline_cli.sh's)
check plan-fwd 0 "$ntpc" plan examples/byte_gpt.ntp --stages 1 --world 8 --gpu h200 -o "$tmp/pf.ntp" --svg "$tmp/pf.svg"
fwd=$(sed -n 's/^predicted step time (forward): \([0-9.]*\) us.*/\1/p' "$tmp/out")
check plan-train 0 "$ntpc" plan examples/byte_gpt.ntp --stages 1 --world 8 --gpu h200 --train -o "$tmp/pt.ntp" --svg "$tmp/pt.svg"
expect_text plan-train "compiler check: the training program (forward, backward, gradient sync) compiles for 8 ranks"
expect_text plan-train "training state"
trn=$(sed -n 's/^predicted step time (training: forward, backward, gradient sync): \([0-9.]*\) us.*/\1/p' "$tmp/out")
if [ -n "$fwd" ] && [ -n "$trn" ] && awk "BEGIN { exit !($trn > 2.5 * $fwd) }"; then ok; else
  bad "plan --train: a training step of $trn us against a forward of $fwd us (expected more than 2.5 times)"; fi
# where memory binds, the training plan recomputes layers; the plan trains as the model does unsharded
check plan-rc 0 "$ntpc" plan examples/byte_gpt.ntp --stages 1 -D B=8 -D S=64 --world 4 --gpu h100 --train --mem-cap 0.004 -o "$tmp/prc.ntp" --svg "$tmp/prc.svg"
expect_text plan-rc "memory binds"
if grep -q 'recompute;' "$tmp/prc.ntp"; then ok; else bad "plan --train under a tight cap recomputes no layer"; cat "$tmp/prc.ntp"; fi
pa="--data $tmp/docs.bin --steps 2 --seed 4 -D B=8 -D S=64"
check plan-rc-ref 0 "$ntpc" train examples/byte_gpt.ntp $pa
grep '^step' "$tmp/out" | sed 's/  [0-9]* tokens\/s$//' >"$tmp/prc0.log"
check plan-rc-train 0 "$ntpc" train examples/byte_gpt.ntp $pa --plan "$tmp/prc.ntp"
grep '^step' "$tmp/out" | sed 's/  [0-9]* tokens\/s$//' >"$tmp/prc1.log"
if awk 'NR == FNR { a[FNR] = $4; next } { d = a[FNR] - $4; if (d < 0) d = -d; if (d > 1e-5 * $4) bad = 1 } END { exit bad }' "$tmp/prc0.log" "$tmp/prc1.log"; then ok; else
  bad "the planned training's losses differ from the unsharded ones"; paste "$tmp/prc0.log" "$tmp/prc1.log"; fi
check plan-train-noloss 1 "$ntpc" plan examples/gpt2.ntp --world 2 --train -o "$tmp/pn.ntp" --svg "$tmp/pn.svg"
expect_text plan-train-noloss "training needs a scalar loss output"
if [ -e "$tmp/pn.ntp" ]; then bad "plan --train wrote a plan for a model without a loss"; else ok; fi

echo "train.sh: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
