#!/usr/bin/env python3
"""Plot the loss curve of `ntpc train` output as an SVG (standard library only).

usage: plot_loss.py LOG.txt OUT.svg [--title TEXT] [--label TEXT] [--ref VALUE LABEL]
                    [--also LOG2.txt LABEL] [--mark STEP LABEL]

LOG.txt is what `ntpc train` printed (its `step N/M  loss X ...` lines; a step taken twice, after
a run went back to a checkpoint, counts with its last loss); the plot shows the loss per step and,
with --ref, a horizontal line (for instance ln 256 = 5.545 for a byte-level model: the loss of a
uniform guess), with --also another run's curve (dashed, over the first), with --mark a vertical
line at a step (a failure)."""
import math
import re
import sys


def read(log):
    """the steps' losses of an `ntpc train` log, each step's last"""
    last = {}
    for m in re.finditer(r"^step +(\d+)/\d+ +loss ([0-9.]+)", open(log).read(), re.M):
        last[int(m.group(1))] = float(m.group(2))
    if not last:
        sys.exit("plot_loss.py: no 'step N/M  loss X' lines in " + log)
    return sorted(last.items())


def main():
    a = sys.argv[1:]
    if len(a) < 2:
        sys.exit(__doc__)
    log, out, title, label, refs, also, marks = a[0], a[1], "ntpc train", None, [], [], []
    i = 2
    try:
        while i < len(a):
            if a[i] == "--title":
                title, i = a[i + 1], i + 2
            elif a[i] == "--label":
                label, i = a[i + 1], i + 2
            elif a[i] == "--ref":
                refs.append((float(a[i + 1]), a[i + 2]))
                i += 3
            elif a[i] == "--also":
                also.append((read(a[i + 1]), a[i + 2]))
                i += 3
            elif a[i] == "--mark":
                marks.append((int(a[i + 1]), a[i + 2]))
                i += 3
            else:
                sys.exit(__doc__)
    except IndexError:
        sys.exit(__doc__)
    pts = read(log)
    W, H, L, R, T, B = 720, 420, 60, 20, 40, 50
    xs = [p[0] for p in pts] + [p[0] for c, _ in also for p in c]
    ys = [p[1] for p in pts] + [r[0] for r in refs] + [p[1] for c, _ in also for p in c]
    x0, x1 = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1
    y0, y1 = 0.0, min(max(ys), 3 * sorted(ys)[len(ys) // 2]) * 1.05  # clip the first steps' spike
    sx = lambda x: L + (x - x0) / (x1 - x0) * (W - L - R)
    sy = lambda y: T + (1 - (min(y, y1) - y0) / (y1 - y0)) * (H - T - B)
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="14">{title}</text>']
    step = 10 ** math.floor(math.log10(max(y1 / 5, 1e-9)))
    y = 0.0
    while y <= y1:
        o.append(f'<line x1="{L}" y1="{sy(y):.1f}" x2="{W - R}" y2="{sy(y):.1f}" stroke="#ddd"/>')
        o.append(f'<text x="{L - 6}" y="{sy(y) + 4:.1f}" text-anchor="end">{y:g}</text>')
        y += step if y1 / step < 12 else 2 * step
    for k in range(6):
        x = x0 + (x1 - x0) * k / 5
        o.append(f'<text x="{sx(x):.1f}" y="{H - B + 18}" text-anchor="middle">{int(round(x))}</text>')
    o.append(f'<text x="{W / 2}" y="{H - 12}" text-anchor="middle">step</text>')
    o.append(f'<text x="16" y="{H / 2}" transform="rotate(-90 16 {H / 2})" text-anchor="middle">loss</text>')
    for v, text in refs:
        o.append(f'<line x1="{L}" y1="{sy(v):.1f}" x2="{W - R}" y2="{sy(v):.1f}" stroke="#c33" stroke-dasharray="6,4"/>')
        o.append(f'<text x="{W - R - 4}" y="{sy(v) - 5:.1f}" text-anchor="end" fill="#c33">{text}</text>')
    for st, text in marks:
        o.append(f'<line x1="{sx(st):.1f}" y1="{T}" x2="{sx(st):.1f}" y2="{H - B}" stroke="#c60" stroke-width="1.5"/>')
        o.append(f'<text x="{sx(st) + 4:.1f}" y="{H - B - 8}" fill="#c60">{text}</text>') # low: the legend is on top
    path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
    o.append(f'<polyline fill="none" stroke="#1f5fbf" stroke-width="1.5" points="{path}"/>')
    legend = [(label, "#1f5fbf", "")] if label else []
    for c, text in also:
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in c)
        o.append(f'<polyline fill="none" stroke="#2a2" stroke-width="1.5" stroke-dasharray="5,4" points="{path}"/>')
        legend.append((text, "#2a2", ' stroke-dasharray="5,4"'))
    # the legend at the top right, unless a curve or a reference line's label is there: then above
    # the marks' labels at the bottom right, where the curves have come down
    lx = W - R - 210
    inside = [sy(y) for x, y in pts + [p for c, _ in also for p in c] if sx(x) >= lx]
    top_end, bottom_start = T + 16 * len(legend) + 6, H - B - 30 - 16 * len(legend)
    top_busy = any(py < top_end for py in inside) or any(sy(v) - 17 < top_end for v, _ in refs)
    low = top_busy and all(py < bottom_start for py in inside)
    for k, (text, color, dash) in enumerate(legend):
        y = (bottom_start + 16 + 16 * k) if low else T + 16 + 16 * k
        o.append(f'<line x1="{W - R - 210}" y1="{y - 4}" x2="{W - R - 185}" y2="{y - 4}" stroke="{color}" stroke-width="1.5"{dash}/>')
        o.append(f'<text x="{W - R - 180}" y="{y}">{text}</text>')
    o.append(f'<rect x="{L}" y="{T}" width="{W - L - R}" height="{H - T - B}" fill="none" stroke="#888"/>')
    o.append("</svg>")
    with open(out, "w") as f:
        f.write("\n".join(o) + "\n")
    print(f"wrote {out}: {len(pts)} steps, loss {pts[0][1]:.4f} -> {pts[-1][1]:.4f}")


if __name__ == "__main__":
    main()
