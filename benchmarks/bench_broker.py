"""Broker figures: admission under concurrent launch requests, request latency, and (with --tinygpt)
a small real tinygpt campaign run through the broker on the local backend.

    python benchmarks/bench_broker.py                 # admission and latency (stand-in trainer, ~30 s)
    python benchmarks/bench_broker.py --tinygpt       # plus 5 calibration runs and 3 candidates of tinygpt

Prints figures; asserts the budget invariant (no admission ever exceeded what was left for search).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from attune.control.campaign import start  # noqa: E402
from attune.core import ledger  # noqa: E402
from attune.core.state import fold  # noqa: E402
from broker.client import BrokerClient  # noqa: E402
from tests._broker_helpers import make_campaign, search  # noqa: E402


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def serve(d: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    proc = subprocess.Popen([sys.executable, "-m", "attune", "broker", "serve", "--campaign", str(d), "--port", "0"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ep = d / ".broker" / "endpoint.json"
    deadline = time.monotonic() + 30
    while not ep.exists():
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit("the broker did not start")
        time.sleep(0.05)
    return proc, json.loads(ep.read_text())["url"], (d / ".broker" / "token").read_text().strip()


def calibrate(c: BrokerClient, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        status, camp = c.call("GET", "/v1/campaign")
        cal = camp["calibration"]
        if cal["mean"] is not None and not camp["in_flight"]:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"calibration did not finish: {cal}")
        needed = cal["runs"] + sum(r["kind"] == "calibration" for r in camp["in_flight"]) < cal["required_runs"]
        if needed and len(camp["in_flight"]) < camp["concurrency"]:
            c.call("POST", "/v1/runs", body={"kind": "calibration"})
            continue
        time.sleep(0.2)


def check_invariant(d: Path) -> None:
    state = fold([])
    for row in ledger.read(d).rows:
        if row.type == "launch_admitted" and row.data["kind"] == "search":
            left = state.budget.search_remaining
            assert left is not None and row.data["expected_gpu_hours"] <= left + 1e-9, "budget overrun"
        state.apply(row)


def bench_admission(n_requests: int, workers: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-broker-"))
    d = make_campaign(tmp, budget={"gpu_hours": 0.01, "reserve_gpu_hours": 0.0001, "concurrency": 1000},
                      control={"poll_interval_s": 0.2, "hang_timeout_s": 600})
    proc, url, token = serve(d)
    try:
        with BrokerClient(url, token) as c:
            calibrate(c, 120)
            lat: list[float] = []
            for _ in range(50):
                t0 = time.perf_counter()
                c.call("GET", "/v1/campaign")
                lat.append(time.perf_counter() - t0)
            print(f"GET /v1/campaign: p50 {1000 * pct(lat, 0.5):.1f} ms, p95 {1000 * pct(lat, 0.95):.1f} ms")

        def launch(i: int) -> tuple[float, dict[str, Any]]:
            with BrokerClient(url, token) as cl:
                t0 = time.perf_counter()
                _, p = cl.launch(**search({"--fake-variant": 10_000 + i, "--fake-step-ms": 2000}, lever="burst"))
                return time.perf_counter() - t0, p

        t0 = time.perf_counter()
        with cf.ThreadPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(launch, range(n_requests)))
        wall = time.perf_counter() - t0
        codes = [p.get("code") or "admitted" for _, p in results]
        lats = [t for t, _ in results]
        print(f"{n_requests} concurrent launch requests from {workers} clients: decided in {wall:.2f} s "
              f"({n_requests / wall:.1f}/s); latency p50 {1000 * pct(lats, 0.5):.0f} ms, "
              f"p95 {1000 * pct(lats, 0.95):.0f} ms; admitted {codes.count('admitted')}, "
              f"refused for budget {codes.count('budget')}, other {len(codes) - codes.count('admitted') - codes.count('budget')}")
        check_invariant(d)
        s = fold(ledger.read(d).rows)
        b = s.budget
        print(f"after the burst: total {b.total:.6f} GPU-h, charged {b.charged:.6f}, in flight {b.in_flight:.6f}, "
              f"reserve {b.reserve_left:.6f}, left for search {b.search_remaining:.6f} (never negative at admission)")
        with BrokerClient(url, token) as c:
            t0 = time.perf_counter()
            for _, p in results:
                if p.get("admitted"):
                    c.call("POST", f"/v1/runs/{p['run_id']}/cancel")
            print(f"cancelled {codes.count('admitted')} runs (process groups killed, charged) in "
                  f"{time.perf_counter() - t0:.2f} s")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)


def bench_tinygpt(candidates: list[dict[str, Any]]) -> None:
    example = ROOT / "examples" / "campaigns" / "tinygpt-local" / "campaign.yaml"
    tmp = Path(tempfile.mkdtemp(prefix="bench-tinygpt-"))
    d = tmp / "tinygpt-local"
    d.mkdir()
    shutil.copy(example, d / "campaign.yaml")
    start(d)
    proc, url, token = serve(d)
    try:
        with BrokerClient(url, token) as c:
            t0 = time.perf_counter()
            calibrate(c, 900)
            t_cal = time.perf_counter() - t0
            status, camp = c.call("GET", "/v1/campaign")
            cal, b = camp["calibration"], camp["budget"]
            print(f"tinygpt calibration: {cal['runs']} runs in {t_cal:.0f} s; mean {cal['mean']:.1f} tokens/s/GPU, "
                  f"sigma {100 * cal['rel_sigma']:.2f}%, band {100 * cal['band']:.2f}%; budget {b['total_gpu_hours']:.4f} "
                  f"GPU-h (reserve {b['reserve_gpu_hours']:.4f})")
            for cand in candidates:
                status, p = c.launch(**cand)
                if status != 201:
                    print(f"  {cand['lever']}: refused ({p['code']}): {p['reason']}")
                    continue
                run = c.wait(p["run_id"], timeout_s=600)
                print(f"  {run['run_id']}: {run['outcome']}, {run['tokens_per_s_per_gpu'] or 0:.1f} tokens/s/GPU, "
                      f"verdict {run['verdict']}, charged {run['charge_gpu_hours']:.6f} GPU-h")
            status, camp = c.call("GET", "/v1/campaign")
            lead, b = camp["leader"], camp["budget"]
            gain = f"{100 * lead['gain']:+.1f}%" if lead["gain"] is not None else "-"
            print(f"leader {lead['run_id']} ({gain}); charged {b['charged_gpu_hours']:.5f} of "
                  f"{b['total_gpu_hours']:.5f} GPU-h")
        check_invariant(d)
        runs = [r for r in fold(ledger.read(d).rows).runs.values() if r.status == "finished"]
        walls = [r.ended_at - r.started_at for r in runs if r.started_at and r.ended_at]
        print(f"run wall time (admission to release): mean {statistics.fmean(walls):.1f} s over {len(walls)} runs")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
        print(f"(campaign left in {d})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--tinygpt", action="store_true", help="also run a small tinygpt campaign (minutes)")
    args = ap.parse_args()
    bench_admission(args.requests, args.workers)
    if args.tinygpt:
        loc = {"--micro-batch-size": "examples/tinygpt/config.py:47", "--optimizer-impl": "examples/tinygpt/config.py:62",
               "--overlap-grad-reduce": "examples/tinygpt/config.py:77"}
        bench_tinygpt([
            {"kind": "search", "changes": {"args": {"--micro-batch-size": 4}}, "lever": "micro-batch size",
             "hypothesis": "fewer, larger microbatches amortise per-call overhead", "expected_gain": 0.1,
             "code_locations": loc},
            {"kind": "search", "changes": {"args": {"--optimizer-impl": "foreach"}}, "lever": "optimizer kernel",
             "hypothesis": "a foreach AdamW cuts the optimizer's Python overhead", "expected_gain": 0.03,
             "code_locations": loc},
            {"kind": "search", "changes": {"args": {"--lr": 0.01}}, "lever": "learning rate",
             "hypothesis": "refused by layer 1: numeric", "expected_gain": 0.0, "code_locations": loc},
        ])


if __name__ == "__main__":
    main()
