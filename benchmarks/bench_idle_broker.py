"""CPU an idle local broker burns: start the campaign's broker, let it settle, and read its CPU time
(user + system, from /proc) over a window with no requests and nothing in flight.

    python benchmarks/bench_idle_broker.py CAMPAIGN_DIR [--seconds 30] [--settle 5]

CAMPAIGN_DIR should hold a finished campaign (e.g. one run by `attune tune --tuner heuristic` on a
simulated example). Prints the CPU seconds used over the window and the share of one core; stops the
broker it started (never one already running: it refuses to measure that one).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from broker.client import ensure_local_broker, running_broker, stop_local_broker  # noqa: E402


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("campaign")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--settle", type=float, default=5.0)
    a = ap.parse_args()
    d = Path(a.campaign).resolve()
    if running_broker(d):
        print(f"{d}: a broker is already running for this campaign; stop it first", file=sys.stderr)
        return 2
    ep = ensure_local_broker(d)
    assert ep.pid is not None
    try:
        time.sleep(a.settle)
        c0, t0 = cpu_seconds(ep.pid), time.monotonic()
        time.sleep(a.seconds)
        c1, t1 = cpu_seconds(ep.pid), time.monotonic()
    finally:
        stop_local_broker(d)
    used = c1 - c0
    print(f"idle broker pid {ep.pid}: {used:.2f} CPU s over {t1 - t0:.1f} s ({100 * used / (t1 - t0):.2f}% of a core)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
