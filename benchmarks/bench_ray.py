"""Ray backend benchmark: what the backend adds around a job, on a running Ray cluster.

usage: python benchmarks/bench_ray.py [--address http://127.0.0.1:8265] [--jobs 3] [--json]

Each job is a short shell loop (no PyTorch, so the figures are the backend's and Ray's, not the
trainer's). For each: the time `submit` takes (capacity check + submission), the queue time from
Ray's submission to the script's start line (the part never charged), the time from the job's end
to the broker seeing it finished, and the mean time of one `status` call. Start the one-machine
cluster first: bash scripts/start-ray.sh. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from broker.backends.base import JobSpec  # noqa: E402
from broker.backends.ray import RayBackend  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--address", default="http://127.0.0.1:8265")
    ap.add_argument("--jobs", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    b = RayBackend(address=a.address, gpu_request="none")
    camp = f"bench{uuid.uuid4().hex[:6]}"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.jobs):
            run = Path(tmp) / f"r{i}"
            spec = JobSpec(job_id=f"r{i}", campaign=camp, argv=("bash", "-c", "for i in 1 2 3; do echo step $i; sleep 0.5; done"),
                           env={}, workdir=Path(tmp), run_dir=run, gpus=1, gpus_per_node=1)
            t0 = time.monotonic()
            sid = b.submit(spec)
            submit_s = time.monotonic() - t0
            calls = []
            while True:
                c0 = time.monotonic()
                st = b.status(sid)
                calls.append(time.monotonic() - c0)
                if st.state.finished:
                    seen_at = time.time()
                    break
                time.sleep(0.2)
            info = b.client().get_job_info(sid)
            rows.append({"state": st.state.value, "submit_s": submit_s,
                         "queue_s": (st.started_at or 0) - info.start_time / 1000,
                         "run_s": (st.ended_at or 0) - (st.started_at or 0),
                         "end_to_seen_s": seen_at - (st.ended_at or seen_at),
                         "status_call_s": statistics.mean(calls), "status_calls": len(calls)})
    out = {"address": a.address, "jobs": rows,
           "median": {k: statistics.median(r[k] for r in rows) for k in
                      ("submit_s", "queue_s", "run_s", "end_to_seen_s", "status_call_s")}}
    if a.json:
        print(json.dumps(out, indent=2))
    else:
        for i, r in enumerate(rows):
            print(f"job {i}: {r['state']}, submit {r['submit_s']:.2f} s, queued (uncharged) {r['queue_s']:.2f} s, "
                  f"ran {r['run_s']:.2f} s, end -> seen {r['end_to_seen_s']:.2f} s, "
                  f"status call {1000 * r['status_call_s']:.0f} ms (x{r['status_calls']})")
        m = out["median"]
        print(f"median: submit {m['submit_s']:.2f} s, queue {m['queue_s']:.2f} s, run {m['run_s']:.2f} s, "
              f"end -> seen {m['end_to_seen_s']:.2f} s, status call {1000 * m['status_call_s']:.0f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
