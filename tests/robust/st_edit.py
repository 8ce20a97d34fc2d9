"""st_edit.py IN OUT EDIT... — a safetensors file with some tensors changed, for the robust cases
(no safetensors package needed). Each EDIT is one of
  NAME=DTYPE:D0xD1x...   replace (or add) NAME: that dtype and shape, random bytes as data
  NAME=:D0xD1x...        the same dtype as before, another shape
  -NAME                  remove NAME
"""
import json
import random
import struct
import sys

SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4,
         "F64": 8, "I64": 8, "U64": 8}


def read(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    meta = header.pop("__metadata__", None)
    ts = {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in header.items()}
    return ts, meta


def write(path, ts, meta):
    header, blob, off = {}, b"", 0
    for k, (dt, shape, data) in ts.items():
        header[k] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(data)]}
        blob += data
        off += len(data)
    if meta is not None:
        header["__metadata__"] = meta
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    open(path, "wb").write(struct.pack("<Q", len(text)) + text + blob)


def main():
    ts, meta = read(sys.argv[1])
    rng = random.Random(7)
    for edit in sys.argv[3:]:
        if edit.startswith("-"):
            del ts[edit[1:]]
            continue
        name, spec = edit.split("=", 1)
        dt, dims = spec.split(":", 1)
        dt = dt or ts[name][0]
        shape = [int(d) for d in dims.split("x")] if dims else []
        count = 1
        for d in shape:
            count *= d
        if dt.startswith("F") or dt == "BF16":  # small finite values, whatever the float format
            data = b"".join(struct.pack("<f", rng.uniform(-1, 1)) for _ in range(count))
            if dt == "F64":
                data = b"".join(struct.pack("<d", rng.uniform(-1, 1)) for _ in range(count))
            elif dt != "F32":
                data = b"".join(data[i + 2:i + 4] for i in range(0, len(data), 4))  # bf16: the high half
        else:
            data = bytes(rng.randrange(2) for _ in range(count * SIZES[dt]))
        ts[name] = (dt, shape, data)
    write(sys.argv[2], ts, meta)


main()
