#!/bin/sh
# surfaces.sh NTPC CASE — bad input on the surfaces added after the first bad-input pass
# (issue 24): Hugging Face layouts, `ntpc train`'s options, outputs and data, checkpoints, the
# input readers, goodput. Same rules as robust.sh: the expected exit status (never a signal),
# within the time limit, and the expected message; the case's comment names the item it guards.
set -u
ntpc=$1 case=$2
# shellcheck source=tests/robust/lib.sh
. "$(dirname "$0")/lib.sh"
edit=$(dirname "$0")/st_edit.py

# a toy GPT-2 and Llama, and their parameters written in the Hugging Face layouts
g2='examples/gpt2.ntp -D B=2 -D S=8 -D D=16 -D H=2 -D V=32 -D L=1'
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

*)
  echo "surfaces.sh: unknown case '$case'" >&2
  exit 2 ;;
esac
exit $fail
