"""Trace analyzer benchmark: attune's analyzer against Holistic Trace Analysis on a large trace set.

usage: python benchmarks/bench_traces.py [--total-gb 1.0] [--ranks 8] [--pp 2]
                                         [--hta-gb G] [--skip-hta] [--dir D] [--keep] [--json]

Builds a synthetic multi-rank Kineto trace set of --total-gb gigabytes (plain JSON, one file per
rank, pipeline x data parallel; see tests/trace_synth.py) in a temporary directory, then times,
each in its own process tree:

- attune: ``python -m attune trace analyze DIR --json`` (its default parallelism);
- HTA: ``TraceAnalysis(trace_dir=DIR)`` then ``get_temporal_breakdown`` and
  ``get_comm_comp_overlap`` (HTA 0.5.0, its default parallelism).

Peak memory is the largest total resident set of the process tree (sampled every 50 ms) and the
largest single process seen. HTA needs several times the trace size in memory: with --hta-gb, HTA
(and attune again, for a like-for-like pair) run on a smaller set of that size and HTA's figures
at the full size are extrapolated linearly (and marked so). It also checks that both report the
same per-rank figures. The directory is deleted afterwards unless --keep.

Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.trace_synth import write_run  # noqa: E402

_HTA_SCRIPT = """
import json, logging, sys
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
ta = TraceAnalysis(trace_dir=sys.argv[1])
tb = ta.get_temporal_breakdown(visualize=False)
ov = ta.get_comm_comp_overlap(visualize=False)
out = {}
for _, row in tb.iterrows():
    out[int(row["rank"])] = {"idle_us": float(row["idle_time(us)"]), "compute_us": float(row["compute_time(us)"]),
                             "non_compute_us": float(row["non_compute_time(us)"])}
for _, row in ov.iterrows():
    out[int(row["rank"])]["comm_comp_overlap_pct"] = float(row["comp_comm_overlap_pctg"])
json.dump(out, sys.stdout)
"""


def _tree_rss(root_pid: int) -> tuple[int, int]:
    """(total, largest) resident bytes of a process and its descendants."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
            fields = stat[stat.rindex(")") + 2 :].split()
            ppid, pages = int(fields[1]), int(fields[21])
        except (OSError, ValueError, IndexError):
            continue
        pid = int(entry)
        children.setdefault(ppid, []).append(pid)
        rss[pid] = pages * os.sysconf("SC_PAGE_SIZE")
    total = largest = 0
    stack = [root_pid]
    while stack:
        pid = stack.pop()
        r = rss.get(pid, 0)
        total += r
        largest = max(largest, r)
        stack.extend(children.get(pid, []))
    return total, largest


def measure(cmd: list[str], stdout_path: Path) -> dict[str, float]:
    """Run ``cmd``; wall seconds and peak memory of its process tree."""
    peak = {"total": 0, "largest": 0}
    with open(stdout_path, "wb") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, cwd=ROOT)
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                total, largest = _tree_rss(proc.pid)
                peak["total"] = max(peak["total"], total)
                peak["largest"] = max(peak["largest"], largest)
                done.wait(0.05)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, err = proc.communicate()
        seconds = time.perf_counter() - t0
        done.set()
        sampler.join()
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[:4]} failed ({proc.returncode}): {err.decode()[-2000:]}")
    return {"seconds": seconds, "peak_mb": peak["total"] / 2**20, "largest_process_mb": peak["largest"] / 2**20}


def build(directory: Path, total_bytes: int, ranks: int, pp: int) -> int:
    dp = ranks // pp
    write_run(directory, pp=pp, dp=dp, steps=3, target_bytes_per_rank=total_bytes // ranks)
    return sum(f.stat().st_size for f in directory.iterdir())


def run_attune(directory: Path, work: Path) -> tuple[dict[str, float], dict]:
    out = work / "attune.json"
    m = measure([sys.executable, "-m", "attune", "trace", "analyze", str(directory), "--json"], out)
    report = json.loads(out.read_text())
    ranks = {
        r["rank"]: {k: r[k] for k in ("idle_us", "compute_us", "non_compute_us", "comm_comp_overlap_pct")}
        for r in report["ranks"]
    }
    return m, ranks


def run_hta(directory: Path, work: Path) -> tuple[dict[str, float], dict]:
    out = work / "hta.json"
    m = measure([sys.executable, "-c", _HTA_SCRIPT, str(directory)], out)
    return m, {int(k): v for k, v in json.loads(out.read_text()).items()}


def agreement(a: dict, h: dict) -> float:
    """Largest relative difference (%) over ranks of idle, compute and non-compute time."""
    worst = 0.0
    for rank, hv in h.items():
        av = a.get(rank)
        if av is None:
            return float("inf")
        for k in ("idle_us", "compute_us", "non_compute_us"):
            worst = max(worst, abs(av[k] - hv[k]) / max(abs(hv[k]), 1.0) * 100)
        if hv.get("comm_comp_overlap_pct") == hv.get("comm_comp_overlap_pct"):  # not NaN
            worst = max(worst, abs(round(av["comm_comp_overlap_pct"], 2) - hv["comm_comp_overlap_pct"]))
    return worst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--total-gb", type=float, default=1.0, help="size of the trace set (default 1.0)")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--hta-gb", type=float, help="run HTA on a set of this size and extrapolate")
    ap.add_argument("--skip-hta", action="store_true")
    ap.add_argument("--dir", type=Path, help="where to build the traces (default: a temporary directory)")
    ap.add_argument("--keep", action="store_true", help="keep the traces")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    a = ap.parse_args()
    if a.ranks % a.pp:
        ap.error("--ranks must be a multiple of --pp")

    base = Path(tempfile.mkdtemp(prefix="bench-traces-", dir=a.dir))
    figures: dict[str, object] = {"ranks": a.ranks, "pp": a.pp}
    try:
        full = base / "full"
        t0 = time.perf_counter()
        size = build(full, int(a.total_gb * 1e9), a.ranks, a.pp)
        figures["trace_bytes"] = size
        figures["build_seconds"] = time.perf_counter() - t0
        print(f"built {size / 1e9:.2f} GB in {a.ranks} rank traces in {figures['build_seconds']:.0f} s", flush=True)

        m_att, att = run_attune(full, base)
        figures["attune"] = m_att
        print(f"attune: {m_att['seconds']:.1f} s, peak {m_att['peak_mb']:.0f} MiB "
              f"(largest process {m_att['largest_process_mb']:.0f} MiB)", flush=True)

        if not a.skip_hta:
            if a.hta_gb is not None and a.hta_gb < a.total_gb:
                small = base / "small"
                small_size = build(small, int(a.hta_gb * 1e9), a.ranks, a.pp)
                scale = size / small_size
                m_att_s, att_s = run_attune(small, base)
                m_hta, hta = run_hta(small, base)
                figures["at_hta_size"] = {"trace_bytes": small_size, "attune": m_att_s, "hta": m_hta,
                                          "max_rel_diff_pct": agreement(att_s, hta)}
                print(f"at {small_size / 1e9:.2f} GB: attune {m_att_s['seconds']:.1f} s / {m_att_s['peak_mb']:.0f} MiB, "
                      f"HTA {m_hta['seconds']:.1f} s / {m_hta['peak_mb']:.0f} MiB; "
                      f"figures differ by at most {figures['at_hta_size']['max_rel_diff_pct']:.4f}%", flush=True)
                hta_full = {k: v * scale for k, v in m_hta.items()}
                figures["hta"] = {**hta_full, "extrapolated_from_bytes": small_size}
                label = f"HTA (extrapolated x{scale:.2f})"
            else:
                m_hta, hta = run_hta(full, base)
                figures["hta"] = m_hta
                figures["max_rel_diff_pct"] = agreement(att, hta)
                hta_full = m_hta
                label = "HTA"
                print(f"figures differ by at most {figures['max_rel_diff_pct']:.4f}%")
            print(f"{label}: {hta_full['seconds']:.1f} s, peak {hta_full['peak_mb']:.0f} MiB "
                  f"(largest process {hta_full['largest_process_mb']:.0f} MiB)")
            speed = hta_full["seconds"] / m_att["seconds"]
            mem = m_att["peak_mb"] / hta_full["peak_mb"]
            figures["speedup"] = speed
            figures["memory_ratio"] = mem
            print(f"attune is {speed:.1f}x faster than HTA and uses {mem:.3f} of its peak memory "
                  f"(goal: >= 10x faster at <= 0.2 of the memory)")
    finally:
        if not a.keep:
            shutil.rmtree(base, ignore_errors=True)
        else:
            print(f"traces kept in {base}")
    if a.json:
        print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
