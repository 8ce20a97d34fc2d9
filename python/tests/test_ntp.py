"""The Python package against the command line (docs/python.md): a forward pass and training steps
equal `ntpc run` / `ntpc train`, tensors in and out as NumPy and (when installed) PyTorch, Hugging
Face checkpoints, the planner as objects, and errors as exceptions.

Run with the repository root as the working directory; NTPC names the ntpc binary (default
build/ntpc) and NTP_NATIVE_LIB the native library when the package is not installed."""
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ntp

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from ntpc_checks import dump  # noqa: E402  the --dump reader the command-line tests use
NTPC = os.environ.get("NTPC", str(ROOT / "build" / "ntpc"))
GPT2 = str(ROOT / "examples" / "gpt2.ntp")
BYTE_GPT = str(ROOT / "examples" / "byte_gpt.ntp")
MIXED8 = str(ROOT / "examples" / "plans" / "gpt2_mixed8.ntp")
TOY = {"B": 8, "S": 16, "D": 64, "H": 8, "V": 250, "L": 2}

try:
    import torch
except ImportError:
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed")


def ntpc(*args, cwd=None):
    p = subprocess.run([NTPC, *args], capture_output=True, text=True, cwd=cwd)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def dims(d):
    return [a for k, v in d.items() for a in ("-D", f"{k}={v}")]


@pytest.fixture(scope="module")
def tokens():
    return np.random.default_rng(1).integers(0, 250, size=(8, 16))


def test_describes_the_model():
    m = ntp.compile(GPT2, defines=TOY, plan=MIXED8)
    assert (m.name, m.world, m.backend) == ("gpt2", 8, "cpu")
    assert [(i.name, i.dtype, i.shape) for i in m.inputs] == [("tokens", "i32", (8, 16))]
    assert [(o.name, o.dtype, o.shape) for o in m.outputs] == [("logits", "bf16", (8, 16, 250))]
    assert ("embed.wte", "bf16", (250, 64)) in [(p.name, p.dtype, p.shape) for p in m.params]
    assert "blk.0.attn: attention, groups (5, 3)" in m.placements
    src = open(GPT2).read()
    assert ntp.compile(src, defines=TOY).name == "gpt2"  # from source text too


def test_forward_equals_ntpc_run(tmp_path, tokens):
    np.save(tmp_path / "tok.npy", tokens)
    ntpc("run", GPT2, *dims(TOY), "--plan", MIXED8, "--seed", "4", "--inputs", str(tmp_path / "tok.npy"),
         "--save-params", str(tmp_path / "p.safetensors"), "--dump", str(tmp_path / "d"))
    want = dump(tmp_path / "d")["logits"]
    m = ntp.compile(GPT2, defines=TOY, plan=MIXED8)
    m.load(tmp_path / "p.safetensors")
    out = m.forward(tokens)
    got = out["logits"]
    assert got.dtype.name == "bfloat16" and got.shape == (8, 16, 250)  # ml_dtypes bf16, never raw uint16
    # the 8 ranks against the CLI's unsharded reference: bf16 partial sums
    assert np.max(np.abs(got.astype(np.float32) - want)) <= 5e-2 * np.max(np.abs(want))
    # the same ranks as the CLI's sharded run: the same seed's parameters through the same program
    m2 = ntp.compile(GPT2, defines=TOY, plan=MIXED8, seed=4)
    assert np.array_equal(m2.forward(tokens)["logits"], got)
    assert np.array_equal(m.forward(tokens=tokens)["logits"], got)  # by name
    assert np.array_equal(m({"tokens": tokens.astype(np.int32)})["logits"], got)  # a dict, int32
    # a forward model's parameters read back from its ranks: the file's, and saved again the same
    cli = dump(tmp_path / "d")
    assert np.array_equal(m.get_param("blk.1.attn.wq").astype(np.float32), cli["blk.1.attn.wq"])
    assert np.array_equal(m2.get_param("embed.wte").astype(np.float32), cli["embed.wte"])  # the default init
    m2.save(tmp_path / "again.safetensors")
    m3 = ntp.compile(GPT2, defines=TOY)
    m3.load(tmp_path / "again.safetensors")
    assert np.max(np.abs(m3.forward(tokens)["logits"].astype(np.float32) - want)) <= 5e-2 * np.max(np.abs(want))


@needs_torch
def test_torch_in_torch_out(tokens):
    m = ntp.compile(GPT2, defines=TOY, plan=MIXED8, seed=2)
    a = m.forward(tokens)["logits"]
    t = m.forward(torch.tensor(tokens))["logits"]
    assert isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16
    assert torch.equal(t.float(), torch.tensor(a.astype(np.float32)))
    m.set_param("embed.wte", torch.zeros(250, 64, dtype=torch.bfloat16))
    assert not torch.equal(m.forward(torch.tensor(tokens))["logits"], t)


def token_file(path):
    """README.md's bytes as a token file (llm.c's format) at path; the ids."""
    ids = np.frombuffer((ROOT / "README.md").read_bytes(), dtype=np.uint8).astype(np.int64)
    hdr = np.zeros(256, dtype="<i4")
    hdr[:3] = [20240520, 1, len(ids)]
    path.write_bytes(hdr.tobytes() + ids.astype("<u2").tobytes())
    return ids


def test_init_schemes(tmp_path):
    """init= as ntpc train --init: the family's start by default (a byte GPT's first loss at ln 256),
    the model's own with "comparison" (ntpc train --init comparison's first loss), errors named."""
    ids = token_file(tmp_path / "t.bin")
    d = {"B": 2, "S": 32}
    tok, tgt = ids[:64].reshape(2, 32), ids[1:65].reshape(2, 32)
    first = ntp.compile(BYTE_GPT, defines=d, train=True).train_step(tok, tgt)
    assert abs(first - np.log(256)) < 0.5, first
    own = ntp.compile(BYTE_GPT, defines=d, train=True, init="comparison").train_step(tok, tgt)
    out = ntpc("train", BYTE_GPT, *dims(d), "--data", str(tmp_path / "t.bin"), "--steps", "1", "-q",
               "--init", "comparison")
    want = float(re.findall(r"step\s+1/1\s+loss (\S+)", out)[0])
    assert own > 10 and abs(own - want) <= 1e-5 * want, (own, want)
    with pytest.raises(ValueError, match="no initialisation 'xavier'"):
        ntp.compile(BYTE_GPT, defines=d, train=True, init="xavier")
    with pytest.raises(ValueError, match="needs train=True"):
        ntp.compile(BYTE_GPT, defines=d, init="gpt2")
    with pytest.raises(ValueError, match="init_std"):
        ntp.compile(BYTE_GPT, defines=d, train=True, init_std=0)


def test_train_steps_equal_ntpc_train(tmp_path):
    ids = token_file(tmp_path / "t.bin")
    d = {"B": 2, "S": 32}
    out = ntpc("train", BYTE_GPT, *dims(d), "--data", str(tmp_path / "t.bin"), "--steps", "3", "--lr", "1e-3",
               "--warmup", "0", "--min-lr-frac", "1", "-q")  # both from the model family's start (gpt2)
    want = [float(x) for x in re.findall(r"step\s+\d+/3\s+loss (\S+)", out)]
    m = ntp.compile(BYTE_GPT, defines=d, train=True)
    n = 2 * 32
    losses = [m.train_step(ids[k * n:(k + 1) * n].reshape(2, 32), ids[k * n + 1:(k + 1) * n + 1].reshape(2, 32),
                           lr=1e-3) for k in range(3)]
    assert len(want) == 3 and np.allclose(losses, want, rtol=1e-5), (losses, want)
    m.save(tmp_path / "trained.safetensors")
    m2 = ntp.compile(BYTE_GPT, defines=d, train=True)
    m2.load(tmp_path / "trained.safetensors")
    assert np.array_equal(m2.get_param("blk.0.attn.wq"), m.get_param("blk.0.attn.wq"))


def test_pipeline_train_steps_equal_unsharded():
    """A plan with stages and micro-batches (docs/pipeline.md) trains as the unsharded model does."""
    plan = ROOT / "tests" / "plans" / "byte_gpt_pp2.ntp"
    d = {"B": 4, "S": 16, "D": 64, "H": 8}
    tok = np.random.default_rng(3).integers(0, 256, size=(3, 4, 17))
    whole = ntp.compile(BYTE_GPT, defines=d, train=True)
    want = [whole.train_step(tok[k, :, :16], tok[k, :, 1:], lr=1e-3) for k in range(3)]
    for schedule in ("1f1b", "gpipe", "zb-h1"):
        piped = ntp.compile(BYTE_GPT, defines=d, train=True, plan=plan, micro_batches=4, schedule=schedule)
        assert piped.world == 4
        got = [piped.train_step(tok[k, :, :16], tok[k, :, 1:], lr=1e-3) for k in range(3)]
        assert np.allclose(got, want, rtol=1e-5), (schedule, got, want)
    with pytest.raises(ntp.NtpError, match="multiple"):
        ntp.compile(BYTE_GPT, defines=d, train=True, plan=plan, micro_batches=3, schedule="interleaved")
    with pytest.raises(ValueError, match="no schedule"):
        ntp.compile(BYTE_GPT, defines=d, train=True, plan=plan, micro_batches=2, schedule="pipedream")
    with pytest.raises(ValueError, match="micro_batches"):
        ntp.compile(BYTE_GPT, defines=d, train=True, plan=plan, micro_batches=0)


def test_distributed_optimizer_train_steps_equal_unsharded():
    """ZeRO-1/2 with redundant shards (docs/training.md#the-distributed-optimizer): the plan's line or
    the keywords over it train as the unsharded model does; bad values and a forward are refused."""
    plan = ROOT / "tests" / "plans" / "byte_gpt_zero2_43.ntp"
    d = {"B": 4, "S": 16, "D": 64, "H": 8}
    tok = np.random.default_rng(4).integers(0, 256, size=(3, 4, 17))
    whole = ntp.compile(BYTE_GPT, defines=d, train=True)
    want = [whole.train_step(tok[k, :, :16], tok[k, :, 1:], lr=1e-3) for k in range(3)]
    for kw in ({}, {"zero": 1}, {"zero": 2, "redundancy": 1, "domain_size": 4}, {"redundancy": 3}):
        m = ntp.compile(BYTE_GPT, defines=d, train=True, plan=plan, **kw)
        got = [m.train_step(tok[k, :, :16], tok[k, :, 1:], lr=1e-3) for k in range(3)]
        assert np.allclose(got, want, rtol=1e-5), (kw, got, want)
        assert np.allclose(m.get_param("blk.0.attn.wq"), whole.get_param("blk.0.attn.wq"), rtol=1e-4, atol=1e-6), kw
    with pytest.raises(ValueError, match="zero"):
        ntp.compile(BYTE_GPT, defines=d, train=True, plan=plan, zero=3)
    with pytest.raises(ValueError, match="redundancy"):
        ntp.compile(BYTE_GPT, defines=d, train=True, plan=plan, zero=0, redundancy=2)
    with pytest.raises(ValueError, match="needs train=True"):
        ntp.compile(BYTE_GPT, defines=d, plan=plan, zero=1)


def test_hugging_face_layout(tmp_path, tokens):
    rng = np.random.default_rng(5)
    D, V, L = 64, 250, 2
    w = lambda *s: (rng.standard_normal(s) * 0.05).astype(np.float32)
    hf = {"wte.weight": w(V, D), "wpe.weight": w(32, D), "ln_f.weight": 1 + w(D), "ln_f.bias": w(D)}
    for i in range(L):
        p = f"h.{i}."
        hf.update({p + "ln_1.weight": 1 + w(D), p + "ln_1.bias": w(D), p + "ln_2.weight": 1 + w(D),
                   p + "ln_2.bias": w(D), p + "attn.c_attn.weight": w(D, 3 * D), p + "attn.c_attn.bias": w(3 * D),
                   p + "attn.c_proj.weight": w(D, D), p + "attn.c_proj.bias": w(D), p + "mlp.c_fc.weight": w(D, 4 * D),
                   p + "mlp.c_fc.bias": w(4 * D), p + "mlp.c_proj.weight": w(4 * D, D), p + "mlp.c_proj.bias": w(D)})
    try:
        from safetensors.numpy import save_file
    except ImportError:
        pytest.skip("the safetensors package is not installed (tests/hf_params.py covers the layout without it)")
    save_file(hf, str(tmp_path / "hf.safetensors"))
    np.save(tmp_path / "tok.npy", tokens)
    ntpc("run", GPT2, *dims(TOY), "--params", str(tmp_path / "hf.safetensors"), "--params-format", "hf-gpt2",
         "--inputs", str(tmp_path / "tok.npy"), "--dump", str(tmp_path / "d"))
    m = ntp.compile(GPT2, defines=TOY)
    m.load(tmp_path / "hf.safetensors", format="hf-gpt2")
    assert np.array_equal(m.forward(tokens)["logits"].astype(np.float32), dump(tmp_path / "d")["logits"])


def test_plan_as_objects(tmp_path):
    p = ntp.plan(str(ROOT / "examples" / "gpt3_175b.ntp"), 8, gpu="h200")
    assert p.feasible and p.world == 8 and p.step_s > 0 and p.mem_peak <= p.mem_cap
    assert len(p.layers) == 2 + 2 * 96 and p.layers[1].name == "blk.0.attn"
    assert sum(p.layers[1].groups) == 8
    out = ntpc("plan", str(ROOT / "examples" / "gpt3_175b.ntp"), "--world", "8", "--gpu", "h200", "-o",
               str(tmp_path / "p.ntp"), "--svg", str(tmp_path / "p.svg"))
    tps = float(re.search(r"; (\d+) tokens/s", out).group(1))
    assert abs(p.tokens_per_s - tps) <= 1
    q = ntp.plan(str(ROOT / "examples" / "gpt3_175b.ntp"), 8, gpu="h200", mem_cap_gib=1)
    assert not q.feasible and "does not fit" in q.why


def test_errors_are_exceptions(tmp_path, tokens):
    with pytest.raises(ntp.NtpError) as e:
        ntp.compile("model x {\n  input a : fp32[4];\n  output y = a + b + c;\n}\n")
    assert len(e.value.diagnostics) == 2
    d = e.value.diagnostics[0]
    assert (d.severity, d.line, d.col, d.message) == ("error", 3, 18, "unknown name 'b'")
    assert "  3 |   output y = a + b + c;" in str(e.value) and "^" in str(e.value)
    with pytest.raises(FileNotFoundError, match="cannot open"):
        ntp.compile(str(tmp_path / "nope.ntp"))
    with pytest.raises(ntp.NtpError, match="model 'gpt2' has no dim 'NOPE'"):
        ntp.compile(GPT2, defines={"NOPE": 3})
    m = ntp.compile(GPT2, defines=TOY)
    with pytest.raises(ValueError, match=r"shape \(2, 16\) for shape \(8, 16\)"):
        m.forward(tokens[:2])
    with pytest.raises(TypeError, match="integer ids"):
        m.forward(tokens.astype(np.float32))
    with pytest.raises(TypeError, match="no input 'tokenz'"):
        m.forward(tokenz=tokens)
    with pytest.raises(ntp.NtpError, match="is not in the file|cannot open"):
        m.load(tmp_path / "missing.safetensors")
    with pytest.raises(ntp.NtpError, match="outside"):  # token ids beyond the vocabulary
        m.forward(np.full((8, 16), 9999))
