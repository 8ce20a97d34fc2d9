#!/usr/bin/env python3
"""docs_commands.py NTPC BUILD_DIR FILE.md... — run every command shown in the documentation.

The convention (docs/testing.md, "Commands in the documentation"):

- In a ```sh block every line is a command (blank lines and `# comment` lines are skipped; a
  line ending in `\\` continues on the next).
- In a block without a language, each line starting with `$ ` is a command; the lines after it,
  up to the next `$ `, are its documented output.
- A command exits 0 unless its trailing comment ends in `exit N` (`$ ntpc check nope.ntp   # exit 2`).
  For a command expected to fail, every documented output line (`…` lines aside) must appear in
  its output, in order; for the others, every documented line holding `error:` must appear.
- HTML comments directly above a block (one per line, no blank line between) change that:
    <!-- not run: REASON -->    the block is not run; counted and listed with its reason
    <!-- run if: SHELL-TEST --> run the block only when SHELL-TEST succeeds (else not run)
    <!-- file: NAME -->         the block is a file, written as NAME before the page's commands run
    <!-- output: exact -->      each command's output is exactly its documented lines, a `…` line
                                standing for any number of lines
- A block without a language whose lines look like commands but have no `$ ` is an error (fence
  it as ```sh, add `$ `, or mark it), and so is a `...`/`…` placeholder in a command.

Each page runs in a fresh temporary directory holding symbolic links to the source tree's top-level
entries and `build` -> BUILD_DIR, so relative paths work as from the repository root and files a
command writes stay in the temporary directory; `/tmp/` in a command (and in its documented output)
is that directory's `tmp/`. PATH starts with a directory holding `ntpc` (NTPC) and, with
--python PY, `python3` (PY). Variables a command assigns are kept for the page's later commands.

Exit status: 0 every command ran as documented, 1 a command failed or a page breaks the convention,
2 usage.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

FENCE = re.compile(r"^(\s*)```\s*([A-Za-z0-9_+-]*)\s*$")
DIRECTIVE = re.compile(r"^\s*<!--\s*(not run|run if|file|output)\s*:\s*(.*?)\s*-->\s*$")
EXIT = re.compile(r"#[^#]*\bexit (\d+)\s*$")
PLACEHOLDER = re.compile(r"(?<![.\w])\.\.\.(?![.\w])|…")
# a line a reader would paste: a known program first, perhaps after VAR=value assignments
COMMANDISH = re.compile(r"^\s*(?:[A-Z_][A-Z0-9_]*=\S*\s+)*(?:ntpc|build/\S+|\./\S+|tests/\S+|cc|gcc|clang|cmake|ctest|"
                        r"make|python3?|/usr/bin/python3|sh|bash|git|pkg-config|readelf|nm|ldd|ls|cat|cp|\$CC)(?:\s|$)")
TMP = re.compile(r"(?<![\w./-])/tmp/")
ELLIPSIS = {"…", "...", ""}
SHELL_LANGS = {"sh", "shell", "bash"}
TRANSCRIPT_LANGS = {"", "console"}


class Block:
    def __init__(self, path, line, lang, body, directives):
        self.path, self.line, self.lang, self.body, self.directives = path, line, lang, body, directives
        self.commands = []  # Command


class Command:
    def __init__(self, block, line, text):
        self.block, self.line, self.text = block, line, text
        self.output = []  # documented output lines (transcripts)

    @property
    def expect(self):  # the exit status: `# ... exit N` ending the command's last line, else 0
        m = EXIT.search(self.text.split("\n")[-1])
        return int(m.group(1)) if m else 0

    def where(self):
        return f"{self.block.path}:{self.line}"


def exact_mismatch(want, got):
    """None when got is want with each `…` line standing for any run of lines; else what differs."""
    while want and not want[-1]:
        want = want[:-1]
    while got and not got[-1]:
        got = got[:-1]
    memo = {}

    def match(i, j):  # want[i:] against got[j:]
        if (i, j) not in memo:
            if i == len(want):
                memo[i, j] = j == len(got)
            elif want[i].strip() in ("…", "..."):
                memo[i, j] = any(match(i + 1, k) for k in range(j, len(got) + 1))
            else:
                memo[i, j] = j < len(got) and want[i] == got[j] and match(i + 1, j + 1)
        return memo[i, j]

    sys.setrecursionlimit(max(10000, 4 * (len(want) + len(got))))
    if match(0, 0):
        return None
    # where it goes wrong, found greedily (for the message only)
    j, skip = 0, False
    for i, ln in enumerate(want):
        if ln.strip() in ("…", "..."):
            skip = True
            continue
        if skip:
            k = next((k for k in range(j, len(got)) if got[k] == ln), None)
            if k is None:
                return f"documented line {i + 1} is not in the output (after output line {j}): {ln!r}"
            j, skip = k + 1, False
        elif j < len(got) and got[j] == ln:
            j += 1
        else:
            return (f"output line {j + 1} differs from documented line {i + 1}: expected {ln!r}, "
                    f"got {got[j] if j < len(got) else '(end of output)'!r}")
    return f"output line {j + 1} is not documented: {got[j] if j < len(got) else ''!r}"


def parse(path):
    """The fenced blocks of a Markdown file, with the directives above each."""
    lines = open(path, encoding="utf-8").read().split("\n")
    blocks, errors, i = [], [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang, start = m.group(1), m.group(2), i
        j = i + 1
        while j < len(lines) and not re.match(r"^\s*```\s*$", lines[j]):
            j += 1
        if j == len(lines):
            errors.append(f"{path}:{start + 1}: unclosed ``` block")
            break
        body = [ln[len(indent):] if ln.startswith(indent) else ln.lstrip() for ln in lines[start + 1:j]]
        directives, k = [], start - 1
        while k >= 0 and DIRECTIVE.match(lines[k]):
            d = DIRECTIVE.match(lines[k])
            directives.insert(0, (d.group(1), d.group(2), k + 1))
            k -= 1
        blocks.append(Block(path, start + 1, lang, body, directives))
        i = j + 1
    return blocks, errors


def join_continued(numbered):
    """[(line_no, text)] -> [(first_line_no, text)] with backslash-continued lines joined."""
    out, cur, first = [], None, None
    for no, text in numbered:
        if cur is None:
            cur, first = text, no
        else:
            cur += "\n" + text
        if not text.endswith("\\"):
            out.append((first, cur))
            cur = None
    if cur is not None:
        out.append((first, cur))
    return out


def extract(block, errors):
    """Fill block.commands; report blocks that look like commands but follow no convention."""
    base = block.line + 1
    if block.lang in SHELL_LANGS:
        numbered = [(base + n, t) for n, t in enumerate(block.body)
                    if t.strip() and not t.lstrip().startswith("#")]
        for no, text in join_continued(numbered):
            block.commands.append(Command(block, no, text))
    elif block.lang in TRANSCRIPT_LANGS:
        cmd, cont = None, False
        for n, t in enumerate(block.body):
            if cont:
                cmd.text += "\n" + t
                cont = t.endswith("\\")
                continue
            if t.startswith("$ "):
                cmd = Command(block, base + n, t[2:])
                cont = t.endswith("\\")
                block.commands.append(cmd)
            elif cmd is not None:
                cmd.output.append(t.rstrip())
        if not block.commands and not any(k == "file" for k, _, _ in block.directives):
            marked = any(k == "not run" for k, _, _ in block.directives)
            for n, t in enumerate(block.body):
                if COMMANDISH.match(t) and marked:  # a synopsis or template: counted as not run
                    block.commands.append(Command(block, base + n, t))
                elif COMMANDISH.match(t):
                    errors.append(f"{block.path}:{base + n}: looks like a command but is not run: "
                                  f"fence the block as ```sh, start the line with '$ ', or mark the block "
                                  f"<!-- not run: REASON --> ({t.strip()})")
                    break


class Page:
    """One Markdown file's commands, run in order in one temporary directory."""

    def __init__(self, args, path):
        self.args, self.path = args, path
        self.ran = self.failed = self.broken = 0
        self.not_run = []  # (block, reason)
        self.files = []
        self.messages = []

    def setup(self, src):
        self.dir = tempfile.mkdtemp(prefix="ntp-docs.")
        for name in sorted(os.listdir(src)):
            if name == ".git" or name.startswith("build"):
                continue
            os.symlink(os.path.join(src, name), os.path.join(self.dir, name))
        os.symlink(os.path.abspath(self.args.build), os.path.join(self.dir, "build"))
        for d in ("bin", "tmp", "cache"):
            os.mkdir(os.path.join(self.dir, d))
        os.symlink(os.path.abspath(self.args.ntpc), os.path.join(self.dir, "bin", "ntpc"))
        if self.args.python:
            os.symlink(self.args.python, os.path.join(self.dir, "bin", "python3"))
        self.env = dict(os.environ)
        self.env.update(PATH=os.path.join(self.dir, "bin") + os.pathsep + os.environ.get("PATH", "/usr/bin:/bin"),
                        TMPDIR=os.path.join(self.dir, "tmp"), XDG_CACHE_HOME=os.path.join(self.dir, "cache"),
                        NTP_CACHE_DIR=os.path.join(self.dir, "cache", "ntp"), LC_ALL="C", NO_COLOR="1")
        self.env.pop("UPDATE_GOLDEN", None)
        self.state = os.path.join(self.dir, ".docs-shell-state")
        open(self.state, "w").close()

    def tmp(self, text):
        return TMP.sub(os.path.join(self.dir, "tmp") + "/", text)

    def sh(self, text, timeout):
        # `set -a` exports what a command assigns; the state file carries it to the next command
        script = f'set -a\n. "{self.state}"\n{text}\n__rc=$?\nexport -p >"{self.state}"\nexit $__rc\n'
        try:
            p = subprocess.run(["sh", "-c", script], cwd=self.dir, env=self.env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, timeout=timeout)
            return p.returncode, p.stdout.decode("utf-8", "replace")
        except subprocess.TimeoutExpired as e:
            return None, (e.stdout or b"").decode("utf-8", "replace")

    def fail(self, cmd, why, out):
        self.failed += 1
        shown = out.rstrip("\n").split("\n")[-25:] if out.strip() else ["(no output)"]
        self.messages.append(f"[FAIL] {cmd.where()}: {why}\n    $ {cmd.text}\n" +
                             "\n".join("    | " + ln for ln in shown))

    def check(self, cmd, rc, out):
        if rc is None:
            return f"timed out after {self.args.timeout} s"
        if rc != cmd.expect:
            return f"exit {rc}, expected {cmd.expect}"
        got = [ln.rstrip() for ln in self.tmp(out).split("\n")]
        want = [self.tmp(ln) for ln in cmd.output]
        if any(k == "output" for k, _, _ in cmd.block.directives):
            return exact_mismatch(want, got)
        if cmd.expect == 0:
            missing = [ln for ln in want if "error:" in ln and ln not in got]
            return f"documented line not in the output: {missing[0]}" if missing else None
        k = 0
        for ln in want:
            if ln.strip() in ELLIPSIS:
                continue
            while k < len(got) and got[k] != ln:
                k += 1
            if k == len(got):
                return f"documented line not in the output (in order): {ln}"
            k += 1
        return None

    def run(self, blocks):
        for b in blocks:
            for kind, value, line in b.directives:
                if kind == "file":
                    name = os.path.join(self.dir, value)
                    if value in self.files or os.path.lexists(name) or "/" in value:
                        self.messages.append(f"[FAIL] {self.path}:{line}: file '{value}' is defined twice, "
                                             f"clashes with the tree, or is not a plain name")
                        self.failed += 1
                        continue
                    with open(name, "w", encoding="utf-8") as f:
                        f.write("\n".join(b.body) + "\n")
                    self.files.append(value)
        for b in blocks:
            if not b.commands:
                continue
            kinds = {k: v for k, v, _ in b.directives}
            if kinds.get("output", "exact") != "exact":
                self.messages.append(f"[FAIL] {b.path}:{b.line}: unknown <!-- output: {kinds['output']} --> (exact)")
                self.failed += 1
                continue
            if "not run" in kinds:
                self.not_run.append((b, kinds["not run"]))
                continue
            if "run if" in kinds:
                rc, _ = self.sh(kinds["run if"], self.args.timeout)
                if rc != 0:
                    self.not_run.append((b, f"run if: {kinds['run if']} (false here)"))
                    continue
            for cmd in b.commands:
                if PLACEHOLDER.search(cmd.text):
                    self.fail(cmd, "a placeholder in a command: make it a real command or mark the block "
                              "<!-- not run: REASON -->", "")
                    continue
                known = next((why for pat, why in self.args.known_broken if pat in cmd.text), None)
                self.args.known_used.update(pat for pat, _ in self.args.known_broken if pat in cmd.text)
                t0 = time.monotonic()
                rc, out = self.sh(self.tmp(cmd.text), self.args.timeout)
                took = time.monotonic() - t0
                why = self.check(cmd, rc, out)
                self.ran += 1
                if self.args.verbose:
                    print(f"== {cmd.where()}: exit {rc} in {took:.2f} s: {cmd.text}")
                    if cmd.output:
                        print("\n".join("   doc| " + ln for ln in cmd.output))
                    print("\n".join("   got| " + ln for ln in out.rstrip("\n").split("\n")))
                if known is not None:
                    if why is None:
                        self.fail(cmd, "listed as known broken (--known-broken in tests/CMakeLists.txt) but "
                                  "it now works: remove it from the list", out)
                    else:
                        self.broken += 1
                        self.messages.append(f"[KNOWN BROKEN] {cmd.where()}: {known}\n    $ {cmd.text}\n    ({why})")
                    continue
                if why:
                    self.fail(cmd, why, out)
                elif took > self.args.slow:
                    self.messages.append(f"[SLOW] {cmd.where()}: {took:.1f} s: {cmd.text}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ntpc")
    ap.add_argument("build")
    ap.add_argument("pages", nargs="+")
    ap.add_argument("--python", help="a python3 with NumPy, first on PATH as python3")
    ap.add_argument("--known-broken", nargs=2, action="append", default=[], metavar=("TEXT", "REASON"),
                    help="a command containing TEXT is expected to fail for REASON (it fails the test once it works)")
    ap.add_argument("--timeout", type=float, default=60, help="seconds per command (default 60)")
    ap.add_argument("--slow", type=float, default=10, help="report commands slower than this (default 10 s)")
    ap.add_argument("--list", action="store_true", help="print the commands and what would run; run nothing")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directories")
    ap.add_argument("--verbose", action="store_true", help="print every command's output (and the documented one)")
    args = ap.parse_args()
    args.known_used = set()
    src = os.getcwd()
    total_failed = 0
    for path in args.pages:
        blocks, errors = parse(path)
        for b in blocks:
            extract(b, errors)
        if args.list:
            for b in blocks:
                kinds = {k: v for k, v, _ in b.directives}
                for c in b.commands:
                    tag = "not run" if "not run" in kinds else ("run if" if "run if" in kinds else "run")
                    print(f"{c.where()}: [{tag}] exit {c.expect}: {c.text}")
            for e in errors:
                print(e)
            continue
        page = Page(args, path)
        page.setup(src)
        t0 = time.monotonic()
        try:
            page.run(blocks)
        finally:
            if args.keep:
                print(f"{path}: kept {page.dir}")
            else:
                shutil.rmtree(page.dir, ignore_errors=True)
        for e in errors:
            page.messages.append("[FAIL] " + e)
            page.failed += 1
        for m in page.messages:
            print(m)
        n_not_run = sum(len(b.commands) for b, _ in page.not_run)
        for b, why in page.not_run:
            print(f"  not run: {b.path}:{b.line} ({len(b.commands)} command{'s' if len(b.commands) != 1 else ''}): {why}")
        print(f"{path}: {page.ran} commands run, {n_not_run} not run ({len(page.not_run)} blocks), "
              f"{len(page.files)} files written, {page.broken} known broken, {page.failed} failed, "
              f"{time.monotonic() - t0:.1f} s")
        total_failed += page.failed
    for pat, _ in args.known_broken:
        if not args.list and pat not in args.known_used:
            print(f"[FAIL] --known-broken '{pat}' matches no command of {' '.join(args.pages)}: remove it")
            total_failed += 1
    return 1 if total_failed else 0


if __name__ == "__main__":
    sys.exit(main())
