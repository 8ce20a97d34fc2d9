# lib.sh — what the robust case scripts share (sourced by robust.sh and surfaces.sh, which set
# $ntpc and $case first): a scratch folder, expect, and small file makers.
tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
fail=0

# expect NAME RC SECONDS TEXT CMD... : exit status RC within SECONDS, output containing TEXT
# The time limits are for an optimised build; a sanitizer build scales them (NTP_TEST_TIME_SCALE).
expect() {
  name=$1 want=$2 secs=$(( $3 * ${NTP_TEST_TIME_SCALE:-1} )) text=$4; shift 4
  timeout -s KILL "$secs" "$@" >"$tmp/out" 2>&1
  rc=$?
  if [ "$rc" -ne "$want" ]; then
    fail=1
    if [ "$rc" -eq 137 ]; then echo "[FAIL] $name: killed after ${secs}s (a hang or unbounded work)"
    elif [ "$rc" -gt 128 ]; then echo "[FAIL] $name: killed by signal $((rc - 128))"
    else echo "[FAIL] $name: exit $rc, expected $want"; fi
    head -c 2000 "$tmp/out" | sed 's/^/    /'
    return
  fi
  if [ -n "$text" ] && ! grep -qF -- "$text" "$tmp/out"; then
    fail=1
    echo "[FAIL] $name: output lacks '$text'"
    head -c 2000 "$tmp/out" | sed 's/^/    /'
    return
  fi
  echo "[ok] $name"
}

model() { # model FILE BODY : a one-model file
  printf 'model m {\n%s\n}\n' "$2" >"$1"
}

# a safetensors file: header JSON ($2) padded to 8 bytes, then $3 bytes of zeros
safetensors() {
  python3 - "$1" "$2" "$3" <<'EOF'
import struct, sys
path, header, nbytes = sys.argv[1], sys.argv[2].encode(), int(sys.argv[3])
header += b' ' * (-len(header) % 8)
open(path, 'wb').write(struct.pack('<Q', len(header)) + header + bytes(nbytes))
EOF
}

tiny='  dim N = 4;
  input x : fp32[2, N];
  output y = lin: linear(x, out = 3);'


# tokens FILE N [ID] : an llm.c token file of N byte-valued ids; ID (if given) as its last token
tokens() {
  python3 - "$@" <<'PY'
import random, struct, sys
path, n = sys.argv[1], int(sys.argv[2])
ids = [random.Random(5).randrange(256) for _ in range(n)]
if len(sys.argv) > 3:
    ids[-1] = int(sys.argv[3])
head = struct.pack("<3i", 20240520, 1, n) + bytes(4 * 253)
open(path, "wb").write(head + struct.pack("<%dH" % n, *ids))
PY
}

# npy FILE DESCR SHAPE NBYTES : a .npy version 1.0 file of that descr and shape, then NBYTES bytes
npy() {
  python3 - "$@" <<'PY'
import struct, sys
path, descr, shape, nbytes = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
h = ("{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)).encode()
h += b" " * (-(len(h) + 11) % 64) + b"\n"
open(path, "wb").write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h + bytes(nbytes))
PY
}
