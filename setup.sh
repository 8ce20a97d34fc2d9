#!/usr/bin/env bash
# setup.sh — on a fresh Debian/Ubuntu machine: install what the build needs, configure,
# build, and run the main job (tools/demo_elastic.sh: a small GPT trained on 16 simulated GPUs
# in stages with non-uniform TP, one GPU failing mid-run and coming back, the plan following it).
# Extra CMake arguments: NTP_CMAKE_ARGS="-DNTP_WERROR=ON" ./setup.sh
set -euo pipefail
cd "$(dirname "$0")"

need=()
command -v cmake >/dev/null || need+=(cmake)
command -v cc >/dev/null || need+=(gcc libc6-dev)
command -v make >/dev/null || need+=(make)
command -v flex >/dev/null || need+=(flex)
command -v bison >/dev/null || need+=(bison)
command -v pkg-config >/dev/null || need+=(pkg-config)
[ -f /usr/include/json-c/json.h ] || need+=(libjson-c-dev)  # safetensors headers
[ -f /usr/include/dlpack/dlpack.h ] || need+=(libdlpack-dev) # tensors across the model library's ABI
# the CPU backend's GEMMs: the OpenMP build of OpenBLAS (shares the thread pool of the other kernels)
ls /usr/lib/*/openblas-openmp/libopenblas.so >/dev/null 2>&1 || need+=(libopenblas-openmp-dev)
/usr/bin/python3 -c 'import numpy' 2>/dev/null || need+=(python3 python3-numpy) # independent numeric tests
/usr/bin/python3 -c 'import ensurepip' 2>/dev/null || need+=(python3-venv)        # the Python package's tests
if ((${#need[@]})); then
  echo "setup: installing ${need[*]}"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# shellcheck disable=SC2086
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo ${NTP_CMAKE_ARGS:-} >/dev/null
cmake --build build -j"$(nproc)"

# the Python package's tests run in a virtual environment with NumPy, ml_dtypes and pytest from
# PyPI (python/tests, docs/python.md); offline, they are skipped
if [ ! -x build/pyenv/bin/python ]; then
  if /usr/bin/python3 -m venv build/pyenv >/dev/null 2>&1 &&
    build/pyenv/bin/pip install -q numpy ml_dtypes pytest safetensors hypothesis >/dev/null 2>&1; then
    echo "setup: build/pyenv: NumPy, ml_dtypes, pytest, safetensors and Hypothesis for the Python package's tests"
  else
    echo "setup: no Python test environment (PyPI unreachable?): the Python package's tests will be skipped"
    rm -rf build/pyenv
  fi
fi

echo
echo "== main job: training on 16 simulated GPUs in stages: a straggler absorbed, a GPU failing and coming back (tools/demo_elastic.sh)"
sh tools/demo_elastic.sh out
