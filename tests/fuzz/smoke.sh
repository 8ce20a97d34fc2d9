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
harnesses=${*:-source plan safetensors abi program hf inputs checkpoint options}
ntpc=$build/ntpc
seeds=$build/fuzz-seeds
corpus=$build/fuzz-corpus
findings=$build/fuzz-findings
mkdir -p "$seeds" "$corpus" "$findings"

# ---- seeds, rebuilt every time (cheap) ------------------------------------------------
rm -rf "$seeds" && mkdir -p "$seeds/source" "$seeds/plan" "$seeds/safetensors" "$seeds/abi" "$seeds/program" \
  "$seeds/hf" "$seeds/inputs" "$seeds/checkpoint" "$seeds/options"
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

# hf: byte 0 the model, byte 1 its dims, byte 2 the layout (bit 0: hf-llama) and raw (bit 1);
# edit mode with a few (offset, byte) edits; raw mode with a file ntpc wrote in the layout
for m in 0 1 2 3 5 7 9 17 33 65 161; do
  for l in 0 1; do
    printf "\\$(printf '%03o' "$m")\\$(printf '%03o' $((m * 37 % 256)))\\$(printf '%03o' "$l")\\020\\000\\173" >"$seeds/hf/m${m}l$l"
  done
done
if [ -x "$ntpc" ]; then
  printf '\000\000\002' >"$seeds/hf/raw_gpt2"
  "$ntpc" run examples/gpt2.ntp -D B=1 -D S=2 -D D=4 -D H=1 -D V=8 -D L=1 --save-params "$build/fuzz-hf.st" \
    --params-format hf-gpt2 >/dev/null 2>&1 && cat "$build/fuzz-hf.st" >>"$seeds/hf/raw_gpt2"
  rm -f "$build/fuzz-hf.st"
fi
# inputs: byte 0 the reader (0 .npy, 1 named .npy, 2 token file, 3 text, 4 the token reader)
python3 - "$seeds/inputs" <<'PY'
import struct, sys
out = sys.argv[1]
def npy(descr, shape, data):
    h = ("{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)).encode()
    h += b" " * (-(len(h) + 11) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h + data
def tok(ids):
    return struct.pack("<3i", 20240520, 1, len(ids)) + bytes(4 * 253) + struct.pack("<%dH" % len(ids), *ids)
seeds = {
    "npy_i4": b"\x00" + npy("<i4", "(2, 4)", struct.pack("<8i", *range(8))),
    "npy_i8_named": b"\x01" + npy("<i8", "(2, 4)", struct.pack("<8q", *range(8))),
    "npy_u2_big": b"\x00" + npy(">u2", "(2, 4)", struct.pack(">8H", *range(8))),
    "npy_f4": b"\x00" + npy("<f4", "(2, 4)", struct.pack("<8f", *range(8))),
    "npy_b1": b"\x00" + npy("|b1", "(2, 4)", bytes([1, 0] * 4)),
    "tokens": b"\x02" + tok([i % 16 for i in range(20)]),
    "text": b"\x03" + bytes(range(1, 12)),
    "reader": b"\x04\x01\x03\x00\x01\x01\x02" + tok([i % 200 for i in range(40)]),
    "reader_shuffle": b"\x04\x00\x02\x10\x00\x00\x05" + tok([i % 300 for i in range(64)]),
}
for name, data in seeds.items():
    open(f"{out}/{name}", "wb").write(data)
PY
# checkpoint: byte 0 bits (1 the state from the input, 2 the index from fields, 4 a step and a save)
printf '\006\001\000\000\000\000\000\000\000\000\000\010' >"$seeds/checkpoint/fields_good"
printf '\006\002\000\000\000\010\000\000\000\000\002\000' >"$seeds/checkpoint/fields_step2"
printf '\006\001\000\000\000\000\000\000\000\000\000\004' >"$seeds/checkpoint/fields_prev_notes"
printf '\004{"format": "ntp-checkpoint", "version": 1, "step": 1, "file": "ckpt-1.safetensors", "bytes": 5, "fnv1a": "0000000000000000", "data_position": 4, "data_epoch": 0, "previous": ""}' >"$seeds/checkpoint/text"
# options: byte 0 the command (0 train, 1 plan, 2 goodput), then one argument per line
printf '\000m.ntp\n--data\nd.bin\n--fail-at\n2:3,4:1\n--plan\np.ntp\n--lr\n3e-3\n--checkpoint\nck\n' >"$seeds/options/train"
printf '\000m.ntp\n--data=d.bin\n--steps\n20\n--rank\n1\n--backend\ncuda\n--world\n4\n-DB=2\n' >"$seeds/options/train_rank"
printf '\001m.ntp\n--world\n8\n--gpu\nh200\n--mem-cap\n40\n--fail\n3,9\n--train\n' >"$seeds/options/plan"
printf '\002m.ntp\n--gpus\n4096\n--fractions\n0,0.001\n--hw-repair-days\n3-5\n--seed\n7\n' >"$seeds/options/goodput"

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
  case $h in source | plan | hf) set -- "$@" -dict=tests/fuzz/ntp.dict ;; options) set -- "$@" -close_fd_mask=3 ;; esac
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
