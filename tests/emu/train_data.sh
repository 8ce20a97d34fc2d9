# train_data.sh — sourced by train.sh, train_epilogues.sh and train_procs.sh (with $py and $tmp set): the token file
# both train on and the options every run shares, so that their runs compare with each other's.
# The text: the example models' sources, not the docs, which change with every edit (after one
# edit of docs/training.md a bias at round-off level came out 1.9e-5 of the parameters' scale from
# the CPU run's, in every CUDA mode alike).
"$py" tools/make_tokens.py "$tmp/docs.bin" --text examples/byte_gpt.ntp examples/gpt2.ntp examples/llama_block.ntp >/dev/null || { echo "[FAIL] make_tokens"; exit 1; }
common="--data $tmp/docs.bin --steps 3 --init-std 0.02 --eps 1e-4 --shuffle --seed 5 -q"
