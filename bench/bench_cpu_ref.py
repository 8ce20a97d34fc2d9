#!/usr/bin/env python3
"""bench_cpu_ref.py — the reference side of bench/bench_cpu (which runs it as a child).

  bench_cpu_ref.py serve                  what bench_cpu runs: commands on stdin (see serve())
  bench_cpu_ref.py gemm FILE REPEATS      NumPy matmul on the shapes in FILE; prints gemm_seconds=
  bench_cpu_ref.py torch MODEL B S L REPEATS
                                          transformers' MODEL (gpt2 | llama) with the configuration
                                          of examples/MODEL*.ntp at L blocks, fp32, eager, random
                                          weights (nothing is downloaded); prints torch_seconds=

FILE has one line per GEMM shape: batch m k n trans_b shared_b count (as bench_cpu writes it);
gemm_seconds is the sum over shapes of count times the median time of one product. Lines that
start with 'info: ' describe the BLAS (threadpoolctl) or the torch build. Exit 77 when NumPy, or
torch and transformers, cannot be imported.
"""
import statistics
import sys
import time


def blas_info():
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "threadpoolctl not installed: BLAS unknown"
    parts = []
    for p in threadpool_info():
        parts.append("%s %s %s, %s threads, kernel %s" % (p.get("internal_api"), p.get("version"),
                                                         p.get("threading_layer", ""), p.get("num_threads"),
                                                         p.get("architecture", "?")))
    return "; ".join(parts) or "no BLAS found by threadpoolctl"


def gemm(path, repeats):
    try:
        import numpy as np
    except ImportError:
        return 77
    rng = np.random.default_rng(0)
    total = 0.0
    with open(path) as f:
        shapes = [tuple(int(x) for x in line.split()) for line in f if line.strip()]
    for batch, m, k, n, trans_b, shared_b, count in shapes:
        a = rng.uniform(-1, 1, (batch, m, k) if batch > 1 else (m, k)).astype(np.float32)
        nb = 1 if shared_b else batch
        bshape = (n, k) if trans_b else (k, n)
        b = rng.uniform(-1, 1, ((nb,) + bshape) if nb > 1 else bshape).astype(np.float32)
        bb = np.swapaxes(b, -1, -2) if trans_b else b  # a view: NumPy hands BLAS the transposed layout
        out = np.matmul(a, bb)  # warm-up, and the output buffer
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            np.matmul(a, bb, out=out)
            times.append(time.perf_counter() - t0)
        total += count * statistics.median(times)
    print("info: numpy %s, %s" % (np.__version__, blas_info()))
    print("gemm_seconds=%.9f" % total)
    return 0


def torch_model(model, B, S, L, repeats):
    try:
        import torch
        net, ids = build_torch(model, B, S, L)
    except ImportError:
        return 77
    times = []
    with torch.inference_mode():
        net(ids, use_cache=False)  # warm-up
        for _ in range(repeats):
            t0 = time.perf_counter()
            net(ids, use_cache=False)
            times.append(time.perf_counter() - t0)
    print("torch_seconds=%.9f" % statistics.median(times))
    return 0


def serve():
    """Commands on stdin, one answer line each (see bench_cpu.c): 'gemm B M K N TB SB' then 'mm [N]'
    (N products back to back, default 1: t=SECONDS, the mean of one); 'torch MODEL B S L' then 'fwd' (one forward: t=SECONDS); 'free';
    'quit'. 'skip' answers what cannot be imported."""
    state = {}
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        try:
            if cmd[0] == "gemm":
                import numpy as np
                batch, m, k, n, trans_b, shared_b = (int(x) for x in cmd[1:7])
                rng = np.random.default_rng(0)
                a = rng.uniform(-1, 1, (batch, m, k) if batch > 1 else (m, k)).astype(np.float32)
                nb = 1 if shared_b else batch
                bshape = (n, k) if trans_b else (k, n)
                b = rng.uniform(-1, 1, ((nb,) + bshape) if nb > 1 else bshape).astype(np.float32)
                bb = np.swapaxes(b, -1, -2) if trans_b else b  # a view: BLAS gets the transposed layout
                out = np.matmul(a, bb)  # warm-up, and the output buffer
                state["mm"] = lambda: np.matmul(a, bb, out=out)
                if "numpy_info" not in state:
                    state["numpy_info"] = True
                    print("info: numpy %s, %s" % (np.__version__, blas_info()))
                print("ok")
            elif cmd[0] == "torch":
                net, ids = build_torch(cmd[1], int(cmd[2]), int(cmd[3]), int(cmd[4]))
                import torch
                def fwd():
                    with torch.inference_mode():
                        net(ids, use_cache=False)
                fwd()  # warm-up
                state["fwd"] = fwd
                print("ok")
            elif cmd[0] in ("mm", "fwd"):
                calls = int(cmd[1]) if len(cmd) > 1 else 1  # 'mm N': N products back to back, the mean
                t0 = time.perf_counter()
                for _ in range(calls):
                    state[cmd[0]]()
                print("t=%.9f" % ((time.perf_counter() - t0) / calls))
            elif cmd[0] == "free":
                state.pop("fwd", None)
                state.pop("mm", None)
                import gc
                gc.collect()
                print("ok")
            else:
                print("error: unknown command %s" % cmd[0])
        except ImportError:
            print("skip")
        except Exception as e:  # the C side prints it and drops the column
            print("error: %s" % str(e).replace("\n", " "))
        sys.stdout.flush()
    return 0


def build_torch(model, B, S, L):
    import torch
    import transformers
    torch.manual_seed(0)
    if model == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=L, n_head=12)
        net, vocab = transformers.GPT2LMHeadModel(cfg), 50257
    else:
        cfg = transformers.LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                                       num_hidden_layers=L, num_attention_heads=32, num_key_value_heads=8,
                                       rope_theta=500000.0, max_position_embeddings=8192, tie_word_embeddings=False,
                                       rms_norm_eps=1e-5)
        net, vocab = transformers.LlamaForCausalLM(cfg), 128256
    net = net.float().eval()
    print("info: torch %s (%d threads), transformers %s, attention %s" %
          (torch.__version__, torch.get_num_threads(), transformers.__version__,
           getattr(net.config, "_attn_implementation", "?")))
    return net, torch.randint(0, vocab, (B, S))


def main(argv):
    if len(argv) == 2 and argv[1] == "serve":
        return serve()
    if len(argv) == 4 and argv[1] == "gemm":
        return gemm(argv[2], int(argv[3]))
    if len(argv) == 7 and argv[1] == "torch":
        return torch_model(argv[2], int(argv[3]), int(argv[4]), int(argv[5]), int(argv[6]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
