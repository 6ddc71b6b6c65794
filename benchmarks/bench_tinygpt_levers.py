"""Measure tinygpt's baseline and its structural levers on this machine (prints a table).

Each configuration runs for real (torchrun, 14 steps) and is scored with attune.core.measure's windowed
throughput over steps 4-13 (iterations 5-14), from the trainer's --metrics-out file. The final loss is
printed so that a lever which changed the objective would show. Slow: about 10 s per configuration
on 2 idle cores. Usage: ``python benchmarks/bench_tinygpt_levers.py [--repeat N] [--only NAME ...]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from attune.core.measure import window_iterations, windowed_throughput  # noqa: E402

TRAIN = ROOT / "examples" / "tinygpt" / "train.py"
CONFIGS: dict[str, tuple[int, list[str]]] = {
    "baseline (dp2, mb1)": (2, []),
    "2 threads per rank": (2, ["--num-threads", "2"]),
    "mb2": (2, ["--micro-batch-size", "2"]),
    "mb8": (2, ["--micro-batch-size", "8"]),
    "mb8 + foreach": (2, ["--micro-batch-size", "8", "--optimizer-impl", "foreach"]),
    "mb8 + fused": (2, ["--micro-batch-size", "8", "--optimizer-impl", "fused"]),
    "mb8 + overlap-grad-reduce": (2, ["--micro-batch-size", "8", "--overlap-grad-reduce"]),
    "mb8 + bucket 40M": (2, ["--micro-batch-size", "8", "--ddp-bucket-size", "40000000"]),
    "mb8 + full recompute": (2, ["--micro-batch-size", "8", "--recompute-granularity", "full"]),
}


def run(nproc: int, args: list[str], out: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("TINYGPT_FAULT", None)
    launch = [sys.executable, str(TRAIN)] if nproc == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), str(TRAIN)]
    subprocess.run([*launch, "--train-iters", "14", "--metrics-out", str(out), *args], check=True, cwd=ROOT,
                   env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return json.loads(out.read_text())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--only", nargs="*", default=None)
    a = p.parse_args()
    window = set(window_iterations(4, 13))
    print(f"{'config':32s} {'tok/s/rank':>11s} {'step ms':>8s} {'wall s':>7s} {'final loss':>11s}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, (nproc, args) in CONFIGS.items():
            if a.only and name not in a.only:
                continue
            tps, ms, walls, loss = [], [], [], 0.0
            for i in range(a.repeat):
                t0 = time.perf_counter()
                m = run(nproc, args, Path(tmp) / f"{i}.json")
                walls.append(time.perf_counter() - t0)
                recs = [r for r in m["iterations"] if r["iteration"] in window]
                tps.append(windowed_throughput([r["tokens"] for r in recs],
                                               [r["step_time_ms"] / 1000 for r in recs], nproc))
                ms.append(statistics.fmean(r["step_time_ms"] for r in recs))
                loss = m["iterations"][-1]["lm_loss"]
            print(f"{name:32s} {statistics.median(tps):11.0f} {statistics.median(ms):8.1f} "
                  f"{statistics.median(walls):7.1f} {loss:11.6f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
