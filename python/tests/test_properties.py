"""Properties of the package's tensor and argument handling, drawn by Hypothesis (issue 24): ids
of any integer dtype, byte order and layout (strided, transposed, non-contiguous) give the
results of the same ids as a dense int32 array; float inputs of any float dtype are rounded the
same way; a wrong shape, a non-integer or out-of-range id, a bad argument raise ValueError,
TypeError or NtpError, never crash or wrap. Devices: the CPU; torch tensors where PyTorch is
installed."""
import numpy as np
import pytest

hyp = pytest.importorskip("hypothesis")
from hypothesis import given, settings, strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402

import ntp  # noqa: E402

IDS = """model i {
  dim B = 3, S = 4, D = 8, V = 16;
  input tokens : i32[B, S];
  x = embed: embedding(tokens, vocab = V, dim = D);
  output logits = head: linear(x, out = V);
}"""
VALS = """model v {
  input x : fp32[3, 4];
  output y = lin: linear(x, out = 2);
}"""
SET = settings(max_examples=60, deadline=None)
_models = {}

try:
    import torch
except ImportError:
    torch = None


def model(src):
    if src not in _models:
        _models[src] = ntp.compile(src)
    return _models[src]


int_dtypes = st.sampled_from([np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]).map(
    np.dtype)
orders = st.sampled_from(["<", ">"])


@st.composite
def laid_out(draw, base):
    """base (a dense array) in another layout: a strided view of a larger array, or a transpose's transpose."""
    how = draw(st.sampled_from(["dense", "strided", "fortran", "reversed"]))
    if how == "strided":
        big = np.zeros((base.shape[0] * 2, base.shape[1] * 3), base.dtype)
        big[::2, ::3] = base
        return big[::2, ::3]
    if how == "fortran":
        return np.asfortranarray(base)
    if how == "reversed":
        return base[::-1, ::-1].copy()[::-1, ::-1]
    return base


@SET
@given(ids=hnp.arrays(np.int32, (3, 4), elements=st.integers(0, 15)), dt=int_dtypes, order=orders, data=st.data())
def test_ids_any_integer_dtype_and_layout(ids, dt, order, data):
    m = model(IDS)
    want = m.forward(ids)["logits"]
    a = data.draw(laid_out(ids.astype(dt.newbyteorder(order) if dt.itemsize > 1 else dt)))
    assert np.array_equal(m.forward(a)["logits"], want)


@SET
@given(bad=st.one_of(st.integers(16, 2**40), st.integers(-2**40, -1)), at=st.tuples(st.integers(0, 2), st.integers(0, 3)),
       dt=st.sampled_from([np.int64, np.uint64]))
def test_out_of_range_ids_raise(bad, at, dt):
    if dt == np.uint64 and bad < 0:
        return
    ids = np.zeros((3, 4), dt)
    ids[at] = bad
    with pytest.raises((ValueError, ntp.NtpError)):
        model(IDS).forward(ids)


@SET
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple))
def test_wrong_shapes_raise(shape):
    if shape == (3, 4):
        return
    with pytest.raises(ValueError):
        model(IDS).forward(np.zeros(shape, np.int32))


@SET
@given(dt=st.sampled_from([np.bool_, np.float16, np.float32, np.float64, np.complex64]))
def test_non_integer_ids_raise(dt):
    with pytest.raises(TypeError):
        model(IDS).forward(np.zeros((3, 4), dt))


@SET
@given(x=hnp.arrays(np.float64, (3, 4), elements=st.floats(-4, 4, width=32)),
       dt=st.sampled_from([np.float16, np.float32, np.float64]), data=st.data())
def test_float_inputs_any_float_dtype_and_layout(x, dt, data):
    m = model(VALS)
    a = x.astype(dt)
    want = m.forward(np.ascontiguousarray(a, np.float32))["y"]
    assert np.array_equal(m.forward(data.draw(laid_out(a)))["y"], want)


@SET
@given(world=st.one_of(st.integers(-2**70, 0), st.integers(4097, 2**70), st.floats(), st.booleans()),
       seed=st.one_of(st.integers(-2**70, -1), st.integers(2**64, 2**70), st.floats()))
def test_compile_arguments(world, seed):
    with pytest.raises((ValueError, TypeError)):
        ntp.compile(VALS, world=world)
    with pytest.raises((ValueError, TypeError)):
        ntp.compile(VALS, seed=seed)


@SET
@given(lr=st.one_of(st.floats(0, 1e-2), st.sampled_from([np.inf, -np.inf, np.nan, -1e-9]), st.integers(-10, -1)),
       beta1=st.floats(-2, 2), clip=st.one_of(st.floats(0, 10), st.sampled_from([np.inf, np.nan, -1.0])))
def test_train_step_arguments(lr, beta1, clip):
    """Bad values raise before any update; good ones (small rates: one model takes every example's
    step) train on."""
    ok = all(np.isfinite(v) and v >= 0 for v in (lr, clip)) and 0 <= beta1 < 1
    m = model(TRAIN)
    tok = np.zeros((2, 4), np.int32)
    if ok:
        assert np.isfinite(m.train_step(tok, tok, lr=lr, beta1=beta1, clip=clip))
    else:
        with pytest.raises((ValueError, TypeError)):
            m.train_step(tok, tok, lr=lr, beta1=beta1, clip=clip)


TRAIN = """model t {
  dim B = 2, S = 4, D = 8, V = 16;
  input tokens : i32[B, S];
  input targets : i32[B, S];
  x = embed: embedding(tokens, vocab = V, dim = D);
  logits = head: linear(x, out = V);
  output loss = cross_entropy(logits, targets);
}"""
_models[TRAIN] = None


def _train_model():
    return ntp.compile(TRAIN, train=True)


def model(src, _orig=model):  # noqa: F811  the training model needs train=True
    if src == TRAIN:
        if _models.get(TRAIN) is None:
            _models[TRAIN] = _train_model()
        return _models[TRAIN]
    return _orig(src)


@pytest.mark.skipif(torch is None, reason="PyTorch is not installed")
@SET
@given(ids=hnp.arrays(np.int32, (3, 4), elements=st.integers(0, 15)),
       dt=st.sampled_from(["int8", "int16", "int32", "int64", "uint8"]))
def test_torch_ids_any_integer_dtype(ids, dt):
    m = model(IDS)
    want = m.forward(ids)["logits"]
    t = torch.from_numpy(ids.astype(np.int64)).to(getattr(torch, dt)).t().contiguous().t()  # non-contiguous
    got = m.forward(t)["logits"]
    assert np.array_equal(got.float().numpy(), want.astype(np.float32))
