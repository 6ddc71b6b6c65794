"""Compare the built-in tuners on the same tinygpt campaign and budget: heuristic, tpe and random,
three seeds each. Prints, per tuner, the mean gain (from each campaign's final re-measurement),
launches, failed launches and the budget used.

    python benchmarks/compare_tuners.py [--seeds 0 1 2] [--tuners heuristic tpe random]
        [--search-runs 5] [--workdir /tmp/attune-compare]

This is a benchmark, not a test: real tinygpt runs on the local backend, about 4-5 minutes per
campaign on two busy cores. To keep it that short, every campaign starts from one shared
calibration (the template campaign's ledger up to its budget row and its runs, copied into each
campaign directory: the same baseline mean and band for every arm), and every arm gets the same
small budget, written as its budget row: the calibration's charge, `--search-runs` baseline-run
costs of search, and a reserve for the baseline's reference check plus one candidate check. Each
campaign then runs its own search, stop, shipping and final re-measurement through
the broker, exactly as `attune tune` does.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from attune.app import report  # noqa: E402
from attune.app.campaign_runner import CampaignRunner  # noqa: E402
from attune.control.campaign import start  # noqa: E402
from attune.core import ledger  # noqa: E402
from attune.core.state import fold, load  # noqa: E402
from attune.tuners.registry import BUILT_IN  # noqa: E402

EXAMPLE = ROOT / "examples" / "campaigns" / "tinygpt-local" / "campaign.yaml"


def stop_broker(d: Path) -> None:
    subprocess.run([sys.executable, "-m", "attune", "broker", "stop", str(d)], cwd=ROOT, capture_output=True,
                   timeout=120)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tuners", nargs="+", default=["heuristic", "tpe", "random"], choices=BUILT_IN)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--search-runs", type=float, default=5.0, help="search budget in baseline-run costs")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/attune-compare"))
    a = p.parse_args()

    spec = yaml.safe_load(EXAMPLE.read_text())
    spec["name"] = "tinygpt-compare"
    spec["budget"]["check_reserve_runs"] = 1  # the reserve pays for one candidate check (and the reference)
    if a.workdir.exists():
        shutil.rmtree(a.workdir)
    template = a.workdir / "template"
    template.mkdir(parents=True)
    (template / "campaign.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    t0 = time.monotonic()
    print("calibrating once ...", flush=True)
    cal = CampaignRunner(template, "heuristic", say=None)
    cal_spec, _ = start(template)
    cal._ensure_broker()
    with cal._client() as client:
        cal.calibrate(client, cal_spec)
    stop_broker(template)
    rows = ledger.read(template).rows
    st = fold(rows)
    assert st.calibration is not None
    cut = next(i for i, r in enumerate(rows) if r.type == "budget_set")
    run_cost = float(rows[cut].data["run_cost_gpu_hours"])
    reserve = float(rows[cut].data["reserve_gpu_hours"])
    charged = fold(rows[:cut]).budget.charged
    total = charged + a.search_runs * run_cost + reserve
    cal_runs = [r for r in st.runs.values() if r.kind == "calibration"]
    print(f"calibration: mean {st.calibration.mean:,.1f} tokens/s/GPU, band {st.calibration.band:.2%}, "
          f"{len(cal_runs)} runs ({len(cal_runs) - len(st.calibration_values)} invalid), {charged:.4f} rank-hours; "
          f"budget {total:.4f} = calibration + {a.search_runs:g} runs of {run_cost:.5f} + reserve {reserve:.4f} "
          f"({time.monotonic() - t0:.0f} s)", flush=True)

    def make_arm(d: Path) -> None:
        """The template's calibration (its ledger up to the budget row, its runs), then the same budget."""
        d.mkdir()
        shutil.copyfile(template / "campaign.yaml", d / "campaign.yaml")
        shutil.copytree(template / "runs", d / "runs")
        with open(d / ledger.LEDGER_NAME, "wb") as fh:
            for r in rows[:cut]:
                fh.write(ledger.canonical_line(r))
        ledger.Ledger(d).append("budget_set", {
            "gpu_hours": round(total, 9), "reserve_gpu_hours": round(reserve, 9), "run_cost_gpu_hours": run_cost,
            "reason": f"benchmark: the shared calibration's charge + {a.search_runs:g} baseline runs + the reserve"})

    results: dict[str, list[dict[str, object]]] = {}
    for tuner in a.tuners:
        for seed in a.seeds:
            d = a.workdir / f"{tuner}-{seed}"
            make_arm(d)
            t1 = time.monotonic()
            res = CampaignRunner(d, tuner, seed=seed, say=None, max_passes=3).run()
            stop_broker(d)
            h = report.build(d).headline
            st, _ = load(d)
            search_used = sum(r.charge_gpu_hours for r in st.runs.values() if r.kind == "search")
            row = {"tuner": tuner, "seed": seed, "gain": h.gain, "shipped": h.shipped_run_id,
                   "launches": h.launches, "failed": h.failed_launches,
                   "pruned": sum(1 for r in st.runs.values() if r.outcome == "pruned"),
                   "used": h.gpu_hours_used, "search_used": search_used, "budget": st.budget.total,
                   "seconds": round(time.monotonic() - t1)}
            results.setdefault(tuner, []).append(row)
            print(json.dumps(row, default=str), flush=True)
            del res

    print()
    print(f"{'tuner':<10} {'mean gain':>10} {'gains':>26} {'launches':>9} {'failed':>7} {'pruned':>7} "
          f"{'used/budget (rank-h)':>22}")
    for tuner, rows in results.items():
        gains = [float(r["gain"] or 0.0) for r in rows]  # type: ignore[arg-type]
        mean = statistics.fmean(gains)
        used = statistics.fmean(float(r["used"]) for r in rows)  # type: ignore[arg-type]
        budget = float(rows[0]["budget"] or 0.0)  # type: ignore[arg-type]
        print(f"{tuner:<10} {mean:>+10.1%} {', '.join(f'{g:+.1%}' for g in gains):>26} "
              f"{statistics.fmean(int(r['launches']) for r in rows):>9.1f} "  # type: ignore[call-overload]
              f"{statistics.fmean(int(r['failed']) for r in rows):>7.1f} "  # type: ignore[call-overload]
              f"{statistics.fmean(int(r['pruned']) for r in rows):>7.1f} "  # type: ignore[call-overload]
              f"{used:>10.4f} / {budget:.4f}")
    print(f"\ntotal {time.monotonic() - t0:.0f} s; gains are the shipped recipe's final re-measurement over the "
          "baseline's (0 when the baseline ships)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
