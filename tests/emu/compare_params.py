"""compare_params.py A.safetensors B.safetensors TOL [FLOOR] — every tensor of B against the same
tensor of A (the reference): max |a - b| / max(max |a|, FLOOR) per tensor, the worst printed; exit 1
above TOL. The floor (default 1e-2): a tensor still near zero after a few steps (a bias that started
at 0 and moves with round-off, as the key bias does: softmax does not see it) is compared at the
parameters' scale."""
import json
import struct
import sys

import numpy as np


def read(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    body = data[8 + n :]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        lo, hi = t["data_offsets"]
        raw = body[lo:hi]
        if t["dtype"] == "F32":
            a = np.frombuffer(raw, dtype="<f4")
        elif t["dtype"] in ("BF16", "F16"):
            u = np.frombuffer(raw, dtype="<u2")
            a = (u.astype(np.uint32) << 16).view(np.float32) if t["dtype"] == "BF16" else u.view(np.float16)
        else:
            continue
        out[name] = a.astype(np.float64).reshape(t["shape"])
    return out


def main():
    ref, got, tol = read(sys.argv[1]), read(sys.argv[2]), float(sys.argv[3])
    floor = float(sys.argv[4]) if len(sys.argv) > 4 else 1e-2
    if sorted(ref) != sorted(got):
        print("compare_params: the files hold different tensors")
        return 1
    worst, wname = 0.0, ""
    for name, a in ref.items():
        b = got[name]
        if a.shape != b.shape:
            print(f"compare_params: {name}: shape {b.shape}, expected {a.shape}")
            return 1
        e = float(np.max(np.abs(a - b))) / max(float(np.max(np.abs(a))), floor) if a.size else 0.0
        if e > worst or not np.isfinite(e):
            worst, wname = e, name
    ok = worst <= tol
    print(f"{len(ref)} parameters, worst {wname}: max relative error {worst:.3g} (tolerance {tol:g}) {'ok' if ok else 'MISMATCH'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
