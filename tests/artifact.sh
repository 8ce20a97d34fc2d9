#!/bin/sh
# artifact.sh NTPC BUILD_DIR — model libraries: `ntpc -o model.so` builds one, the example
# program (examples/run_model.c, nothing but the C ABI) loads and runs it, and its outputs
# equal `ntpc run`'s sharded outputs; then the same from an installed tree via pkg-config.
set -u
ntpc=$1 build=$2
tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
same() { # same NAME FILE_A FILE_B
  if cmp -s "$2" "$3"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "[FAIL] $1"; diff "$2" "$3"; fi
}
toy="-D B=8 -D S=16 -D D=64 -D H=8 -D V=250 -D L=2"

# NTP_TEST_CFLAGS: the sanitizer flags of a sanitized build (its runtime must come first)
cc -std=c17 -Wall -Wextra -Werror ${NTP_TEST_CFLAGS:-} examples/run_model.c -Iruntime -ldl -lm -o "$tmp/run_model" || exit 1

# gpt2 with the mixed plan (degrees 8, 4, 2 and a (5, 3) split)
"$ntpc" examples/gpt2.ntp $toy --plan examples/plans/gpt2_mixed8.ntp -o "$tmp/gpt2.so" || { echo "[FAIL] build"; exit 1; }
[ -e "$tmp/gpt2.so.c" ] && { echo "[FAIL] the generated C was left behind"; fail=$((fail + 1)); }
"$tmp/run_model" "$tmp/gpt2.so" --seed 3 >"$tmp/so.out" || { echo "[FAIL] run_model"; cat "$tmp/so.out"; exit 1; }
"$ntpc" run examples/gpt2.ntp $toy --plan examples/plans/gpt2_mixed8.ntp --seed 3 | grep '^output' | tail -1 >"$tmp/ntpc.out"
grep '^output' "$tmp/so.out" >"$tmp/so.outputs"
same "gpt2.so outputs equal ntpc run's sharded outputs" "$tmp/so.outputs" "$tmp/ntpc.out"
grep -q "^blk.0.attn: attention, groups (5, 3)" "$tmp/so.out" && pass=$((pass + 1)) || { fail=$((fail + 1)); echo "[FAIL] sharding in the model info"; }

# parameters from a safetensors file, through the library
"$ntpc" run examples/gpt2.ntp $toy --seed 9 --save-params "$tmp/p.safetensors" >/dev/null
"$tmp/run_model" "$tmp/gpt2.so" --seed 9 --params "$tmp/p.safetensors" | grep '^output' >"$tmp/so9.out"
"$ntpc" run examples/gpt2.ntp $toy --plan examples/plans/gpt2_mixed8.ntp --seed 9 | grep '^output' | tail -1 >"$tmp/ntpc9.out"
same "loaded parameters" "$tmp/so9.out" "$tmp/ntpc9.out"

# a GQA + RoPE + SwiGLU block on 5 ranks in groups (3, 2) / (4, 1)
"$ntpc" examples/llama_block.ntp -D B=6 -D S=16 -D D=64 -D H=8 --plan tests/plans/llama_block_w5_groups.ntp -o "$tmp/lb.so" || exit 1
"$tmp/run_model" "$tmp/lb.so" --seed 4 | grep '^output' >"$tmp/lb.so.out"
"$ntpc" run examples/llama_block.ntp -D B=6 -D S=16 -D D=64 -D H=8 --plan tests/plans/llama_block_w5_groups.ntp --seed 4 | grep '^output' | tail -1 >"$tmp/lb.ntpc.out"
same "llama_block.so outputs" "$tmp/lb.so.out" "$tmp/lb.ntpc.out"

# errors come back through the ABI, not as crashes
"$tmp/run_model" "$tmp/gpt2.so" --backend tpu >"$tmp/bad.out" 2>&1 && { fail=$((fail + 1)); echo "[FAIL] unknown backend accepted"; } || pass=$((pass + 1))
grep -q "unknown backend 'tpu'" "$tmp/bad.out" && pass=$((pass + 1)) || { fail=$((fail + 1)); echo "[FAIL] message"; cat "$tmp/bad.out"; }

# installed: cmake --install, pkg-config, the installed ntpc finds its runtime
if cmake --install "$build" --prefix "$tmp/prefix" >/dev/null; then
  pc="$tmp/prefix/lib/pkgconfig"
  [ -d "$pc" ] || pc=$(dirname "$(find "$tmp/prefix" -name ntprt.pc | head -1)")
  flags=$(PKG_CONFIG_PATH="$pc" pkg-config --cflags ntprt)
  cc -std=c17 ${NTP_TEST_CFLAGS:-} examples/run_model.c $flags -ldl -lm -o "$tmp/run_model2" && pass=$((pass + 1)) || { fail=$((fail + 1)); echo "[FAIL] build against the installed headers"; }
  "$tmp/prefix/bin/ntpc" examples/gpt2.ntp $toy --plan examples/plans/gpt2_mixed8.ntp -o "$tmp/gpt2i.so" &&
    "$tmp/run_model2" "$tmp/gpt2i.so" --seed 3 | grep '^output' >"$tmp/inst.out"
  same "installed toolchain gives the same outputs" "$tmp/inst.out" "$tmp/ntpc.out"
else
  fail=$((fail + 1)); echo "[FAIL] cmake --install"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
