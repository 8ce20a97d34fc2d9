"""ntp — non-uniform tensor parallelism from Python (docs/python.md).

    import ntp, numpy as np
    model = ntp.compile("examples/gpt2.ntp", defines={"L": 2, "S": 16}, plan="examples/plans/gpt2_mixed8.ntp")
    model.load("gpt2.safetensors", format="hf-gpt2")
    logits = model.forward(tokens)["logits"]          # NumPy in, NumPy out; torch tensors in, torch out

The compiler and the runtime run in this process (one native library); every rank of a plan runs
on the CPU backend, or on CUDA GPUs with backend="cuda". Tensors cross as DLPack without copies
where they already have the model's dtype and layout (bf16 as ml_dtypes.bfloat16 or
torch.bfloat16).
"""
from __future__ import annotations

import ctypes as C
import json
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import _checks as K
from . import _native as N
from ._tensors import as_input, dtype_name, is_torch, new_output

__all__ = ["compile", "plan", "Model", "Plan", "LayerPlan", "TensorInfo", "Diagnostic", "NtpError", "__version__"]
__version__ = "0.1.0"

PathLike = Union[str, "os.PathLike[str]"]


@dataclass(frozen=True)
class Diagnostic:
    """One compiler message: where (1-based line and column) and what."""
    severity: str  # "error", "warning" or "note"
    file: Optional[str]
    line: int
    col: int
    end_col: int
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}:{self.col}: " if self.file else ""
        return f"{where}{self.severity}: {self.message}"


class NtpError(Exception):
    """A compile error (with every diagnostic, as data and as text with source lines and carets)
    or a runtime error (the runtime's message)."""

    def __init__(self, message: str, diagnostics: Sequence[Diagnostic] = ()):
        super().__init__(message)
        self.diagnostics: List[Diagnostic] = list(diagnostics)


@dataclass(frozen=True)
class TensorInfo:
    """An input, output or parameter of a model: its name, storage dtype and global shape."""
    name: str
    dtype: str  # "bf16", "fp16", "fp32", "i32"
    shape: Tuple[int, ...]


def _infos(arr, n: int) -> List[TensorInfo]:
    return [TensorInfo(arr[i].name.decode(), dtype_name(arr[i].dtype), tuple(arr[i].shape[d] for d in range(arr[i].ndim)))
            for i in range(n)]


class _Unit:
    """A compiled unit of the native library: session, diagnostics, the in-memory artifact."""

    def __init__(self, source: Union[str, PathLike], *, plan: Optional[PathLike], plan_name: Optional[str],
                 defines: Optional[Mapping[str, int]], model: Optional[str], world: Optional[int], train: bool,
                 cuda: bool, gpu: Optional[str], micro_batches: int = 0, schedule: Optional[Union[str, PathLike]] = None,
                 optimizer: Tuple[int, int, int] = (-1, -1, -1)):
        self.h = None  # set before anything can raise: __del__ frees it
        path, text = _path_or_source(source)
        defs = K.defines(defines)
        arr = (C.c_char_p * max(1, len(defs)))(*[d.encode() for d in defs])
        h = C.c_void_p()
        enc = lambda s: None if s is None else os.fspath(s).encode()
        st = N.lib.ntp_py_compile(enc(path), enc(text), b"<string>", arr, len(defs), enc(plan), enc(plan_name),
                                  enc(model), int(world or 0), int(train), int(cuda), enc(gpu), int(micro_batches),
                                  enc(schedule), *optimizer, C.byref(h))
        self.h = h
        if st != 0:
            diags = self.diagnostics()
            text_ = K.text(N.lib.ntp_py_diagnostics(h)) if h else ""
            msg = K.text(N.lib.ntp_py_last_error())
            self.free()
            if st == 1:
                n = sum(d.severity == "error" for d in diags)
                raise NtpError(text_ + f"{n} error{'s' if n != 1 else ''} generated.", diags)
            full = msg + ("\n" + text_ if text_ else "")
            if st == 2:
                raise (FileNotFoundError if msg.startswith("cannot open") else ValueError)(full)
            raise NtpError(full)

    def diagnostics(self) -> List[Diagnostic]:
        out = []
        for i in range(N.lib.ntp_py_diag_count(self.h) if self.h else 0):
            d = N.lib.ntp_py_diag(self.h, i).contents
            out.append(Diagnostic(("error", "warning", "note")[d.severity], K.text(d.file) if d.file else None, d.line,
                                  d.col, d.end_col, K.text(d.message)))
        return out

    def free(self) -> None:
        if self.h:
            N.lib.ntp_py_free(self.h)
            self.h = None

    def __del__(self):
        self.free()


def _path_or_source(source: Union[str, PathLike]) -> Tuple[Optional[str], Optional[str]]:
    if isinstance(source, bytes):
        raise TypeError("source must be a path or the model's text (str), not bytes")
    if not isinstance(source, str) or "{" not in source:
        return os.fspath(source), None
    if "\0" in source:
        raise ValueError("the model's source holds a NUL character")
    return None, source


class Model:
    """A compiled model with its runtime: inputs, outputs and parameters described; forward, a
    training step, parameters loaded and saved. Create with ntp.compile."""

    def __init__(self, unit: _Unit, *, backend: str, seed: int, loopback: bool, device: int):
        # one native call on a model at a time: the runtime's model is not thread-safe (two
        # forwards from two threads shared its buffers; a close under a forward freed them)
        self._lock = threading.RLock()
        self._m = None
        self._unit = unit
        art = N.lib.ntp_py_artifact(unit.h)
        info = art.contents.info
        self.name: str = info.name.decode()
        self.world: int = info.world
        self.inputs: List[TensorInfo] = _infos(info.inputs, info.n_inputs)
        self.outputs: List[TensorInfo] = _infos(info.outputs, info.n_outputs)
        self.params: List[TensorInfo] = _infos(info.params, info.n_params)
        self.placements: List[str] = [l for l in info.sharding.decode().split("\n") if l]
        self.backend = backend
        self.diagnostics: List[Diagnostic] = unit.diagnostics()  # warnings, notes
        opts = N.ModelOptionsC(backend.encode(), -1, device, int(loopback), None, seed)
        self._m = C.c_void_p()
        m = C.c_void_p()
        if N.lib.ntprt_model_create(art, C.byref(opts), C.byref(m)) != 0:
            raise NtpError(K.text(N.lib.ntprt_model_last_error()))
        self._m = m

    # -- helpers
    def _call(self, fn, *args) -> None:
        """fn(model, *args) under the model's lock; NtpError with the runtime's message (read in
        the same thread: the message is thread-local) when it fails, or when the model is closed."""
        with self._lock:
            if not self._m:
                raise NtpError(f"model {self.name} is closed")
            if fn(self._m, *args) != 0:
                raise NtpError(K.text(N.lib.ntprt_model_last_error()))

    def _held_inputs(self, args: Sequence[Any], kwargs: Mapping[str, Any]):
        if len(args) == 1 and isinstance(args[0], Mapping) and not kwargs:
            kwargs, args = args[0], ()
        if len(args) > len(self.inputs):
            raise TypeError(f"{self.name} takes {len(self.inputs)} inputs ({', '.join(i.name for i in self.inputs)}), "
                            f"{len(args)} given")
        given = dict(zip((i.name for i in self.inputs), args))
        for k, v in kwargs.items():
            if k not in {i.name for i in self.inputs}:
                raise TypeError(f"{self.name} has no input '{k}' (its inputs: {', '.join(i.name for i in self.inputs)})")
            if k in given:
                raise TypeError(f"input '{k}' given twice")
            given[k] = v
        missing = [i.name for i in self.inputs if i.name not in given]
        if missing:
            raise TypeError(f"{self.name}: input{'s' if len(missing) > 1 else ''} {', '.join(missing)} not given")
        held = [as_input(given[i.name], i.dtype, i.shape, f"input '{i.name}'") for i in self.inputs]
        ptrs = (C.POINTER(N.DLTensor) * max(1, len(held)))(*[h.ptr for h in held])
        return held, ptrs, next((given[i.name] for i in self.inputs if is_torch(given[i.name])), None)

    # -- running
    def forward(self, *inputs: Any, **named: Any) -> Dict[str, Any]:
        """Runs the forward pass. Inputs in the model's order, by name, or as one dict: NumPy
        arrays, PyTorch tensors (host or GPU) or anything with __dlpack__. Returns {output name:
        array}: torch tensors (on the first torch input's device) when an input is one, else
        NumPy arrays (bf16 as ml_dtypes.bfloat16)."""
        held, ptrs, like = self._held_inputs(inputs, named)
        outs = [new_output(o.dtype, o.shape, like) for o in self.outputs]
        optrs = (C.POINTER(N.DLTensor) * max(1, len(outs)))(*[o.ptr for o in outs])
        self._call(N.lib.ntprt_model_forward, ptrs, optrs)
        del held
        return {o.name: h.array for o, h in zip(self.outputs, outs)}

    __call__ = forward

    def train_step(self, *inputs: Any, lr: float = 1e-3, beta1: float = 0.9, beta2: float = 0.95, eps: float = 1e-8,
                   weight_decay: float = 0.1, clip: float = 1.0, **named: Any) -> float:
        """One AdamW step on the fp32 master weights (a model compiled with train=True); the loss
        before the update. The learning rate is this step's: the caller runs the schedule."""
        opts = N.TrainOptionsC(*K.adamw(lr, beta1, beta2, eps, weight_decay, clip))
        held, ptrs, _ = self._held_inputs(inputs, named)
        loss = C.c_double()
        self._call(N.lib.ntprt_model_train_step, C.byref(opts), ptrs, C.byref(loss))
        del held
        return loss.value

    # -- parameters
    def load(self, path: PathLike, format: str = "ntp") -> None:
        """Reads every parameter from a safetensors file: format "ntp" (the model's names), or a
        Hugging Face checkpoint as published, "hf-gpt2" or "hf-llama". Each rank reads its slices."""
        self._call(N.lib.ntprt_model_load_format, os.fsencode(path), _format(format))

    def save(self, path: PathLike, format: str = "ntp") -> None:
        """Writes every parameter to a safetensors file, in the model's names or a Hugging Face
        layout (cpu backend, or a model compiled with train=True)."""
        self._call(N.lib.ntprt_model_save_format, os.fsencode(path), _format(format))

    def _param(self, name: str) -> TensorInfo:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(f"{self.name} has no parameter '{name}'")

    def set_param(self, name: str, value: Any) -> None:
        """Sets one parameter from a global array (its full, unsharded shape)."""
        p = self._param(name)
        h = as_input(value, p.dtype, p.shape, f"parameter '{name}'")
        self._call(N.lib.ntprt_model_set_param, name.encode(), h.ptr)

    def get_param(self, name: str) -> Any:
        """A parameter's current value as a NumPy array, global shape (cpu backend, or a model
        compiled with train=True: its master weight rounded to the model's dtype)."""
        p = self._param(name)
        out = new_output(p.dtype, p.shape, None)
        self._call(N.lib.ntprt_model_get_param, name.encode(), out.ptr)
        return out.array

    def close(self) -> None:
        """Frees the runtime's model; waits for a call running in another thread. Later calls
        raise NtpError."""
        lock = getattr(self, "_lock", None)
        if lock is None:
            return
        with lock:
            if self._m:
                N.lib.ntprt_model_destroy(self._m)
                self._m = None

    def __del__(self):
        self.close()

    def __repr__(self) -> str:
        return (f"<ntp.Model {self.name}: {self.world} rank{'s' if self.world != 1 else ''}, {self.backend}, "
                f"inputs {[i.name for i in self.inputs]}, outputs {[o.name for o in self.outputs]}>")


def _format(format: str) -> bytes:
    if not isinstance(format, str):
        raise TypeError(f"format must be ntp, hf-gpt2 or hf-llama, got {format!r}")
    return format.encode()


def compile(source: Union[str, PathLike], *, plan: Optional[PathLike] = None, plan_name: Optional[str] = None,
            defines: Optional[Mapping[str, int]] = None, model: Optional[str] = None, world: Optional[int] = None,
            backend: str = "cpu", train: bool = False, seed: int = 0, loopback: bool = False, device: int = 0,
            gpu: Optional[str] = None, micro_batches: Optional[int] = None,
            schedule: Optional[Union[str, PathLike]] = None, zero: Optional[int] = None,
            redundancy: Optional[int] = None, domain_size: Optional[int] = None, init: Optional[str] = None,
            init_std: float = 0.02) -> Model:
    """Compiles a model (a .ntp path, or its source text) and makes it runnable.

    plan: a plan file (its plan for the model becomes active; plan_name picks one); defines:
    dims to override ({"L": 2}); world: shard for this many ranks without a plan; backend: "cpu"
    (every rank simulated here) or "cuda" (loopback: every rank on one GPU); train: compile the
    training step (the loss's backward, the gradients' sync) for train_step; seed: the default
    initialisation of parameters not loaded; gpu: the device profile (a built-in name or a profile
    file) 'tp auto' layers are planned for, and whose measured attention crossover picks the CUDA
    attention kernel (ntpc --gpu); micro_batches: cut the batch into this many micro-batches whose
    gradients accumulate (a plan's pipeline stages run them concurrently; default: the plan's
    'micro_batches' line, else 1); schedule: how they are
    ordered on each rank, "gpipe", "1f1b", "interleaved", "zb-h1" or a CSV table's path (ntpc
    --micro-batches, --schedule; docs/pipeline.md); zero, redundancy, domain_size: with train, the
    distributed optimizer over the plan's 'optimizer' line (ZeRO stage 0 to 2, each part of the
    state on this many replicas, GPUs per failure domain; ntpc --zero, --redundancy, --domain-size;
    docs/training.md); init, init_std: with train, the parameters' start as ntpc train --init,
    --init-std: "gpt2", "megatron", "llama", "uniform" or "comparison" (the model's own), default
    the model family's (llama with an RMS norm, else gpt2), drawn from seed (docs/training.md,
    "Initialisation"). Errors in the model raise NtpError with every diagnostic."""
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a backend's name, got {type(backend).__name__} {backend!r}")
    kernels = C.c_int(0)  # the runtime's table of backends says which names exist and what each runs
    if N.lib.ntp_py_backend(backend.encode(), C.byref(kernels)) != 0:
        raise ValueError(K.text(N.lib.ntp_py_last_error()))
    # the CLI's bounds (ntpc --world, --seed); ctypes would truncate larger values silently
    world = None if world is None else K.whole("world", world, 1, 4096)
    seed = K.whole("seed", seed, 0, 2**64 - 1)
    device = K.whole("device", device, 0, 2**31 - 1)
    train, loopback = K.flag("train", train), K.flag("loopback", loopback)
    # ntpc --micro-batches; None: the plan's 'micro_batches' line, else the batch whole
    micro_batches = 0 if micro_batches is None else K.whole("micro_batches", micro_batches, 1, 4096)
    if schedule is not None and not isinstance(schedule, (str, os.PathLike)):
        raise TypeError(f"schedule must be a schedule's name or a CSV file's path, got {type(schedule).__name__}")
    opt = (zero, redundancy, domain_size)
    bounds = (("zero", 0, 2), ("redundancy", 1, 64), ("domain_size", 1, 4096))
    opt = tuple(-1 if v is None else K.whole(name, v, lo, hi) for v, (name, lo, hi) in zip(opt, bounds))
    if not train and opt != (-1, -1, -1):  # a forward has no optimizer: it would look used
        name = bounds[next(i for i, v in enumerate(opt) if v >= 0)][0]
        raise ValueError(f"{name} shards the optimizer's state: it needs train=True")
    if init is not None and not isinstance(init, str):
        raise TypeError(f"init must be a scheme's name, got {type(init).__name__}")
    if not train and init is not None:
        raise ValueError("init sets a training model's start: it needs train=True")
    if not isinstance(init_std, (int, float)) or isinstance(init_std, bool) or not init_std > 0:
        raise ValueError(f"init_std must be a standard deviation above 0, got {init_std!r}")
    unit = _Unit(source, plan=plan, plan_name=plan_name, defines=defines, model=model, world=world, train=train,
                 cuda=bool(kernels.value), gpu=gpu, micro_batches=micro_batches, schedule=schedule, optimizer=opt)
    m = Model(unit, backend=backend, seed=seed, loopback=loopback, device=device)
    if train:  # the start ntpc train takes: the scheme asked for, else the model family's
        try:
            m._call(N.lib.ntprt_model_init, None if init is None else init.encode(), float(init_std))
        except NtpError as e:
            m.close()
            raise ValueError(str(e)) from None
    return m


@dataclass(frozen=True)
class LayerPlan:
    """One layer of a plan: its placement and predicted costs (seconds, bytes per GPU)."""
    name: str
    placement: str
    groups: Tuple[int, ...]
    sequence_parallel: bool
    recompute: bool
    pinned: bool
    compute_s: float
    comm_s: float
    redist_s: float
    param_bytes: float
    act_bytes: float


@dataclass(frozen=True)
class Plan:
    """The planner's choice for every layer (ntpc plan), with the predicted step."""
    model: str
    world: int
    device: str
    train: bool
    feasible: bool
    why: str = ""
    step_s: float = 0.0
    compute_s: float = 0.0
    comm_s: float = 0.0
    tokens_per_s: float = 0.0
    mem_cap: float = 0.0
    mem_peak: float = 0.0
    exact: bool = False
    layers: List[LayerPlan] = field(default_factory=list)


def plan(source: Union[str, PathLike], world: int, *, gpu: str = "h100", train: bool = False,
         defines: Optional[Mapping[str, int]] = None, model: Optional[str] = None, plan: Optional[PathLike] = None,
         mem_cap_gib: float = 0.0, nodes_of: int = 0) -> Plan:
    """Chooses every layer's TP placement for `world` GPUs of a built-in profile (h100, h200,
    a100, b200) within their memory (mem_cap_gib: 0 = the profile's), as `ntpc plan` does.
    train: plan a training step. Layers pinned by `plan` keep their placement."""
    world = K.whole("world", world, 1, 1024)  # ntpc plan --world
    mem_cap_gib = K.real("mem_cap_gib", mem_cap_gib, 0, 1e9)  # 0: the profile's
    nodes_of = K.whole("nodes_of", nodes_of, 0, 1 << 16)
    train = K.flag("train", train)
    if not isinstance(gpu, str):
        raise TypeError(f"gpu must be a profile name, got {gpu!r}")
    if train:  # a model that cannot train (no loss) is refused before planning, as ntpc plan --train does
        _Unit(source, plan=None, plan_name=None, defines=defines, model=model, world=None, train=True, cuda=False,
              gpu=None).free()
    unit = _Unit(source, plan=plan, plan_name=None, defines=defines, model=model, world=None, train=False, cuda=False,
                 gpu=None)
    out = C.c_void_p()
    st = N.lib.ntp_py_plan(unit.h, int(world), gpu.encode(), int(train), float(mem_cap_gib), int(nodes_of), C.byref(out))
    if st != 0:
        diags = unit.diagnostics()
        raise (ValueError if st == 2 else NtpError)(K.text(N.lib.ntp_py_last_error()) + "\n" +
                                                     K.text(N.lib.ntp_py_diagnostics(unit.h)), *(() if st == 2 else (diags,)))
    d = json.loads(K.text(C.string_at(out)))
    N.lib.ntp_py_free_string(out)
    layers = [LayerPlan(l["name"], l["placement"], tuple(l["groups"]), l["sequence_parallel"], l["recompute"],
                        l["pinned"], l["compute_s"], l["comm_s"], l["redist_s"], l["param_bytes"], l["act_bytes"])
              for l in d.pop("layers", [])]
    return Plan(**d, layers=layers)
