"""Small hand-built Kineto traces for the trace analyzer's tests."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

BASE = 1_000_000.0  # a non-zero clock, as in real traces


def x(cat: str, name: str, ts: float, dur: float, pid: int | str = 1, tid: int | str = 1, **args: Any) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": BASE + ts, "dur": dur, "args": args}


def kernel(name: str, ts: float, dur: float, corr: int, stream: int = 7, cat: str = "kernel", **args: Any) -> dict:
    return x(cat, name, ts, dur, pid=0, tid=stream, stream=stream, correlation=corr, device=0, **args)


def launch(ts: float, dur: float, corr: int, name: str = "cudaLaunchKernel", tid: int = 1) -> dict:
    return x("cuda_runtime", name, ts, dur, tid=tid, correlation=corr)


def step(n: int, ts: float, dur: float) -> dict:
    return x("user_annotation", f"ProfilerStep#{n}", ts, dur)


def write_trace(path: Path, events: list[dict], rank: int | None = 0, world: int | None = 1,
                meta_after: bool = False, pretty: bool = True, **meta: Any) -> Path:
    """Write a trace; with ``meta_after`` the metadata keys follow the events."""
    header: dict[str, Any] = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "Test GPU"}]}
    if rank is not None:
        header["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": world, **meta.pop("dist", {})}
    header.update(meta)
    doc: dict[str, Any] = {}
    if meta_after:
        doc["traceEvents"] = events
        doc.update(header)
    else:
        doc.update(header)
        doc["traceEvents"] = events
    text = json.dumps(doc, indent=2 if pretty else None)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".gz"):
        with gzip.open(path, "wt", encoding="utf-8") as fh:
            fh.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def known_gpu_events() -> list[dict]:
    """Two steps with every kind of time in known amounts (see test_known_breakdown)."""
    dp = {"Collective name": "allreduce", "Process Group Description": "DATA_PARALLEL_GROUP"}
    pp = {"Collective name": "recv", "Process Group Description": "PIPELINE_MODEL_PARALLEL_GROUP"}
    return [
        step(1, 0, 100),
        step(2, 100, 100),
        x("user_annotation", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 0, 6),
        launch(6, 3, 1),
        launch(12, 1, 2),
        launch(14, 1, 3),
        launch(16, 1, 4, name="cudaMemcpyAsync"),
        launch(68, 12, 5, name="cudaStreamSynchronize"),
        launch(85, 5, 6),
        launch(120, 5, 7),
        x("cpu_op", "aten::mm", 5, 10),
        x("cpu_op", "aten::mm", 84, 7),
        kernel("gemm_kernel", 10, 30, 1),
        kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 30, 30, 2, stream=20, **dp),
        kernel("ncclDevKernel_SendRecv", 60, 5, 3, stream=21, **pp),
        kernel("Memcpy HtoD (Pinned -> Device)", 62, 8, 4, cat="gpu_memcpy"),
        kernel("Stream Sync", 70, 2, 5, cat="cuda_sync"),
        kernel("gemm_kernel", 150, 10, 6),
        kernel("gemm_kernel", 170, 10, 7),
        {"ph": "s", "id": 1, "pid": 1, "tid": 1, "ts": BASE + 6, "cat": "ac2g", "name": "ac2g"},
        {"ph": "f", "id": 1, "pid": 0, "tid": 7, "ts": BASE + 10, "cat": "ac2g", "name": "ac2g", "bp": "e"},
        {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "python"}},
    ]
