"""Record HTA's figures for the sample traces into expected.json (run by hand; needs HTA).

usage: python tests/data/hta/record_expected.py
"""

from __future__ import annotations

import json
import logging
import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def hta_figures(directory: Path) -> dict[str, dict[str, float | None]]:
    """HTA's temporal breakdown and comm/comp overlap per rank of one trace directory."""
    from hta.trace_analysis import TraceAnalysis

    ta = TraceAnalysis(trace_dir=str(directory))
    tb = ta.get_temporal_breakdown(visualize=False)
    ov = ta.get_comm_comp_overlap(visualize=False)
    out: dict[str, dict[str, float | None]] = {}
    for _, row in tb.iterrows():
        out[str(int(row["rank"]))] = {
            "idle_us": float(row["idle_time(us)"]),
            "compute_us": float(row["compute_time(us)"]),
            "non_compute_us": float(row["non_compute_time(us)"]),
            "span_us": float(row["kernel_time(us)"]),
        }
    for _, row in ov.iterrows():
        pct = float(row["comp_comm_overlap_pctg"])
        out[str(int(row["rank"]))]["comm_comp_overlap_pct"] = None if math.isnan(pct) else pct
    return out


def main() -> None:
    logging.disable(logging.WARNING)
    expected = {}
    for d in sorted(p for p in HERE.iterdir() if p.is_dir() and p.name != "cpu_only"):
        expected[d.name] = hta_figures(d)
        print(d.name, expected[d.name], file=sys.stderr)
    (HERE / "expected.json").write_text(json.dumps({"hta_version": "0.5.0", "figures": expected}, indent=2) + "\n")


if __name__ == "__main__":
    main()
