"""The CUDA backend from Python, with inputs in device memory through DLPack: on a GPU, or on the
emulated one (tests/emu: ctest's emu.python sets NTP_CUDART_LIB and friends to the emulator).
Skipped when no CUDA runtime is named (NTP_CUDART_LIB) and PyTorch has no GPU."""
import ctypes as C
import os
from pathlib import Path

import numpy as np
import pytest

import ntp

ROOT = Path(__file__).resolve().parents[2]
GPT2 = str(ROOT / "examples" / "gpt2.ntp")
MIXED8 = str(ROOT / "examples" / "plans" / "gpt2_mixed8.ntp")
TOY = {"B": 8, "S": 16, "D": 64, "H": 8, "V": 250, "L": 2}

CUDART = os.environ.get("NTP_CUDART_LIB")
pytestmark = pytest.mark.skipif(not CUDART, reason="no CUDA runtime named (NTP_CUDART_LIB): no GPU, no emulator")


class DLManaged(C.Structure):
    _fields_ = [("dl_tensor", ntp._native.DLTensor), ("manager_ctx", C.c_void_p), ("deleter", C.c_void_p)]


class DeviceArray:
    """A minimal DLPack producer over memory from cudaMalloc (what CuPy or JAX would hand over)."""

    def __init__(self, host: np.ndarray):
        self.rt = C.CDLL(CUDART)
        self.ptr = C.c_void_p()
        assert self.rt.cudaMalloc(C.byref(self.ptr), C.c_size_t(host.nbytes)) == 0
        assert self.rt.cudaMemcpy(self.ptr, host.ctypes.data_as(C.c_void_p), C.c_size_t(host.nbytes), 1) == 0
        self.shape = (C.c_int64 * host.ndim)(*host.shape)
        code = {"i": ntp._native.kDLInt, "f": ntp._native.kDLFloat}[host.dtype.kind]
        self.m = DLManaged(ntp._native.DLTensor(self.ptr, ntp._native.DLDevice(ntp._native.kDLCUDA, 0), host.ndim,
                                                ntp._native.DLDataType(code, host.dtype.itemsize * 8, 1), self.shape,
                                                None, 0), None, None)

    def __dlpack_device__(self):
        return (ntp._native.kDLCUDA, 0)

    def __dlpack__(self, stream=None):
        new = C.pythonapi.PyCapsule_New
        new.restype = C.py_object
        new.argtypes = [C.c_void_p, C.c_char_p, C.c_void_p]
        return new(C.addressof(self.m), b"dltensor", None)

    def __del__(self):
        self.rt.cudaFree(self.ptr)


def test_cuda_forward_from_device_memory():
    tokens = np.random.default_rng(3).integers(0, 250, size=(8, 16)).astype(np.int32)
    cpu = ntp.compile(GPT2, defines=TOY, plan=MIXED8, seed=6)
    gpu = ntp.compile(GPT2, defines=TOY, plan=MIXED8, seed=6, backend="cuda", loopback=True)
    want = cpu.forward(tokens)["logits"].astype(np.float32)
    host = gpu.forward(tokens)["logits"].astype(np.float32)
    dev = gpu.forward(DeviceArray(tokens))["logits"].astype(np.float32)  # the ids read from device memory
    assert np.array_equal(host, dev)
    assert np.max(np.abs(dev - want)) <= 5e-2 * np.max(np.abs(want))  # bf16: other sums' order
    with pytest.raises(TypeError, match="device tensors are not converted"):
        gpu.forward(DeviceArray(tokens.astype(np.int64)))
