#!/bin/sh
# golden.sh NTPC KIND INPUT EXPECTED [ntpc options...]
#   KIND=ir : `ntpc INPUT --emit=ir` must print EXPECTED and exit 0
#   KIND=err: `ntpc check INPUT` must print EXPECTED on stderr and exit 1
#   KIND=out: `ntpc INPUT [options]` must print EXPECTED and exit 0 (options name the stage)
# With UPDATE_GOLDEN=1 the expected file is rewritten instead (review the diff!).
set -u
ntpc=$1 kind=$2 input=$3 expected=$4
shift 4
out=$(mktemp) && trap 'rm -f "$out"' EXIT
case $kind in
  ir)  "$ntpc" "$input" --emit=ir --color=never "$@" >"$out"; rc=$?; want=0 ;;
  err) "$ntpc" check "$input" --color=never "$@" 2>"$out" >/dev/null; rc=$?; want=1 ;;
  out) "$ntpc" "$input" --color=never "$@" >"$out"; rc=$?; want=0 ;;
  *)   echo "golden.sh: unknown kind $kind" >&2; exit 2 ;;
esac
if [ "${UPDATE_GOLDEN:-0}" = 1 ]; then
  [ "$rc" -eq "$want" ] || { echo "[FAIL] $input: exit code $rc, expected $want; not updating"; cat "$out"; exit 1; }
  cp "$out" "$expected" && echo "[UPDATED] $expected" && exit 0
fi
if [ "$rc" -ne "$want" ]; then
  echo "[FAIL] $input: exit code $rc, expected $want"; cat "$out"; exit 1
fi
if ! diff -u "$expected" "$out"; then
  echo "[FAIL] $input: output differs from $expected"; exit 1
fi
echo "[PASS] $input"
