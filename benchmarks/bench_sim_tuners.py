"""The paper's Table 3 tuner comparison, on the simulated cluster (a test bed, not real GPUs).

Runs the built-in tuners (heuristic, tpe, tpe-prefilter, random; `attune.tuners.registry`), three seeds
each, on the GLM-4.5 (128 x B200, 1,880 GPU-hours) and MiniMax-M2 (64 x B200, 530 GPU-hours) example
campaigns of examples/campaigns at the paper's budgets (Table D1), each campaign a whole `attune tune`
through the production control plane: `attune.app.campaign_runner.CampaignRunner` with the broker in
process (`broker.inprocess`: the broker's own handlers, `CampaignHandle`, `attune.control.plane.Control`,
`attune.control.shipping`, the sim backend; its monitor step moves the simulated clock). Calibration, admission,
the gate, charging, the early abort, promotion, the search rules, shipping with its check runs and the
final re-measurement are the code that ships.

Per seed the campaign is a copy of the example with the sim backend's seed set to 1000 x seed + 17,
`--infra-fault-rate` node failures per node-hour, and concurrency 1 (one run at a time, so that a
campaign is deterministic given its seed). The heuristic searches the campaign's `search_space` with the
skill's search rules enforced, as `attune tune --tuner heuristic` does; the black-box tuners search the
model's frozen Table E1 knob space (`attune.tuners.knobs`), as the paper's did, with the rules off and
the early abort on. `--space` overrides either.

Prints per tuner: mean gain of the shipped recipe over the baseline (both re-measured), GPU-hours used
(search launches and correctness checks), launches, failed launches (out of memory, hang or crash: their
share and GPU-hours), next to the paper's Table 3, and the heuristic's shipped GLM-4.5 layout per seed.

    python benchmarks/bench_sim_tuners.py [--models glm-4.5 minimax-m2] [--tuners ...] [--seeds 1 2 3]
        [--infra-fault-rate 0.002] [--space auto|campaign|table-e1] [--jobs N] [--keep DIR] [--json]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attune.tuners.registry import BLACK_BOX, BUILT_IN  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = {
    "glm-4.5": ROOT / "examples" / "campaigns" / "glm45-128xb200",
    "minimax-m2": ROOT / "examples" / "campaigns" / "minimax-m2-64xb200",
    "llama-3.1-405b": ROOT / "examples" / "campaigns" / "llama31-405b-128xb200",
    "mixtral-8x22b": ROOT / "examples" / "campaigns" / "mixtral-8x22b-128xh100",
}
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
TP, PP, EP = "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--expert-model-parallel-size"
# The paper's GLM-4.5 winner: the TP1 layout that ran out of memory, retried with full recomputation.
GLM_WINNER = {TP: 1, PP: 16, EP: 8, "--recompute-granularity": "full"}


def campaign_copy(model: str, seed: int, infra_fault_rate: float, root: Path) -> Path:
    """The example campaign for one seed: sim seed 1000 x seed + 17, the fault rate, concurrency 1."""
    spec = yaml.safe_load((EXAMPLES[model] / "campaign.yaml").read_text())
    spec["cluster"]["settings"]["seed"] = seed * 1000 + 17
    spec["cluster"]["settings"]["infra_fault_rate"] = infra_fault_rate
    spec["budget"]["concurrency"] = 1
    d = root
    d.mkdir(parents=True, exist_ok=True)
    (d / "campaign.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return d


def run_one(model: str, tuner: str, seed: int, infra_fault_rate: float, space: str, root: str) -> dict[str, Any]:
    """One whole campaign through `attune tune`'s runner, in process; its Table 3 figures."""
    from attune.app import report
    from attune.app.campaign_runner import CampaignRunner, RunnerError
    from attune.core.state import load

    t0 = time.perf_counter()
    d = campaign_copy(model, seed, infra_fault_rate, Path(root) / f"{model}-{tuner}-{seed}")
    knobs = space == "table-e1" or (space == "auto" and tuner in BLACK_BOX)
    failed: str | None = None
    try:
        failed = CampaignRunner(d, tuner, seed=seed, say=None, transport="in-process", knob_space=knobs).run().failed
    except RunnerError as exc:  # e.g. the heuristic's stop refused by the search rules: a result, not a crash
        failed = str(exc)
    st, _ = load(d)
    h = report.build(d).headline.__dict__
    shipped = st.runs.get((st.shipped or {}).get("run_id") or "")
    args = dict((shipped.changes or {}).get("args") or {}) if shipped else {}
    return {
        "model": model, "tuner": tuner, "seed": seed, "space": "table-e1" if knobs else "campaign",
        "gain": h["gain"] or 0.0, "remeasured": h["remeasured"], "shipped": h["shipped_run_id"], "shipped_args": args,
        "glm_winner": all(args.get(k) == v for k, v in GLM_WINNER.items()),
        "gpu_hours": h["gpu_hours_used"], "launches": h["launches"], "failed_launches": h["failed_launches"],
        "failed_share": h["failed_launches"] / h["launches"] if h["launches"] else 0.0,
        "failed_gpu_hours": h["failed_gpu_hours"], "refused": h["launches_refused"],
        "pruned": sum(1 for r in st.runs.values() if r.kind == "search" and r.outcome == "pruned"),
        "checks": sum(1 for r in st.runs.values() if r.kind == "check"),
        "stop": (st.stop or {}).get("diagnosis"), "failed": failed,
        "wall_seconds": time.perf_counter() - t0,
    }


def summarise(results: list[dict[str, Any]]) -> dict[str, Any]:
    def mean(k: str) -> float:
        return statistics.fmean(float(r[k]) for r in results)

    return {"gain": mean("gain"), "gpu_hours": mean("gpu_hours"), "launches": mean("launches"),
            "failed_share": mean("failed_share"), "failed_gpu_hours": mean("failed_gpu_hours"),
            "pruned": mean("pruned"), "gains": [round(r["gain"], 4) for r in results],
            "wall_s_max": max(r["wall_seconds"] for r in results)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(EXAMPLES), choices=list(EXAMPLES))
    ap.add_argument("--tuners", nargs="+", default=list(BUILT_IN), choices=BUILT_IN)
    ap.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    ap.add_argument("--infra-fault-rate", type=float, default=0.002, help="node failures per node-hour")
    ap.add_argument("--space", default="auto", choices=("auto", "campaign", "table-e1"),
                    help="auto: the heuristic on the campaign's search_space, black-box tuners on Table E1")
    ap.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1),
                    help="campaigns run at once, each in its own process (results do not depend on it)")
    ap.add_argument("--keep", type=Path, help="keep the campaign directories here (default: a temporary one)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    # Campaign directories on a RAM disk where there is one: the ledger's fsyncs then cost nothing.
    shm = Path("/dev/shm")
    tmp_parent = str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None
    root = args.keep or Path(tempfile.mkdtemp(prefix="bench-sim-tuners-", dir=tmp_parent))
    t0 = time.perf_counter()
    work = [(m, t, s) for m in args.models for t in args.tuners for s in args.seeds]
    try:
        if args.jobs > 1:
            with cf.ProcessPoolExecutor(max_workers=args.jobs) as pool:
                futs = [pool.submit(run_one, m, t, s, args.infra_fault_rate, args.space, str(root)) for m, t, s in work]
                campaigns = [f.result() for f in futs]
        else:
            campaigns = [run_one(m, t, s, args.infra_fault_rate, args.space, str(root)) for m, t, s in work]
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    total = time.perf_counter() - t0
    rows = []
    for m in args.models:
        for t in args.tuners:
            res = [c for c in campaigns if c["model"] == m and c["tuner"] == t]
            rows.append({"model": m, "tuner": t, "space": res[0]["space"], **summarise(res)})
    if args.json:
        print(json.dumps({"rows": rows, "campaigns": campaigns, "wall_seconds": total, "jobs": args.jobs},
                         indent=2, default=str))
        return 0
    print("Tuner comparison on the SIMULATED cluster (test bed) through the production control plane, means over "
          f"seeds {args.seeds}; the paper's Table 3 in brackets where it has the tuner")
    print(f"{'model':11} {'tuner':14} {'space':9} {'gain':>8} {'(paper)':>8} {'GPU-h':>6} {'(paper)':>7} "
          f"{'launch':>6} {'(paper)':>7} {'failed':>6} {'(GPU-h)':>7} {'(paper)':>11} {'pruned':>6}  per seed")
    for r in rows:
        p = PAPER.get((r["model"], r["tuner"]))
        pg = f"{p[0] * 100:+.1f}%" if p else "-"
        ph = f"{p[1]}" if p else "-"
        pl = f"{p[2]}" if p else "-"
        pf = f"{p[3] * 100:.0f}% ({p[4]})" if p else "-"
        print(f"{r['model']:11} {r['tuner']:14} {r['space']:9} {r['gain'] * 100:+7.1f}% {pg:>8} {r['gpu_hours']:6.0f} "
              f"{ph:>7} {r['launches']:6.1f} {pl:>7} {r['failed_share'] * 100:5.0f}% {r['failed_gpu_hours']:7.0f} "
              f"{pf:>11} {r['pruned']:6.1f}  " + ", ".join(f"{g * 100:+.1f}%" for g in r["gains"]))
    for m in args.models:
        p = PAPER.get((m, "attune (agent)"))
        if p:
            print(f"{m:11} {'ATTUNE agent':14} {'':9} {'':>8} {p[0] * 100:+7.1f}% {'':>6} {p[1]:>7} {'':>6} "
                  f"{p[2]:>7} {'':>6} {'':>7} {p[3] * 100:.0f}% ({p[4]})  (the paper's agent; not simulated here)")
    heur = [c for c in campaigns if c["model"] == "glm-4.5" and c["tuner"] == "heuristic"]
    for c in heur:
        a = c["shipped_args"]
        print(f"heuristic GLM-4.5 seed {c['seed']}: shipped {c['shipped']} (TP{a.get(TP, '=')} PP{a.get(PP, '=')} "
              f"EP{a.get(EP, '=')} recompute {a.get('--recompute-granularity', '=')}): "
              + ("the paper's winner (TP1/PP16/EP8 + full recompute)" if c["glm_winner"] else "NOT the paper's winner"))
    print(f"{len(campaigns)} campaigns in {total:.1f} s of wall time with {args.jobs} process(es); the slowest "
          f"campaign took {max(c['wall_seconds'] for c in campaigns):.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
