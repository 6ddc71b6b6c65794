"""What a simulated campaign's CPU goes to: the simulation, or the bookkeeping around it.

Runs one whole GLM-4.5 campaign (examples/campaigns/glm45-128xb200, the benchmark's seed-1 copy of
`bench_sim_tuners.py`: sim seed 1017, node faults at 0.002 per node-hour, one run at a time) with the
heuristic tuner, in process, under cProfile, on a real disk (the ledger's fsyncs count), and prints the
CPU time of the whole campaign and the shares spent in:

    simulating   attune/sim/ and the sim backend (broker/backends/sim.py), their own time
    sim_incl     the same code and everything it calls (the catalog's layout arithmetic, ...): the share
                 of the campaign's CPU that goes to simulating the cluster and the estimates
    fsync        os.fsync (the ledger's durability)
    ledger       attune/core/ledger.py and attune/core/state.py (rows, MACs, the anchor, the fold)
    yaml         the YAML loader (campaign files, catalogs, correctness lists)

`--plain` times the campaign without the profiler (`--repeat N`: the least CPU of N campaigns, each in a
fresh process, so no cache of one campaign helps the next). A campaign in a fresh process also imports
the modules it uses on first use (the in-process broker, the simulator, the gate): `--warm` imports
them before the clock starts (only imports: no campaign runs before), to show the campaign's own work.

    python benchmarks/bench_bookkeeping.py [--seed 1] [--tuner heuristic] [--dir DIR] [--top 25] [--json]
    python benchmarks/bench_bookkeeping.py --plain [--warm] [--repeat 5]
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import json
import pstats
import shutil
import subprocess
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


# What a campaign imports on first use (warmed by `--warm`; importing has no other effect).
WARM_MODULES = ("broker.inprocess", "broker.service", "broker.campaigns", "broker.backends.sim", "broker.tuner_plane",
                "attune.sim.run", "attune.sim.estimate", "attune.control.plane", "attune.control.shipper",
                "attune.control.search_rules", "attune.tuners.heuristic", "attune.app.report", "attune.app.summary",
                "gate", "gate.config_check", "gate.judge", "gate.lists", "gate.noise")


def _shares(stats: pstats.Stats, total: float) -> dict[str, float]:
    """Each group's share of the total: the time spent inside its functions (their own time, `tottime`),
    for fsync the built-in's time, and for sim_incl the simulation's inclusive time (the cumulative time
    of every call into its code from outside it)."""
    own: dict[str, float] = {k: 0.0 for k in GROUPS}
    own["fsync"] = 0.0
    own["sim_incl"] = 0.0
    sim = GROUPS["simulating"]
    for (filename, _line, name), (_cc, _nc, tt, _ct, callers) in stats.stats.items():  # type: ignore[attr-defined]
        if name == "<built-in method posix.fsync>":
            own["fsync"] += tt
            continue
        if any(p in filename for p in sim):
            own["sim_incl"] += sum(c[3] for caller, c in callers.items() if not any(p in caller[0] for p in sim))
        for group, parts in GROUPS.items():
            if any(p in filename for p in parts):
                own[group] += tt
                break
    return {k: (v / total if total else 0.0) for k, v in own.items()}


def _repeat(args: argparse.Namespace) -> int:
    """The least CPU of `--repeat` plain campaigns, each in a fresh process."""
    cmd = [sys.executable, __file__, "--plain", "--json", "--seed", str(args.seed), "--tuner", args.tuner]
    cmd += ["--warm"] if args.warm else []
    runs = [json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
            for _ in range(args.repeat)]
    cpus = sorted(r["cpu_seconds"] for r in runs)
    out = {**runs[0], "cpu_seconds": cpus[0], "cpu_seconds_all": cpus, "repeat": args.repeat}
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"{out['campaign']}: {cpus[0]:.2f} s CPU, least of {args.repeat} fresh processes "
              f"({', '.join(f'{c:.2f}' for c in cpus)}){', modules imported first' if args.warm else ''}, "
              f"{out['ledger_rows']} ledger rows" + (f"; the campaign failed: {out['failed']}" if out["failed"] else ""))
    return 0 if not out["failed"] else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tuner", default="heuristic")
    ap.add_argument("--dir", type=Path, help="where the campaign directory goes (default: a temporary one on disk)")
    ap.add_argument("--top", type=int, default=0, help="also print the top N functions by own time")
    ap.add_argument("--plain", action="store_true", help="no profiler: the CPU time alone (profiling adds ~3x)")
    ap.add_argument("--warm", action="store_true", help="import the modules a campaign uses before the clock starts")
    ap.add_argument("--repeat", type=int, default=1, help="with --plain: the least CPU of N fresh processes")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error("--repeat: expected a positive number of campaigns")
    if args.repeat > 1:
        if not args.plain:
            ap.error("--repeat goes with --plain")
        return _repeat(args)
    if args.warm:
        for name in WARM_MODULES:
            importlib.import_module(name)

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
        plain = {"campaign": f"glm-4.5 {args.tuner} seed {args.seed}", "cpu_seconds": round(cpu, 3),
                 "wall_seconds": round(wall, 3), "ledger_rows": rows, "failed": failed, "warm": args.warm}
        if args.json:
            print(json.dumps(plain, indent=2))
            return 0
        print(f"glm-4.5 {args.tuner} seed {args.seed}: {cpu:.2f} s CPU ({wall:.2f} s wall, not profiled"
              f"{', modules imported first' if args.warm else ''}), "
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
