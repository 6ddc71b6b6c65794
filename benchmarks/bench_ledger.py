"""Ledger benchmark: durable appends per second, and the time to rebuild a 10,000-row state.

usage: python benchmarks/bench_ledger.py [--appends N] [--rows 10000] [--json]

Prints figures; asserts nothing (speed targets live here, not in timed tests).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attune.core import state  # noqa: E402
from attune.core.ledger import Ledger, verify  # noqa: E402


def realistic_rows(n: int):  # noqa: ANN201 - a generator of (type, data)
    yield "campaign_started", {"name": "bench", "spec_sha256": "0" * 64, "gpus": 128,
                               "budget_gpu_hours": 1e9, "reserve_gpu_hours": 10.0}
    i = 0
    while True:
        rid = f"r{i}"
        for item in (
            ("launch_admitted", {"run_id": rid, "kind": "search", "expected_gpu_hours": 60.0,
                                 "changes": {"args": {"--pipeline-model-parallel-size": 8}}, "lever": "pp",
                                 "hypothesis": "the pipeline bubble dominates; deeper pipeline with VP"}),
            ("run_started", {"run_id": rid}),
            ("run_finished", {"run_id": rid, "outcome": "ok", "charge_gpu_hours": 61.0}),
            ("measurement", {"run_id": rid, "tokens_per_s_per_gpu": 700.0 + i % 50, "valid": True,
                             "verdict": "within_band"}),
        ):
            yield item
            n -= 1
            if n <= 1:
                return
        i += 1


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--appends", type=int, default=2000)
    ap.add_argument("--rows", type=int, default=10_000)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d1 = Path(tmp) / "appends"
        d1.mkdir()
        led = Ledger(d1)
        t0 = time.perf_counter()
        for type_, data in realistic_rows(a.appends):
            led.append(type_, data)
        append_s = time.perf_counter() - t0
        n_appended = len(led.rows())

        d2 = Path(tmp) / "rebuild"
        d2.mkdir()
        led2 = Ledger(d2)
        for type_, data in realistic_rows(a.rows):
            led2.append(type_, data)
        size = (d2 / "ledger.jsonl").stat().st_size
        t0 = time.perf_counter()
        s, _ = state.load(d2)
        rebuild_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        rep = verify(d2)
        verify_s = time.perf_counter() - t0
        assert rep.ok and s.last_seq + 1 == rep.rows
    out = {
        "appends": n_appended,
        "appends_per_s": n_appended / append_s,
        "append_ms_mean": append_s / n_appended * 1e3,
        "rebuild_rows": rep.rows,
        "rebuild_ledger_bytes": size,
        "rebuild_s": rebuild_s,
        "verify_s": verify_s,
    }
    if a.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"durable appends: {out['appends_per_s']:.0f}/s ({out['append_ms_mean']:.3f} ms each, fsync per row)")
        print(f"rebuild state of {rep.rows} rows ({size / 1e6:.1f} MB): {rebuild_s * 1e3:.0f} ms; "
              f"verify chain: {verify_s * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
