#!/usr/bin/env python3
"""inputs.py NTPC — `ntpc run --inputs` and `--text` (docs/cli.md#real-inputs), checked with NumPy.

- float inputs from .npy (float32, float64, float16; big-endian too) are the run's inputs
  exactly (as --dump writes them), and its output is x @ w^T recomputed here from them;
- token ids from .npy (int64, big-endian int16), an llm.c token file, a text file and --text
  give the same tokens (and the targets, each token's successor): the dumped inputs equal the
  ids NumPy computes, and the loss of `run --train` equals the first loss of `ntpc train` on
  the same file;
- a sharded run is handed the same inputs (vs unsharded: ok, and its loss is the given-input
  one, not the default initialisation's);
- errors: ids out of the vocabulary, wrong shapes, floats for ids, unknown input names, two
  arrays for one input, an unnamed .npy for a model with two inputs, text too short, a file
  that is no .npy, a Fortran-order array; each an exit status 1 with a message, no crash.
Exit status 0, 1 a check failed, 77 without NumPy.
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ntpc_checks import dump, start  # noqa: E402

np, T, tmp = start("inputs.py")
ntpc, check, run = T.ntpc, T.check, T.run


def loss_of(text):
    m = re.search(r"output loss : fp32\[\]\s+sum=(\S+)", text)
    return float(m.group(1)) if m else None


# ---- float inputs: the linear model of the numeric tests (y = x w^T, y2 = x2 w2^T) -----------
lin = "tests/numeric/linear.ntp"
rng = np.random.default_rng(7)
x = rng.standard_normal((2, 5, 24)).astype(np.float32)
x2 = rng.standard_normal((5, 24))
np.save(f"{tmp}/x.npy", x)
np.save(f"{tmp}/x2.npy", x2.astype(">f8"))  # big-endian float64
run("run", lin, "--inputs", f"x={tmp}/x.npy", "--inputs", f"x2={tmp}/x2.npy", "--dump", f"{tmp}/d1")
d = dump(f"{tmp}/d1")
check(np.array_equal(d["x"], x), "the float32 input is not the array given")
check(np.array_equal(d["x2"], x2.astype(np.float32)), "the big-endian float64 input is not the array given")
y = d["x"].astype(np.float64) @ d["proj.w"].astype(np.float64).T
check(np.max(np.abs(d["y"] - y)) <= 1e-4 * np.max(np.abs(y)), "y is not x w^T for the given x")
np.save(f"{tmp}/xh.npy", x.astype(np.float16))
run("run", lin, "--inputs", f"x={tmp}/xh.npy", "--dump", f"{tmp}/d2")
check(np.array_equal(dump(f"{tmp}/d2")["x"], x.astype(np.float16).astype(np.float32)), "float16 input not read exactly")

# ---- token ids: byte_gpt (tokens and targets), B=2, S=32 -------------------------------------
gpt = ["examples/byte_gpt.ntp", "-D", "B=2", "-D", "S=32"]
text = open("README.md", "rb").read()
ids = np.frombuffer(text, dtype=np.uint8).astype(np.int64)
tok, tgt = ids[:64].reshape(2, 32), ids[1:65].reshape(2, 32)
np.save(f"{tmp}/tok.npy", tok)
np.save(f"{tmp}/tgt.npy", tgt.astype(">i2"))
# llm.c token file: 256 int32 header (magic 20240520, version 1, count), uint16 ids
hdr = np.zeros(256, dtype="<i4")
hdr[:3] = [20240520, 1, len(ids)]
with open(f"{tmp}/t.bin", "wb") as f:
    f.write(hdr.tobytes())
    f.write(ids.astype("<u2").tobytes())
with open(f"{tmp}/t.txt", "wb") as f:
    f.write(text[:65])
losses = {}
for name, args in [("npy", ["--inputs", f"tokens={tmp}/tok.npy", "--inputs", f"targets={tmp}/tgt.npy"]),
                   ("bin", ["--inputs", f"{tmp}/t.bin"]), ("txt", ["--inputs", f"{tmp}/t.txt"]),
                   ("text", ["--text", text[:65].decode()])]:
    out = run("run", *gpt, *args, "--dump", f"{tmp}/d_{name}")
    d = dump(f"{tmp}/d_{name}")
    check(np.array_equal(d["tokens"], tok) and np.array_equal(d["targets"], tgt), f"{name}: not the ids given")
    losses[name] = loss_of(out)
check(len(set(losses.values())) == 1, f"the same ids gave other losses: {losses}")
default = loss_of(run("run", *gpt))
check(default != losses["npy"], "the given ids gave the default initialisation's loss")
tr = run("train", *gpt, "--data", f"{tmp}/t.bin", "--steps", "1", "-q", "--init", "comparison")  # run's start
m = re.search(r"step\s+1/1\s+loss (\S+)", tr)
check(m and abs(float(m.group(1)) - losses["bin"]) <= 1e-5 * abs(losses["bin"]),
      f"run --inputs's loss {losses['bin']} is not ntpc train's first loss on the file:\n{tr}")
out = run("run", *gpt, "--inputs", f"{tmp}/t.bin", "--world", "2")
check("vs unsharded: max relative error" in out and "MISMATCH" not in out, "sharded run with inputs:\n" + out)
check(loss_of(out) == losses["bin"], "the sharded run's unsharded loss is not the given-input one")
out = run("run", *gpt, "--train", "--inputs", f"{tmp}/t.bin", "--plan", "examples/plans/byte_gpt_7.ntp",
          "-D", "B=4", "-D", "S=32", "-D", "D=64")
check(out.count(" ok") >= 3 and "MISMATCH" not in out, "training step at 7 ranks with given inputs:\n" + out)

# ---- errors ---------------------------------------------------------------------------------
def err(args, text):
    out = run(*args, rc=1)
    check(text in out, f"ntpc {' '.join(args)}: no '{text}' in\n{out}")


np.save(f"{tmp}/big.npy", np.full((2, 32), 256))
err(["run", *gpt, "--inputs", f"tokens={tmp}/big.npy", "--inputs", f"targets={tmp}/tgt.npy"],
    "element 0 is 256, outside input 'tokens''s vocabulary [0, 256)")
np.save(f"{tmp}/neg.npy", np.full((2, 32), -1))
err(["run", *gpt, "--inputs", f"tokens={tmp}/neg.npy"], "element 0 is -1, outside input 'tokens''s vocabulary")
run("run", *gpt, "--inputs", f"targets={tmp}/neg.npy")  # -1: the loss's ignore index, allowed
np.save(f"{tmp}/shape.npy", np.zeros((3, 32), dtype=np.int32))
err(["run", *gpt, "--inputs", f"tokens={tmp}/shape.npy"], "an array of shape [3, 32] for input 'tokens' of shape [2, 32]")
np.save(f"{tmp}/f.npy", np.zeros((2, 32), dtype=np.float32))
err(["run", *gpt, "--inputs", f"tokens={tmp}/f.npy"], "floats for input 'tokens', which takes integer ids")
err(["run", *gpt, "--inputs", f"tokenz={tmp}/tok.npy"], "'tokenz' is not an input of model byte_gpt (its inputs: tokens, targets)")
err(["run", *gpt, "--inputs", f"tokens={tmp}/tok.npy", "--inputs", f"tokens={tmp}/tok.npy"], "input 'tokens' is given twice")
err(["run", *gpt, "--inputs", f"{tmp}/tok.npy"], "model byte_gpt has 2 inputs: name the one")
err(["run", *gpt, "--text", "too short"], "the text holds 9 ids; input 'tokens' [2, 32] needs 65")
with open(f"{tmp}/no.npy", "wb") as f:
    f.write(b"not numpy at all")
err(["run", *gpt, "--inputs", f"tokens={tmp}/no.npy"], "not a NumPy .npy file")
np.save(f"{tmp}/fo.npy", np.asfortranarray(np.zeros((2, 32), dtype=np.int32)))
err(["run", *gpt, "--inputs", f"tokens={tmp}/fo.npy"], "a Fortran-order array")
err(["run", *gpt, "--inputs", f"{tmp}/missing.bin"], "cannot open token file")

sys.exit(T.summary("inputs.py"))
