"""The simulated example campaigns through the production path: `attune tune --tuner heuristic` (the real
broker, admission, search rules, shipping), and, on GLM-4.5, whether the search reaches the paper's winner
(TP1/PP16/EP8 retried with full recomputation after running out of memory) for several simulator seeds.

    python benchmarks/bench_heuristic_examples.py [--glm-seeds 1 2 3] [--json]

Prints one row per campaign: shipped changes, re-measured gain, charged GPU-hours, search launches and
failed launches, refused stops, whether the GLM TP1 retry happened, wall seconds. Simulated clusters:
a test bed, not a claim about GPUs (docs/sim.md)."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from attune.core.state import load  # noqa: E402

EXAMPLES = ROOT / "examples" / "campaigns"
SIM = ["glm45-128xb200", "llama31-405b-128xb200", "mixtral-8x22b-128xh100", "minimax-m2-64xb200"]
TP, PP, EP = "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--expert-model-parallel-size"


def run(name: str, seed: int | None, tmp: Path) -> dict[str, Any]:
    d = tmp / f"{name}-{seed}"
    n = 1
    while d.exists():
        n += 1
        d = tmp / f"{name}-{seed}-{n}"
    d.mkdir()
    text = (EXAMPLES / name / "campaign.yaml").read_text()
    if seed is not None:
        text = re.sub(r"(\n    seed: )\d+", rf"\g<1>{seed}", text, count=1)
    (d / "campaign.yaml").write_text(text)
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "attune", "tune", str(d / "campaign.yaml"), "--tuner", "heuristic",
                          "--quiet", "--json"], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    wall = time.monotonic() - t0
    subprocess.run([sys.executable, "-m", "attune", "broker", "stop", str(d)], cwd=ROOT, capture_output=True)
    st, _ = load(d)
    search = [r for r in st.runs.values() if r.kind == "search"]
    shipped = (st.shipped or {}).get("run_id")
    args = st.runs[shipped].changes.get("args", {}) if shipped in st.runs else {}
    tp1 = [r for r in search if (r.changes["args"].get(TP), r.changes["args"].get(PP), r.changes["args"].get(EP))
           == (1, 16, 8)]
    out: dict[str, Any] = {
        "campaign": name, "sim_seed": seed, "exit": res.returncode, "shipped": shipped,
        "shipped_changes": args, "gain": None, "charged_gpu_hours": round(st.budget.charged, 1),
        "launches": len(search), "failed": sum(1 for r in search if r.outcome in ("oom", "hang", "crash")),
        "stop_refusals": sum(1 for r in [st.stop_refusal] if r), "wall_s": round(wall, 1),
        "ship_reason": (st.shipped or {}).get("reason"), "dir": str(d),
    }
    if res.returncode == 0:
        out["gain"] = json.loads(res.stdout)["headline"].get("gain")
    else:
        out["error"] = res.stderr.strip().splitlines()[-1:] if res.stderr else []
    if name.startswith("glm"):
        out["tp1_oom_then_full_recompute"] = (any(r.outcome == "oom" for r in tp1) and any(
            r.changes["args"].get("--recompute-granularity") == "full" and r.outcome == "ok" for r in tp1))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--glm-seeds", type=int, nargs="*", default=[1, 2, 3])
    ap.add_argument("--only-glm", action="store_true", help="skip the other examples")
    ap.add_argument("--keep", type=Path, help="keep the campaign directories under this (new) directory")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as t:
        where = Path(t)
        if args.keep:
            args.keep.mkdir(parents=True)
            where = args.keep
        for seed in args.glm_seeds:
            rows.append(run("glm45-128xb200", seed, where))
        for name in [] if args.only_glm else SIM[1:]:
            rows.append(run(name, None, where))
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print("| campaign | sim seed | exit | shipped | gain | GPU-h | launches | failed | TP1 retry | wall s |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            g = f"{r['gain']:+.1%}" if r["gain"] is not None else "-"
            tp1 = {True: "yes", False: "no"}.get(r.get("tp1_oom_then_full_recompute"), "")
            print(f"| {r['campaign']} | {r['sim_seed'] or '-'} | {r['exit']} | {r['shipped']} | {g} | "
                  f"{r['charged_gpu_hours']} | {r['launches']} | {r['failed']} | {tp1} | {r['wall_s']} |")
    return 0 if all(r["exit"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
