"""One Model from several threads (issue 24 item 5): every native call on a model holds its lock,
so concurrent forwards each get their own results, a training step beside a forward neither
crashes nor mixes them, and a close waits for the call in flight (later calls raise NtpError).
The crash-prone cases run in a child interpreter: a segfault there is a failure here, not the
end of pytest."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = """model t {
  dim B = 2, S = 8, D = 16, V = 32;
  input tokens : i32[B, S];
  input targets : i32[B, S];
  x = embed: embedding(tokens, vocab = V, dim = D, positions = S);
  x = x + mlp: mlp(x, hidden = 32, act = gelu);
  logits = head: linear(x, out = V);
  output loss = cross_entropy(logits, targets);
}"""


def child(body: str) -> subprocess.CompletedProcess:
    code = "import ntp, numpy as np, threading\nSRC = " + repr(SRC) + "\n" + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})


def test_two_forwards_on_one_model():
    p = child("""
        m = ntp.compile(SRC, world=2)
        rng = np.random.default_rng(1)
        batches = [(rng.integers(0, 32, (2, 8), dtype=np.int32), rng.integers(0, 32, (2, 8), dtype=np.int32))
                   for _ in range(2)]
        want = [m.forward(*b)["loss"].copy() for b in batches]
        wrong = [0, 0]
        def run(k):
            for _ in range(300):
                if not np.array_equal(m.forward(*batches[k])["loss"], want[k]):
                    wrong[k] += 1
        ts = [threading.Thread(target=run, args=(k,)) for k in range(2)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        print("wrong", sum(wrong), "of 600")
        assert sum(wrong) == 0
        """)
    assert p.returncode == 0, p.stdout + p.stderr


def test_forward_and_train_step_on_one_model():
    p = child("""
        m = ntp.compile(SRC, world=2, train=True)
        tok = np.arange(16, dtype=np.int32).reshape(2, 8) % 32
        def fwd():
            for _ in range(200):
                m.forward(tok, tok)
        def train():
            for _ in range(100):
                assert np.isfinite(m.train_step(tok, tok, lr=1e-3))
        ts = [threading.Thread(target=fwd), threading.Thread(target=train)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        print("ok")
        """)
    assert p.returncode == 0 and "ok" in p.stdout, p.stdout + p.stderr


def test_close_while_another_thread_runs():
    p = child("""
        m = ntp.compile(SRC, world=2)
        tok = np.zeros((2, 8), np.int32)
        seen = []
        def fwd():
            for _ in range(2000):
                try:
                    m.forward(tok, tok)
                except ntp.NtpError as e:
                    seen.append(str(e))
                    return
        t = threading.Thread(target=fwd)
        t.start()
        m.close()
        t.join()
        m.close()  # twice: nothing
        try:
            m.forward(tok, tok)
        except ntp.NtpError as e:
            print("after close:", e)
        print("ok", seen[:1])
        """)
    assert p.returncode == 0 and "ok" in p.stdout and "is closed" in p.stdout, p.stdout + p.stderr
