# train_runs.sh — sourced by train.sh and train_epilogues.sh (with $ntpc, $py, $tmp, $here,
# $common and fail set): one training run and the comparison of two.
# shown: the sed script of the run's lines to print (default: its steps and its backend line).

# train NAME ARGS...: the run's step lines into NAME.log, its parameters into NAME.st
train() {
  name=$1
  shift
  "$ntpc" train "$@" $common --save-params "$tmp/$name.st" >"$tmp/$name.out" 2>&1
  rc=$?
  if [ $rc -ne 0 ]; then
    echo "[FAIL] $name: ntpc train exited $rc"
    cat "$tmp/$name.out"
    fail=1
    return 1
  fi
  grep '^step *[0-9]*/' "$tmp/$name.out" | sed 's/  [0-9]* tokens\/s$//' >"$tmp/$name.log"
  sed -n "${shown:-/^step/p;/^backend/p}" "$tmp/$name.out"
}

# same REF NAME LOSS_TOL PARAM_TOL [FLOOR]: NAME's losses and parameters against REF's
same() {
  if awk -v tol="$3" 'NR == FNR { a[FNR] = $4; n = FNR; next }
      { d = a[FNR] - $4; if (d < 0) d = -d; if (d > tol * a[FNR]) bad = 1; m = FNR }
      END { exit bad || m != n || n != 3 }' "$tmp/$1.log" "$tmp/$2.log"; then
    echo "$2: losses equal $1's within $3"
  else
    echo "[FAIL] $2: the losses differ from $1's"
    paste "$tmp/$1.log" "$tmp/$2.log"
    fail=1
  fi
  printf '%s: ' "$2"
  "$py" "$here/compare_params.py" "$tmp/$1.st" "$tmp/$2.st" "$4" ${5:-} || fail=1
}
