# shellcheck shell=bash
# bench/bench_lib.sh — what the GPU benchmarks share (sourced, not run): the build, the probe for a
# usable GPU (no GPU: one "NAME: no GPU: ..." line and exit 0), the work directory, the direct
# driver (bench_model.c against the static libraries). The scripts honour the emulated GPU's
# variables (NTP_CUDART_LIB, ... as tests/emu/CMakeLists.txt sets them): there everything runs
# and nothing measured means anything, which the line "(emulated GPU: ...)" says.
#
# Before sourcing: BENCH (the script's name, for messages). After: ROOT, BUILD, NTPC, W (a temporary
# directory removed at exit), EMU (1 on the emulated GPU), and the functions below.
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
ROOT=$PWD
bench_fail() { echo "$BENCH: FAIL: $*" >&2; exit 1; }

# --- build (as tests/gpu/check.sh) ------------------------------------------------------------
BUILD=${NTP_BUILD_DIR:-build}
if [ -f "$BUILD/CMakeCache.txt" ]; then
  home=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$BUILD/CMakeCache.txt")
  if [ -n "$home" ] && [ "$(cd "$home" 2>/dev/null && pwd -P)" != "$(pwd -P)" ]; then
    echo "$BENCH: $BUILD was configured for $home, not $ROOT; using build-gpu" >&2
    BUILD=build-gpu
  fi
fi
if [ "${NTP_NO_BUILD:-0}" != 1 ]; then
  if [ ! -f "$BUILD/CMakeCache.txt" ]; then
    cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null || { echo "$BENCH: cmake configure failed" >&2; exit 2; }
  fi
  cmake --build "$BUILD" -j"$(nproc 2>/dev/null || echo 4)" >/dev/null 2>&1 || {
    cmake --build "$BUILD" -j1 2>&1 | tail -30 >&2
    echo "$BENCH: build failed" >&2
    exit 2
  }
fi
NTPC=$BUILD/ntpc
[ -x "$NTPC" ] || { echo "$BENCH: $NTPC not found" >&2; exit 2; }

EMU=0
case "${NTP_CUDART_LIB:-}" in *ntp_emu*) EMU=1 ;; esac

# No usable GPU: a line saying so, exit 0. A GPU that nvidia-smi lists but ntpc cannot use: exit 1.
bench_probe() {
  local probe prc
  probe=$("$NTPC" run examples/elementwise.ntp --backend cuda --iters 0 -D B=1 -D S=2 -D D=8 2>&1)
  prc=$?
  if [ $prc -eq 2 ]; then
    if [ $EMU = 0 ] && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
      echo "$BENCH: FAIL: nvidia-smi lists a GPU, but ntpc cannot use it:" >&2
      echo "$probe" >&2
      exit 1
    fi
    echo "$BENCH: no GPU: nothing measured ($(echo "$probe" | head -1))"
    exit 0
  fi
  [ $prc -eq 0 ] || bench_fail "probe run failed (exit $prc): $probe"
  [ $EMU = 0 ] || echo "$BENCH: (emulated GPU: the pipeline runs, the numbers mean nothing)"
}

W=$(mktemp -d "${TMPDIR:-/tmp}/ntp-bench.XXXXXX")
trap 'rm -rf "$W"' EXIT

# the direct driver: bench_model.c against libntpc/libntprt (the runtime without the model ABI)
bench_build_direct() {
  # shellcheck disable=SC2046
  ${CC:-cc} -std=c17 -O2 -DNTP_BENCH_DIRECT -I"$BUILD/include/ntp" -Iruntime -Iruntime/cuda -Itools bench/bench_model.c \
    "$BUILD/libntprt.a" "$BUILD/libntpc.a" "$BUILD/libntpcore.a" $(pkg-config --libs json-c 2>/dev/null || echo -ljson-c) \
    -lopenblas -fopenmp -ldl -lm -o "$1" 2>"$W/cc_direct.log" || { cat "$W/cc_direct.log" >&2; return 1; }
}

# key=value from a log
bench_kv() { sed -n "s/^$1=//p" "$2" | tail -1; }
# "a|b|c" rows on stdin as an aligned table (the second row: the rule)
bench_table() {
  awk -F'|' '
  { for (i = 1; i <= NF; i++) { c[NR, i] = $i; if (length($i) > w[i]) w[i] = length($i) } if (NF > nf) nf = NF; n = NR }
  END { for (r = 1; r <= n; r++) { l = ""
          for (i = 1; i <= nf; i++) { x = c[r, i]; if (r == 2) { x = ""; for (k = 0; k < w[i]; k++) x = x "-" }
                                      l = l (i > 1 ? " | " : "") sprintf("%-" w[i] "s", x) }
          sub(/ +$/, "", l); print l } }'
}
