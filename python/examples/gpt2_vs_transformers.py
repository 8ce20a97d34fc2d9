"""gpt2_vs_transformers.py — a GPT-2 forward pass from PyTorch tensors on weights in the Hugging
Face layout, against transformers' own output on the same weights (docs/python.md).

transformers builds a GPT-2 (its own random initialisation) and writes it with save_pretrained
(model.safetensors, the layout published checkpoints have); ntp loads that file with
format="hf-gpt2" into examples/gpt2.ntp — in fp32 and as shipped (bf16) — on one rank and on 8
ranks under a non-uniform plan, and both take the same torch token tensor.

    pip install . torch transformers && python python/examples/gpt2_vs_transformers.py
"""
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import transformers

import ntp

ROOT = Path(__file__).resolve().parents[2]
B, S, D, H, L, V, NPOS = 8, 64, 128, 8, 2, 1000, 128

cfg = transformers.GPT2Config(vocab_size=V, n_positions=NPOS, n_embd=D, n_layer=L, n_head=H,
                              activation_function="gelu_new", resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)
torch.manual_seed(0)
hf = transformers.GPT2LMHeadModel(cfg).eval()
tmp = Path(tempfile.mkdtemp())
hf.save_pretrained(tmp, safe_serialization=True)
tokens = torch.randint(0, V, (B, S))
with torch.no_grad():
    ref = hf(tokens).logits.float().numpy()

src = (ROOT / "examples" / "gpt2.ntp").read_text()
dims = {"B": B, "S": S, "D": D, "H": H, "L": L, "V": V}
worst = 0.0
for dtype, tol in [("fp32", 1e-4), ("bf16", 5e-2)]:
    text = src if dtype == "bf16" else src.replace("dtype bf16;", "dtype fp32;")
    for plan in [None, ROOT / "examples" / "plans" / "gpt2_mixed8.ntp"]:
        model = ntp.compile(text, defines=dims, plan=plan, world=None if plan else 1)
        model.load(tmp / "model.safetensors", format="hf-gpt2")
        out = model.forward(tokens)["logits"]                     # torch in, torch out
        assert isinstance(out, torch.Tensor)
        got = out.float().numpy()
        err = float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))
        agree = float(np.mean(got.argmax(-1) == ref.argmax(-1)))
        print(f"{dtype} on {model.world} rank{'s' if model.world > 1 else ''}: logits {tuple(out.shape)} "
              f"{out.dtype}, max relative error against transformers {err:.2e} (tolerance {tol:.0e}), "
              f"same top token at {100 * agree:.1f}% of positions")
        worst = max(worst, err / tol)
print(f"transformers {transformers.__version__}, torch {torch.__version__}: {'ok' if worst <= 1 else 'MISMATCH'}")
sys.exit(0 if worst <= 1 else 1)
