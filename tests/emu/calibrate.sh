#!/bin/sh
# calibrate.sh NTPC — `ntpc calibrate --quick` end to end on the emulated GPU (the numbers mean
# nothing there): every measurement runs (GEMMs, attention's two kernels against each other and
# the attention layer, copies, the streaming kernel, launches, an NCCL all-reduce over 2 emulated
# GPUs), the profile is written, every measured line says so, the planner reads it and plans with
# it, the compiler reads it (--gpu FILE); and with no GPU at all
# (NTP_EMU_GPUS=0) the command exits 1 with a line saying why, writing nothing.
# shellcheck disable=SC2015 # "A && B || fail": fail when any check does not hold
set -u
ntpc=$1
tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
fail() { echo "calibrate.sh: FAIL: $*" >&2; exit 1; }

"$ntpc" calibrate --quick --gpus 2 -o "$tmp/emu.prof" >"$tmp/out" 2>"$tmp/err" || { cat "$tmp/err" >&2; fail "ntpc calibrate exited $?"; }
grep -q "^calibrate: wrote $tmp/emu.prof" "$tmp/out" || fail "no 'wrote' line"
for key in "flops bf16" "flops fp16" "flops fp32" gemm_efficiency attention_efficiency attention_gemm_from memory_bandwidth \
           memory_efficiency kernel_launch "collective intra all-reduce"; do
  grep "^$key " "$tmp/emu.prof" | grep -q "# measured on .* at 20[0-9-]*T" || fail "'$key' is not marked measured"
done
# attention's crossover: both kernels timed at each S, a sequence length or never; the compiler
# reads the profile (--gpu FILE) and picks attention's kernel by it
grep -q "^attention_gemm_from \([0-9][0-9]*\|never\)  # measured on .*: tiled vs gemm attention layers.*S = 16\.\.32" "$tmp/emu.prof" ||
  fail "no measured attention_gemm_from line: $(grep attention_gemm_from "$tmp/emu.prof")"
grep -q "^calibrate: attention S=32 .*: tiled .* us, gemm .* us" "$tmp/err" || fail "no tiled-vs-gemm timing on stderr"
printf 'model a {\n  dim B = 1, S = 32, D = 32;\n  dtype bf16;\n  input x : bf16[B, S, D];\n  output y = attn: attention(x, heads = 2, causal);\n}\n' >"$tmp/a.ntp"
"$ntpc" "$tmp/a.ntp" --gpu "$tmp/emu.prof" --emit=cuda >"$tmp/a.cu" 2>&1 || { cat "$tmp/a.cu" >&2; fail "--gpu emu.prof does not compile"; }
# what was not measured names where it came from
grep "^link intra " "$tmp/emu.prof" | grep -q "# from built-in h100" || fail "'link intra' does not name its source"
grep "^collective intra all-gather " "$tmp/emu.prof" | grep -q "not measured: libnccl lacks ncclAllGather" ||
  fail "the all-gather line does not say why it was not measured"
"$ntpc" plan examples/gpt2.ntp -D B=2 -D S=16 -D D=64 -D H=4 -D V=256 -D L=2 --world 2 --profile "$tmp/emu.prof" \
  -o "$tmp/plan.ntp" --svg "$tmp/plan.svg" >"$tmp/plan.out" 2>&1 || { cat "$tmp/plan.out" >&2; fail "ntpc plan --profile"; }
"$ntpc" check examples/gpt2.ntp -D B=2 -D S=16 -D D=64 -D H=4 -D V=256 -D L=2 --plan "$tmp/plan.ntp" >/dev/null ||
  fail "the plan made with the profile does not check"

# usage errors: exit 2 and the reason
"$ntpc" calibrate --gpus 0 2>"$tmp/err"; rc=$?
[ $rc -eq 2 ] && grep -q "gpus needs a count of 1 or more" "$tmp/err" || fail "--gpus 0: exit $rc"
"$ntpc" calibrate --frobnicate 2>"$tmp/err"; rc=$?
[ $rc -eq 2 ] && grep -q "unexpected argument '--frobnicate'" "$tmp/err" || fail "an unknown option: exit $rc"
"$ntpc" calibrate --quick --base nope -o "$tmp/nope.prof" 2>"$tmp/err"; rc=$?
[ $rc -eq 2 ] && grep -q "unknown base profile 'nope'" "$tmp/err" && [ ! -e "$tmp/nope.prof" ] || fail "--base nope: exit $rc"
"$ntpc" calibrate --quick --gpus 99 2>"$tmp/err"; rc=$?
[ $rc -eq 1 ] && grep -q -- "--gpus 99, but 8 GPUs are visible" "$tmp/err" || fail "--gpus 99: exit $rc"
# --base FILE: what is not measured comes from that file, and says so
"$ntpc" calibrate --quick --gpus 1 --base profiles/a100.prof --name mine -o "$tmp/mine.prof" >/dev/null 2>&1 || fail "--base FILE"
grep -q "^name mine$" "$tmp/mine.prof" && grep "^link inter " "$tmp/mine.prof" | grep -q "2.5e+10  # from the base profile profiles/a100.prof" ||
  fail "--base FILE: the unmeasured lines do not come from it"

# no GPU: exit 1, one clear line, no file
NTP_EMU_GPUS=0 "$ntpc" calibrate --quick -o "$tmp/none.prof" >"$tmp/out" 2>"$tmp/err"
rc=$?
[ $rc -eq 1 ] || fail "no GPU: exit $rc, expected 1"
grep -q "^ntpc calibrate: error: no GPU to calibrate: " "$tmp/err" || { cat "$tmp/err" >&2; fail "no GPU: no clear line"; }
[ ! -e "$tmp/none.prof" ] || fail "no GPU: a profile was written"
echo "calibrate.sh: ok"
