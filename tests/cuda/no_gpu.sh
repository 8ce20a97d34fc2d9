#!/bin/sh
# no_gpu.sh NTPC — without a usable GPU, `--backend cuda` says so and exits 2 (never crashes);
# with one, this test has nothing to check (the GPU check script does the real work).
ntpc=$1
out=$("$ntpc" run examples/gpt2.ntp --backend cuda -D L=1 -D S=8 2>&1)
rc=$?
case $rc in
  0) echo "a GPU is present: skipped"; exit 77 ;;
  2) echo "$out" | grep -Eq "no CUDA GPU|not installed|built without" || { echo "[FAIL] unclear message: $out"; exit 1; }
     echo "[PASS] $out"; exit 0 ;;
  *) echo "[FAIL] exit $rc: $out"; exit 1 ;;
esac
