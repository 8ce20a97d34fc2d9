#!/usr/bin/env python3
"""Independent numeric check of ntpc's CPU reference against NumPy.

usage: check.py NTPC MODEL.ntp [-D NAME=VALUE]... [--seed N] [--model NAME]
                                [--mutants | --mutant NAME]

Runs `NTPC run MODEL.ntp --backend cpu --dump TMP`, loads every dumped input,
parameter and output, recomputes the outputs with a NumPy implementation of
the language spec (docs/language.md) written by hand for each model (REFS
below, keyed by model name; the IR is never read), and compares them element
by element. One line per output with its max error and PASS/FAIL, then a
PASS/FAIL line for the model.

Reference arithmetic
  Every operation is computed in float64 from the dumped (already storage-
  rounded) inputs and parameters; its result is rounded to float32 and then
  to the storage dtype, as the spec says ("arithmetic is fp32; every stored
  value is rounded to its storage dtype"). Rounding points: each elementwise
  operator and function, each matmul, and inside the layer builtins each
  projection, each bias add, the normalisation and then each of its affine
  scale / shift, RoPE, the attention core (scores, mask, softmax and the
  weighted sum of values as one step), the activation and the gating
  product. Number literals are storage-dtype scalars (rounded like a stored
  value: 0.1 in a bf16 model is 0.10009765625). bf16 is round-to-nearest-
  even done on the float32 bit pattern; fp16 is NumPy's float32 -> float16
  conversion (round-to-nearest-even, subnormals, overflow to inf).

Metric
  For an output with reference r and result g:
      err_i = |g_i - r_i| / max(|r_i|, floor * max_j |r_j|)
  the relative error, except that elements smaller than `floor` times the
  tensor's largest magnitude are measured against that: a sum that cancels
  has an absolute error of the order of its terms, not of its value.
  Non-finite values must match exactly (+inf where both overflow). An output
  passes when max_i err_i <= tol. (tol, floor) per model (classes below):
    EXACT  (0,    1e-3)  fp32 + - * /, neg, relu, gather: IEEE results are
                         correctly rounded, so they must be bit-identical
    FUNC   (1e-6, 1e-3)  fp32 exp tanh sigmoid silu softmax layernorm
                         rmsnorm (a few float32 ulp); gelu 5e-5 (its
                         1 + tanh(..) cancels for x << 0)
    ACC    (1e-4, 1e-2)  fp32 matmul and every layer built on it
    BF16 / FP16 (2^-6, 1e-2) for short bf16 / fp16 chains, DEEP (2^-2, 1e-2)
                         for multi-layer bf16 / fp16 models
  bf16 / fp16 outputs must in addition be bit-identical to the reference in
  at least 95% (DEEP: 75%) of their elements. ntpc accumulates in float32
  and the reference in float64, so now and then a rounding lands on the
  other side of a tie by one ulp; in a deep model that flip cascades through
  the rest of its row, hence the loose max error there. The exact fraction
  is the sharp check: a model that skips an intermediate rounding, or
  rounds in another way, matches in far fewer elements (30-85% here).

Other checks
  - the dumped inputs / params are exactly the tensors the reference reads
    (a parameter the spec does not define fails, so does a missing one),
    with the spec's shapes, and carry the model's storage dtype;
  - dumped inputs / params are already rounded to the storage dtype;
  - output names, dtypes and shapes match.

Self test: --mutant NAME runs one deliberately wrong reference (a plausible
bug: gelu with erf, no causal mask, GQA head mapping h % KV, interleaved
RoPE pairs, unbiased variance, no intermediate rounding, bf16 truncation,
one output element pushed just past the tolerance, ...); --mutants runs the
model's curated list, each of which must FAIL, and exits 0 when all of them
were caught (and the correct reference passes).

Exit status: 0 pass, 1 a failure (including ntpc failing), 2 usage,
77 NumPy unavailable (ctest SKIP_RETURN_CODE).
"""
import os
import re
import subprocess
import sys
import tempfile

try:
    import numpy as np
except ImportError:  # ctest: SKIP_RETURN_CODE 77
    print("SKIP: NumPy is not available to %s" % sys.executable)
    sys.exit(77)

MIN_EXACT = 0.95

# --------------------------------------------------------------------------
# storage rounding


def _to_f32(x):
    return np.asarray(x, dtype=np.float64).astype(np.float32)


def round_bf16(x):
    """float64 -> float32 -> bf16 (round to nearest, ties to even), as float64."""
    f = _to_f32(x)
    u = f.view(np.uint32).astype(np.uint64)
    if "bf16_trunc" in MUT:
        r = u & np.uint64(0xFFFF0000)
    else:
        r = (u + np.uint64(0x7FFF) + ((u >> np.uint64(16)) & np.uint64(1))) & np.uint64(0xFFFF0000)
    r = np.where(np.isnan(f), u | np.uint64(0x00400000), r)  # NaN stays a (quiet) NaN
    return r.astype(np.uint32).view(np.float32).astype(np.float64)


def round_fp16(x):
    with np.errstate(over="ignore"):
        return _to_f32(x).astype(np.float16).astype(np.float64)


def round_fp32(x):
    return _to_f32(x).astype(np.float64)


ROUND = {"fp32": round_fp32, "bf16": round_bf16, "fp16": round_fp16}

MUT = set()  # active mutants
DTYPE = "fp32"  # storage dtype of the model under test


def st(x):
    """Store: round a freshly computed value to the storage dtype."""
    if "no_round" in MUT:  # mutant: keep fp32 intermediates (outputs are rounded in check())
        return round_fp32(x)
    return ROUND[DTYPE](x)


def lit(v):
    """A number literal: a storage-dtype scalar."""
    return np.float64(v) if "const_exact" in MUT else st(np.float64(v))


# --------------------------------------------------------------------------
# tensors


class Tensors:
    """The dumped inputs and params; records which ones the reference reads."""

    def __init__(self, items):
        self.items = items
        self.used = set()

    def __getitem__(self, name):
        if name not in self.items:
            raise RefError("the spec requires tensor '%s', which ntpc did not create" % name)
        self.used.add(name)
        return self.items[name]

    def has(self, name):
        return name in self.items

    def get(self, name, shape):
        a = self[name]
        if tuple(a.shape) != tuple(shape):
            raise RefError("tensor '%s' has shape %s, the spec says %s" % (name, list(a.shape), list(shape)))
        return a


class RefError(Exception):
    pass


# --------------------------------------------------------------------------
# elementwise functions (float64, then stored)


def f_gelu(x):
    if "gelu_erf" in MUT:
        from math import erf
        return st(0.5 * x * (1 + np.vectorize(erf)(x / np.sqrt(2))))
    return st(0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))))


def f_relu(x):
    return st(np.maximum(x, 0))


def _sigmoid(x):
    with np.errstate(over="ignore"):
        return 1 / (1 + np.exp(-x))


def f_sigmoid(x):
    return st(_sigmoid(x))


def f_silu(x):
    return st(x * _sigmoid(x))


def f_tanh(x):
    return st(np.tanh(x))


def f_exp(x):
    with np.errstate(over="ignore"):
        return st(np.exp(x))


def f_softmax(x):
    axis = 0 if "softmax_axis0" in MUT else -1
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return st(e / np.sum(e, axis=axis, keepdims=True))


def mm(a, b):
    return st(np.matmul(a, b))


# --------------------------------------------------------------------------
# layer builtins, per the spec (params [out, in]; a linear is x @ w.T + b)


def dense(t, x, w_name, b_name, n, bias):
    k = x.shape[-1]
    y = mm(x, t.get(w_name, (n, k)).T)
    if bias:
        bv = t.get(b_name, (n,))
        if "bias_skip" not in MUT:  # the mutant reads the bias but does not add it
            y = st(y + bv)
    return y


def embedding(t, label, tokens, vocab, dim, positions=None):
    wte = t.get(label + ".wte", (vocab, dim))
    assert tokens.min() >= 0 and tokens.max() < vocab, "token ids out of range"
    x = wte[tokens]
    if positions is not None:
        s = tokens.shape[1]
        assert positions >= s
        wpe = t.get(label + ".wpe", (positions, dim))
        if "no_wpe" not in MUT:
            x = st(x + wpe[:s])
    return x


def linear(t, label, x, out, bias=False, tied=None):
    if tied is not None:
        w = t.get(tied + ".wte", (out, x.shape[-1]))
        y = mm(x, w.T)
        if bias:
            y = st(y + t.get(label + ".b", (out,)))
        return y
    return dense(t, x, label + ".w", label + ".b", out, bias)


def layernorm(t, label, x, eps=1e-5):
    d = x.shape[-1]
    if "eps_default" in MUT:
        eps = 1e-5
    mean = x.mean(axis=-1, keepdims=True)
    var = x.var(axis=-1, keepdims=True, ddof=1 if "ln_unbiased" in MUT else 0)
    y = st((x - mean) / np.sqrt(var + eps))
    y = st(y * t.get(label + ".g", (d,)))
    return st(y + t.get(label + ".b", (d,)))


def rmsnorm(t, label, x, eps=1e-5):
    d = x.shape[-1]
    if "eps_default" in MUT:
        eps = 1e-5
    y = st(x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))
    return st(y * t.get(label + ".g", (d,)))


def rope(x, theta):
    """x [B, S, heads, HD]; rotate-half pairs (i, i + HD/2), position = s."""
    b, s, h, hd = x.shape
    half = hd // 2
    i = np.arange(half, dtype=np.float64)
    pos = np.arange(s, dtype=np.float64)
    ang = pos[:, None] * theta ** ((-1 if "rope_freq" in MUT else -2) * i / hd)[None, :]  # [S, HD/2]
    cos = np.cos(ang)[None, :, None, :]
    sin = np.sin(ang)[None, :, None, :]
    if "rope_interleaved" in MUT:  # GPT-J pairs (2i, 2i+1): a wrong convention
        x1, x2 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x1 * cos - x2 * sin
        out[..., 1::2] = x2 * cos + x1 * sin
        return st(out)
    x1, x2 = x[..., :half], x[..., half:]
    return st(np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1))


def attention_core(q, k, v, causal):
    """q [B,S,H,HD], k v [B,S,KV,HD] -> [B,S,H,HD]; one stored result."""
    b, s, h, hd = q.shape
    kv = k.shape[2]
    group = h // kv
    idx = np.arange(h) % kv if "gqa_mod" in MUT else np.arange(h) // group
    kk, vv = k[:, :, idx, :], v[:, :, idx, :]
    scale = 1.0 if "no_scale" in MUT else 1 / np.sqrt(hd)
    sc = np.einsum("bqhd,bkhd->bhqk", q, kk) * scale
    if causal and "no_causal" not in MUT:
        mask = np.triu(np.ones((s, s), dtype=bool), 1)  # key t > query s
        sc = np.where(mask, -np.inf, sc)
    sc = sc - sc.max(axis=-1, keepdims=True)
    p = np.exp(sc)
    p = p / p.sum(axis=-1, keepdims=True)
    return st(np.einsum("bhqk,bkhd->bqhd", p, vv))


def attention(t, label, x, heads, kv_heads=None, head_dim=None, rope_theta=None, causal=False, bias=False):
    b, s, d = x.shape
    kv = heads if kv_heads is None else kv_heads
    hd = d // heads if head_dim is None else head_dim
    assert heads % kv == 0
    q = dense(t, x, label + ".wq", label + ".bq", heads * hd, bias)
    k = dense(t, x, label + ".wk", label + ".bk", kv * hd, bias)
    v = dense(t, x, label + ".wv", label + ".bv", kv * hd, bias)
    q = q.reshape(b, s, heads, hd)
    k = k.reshape(b, s, kv, hd)
    v = v.reshape(b, s, kv, hd)
    if rope_theta is not None and "no_rope" not in MUT:
        q = rope(q, rope_theta)
        k = rope(k, rope_theta)
    o = attention_core(q, k, v, causal).reshape(b, s, heads * hd)
    return dense(t, o, label + ".wo", label + ".bo", d, bias)


def mlp(t, label, x, hidden, act, bias=False):
    d = x.shape[-1]
    up = dense(t, x, label + ".w_up", label + ".b_up", hidden, bias)
    if act in ("swiglu", "geglu"):
        # gate(x) = x w_gate^T + b_gate (docs/language.md: b_gate with bias = true)
        gate = dense(t, x, label + ".w_gate", label + ".b_gate", hidden, bias and "no_gate_bias" not in MUT)
        if bias and "no_gate_bias" in MUT:
            t.get(label + ".b_gate", (hidden,))  # read, not added
        if "swap_gate" in MUT:
            gate, up = up, gate
        h = st((f_silu if act == "swiglu" else f_gelu)(gate) * up)
    else:
        h = {"gelu": f_gelu, "relu": f_relu, "silu": f_silu}[act](up)
    return dense(t, h, label + ".w_down", label + ".b_down", d, bias)


# --------------------------------------------------------------------------
# per-model references: fn(tensors, dims) -> {output name: array}


def ref_ew(op):
    def f(t, dims):
        x, y, c, r, bias = t["x"], t["y"], t["c"], t["r"], t["bias"]
        return {
            "full": st(op(x, y)),
            "vec": st(op(x, bias)),
            "vec_left": st(op(bias, x)),
            "scal": st(op(x, lit(1.5))),
            "scal_left": st(op(lit(3), x)),
            "both": st(op(c, r)),
        }
    return f


def ref_ew_precedence(t, dims):
    a, b, c, w = t["a"], t["b"], t["c"], t["w"]
    return {
        "left_sub": st(st(a - b) - c),
        "left_div": st(st(a / b) / c),
        "mixed": st(st(a + st(b * c)) - st(a / b)),
        "neg_mul": st(st(-a) * b),
        "neg_neg": st(-st(st(-a) + b)),
        "div_mm": mm(st(a / lit(4)), w),
        "mm_add": st(mm(a, w) + lit(0.25)),
    }


def ref_unary(fn, scale):
    def f(t, dims):
        x = t["x"]
        return {"y": fn(st(x * lit(scale))), "y2": fn(x)}
    return f


def ref_un_exp(t, dims):
    x = t["x"]
    return {"y": f_exp(st(x * lit(8))), "y2": f_exp(x), "y3": f_exp(st(x * lit(100)))}


def ref_un_neg(t, dims):
    x = t["x"]
    return {"y": st(-x), "y2": st(st(-st(x * lit(2))) - x)}


def ref_softmax(t, dims):
    x, z = t["x"], t["z"]
    return {"y": f_softmax(st(x * lit(6))), "y2": f_softmax(st(z * lit(30))), "y3": f_softmax(x)}


def ref_mm_2d(t, dims):
    return {"c": mm(t["a"], t["b"])}


def ref_mm_shared(t, dims):
    return {"c": mm(t["a"], t["w"]), "c4": mm(t["a4"], t["w"])}


def ref_mm_batched(t, dims):
    return {"c": mm(t["a"], t["b"]), "c4": mm(t["a4"], t["b4"])}


def ref_linear(t, dims):
    n = dims.get("N", 13)
    return {"y": linear(t, "proj", t["x"], n), "y2": linear(t, "proj2", t["x2"], n)}


def ref_linear_bias(t, dims):
    return {"y": linear(t, "proj", t["x"], dims.get("N", 13), bias=True)}


def ref_linear_tied(t, dims):
    v = dims.get("V", 29)
    x = embedding(t, "embed", t["tokens"], v, dims.get("D", 16))
    return {"logits": linear(t, "head", x if "no_wte_scale" in MUT else st(x * lit(0.5)), v, tied="embed")}


def ref_embedding(t, dims):
    return {"x": embedding(t, "embed", t["tokens"], dims.get("V", 23), dims.get("D", 10))}


def ref_embedding_pos(t, dims):
    return {"x": embedding(t, "embed", t["tokens"], dims.get("V", 23), dims.get("D", 10), positions=dims.get("P", 11))}


def ref_norm(norm, p):
    def f(t, dims):
        x, x2 = t["x"], t["x2"]
        return {
            "y": norm(t, p, st(st(x * lit(3)) + lit(1))),
            "y2": norm(t, p + "_eps", x, eps=0.1),
            "y3": norm(t, p + "2d", x2),
        }
    return f


def ref_attn(**kw):
    def f(t, dims):
        return {"y": attention(t, "attn", t["x"], heads=dims.get("H", 4), **kw)}
    return f


def ref_mlp(act, bias):
    def f(t, dims):
        return {"y": mlp(t, "ffn", t["x"], dims.get("F", 40), act, bias)}
    return f


def ref_dt_ew(t, dims):
    x, y, kt, b, w = t["x"], t["y"], t["kt"], t["b"], t["w"]
    f = st(f_gelu(st(x * lit(4))) + f_silu(st(y * lit(4))))
    f = st(f - st(f_sigmoid(x) * f_tanh(y)))
    f = st(f + f_relu(st(-x)))
    xw = mm(x, w)
    return {
        "s": st(st(x + y) + b),
        "d": st(st(x * y) - st(lit(0.1) / x)),
        "q": st(x / st(y + lit(3))),
        "e": f_exp(st(x * lit(12))),
        "f": f,
        "sm": f_softmax(st(st(x * lit(5)) + y)),
        "mm": st(st(xw * lit(3)) + st(mm(mm(x, kt), mm(y, w)) / lit(8))),
    }


def ref_dt_block(t, dims):
    tokens = t["tokens"]
    s = tokens.shape[1]
    D, H, V = dims.get("D", 24), dims.get("H", 4), dims.get("V", 31)
    x = embedding(t, "embed", tokens, V, D, positions=2 * s)
    h = layernorm(t, "ln1", x)
    x = st(x + attention(t, "attn", h, H, kv_heads=2, rope_theta=10000, causal=True, bias=True))
    h = rmsnorm(t, "ln2", x)
    x = st(x + mlp(t, "mlp", h, 4 * D, "gelu", bias=True))
    h = layernorm(t, "ln3", x, eps=1e-3)
    x = st(x + mlp(t, "ffn", h, 4 * D, "swiglu"))
    x = st(x + linear(t, "proj", x, D, bias=True))
    logits = linear(t, "head", rmsnorm(t, "ln_f", x), V, tied="embed")
    return {"logits": logits, "p": f_softmax(st(logits * lit(0.5)))}


# ---- the shipped examples (run with toy -D sizes) ----


def _blocks(t, prefix):
    n = 0
    while t.has("%s.%d.%s" % ("blk", n, prefix)):
        n += 1
    return n


def ref_gpt2(t, dims):
    tokens = t["tokens"]
    b, s = tokens.shape
    D, H = dims.get("D", 768), dims.get("H", 12)
    V = dims.get("V", 50257)
    F = 4 * D
    x = embedding(t, "embed", tokens, V, D, positions=s)
    L = _blocks(t, "ln1.g")
    assert L == dims.get("L", 12)
    for i in range(L):
        p = "blk.%d." % i
        h = layernorm(t, p + "ln1", x)
        x = st(x + attention(t, p + "attn", h, H, causal=True, bias=True))
        h = layernorm(t, p + "ln2", x)
        x = st(x + mlp(t, p + "mlp", h, F, "gelu", bias=True))
    x = layernorm(t, "ln_f", x)
    return {"logits": linear(t, "head", x, V, tied="embed")}


def ref_llama3_8b(t, dims):
    tokens = t["tokens"]
    D, H, G = dims.get("D", 4096), dims.get("H", 32), dims.get("G", 4)
    V = dims.get("V", 128256)
    F = dims.get("F", 7 * D // 2)
    x = embedding(t, "embed", tokens, V, D)
    L = _blocks(t, "attn_norm.g")
    assert L == dims.get("L", 32)
    for i in range(L):
        p = "blk.%d." % i
        h = rmsnorm(t, p + "attn_norm", x)
        x = st(x + attention(t, p + "attn", h, H, kv_heads=H // G, rope_theta=500000, causal=True))
        h = rmsnorm(t, p + "ffn_norm", x)
        x = st(x + mlp(t, p + "ffn", h, F, "swiglu"))
    x = rmsnorm(t, "norm", x)
    return {"logits": linear(t, "head", x, V)}


def ref_llama_block(t, dims):
    x = t["x"]
    D, H, G = dims.get("D", 4096), dims.get("H", 32), dims.get("G", 4)
    F = dims.get("F", 14336)
    assert x.shape[2] == D
    h = rmsnorm(t, "norm1", x)
    y = st(x + attention(t, "attn", h, H, kv_heads=H // G, rope_theta=10000, causal=True))
    h = rmsnorm(t, "norm2", y)
    return {"z": st(y + mlp(t, "ffn", h, F, "swiglu"))}


def ref_elementwise(t, dims):
    x, k, v = t["x"], t["k"], t["v"]
    w1, b1, w2, b2, gamma = t["w1"], t["b1"], t["w2"], t["b2"], t["gamma"]
    h = st(mm(x, w1) + b1)
    a = f_gelu(h)
    r = st(f_relu(h) - st(lit(0.5) * f_silu(h)))
    s = st(st(f_sigmoid(h) * f_tanh(h)) / lit(2))
    e = f_exp(st(st(-h) * h))
    m = st(mm(st(st(st(st(a + r) + s) + e) / lit(4)), w2) + b2)
    y = st(x + st(m * gamma))
    p = f_softmax(st(mm(y, k) / lit(8.0)))
    o = mm(p, v)
    return {"y": y, "o": o, "g": st(f_sigmoid(o) - lit(1))}


# Tolerance classes (see the module docstring): (tol, floor).
EXACT = (0.0, 1e-3)   # fp32 + - * / relu neg gather: IEEE results are correctly rounded
FUNC = (1e-6, 1e-3)   # fp32 elementwise functions / softmax / norms: a few ulp
ACC = (1e-4, 1e-2)    # fp32 sums over an axis (matmul and the layers built on it)
BF16 = (2.0 ** -6, 1e-2)   # bf16: 4 ulp (one bf16 ulp is 2^-8..2^-7 relative)
FP16 = (2.0 ** -6, 1e-2)   # fp16: 16 ulp (one fp16 ulp is 2^-11..2^-10 relative)
# Deep bf16/fp16 stacks (several layers): one rounding that flips by an ulp
# (ntpc accumulates in fp32, the reference in float64) perturbs every later
# value of its row and cascades into more flips, so the max error is only a
# coarse bound here; the bit-identical fraction (>= 75%; a model that skips
# the intermediate roundings scores ~0%) is the sharp check.
DEEP = (2.0 ** -2, 1e-2)
DEEP_EXACT = 0.75


class Ref:
    def __init__(self, dtype, fn, tol, mutants, min_exact=MIN_EXACT, out_tol=None):
        self.dtype, self.fn, self.mutants, self.min_exact = dtype, fn, mutants, min_exact
        self.tol, self.floor = tol
        self.out_tol = out_tol or {}  # output name -> (tol, floor) where it differs

    def tol_of(self, name):
        return self.out_tol.get(name, (self.tol, self.floor))


REFS = {
    "ew_add": Ref("fp32", ref_ew(lambda a, b: a + b), EXACT, ["perturb", "swap_args"]),
    "ew_sub": Ref("fp32", ref_ew(lambda a, b: a - b), EXACT, ["perturb", "swap_args"]),
    "ew_mul": Ref("fp32", ref_ew(lambda a, b: a * b), EXACT, ["perturb", "swap_args"]),
    "ew_div": Ref("fp32", ref_ew(lambda a, b: a / b), EXACT, ["perturb", "swap_args"]),
    "ew_precedence": Ref("fp32", ref_ew_precedence, EXACT, ["perturb"],
                         out_tol={"div_mm": ACC, "mm_add": ACC}),
    # gelu: 0.5 x (1 + tanh(...)) cancels for x << 0; fp32 loses ~1e-5 relative there
    "un_gelu": Ref("fp32", ref_unary(f_gelu, 4), (5e-5, 1e-3), ["perturb", "gelu_erf"]),
    "un_relu": Ref("fp32", ref_unary(f_relu, 4), EXACT, ["perturb"]),
    "un_silu": Ref("fp32", ref_unary(f_silu, 6), FUNC, ["perturb"]),
    "un_sigmoid": Ref("fp32", ref_unary(f_sigmoid, 20), FUNC, ["perturb"]),
    "un_tanh": Ref("fp32", ref_unary(f_tanh, 4), FUNC, ["perturb"]),
    "un_exp": Ref("fp32", ref_un_exp, FUNC, ["perturb"]),
    "un_neg": Ref("fp32", ref_un_neg, EXACT, ["perturb"]),
    "softmax": Ref("fp32", ref_softmax, FUNC, ["perturb", "softmax_axis0"]),
    "mm_2d": Ref("fp32", ref_mm_2d, ACC, ["perturb"]),
    "mm_shared": Ref("fp32", ref_mm_shared, ACC, ["perturb"]),
    "mm_batched": Ref("fp32", ref_mm_batched, ACC, ["perturb"]),
    "linear": Ref("fp32", ref_linear, ACC, ["perturb"]),
    "linear_bias": Ref("fp32", ref_linear_bias, ACC, ["perturb", "bias_skip"]),
    "linear_tied": Ref("fp32", ref_linear_tied, ACC, ["perturb", "no_wte_scale"]),
    "embedding": Ref("fp32", ref_embedding, EXACT, ["perturb"]),
    "embedding_pos": Ref("fp32", ref_embedding_pos, EXACT, ["perturb", "no_wpe"]),
    "layernorm": Ref("fp32", ref_norm(layernorm, "ln"), FUNC, ["perturb", "ln_unbiased", "eps_default"]),
    "rmsnorm": Ref("fp32", ref_norm(rmsnorm, "rn"), FUNC, ["perturb", "eps_default"]),
    "attn_mha": Ref("fp32", ref_attn(), ACC, ["perturb", "no_scale"]),
    "attn_causal": Ref("fp32", ref_attn(causal=True), ACC, ["perturb", "no_causal"]),
    "attn_gqa": Ref("fp32", ref_attn(kv_heads=2, causal=True), ACC, ["perturb", "gqa_mod"]),
    "attn_mqa": Ref("fp32", ref_attn(kv_heads=1), ACC, ["perturb"]),
    "attn_rope": Ref("fp32", ref_attn(rope_theta=10000, causal=True), ACC,
                     ["perturb", "no_rope", "rope_interleaved", "rope_freq"]),
    "attn_bias": Ref("fp32", ref_attn(bias=True), ACC, ["perturb", "bias_skip"]),
    "attn_head_dim": Ref("fp32", ref_attn(head_dim=8), ACC, ["perturb", "no_scale"]),
    "attn_full": Ref("fp32", ref_attn(kv_heads=2, head_dim=10, rope_theta=100, causal=True, bias=True), ACC,
                     ["perturb", "gqa_mod", "rope_interleaved", "no_causal", "bias_skip"]),
    "dt_bf16_ew": Ref("bf16", ref_dt_ew, BF16, ["perturb", "no_round", "bf16_trunc", "const_exact"]),
    "dt_fp16_ew": Ref("fp16", ref_dt_ew, FP16, ["perturb", "no_round", "const_exact"]),
    "dt_bf16_block": Ref("bf16", ref_dt_block, DEEP, ["perturb", "no_round", "bf16_trunc"], min_exact=DEEP_EXACT),
    "dt_fp16_block": Ref("fp16", ref_dt_block, DEEP, ["perturb", "no_round"], min_exact=DEEP_EXACT),
    # the shipped examples, at toy sizes
    "gpt2": Ref("bf16", ref_gpt2, DEEP, ["perturb", "no_round", "no_causal"], min_exact=DEEP_EXACT),
    "llama3_8b": Ref("bf16", ref_llama3_8b, DEEP, ["perturb", "no_round", "rope_interleaved"], min_exact=DEEP_EXACT),
    "llama_block": Ref("bf16", ref_llama_block, DEEP, ["perturb", "no_round", "gqa_mod"], min_exact=DEEP_EXACT),
    "elementwise": Ref("fp32", ref_elementwise, ACC, ["perturb", "gelu_erf"]),
}
for _act in ("gelu", "relu", "silu", "swiglu", "geglu"):
    _muts = ["perturb"] + (["swap_gate"] if _act in ("swiglu", "geglu") else []) + (["gelu_erf"] if "gelu" in _act else [])
    REFS["mlp_" + _act] = Ref("fp32", ref_mlp(_act, False), ACC, _muts)
    REFS["mlp_%s_bias" % _act] = Ref("fp32", ref_mlp(_act, True), ACC, _muts + ["bias_skip"] +
                                     (["no_gate_bias"] if _act in ("swiglu", "geglu") else []))

# --------------------------------------------------------------------------
# driver


def load_dump(d):
    tensors = {}
    with open(os.path.join(d, "manifest.tsv")) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            kind, name, dtype, shape, fname = line.split("\t")
            shp = tuple(int(s) for s in shape.split(",")) if shape else ()
            raw = np.fromfile(os.path.join(d, fname), dtype="<i4" if dtype == "i32" else "<f4")
            n = int(np.prod(shp)) if shp else 1
            if raw.size != n:
                raise RefError("%s: file holds %d values, shape %s needs %d" % (name, raw.size, shape, n))
            arr = raw.reshape(shp)
            if dtype != "i32":
                arr = arr.astype(np.float64)
            tensors[name] = (kind, dtype, arr)
    return tensors


def compare(name, got, ref, tol, floor, min_exact):
    """Returns (ok, message)."""
    if got.shape != ref.shape:
        return False, "shape %s, reference %s" % (list(got.shape), list(ref.shape))
    fin_r, fin_g = np.isfinite(ref), np.isfinite(got)
    bad_nonfinite = int(np.sum((fin_r != fin_g) | (~fin_r & ~fin_g & (got != ref)) | (np.isnan(got) != np.isnan(ref))))
    g, r = np.where(fin_r & fin_g, got, 0.0), np.where(fin_r & fin_g, ref, 0.0)
    scale = floor * (np.max(np.abs(r)) if r.size else 0.0)
    denom = np.maximum(np.abs(r), scale)
    err = np.where(denom > 0, np.abs(g - r) / np.where(denom > 0, denom, 1), np.abs(g - r))
    max_err = float(np.max(err)) if err.size else 0.0
    same = np.sum((got == ref) | (np.isnan(got) & np.isnan(ref)))
    exact = float(same) / got.size if got.size else 1.0
    ok = max_err <= tol and bad_nonfinite == 0 and exact >= min_exact
    at = np.unravel_index(int(np.argmax(err)), err.shape) if err.size else ()
    msg = "max_err %.3e (tol %.1e) at %s got %.9g ref %.9g, exact %.1f%%" % (
        max_err, tol, list(map(int, at)), got[at] if err.size else 0, ref[at] if err.size else 0, 100 * exact)
    n_inf = int(np.sum(np.isinf(ref)))
    if n_inf:
        msg += ", %d inf" % n_inf
    if bad_nonfinite:
        msg += ", %d non-finite mismatches" % bad_nonfinite
    if exact < min_exact:
        msg += " < %.0f%% bit-identical" % (100 * min_exact)
    return ok, msg


def check(model, dump, dims, mutants, verbose=True):
    """Returns (passed, lines)."""
    global DTYPE
    MUT.clear()
    MUT.update(m for m in mutants if m not in ("perturb", "swap_args"))
    ref_spec = REFS[model]
    dtype, fn = ref_spec.dtype, ref_spec.fn
    DTYPE = dtype
    lines, ok_all = [], True
    named = {k: v for k, v in dump.items() if v[0] in ("input", "param")}
    for name, (kind, dt, arr) in named.items():
        if dt != "i32" and dt != dtype:
            lines.append("FAIL %s %s: dtype %s, the model stores %s" % (kind, name, dt, dtype))
            ok_all = False
        if dt != "i32" and not np.array_equal(ROUND[dtype](arr), arr):
            lines.append("FAIL %s %s: dumped values are not rounded to %s" % (kind, name, dtype))
            ok_all = False
        if dt != "i32" and np.any(arr == 0):
            lines.append("note %s %s: has exact zeros" % (kind, name))
    t = Tensors({k: v[2] for k, v in named.items()})
    if "swap_args" in mutants:  # mutant: operands of the binary ops in the wrong order
        t.items = dict(t.items)
        t.items["x"], t.items["y"] = t.items["y"], t.items["x"]
        t.items["bias"] = t.items["bias"][::-1].copy()
        t.items["c"] = t.items["c"] * -1
    try:
        with np.errstate(divide="ignore", invalid="ignore"):
            refs = fn(t, dims)
        if "no_round" in MUT:  # the mutant rounds only the final outputs
            refs = {k: ROUND[dtype](v) for k, v in refs.items()}
    except (RefError, AssertionError) as e:
        return False, lines + ["FAIL reference: %s" % (e or "assertion failed")]
    unused = sorted(set(t.items) - t.used)
    for u in unused:
        lines.append("FAIL %s %s %s: not defined by the spec (the reference never reads it)"
                     % (named[u][0], u, list(named[u][2].shape)))
        ok_all = False
    outs = {k: v for k, v in dump.items() if v[0] == "output"}
    for name in sorted(set(refs) - set(outs)):
        lines.append("FAIL output %s: missing from the dump" % name)
        ok_all = False
    for name in sorted(set(outs) - set(refs)):
        lines.append("FAIL output %s: not expected by the reference" % name)
        ok_all = False
    min_exact = ref_spec.min_exact if dtype != "fp32" else 0.0
    for name in [n for n in outs if n in refs]:
        got = outs[name][2]
        if outs[name][1] != dtype:
            lines.append("FAIL output %s: dtype %s, expected %s" % (name, outs[name][1], dtype))
            ok_all = False
        ref = np.asarray(refs[name], dtype=np.float64)
        tol, floor = ref_spec.tol_of(name)
        if "perturb" in mutants:  # mutant: one element just outside the tolerance
            ref = ref.copy()
            fl = ref.reshape(-1)
            j = int(np.argmax(np.where(np.isfinite(fl), np.abs(fl), 0)))
            fl[j] = fl[j] * (1 + max(3 * tol, 2.0 ** -20)) + (1e-30 if fl[j] == 0 else 0)
        ok, msg = compare(name, got, ref, tol, floor, min_exact)
        ok_all &= ok
        lines.append("%s %s %s: %s" % ("PASS" if ok else "FAIL", model, name, msg))
    return ok_all, lines


def main(argv):
    args = argv[1:]
    if len(args) < 2:
        print(__doc__.split("\n\n")[1])
        return 2
    ntpc, src = args[0], args[1]
    dflags, dims, seed, model, mutants, one = [], {}, None, None, False, None
    i = 2
    while i < len(args):
        a = args[i]
        if a == "-D" and i + 1 < len(args):
            dflags += ["-D", args[i + 1]]
            k, v = args[i + 1].split("=", 1)
            dims[k] = int(v)
            i += 2
        elif a.startswith("-D") and "=" in a:
            dflags.append(a)
            k, v = a[2:].split("=", 1)
            dims[k] = int(v)
            i += 1
        elif a == "--seed":
            seed = args[i + 1]
            i += 2
        elif a == "--model":
            model = args[i + 1]
            i += 2
        elif a == "--mutants":
            mutants = True
            i += 1
        elif a == "--mutant":
            one = args[i + 1]
            i += 2
        else:
            print("check.py: unknown argument %s" % a)
            return 2
    if model is None:
        with open(src) as f:
            m = re.search(r"^\s*model\s+(\w+)", f.read(), re.M)
        model = m.group(1) if m else os.path.splitext(os.path.basename(src))[0]
    if model not in REFS:
        print("check.py: no NumPy reference for model '%s'" % model)
        return 2
    with tempfile.TemporaryDirectory(prefix="ntp-numeric-") as tmp:
        cmd = [ntpc, "run", src, "--backend", "cpu", "--dump", tmp, "--model", model] + dflags
        if seed is not None:
            cmd += ["--seed", seed]
        try:
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
        except OSError as e:
            print("FAIL %s: cannot run %s: %s" % (model, ntpc, e))
            return 1
        if p.returncode != 0:
            print(" ".join(cmd))
            print(p.stdout)
            print("FAIL %s: ntpc exited with status %d" % (model, p.returncode))
            return 1
        dump = load_dump(tmp)
    if one is not None:
        ok, lines = check(model, dump, dims, [one])
        print("\n".join(lines))
        print("%s %s with mutant %s" % ("PASS" if ok else "FAIL", model, one))
        return 0 if ok else 1
    ok, lines = check(model, dump, dims, [])
    print("\n".join(lines))
    if not mutants:
        print("%s %s" % ("PASS" if ok else "FAIL", model))
        return 0 if ok else 1
    if not ok:
        print("FAIL %s: the correct reference already fails; mutants not run" % model)
        return 1
    caught = True
    for mname in REFS[model].mutants:
        mok, mlines = check(model, dump, dims, [mname])
        worst = [l for l in mlines if l.startswith("FAIL")]
        print("%s mutant %-16s %s" % ("caught " if not mok else "MISSED ", mname, worst[0] if worst else ""))
        caught &= not mok
    print("%s %s: %s" % ("PASS" if caught else "FAIL", model,
                          "every mutant was detected" if caught else "a wrong reference passed"))
    return 0 if caught else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
