# check.sh — the assertions of the shell tests (sourced by cli.sh, train.sh, train_zero.sh and
# planner/zero_cli.sh). The sourcing
# script sets $tmp (a scratch folder) first; the results are counted in $pass and $fail.
pass=0 fail=0
ok() { pass=$((pass + 1)); }                       # a check of the script's own that passed
bad() { fail=$((fail + 1)); echo "[FAIL] $*"; }    # ... and one that failed: what was wrong
check() { # check NAME EXPECTED_RC CMD... ; stdout+stderr in $tmp/out
  name=$1 want=$2; shift 2
  "$@" >"$tmp/out" 2>&1; rc=$?
  if [ "$rc" -eq "$want" ]; then pass=$((pass + 1)); else
    fail=$((fail + 1)); echo "[FAIL] $name: exit $rc, expected $want"; sed 's/^/    /' "$tmp/out"; fi
}
expect_text() { # expect_text NAME TEXT : the last command's output contains TEXT
  if grep -qF -- "$2" "$tmp/out"; then pass=$((pass + 1)); else
    fail=$((fail + 1)); echo "[FAIL] $1: output lacks '$2'"; sed 's/^/    /' "$tmp/out"; fi
}
