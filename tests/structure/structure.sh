#!/bin/sh
# structure.sh [REPO] — the shape of the code, checked on every run (docs/testing.md, "The code's
# shape"): what a reviewer would otherwise have to re-measure by hand after every change.
#  1. no C file in runtime/, codegen/, compiler/ or tools/ over 800 lines;
#  2. no function there over 100 lines (brace-initialised tables end in "};" and are not
#     functions: funclen.awk, which gives the same lengths as universal-ctags);
#  3. no test of which backend a caller holds outside the backends' own folders (runtime/cpu/,
#     runtime/cuda/) and the table that picks one (runtime/exec/exec.c): callers hold an executor
#     and call its operations (runtime/exec/exec.h, docs/adding-a-backend.md). Two places are the
#     CUDA backend's by nature and allowed: the program image's per-rank CUDA section as the reader
#     fills it (runtime/io/program_read.c) and `ntpc calibrate`, which measures the local GPUs.
# Exit 0 when all hold, 1 listing every violation.
set -u
here=$(cd "$(dirname "$0")" && pwd)
cd "${1:-$here/../..}" || exit 2
fail=0
dirs="runtime codegen compiler tools"

big=$(find $dirs -name '*.[ch]' -exec wc -l {} + | awk '$2 != "total" && $1 > 800 { print "  " $2 ": " $1 " lines" }')
[ -z "$big" ] || { printf 'files over 800 lines:\n%s\n' "$big"; fail=1; }

long=$(find $dirs -name '*.c' | sort | xargs awk -f "$here/funclen.awk" | awk '$1 > 100 { print "  " $2 ": " $1 " lines" }')
[ -z "$long" ] || { printf 'functions over 100 lines:\n%s\n' "$long"; fail=1; }

tests=$(grep -rnE --include=*.c --include=*.h --include=*.py \
  'cuda \?|->cuda\b|[.>]cuda \?|o\.cuda\b|backend ?[!=]= ?"|strn?cmp\([^)]*"(cpu|cuda)"|cuda_backend\.h|ntp_cuda_[a-z_]+\(|ntp_trainer_new_cuda' \
  runtime tools python 2>/dev/null |
  grep -v '^runtime/cuda/\|^runtime/cpu/\|^runtime/exec/exec\.c:\|^tools/ntpc/calibrate_cmd\.c:' |
  grep -v '^runtime/io/program_read\.c:[0-9]*: .*p->cuda' |
  grep -v 'strncmp(o\.emit, "cuda"')
[ -z "$tests" ] || { printf 'backend tests outside the backends and exec.c (call the executor table instead):\n%s\n' "$tests"; fail=1; }

[ $fail -eq 0 ] && echo "structure.sh: files <= 800 lines, functions <= 100 lines, no backend test outside the backends"
exit $fail
