#!/bin/sh
# surfaces.sh NTPC CASE — bad input on the surfaces added after the first bad-input pass
# (issue 24): Hugging Face layouts, `ntpc train`'s options, outputs and data, checkpoints, the
# input readers, goodput. Same rules as robust.sh: the expected exit status (never a signal),
# within the time limit, and the expected message; the case's comment names the item it guards.
set -u
ntpc=$1 case=$2
case $ntpc in /*) ;; *) ntpc=$PWD/$ntpc ;; esac
# shellcheck source=tests/robust/lib.sh
. "$(dirname "$0")/lib.sh"
edit=$(dirname "$0")/st_edit.py

# a toy GPT-2 and Llama, and their parameters written in the Hugging Face layouts
g2='examples/gpt2.ntp -D B=2 -D S=8 -D D=16 -D H=2 -D V=32 -D L=1'
bg='examples/byte_gpt.ntp -D B=2 -D S=16 -D D=16 -D H=2 -D L=1 --steps 3 -q'
ll='examples/llama3_8b.ntp -D B=2 -D S=8 -D D=16 -D H=4 -D F=24 -D V=32 -D L=1'
hf_gpt2() { # hf_gpt2 FILE EDIT... : the toy GPT-2's file, edited
  # shellcheck disable=SC2086
  "$ntpc" run $g2 --save-params "$tmp/base.st" --params-format hf-gpt2 >/dev/null && python3 "$edit" "$tmp/base.st" "$@"
}

case $case in
list)
  sed -n 's/^\([a-z0-9_]*\))$/\1/p' "$0" | grep -v '^list$'
  exit 0 ;;

# item 1: a mapped tensor of a dtype the reader does not convert, or of more dims than a tensor may have
hf_mapped_dtype)
  for dt in F64 I32 I64 U8 I8 BOOL; do
    hf_gpt2 "$tmp/g.st" "wte.weight=$dt:32x16" || exit 1
    # shellcheck disable=SC2086
    expect "$case.$dt" 1 20 "parameter 'embed.wte' (wte.weight in the hf-gpt2 layout): dtype $dt is not supported (BF16, F16, F32)" \
      "$ntpc" run $g2 --params "$tmp/g.st" --params-format hf-gpt2
  done ;;
hf_mapped_rank7)
  hf_gpt2 "$tmp/g.st" "ln_f.weight=:1x1x1x1x1x1x16" || exit 1
  # shellcheck disable=SC2086
  expect "$case" 1 20 "parameter 'ln_f.g' (ln_f.weight in the hf-gpt2 layout): more than 6 dims" \
    "$ntpc" run $g2 --params "$tmp/g.st" --params-format hf-gpt2 ;;

# item 2: a model's own wk (no wq, wv beside it) has no place in GPT-2's fused c_attn
hf_gpt2_own_qkv)
  for r in wk wv; do
    model "$tmp/m.ntp" "  dim N = 4;
  input x : fp32[2, N];
  repeat 1 as blk { param $r : fp32[N, N]; x = x @ $r; }
  output y = x;"
    expect "$case.save.$r" 1 20 "the hf-gpt2 layout's c_attn needs wq, wk and wv of layer 'blk.0' together" \
      "$ntpc" run "$tmp/m.ntp" --save-params "$tmp/o.st" --params-format hf-gpt2
    [ -e "$tmp/o.st" ] && { fail=1; echo "[FAIL] $case: a refused save left $tmp/o.st"; }
    "$ntpc" run "$tmp/m.ntp" --save-params "$tmp/own.st" >/dev/null || exit 1
    expect "$case.load.$r" 1 20 "the hf-gpt2 layout's c_attn needs wq, wk and wv of layer 'blk.0' together" \
      "$ntpc" run "$tmp/m.ntp" --params "$tmp/own.st" --params-format hf-gpt2
  done
  model "$tmp/m.ntp" '  dim N = 4;
  input x : fp32[2, N];
  repeat 1 as blk { param bk : fp32[N]; x = x + bk; }
  output y = x;'
  expect "$case.bias" 1 20 "needs bq, bk and bv of layer 'blk.0' together" \
    "$ntpc" run "$tmp/m.ntp" --save-params "$tmp/o.st" --params-format hf-gpt2 ;;

# item 3: q, k and v of one block with different inner dims cannot share c_attn
hf_save_inner_dims)
  model "$tmp/m.ntp" '  input x : fp32[2, 4];
  repeat 1 as blk { param wq : fp32[4, 4]; param wk : fp32[4, 4]; param wv : fp32[4, 8];
    x = x @ wq + x @ wk; y = x @ wv; }
  output y = y;'
  expect "$case" 1 20 "parameters 'blk.0.wq' and 'blk.0.wv' map to one tensor h.0.attn.c_attn.weight of the hf-gpt2 layout with different inner dims" \
    "$ntpc" run "$tmp/m.ntp" --save-params "$tmp/o.st" --params-format hf-gpt2 ;;

# item 7: two repeats numbered alike (an encoder and a decoder) would both be h.0.* in the file
hf_save_two_repeats)
  model "$tmp/m.ntp" '  dim N = 8;
  input x : fp32[2, N];
  repeat 1 as enc { x = x + ff: mlp(x, hidden = 16, act = gelu, bias = true); }
  repeat 1 as dec { x = x + ff: mlp(x, hidden = 16, act = gelu, bias = true); }
  output y = x;'
  expect "$case.save" 1 20 "parameters 'enc.0.ff.w_up' and 'dec.0.ff.w_up' both map to h.0.mlp.c_fc.weight in the hf-gpt2 layout" \
    "$ntpc" run "$tmp/m.ntp" --save-params "$tmp/o.st" --params-format hf-gpt2
  [ -e "$tmp/o.st" ] && { fail=1; echo "[FAIL] $case: a refused save left $tmp/o.st"; }
  "$ntpc" run "$tmp/m.ntp" --save-params "$tmp/own.st" >/dev/null || exit 1
  expect "$case.load" 1 20 "both map to h.0.mlp.c_fc.weight" \
    "$ntpc" run "$tmp/m.ntp" --params "$tmp/own.st" --params-format hf-gpt2 ;;

# item 8: shapes match exactly; only a position table may be longer than the model's
hf_shape_exact)
  while IFS='|' read -r spec what text; do
    hf_gpt2 "$tmp/g.st" "$spec" || exit 1
    # shellcheck disable=SC2086
    expect "$case.$what" 1 20 "$text" "$ntpc" run $g2 --params "$tmp/g.st" --params-format hf-gpt2
  done <<'EOT'
wte.weight=:33x16|vocab|(wte.weight in the hf-gpt2 layout): the file's shape [33, 16] should be [32, 16]
h.0.attn.c_attn.weight=:16x49|c_attn|the file's shape [16, 49] should be [16, 48]
h.0.attn.c_attn.bias=:49|c_attn_bias|the file's shape [49] should be [48]
ln_f.weight=:17|ln_f|(ln_f.weight in the hf-gpt2 layout): the file's shape [17] should be [16]
h.0.mlp.c_fc.weight=:16x65|c_fc|the file's shape [16, 65] should be [16, 64]
EOT
  hf_gpt2 "$tmp/g.st" "wpe.weight=:64x16" || exit 1 # a longer position table: its first rows
  # shellcheck disable=SC2086
  expect "$case.wpe_longer" 0 20 "output logits" "$ntpc" run $g2 --params "$tmp/g.st" --params-format hf-gpt2
  # a checkpoint with 2 key/value heads into a model with 1
  # shellcheck disable=SC2086
  "$ntpc" run $ll -D G=2 --save-params "$tmp/l2.st" --params-format hf-llama >/dev/null || exit 1
  # shellcheck disable=SC2086
  expect "$case.kv_heads" 1 20 "parameter 'blk.0.attn.wk' (model.layers.0.self_attn.k_proj.weight in the hf-llama layout): the file's shape [8, 16] should be [4, 16]" \
    "$ntpc" run $ll -D G=4 --params "$tmp/l2.st" --params-format hf-llama ;;

# item 4: --fail-at's numbers: decimal, in range, both halves (a huge rank wrapped to a negative index)
fail_at_numbers)
  tokens "$tmp/t.bin" 4000
  for v in 2:2147483648 2:4294967296 2:4294967295 2: 2:-1 :3 2:3, 2:0x3 0:1 "2: 3" 2:3:4 1000000001:0; do
    # shellcheck disable=SC2086
    expect "$case.$v" 2 20 "--fail-at $v: expected STEP:RANK[,STEP:RANK...] (steps 1 to 10^9, ranks 0 to 4095, at most 64)" \
      "$ntpc" train $bg --data "$tmp/t.bin" --plan examples/plans/byte_gpt_7.ntp --fail-at "$v"
  done ;;
fail_at_outside_world)
  tokens "$tmp/t.bin" 4000
  # shellcheck disable=SC2086
  expect "$case" 2 20 "--fail-at 3:9: GPU 9 is not in the world of 7" \
    "$ntpc" train $bg -D H=4 --data "$tmp/t.bin" --plan examples/plans/byte_gpt_7.ntp --fail-at 2:1,3:9 ;;

# the distributed optimizer's numbers (issue 27): decimal, whole, in range, on train and on ntpc
zero_numbers)
  tokens "$tmp/t.bin" 4000
  for v in "" x -1 1.5 3 0x1 1e0 " 1" 99999999999999999999; do
    # shellcheck disable=SC2086
    expect "$case.zero$v" 2 20 "--zero $v: expected a whole number from 0 to 2" \
      "$ntpc" train $bg --data "$tmp/t.bin" --plan tests/plans/byte_gpt_zero_dp4.ntp --zero "$v"
  done
  for v in 0 65 -2 2.5; do
    # shellcheck disable=SC2086
    expect "$case.redundancy$v" 2 20 "--redundancy $v: expected a whole number from 1 to 64" \
      "$ntpc" train $bg --data "$tmp/t.bin" --plan tests/plans/byte_gpt_zero_dp4.ntp --redundancy "$v"
  done
  for v in 0 4097; do
    # shellcheck disable=SC2086
    expect "$case.domain$v" 2 20 "--domain-size $v: expected a whole number from 1 to 4096" \
      "$ntpc" report examples/byte_gpt.ntp --plan tests/plans/byte_gpt_zero_dp4.ntp --train --domain-size "$v"
  done
  # shellcheck disable=SC2086
  expect "$case.forward" 2 20 "--redundancy shards the optimizer's state: it needs --train" \
    "$ntpc" report examples/byte_gpt.ntp --plan tests/plans/byte_gpt_zero_dp4.ntp --redundancy 2 ;;

# item 10: every output path and every id of the data checked before step 1
train_bad_checkpoint_early)
  tokens "$tmp/t.bin" 4000
  : >"$tmp/file"
  # shellcheck disable=SC2086
  expect "$case" 2 20 "--checkpoint: '$tmp/file' is not a folder (checked before the first step)" \
    "$ntpc" train $bg --data "$tmp/t.bin" --checkpoint "$tmp/file" --save-params "$tmp/p.st"
  grep -q '^step' "$tmp/out" && { fail=1; echo "[FAIL] $case: it trained first"; } ;;
train_bad_save_params_early)
  tokens "$tmp/t.bin" 4000
  # shellcheck disable=SC2086
  expect "$case" 2 20 "--save-params: cannot write '$tmp/no/p.st'" \
    "$ntpc" train $bg --data "$tmp/t.bin" --save-params "$tmp/no/p.st"
  grep -q '^step' "$tmp/out" && { fail=1; echo "[FAIL] $case: it trained first"; } ;;
train_save_params_layout_early)
  tokens "$tmp/t.bin" 4000
  # shellcheck disable=SC2086
  expect "$case" 2 20 "--save-params: parameter 'embed.wpe' has no place in the hf-llama layout (role 'wpe') (checked before the first step)" \
    "$ntpc" train $bg --data "$tmp/t.bin" --save-params "$tmp/p.st" --params-format hf-llama ;;
train_vocab_late)
  tokens "$tmp/t.bin" 4001 300
  # shellcheck disable=SC2086
  expect "$case" 1 20 "token 4000 of 4001 is 300, outside the model's vocabulary of 256 (checked before the first step)" \
    "$ntpc" train $bg --data "$tmp/t.bin" --steps 2 ;;
train_checkpoint_fails_params_saved)
  tokens "$tmp/t.bin" 4000
  # shellcheck disable=SC2086
  NTP_FAILPOINT=checkpoint-error:3 expect "$case" 2 30 "the checkpoint of step 3 was not written" \
    "$ntpc" train $bg --data "$tmp/t.bin" --steps 5 --checkpoint "$tmp/ck" --checkpoint-every 1 --save-params "$tmp/p.st"
  grep -qF "its parameters are in $tmp/p.st" "$tmp/out" && [ -s "$tmp/p.st" ] ||
    { fail=1; echo "[FAIL] $case: the parameters were not saved"; } ;;

# item 11: a checkpoint index is checked against its state file and never deletes another file
ckpt_previous_names_index)
  tokens "$tmp/t.bin" 4000
  # shellcheck disable=SC2086
  "$ntpc" train $bg --data "$tmp/t.bin" --steps 2 --checkpoint "$tmp/ck" -q >/dev/null || exit 1
  : >"$tmp/ck/notes.txt"
  sed -i 's/"previous": "[^"]*"/"previous": "checkpoint.json"/' "$tmp/ck/checkpoint.json"
  # shellcheck disable=SC2086
  expect "$case.resume" 1 20 "'previous' is 'checkpoint.json', not the state file of an earlier step" \
    "$ntpc" train $bg --data "$tmp/t.bin" --steps 3 --resume "$tmp/ck"
  # a save over it (no resume) starts the chain again and removes nothing but state files
  sed -i 's/"previous": "[^"]*"/"previous": "notes.txt"/' "$tmp/ck/checkpoint.json"
  # shellcheck disable=SC2086
  expect "$case.save" 0 30 "checkpoint: $tmp/ck at step 2" "$ntpc" train $bg --data "$tmp/t.bin" --steps 2 --checkpoint "$tmp/ck"
  [ -f "$tmp/ck/checkpoint.json" ] && [ -f "$tmp/ck/notes.txt" ] ||
    { fail=1; echo "[FAIL] $case: a save deleted its index or another file: $(ls "$tmp/ck")"; } ;;
ckpt_index_numbers)
  tokens "$tmp/t.bin" 4000
  # shellcheck disable=SC2086
  "$ntpc" train $bg --data "$tmp/t.bin" --steps 2 --checkpoint "$tmp/ck" -q >/dev/null || exit 1
  cp "$tmp/ck/checkpoint.json" "$tmp/good.json"
  while IFS='|' read -r what from to text; do
    sed "s/$from/$to/" "$tmp/good.json" >"$tmp/ck/checkpoint.json"
    # shellcheck disable=SC2086
    expect "$case.$what" 1 20 "$text" "$ntpc" train $bg --data "$tmp/t.bin" --steps 3 --resume "$tmp/ck"
  done <<'EOT'
step_huge|"step": 2|"step": 99999999999999999999|'step' is missing, not a whole number or outside [0, 1000000000]
step_string|"step": 2|"step": "2"|'step' is missing, not a whole number
step_other_file|"step": 2|"step": 1|'file' is 'ckpt-2.safetensors', not the state file of step 1
position_huge|"data_position": [0-9]*|"data_position": 9223372036854775807|'data_position' is missing, not a whole number or outside
position_past_end|"data_position": [0-9]*|"data_position": 5000|data position 5000 (epoch 0) is not a position of the token file of 4000 tokens
position_float|"data_position": [0-9]*|"data_position": 1.5|'data_position' is missing, not a whole number
epoch_negative|"data_epoch": [0-9]*|"data_epoch": -1|'data_epoch' is missing, not a whole number or outside
EOT
  ;;

# item 15: a save killed by kill -9 leaves temporaries, which the next save removes
ckpt_stale_temporaries)
  tokens "$tmp/t.bin" 4000
  mkdir "$tmp/ck"
  : >"$tmp/ck/ckpt-7.safetensors.tmp999999999"
  : >"$tmp/ck/checkpoint.json.tmp999999999.json"
  : >"$tmp/ck/mine.tmp999999999" # not a checkpoint's name: left alone
  : >"$tmp/ck/ckpt-8.safetensors.tmp$$" # this shell is alive: left alone
  # shellcheck disable=SC2086
  expect "$case" 0 30 "checkpoint: $tmp/ck at step 2" "$ntpc" train $bg --data "$tmp/t.bin" --steps 2 --checkpoint "$tmp/ck"
  left=$(cd "$tmp/ck" && ls | grep tmp | tr '\n' ' ')
  [ "$left" = "ckpt-8.safetensors.tmp$$ mine.tmp999999999 " ] || { fail=1; echo "[FAIL] $case: left in the folder: $left"; } ;;
readonly_output_mode)
  tokens "$tmp/t.bin" 4000
  : >"$tmp/p.st"
  chmod 444 "$tmp/p.st"
  # shellcheck disable=SC2086
  expect "$case" 0 30 "wrote $tmp/p.st" "$ntpc" train $bg --data "$tmp/t.bin" --steps 1 --save-params "$tmp/p.st"
  mode=$(stat -c %a "$tmp/p.st")
  [ "$mode" = 444 ] || { fail=1; echo "[FAIL] $case: the replaced file has mode $mode"; } ;;
numbers_decimal_only)
  tokens "$tmp/t.bin" 4000
  for v in 0x10 inf nan " 1" 1e-3x ""; do
    # shellcheck disable=SC2086
    expect "$case.lr[$v]" 2 20 "expected a number of 0 or more" "$ntpc" train $bg --data "$tmp/t.bin" --lr "$v"
  done
  src=$PWD # ntpc plan writes its plan in the working folder: run it in the scratch one
  (cd "$tmp" && expect "$case.plan" 2 20 "--mem-cap expects GiB per GPU (a positive number), got '0x10'" \
    "$ntpc" plan "$src/examples/gpt2.ntp" --world 8 --mem-cap 0x10 && exit "$fail") || fail=1
  expect "$case.goodput" 2 20 "--fractions expects" "$ntpc" goodput examples/gpt2.ntp --fractions 0x0.1 ;;

# item 12: a text input is read only as far as the input needs (/dev/zero never ends)
inputs_text_unbounded)
  # shellcheck disable=SC2086
  expect "$case" 0 30 "output logits" "$ntpc" run $g2 --inputs /dev/zero ;;

# item 13: .npy element types NumPy itself refuses, a header cut inside descr, a shape past 2^40
npy_descr_not_numpy)
  for d in '<f1' '|b8' '<b2' '<f4junk' '<f16' '<i3' '<c8' "'"; do
    npy "$tmp/a.npy" "$d" '(2, 8)' 128
    # shellcheck disable=SC2086
    expect "$case.$d" 1 20 "is not a number NumPy writes plainly (int, uint, float, bool)" "$ntpc" run $g2 --inputs "$tmp/a.npy"
  done ;;
npy_descr_cut)
  printf "\223NUMPY\001\000\013\000{'descr': '" >"$tmp/a.npy"
  # shellcheck disable=SC2086
  expect "$case" 1 20 "$tmp/a.npy" "$ntpc" run $g2 --inputs "$tmp/a.npy" ;;
npy_shape_overflow)
  npy "$tmp/a.npy" '<i4' '(4294967296, 4294967296, 4294967296)' 0
  # shellcheck disable=SC2086
  expect "$case" 1 20 "a shape of more than 2^40 elements" "$ntpc" run $g2 --inputs "$tmp/a.npy"
  npy "$tmp/b.npy" '<i4' '(2, 8)' 8 # the data shorter than the shape
  # shellcheck disable=SC2086
  expect "$case.short" 1 20 "shorter than its header says" "$ntpc" run $g2 --inputs "$tmp/b.npy" ;;

# item 15: the small ones
inputs_directory)
  # shellcheck disable=SC2086
  expect "$case" 1 20 "cannot read '$tmp': Is a directory" "$ntpc" run $g2 --inputs "$tmp" ;;
text_twice)
  # shellcheck disable=SC2086
  expect "$case" 2 20 "--text is given twice" "$ntpc" run $g2 --text hello --text world ;;
run_options_elsewhere)
  for o in "--inputs x.npy" "--text hi" "--params p.st" "--save-params p.st" "--dump d"; do
    # shellcheck disable=SC2086
    expect "$case.${o%% *}" 2 20 "${o%% *} applies to 'ntpc run' only" "$ntpc" check $g2 $o
  done
  # shellcheck disable=SC2086
  expect "$case.report" 2 20 "--inputs applies to 'ntpc run' only" "$ntpc" report $g2 --inputs x.npy ;;
calibrate_bad_arguments)
  expect "$case.base" 2 20 "--base: unknown base profile 'nope'" "$ntpc" calibrate --base nope
  printf 'name x\n' >"$tmp/bad.prof"
  expect "$case.base_file" 2 20 "--base: " "$ntpc" calibrate --base "$tmp/bad.prof"
  expect "$case.out" 2 20 "-o: cannot write '$tmp/no/c.prof'" "$ntpc" calibrate -o "$tmp/no/c.prof"
  expect "$case.out_dir" 2 20 "-o: cannot write '$tmp': it exists and is a directory" "$ntpc" calibrate -o "$tmp" ;;
model_library_truncated)
  # shellcheck disable=SC2086
  "$ntpc" $g2 -o "$tmp/m.so" >/dev/null 2>&1 || exit 1
  cc -std=c17 examples/run_model.c -Iruntime -ldl -lm -o "$tmp/run_model" || exit 1
  size=$(stat -c %s "$tmp/m.so")
  head -c $((size / 2)) "$tmp/m.so" >"$tmp/half.so"
  expect "$case" 1 20 "its headers describe $size" "$tmp/run_model" "$tmp/half.so"
  head -c 100 "$tmp/m.so" >"$tmp/tiny.so"
  expect "$case.header" 1 20 "not a 64-bit ELF shared library" "$tmp/run_model" "$tmp/tiny.so" ;;

*)
  echo "surfaces.sh: unknown case '$case'" >&2
  exit 2 ;;
esac
exit $fail
