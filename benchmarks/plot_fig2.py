"""The paper's Figure 2 from the simulated tuner comparison: best-so-far gain against cumulative GPU-h,
per tuner, the mean over seeds and its range (min to max), drawn as a self-contained SVG.

Reads the campaign directories `benchmarks/bench_sim_tuners.py --keep DIR` leaves (`<model>-<tuner>-<seed>`):
each campaign's curve is its report's (`attune.app.report.build(...).curve`: charged GPU-h, best-so-far
gain over the calibrated baseline). Curves are step functions, sampled on a common grid of GPU-h.

    python benchmarks/bench_sim_tuners.py --models glm-4.5 --keep /tmp/sim && \\
    python benchmarks/plot_fig2.py /tmp/sim --model glm-4.5 --out fig2.svg
"""

from __future__ import annotations

import argparse
import html
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
NAME = re.compile(r"^(?P<model>.+)-(?P<tuner>heuristic|tpe-prefilter|tpe|random|[a-z-]+)-(?P<seed>\d+)$")


def curves(root: Path, model: str) -> dict[str, list[list[tuple[float, float]]]]:
    from attune.app.report import build

    out: dict[str, list[list[tuple[float, float]]]] = {}
    for d in sorted(p for p in root.iterdir() if p.is_dir() and (p / "ledger.jsonl").exists()):
        m = NAME.match(d.name)
        if not m or m["model"] != model:
            continue
        out.setdefault(m["tuner"], []).append(build(d).curve)
    return out


def at(curve: list[tuple[float, float]], x: float) -> float:
    """A step curve's value at x (the best gain reached by then)."""
    y = 0.0
    for cx, cy in curve:
        if cx > x:
            break
        y = cy
    return y


def band(runs: list[list[tuple[float, float]]], grid: list[float]) -> list[tuple[float, float, float, float]]:
    """(x, mean, min, max) over the seeds at each grid point."""
    rows = []
    for x in grid:
        ys = [at(c, x) for c in runs]
        rows.append((x, sum(ys) / len(ys), min(ys), max(ys)))
    return rows


def svg(series: dict[str, list[tuple[float, float, float, float]]], title: str) -> str:
    w, h, ml, mr, mt, mb = 760, 420, 70, 160, 40, 50
    pw, ph = w - ml - mr, h - mt - mb
    xmax = max((r[0] for rows in series.values() for r in rows), default=1.0) or 1.0
    ymax = max((r[3] for rows in series.values() for r in rows), default=0.01) * 1.1 or 0.01

    def sx(x: float) -> float:
        return ml + pw * x / xmax

    def sy(y: float) -> float:
        return mt + ph * (1 - y / ymax)

    parts = [f'<rect x="{ml}" y="{mt}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>']
    for i in range(6):
        x, y = xmax * i / 5, ymax * i / 5
        parts.append(f'<text x="{sx(x):.1f}" y="{mt + ph + 16}" font-size="11" text-anchor="middle">{x:,.0f}</text>')
        parts.append(f'<text x="{ml - 6}" y="{sy(y) + 4:.1f}" font-size="11" text-anchor="end">{y:+.0%}</text>')
    for k, (tuner, rows) in enumerate(series.items()):
        c = COLORS[k % len(COLORS)]
        upper = " ".join(f"{sx(x):.1f},{sy(hi):.1f}" for x, _, _, hi in rows)
        lower = " ".join(f"{sx(x):.1f},{sy(lo):.1f}" for x, _, lo, _ in reversed(rows))
        parts.append(f'<polygon points="{upper} {lower}" fill="{c}" fill-opacity="0.15" stroke="none"/>')
        mean = " ".join(f"{sx(x):.1f},{sy(m):.1f}" for x, m, _, _ in rows)
        parts.append(f'<polyline points="{mean}" fill="none" stroke="{c}" stroke-width="2"/>')
        parts.append(f'<text x="{ml + pw + 10}" y="{mt + 16 + 18 * k}" font-size="12" fill="{c}">{html.escape(tuner)}</text>')
    parts.append(f'<text x="{ml + pw / 2}" y="{h - 10}" font-size="12" text-anchor="middle">cumulative GPU-hours</text>')
    parts.append(f'<text x="{ml + pw / 2}" y="22" font-size="14" text-anchor="middle">{html.escape(title)}</text>')
    parts.append(f'<text x="16" y="{mt + ph / 2}" font-size="12" text-anchor="middle" '
                 f'transform="rotate(-90 16 {mt + ph / 2})">best-so-far gain (mean, range over seeds)</text>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}">'
            f'<rect width="{w}" height="{h}" fill="white"/>{"".join(parts)}</svg>\n')


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path, help="the directory bench_sim_tuners.py --keep wrote")
    ap.add_argument("--model", default="glm-4.5")
    ap.add_argument("--out", type=Path, default=Path("fig2.svg"))
    ap.add_argument("--points", type=int, default=200)
    args = ap.parse_args()
    runs = curves(args.root, args.model)
    if not runs:
        print(f"plot_fig2: no {args.model} campaigns under {args.root}", file=sys.stderr)
        return 1
    xmax = max(x for cs in runs.values() for c in cs for x, _ in c)
    grid = [xmax * i / (args.points - 1) for i in range(args.points)]
    series = {t: band(cs, grid) for t, cs in sorted(runs.items())}
    args.out.write_text(svg(series, f"{args.model}: best-so-far gain against GPU-hours (simulated)"))
    for t, rows in series.items():
        print(f"{t:14} final mean {rows[-1][1]:+.1%} (range {rows[-1][2]:+.1%} .. {rows[-1][3]:+.1%}), "
              f"{len(runs[t])} seed(s)")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
