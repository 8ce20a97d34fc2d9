"""The package's argument checks, in one place, as the CLI makes them (tools/ntpc: cli_args.c,
train_cmd.c, plan_cmd.c): ctypes would otherwise truncate an int silently (world=2**32+2 becomes
2) or pass inf and NaN on. Each raises ValueError (TypeError for a value of the wrong kind)
naming the argument. Internal to the package."""
from __future__ import annotations

import math
import numbers
from typing import Any, Mapping, Optional

I64_MAX = 2**63 - 1


def text(b: Optional[bytes]) -> str:
    """A native message as text: the compiler quotes what the user wrote, which need not be UTF-8."""
    return "" if b is None else b.decode("utf-8", "replace")


def whole(name: str, v: Any, lo: int, hi: int) -> int:
    """An integer in [lo, hi]: bool and float are refused (True is not a world, 2.5 not a seed)."""
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(v).__name__} {v!r}")
    v = int(v)
    if not lo <= v <= hi:
        raise ValueError(f"{name} must be from {lo} to {hi}, got {v}")
    return v


def number(name: str, v: Any) -> float:
    """A real number (bool and str are refused: True is not a rate) as a float."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(v).__name__} {v!r}")
    return float(v)


def real(name: str, v: Any, lo: float, hi: float = math.inf, *, below_hi: bool = False) -> float:
    """A finite number in [lo, hi] (or [lo, hi) with below_hi)."""
    f = number(name, v)
    if not math.isfinite(f) or f < lo or f > hi or (below_hi and f == hi):
        bound = f"below {hi:g}" if below_hi else f"at most {hi:g}" if math.isfinite(hi) else "finite"
        raise ValueError(f"{name} must be a number of at least {lo:g} and {bound}, got {v!r}")
    return f


def flag(name: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise TypeError(f"{name} must be True or False, got {v!r}")
    return v


def defines(d: Optional[Mapping[str, Any]]) -> list:
    """-D NAME=VALUE overrides: identifiers to integers (a dim is whole; 2.0 is refused as -D is)."""
    if d is None:
        return []
    if not isinstance(d, Mapping):
        raise TypeError(f"defines must be a mapping of dim names to integers, got {type(d).__name__}")
    out = []
    for k, v in d.items():
        if not isinstance(k, str) or not k.isidentifier():
            raise ValueError(f"defines: {k!r} is not a dim name")
        out.append(f"{k}={whole(f'defines[{k!r}]', v, -I64_MAX, I64_MAX)}")
    return out


def adamw(lr: Any, beta1: Any, beta2: Any, eps: Any, weight_decay: Any, clip: Any) -> tuple:
    """train_step's optimizer arguments: numbers (TypeError otherwise), each checked against the
    trainer's one table of options (runtime/train/adamw_options.c), which ntpc train and the model
    ABI use too (finite, 0 or more, the betas below 1): lr=inf would leave every weight NaN."""
    from . import _native as N
    out = []
    for name, v in (("lr", lr), ("beta1", beta1), ("beta2", beta2), ("eps", eps), ("weight_decay", weight_decay),
                    ("clip", clip)):
        f = number(name, v)  # its bounds are the table's
        if N.lib.ntp_py_adamw_check(name.encode(), f) != 0:
            raise ValueError(f"{name}: {text(N.lib.ntp_py_last_error())}, got {v!r}")
        out.append(f)
    return tuple(out)
