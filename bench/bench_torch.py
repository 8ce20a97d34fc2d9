#!/usr/bin/env python3
"""GPT-2 forward in PyTorch on the GPU: eager and torch.compile, the baselines of bench/gpt2_ratios.sh.

usage: bench_torch.py [-D NAME=VALUE]... [--iters N] [--dtype bf16|fp16|fp32] [--no-compile]

The model is GPT-2 as ntp's examples/gpt2.ntp writes it (learned positions, pre-LN blocks, causal
attention with biases, tanh-GELU MLP with biases, final LayerNorm, head tied to the token
embedding) in the usual PyTorch form: F.linear, F.layer_norm, F.scaled_dot_product_attention
(is_causal: PyTorch's fused attention kernels). Weights are random, made on the GPU in the
storage dtype (timing only: no comparison here; bench/pytorch_compare.py checks the numbers).
Times are CUDA events around `iters` forwards after warm-ups (torch.compile: its compilation
happens in the warm-ups and is reported apart).

Prints key=value lines: torch_version, eager_ms, compile_ms, compile_build_s; or torch_missing=WHY
and exit 77 when torch, or a CUDA device for it, is not there.
Dims: B=8 S=1024 D=768 H=12 L=12 V=50257 unless -D says otherwise.
"""
import argparse
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-D", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--no-compile", action="store_true")
    a = ap.parse_args()
    dims = dict(B=8, S=1024, D=768, H=12, L=12, V=50257)
    for d in a.D:
        k, _, v = d.partition("=")
        if k not in dims or not v.isdigit():
            ap.error("-D %s: expected one of %s = a number" % (d, ",".join(dims)))
        dims[k] = int(v)
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - any import failure means: no baseline
        print("torch_missing=torch is not importable (%s)" % str(e).splitlines()[0])
        return 77
    if not torch.cuda.is_available():
        print("torch_missing=torch %s sees no CUDA device" % torch.__version__)
        return 77
    F = torch.nn.functional
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.dtype]
    B, S, D, H, L, V = (dims[k] for k in "BSDHLV")
    g = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape, scale=0.02, center=0.0):
        return (center + scale * (2 * torch.rand(*shape, generator=g, device="cuda") - 1)).to(dt)

    P = {"wte": rand(V, D, scale=1.0), "wpe": rand(S, D, scale=0.5), "lnf_g": rand(D, center=1.0), "lnf_b": rand(D)}
    blocks = []
    for _ in range(L):
        blocks.append({"ln1_g": rand(D, center=1.0), "ln1_b": rand(D), "wqkv": rand(3 * D, D, scale=D**-0.5),
                       "bqkv": rand(3 * D), "wo": rand(D, D, scale=D**-0.5), "bo": rand(D),
                       "ln2_g": rand(D, center=1.0), "ln2_b": rand(D), "wup": rand(4 * D, D, scale=D**-0.5),
                       "bup": rand(4 * D), "wdown": rand(D, 4 * D, scale=(4 * D)**-0.5), "bdown": rand(D)})
    tokens = torch.randint(0, V, (B, S), generator=g, device="cuda")
    pos = torch.arange(S, device="cuda")

    def forward(tok):
        x = P["wte"][tok] + P["wpe"][pos]
        for b in blocks:
            h = F.layer_norm(x, (D,), b["ln1_g"], b["ln1_b"], 1e-5)
            q, k, v = F.linear(h, b["wqkv"], b["bqkv"]).view(B, S, 3, H, D // H).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, S, D)
            x = x + F.linear(y, b["wo"], b["bo"])
            h = F.layer_norm(x, (D,), b["ln2_g"], b["ln2_b"], 1e-5)
            x = x + F.linear(F.gelu(F.linear(h, b["wup"], b["bup"]), approximate="tanh"), b["wdown"], b["bdown"])
        return F.layer_norm(x, (D,), P["lnf_g"], P["lnf_b"], 1e-5) @ P["wte"].T

    def timed(fn, warm):
        with torch.no_grad():
            for _ in range(warm):
                fn(tokens)
            torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(a.iters):
                fn(tokens)
            e1.record()
            torch.cuda.synchronize()
        return e0.elapsed_time(e1) / max(a.iters, 1)

    print("torch_version=%s" % torch.__version__)
    print("device=%s" % torch.cuda.get_device_name(0))
    print("eager_ms=%.3f" % timed(forward, 2))
    if not a.no_compile:
        try:
            compiled = torch.compile(forward)
            t0 = time.perf_counter()
            with torch.no_grad():
                compiled(tokens)
            torch.cuda.synchronize()
            print("compile_build_s=%.1f" % (time.perf_counter() - t0))
            print("compile_ms=%.3f" % timed(compiled, 2))
        except Exception as e:  # noqa: BLE001 - report, keep the eager figure
            print("compile_missing=torch.compile failed (%s)" % str(e).splitlines()[0][:200])
    return 0


if __name__ == "__main__":
    sys.exit(main())
