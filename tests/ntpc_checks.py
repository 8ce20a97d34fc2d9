"""ntpc_checks.py — what the Python test scripts that drive ntpc share (tests/inputs.py,
tests/hf_params.py): counted checks, ntpc runs with their expected exit status, and the --dump
format read back (docs/cli.md#--dump-dir)."""
import os
import subprocess
import sys
import tempfile


class Checks:
    def __init__(self, ntpc):
        self.ntpc, self.fails, self.count = ntpc, 0, 0

    def check(self, cond, what):
        self.count += 1
        if not cond:
            self.fails += 1
            print("[FAIL]", what)

    def run(self, *args, rc=0):
        """ntpc ARGS: its stdout and stderr; a check that it exits with rc"""
        p = subprocess.run([self.ntpc, *args], capture_output=True, text=True)
        self.check(p.returncode == rc, f"ntpc {' '.join(args)}: exit {p.returncode}, expected {rc}\n{p.stdout}{p.stderr}")
        return p.stdout + p.stderr

    def summary(self, name, extra=""):
        print(f"{name}: {extra}{self.count - self.fails} of {self.count} checks passed")
        return 1 if self.fails else 0


def start(name):
    """NumPy, the counted checks over sys.argv[1] (ntpc) and a scratch directory; without NumPy
    the script says so and exits 77 (skipped)."""
    try:
        import numpy
    except ImportError:
        print(f"{name}: NumPy is not installed; skipped")
        sys.exit(77)
    return numpy, Checks(sys.argv[1]), tempfile.mkdtemp()


def dump(d):
    """a --dump directory: {name: array} (fp32 values, int32 ids)"""
    import numpy as np
    out = {}
    with open(os.path.join(d, "manifest.tsv")) as f:
        for line in f:
            kind, name, dtype, shape, fname = line.rstrip("\n").split("\t")
            raw = np.fromfile(os.path.join(d, fname), dtype="<i4" if dtype == "i32" else "<f4")
            out[name] = raw.reshape([int(s) for s in shape.split(",")] if shape else [])
    return out
