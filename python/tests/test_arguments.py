"""The package checks its arguments as the CLI does (issue 24 items 6 and 9): no silent ctypes
truncation, no NaN-making optimizer settings, ids that fit 32 bits and are integers, garbage
sources as NtpError (not UnicodeDecodeError)."""
import math

import numpy as np
import pytest

import ntp

SRC = """model t {
  dim B = 2, S = 4, D = 8, V = 16;
  input tokens : i32[B, S];
  input targets : i32[B, S];
  x = embed: embedding(tokens, vocab = V, dim = D);
  logits = head: linear(x, out = V);
  output loss = cross_entropy(logits, targets);
}"""
FWD = """model f {
  dim B = 2, S = 4, D = 8, V = 16;
  input tokens : i32[B, S];
  x = embed: embedding(tokens, vocab = V, dim = D);
  output logits = head: linear(x, out = V);
}"""

try:
    import torch
except ImportError:
    torch = None


@pytest.mark.parametrize("kw", [dict(world=2**32 + 2), dict(world=0), dict(world=True), dict(world=2.0),
                                dict(seed=-1), dict(seed=2**64), dict(seed=1.5), dict(device=-1),
                                dict(device=2**31), dict(train="yes"), dict(defines={"B": 2.0}),
                                dict(defines={"B": True}), dict(defines={"B": "2"}), dict(defines={"B": 2**63}),
                                dict(defines={"2B": 2}), dict(defines=[("B", 2)])])
def test_compile_arguments_refused(kw):
    with pytest.raises((ValueError, TypeError)):
        ntp.compile(SRC, **kw)


def test_train_without_a_loss():
    with pytest.raises(ntp.NtpError, match="training needs a scalar loss output"):
        ntp.compile(FWD, train=True)
    with pytest.raises(ntp.NtpError, match="training needs a scalar loss output"):
        ntp.plan(FWD, 2, train=True)


@pytest.mark.parametrize("kw", [dict(lr=math.inf), dict(lr=math.nan), dict(lr=-1e-3), dict(beta1=1.0),
                                dict(beta2=1.5), dict(eps=-1.0), dict(weight_decay=math.inf), dict(clip=math.nan),
                                dict(lr="0.1"), dict(lr=True)])
def test_train_step_arguments_refused(kw):
    m = ntp.compile(SRC, train=True)
    tok = np.zeros((2, 4), np.int32)
    before = m.get_param("embed.wte").copy()
    with pytest.raises((ValueError, TypeError)):
        m.train_step(tok, tok, **kw)
    assert np.array_equal(m.get_param("embed.wte"), before)  # nothing was updated


@pytest.mark.parametrize("kw", [dict(world=2**32 + 2), dict(world=0), dict(mem_cap_gib=math.inf),
                                dict(mem_cap_gib=-1), dict(mem_cap_gib=math.nan), dict(nodes_of=-1), dict(gpu=3)])
def test_plan_arguments_refused(kw):
    args = dict(world=2)
    args.update(kw)
    with pytest.raises((ValueError, TypeError)):
        ntp.plan(FWD, **args)


@pytest.mark.parametrize("ids", [np.full((2, 4), 2**32 + 1, np.int64), np.full((2, 4), -2**31 - 1, np.int64),
                                 np.ones((2, 4), bool), np.ones((2, 4), np.complex64), np.ones((2, 4), np.float32)])
def test_numpy_ids_refused(ids):
    m = ntp.compile(FWD)
    with pytest.raises((ValueError, TypeError)):
        m.forward(ids)


@pytest.mark.skipif(torch is None, reason="PyTorch is not installed")
@pytest.mark.parametrize("make", [lambda: torch.full((2, 4), 2**32 + 1, dtype=torch.int64),
                                  lambda: torch.ones((2, 4), dtype=torch.bool),
                                  lambda: torch.ones((2, 4), dtype=torch.complex64),
                                  lambda: torch.ones((2, 4), dtype=torch.float32)])
def test_torch_ids_refused(make):
    m = ntp.compile(FWD)
    with pytest.raises((ValueError, TypeError)):
        m.forward(make())


def test_garbage_bytes_are_ntp_errors(tmp_path):
    p = tmp_path / "g.ntp"
    p.write_bytes(b"model \xff\xfe { \x80\x81 }\n")
    with pytest.raises(ntp.NtpError):
        ntp.compile(p)
    with pytest.raises(ntp.NtpError):
        ntp.compile("model \udcff { input x : fp32[2]; output y = x; }".encode("utf-8", "surrogateescape")
                    .decode("latin-1"))


def test_source_over_16_mib(tmp_path):
    p = tmp_path / "big.ntp"
    p.write_bytes(b" " * (17 << 20))
    with pytest.raises(ntp.NtpError, match="larger than 16 MiB"):
        ntp.compile(p)
    with pytest.raises(ntp.NtpError, match="larger than 16 MiB"):
        ntp.compile("model m {" + " " * (17 << 20) + "}")


def test_closed_model_is_an_error():
    m = ntp.compile(FWD)
    m.close()
    with pytest.raises(ntp.NtpError, match="closed"):
        m.forward(np.zeros((2, 4), np.int32))
    with pytest.raises(ntp.NtpError, match="closed"):
        m.get_param("embed.wte")
