#!/bin/sh
# python.sh BUILD_DIR NTPC [TESTS] — the Python package's pytest suite (python/tests, or TESTS) against this build
# tree's native library, in the virtual environment ./setup.sh makes (BUILD_DIR/pyenv: NumPy,
# ml_dtypes, pytest from PyPI). Without it the suite is skipped (77); .ci/run also runs it
# against a `pip install .` of the package (docs/python.md).
py=$1/pyenv/bin/python
if [ ! -x "$py" ] || ! "$py" -c "import pytest, numpy, ml_dtypes" 2>/dev/null; then
  echo "python.sh: no test environment in $1/pyenv (./setup.sh makes it; it needs PyPI): skipped"
  exit 77
fi
NTP_NATIVE_LIB=$1/python/libntp_native.so PYTHONPATH=python NTPC=$2 exec "$py" -m pytest -q -rs -p no:cacheprovider "${3:-python/tests}"
