#!/bin/sh
# smoke.sh BUILD_DIR SECONDS [HARNESS...] — run the libFuzzer harnesses of a -DNTP_FUZZ=ON
# build, from the source tree, each for SECONDS (0: every seed once, no mutation), on a corpus
# kept in BUILD_DIR/fuzz-corpus/HARNESS and seeded from examples/ and tests/. Fails when a
# harness reports a crash, a sanitizer error, a leak, a timeout or running out of memory; the
# input that did it is left in BUILD_DIR/fuzz-findings/. Prints executions and coverage.
# The long campaign (docs/testing.md): smoke.sh build-fuzz 3600
set -u
build=$1 secs=$2
shift 2
harnesses=${*:-source plan safetensors abi program}
ntpc=$build/ntpc
seeds=$build/fuzz-seeds
corpus=$build/fuzz-corpus
findings=$build/fuzz-findings
mkdir -p "$seeds" "$corpus" "$findings"

# ---- seeds, rebuilt every time (cheap) ------------------------------------------------
rm -rf "$seeds" && mkdir -p "$seeds/source" "$seeds/plan" "$seeds/safetensors" "$seeds/abi" "$seeds/program"
i=0
for f in examples/*.ntp examples/plans/*.ntp tests/errors/*.ntp tests/numeric/*.ntp tests/plans/*.ntp tests/fuzz/fixture.ntp; do
  [ -f "$f" ] || continue
  # the first byte picks the world: spread the seeds over all of them
  printf "\\$(printf '%03o' $((i % 8)))" >"$seeds/source/$i"
  cat "$f" >>"$seeds/source/$i"
  i=$((i + 1))
done
i=0
for f in examples/plans/gpt2_*.ntp tests/plans/llama_block_*.ntp; do
  [ -f "$f" ] || continue
  case $f in *llama_block*) model=1 ;; *) model=0 ;; esac
  printf "\\$(printf '%03o' "$model")" >"$seeds/plan/$i" && cat "$f" >>"$seeds/plan/$i"
  i=$((i + 1))
done
printf '\002plan p for sharded_matmul { world 8; }\n' >"$seeds/plan/mm"
printf '\003plan p for elementwise { world 2; * tp 2; }\n' >"$seeds/plan/ew"
if [ -x "$ntpc" ]; then
  "$ntpc" run tests/fuzz/fixture.ntp --seed 1 --save-params "$seeds/safetensors/fixture" >/dev/null 2>&1 || true
  "$ntpc" run examples/gpt2.ntp -D B=1 -D S=4 -D D=16 -D H=2 -D V=16 -D L=1 --save-params "$seeds/safetensors/gpt2" >/dev/null 2>&1 || true
fi
# program: image payloads (the harness puts the header on), without and with CUDA
if [ -x "$ntpc" ]; then
  for w in 1 2 3; do
    "$ntpc" tests/fuzz/fixture.ntp --world $w --emit=sharded-ir >/dev/null 2>&1 || continue
    "$ntpc" tests/fuzz/fixture.ntp --world $w --emit=image -o "$build/fuzz-image" >/dev/null 2>&1 &&
      tail -c +33 "$build/fuzz-image" >"$seeds/program/w$w"
  done
  "$ntpc" examples/elementwise.ntp --world 2 --emit=image -o "$build/fuzz-image" >/dev/null 2>&1 &&
    tail -c +33 "$build/fuzz-image" >"$seeds/program/elementwise"
  rm -f "$build/fuzz-image"
fi
# abi: create, forward, set a parameter, load, destroy twice, use after destroy
printf '\000\001\001\001\001\002\000\000\000\002\001\001\001\003\000\000\001\004\002\001\001\041\002' >"$seeds/abi/seq1"
printf '\000\001\001\000\001\002\005\000\002\000\004\002\001\001' >"$seeds/abi/seq2"
printf '\000\001\001\001\001\020\001\003\001\001\005\000\005\001' >"$seeds/abi/seq3"

# ---- runs -------------------------------------------------------------------------------
rc=0
for h in $harnesses; do
  bin=$build/tests/fuzz/fuzz_$h
  [ -x "$bin" ] || { echo "smoke.sh: $bin is missing (configure with -DNTP_FUZZ=ON -DCMAKE_C_COMPILER=clang)"; exit 2; }
  mkdir -p "$corpus/$h" "$findings/$h"
  log=$build/fuzz-$h.log
  if [ "$secs" -eq 0 ]; then
    set -- -runs=0
  else
    set -- -max_total_time="$secs"
  fi
  case $h in source | plan) set -- "$@" -dict=tests/fuzz/ntp.dict ;; esac
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 \
    "$bin" "$@" -timeout=20 -rss_limit_mb=3072 -malloc_limit_mb=3072 -max_len=65536 \
    -print_final_stats=1 -artifact_prefix="$findings/$h/" "$corpus/$h" "$seeds/$h" >"$log" 2>&1
  status=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
  ft=$(grep -o 'ft: [0-9]*' "$log" | tail -1)
  units=$(ls "$corpus/$h" | wc -l)
  if [ "$status" -ne 0 ]; then
    rc=1
    echo "[FAIL] fuzz_$h: exit $status after ${execs:-?} executions; the input is in $findings/$h/"
    grep -E 'ERROR|runtime error|SUMMARY|Test unit written|deadly signal|timeout' "$log" | head -20 | sed 's/^/    /'
  else
    echo "[ok] fuzz_$h: ${execs:-?} executions, ${cov:-cov: ?} edges, ${ft:-ft: ?} features, corpus $units, ${secs}s"
  fi
done
exit $rc
