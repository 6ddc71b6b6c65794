"""Launches per second through the control plane on a campaign whose ledger has 10,000 rows.

    python benchmarks/bench_launch_rate.py [--rows 10000] [--launches 30] [--no-prefix-check] [--json]

A campaign of the stand-in trainer (tests/fake_trainer.py's spec, local backend, search rules off)
is calibrated through `Control` (five calibration runs admitted, given a real stand-in log, finished
and scored), then filled up to `--rows` rows with finished search runs appended through the ledger
API as the broker writes them (admitted, submitted, started, finished, measured). Then it times
`--launches` search launches through one `Control`: admit (the run generator, layer 1 of the gate,
the identical-recipe rule, budget admission, job.json, `launch_admitted`), `run_submitted`,
`run_started`, and finish (the metrics reader scores a real log, the charge, `run_finished`,
`measurement`). No job process runs in the timed loop: the figure is the control plane's own rate.
`--no-prefix-check`: the incremental state reader without its SHA-256 of the rows already read (the
check that notices an in-place edit of an old row), to show what that check costs.

It runs on older code too (`Control` without an incremental reader): point PYTHONPATH at a copy.

Prints figures; asserts nothing but that every launch was admitted and finished ok.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from attune.control.plane import Control, JobFacts  # noqa: E402
from attune.core.ledger import Ledger  # noqa: E402
from tests._broker_helpers import make_campaign, search  # noqa: E402

BUDGET = {"gpu_hours": 1e9, "reserve_gpu_hours": 1.0, "concurrency": 4}


def stand_in_log(tmp: Path) -> Path:
    """One real log of the stand-in trainer (14 steps), copied into every run's directory."""
    out = tmp / "template-log.txt"
    with open(out, "wb") as fh:
        subprocess.run([sys.executable, str(ROOT / "tests" / "fake_trainer.py"), "--world-size", "2",
                        "--train-iters", "14", "--fake-step-ms", "5"], stdout=fh, stderr=subprocess.STDOUT,
                       check=True, cwd=ROOT)
    return out


def run_once(c: Control, log: Path, request: dict[str, object]) -> dict[str, object]:
    """Admit, submit, start and finish one run; returns what finish said."""
    a = c.admit(request)
    if not a.admitted or a.run_id is None:
        raise SystemExit(f"refused: {a.code}: {a.reason}")
    c.record_submitted(a.run_id, "local", f"pid-{a.run_id}")
    t0 = time.time()
    c.record_started(a.run_id, t0, ["localhost"])
    shutil.copyfile(log, c.run_dir(a.run_id) / "log.txt")
    return c.finish(a.run_id, JobFacts(state="completed", started_at=t0, ended_at=t0 + 0.3, exit_code=0,
                                       nodes=["localhost"]))


def fill(d: Path, rows: int) -> int:
    """Append finished search runs (5 rows each) until the ledger has `rows` rows; returns the count."""
    led = Ledger(d)
    n = len(led.rows())
    i = 0
    while n + 5 <= rows:
        rid = f"f{i:05d}-filler"
        for type_, data in (
            ("launch_admitted", {"run_id": rid, "kind": "search", "expected_gpu_hours": 0.0002,
                                 "changes": {"args": {"--fake-variant": 100_000 + i}, "env": {}},
                                 "hypothesis": "filler: a finished search run", "lever": "variant",
                                 "expected_gain": 0.01, "profile": False, "base_run_id": "leader",
                                 "recipe_key": f"filler-{i}", "retry_of": None, "prune_below": None}),
            ("run_submitted", {"run_id": rid, "backend": "local", "backend_id": f"pid-{i}"}),
            ("run_started", {"run_id": rid, "started_at": 1.0e9, "nodes": ["localhost"]}),
            ("run_finished", {"run_id": rid, "outcome": "ok", "charge_gpu_hours": 0.0002, "charged_to": "budget",
                              "started_at": 1.0e9, "ended_at": 1.0e9 + 0.3, "exit_code": 0,
                              "nodes": ["localhost"], "reason": "ok"}),
            ("measurement", {"run_id": rid, "tokens_per_s_per_gpu": 1000.0 + i % 7, "valid": True,
                             "invalid_reasons": [], "verdict": "within_band"}),
        ):
            led.append(type_, data)
        n += 5
        i += 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=10_000)
    ap.add_argument("--launches", type=int, default=30)
    ap.add_argument("--no-prefix-check", action="store_true")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        log = stand_in_log(tmp)
        d = make_campaign(tmp, name="bench-rate", search_rules="off", budget=BUDGET)
        c = Control(d)
        for _ in range(5):
            run_once(c, log, {"kind": "calibration"})
        if c.state().calibration is None:
            raise SystemExit("calibration did not complete")
        t0 = time.perf_counter()
        n_rows = fill(d, a.rows)
        fill_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        c = Control(d)  # a broker that starts on the full ledger
        open_s = time.perf_counter() - t0
        follower = getattr(c, "_follower", None)
        if a.no_prefix_check and follower is not None:
            follower.verify_prefix = False
        t0 = time.perf_counter()
        st = c.state()
        state_s = time.perf_counter() - t0

        per: list[float] = []
        for i in range(a.launches):
            t1 = time.perf_counter()
            out = run_once(c, log, search({"--fake-variant": i + 1}, lever=f"variant{i}"))
            per.append(time.perf_counter() - t1)
            if out.get("outcome") != "ok":
                raise SystemExit(f"launch {i} finished {out.get('outcome')}: {out.get('reason')}")
        total = sum(per)
        rows_end = c.state().last_seq + 1
    figures = {
        "ledger_rows_at_start": n_rows, "ledger_rows_at_end": rows_end, "runs_at_start": len(st.runs),
        "launches": a.launches, "launches_per_s": a.launches / total,
        "ms_per_launch_mean": 1000 * statistics.fmean(per), "ms_per_launch_median": 1000 * statistics.median(per),
        "incremental": follower is not None, "prefix_check": follower is not None and follower.verify_prefix,
        "ms_control_open": 1000 * open_s, "ms_state_call": 1000 * state_s, "fill_s": fill_s,
    }
    if a.json:
        print(json.dumps(figures, indent=2))
        return
    how = ("full re-read per state()" if follower is None else
           f"incremental state, prefix check {'on' if follower.verify_prefix else 'off'}")
    print(f"control plane: {how}")
    print(f"ledger: {n_rows} rows ({len(st.runs)} runs) at the start, {rows_end} at the end")
    print(f"Control() on the full ledger: {figures['ms_control_open']:.0f} ms; one state(): "
          f"{figures['ms_state_call']:.1f} ms")
    print(f"{a.launches} launches (admit + submitted + started + finish with a scored log): "
          f"{figures['launches_per_s']:.2f} launches/s, {figures['ms_per_launch_mean']:.1f} ms mean, "
          f"{figures['ms_per_launch_median']:.1f} ms median")


if __name__ == "__main__":
    main()
