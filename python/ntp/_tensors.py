"""Arrays across the native boundary as DLPack DLTensors, without copies where the data already
has the model's dtype and layout: NumPy arrays (bf16 as ml_dtypes.bfloat16), PyTorch tensors on
the host or on a GPU, and anything else that speaks DLPack. Internal to the package."""
from __future__ import annotations

import ctypes as C
from typing import Any

import numpy as np

from . import _native as N

try:  # NumPy has no bfloat16; ml_dtypes (a dependency) gives it one
    import ml_dtypes
    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover
    BF16 = None

NUMPY_OF = {"bf16": BF16, "fp16": np.dtype(np.float16), "fp32": np.dtype(np.float32), "i32": np.dtype(np.int32)}


def dtype_name(dl: N.DLDataType) -> str:
    if dl.code == N.kDLBfloat:
        return "bf16"
    if dl.code == N.kDLFloat:
        return "fp16" if dl.bits == 16 else "fp32"
    return "i32"


def _torch():
    try:
        import torch
        return torch
    except ImportError:
        return None


def is_torch(x: Any) -> bool:
    t = _torch()
    return t is not None and isinstance(x, t.Tensor)


def torch_dtype(name: str):
    t = _torch()
    return {"bf16": t.bfloat16, "fp16": t.float16, "fp32": t.float32, "i32": t.int32}[name]


class Held:
    """A DLTensor over an array, with what keeps its memory and shape alive."""

    def __init__(self, array: Any, dl: N.DLTensor, shape: Any):
        self.array, self.dl, self.shape = array, dl, shape

    @property
    def ptr(self):
        return C.pointer(self.dl)


def _dl(data_ptr: int, shape, name: str, device=(N.kDLCPU, 0)) -> tuple:
    sh = (C.c_int64 * max(1, len(shape)))(*shape)
    code = {"bf16": N.kDLBfloat, "fp16": N.kDLFloat, "fp32": N.kDLFloat, "i32": N.kDLInt}[name]
    bits = 32 if name in ("fp32", "i32") else 16
    dl = N.DLTensor(C.c_void_p(data_ptr), N.DLDevice(*device), len(shape), N.DLDataType(code, bits, 1), sh, None, 0)
    return dl, sh


class _DLManagedTensor(C.Structure):
    _fields_ = [("dl_tensor", N.DLTensor), ("manager_ctx", C.c_void_p), ("deleter", C.c_void_p)]


_capsule_pointer = C.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = C.c_void_p
_capsule_pointer.argtypes = [C.py_object, C.c_char_p]


def _from_capsule(x: Any, name: str, shape: tuple, what: str) -> Held:
    """A DLPack producer's tensor in device memory (CuPy, JAX, ...), borrowed for the call: its
    capsule is kept alive (and so its memory) while the DLTensor is in use."""
    cap = x.__dlpack__()
    t = _DLManagedTensor.from_address(_capsule_pointer(cap, b"dltensor")).dl_tensor
    got = tuple(t.shape[d] for d in range(t.ndim))
    if got != tuple(shape):
        raise ValueError(f"{what}: a tensor of shape {got} for shape {tuple(shape)}")
    want = {"bf16": (N.kDLBfloat, 16), "fp16": (N.kDLFloat, 16), "fp32": (N.kDLFloat, 32), "i32": (N.kDLInt, 32)}[name]
    if (t.dtype.code, t.dtype.bits, t.dtype.lanes) != (*want, 1):
        raise TypeError(f"{what}: a device tensor of another dtype than {name} (device tensors are not converted)")
    if t.strides:
        st, want = [t.strides[d] for d in range(t.ndim)], 1
        for d in reversed(range(t.ndim)):
            if got[d] != 1 and st[d] != want:
                raise ValueError(f"{what}: a device tensor that is not dense and row-major")
            want *= got[d]
    dl, sh = _dl(t.data + t.byte_offset, shape, name, (t.device.device_type, t.device.device_id))
    return Held(cap, dl, sh)


def as_input(x: Any, name: str, shape: tuple, what: str) -> Held:
    """x as a tensor of dtype `name` and shape `shape`: zero-copy when it already is one (and is
    dense); integer ids of another width and floats of another precision are converted."""
    if is_torch(x):
        torch = _torch()
        if tuple(x.shape) != tuple(shape):
            raise ValueError(f"{what}: a tensor of shape {tuple(x.shape)} for shape {tuple(shape)}")
        want = torch_dtype(name)
        if x.dtype != want:
            ints = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
            # ids: integers only (bool and complex are not ids), and within 32 bits before the
            # cast, which would wrap 2**32 + 1 to 1; values: real floats only
            if (x.dtype not in ints) if name == "i32" else (not x.dtype.is_floating_point or x.dtype.is_complex):
                raise TypeError(f"{what}: {x.dtype} for a {name} tensor")
            if name == "i32" and x.numel() and (int(x.min()) < -2**31 or int(x.max()) >= 2**31):
                raise ValueError(f"{what}: ids beyond 32 bits")
            x = x.to(want)
        x = x.contiguous()
        dev = (N.kDLCUDA, x.device.index or 0) if x.device.type == "cuda" else (N.kDLCPU, 0)
        dl, sh = _dl(x.data_ptr(), shape, name, dev)
        return Held(x, dl, sh)
    if not isinstance(x, np.ndarray) and hasattr(x, "__dlpack__"):
        dev = x.__dlpack_device__()[0] if hasattr(x, "__dlpack_device__") else N.kDLCPU
        if dev != N.kDLCPU:
            return _from_capsule(x, name, shape, what)
        x = np.from_dlpack(x)
    a = np.asarray(x)
    if a.shape != tuple(shape):
        raise ValueError(f"{what}: an array of shape {a.shape} for shape {tuple(shape)}")
    want = NUMPY_OF[name]
    if want is None:
        raise TypeError(f"{what}: bf16 needs ml_dtypes (pip install ml_dtypes) or a torch.bfloat16 tensor")
    if a.dtype != want:
        if name == "i32" and a.dtype.kind not in "iu":
            raise TypeError(f"{what}: {a.dtype} values for integer ids (i32)")
        if name != "i32" and a.dtype.kind not in "fV" and a.dtype != BF16:
            raise TypeError(f"{what}: {a.dtype} values for a {name} tensor")
        if name == "i32" and a.size and (a.min() < -2**31 or a.max() >= 2**31):
            raise ValueError(f"{what}: ids beyond 32 bits")
    a = np.ascontiguousarray(a, dtype=want)
    dl, sh = _dl(a.ctypes.data, shape, name)
    return Held(a, dl, sh)


def new_output(name: str, shape: tuple, like: Any) -> Held:
    """An empty tensor to receive an output: a torch tensor on like's device when like is one,
    else a NumPy array."""
    if is_torch(like):
        torch = _torch()
        t = torch.empty(tuple(shape), dtype=torch_dtype(name), device=like.device)
        dev = (N.kDLCUDA, t.device.index or 0) if t.device.type == "cuda" else (N.kDLCPU, 0)
        dl, sh = _dl(t.data_ptr(), shape, name, dev)
        return Held(t, dl, sh)
    want = NUMPY_OF[name]
    if want is None:
        raise TypeError("a bf16 output needs ml_dtypes (pip install ml_dtypes)")
    a = np.empty(tuple(shape), dtype=want)
    dl, sh = _dl(a.ctypes.data, shape, name)
    return Held(a, dl, sh)
