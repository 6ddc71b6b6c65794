"""Throughput and peak memory of the metrics reader on a generated Megatron-LM log.

    python benchmarks/bench_metrics.py                 # 1 GB log, chatter from 256 ranks
    python benchmarks/bench_metrics.py --dense --size-mb 256   # iteration lines only (worst case)

The log is written to a temporary directory and deleted afterwards. The reader runs in a
fresh subprocess, which reports its own wall time and peak RSS (getrusage ru_maxrss), so the
figures exclude the generator. The log was just written, so it is read from the page cache:
the figures are the parser's speed, not the disk's. Wall-clock MB/s drops when other processes
compete for the CPU; MB/s per CPU second does not.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

RANK_CHATTER = (
    "[rank{r}]:[W{d:02d}02 11:04:17.{us:06d} reducer.cpp:1400] Warning: find_unused_parameters=True was specified "
    "in DDP constructor, but did not find any unused parameters in the forward pass.\n"
    "node-{n:03d}:{pid}:{pid} [{g}] NCCL INFO Channel {c:02d}/0 : {r}[{g}] -> {nxt}[{g}] via P2P/IPC/read\n"
)


def iteration_line(it: int, total: int, gbs: int) -> str:
    ms = 5300.0 + (it * 37 % 101) / 10.0
    return (
        f" [2026-10-02 11:{it // 60 % 60:02d}:{it % 60:02d}.123456] iteration {it:8d}/{total:8d} |"
        f" consumed samples: {it * gbs:12d} | elapsed time per iteration (ms): {ms:.1f} |"
        f" throughput per GPU (TFLOP/s/GPU): 402.7 | learning rate: 1.000000E-05 |"
        f" global batch size: {gbs:5d} | lm loss: {2.0 + 1.0 / it:.6E} | load_balancing_loss: 1.020000E+00 |"
        f" loss scale: 1.0 | grad norm: 0.812 | number of skipped iterations:   0 |"
        f" number of nan iterations:   0 |\n"
    )


def generate(path: Path, size_bytes: int, *, dense: bool, ranks: int) -> int:
    """Write a Megatron-LM log of about size_bytes; returns the number of iterations."""
    gbs = 2048
    with open(path, "w", buffering=2**22) as fh:
        fh.write("------------------------ arguments ------------------------\n")
        for name, value in (("seq_length", "4096"), ("global_batch_size", str(gbs)), ("world_size", str(ranks)),
                            ("pipeline_model_parallel_size", "8"), ("tensor_model_parallel_size", "4")):
            fh.write(f"  {name} {'.' * (48 - len(name))} {value}\n")
        fh.write("-------------------- end of arguments ---------------------\n")
        # Per-step chatter from every rank (one warning and one NCCL line each), built once.
        chatter = "" if dense else "".join(
            RANK_CHATTER.format(r=r, d=10, us=r * 37 % 10**6, n=r // 8, pid=4000 + r, g=r % 8, c=r % 32,
                                nxt=(r + 1) % ranks)
            for r in range(ranks)
        )
        per_step = len(iteration_line(1, 10**6, gbs)) + len(chatter)
        total = max(1, (size_bytes - fh.tell()) // per_step)
        for it in range(1, total + 1):
            fh.write(chatter)
            fh.write(iteration_line(it, total, gbs))
            if it <= 2:
                for stage in range(8):
                    fh.write(f"[Rank {stage * ranks // 8}] (after {it} iterations) memory (MB) | allocated: 51234.1"
                             f" | max allocated: {70000 + stage}.5 | reserved: 72000.0 | max reserved: 72000.0\n")
    return total


CHILD = """
import json, resource, sys, time
from attune.readers.metrics import read_metrics
r0 = resource.getrusage(resource.RUSAGE_SELF)
t0 = time.perf_counter()
m = read_metrics(sys.argv[1], framework="megatron-lm", gpus=int(sys.argv[2]), window=(4, 13))
wall = time.perf_counter() - t0
r1 = resource.getrusage(resource.RUSAGE_SELF)
cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
print(json.dumps({"wall_s": wall, "cpu_s": cpu, "maxrss_kib": r1.ru_maxrss,
                  "steps": len(m.steps), "bytes": m.bytes_read, "valid": m.valid,
                  "tokens_per_s_per_gpu": m.tokens_per_s_per_gpu}))
"""

BASELINE = """
import json, resource
from attune.readers.metrics import read_metrics  # noqa: F401 - the import's own footprint
print(json.dumps({"maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def run_child(code: str, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    return json.loads(out.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=float, default=1024.0, help="log size in MiB (default 1024)")
    ap.add_argument("--dense", action="store_true", help="iteration lines only: the worst case for the reader")
    ap.add_argument("--ranks", type=int, default=256, help="ranks whose chatter fills the log (default 256)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="attune-bench-") as tmp:
        path = Path(tmp) / "megatron.log"
        t0 = time.perf_counter()
        iterations = generate(path, int(args.size_mb * 2**20), dense=args.dense, ranks=args.ranks)
        gen_s = time.perf_counter() - t0
        size = path.stat().st_size
        base = run_child(BASELINE)
        result = run_child(CHILD, str(path), str(args.ranks))
    mb = size / 1e6
    kind = "dense (iteration lines only)" if args.dense else f"chatter from {args.ranks} ranks"
    print(f"log: {size / 2**20:,.0f} MiB, {iterations:,} iterations, {kind} (generated in {gen_s:.1f} s)")
    print(f"reader: {result['wall_s']:.2f} s wall, {mb / result['wall_s']:,.0f} MB/s "
          f"({result['cpu_s']:.2f} s CPU, {mb / result['cpu_s']:,.0f} MB/s per CPU second; "
          f"load average {os.getloadavg()[0]:.1f}), {result['steps']:,} steps kept")
    print(f"peak RSS: {result['maxrss_kib'] / 1024:,.1f} MiB (interpreter + imports alone: "
          f"{base['maxrss_kib'] / 1024:,.1f} MiB)")
    print(f"check: valid={result['valid']} tokens/s/GPU={result['tokens_per_s_per_gpu']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
