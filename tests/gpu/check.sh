#!/usr/bin/env bash
# tests/gpu/check.sh — the GPU check: every example on the CUDA backend, unsharded and sharded
# (all ranks on one GPU, --loopback), each compared by ntpc with the unsharded CPU reference.
# Runnable by anyone on a one-GPU machine in under 5 minutes (see tests/gpu/README.md).
#
#   tests/gpu/check.sh               build if needed, run every case, print one table
#   tests/gpu/check.sh PATTERN       only the cases whose name matches the grep -E PATTERN
#   tests/gpu/check.sh --list        list the cases and their commands, run nothing
#   tests/gpu/check.sh --names       the case names, one a line (CTest registers one test each)
#   tests/gpu/check.sh --validate    no GPU needed: `ntpc check` every case (do the plans apply?)
#   tests/gpu/check.sh --emu [PATTERN]  on the emulated GPU (tests/emu, no GPU needed): each case at
#                                    its smaller emulator dims, the race check on, 8 emulated GPUs
#
# Environment: NTP_BUILD_DIR (default build; a tree configured for another source directory is
# replaced by build-gpu), NTP_NO_BUILD=1 (use the build as it is), NTP_GPU_ITERS (timed forwards
# per case, default 5), NTP_CASE_TIMEOUT (seconds per case, default 240), NTP_CACHE_DIR (the NVRTC
# cache, default ~/.cache/ntp), NTP_GPU_LOGS (where each case's output is kept; default a
# temporary directory).
#
# Exit status: 0 every case passed, 1 a case failed, 2 usage or build failure,
# 77 no usable GPU (ntpc run --backend cuda exits 2 and nvidia-smi lists no GPU).
set -u
cd "$(dirname "$0")/../.." || exit 2
ROOT=$PWD

mode=run
emu=0
pattern=""
for a in "$@"; do
  case $a in
    --list) mode=list ;;
    --names) mode=names ;;
    --validate) mode=validate ;;
    --emu) emu=1 ;;
    -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    -*) echo "check.sh: unknown option '$a'" >&2; exit 2 ;;
    *) pattern=$a ;;
  esac
done

ITERS=${NTP_GPU_ITERS:-5}
[ "$emu" = 1 ] && ITERS=${NTP_GPU_ITERS:-0} # the warm-up forward is the one compared
CASE_TIMEOUT=${NTP_CASE_TIMEOUT:-240}
T_START=$(date +%s.%N)

# --- build ------------------------------------------------------------------------------------
BUILD=${NTP_BUILD_DIR:-build}
if [ -f "$BUILD/CMakeCache.txt" ]; then
  home=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$BUILD/CMakeCache.txt")
  if [ -n "$home" ] && [ "$(cd "$home" 2>/dev/null && pwd -P)" != "$(pwd -P)" ]; then
    echo "check.sh: $BUILD was configured for $home, not $ROOT; using build-gpu" >&2
    BUILD=build-gpu
  fi
fi
NTPC=$BUILD/ntpc
if [ "$mode" = names ]; then
  sed -n 's/^  "\([A-Za-z0-9_.]*\)|.*/\1/p' "$0"
  exit 0
fi
if [ "${NTP_NO_BUILD:-0}" != 1 ] && [ "$mode" != list ]; then
  if [ ! -f "$BUILD/CMakeCache.txt" ]; then
    echo "== configuring $BUILD"
    cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null || { echo "check.sh: cmake configure failed" >&2; exit 2; }
  fi
  echo "== building $BUILD"
  cmake --build "$BUILD" -j"$(nproc 2>/dev/null || echo 4)" >"${TMPDIR:-/tmp}/ntp-gpu-build.$$.log" 2>&1 || {
    tail -40 "${TMPDIR:-/tmp}/ntp-gpu-build.$$.log" >&2
    echo "check.sh: build failed" >&2
    exit 2
  }
  rm -f "${TMPDIR:-/tmp}/ntp-gpu-build.$$.log"
fi
if [ "$mode" != list ] && [ ! -x "$NTPC" ]; then
  echo "check.sh: $NTPC not found (build failed?)" >&2
  exit 2
fi

# --- the emulated GPU: the real backend over tests/emu's libraries --------------------------------
if [ "$emu" = 1 ] && [ "$mode" = run ]; then
  EMU_LIB=$ROOT/$BUILD/tests/emu/libntp_emu.so
  case $BUILD in /*) EMU_LIB=$BUILD/tests/emu/libntp_emu.so ;; esac
  if [ ! -f "$EMU_LIB" ]; then
    echo "check.sh: $EMU_LIB not found (a build without the CUDA headers?)" >&2
    exit 2
  fi
  export NTP_CUDART_LIB=$EMU_LIB NTP_CUBLASLT_LIB=$EMU_LIB NTP_NCCL_LIB=$EMU_LIB NTP_NVRTC_LIB=$EMU_LIB
  export NTP_EMU_RACECHECK=${NTP_EMU_RACECHECK:-reverse} NTP_EMU_GPUS=${NTP_EMU_GPUS:-8}
  export NTP_CACHE_DIR=${NTP_CACHE_DIR:-$(dirname "$EMU_LIB")/../../emu-cache}
fi

# --- plans that exist only for this check -------------------------------------------------------
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ntp-gpu-check.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
LOGS=${NTP_GPU_LOGS:-$WORK/logs}
mkdir -p "$LOGS"
cat >"$WORK/gpt2_w2.ntp" <<'EOF'
// two ranks, every layer split 2 ways (the 50257-row vocabulary: 25129 + 25128)
plan gpt2_w2 for gpt2 {
  world 2;
  * tp 2;
}
EOF
cat >"$WORK/llama3_w4.ntp" <<'EOF'
// four ranks, every layer split 4 ways (vocabulary 8191: 2048 + 3 * 2047)
plan llama3_w4 for llama3_8b {
  world 4;
  * tp 4;
}
EOF

# --- the cases ----------------------------------------------------------------------------------
# name | world | expect | ntpc run arguments | what it covers | emulator overrides (appended: later -D win)
# expect: ok — every output ok; nccl — ranks on separate GPUs: with at least `world` GPUs visible
# it must pass like an ok case, with fewer it must be refused cleanly (exit 1 or 2, a message
# naming the GPUs or NCCL)
# The CPU reference (single-threaded, ~2 GFLOP/s) recomputes the unsharded model for every case,
# so the dims are chosen to keep it at a few seconds per case (about 80 s in all).
CASES=(
  "gpt2.full|1|ok|examples/gpt2.ntp -D B=2 -D S=64 -D L=12|GPT-2 124M: full width, 12 blocks, vocabulary 50257 (odd GEMM N)|-D B=1 -D S=8 -D L=2"
  "gpt2.s1024|1|ok|examples/gpt2.ntp -D B=1 -D S=1024 -D L=1 -D V=4096|1024-token causal attention (the benchmark's sequence)|-D S=96 -D D=128 -D H=2 -D V=512"
  "gpt2.world1|1|ok|examples/gpt2.ntp --world 1 -D B=2 -D S=32 -D L=2 -D V=8191|single rank (NCCL world 1 is not exercised: one rank never uses NCCL, and NCCL mode needs a GPU per rank)|-D S=16 -D D=64 -D H=4 -D V=1001"
  "llama3_8b.L2|1|ok|examples/llama3_8b.ntp -D B=1 -D S=16 -D L=2 -D V=8192|Llama-3-8B width: D 4096, GQA 32/8, RoPE 5e5, SwiGLU 14336; 2 blocks|-D D=512 -D H=16 -D V=1024"
  "llama_block|1|ok|examples/llama_block.ntp -D B=2 -D S=128 -D D=1024 -D H=8 -D F=2816|Llama block: RMSNorm, GQA 8/2 (head 128), RoPE, SwiGLU|-D S=32 -D D=256 -D F=704"
  "gpt3.L1|1|ok|examples/gpt3_175b.ntp -D B=2 -D S=64 -D D=1536 -D H=12 -D L=1 -D V=4096|GPT-3 block shape, head size 128, D reduced to 1536|-D S=16 -D D=384 -D H=3 -D V=1000"
  "sharded_matmul|1|ok|examples/sharded_matmul.ntp -D M=256 -D K=512 -D N=384|explicit-layout matmul chain, unsharded|-D M=64 -D K=96 -D N=80"
  "elementwise|1|ok|examples/elementwise.ntp|fp32: every elementwise function, broadcasting, batched matmul, softmax|"
  "gpt2.w2|2|ok|examples/gpt2.ntp --plan \$WORK/gpt2_w2.ntp --loopback -D B=2 -D S=32 -D L=2|tp 2 everywhere; vocabulary 50257 split 25129 + 25128|-D S=16 -D D=64 -D H=4 -D V=1001"
  "gpt2.w2.nccl|2|nccl|examples/gpt2.ntp --plan \$WORK/gpt2_w2.ntp -D B=2 -D S=32 -D L=2|2 ranks without --loopback (NCCL mode, a GPU per rank): with fewer GPUs, refused cleanly|-D S=16 -D D=64 -D H=4 -D V=1001"
  "llama_block.w3|3|ok|examples/llama_block.ntp --plan tests/plans/llama_block_w3_uneven.ntp --loopback -D B=6 -D S=32 -D D=1024 -D H=8 -D F=2816|tp 3, uneven: 8 heads 3/3/2 over 2 KV heads, hidden 2816 = 960+960+896|-D S=16 -D D=256 -D F=704"
  "elementwise.w3|3|ok|examples/elementwise.ntp --world 3 --loopback|fp32 model on 3 ranks|"
  "llama3_8b.w4|4|ok|examples/llama3_8b.ntp --plan \$WORK/llama3_w4.ntp --loopback -D B=4 -D S=32 -D D=1024 -D H=16 -D L=2 -D V=8191|tp 4 everywhere, GQA 16/4, vocabulary 8191 uneven|-D S=16 -D D=256 -D V=1001"
  "llama_block.w5|5|ok|examples/llama_block.ntp --plan tests/plans/llama_block_w5_groups.ntp --loopback -D B=6 -D S=32 -D D=1024 -D H=8 -D F=2816|unequal groups: attention (3, 2) with batch 3:2, MLP (4, 1)|-D S=16 -D D=256 -D F=704"
  "llama_block.w6|6|ok|examples/llama_block.ntp --plan tests/plans/llama_block_w6_sp.ntp --loopback -D B=6 -D S=32 -D D=1024 -D H=8 -D F=2816|attention tp 6: 8 heads 2/2/1/1/1/1, 2 KV heads replicated; MLP (3, 3) sequence parallel|-D S=16 -D D=256 -D F=704"
  "gpt2.degraded7|7|ok|examples/gpt2.ntp --plan examples/plans/gpt2_degraded7.ntp --loopback -D B=7 -D S=16 -D L=1 -D V=8191|one GPU lost: groups (4, 3), batch 4:3, 12 heads 3/3/3/3 and 4/4/4|-D S=8 -D D=192 -D V=1001"
  "gpt2.mixed8|8|ok|examples/gpt2.ntp --plan examples/plans/gpt2_mixed8.ntp --loopback -D B=8 -D S=16 -D L=2 -D V=8191|degrees 8/4/2 per layer, attention (5, 3) with 12 heads 3/3/2/2/2, SP MLP|-D S=8 -D D=192 -D V=1001"
  "gpt2.inline8|8|ok|examples/gpt2.ntp --world 8 --loopback -D B=8 -D S=16 -D L=1 -D V=8191|inline @tp: vocabulary 8 ways (uneven), attention (4, 4), MLP (2, 2, 2, 2)|-D S=8 -D D=192 -D V=1001"
  "llama3_8b.w8|8|ok|examples/llama3_8b.ntp --world 8 --loopback -D B=8 -D S=16 -D D=1024 -D H=16 -D L=2 -D V=8191|tp 8, 4 KV heads over 8 ranks (replicated), vocabulary uneven|-D S=8 -D D=256 -D V=1001"
  "gpt2.mixed8.nccl|8|nccl|examples/gpt2.ntp --plan examples/plans/gpt2_mixed8.ntp -D B=8 -D S=16 -D L=2 -D V=8191|the mixed plan on 8 GPUs through NCCL: split communicators per reducing set, grouped send/recv|-D S=8 -D D=192 -D V=1001"
  "sharded_matmul.w8|8|ok|examples/sharded_matmul.ntp --world 8 --loopback -D M=256 -D K=512 -D N=384|2x4 mesh: row, column, block, diagonal layouts; requested output layout|-D M=64 -D K=96 -D N=80"
  "train.byte_gpt|1|ok|examples/byte_gpt.ntp --train -D B=4 -D S=64 -D D=128|training: the loss and every gradient (backward kernels, dgrad/wgrad GEMMs) of a small GPT over bytes|-D B=2 -D S=16 -D D=64"
  "train.byte_gpt.w7|7|ok|examples/byte_gpt.ntp --train --plan examples/plans/byte_gpt_7.ntp --loopback -D B=4 -D S=64 -D D=128|training, one GPU lost: attention and MLP in groups (4, 3), vocabulary 7 ways, gradients summed over replicas that split a weight differently|-D B=2 -D S=16 -D D=64"
  "train.byte_gpt.mixed8.nccl|8|nccl|examples/byte_gpt.ntp -D H=8 --train --plan examples/plans/byte_gpt_mixed8.ntp -D B=8 -D S=64 -D D=128|training on 8 GPUs through NCCL: every layer its own way, batch shares 3:5; reductions that are no all-reduce by send/recv|-D B=2 -D S=16 -D D=64"
  "train.byte_gpt.w7.recompute|7|ok|examples/byte_gpt.ntp --train --plan tests/plans/byte_gpt_7_recompute.ntp --loopback -D B=4 -D S=64 -D D=128|training with every attention and MLP recomputed in the backward (their forward kernels and transfers run again on clones)|-D B=2 -D S=16 -D D=64"
  "train.llama.w6|6|ok|tests/numeric/train_llama.ntp --train --plan tests/plans/train_llama_w6_sp.ntp --loopback -D B=2 -D S=64 -D D=256 -D H=8|training a Llama shape: 8 heads 2/2/1/1/1/1 over replicated KV heads, RoPE, SwiGLU MLP (3, 3) sequence parallel|-D S=8 -D D=32"
  "train.llama.w5|5|ok|tests/numeric/train_llama.ntp --train --plan tests/plans/train_llama_w5_groups.ntp --loopback -D B=2 -D S=64 -D D=256 -D H=8|training with unequal groups and batch shares: attention (3, 2), MLP (4, 1), head (2, 3)|-D S=8 -D D=32"
)

field() { echo "$1" | cut -d'|' -f"$2"; }
case_args() {
  local a
  a=$(field "$1" 4 | sed "s|\\\$WORK|$WORK|g")
  if [ "$emu" = 1 ]; then a="$a $(field "$1" 6)"; fi
  echo "$a"
}

selected=()
for c in "${CASES[@]}"; do
  name=$(field "$c" 1)
  if [ -z "$pattern" ] || echo "$name" | grep -Eq -- "$pattern"; then selected+=("$c"); fi
done
if [ ${#selected[@]} -eq 0 ]; then
  echo "check.sh: no case matches '$pattern'" >&2
  exit 2
fi

if [ "$mode" = list ]; then
  for c in "${selected[@]}"; do
    printf '%-18s world %s  %s\n    ntpc run %s --backend cuda --iters %s\n' "$(field "$c" 1)" "$(field "$c" 2)" \
      "$(field "$c" 5)" "$(field "$c" 4)" "$ITERS"
  done
  exit 0
fi

if [ "$mode" = validate ]; then
  # `check` with the same options (minus the CUDA-only ones) compiles, shards and verifies.
  bad=0
  for c in "${selected[@]}"; do
    name=$(field "$c" 1)
    # shellcheck disable=SC2046
    if out=$("$NTPC" check $(case_args "$c" | sed 's/--loopback//') 2>&1); then
      printf '%-18s ok      %s\n' "$name" "$(echo "$out" | tail -1)"
    else
      printf '%-18s FAILED\n%s\n' "$name" "$out"
      bad=1
    fi
  done
  exit $bad
fi

# --- is there a GPU? ------------------------------------------------------------------------------
probe=$("$NTPC" run examples/elementwise.ntp --backend cuda --iters 0 -D B=1 -D S=2 -D D=8 2>&1)
prc=$?
if [ $prc -eq 2 ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    echo "check.sh: FAIL: nvidia-smi lists a GPU, but ntpc cannot use it:" >&2
    echo "$probe" >&2
    exit 1
  fi
  echo "check.sh: SKIP: no usable GPU ($(echo "$probe" | head -1))"
  exit 77
fi
if [ $prc -ne 0 ]; then
  echo "check.sh: FAIL: the probe run failed (exit $prc):" >&2
  echo "$probe" >&2
  exit 1
fi
if command -v nvidia-smi >/dev/null 2>&1; then
  gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)
  echo "== GPU: ${gpu:-unknown}"
fi
# GPUs visible to CUDA (NCCL mode runs rank r on GPU r)
NGPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
[ "$NGPUS" -ge 1 ] 2>/dev/null || NGPUS=1
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
  nv=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)
  [ "$nv" -lt "$NGPUS" ] && NGPUS=$nv
fi
if [ "$emu" = 1 ]; then
  NGPUS=$NTP_EMU_GPUS
  echo "== GPU: emulated ($NTP_EMU_GPUS GPUs, race check $NTP_EMU_RACECHECK; $EMU_LIB)"
fi
echo "== ntpc: $NTPC ($("$NTPC" --version)); NVRTC cache: ${NTP_CACHE_DIR:-~/.cache/ntp}; logs: $LOGS"
echo "== ${#selected[@]} cases, $ITERS timed forwards each; $NGPUS GPU(s) visible"

# --- run ------------------------------------------------------------------------------------------
rows=()
failed=()
notes=()
for c in "${selected[@]}"; do
  name=$(field "$c" 1) world=$(field "$c" 2) expect=$(field "$c" 3) what=$(field "$c" 5)
  log=$LOGS/$name.log
  args=$(case_args "$c")
  backend=cuda
  case " $args " in *" --loopback "*) backend="cuda loopback" ;; esac
  printf '%-18s ... ' "$name"
  t0=$(date +%s.%N)
  # shellcheck disable=SC2086
  timeout -k 10 "$CASE_TIMEOUT" "$NTPC" run $args --backend cuda --iters "$ITERS" >"$log" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
  err=$(awk '/vs cpu reference: max relative error/ {
               v = $7; if (v !~ /^[-+0-9.eE]+$/) v = "inf"; else v = v + 0;
               if (n++ == 0 || v == "inf" || (m != "inf" && v > m)) m = v }
             END { if (n) print (m == "inf" ? "nan/inf" : sprintf("%.3g", m)); else print "-" }' "$log")
  tol=$(sed -n 's/.*vs cpu reference:.*(tolerance \([^)]*\)).*/\1/p' "$log" | sort -g | head -1)
  fwd=$(sed -n 's/^backend cuda.* forward \([0-9.]*\) ms.*/\1/p' "$log" | head -1)
  logged=$(sed -n 's/^backend \(cuda[a-z ]*\), \([0-9]*\) ranks.*/\1|\2/p' "$log" | head -1)
  if [ -n "$logged" ]; then backend=${logged%|*} world=${logged#*|}; fi
  status=ok
  if [ "$expect" = nccl ] && [ "$NGPUS" -lt "$world" ]; then
    if { [ $rc -eq 1 ] || [ $rc -eq 2 ]; } && grep -Eq "GPUs|NCCL|nccl" "$log" && ! grep -q "vs cpu reference" "$log"; then
      status="refused (expected: $NGPUS GPU)"
    else
      status="FAIL (expected a refusal, exit $rc)"
    fi
    err=- tol=- fwd=""
  elif [ $rc -eq 124 ]; then
    status="TIMEOUT ${CASE_TIMEOUT}s"
  elif grep -q "MISMATCH" "$log"; then
    status=MISMATCH
  elif [ $rc -ne 0 ]; then
    status="ERROR (exit $rc)"
  elif ! grep -q "vs cpu reference:" "$log"; then
    status="ERROR (no comparison printed)"
  fi
  case $status in ok | "refused (expected"*) ;; *) failed+=("$name") ;; esac
  echo "$status (${wall}s)"
  rows+=("$name|$world|$backend|$err|${tol:--}|$status|${fwd:+$fwd ms}|${wall}s")
  case $name in gpt2.world1) notes+=("$name: $what") ;; esac
done

# --- the table --------------------------------------------------------------------------------------
echo
{
  echo "case|world|backend|max rel err|tolerance|status|time/forward|wall"
  echo "----|-----|-------|-----------|---------|------|------------|----"
  for r in "${rows[@]}"; do echo "$r"; done
} | awk -F'|' '
  { for (i = 1; i <= NF; i++) { cell[NR, i] = $i; if (length($i) > w[i]) w[i] = length($i) } n = NR; nf = NF }
  END {
    for (r = 1; r <= n; r++) {
      line = ""
      for (i = 1; i <= nf; i++) {
        c = cell[r, i]
        if (r == 2) { c = ""; for (k = 0; k < w[i]; k++) c = c "-" }
        line = line (i > 1 ? " | " : "") sprintf("%-" w[i] "s", c)
      }
      sub(/ +$/, "", line); print line
    }
  }'
echo
echo "max rel err: max |cuda - cpu| / max |cpu| over all elements of each output (worst output), against"
echo "the unsharded CPU reference; time/forward: device time (CUDA events) per forward, mean of $ITERS after a"
echo "warm-up; wall: the whole ntpc run (compile, NVRTC, CPU reference, transfers)."
for n in "${notes[@]}"; do echo "note: $n"; done
T_END=$(date +%s.%N)
total=$(awk -v a="$T_START" -v b="$T_END" 'BEGIN { printf "%.0f", b - a }')
if [ ${#failed[@]} -gt 0 ]; then
  echo
  for f in "${failed[@]}"; do
    echo "== $f: last lines of its log"
    tail -15 "$LOGS/$f.log" | sed 's/^/   /'
  done
  echo
  echo "FAIL: ${#failed[@]} of ${#rows[@]} cases failed (${failed[*]}); total ${total}s"
  exit 1
fi
echo "PASS: ${#rows[@]} cases; total ${total}s"
exit 0
