"""The paper's Table 3 tuner comparison, on the simulated cluster (a test bed, not real GPUs).

Runs the built-in tuners (heuristic, tpe, tpe-prefilter, random), three seeds each, on GLM-4.5
(128 x B200, 1,880 GPU-hours) and MiniMax-M2 (64 x B200, 530 GPU-hours) at the paper's budgets
(30 x one baseline run, Table D1), each campaign through `broker.sim_plane` (the same admission,
gate, charging, promotion, shipping and re-measurement rules for every tuner), and prints per tuner:
mean gain of the shipped recipe over the baseline (re-measured), GPU-hours used (search launches and
correctness checks), launches, and failed launches (out of memory, hang or crash) with their GPU-hours.

    python benchmarks/bench_sim_tuners.py [--models glm-4.5 minimax-m2] [--tuners ...] [--seeds 1 2 3]
                                          [--infra-fault-rate 0.002] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from broker.sim_plane import CampaignResult, run_campaign  # noqa: E402

TUNERS = ("heuristic", "tpe", "tpe-prefilter", "random")
# The paper's Table 3 rows for the tuners that also exist here (mean gain, GPU-h, launches, failed share, failed GPU-h).
PAPER = {
    ("glm-4.5", "tpe"): (0.018, 1675, 19.7, 0.39, 186),
    ("glm-4.5", "tpe-prefilter"): (0.039, 1695, 13.7, 0.05, 58),
    ("glm-4.5", "random"): (0.078, 1688, 22.7, 0.51, 278),
    ("glm-4.5", "attune (agent)"): (0.339, 669, 8.3, 0.24, 60),
    ("minimax-m2", "tpe"): (0.461, 492, 35.0, 0.53, 136),
    ("minimax-m2", "tpe-prefilter"): (0.555, 489, 22.7, 0.04, 23),
    ("minimax-m2", "random"): (0.327, 487, 38.0, 0.67, 202),
    ("minimax-m2", "attune (agent)"): (1.641, 203, 13.3, 0.23, 25),
}


def summarise(results: list[CampaignResult]) -> dict[str, float]:
    return {
        "gain": statistics.fmean(r.gain for r in results),
        "gain_min": min(r.gain for r in results),
        "gain_max": max(r.gain for r in results),
        "gpu_hours": statistics.fmean(r.gpu_hours_used for r in results),
        "launches": statistics.fmean(r.launches for r in results),
        "failed_share": statistics.fmean(r.failed_share for r in results),
        "failed_gpu_hours": statistics.fmean(r.failed_gpu_hours for r in results),
        "pruned": statistics.fmean(r.pruned for r in results),
        "wall_s_max": max(r.wall_seconds for r in results),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["glm-4.5", "minimax-m2"])
    ap.add_argument("--tuners", nargs="+", default=list(TUNERS), choices=TUNERS)
    ap.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    ap.add_argument("--infra-fault-rate", type=float, default=0.002, help="node failures per node-hour")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    t0 = time.perf_counter()
    rows = []
    campaigns = []
    for model in args.models:
        for tuner in args.tuners:
            res = [run_campaign(model, tuner, s, infra_fault_rate=args.infra_fault_rate) for s in args.seeds]
            campaigns += [r.as_dict() for r in res]
            rows.append({"model": model, "tuner": tuner, **summarise(res),
                         "gains": [round(r.gain, 4) for r in res]})
    total = time.perf_counter() - t0
    if args.json:
        print(json.dumps({"rows": rows, "campaigns": campaigns, "wall_seconds": total}, indent=2, default=str))
        return 0
    print("Tuner comparison on the SIMULATED cluster (test bed), means over seeds "
          f"{args.seeds}; the paper's Table 3 in brackets where it has the tuner")
    print(f"{'model':11} {'tuner':14} {'gain':>8} {'(paper)':>9} {'GPU-h':>7} {'(paper)':>8} {'launches':>8} "
          f"{'(paper)':>8} {'failed':>7} {'(GPU-h)':>8} {'(paper)':>13} {'pruned':>6}  per seed")
    for r in rows:
        p = PAPER.get((r["model"], r["tuner"]))
        pg = f"{p[0] * 100:+.1f}%" if p else "-"
        ph = f"{p[1]}" if p else "-"
        pl = f"{p[2]}" if p else "-"
        pf = f"{p[3] * 100:.0f}% ({p[4]})" if p else "-"
        print(f"{r['model']:11} {r['tuner']:14} {r['gain'] * 100:+7.1f}% {pg:>9} {r['gpu_hours']:7.0f} {ph:>8} "
              f"{r['launches']:8.1f} {pl:>8} {r['failed_share'] * 100:6.0f}% {r['failed_gpu_hours']:8.0f} {pf:>13} "
              f"{r['pruned']:6.1f}  " + ", ".join(f"{g * 100:+.1f}%" for g in r["gains"]))
    for model in args.models:
        p = PAPER.get((model, "attune (agent)"))
        if p:
            print(f"{model:11} {'ATTUNE agent':14} {'':>8} {p[0] * 100:+8.1f}% {'':>7} {p[1]:>8} {'':>8} {p[2]:>8} "
                  f"{'':>7} {'':>8} {p[3] * 100:.0f}% ({p[4]}){'':>3}  (the paper's agent; not simulated here)")
    slowest = max(r["wall_s_max"] for r in rows)
    print(f"{len(campaigns)} campaigns in {total:.1f} s of wall time; the slowest campaign took {slowest:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
