#!/usr/bin/env python3
"""hf_params.py NTPC — Hugging Face checkpoints as published (docs/runtime.md#checkpoint-layouts).

Writes toy GPT-2 and Llama checkpoints in the Hugging Face layout (with the `safetensors`
package when it is installed, else with the few lines of the format below) and checks:
- `ntpc run --params F --params-format hf-gpt2|hf-llama` reads every parameter as NumPy's own
  conversion gives it: the fused c_attn split into q, k, v, Conv1D weights transposed, a
  position table longer than the model's cut, F32 rounded to the model's bf16 (the dumped
  parameters equal it bit for bit), with and without the "transformer." prefix; Llama's
  projections, an untied head and a tied one (no lm_head.weight: the embedding);
- a sharded run reads its slices through the map (transposed boxes, parts of c_attn) and equals
  the unsharded one;
- `--save-params --params-format hf-gpt2` writes the layout back: read again, the same bits;
- with PyTorch and transformers installed: logits equal GPT2LMHeadModel's and
  LlamaForCausalLM's on the same weights (fp32 models, within 1e-4);
- a missing tensor or a wrong shape is an error naming both names.
Exit status 0, 1 a check failed, 77 without NumPy.
"""
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ntpc_checks import dump, start  # noqa: E402

np, T, tmp = start("hf_params.py")
ntpc, check, run = T.ntpc, T.check, T.run


try:
    from safetensors.numpy import save_file
    writer = "the safetensors package"
except ImportError:
    writer = "this script's writer (the safetensors package is not installed)"

    def save_file(tensors, path):  # the format: u64 header length, JSON header, raw little-endian data
        header, off, blobs = {}, 0, []
        for k, v in tensors.items():
            b = np.ascontiguousarray(v).astype(v.dtype.newbyteorder("<")).tobytes()
            header[k] = {"dtype": {"float32": "F32", "float16": "F16"}[v.dtype.name], "shape": list(v.shape),
                         "data_offsets": [off, off + len(b)]}
            off += len(b)
            blobs.append(b)
        h = json.dumps(header).encode()
        h += b" " * (-len(h) % 8)
        with open(path, "wb") as f:
            f.write(len(h).to_bytes(8, "little") + h + b"".join(blobs))


def load_file(path):  # our reader: BF16 too (NumPy has no bfloat16)
    b = open(path, "rb").read()
    n = int.from_bytes(b[:8], "little")
    out = {}
    for k, v in json.loads(b[8:8 + n]).items():
        if k == "__metadata__":
            continue
        lo, hi = v["data_offsets"]
        raw = b[8 + n + lo:8 + n + hi]
        if v["dtype"] == "BF16":
            a = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            a = np.frombuffer(raw, {"F32": "<f4", "F16": "<f2"}[v["dtype"]]).astype(np.float32)
        out[k] = a.reshape(v["shape"])
    return out



def bf16(x):  # round to nearest even on the float32 bits
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    b = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16
    return b.astype(np.uint32).view(np.float32)




rng = np.random.default_rng(3)
B, S, D, H, V, L, NPOS = 8, 16, 64, 8, 96, 2, 40
dims = ["-D", f"B={B}", "-D", f"S={S}", "-D", f"D={D}", "-D", f"H={H}", "-D", f"V={V}", "-D", f"L={L}"]
tokens = rng.integers(0, V, size=(B, S))
np.save(f"{tmp}/tok.npy", tokens)


def w(*shape, scale=0.08):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


# ---- GPT-2 ------------------------------------------------------------------------------------
hf = {"wte.weight": w(V, D), "wpe.weight": w(NPOS, D), "ln_f.weight": 1 + w(D), "ln_f.bias": w(D)}
for i in range(L):
    p = f"h.{i}."
    hf.update({p + "ln_1.weight": 1 + w(D), p + "ln_1.bias": w(D), p + "ln_2.weight": 1 + w(D), p + "ln_2.bias": w(D),
               p + "attn.c_attn.weight": w(D, 3 * D), p + "attn.c_attn.bias": w(3 * D),
               p + "attn.c_proj.weight": w(D, D), p + "attn.c_proj.bias": w(D),
               p + "mlp.c_fc.weight": w(D, 4 * D), p + "mlp.c_fc.bias": w(4 * D),
               p + "mlp.c_proj.weight": w(4 * D, D), p + "mlp.c_proj.bias": w(D)})
hf["h.0.attn.c_proj.weight"] = hf["h.0.attn.c_proj.weight"].astype(np.float16)  # an F16 tensor too
save_file(hf, f"{tmp}/gpt2.safetensors")
save_file({"transformer." + k: v for k, v in hf.items()}, f"{tmp}/gpt2_prefixed.safetensors")


def gpt2_expected(hf):  # the model's names and layout, by NumPy
    f = lambda a: bf16(a.astype(np.float32))
    e = {"embed.wte": f(hf["wte.weight"]), "embed.wpe": f(hf["wpe.weight"][:S]),
         "ln_f.g": f(hf["ln_f.weight"]), "ln_f.b": f(hf["ln_f.bias"])}
    for i in range(L):
        p, q = f"h.{i}.", f"blk.{i}."
        ca, cb = hf[p + "attn.c_attn.weight"].astype(np.float32), hf[p + "attn.c_attn.bias"]
        for j, r in enumerate("qkv"):
            e[q + f"attn.w{r}"] = f(ca[:, j * D:(j + 1) * D].T)
            e[q + f"attn.b{r}"] = f(cb[j * D:(j + 1) * D])
        e.update({q + "attn.wo": f(hf[p + "attn.c_proj.weight"].astype(np.float32).T), q + "attn.bo": f(hf[p + "attn.c_proj.bias"]),
                  q + "ln1.g": f(hf[p + "ln_1.weight"]), q + "ln1.b": f(hf[p + "ln_1.bias"]),
                  q + "ln2.g": f(hf[p + "ln_2.weight"]), q + "ln2.b": f(hf[p + "ln_2.bias"]),
                  q + "mlp.w_up": f(hf[p + "mlp.c_fc.weight"].T), q + "mlp.b_up": f(hf[p + "mlp.c_fc.bias"]),
                  q + "mlp.w_down": f(hf[p + "mlp.c_proj.weight"].T), q + "mlp.b_down": f(hf[p + "mlp.c_proj.bias"])})
    return e


want = gpt2_expected(hf)
gpt2 = ["examples/gpt2.ntp", *dims, "--inputs", f"{tmp}/tok.npy"]
for name in ["gpt2", "gpt2_prefixed"]:
    out = run("run", *gpt2, "--params", f"{tmp}/{name}.safetensors", "--params-format", "hf-gpt2", "--dump", f"{tmp}/d_{name}")
    got = dump(f"{tmp}/d_{name}")
    bad = [k for k in want if k not in got or not np.array_equal(got[k], want[k])]
    check(not bad and len([k for k in got if "." in k]) == len(want), f"{name}: parameters differ from NumPy's conversion: {bad[:5]}")
logits = dump(f"{tmp}/d_gpt2")["logits"]
out = run("run", *gpt2, "--params", f"{tmp}/gpt2.safetensors", "--params-format", "hf-gpt2",
          "--plan", "examples/plans/gpt2_mixed8.ntp")
check("vs unsharded" in out and "MISMATCH" not in out, "sharded run on the hf-gpt2 file:\n" + out)
# written back in the layout, read again: the same bits
run("run", *gpt2, "--params", f"{tmp}/gpt2.safetensors", "--params-format", "hf-gpt2",
    "--save-params", f"{tmp}/back.safetensors", "--params-format", "hf-gpt2")
back = load_file(f"{tmp}/back.safetensors")
check(sorted(back) == sorted(k for k in hf), f"the written layout's names: {sorted(set(back) ^ set(hf))[:6]}")
same = all(np.array_equal(np.asarray(back[k], np.float32), bf16(hf[k].astype(np.float32))[:S] if k == "wpe.weight"
                          else bf16(hf[k].astype(np.float32))) for k in hf if k in back)
check(same, "the written hf-gpt2 file is not the read one (bf16-rounded)")
run("run", *gpt2, "--params", f"{tmp}/back.safetensors", "--params-format", "hf-gpt2", "--dump", f"{tmp}/d_back")
check(np.array_equal(dump(f"{tmp}/d_back")["logits"], logits), "the file written back gives other logits")
# ntpc train reads and writes the layout too: a byte-level GPT trained 2 steps, saved as hf-gpt2,
# read back by run (the same names as GPT-2's), and trained on from it
bg = ["examples/byte_gpt.ntp", "-D", "B=2", "-D", "S=16"]
ids = np.frombuffer(open("README.md", "rb").read(), dtype=np.uint8)
hdr = np.zeros(256, dtype="<i4")
hdr[:3] = [20240520, 1, len(ids)]
with open(f"{tmp}/t.bin", "wb") as f:
    f.write(hdr.tobytes() + ids.astype("<u2").tobytes())
run("train", *bg, "--data", f"{tmp}/t.bin", "--steps", "2", "-q", "--save-params", f"{tmp}/bg_hf.safetensors",
    "--params-format", "hf-gpt2")
check("h.0.attn.c_attn.weight" in load_file(f"{tmp}/bg_hf.safetensors"), "ntpc train did not write the hf-gpt2 layout")
out = run("train", *bg, "--data", f"{tmp}/t.bin", "--steps", "1", "-q", "--params", f"{tmp}/bg_hf.safetensors",
          "--params-format", "hf-gpt2")
check("step    1/1" in out, "ntpc train --params-format hf-gpt2:\n" + out)
# errors
bad = dict(hf)
del bad["h.1.mlp.c_fc.bias"]
save_file(bad, f"{tmp}/missing.safetensors")
out = run("run", *gpt2, "--params", f"{tmp}/missing.safetensors", "--params-format", "hf-gpt2", rc=1)
check("parameter 'blk.1.mlp.b_up' (h.1.mlp.c_fc.bias in the hf-gpt2 layout): is not in the file" in out, out)
bad = dict(hf)
bad["wpe.weight"] = w(8, D)
save_file(bad, f"{tmp}/short.safetensors")
out = run("run", *gpt2, "--params", f"{tmp}/short.safetensors", "--params-format", "hf-gpt2", rc=1)
check("the file's shape [8, 64] should be [16, 64] (or longer) for the model's [16, 64]" in out, out)
out = run("run", *gpt2, "--params", f"{tmp}/gpt2.safetensors", "--params-format", "hf-bert", rc=2)
check("--params-format expects ntp, hf-gpt2 or hf-llama, got 'hf-bert'" in out, out)

# ---- Llama --------------------------------------------------------------------------------------
KV, F = 2, 96  # 8 heads over 2 KV heads
ldims = ["-D", f"B={B}", "-D", f"S={S}", "-D", f"D={D}", "-D", f"H={H}", "-D", f"G={H // KV}", "-D", f"V={V}", "-D", f"L={L}",
         "-D", f"F={F}"]
hd = D // H
lh = {"model.embed_tokens.weight": w(V, D), "model.norm.weight": 1 + w(D), "lm_head.weight": w(V, D)}
for i in range(L):
    p = f"model.layers.{i}."
    lh.update({p + "input_layernorm.weight": 1 + w(D), p + "post_attention_layernorm.weight": 1 + w(D),
               p + "self_attn.q_proj.weight": w(D, D), p + "self_attn.k_proj.weight": w(KV * hd, D),
               p + "self_attn.v_proj.weight": w(KV * hd, D), p + "self_attn.o_proj.weight": w(D, D),
               p + "mlp.gate_proj.weight": w(F, D), p + "mlp.up_proj.weight": w(F, D), p + "mlp.down_proj.weight": w(D, F)})
save_file(lh, f"{tmp}/llama.safetensors")
tied = {k: v for k, v in lh.items() if k != "lm_head.weight"}
save_file(tied, f"{tmp}/llama_tied.safetensors")
names = {"embed.wte": "model.embed_tokens.weight", "norm.g": "model.norm.weight", "head.w": "lm_head.weight"}
for i in range(L):
    p, q = f"model.layers.{i}.", f"blk.{i}."
    names.update({q + "attn_norm.g": p + "input_layernorm.weight", q + "ffn_norm.g": p + "post_attention_layernorm.weight",
                  q + "attn.wq": p + "self_attn.q_proj.weight", q + "attn.wk": p + "self_attn.k_proj.weight",
                  q + "attn.wv": p + "self_attn.v_proj.weight", q + "attn.wo": p + "self_attn.o_proj.weight",
                  q + "ffn.w_gate": p + "mlp.gate_proj.weight", q + "ffn.w_up": p + "mlp.up_proj.weight",
                  q + "ffn.w_down": p + "mlp.down_proj.weight"})
llama = ["examples/llama3_8b.ntp", *ldims, "--inputs", f"{tmp}/tok.npy"]
for name, src in [("llama", lh), ("llama_tied", tied)]:
    run("run", *llama, "--params", f"{tmp}/{name}.safetensors", "--params-format", "hf-llama", "--dump", f"{tmp}/d_{name}")
    got = dump(f"{tmp}/d_{name}")
    srcname = lambda k: "model.embed_tokens.weight" if k == "head.w" and name == "llama_tied" else names[k]
    bad = [k for k in names if not np.array_equal(got[k], bf16(src[srcname(k)]))]
    check(not bad, f"{name}: parameters differ from the file's: {bad[:5]}")
out = run("run", *llama, "--params", f"{tmp}/llama.safetensors", "--params-format", "hf-llama", "--world", "8")
check("vs unsharded" in out and "MISMATCH" not in out, "sharded run on the hf-llama file:\n" + out)

# ---- against transformers, when installed (fp32 models on the same weights) ---------------------
try:
    import torch
    import transformers
except ImportError:
    torch = None
    print("hf_params.py: PyTorch or transformers not installed: the comparison with transformers is skipped")
if torch is not None:
    def fp32_model(src, dst):
        text = open(src).read().replace("dtype bf16;", "dtype fp32;")
        open(dst, "w").write(text)
        return dst
    g32 = fp32_model("examples/gpt2.ntp", f"{tmp}/gpt2_fp32.ntp")
    run("run", g32, *dims, "--inputs", f"{tmp}/tok.npy", "--params", f"{tmp}/gpt2.safetensors", "--params-format", "hf-gpt2",
        "--dump", f"{tmp}/d_g32")
    ours = dump(f"{tmp}/d_g32")["logits"]
    cfg = transformers.GPT2Config(vocab_size=V, n_positions=NPOS, n_embd=D, n_layer=L, n_head=H, activation_function="gelu_new",
                                  resid_pdrop=0, embd_pdrop=0, attn_pdrop=0, layer_norm_epsilon=1e-5)
    m = transformers.GPT2LMHeadModel(cfg).eval()
    sd = {("transformer." + k): torch.tensor(v.astype(np.float32)) for k, v in hf.items()}
    sd["lm_head.weight"] = sd["transformer.wte.weight"]
    missing, unexpected = m.load_state_dict(sd, strict=False)
    check(not unexpected and all("attn.bias" in k or "masked_bias" in k for k in missing), f"state dict: {missing} {unexpected}")
    with torch.no_grad():
        ref = m(torch.tensor(tokens)).logits.numpy()
    e = np.max(np.abs(ours - ref)) / np.max(np.abs(ref))
    print(f"GPT-2 logits against transformers {transformers.__version__}: max relative error {e:.2e}")
    check(e < 1e-4, f"GPT-2 logits differ from transformers': {e}")
    l32 = fp32_model("examples/llama3_8b.ntp", f"{tmp}/llama_fp32.ntp")
    run("run", l32, *ldims, "--inputs", f"{tmp}/tok.npy", "--params", f"{tmp}/llama.safetensors", "--params-format", "hf-llama",
        "--dump", f"{tmp}/d_l32")
    ours = dump(f"{tmp}/d_l32")["logits"]
    cfg = transformers.LlamaConfig(vocab_size=V, hidden_size=D, intermediate_size=F, num_hidden_layers=L, num_attention_heads=H,
                                   num_key_value_heads=KV, max_position_embeddings=NPOS, rms_norm_eps=1e-5, rope_theta=500000.0,
                                   tie_word_embeddings=False)
    m = transformers.LlamaForCausalLM(cfg).eval()
    m.load_state_dict({k: torch.tensor(v) for k, v in lh.items()}, strict=True)
    with torch.no_grad():
        ref = m(torch.tensor(tokens)).logits.numpy()
    e = np.max(np.abs(ours - ref)) / np.max(np.abs(ref))
    print(f"Llama logits against transformers {transformers.__version__}: max relative error {e:.2e}")
    check(e < 1e-4, f"Llama logits differ from transformers': {e}")

sys.exit(T.summary("hf_params.py", f"files written by {writer}; "))
