#!/bin/sh
# robust.sh NTPC CASE — bad input never crashes, hangs or is silently accepted (issue 9).
# One case per defect found by fuzzing or by hand; each names the class it guards. A case
# passes when ntpc exits with the expected status (never a signal), within its time limit,
# and prints the expected message. Run all: for c in $(sh robust.sh - list); do ...
set -u
ntpc=$1 case=$2
# shellcheck source=tests/robust/lib.sh
. "$(dirname "$0")/lib.sh"

case $case in
list)
  sed -n 's/^\([a-z0-9_]*\))$/\1/p' "$0" | grep -v '^list$'
  exit 0 ;;

# class 1: use-after-free (caught by ASan in the sanitizer build)
uaf_embedding_positions)
  # 14 inputs first: the value table (16 entries) grows while the embedding is lowered
  model "$tmp/m.ntp" '  dim B = 2, S = 4, D = 8, V = 16;
  input u0 : fp32[1]; input u1 : fp32[1]; input u2 : fp32[1]; input u3 : fp32[1]; input u4 : fp32[1];
  input u5 : fp32[1]; input u6 : fp32[1]; input u7 : fp32[1]; input u8 : fp32[1]; input u9 : fp32[1];
  input u10 : fp32[1]; input u11 : fp32[1]; input u12 : fp32[1]; input u13 : fp32[1];
  input tokens : i32[B, S];
  x = embed: embedding(tokens, vocab = V, dim = D, positions = 8);
  output y = x;'
  expect "$case" 0 60 "model m: 1 layers" "$ntpc" run "$tmp/m.ntp" ;;

# class 2: integer arithmetic
dim_int64_min_div)
  model "$tmp/m.ntp" '  dim B = (-2305843009213693951 * 4 - 4) / -1;
  input x : fp32[2];
  output y = x;'
  expect "$case" 1 20 "dim arithmetic overflows" "$ntpc" check "$tmp/m.ntp" ;;
dim_int64_min_neg)
  model "$tmp/m.ntp" '  dim B = -(-2305843009213693951 * 4 - 4);
  input x : fp32[2];
  output y = x;'
  expect "$case" 1 20 "dim arithmetic overflows" "$ntpc" check "$tmp/m.ntp" ;;
elems_overflow_run)
  model "$tmp/m.ntp" '  dim A = 2147483648;
  input x : fp32[A, A, A];
  output y = x;'
  expect "$case" 1 20 "tensor 'x' fp32[2147483648, 2147483648, 2147483648] has 9.904e+27 elements" "$ntpc" run "$tmp/m.ntp" ;;
bytes_wrap_run)
  model "$tmp/m.ntp" '  dim A = 2147483648;
  input x : fp32[A, A];
  output y = x + x;'
  expect "$case" 1 20 "a tensor may have at most 2^40 elements" "$ntpc" run "$tmp/m.ntp" ;;
elems_overflow_broadcast)
  model "$tmp/m.ntp" '  dim A = 1099511627776;
  input x : fp32[A, 1];
  input z : fp32[1, A];
  output y = x + z;'
  expect "$case" 1 20 "tensor 'y' fp32[1099511627776, 1099511627776] has 1.209e+24 elements" "$ntpc" check "$tmp/m.ntp" ;;
attention_width_overflow)
  model "$tmp/m.ntp" '  input x : fp32[1, 2, 8];
  output y = a: attention(x, heads = 4294967296, head_dim = 4294967296);'
  expect "$case" 1 20 "is too large" "$ntpc" check "$tmp/m.ntp" ;;
mesh_product_overflow)
  model "$tmp/m.ntp" '  mesh g = 4294967296 x 4294967296 (r, c);
  input x : fp32[4{r}, 4];
  output y = x;'
  expect "$case" 1 20 "a mesh dim must be at most 4096" "$ntpc" check "$tmp/m.ntp" --world 4 ;;
plan_group_sum_overflow)
  model "$tmp/m.ntp" "$tiny"
  printf 'plan p for m {\n  world 2;\n  lin tp (2305843009213693951 * 4, 2305843009213693951 * 4, 2);\n}\n' >"$tmp/p.ntp"
  expect "$case" 1 20 "a TP degree must be at most 4096" "$ntpc" check "$tmp/m.ntp" --plan "$tmp/p.ntp" ;;

# found by fuzz_source: a layer whose input is a vector (no batch dim) was split over groups
# along its features, and the sharded-program verifier rejected the result (exit 3)
shard_vector_layer_input)
  model "$tmp/m.ntp" '  dim D = 16, F = 40;
  input x : fp32[D];
  h = ffn: mlp(x, hidden = F, act = geglu, bias = true) @tp(2);
  output y = lin: linear(h, out = 8, bias = true) @tp(4);'
  expect "$case" 0 30 "vs unsharded: max relative error" "$ntpc" run "$tmp/m.ntp" --world 8
  expect "$case.w4" 0 30 "vs unsharded: max relative error" "$ntpc" run "$tmp/m.ntp" --world 4 ;;

shard_vector_embedding)
  # 1-D token ids: the lookup's [B+S, D] output has no batch rows to split over groups either
  model "$tmp/m.ntp" '  input tokens : i32[10];
  output x = embed: embedding(tokens, vocab = 32, dim = 8);'
  printf 'plan two for m { world 5; embed tp (3, 2), batch (1, 1); }\n' >"$tmp/p.ntp"
  expect "$case" 0 30 "vs unsharded: max relative error 0" "$ntpc" run "$tmp/m.ntp" --world 4
  expect "$case.groups" 0 30 "vs unsharded: max relative error 0" "$ntpc" run "$tmp/m.ntp" --plan "$tmp/p.ntp" ;;

# class 3: recursion that follows the input
deep_add_chain)
  python3 -c "print('model m { input x : fp32[2]; y = x' + ' + x' * 30000 + '; output z = y; }')" >"$tmp/m.ntp"
  expect "$case" 1 30 "expression nested more than 1000 levels deep" "$ntpc" check "$tmp/m.ntp" ;;
deep_parens)
  python3 -c "print('model m { input x : fp32[2]; output y = ' + '(' * 50000 + 'x' + ')' * 50000 + '; }')" >"$tmp/m.ntp"
  expect "$case" 1 30 "error:" "$ntpc" check "$tmp/m.ntp" ;;
deep_calls)
  python3 -c "print('model m { input x : fp32[2]; output y = ' + 'gelu(' * 3000 + 'x' + ')' * 3000 + '; }')" >"$tmp/m.ntp"
  expect "$case" 1 30 "nested" "$ntpc" check "$tmp/m.ntp" ;;

# class 4: safetensors
st_negative_offsets)
  model "$tmp/m.ntp" "$tiny"
  safetensors "$tmp/p.st" '{"lin.w":{"dtype":"F32","shape":[3,4],"data_offsets":[-64,-16]},"lin.b":{"dtype":"F32","shape":[3],"data_offsets":[48,60]}}' 60
  expect "$case" 1 20 "data_offsets must be 0 <= begin <= end" "$ntpc" run "$tmp/m.ntp" --params "$tmp/p.st" ;;
st_offsets_into_header)
  model "$tmp/m.ntp" "$tiny"
  safetensors "$tmp/p.st" '{"lin.w":{"dtype":"F32","shape":[3,4],"data_offsets":[-100,-52]}}' 0
  expect "$case" 1 20 "data_offsets" "$ntpc" run "$tmp/m.ntp" --params "$tmp/p.st" ;;
st_shape_not_array)
  model "$tmp/m.ntp" "$tiny"
  safetensors "$tmp/p.st" '{"lin.w":{"dtype":"F32","shape":12,"data_offsets":[0,48]}}' 48
  expect "$case" 1 20 "needs a dtype string, a shape array and two data_offsets" "$ntpc" run "$tmp/m.ntp" --params "$tmp/p.st" ;;
st_offsets_not_array)
  model "$tmp/m.ntp" "$tiny"
  safetensors "$tmp/p.st" '{"lin.w":{"dtype":"F32","shape":[3,4],"data_offsets":"0,48"}}' 48
  expect "$case" 1 20 "needs a dtype string, a shape array and two data_offsets" "$ntpc" run "$tmp/m.ntp" --params "$tmp/p.st" ;;
st_overlap)
  model "$tmp/m.ntp" "$tiny"
  safetensors "$tmp/p.st" '{"lin.w":{"dtype":"F32","shape":[3,4],"data_offsets":[0,48]},"lin.b":{"dtype":"F32","shape":[3],"data_offsets":[36,48]}}' 48
  expect "$case" 1 20 "overlap in the data block" "$ntpc" run "$tmp/m.ntp" --params "$tmp/p.st" ;;

# class 5: unbounded work
huge_repeat_count)
  expect "$case" 1 20 "the repeat count must be at most 65536" "$ntpc" check examples/gpt2.ntp -D L=9223372036854775807 ;;
nested_repeats_ops)
  model "$tmp/m.ntp" '  input x : fp32[2];
  repeat 60000 as a { repeat 60000 as b { x = x + x; } }
  output y = x;'
  expect "$case" 1 60 "the unrolled model has more than" "$ntpc" check "$tmp/m.ntp" ;;
dev_zero_source)
  expect "$case" 1 20 "the largest source accepted" "$ntpc" check /dev/zero ;;
host_memory_cap)
  NTP_CPU_MEMORY_LIMIT=1000000000 expect "$case" 2 60 "tensor 'embed.wte' bf16[5000000, 100]" \
    "$ntpc" run examples/gpt2.ntp -D V=5000000 -D D=100 -D H=4 -D L=1 -D S=8 -D B=1 ;;

# class 6: quadratic time
big_source_time)
  python3 -c "
import sys
body = ''.join('  dim D%d = %d;\n' % (i, i + 1) for i in range(400000))
open(sys.argv[1], 'w').write('model m {\n' + body + '  input x : fp32[2];\n  output y = x;\n}\n')" "$tmp/m.ntp"
  expect "$case" 0 30 "model m: 0 layers" "$ntpc" check "$tmp/m.ntp" ;;
many_errors_time)
  python3 -c "
import sys
open(sys.argv[1], 'w').write('model m {\n' + '  y = nope;\n' * 200000 + '}\n')" "$tmp/m.ntp"
  expect "$case" 1 30 "too many errors emitted, stopping now [-ferror-limit=20]" "$ntpc" check "$tmp/m.ntp" ;;
many_errors_unlimited_time)
  python3 -c "
import sys
open(sys.argv[1], 'w').write('model m {\n' + ''.join('  y%d = @;\n' % i for i in range(200000)) + '}\n')" "$tmp/m.ntp"
  expect "$case" 1 30 "200000 errors generated." "$ntpc" check "$tmp/m.ntp" -ferror-limit=0 ;;
report_time)
  expect "$case" 0 10 "all ranks:" "$ntpc" report examples/gpt2.ntp -D L=1000 -D B=8 -D S=16 -D D=64 -D H=8 -D V=250 --world 8 ;;

# class 7 (and Deliver 4): -o onto something that is not a regular file
out_fifo)
  mkfifo "$tmp/fifo"
  expect "$case" 2 20 "it exists and is a FIFO" "$ntpc" examples/gpt2.ntp --emit=ir -o "$tmp/fifo"
  [ -p "$tmp/fifo" ] || { fail=1; echo "[FAIL] $case: the FIFO was replaced"; } ;;
out_symlink)
  echo keep >"$tmp/target"
  ln -s "$tmp/target" "$tmp/link"
  expect "$case" 2 20 "it exists and is a symbolic link" "$ntpc" examples/gpt2.ntp --emit=ir -o "$tmp/link"
  { [ -L "$tmp/link" ] && [ "$(cat "$tmp/target")" = keep ]; } || { fail=1; echo "[FAIL] $case: the link was replaced"; } ;;
out_device)
  # a device node of our own (a copy of /dev/null's numbers): a broken ntpc must never be
  # pointed at a real device, it would replace it. Skipped (77) where mknod is not allowed.
  mknod "$tmp/null" c 1 3 2>/dev/null || { echo "[skip] $case: cannot create a device node"; exit 77; }
  expect "$case" 2 20 "it exists and is a character device" "$ntpc" report examples/gpt2.ntp -D L=1 -o "$tmp/null"
  [ -c "$tmp/null" ] || { fail=1; echo "[FAIL] $case: the device node was replaced"; } ;;
out_directory_library)
  mkdir "$tmp/lib.so"
  expect "$case" 2 20 "it exists and is a directory" "$ntpc" examples/gpt2.ntp -D L=1 -o "$tmp/lib.so" ;;
out_save_params_fifo)
  mkfifo "$tmp/fifo"
  expect "$case" 2 60 "it exists and is a FIFO" "$ntpc" run examples/gpt2.ntp -D L=1 -D S=8 -D D=32 -D H=2 -D V=64 --save-params "$tmp/fifo"
  [ -p "$tmp/fifo" ] || { fail=1; echo "[FAIL] $case: the FIFO was replaced"; } ;;

# class 8: the 257th model of a file
plan_for_model_257)
  python3 -c "
import sys
ms = ''.join('model m%d { input x : fp32[2]; output y = x; }\n' % i for i in range(300))
open(sys.argv[1], 'w').write(ms + 'plan p for m299 { world 1; }\n')" "$tmp/m.ntp"
  expect "$case" 0 20 "model m299:" "$ntpc" check "$tmp/m.ntp" --model m299 --plan-name p ;;

# class 11: the small ones
seed_beyond_64_bits)
  expect "$case" 2 20 "--seed must be below 2^64" "$ntpc" run examples/gpt2.ntp --seed 18446744073709551616 ;;
color_junk)
  expect "$case" 2 20 "--color takes auto, always or never, got 'junk'" "$ntpc" check examples/gpt2.ntp --color=junk ;;
params_exit_code)
  printf 'junk' >"$tmp/bad.st"
  expect "$case" 1 20 "not a safetensors file" "$ntpc" run examples/gpt2.ntp -D L=1 -D S=8 -D D=32 -D H=2 -D V=64 --params "$tmp/bad.st" ;;
token_range_is_vocab)
  expect "$case" 0 20 "init [0, 50257)" "$ntpc" examples/gpt2.ntp --emit=ir -D L=1 ;;
repeat_annotation_error_once)
  # @tp(4) inside the 12-block repeat: one error, not one per block (and one each for embed, head)
  expect "$case" 1 20 "3 errors generated." "$ntpc" check examples/gpt2.ntp --world 6 ;;
sigterm_library_leaves_nothing)
  cp examples/gpt2.ntp "$tmp/g.ntp"
  # a large model library: the generated C is written and compiled for a while; kill it midway
  "$ntpc" "$tmp/g.ntp" -D L=400 -D D=64 -D H=8 -D V=256 -D S=16 -D B=8 --world 8 -o "$tmp/g.so" >/dev/null 2>&1 &
  pid=$!
  for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30; do
    ls "$tmp"/g.so.c* >/dev/null 2>&1 && break
    sleep 0.1
  done
  kill -TERM "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  sleep 0.2
  left=$(ls "$tmp" | grep -v '^g.ntp$' || true)
  if [ -n "$left" ]; then fail=1; echo "[FAIL] $case: left behind: $left"; else echo "[ok] $case"; fi ;;
oom_message_names_tensor)
  model "$tmp/m.ntp" "$tiny"
  NTP_CPU_MEMORY_LIMIT=50 expect "$case" 2 20 "for tensor 'lin.w' fp32[3, 4] alone" "$ntpc" run "$tmp/m.ntp" ;;
*)
  echo "robust.sh: unknown case '$case'" >&2
  exit 2 ;;
esac
exit $fail
