"""The native library (python/native/ntp_native.c: the compiler and the runtime in one shared
object) through ctypes: its structures and prototypes. Internal to the package."""
from __future__ import annotations

import ctypes as C
import os
from pathlib import Path

# ---- DLPack (dlpack.h, v0.8 layout) -------------------------------------------------------------
kDLCPU, kDLCUDA = 1, 2
kDLInt, kDLUInt, kDLFloat, kDLBfloat = 0, 1, 2, 4


class DLDevice(C.Structure):
    _fields_ = [("device_type", C.c_int), ("device_id", C.c_int32)]


class DLDataType(C.Structure):
    _fields_ = [("code", C.c_uint8), ("bits", C.c_uint8), ("lanes", C.c_uint16)]


class DLTensor(C.Structure):
    _fields_ = [("data", C.c_void_p), ("device", DLDevice), ("ndim", C.c_int32), ("dtype", DLDataType),
                ("shape", C.POINTER(C.c_int64)), ("strides", C.POINTER(C.c_int64)), ("byte_offset", C.c_uint64)]


# ---- the model ABI (runtime/ntp_model.h) ---------------------------------------------------------
class TensorInfoC(C.Structure):
    _fields_ = [("name", C.c_char_p), ("dtype", DLDataType), ("ndim", C.c_int32), ("shape", C.POINTER(C.c_int64))]


class ModelInfoC(C.Structure):
    _fields_ = [("abi_version", C.c_int32), ("name", C.c_char_p), ("world", C.c_int32), ("sharding", C.c_char_p),
                ("n_inputs", C.c_int32), ("n_outputs", C.c_int32), ("n_params", C.c_int32),
                ("inputs", C.POINTER(TensorInfoC)), ("outputs", C.POINTER(TensorInfoC)),
                ("params", C.POINTER(TensorInfoC))]


class ArtifactC(C.Structure):
    _fields_ = [("abi_version", C.c_int32), ("image", C.c_void_p), ("image_len", C.c_size_t), ("info", ModelInfoC)]


class ModelOptionsC(C.Structure):
    _fields_ = [("backend", C.c_char_p), ("rank", C.c_int32), ("device", C.c_int32), ("loopback", C.c_int32),
                ("nccl_comm", C.c_void_p), ("seed", C.c_uint64)]


class TrainOptionsC(C.Structure):
    _fields_ = [("lr", C.c_double), ("beta1", C.c_double), ("beta2", C.c_double), ("eps", C.c_double),
                ("weight_decay", C.c_double), ("clip", C.c_double)]


class DiagC(C.Structure):
    _fields_ = [("severity", C.c_int), ("file", C.c_char_p), ("line", C.c_int), ("col", C.c_int),
                ("end_col", C.c_int), ("message", C.c_char_p)]


def _find() -> str:
    env = os.environ.get("NTP_NATIVE_LIB")
    if env:
        return env
    here = Path(__file__).resolve().parent
    for cand in (here / "libntp_native.so", here.parent.parent / "build" / "python" / "libntp_native.so"):
        if cand.exists():
            return str(cand)
    raise ImportError("ntp: the native library libntp_native.so is not installed beside the package "
                      "(pip install . builds it; in a build tree set NTP_NATIVE_LIB)")


lib = C.CDLL(_find())
P = C.c_void_p
lib.ntp_py_compile.argtypes = [C.c_char_p, C.c_char_p, C.c_char_p, C.POINTER(C.c_char_p), C.c_int, C.c_char_p,
                               C.c_char_p, C.c_char_p, C.c_int, C.c_int, C.c_int, C.c_char_p, C.c_int, C.c_char_p,
                               C.c_int, C.c_int, C.c_int, C.POINTER(P)]
lib.ntp_py_compile.restype = C.c_int
lib.ntp_py_free.argtypes = [P]
lib.ntp_py_artifact.argtypes = [P]
lib.ntp_py_artifact.restype = C.POINTER(ArtifactC)
lib.ntp_py_diagnostics.argtypes = [P]
lib.ntp_py_diagnostics.restype = C.c_char_p
lib.ntp_py_diag_count.argtypes = [P]
lib.ntp_py_diag_count.restype = C.c_size_t
lib.ntp_py_diag.argtypes = [P, C.c_size_t]
lib.ntp_py_diag.restype = C.POINTER(DiagC)
lib.ntp_py_last_error.restype = C.c_char_p
lib.ntp_py_plan.argtypes = [P, C.c_int, C.c_char_p, C.c_int, C.c_double, C.c_int, C.POINTER(C.c_void_p)]
lib.ntp_py_plan.restype = C.c_int
lib.ntp_py_free_string.argtypes = [C.c_void_p]
lib.ntp_py_backend.argtypes = [C.c_char_p, C.POINTER(C.c_int)]
lib.ntp_py_backend.restype = C.c_int
lib.ntp_py_adamw_check.argtypes = [C.c_char_p, C.c_double]
lib.ntp_py_adamw_check.restype = C.c_int

lib.ntprt_model_create.argtypes = [C.POINTER(ArtifactC), C.POINTER(ModelOptionsC), C.POINTER(P)]
lib.ntprt_model_load_format.argtypes = [P, C.c_char_p, C.c_char_p]
lib.ntprt_model_save_format.argtypes = [P, C.c_char_p, C.c_char_p]
lib.ntprt_model_set_param.argtypes = [P, C.c_char_p, C.POINTER(DLTensor)]
lib.ntprt_model_get_param.argtypes = [P, C.c_char_p, C.POINTER(DLTensor)]
lib.ntprt_model_forward.argtypes = [P, C.POINTER(C.POINTER(DLTensor)), C.POINTER(C.POINTER(DLTensor))]
lib.ntprt_model_train_step.argtypes = [P, C.POINTER(TrainOptionsC), C.POINTER(C.POINTER(DLTensor)),
                                       C.POINTER(C.c_double)]
lib.ntprt_model_init.argtypes = [P, C.c_char_p, C.c_double]
lib.ntprt_model_last_error.restype = C.c_char_p
lib.ntprt_model_destroy.argtypes = [P]
for f in ("ntprt_model_create", "ntprt_model_load_format", "ntprt_model_save_format", "ntprt_model_set_param",
          "ntprt_model_get_param", "ntprt_model_forward", "ntprt_model_train_step", "ntprt_model_init"):
    getattr(lib, f).restype = C.c_int
