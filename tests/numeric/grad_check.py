#!/usr/bin/env python3
"""Whole-model gradients of ntpc's training against an independent NumPy implementation.

usage: grad_check.py NTPC {gpt2|llama} [--mutant NAME]

Runs `NTPC train MODEL --steps 1 --dump DIR` on a token file of random bytes, loads the dumped
inputs, parameters, loss and gradients (grad.NAME), and recomputes the loss and every gradient
with a forward and backward pass written here by hand in float64 from the language's definitions
(docs/language.md, docs/training.md; the IR is never read): GPT-2 (learned positions, LayerNorm,
attention with biases, a GELU MLP with biases, a tied head) and Llama (RMSNorm, RoPE, grouped KV
heads, SwiGLU, an untied head), both with cross-entropy. Passes when the loss agrees within 1e-6
relative and every gradient within 1e-5 of its largest element (fp32 against float64).

--mutant NAME makes one rule of this reference wrong (a plausible bug): the check must then fail,
which shows it can. Names: ln_mean (LayerNorm's backward without the mean term), rope_sign (RoPE's
backward by the same angle), gqa_sum (K and V gradients of the first query head of a group
only), tied (the tied head's gradient not added to the embedding's). Exit 77 without NumPy."""
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
except ImportError:
    print("grad_check.py: NumPy not installed: skipped")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MODELS = {
    "gpt2": (os.path.join(ROOT, "examples", "byte_gpt.ntp"), ["-D", "B=2", "-D", "S=8", "-D", "D=16", "-D", "H=2"]),
    "llama": (os.path.join(HERE, "train_llama.ntp"), []),
}
MUTANT = None


def load_dump(d):
    out = {"input": {}, "param": {}, "output": {}}
    for line in open(os.path.join(d, "manifest.tsv")):
        kind, name, dt, shape, f = line.rstrip("\n").split("\t")
        shp = tuple(int(s) for s in shape.split(",")) if shape else ()
        a = np.fromfile(os.path.join(d, f), dtype="<i4" if dt == "i32" else "<f4").reshape(shp)
        out[kind][name] = a.astype(np.int64 if dt == "i32" else np.float64)
    return out


# ---- layers: forward returns (y, cache); backward(dy, cache) returns dx and fills grads ----
def linear_f(x, w, b=None):
    y = x @ w.T
    return (y + b if b is not None else y), x


def linear_b(dy, x, w, gw, gb=None):
    gw += dy.reshape(-1, dy.shape[-1]).T @ x.reshape(-1, x.shape[-1])
    if gb is not None:
        gb += dy.reshape(-1, dy.shape[-1]).sum(0)
    return dy @ w


def layernorm_f(x, g, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    inv = 1.0 / np.sqrt(var + eps)
    xh = (x - mu) * inv
    return xh * g + b, (xh, inv)


def layernorm_b(dy, cache, g, gg, gb):
    xh, inv = cache
    gg += (dy * xh).reshape(-1, xh.shape[-1]).sum(0)
    gb += dy.reshape(-1, dy.shape[-1]).sum(0)
    d = dy * g
    mean_term = 0 if MUTANT == "ln_mean" else d.mean(-1, keepdims=True)
    return inv * (d - mean_term - xh * (d * xh).mean(-1, keepdims=True))


def rmsnorm_f(x, g, eps=1e-5):
    r = 1.0 / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    return x * r * g, (x, r)


def rmsnorm_b(dy, cache, g, gg):
    x, r = cache
    gg += (dy * x * r).reshape(-1, x.shape[-1]).sum(0)
    d = dy * g
    return r * d - r ** 3 * x * (d * x).mean(-1, keepdims=True)


def rope(x, theta, sign=1.0):
    """rotate-half: pairs (i, i + hd/2) turned by pos * theta^(-2i/hd); sign -1 turns back"""
    b, s, h, hd = x.shape
    half = hd // 2
    i = np.arange(half)
    ang = np.arange(s)[:, None] * theta ** (-2.0 * i / hd)[None, :]
    cs, sn = np.cos(ang)[None, :, None, :], sign * np.sin(ang)[None, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cs - x2 * sn, x2 * cs + x1 * sn], -1)


def attention_f(h, p, pre, heads, kv, theta, bias):
    b, s, d = h.shape
    hd = d // heads
    q, hq = linear_f(h, p[pre + "wq"], p.get(pre + "bq") if bias else None)
    k, _ = linear_f(h, p[pre + "wk"], p.get(pre + "bk") if bias else None)
    v, _ = linear_f(h, p[pre + "wv"], p.get(pre + "bv") if bias else None)
    q, k, v = q.reshape(b, s, heads, hd), k.reshape(b, s, kv, hd), v.reshape(b, s, kv, hd)
    if theta:
        q, k = rope(q, theta), rope(k, theta)
    grp = heads // kv
    kk, vv = np.repeat(k, grp, axis=2), np.repeat(v, grp, axis=2)  # query head n uses kv head n // grp
    sc = np.einsum("bshe,bthe->bhst", q, kk) / np.sqrt(hd)
    sc = np.where(np.tril(np.ones((s, s), bool))[None, None], sc, -np.inf)
    sc = sc - sc.max(-1, keepdims=True)
    pr = np.exp(sc)
    pr /= pr.sum(-1, keepdims=True)
    o = np.einsum("bhst,bthe->bshe", pr, vv).reshape(b, s, d)
    y, xo = linear_f(o, p[pre + "wo"], p.get(pre + "bo") if bias else None)
    return y, (h, q, kk, vv, pr, xo, hd, grp)


def attention_b(dy, cache, p, g, pre, heads, kv, theta, bias):
    h, q, kk, vv, pr, xo, hd, grp = cache
    b, s, d = h.shape
    do = linear_b(dy, xo, p[pre + "wo"], g[pre + "wo"], g.get(pre + "bo") if bias else None).reshape(b, s, heads, hd)
    dpr = np.einsum("bshe,bthe->bhst", do, vv)
    dvv = np.einsum("bhst,bshe->bthe", pr, do)
    dsc = pr * (dpr - (dpr * pr).sum(-1, keepdims=True)) / np.sqrt(hd)
    dq = np.einsum("bhst,bthe->bshe", dsc, kk)
    dkk = np.einsum("bhst,bshe->bthe", dsc, q)
    if MUTANT == "gqa_sum":
        dk, dv = dkk[:, :, ::grp], dvv[:, :, ::grp]
    else:
        dk = dkk.reshape(b, s, kv, grp, hd).sum(3)
        dv = dvv.reshape(b, s, kv, grp, hd).sum(3)
    if theta:
        back = 1.0 if MUTANT == "rope_sign" else -1.0
        dq, dk = rope(dq, theta, back), rope(dk, theta, back)
    dh = linear_b(dq.reshape(b, s, d), h, p[pre + "wq"], g[pre + "wq"], g.get(pre + "bq") if bias else None)
    dh += linear_b(dk.reshape(b, s, -1), h, p[pre + "wk"], g[pre + "wk"], g.get(pre + "bk") if bias else None)
    dh += linear_b(dv.reshape(b, s, -1), h, p[pre + "wv"], g[pre + "wv"], g.get(pre + "bv") if bias else None)
    return dh


C = np.sqrt(2.0 / np.pi)


def gelu(x):
    return 0.5 * x * (1.0 + np.tanh(C * (x + 0.044715 * x ** 3)))


def gelu_d(x):
    t = np.tanh(C * (x + 0.044715 * x ** 3))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * C * (1 + 3 * 0.044715 * x * x)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def cross_entropy(logits, targets):
    z = logits - logits.max(-1, keepdims=True)
    lse = np.log(np.exp(z).sum(-1, keepdims=True))
    logp = z - lse
    n = targets.size
    loss = -np.take_along_axis(logp, targets[..., None], -1).sum() / n
    d = np.exp(logp)
    np.put_along_axis(d, targets[..., None], np.take_along_axis(d, targets[..., None], -1) - 1.0, -1)
    return loss, d / n


def gpt2(p, tokens, targets, L, heads):
    g = {k: np.zeros_like(v) for k, v in p.items()}
    s = tokens.shape[1]
    x = p["embed.wte"][tokens] + p["embed.wpe"][:s]
    caches = []
    for i in range(L):
        pre = f"blk.{i}."
        h, c1 = layernorm_f(x, p[pre + "ln1.g"], p[pre + "ln1.b"])
        a, c2 = attention_f(h, p, pre + "attn.", heads, heads, 0, True)
        x = x + a
        h, c3 = layernorm_f(x, p[pre + "ln2.g"], p[pre + "ln2.b"])
        u, c4 = linear_f(h, p[pre + "mlp.w_up"], p[pre + "mlp.b_up"])
        m, c5 = linear_f(gelu(u), p[pre + "mlp.w_down"], p[pre + "mlp.b_down"])
        x = x + m
        caches.append((c1, c2, c3, c4, c5, u))
    xf, cf = layernorm_f(x, p["ln_f.g"], p["ln_f.b"])
    logits, ch = linear_f(xf, p["embed.wte"])
    loss, dlog = cross_entropy(logits, targets)
    dwte_head = np.zeros_like(p["embed.wte"])
    dx = linear_b(dlog, ch, p["embed.wte"], dwte_head)
    if MUTANT != "tied":
        g["embed.wte"] += dwte_head
    dx = layernorm_b(dx, cf, p["ln_f.g"], g["ln_f.g"], g["ln_f.b"])
    for i in reversed(range(L)):
        pre = f"blk.{i}."
        c1, c2, c3, c4, c5, u = caches[i]
        da = linear_b(dx, c5, p[pre + "mlp.w_down"], g[pre + "mlp.w_down"], g[pre + "mlp.b_down"])
        dh = linear_b(da * gelu_d(u), c4, p[pre + "mlp.w_up"], g[pre + "mlp.w_up"], g[pre + "mlp.b_up"])
        dx = dx + layernorm_b(dh, c3, p[pre + "ln2.g"], g[pre + "ln2.g"], g[pre + "ln2.b"])
        dh = attention_b(dx, c2, p, g, pre + "attn.", heads, heads, 0, True)
        dx = dx + layernorm_b(dh, c1, p[pre + "ln1.g"], g[pre + "ln1.g"], g[pre + "ln1.b"])
    np.add.at(g["embed.wte"], tokens, dx)
    g["embed.wpe"][:s] += dx.sum(0)
    return loss, g


def llama(p, tokens, targets, L, heads, kv):
    g = {k: np.zeros_like(v) for k, v in p.items()}
    x = p["embed.wte"][tokens]
    caches = []
    for i in range(L):
        pre = f"blk.{i}."
        h, c1 = rmsnorm_f(x, p[pre + "n1.g"])
        a, c2 = attention_f(h, p, pre + "attn.", heads, kv, 10000.0, False)
        x = x + a
        h, c3 = rmsnorm_f(x, p[pre + "n2.g"])
        up, cu = linear_f(h, p[pre + "mlp.w_up"])
        gate, _ = linear_f(h, p[pre + "mlp.w_gate"])
        act = gate * sigmoid(gate)
        m, cd = linear_f(act * up, p[pre + "mlp.w_down"])
        x = x + m
        caches.append((c1, c2, c3, cu, cd, up, gate, act))
    xf, cf = rmsnorm_f(x, p["nf.g"])
    logits, ch = linear_f(xf, p["head.w"])
    loss, dlog = cross_entropy(logits, targets)
    dx = linear_b(dlog, ch, p["head.w"], g["head.w"])
    dx = rmsnorm_b(dx, cf, p["nf.g"], g["nf.g"])
    for i in reversed(range(L)):
        pre = f"blk.{i}."
        c1, c2, c3, cu, cd, up, gate, act = caches[i]
        dm = linear_b(dx, cd, p[pre + "mlp.w_down"], g[pre + "mlp.w_down"])
        sg = sigmoid(gate)
        dgate = dm * up * sg * (1 + gate * (1 - sg))
        dh = linear_b(dm * act, cu, p[pre + "mlp.w_up"], g[pre + "mlp.w_up"])
        dh += linear_b(dgate, cu, p[pre + "mlp.w_gate"], g[pre + "mlp.w_gate"])
        dx = dx + rmsnorm_b(dh, c3, p[pre + "n2.g"], g[pre + "n2.g"])
        dh = attention_b(dx, c2, p, g, pre + "attn.", heads, kv, 10000.0, False)
        dx = dx + rmsnorm_b(dh, c1, p[pre + "n1.g"], g[pre + "n1.g"])
    np.add.at(g["embed.wte"], tokens, dx)
    return loss, g


def main():
    global MUTANT
    args = sys.argv[1:]
    if "--mutant" in args:
        k = args.index("--mutant")
        MUTANT = args[k + 1]
        del args[k:k + 2]
    if len(args) != 2 or args[1] not in MODELS:
        sys.exit(__doc__)
    ntpc, which = args
    model, defs = MODELS[which]
    with tempfile.TemporaryDirectory() as d:
        rng = np.random.default_rng(7)
        ids = rng.integers(0, 256, 4096).astype("<u2")
        header = np.zeros(256, "<i4")
        header[:3] = [20240520, 1, ids.size]
        with open(os.path.join(d, "t.bin"), "wb") as f:
            f.write(header.tobytes() + ids.tobytes())
        r = subprocess.run([ntpc, "train", model, "--data", os.path.join(d, "t.bin"), "--steps", "1", "--seed", "5",
                            "--dump", os.path.join(d, "dump")] + defs, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"grad_check.py: ntpc train failed:\n{r.stdout}{r.stderr}")
        dump = load_dump(os.path.join(d, "dump"))
    p = dump["param"]
    tokens, targets = dump["input"]["tokens"], dump["input"]["targets"]
    L = 1 + max(int(n.split(".")[1]) for n in p if n.startswith("blk."))
    if which == "gpt2":
        loss, g = gpt2(p, tokens, targets, L, heads=2)
    else:
        heads, kv = 4, 2
        loss, g = llama(p, tokens, targets, L, heads, kv)
    ok = True
    got = dump["output"]["loss"].item()
    e = abs(got - loss) / abs(loss)
    ok &= e <= 1e-6
    print(f"{which}: loss ntpc {got:.8f} numpy {loss:.8f}  relative error {e:.2e}  {'ok' if e <= 1e-6 else 'FAIL'}")
    # a gradient that vanishes (the key bias: softmax does not see it) is measured against a
    # thousandth of the model's largest gradient, not against its own float64 round-off
    floor = 1e-3 * max(np.abs(v).max() for v in g.values())
    worst = 0.0
    for name in p:
        ours = dump["output"].get("grad." + name)
        if ours is None:
            print(f"  {name}: no gradient dumped  FAIL")
            ok = False
            continue
        ref = g[name]
        scale = np.abs(ref).max()
        err = np.abs(ours - ref).max() / max(scale, floor)
        worst = max(worst, err)
        good = err <= 1e-5
        ok &= good
        if not good or os.environ.get("VERBOSE"):
            print(f"  grad.{name:22s} {str(ref.shape):12s} max|g| {scale:.3e}  error {err:.2e}  {'ok' if good else 'FAIL'}")
    print(f"{which}: {len(p)} gradients, worst error {worst:.2e} of the tensor's largest element (bound 1e-5): "
          f"{'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
