#!/bin/sh
# attention.sh NTPC [PATTERN] — attention's kernels on the emulated GPU against the CPU reference,
# forward and backward: each case is a one-layer model (embedding, attention, head, loss) run by
# `ntpc run --train --backend cuda`, which compares the attention's output, the loss and every
# gradient (wq, wk, wv through dq, dk, dv) with the unsharded CPU run element by element and
# exits 1 on a mismatch. Every case runs under both selections, NTP_CUDA_ATTENTION=tiled and
# =gemm, and checks that the kernel it meant to test is the one generated (the tiled backward's
# statistics pass, the GEMM baseline's softmax over the scores, the warp kernels above the tiled
# head-dim limit of 128, the tiled kernel where a rank boundary cuts a group of query heads). Covered: causal and not; one query head per kv head, groups of 2 and 4;
# head dims 8, 24, 64, 128 and 136; S = 1, 17, 100 (no multiple of a tile); fp32 and bf16;
# heads split over ranks (--world: q_off / kv_off, a group cut by a rank boundary). Then auto's
# rule: its crossover from NTP_CUDA_ATTENTION_GEMM_FROM, from the device profile (--gpu FILE's
# attention_gemm_from, as ntpc calibrate measures it) and the precedence between them.
# Run by CTest with the emulator's environment (race check on; tests/emu/CMakeLists.txt).
set -u
ntpc=$1
pattern=${2:-}
tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
fail=0

# name | dtype | causal (1/0) | B S H KV HD | world | the GEMMs apply on rank 0 (it holds whole groups of
# query heads; sharded.gqa4.w3 splits 8 heads 3/3/2 over groups of 4: the tiled kernel there)
cases='
mha.s17.hd8.causal|fp32|1|2 17 4 4 8|1|1
mha.s17.hd8.full|fp32|0|2 17 4 4 8|1|1
mha.s1.hd64.causal|fp32|1|2 1 4 4 64|1|1
mha.s1.hd8.full.bf16|bf16|0|2 1 4 4 8|1|1
mha.s100.hd24.causal.bf16|bf16|1|2 100 4 4 24|1|1
mha.s100.hd128.full|fp32|0|1 100 4 4 128|1|1
gqa2.s100.hd24.causal|fp32|1|2 100 4 2 24|1|1
gqa2.s17.hd128.causal.bf16|bf16|1|2 17 4 2 128|1|1
gqa4.s100.hd64.full.bf16|bf16|0|1 100 4 1 64|1|1
gqa4.s17.hd8.full|fp32|0|2 17 4 1 8|1|1
above.s17.hd136.causal|fp32|1|2 17 4 2 136|1|1
above.s17.hd136.full.bf16|bf16|0|2 17 4 4 136|1|1
sharded.gqa4.w3.s17.hd8.causal|fp32|1|2 17 8 2 8|3|0
sharded.gqa2.w3.s100.hd24.full.bf16|bf16|0|1 100 8 4 24|3|1
sharded.mha.w2.s100.hd24.causal.bf16|bf16|1|2 100 4 4 24|2|1
'

# model DTYPE CAUSAL B S H KV HD WORLD > file: the attention's heads split over WORLD ranks
model() {
  flag="" tp=""
  [ "$2" = 1 ] && flag=", causal"
  [ "$8" -gt 1 ] && tp=" @tp($8)"
  cat <<EOF
model attn_case {
  dim B = $3, S = $4, D = 32, H = $5, KV = $6, HD = $7, V = 64;
  dtype $1;
  input tokens : i32[B, S];
  input targets : i32[B, S];
  x = embed: embedding(tokens, vocab = V, dim = D);
  a = attn: attention(x, heads = H, kv_heads = KV, head_dim = HD$flag)$tp;
  output y = a;
  x = x + a;
  logits = head: linear(x, out = V);
  output loss = cross_entropy(logits, targets);
}
EOF
}

# has NAME MODE FILE TEXT WANT: the generated CUDA of rank 0 holds TEXT (WANT 1) or not (WANT 0)
has() {
  got=0
  NTP_CUDA_ATTENTION=$2 "$ntpc" "$3" --train $4 --emit=cuda >"$tmp/cuda.txt" 2>&1 && grep -q "$5" "$tmp/cuda.txt" && got=1
  if [ "$got" != "$6" ]; then
    echo "[FAIL] $1 ($2): the generated CUDA $( [ "$6" = 1 ] && echo lacks || echo has ) '$5'"
    fail=1
  fi
}

echo "$cases" | while IFS='|' read -r name dt causal dims world whole; do
  [ -n "$name" ] || continue
  case $name in *$pattern*) ;; *) continue ;; esac
  set -- $dims
  H=$3 KV=$4 HD=$5
  f=$tmp/$name.ntp
  model "$dt" "$causal" "$@" "$world" >"$f"
  opts=""
  [ "$world" -gt 1 ] && opts="--world $world --loopback"
  for mode in tiled gemm; do
    if NTP_CUDA_ATTENTION=$mode "$ntpc" run "$f" --train --backend cuda $opts --iters 0 >"$tmp/out.txt" 2>&1; then
      echo "$name ($mode): forward and gradients equal the CPU's ($(grep -c 'vs cpu reference.* ok$' "$tmp/out.txt") outputs)"
    else
      echo "[FAIL] $name ($mode): ntpc run exited $?"
      grep -v ' ok$' "$tmp/out.txt" | tail -20
      echo fail >"$tmp/failed"
    fi
    # the heads split: rank 0 computes fewer heads than the model has
    if [ "$world" -gt 1 ] && ! "$ntpc" "$f" --train --world "$world" --emit=sharded-ir 2>&1 | grep -q "r0 .* = attention .*q_off=\|r1 .* = attention .*q_off="; then
      echo "[FAIL] $name: the attention's heads are not split over the ranks"
      echo fail >"$tmp/failed"
    fi
    # the kernels meant: the tiled backward up to head dim 128; the GEMMs where they apply
    tiled=0 gemm=0
    [ "$HD" -le 128 ] && tiled=1
    [ "$mode" = gemm ] && [ "$whole" = 1 ] && gemm=1
    has "$name" $mode "$f" "$opts" 'SC\[at\] = m + logf(l)' $tiled
    has "$name" $mode "$f" "$opts" 'const float \*SCO' $gemm
    [ $fail = 1 ] && echo fail >"$tmp/failed"
  done
done
[ -f "$tmp/failed" ] && fail=1

# auto's rule: the GEMMs from the crossover on (NTP_CUDA_ATTENTION_GEMM_FROM), for GQA too;
# a bad setting is an error that names it
model fp32 1 2 17 4 4 8 1 >"$tmp/mha.ntp"
model fp32 1 2 17 4 2 8 1 >"$tmp/gqa.ntp"
for want in "17 mha 1" "18 mha 0" "1 gqa 1"; do
  set -- $want
  got=0
  NTP_CUDA_ATTENTION=auto NTP_CUDA_ATTENTION_GEMM_FROM=$1 "$ntpc" "$tmp/$2.ntp" --emit=cuda 2>&1 | grep -q 'const float \*SCO' && got=1
  if [ "$got" = "$3" ]; then echo "auto from $1, $2 at S = 17: $( [ "$3" = 1 ] && echo gemm || echo tiled)"
  else echo "[FAIL] auto from $1, $2 at S = 17: the wrong kernel"; fail=1; fi
done
for bad in "NTP_CUDA_ATTENTION=fast" "NTP_CUDA_ATTENTION_GEMM_FROM=0"; do
  if env "$bad" "$ntpc" "$tmp/mha.ntp" --emit=cuda >"$tmp/bad.txt" 2>&1 || ! grep -q "error: $bad: expected" "$tmp/bad.txt"; then
    echo "[FAIL] $bad: not refused with a message naming it"
    cat "$tmp/bad.txt"
    fail=1
  else
    echo "$bad: refused ($(grep -o 'expected.*' "$tmp/bad.txt"))"
  fi
done

# the crossover from the device profile the compile is given (--gpu FILE, as `ntpc calibrate`
# writes one): attention_gemm_from 17 takes the GEMMs at S = 17 and the tiled kernel at S = 16;
# NTP_CUDA_ATTENTION_GEMM_FROM overrides the profile's, NTP_CUDA_ATTENTION=tiled|gemm both;
# 'never' keeps the tiled kernel; no --gpu, or a built-in (which measures nothing): the default 128
model fp32 1 2 16 4 4 8 1 >"$tmp/mha16.ntp"
{ cat profiles/h100.prof; echo "attention_gemm_from 17  # a test's crossover"; } >"$tmp/from17.prof"
{ cat profiles/h100.prof; echo "attention_gemm_from never"; } >"$tmp/never.prof"
# PROFILE (a file in $tmp, a built-in, or - for none) MODEL ENV_FROM ENV_MODE (- unset) GEMM (1: generated)
for want in "from17 mha - - 1" "from17 mha16 - - 0" "from17 mha 18 - 0" "from17 mha16 16 - 1" "from17 mha - tiled 0" \
            "never mha - - 0" "never mha 17 - 1" "never mha - gemm 1" "h100 mha - - 0" "- mha - - 0"; do
  set -- $want
  gpu="" got=0
  [ -f "$tmp/$1.prof" ] && gpu="--gpu $tmp/$1.prof"
  [ "$1" = h100 ] && gpu="--gpu h100"
  from=$3 mode=$4
  [ "$from" = - ] && from=""
  [ "$mode" = - ] && mode=""
  NTP_CUDA_ATTENTION=$mode NTP_CUDA_ATTENTION_GEMM_FROM=$from "$ntpc" "$tmp/$2.ntp" $gpu --emit=cuda >"$tmp/cuda.txt" 2>&1 &&
    grep -q 'const float \*SCO' "$tmp/cuda.txt" && got=1
  what="profile $1, $2, env from '$from' mode '$mode'"
  if [ "$got" = "$5" ]; then echo "$what: $( [ "$5" = 1 ] && echo gemm || echo tiled)"
  else echo "[FAIL] $what: the wrong kernel"; head -3 "$tmp/cuda.txt"; fail=1; fi
done
# the profile's crossover end to end: the GEMM attention run by the CUDA backend equals the CPU's
if "$ntpc" run "$tmp/mha.ntp" --backend cuda --gpu "$tmp/from17.prof" >"$tmp/out.txt" 2>&1 && grep -q 'vs cpu reference.* ok$' "$tmp/out.txt"; then
  echo "ntpc run --gpu from17.prof: the GEMM attention equals the CPU's"
else
  echo "[FAIL] ntpc run --gpu from17.prof"; tail -20 "$tmp/out.txt"; fail=1
fi
# a bad crossover in the profile: a usage error naming the file, line and key
{ cat profiles/h100.prof; echo "attention_gemm_from 0"; } >"$tmp/bad.prof"
"$ntpc" "$tmp/mha.ntp" --gpu "$tmp/bad.prof" --emit=cuda >"$tmp/bad.txt" 2>&1; rc=$?
if [ $rc -eq 2 ] && grep -q "bad.prof:[0-9]*: attention_gemm_from '0': expected a sequence length" "$tmp/bad.txt"; then
  echo "--gpu bad.prof: refused ($(grep -o 'attention_gemm_from .*' "$tmp/bad.txt"))"
else
  echo "[FAIL] --gpu bad.prof: exit $rc"; cat "$tmp/bad.txt"; fail=1
fi
exit $fail
