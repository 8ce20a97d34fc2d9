#!/usr/bin/env python3
"""Training throughput on the CPU: `ntpc train` against PyTorch CPU eager on the same model.

usage: bench_train.py NTPC [--steps N] [-D NAME=VALUE]...   (run from the repository root)

Trains examples/byte_gpt.ntp (a GPT-2-shaped model over bytes: learned positions, pre-LayerNorm
blocks, attention with biases, a tanh-GELU MLP with biases, a tied head, cross-entropy) for
--steps steps (default 20) with `ntpc train`, and the same architecture written in PyTorch
(float32, AdamW with the same hyper-parameters, the same batches) for as many steps, with the same
number of threads; prints each one's tokens per second (the median step after the first) and
their ratio, measured in this one run. Without torch (it is never a CI requirement) the PyTorch
column says so and the script still exits 0. The token file is made from this repository's docs.
"""
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def dims(defs):
    d = {"B": 8, "S": 64, "D": 64, "H": 4, "L": 2, "V": 256}
    for s in defs:
        k, v = s.split("=")
        d[k] = int(v)
    return d


def ntp_run(ntpc, data, steps, defs):
    args = [ntpc, "train", os.path.join(ROOT, "examples", "byte_gpt.ntp"), "--data", data, "--steps", str(steps),
            "--lr", "1e-3", "-q"]
    for s in defs:
        args += ["-D", s]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    rates = [float(m) for m in re.findall(r"  ([0-9.]+) tokens/s$", out, re.M)]
    losses = [float(m) for m in re.findall(r"^step .*  loss ([0-9.]+)", out, re.M)]
    return statistics.median(rates[1:] or rates), losses


def torch_run(data, steps, d, threads):
    try:
        import numpy as np
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    B, S, D, H, L, V = d["B"], d["S"], d["D"], d["H"], d["L"], d["V"]
    ids = np.fromfile(data, dtype="<u2", offset=1024).astype(np.int64)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = torch.nn.LayerNorm(D), torch.nn.LayerNorm(D)
            self.q, self.k, self.v, self.o = (torch.nn.Linear(D, D) for _ in range(4))
            self.up, self.down = torch.nn.Linear(D, 4 * D), torch.nn.Linear(4 * D, D)

        def forward(self, x):
            h = self.ln1(x)
            q, k, v = (t(h).view(B, S, H, D // H).transpose(1, 2) for t in (self.q, self.k, self.v))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, S, D)
            x = x + self.o(a)
            return x + self.down(F.gelu(self.up(self.ln2(x)), approximate="tanh"))

    class GPT(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = torch.nn.Embedding(V, D), torch.nn.Embedding(S, D)
            self.blocks = torch.nn.ModuleList(Block() for _ in range(L))
            self.lnf = torch.nn.LayerNorm(D)

        def forward(self, tok):
            x = self.wte(tok) + self.wpe.weight[None, :S]
            for b in self.blocks:
                x = b(x)
            return self.lnf(x) @ self.wte.weight.T

    model = GPT()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}], lr=1e-3,
                            betas=(0.9, 0.95), eps=1e-8)
    times, pos = [], 0
    for _ in range(steps):
        if pos + B * S + 1 > ids.size:
            pos = 0
        w = torch.from_numpy(ids[pos:pos + B * S + 1])
        tok, tgt = w[:-1].view(B, S), w[1:].view(B, S)
        pos += B * S
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(tok).view(-1, V), tgt.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    return B * S / statistics.median(times[1:] or times)


def main():
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    ntpc, steps, defs = args[0], 20, []
    i = 1
    while i < len(args):
        if args[i] == "--steps":
            steps = int(args[i + 1])
            i += 2
        elif args[i] == "-D":
            defs.append(args[i + 1])
            i += 2
        else:
            sys.exit(__doc__)
    d = dims(defs)
    threads = int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1))
    with tempfile.TemporaryDirectory() as t:
        data = os.path.join(t, "docs.bin")
        docs = [os.path.join(ROOT, "README.md")] + sorted(
            os.path.join(ROOT, "docs", f) for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_tokens.py"), data, "--text"] + docs,
                       check=True, capture_output=True)
        ntp, losses = ntp_run(ntpc, data, steps, defs)
        pt = torch_run(data, steps, d, threads)
    print(f"byte_gpt B={d['B']} S={d['S']} D={d['D']} H={d['H']} L={d['L']}, {steps} steps, {threads} threads")
    print(f"  ntpc train     {ntp:10.0f} tokens/s   (loss {losses[0]:.3f} -> {losses[-1]:.3f})")
    if pt is None:
        print("  PyTorch eager  (torch is not importable: no comparison)")
    else:
        print(f"  PyTorch eager  {pt:10.0f} tokens/s")
        print(f"  ntp / PyTorch  {ntp / pt:10.2f}  (above 1: ntp faster)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
