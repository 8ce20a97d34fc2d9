#!/bin/sh
# run_example.sh NTPC MODEL [ntpc options...]
# Runs a model on the CPU reference twice with the same seed and once with another:
# the outputs must be finite, not all zero, identical for the same seed (determinism)
# and different for a different seed (the initialisation really depends on it).
set -u
ntpc=$1 model=$2
shift 2
a=$("$ntpc" run "$model" --backend cpu --seed 1 "$@") || { echo "[FAIL] $model: run failed"; exit 1; }
b=$("$ntpc" run "$model" --backend cpu --seed 1 "$@") || exit 1
c=$("$ntpc" run "$model" --backend cpu --seed 2 "$@") || exit 1
echo "$a"
outs() { echo "$1" | grep '^output '; }
if [ "$(outs "$a")" != "$(outs "$b")" ]; then echo "[FAIL] $model: two runs with seed 1 differ"; exit 1; fi
if [ "$(outs "$a")" = "$(outs "$c")" ]; then echo "[FAIL] $model: seeds 1 and 2 give the same outputs"; exit 1; fi
if outs "$a" | grep -Eiq 'nan|inf'; then echo "[FAIL] $model: non-finite output"; exit 1; fi
if outs "$a" | grep -q 'mean|x|=0.000000e+00'; then echo "[FAIL] $model: an output is all zeros"; exit 1; fi
[ -n "$(outs "$a")" ] || { echo "[FAIL] $model: no outputs printed"; exit 1; }
echo "[PASS] $model"
