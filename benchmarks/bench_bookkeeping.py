"""What a simulated campaign's CPU goes to: the simulation, or the bookkeeping around it.

Runs one whole GLM-4.5 campaign (examples/campaigns/glm45-128xb200, the benchmark's seed-1 copy of
`bench_sim_tuners.py`: sim seed 1017, node faults at 0.002 per node-hour, one run at a time) with the
heuristic tuner, in process, under cProfile, on a real disk (the ledger's fsyncs count), and prints the
CPU time of the whole campaign and the shares spent in:

    simulating   attune/sim/ and the sim backend (broker/backends/sim.py)
    fsync        os.fsync (the ledger's durability)
    ledger       attune/core/ledger.py and attune/core/state.py (rows, MACs, the anchor, the fold)
    yaml         the YAML loader (campaign files, catalogs, correctness lists)

    python benchmarks/bench_bookkeeping.py [--seed 1] [--tuner heuristic] [--dir DIR] [--top 25] [--json]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_sim_tuners import campaign_copy  # noqa: E402

GROUPS = {
    "simulating": ("/attune/sim/", "/broker/backends/sim.py"),
    "ledger": ("/attune/core/ledger.py", "/attune/core/state.py"),
    "yaml": ("/yaml/",),
}


def _shares(stats: pstats.Stats, total: float) -> dict[str, float]:
    """Each group's share of the total: the time spent inside its functions (their own time, `tottime`),
    and for fsync the built-in's time."""
    own: dict[str, float] = {k: 0.0 for k in GROUPS}
    own["fsync"] = 0.0
    for (filename, _line, name), (_cc, _nc, tt, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        if name == "<built-in method posix.fsync>":
            own["fsync"] += tt
            continue
        for group, parts in GROUPS.items():
            if any(p in filename for p in parts):
                own[group] += tt
                break
    return {k: (v / total if total else 0.0) for k, v in own.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tuner", default="heuristic")
    ap.add_argument("--dir", type=Path, help="where the campaign directory goes (default: a temporary one on disk)")
    ap.add_argument("--top", type=int, default=0, help="also print the top N functions by own time")
    ap.add_argument("--plain", action="store_true", help="no profiler: the CPU time alone (profiling adds ~3x)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from attune.app.campaign_runner import CampaignRunner, RunnerError

    root = args.dir or Path(tempfile.mkdtemp(prefix="bench-bookkeeping-", dir=str(Path.cwd())))
    d = campaign_copy("glm-4.5", args.seed, 0.002, root / f"glm-4.5-{args.tuner}-{args.seed}")
    prof = cProfile.Profile(time.process_time)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    failed: str | None = None
    try:
        if not args.plain:
            prof.enable()
        try:
            failed = CampaignRunner(d, args.tuner, seed=args.seed, say=None, transport="in-process").run().failed
        except RunnerError as exc:
            failed = str(exc)
        finally:
            prof.disable()
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        rows = sum(1 for _ in (d / "ledger.jsonl").open())
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    if args.plain:
        print(f"glm-4.5 {args.tuner} seed {args.seed}: {cpu:.2f} s CPU ({wall:.2f} s wall, not profiled), "
              f"{rows} ledger rows" + (f"; the campaign failed: {failed}" if failed else ""))
        return 0
    stats = pstats.Stats(prof)
    total = sum(tt for (_cc, _nc, tt, _ct, _c) in stats.stats.values())  # type: ignore[attr-defined]
    shares = _shares(stats, total)
    out: dict[str, Any] = {"campaign": f"glm-4.5 {args.tuner} seed {args.seed}", "cpu_seconds": round(cpu, 3),
                           "wall_seconds": round(wall, 3), "ledger_rows": rows, "failed": failed,
                           "shares": {k: round(v, 4) for k, v in shares.items()}}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"{out['campaign']}: {cpu:.2f} s CPU ({wall:.2f} s wall, profiled), {rows} ledger rows"
          + (f"; the campaign failed: {failed}" if failed else ""))
    print("  " + ", ".join(f"{k} {v:.1%}" for k, v in shares.items()))
    if args.top:
        stats.sort_stats("tottime").print_stats(args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
