"""`attune trace analyze PATH... [--layout tp=..,pp=..] [--json]`: break profiled steps down."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from attune.core.errors import EXIT_OK, UsageError
from attune.core.output import add_json_flag, emit_json


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "trace",
        help="analyse PyTorch profiler traces",
        description="Analyse PyTorch profiler (Kineto) traces of a profiled run.",
    )
    sub = parser.add_subparsers(dest="trace_command", metavar="SUBCOMMAND")
    sub.required = True
    analyze = sub.add_parser(
        "analyze",
        help="split each traced rank's steps into compute, communication, host and idle time",
        description=(
            "Stream each trace (plain or gzipped JSON; directories are searched for *.json and "
            "*.json.gz traces at any depth), split every profiler step into computation, "
            "communication (exposed and hidden), memory copies, host-side time and idle, map ranks "
            "to pipeline stages, and name the slowest stage and what it waits on. Per rank, the "
            "JSON also gives HTA-comparable figures (compute_us, non_compute_us, idle_us, "
            "comm_comp_overlap_pct). The shape is documented in docs/traces.md."
        ),
    )
    analyze.add_argument("paths", nargs="+", metavar="PATH", help="trace files or directories")
    analyze.add_argument(
        "--layout",
        help="the run's parallel layout, e.g. tp=2,pp=4 (dp from the world size) "
        "or tp=2,pp=4,dp=8,order=tp-cp-dp-pp; without it, stages come from the traces' "
        "pipeline process groups, else every rank is taken as one stage",
    )
    analyze.add_argument("--jobs", type=int, help="worker processes (default: by input size and cores)")
    analyze.add_argument("--top", type=int, default=10, help="heaviest kernels/operators to list (default 10)")
    add_json_flag(analyze)
    analyze.set_defaults(func=run)


def _ms(us: float | None) -> str:
    return "-" if us is None else f"{us / 1000:.2f}"


def run(args: argparse.Namespace) -> int:
    from attune.readers.traces import TraceInputError, analyze_paths

    if args.jobs is not None and args.jobs < 1:
        raise UsageError("--jobs must be a positive integer")
    if args.top < 0:
        raise UsageError("--top must be zero or more")
    try:
        report = analyze_paths(args.paths, layout=args.layout, jobs=args.jobs, top_n=args.top)
    except TraceInputError as exc:
        raise UsageError(str(exc)) from exc
    if args.json:
        emit_json(report.model_dump(mode="json", by_alias=True))
        return EXIT_OK
    out = sys.stdout
    out.write(report.summary + "\n\n")
    out.write("stage  ranks          step ms  busy ms  compute  exp.comm  memcpy  host   waits most on\n")
    for st in report.stages:
        b = st.breakdown
        ranks = ",".join("?" if r is None else str(r) for r in st.ranks)
        top = st.waits_on[0].what if st.waits_on else "-"
        out.write(
            f"{st.stage:<6} {ranks[:14]:<14} {_ms(b.step_us):>7}  {_ms(st.busy_us):>7}  "
            f"{_ms(b.compute_us):>7}  {_ms(b.comm_exposed_us):>8}  {_ms(b.memcpy_exposed_us):>6}  "
            f"{_ms(b.host_us):>5}  {top}\n"
        )
    out.write("\nrank  kind  steps  HTA: compute ms  non-compute ms  idle ms  overlap %   file\n")
    for r in report.ranks:
        ov = "-" if r.comm_comp_overlap_pct is None else f"{r.comm_comp_overlap_pct:.1f}"
        out.write(
            f"{'?' if r.rank is None else r.rank:<5} {r.kind:<5} {r.steps:>5}  {_ms(r.compute_us):>15}  "
            f"{_ms(r.non_compute_us):>14}  {_ms(r.idle_us):>7}  {ov:>9}   {r.file}\n"
        )
    if report.top_kernels:
        out.write("\nheaviest kernels (all ranks): \n")
        for k in report.top_kernels[:5]:
            out.write(f"  {_ms(k.total_us):>10} ms  {k.kind or '':<8} {k.name[:90]}\n")
    if report.top_operators:
        out.write("heaviest operators (all ranks, inclusive): \n")
        for k in report.top_operators[:5]:
            out.write(f"  {_ms(k.total_us):>10} ms  {k.name[:90]}\n")
    return EXIT_OK
