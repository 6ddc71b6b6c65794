"""Synthetic multi-rank Kineto traces, shaped like a pipeline-parallel training profile.

Used by the tests (small traces with a known layout) and by benchmarks/bench_traces.py (a trace
set of a gigabyte or more). The event mix follows real PyTorch profiler output: profiler steps,
a data-loader annotation, nested CPU operators, Python function events, launch calls with their
``ac2g`` flow events, GEMM and elementwise kernels, host-to-device copies, NCCL point-to-point
traffic between pipeline stages, a data-parallel all-reduce overlapping the backward pass, an
optimizer, and a stream synchronisation ending each step. Events are written one at a time in
Kineto's indented layout, so memory stays flat whatever the size.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

PIPELINE_DESC = "PIPELINE_MODEL_PARALLEL_GROUP"
DATA_DESC = "DATA_PARALLEL_GROUP"

_GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"
_ELEMWISE = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
    "at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::{lambda(c10::BFloat16)#1}, "
    "at::detail::Array<char*, 2> >(int, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)"
    "::{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2>)"
)
_OPTIM = "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4>>"


class _Writer:
    def __init__(self, path: Path, header: dict) -> None:
        self.fh = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self.fh.write("{\n")
        for k, v in header.items():
            self.fh.write(f'  "{k}": {json.dumps(v)},\n')
        self.fh.write('  "traceEvents": [\n')
        self.first = True
        self.size = 0

    def event(self, text: str) -> None:
        if not self.first:
            self.fh.write(",\n")
        self.first = False
        self.fh.write(text)
        self.size += len(text) + 2

    def close(self, trailer: dict) -> None:
        self.fh.write("\n  ]")
        for k, v in trailer.items():
            self.fh.write(f',\n  "{k}": {json.dumps(v)}')
        self.fh.write("\n}\n")
        self.fh.close()


def _x(cat: str, name: str, pid: int | str, tid: int | str, ts: float, dur: float, args: str) -> str:
    return (
        f'  {{\n    "ph": "X", "cat": "{cat}", "name": {json.dumps(name)}, "pid": {pid}, "tid": {tid},\n'
        f'    "ts": {ts:.3f}, "dur": {dur:.3f},\n    "args": {{\n      {args}\n    }}\n  }}'
    )


def _flow(ph: str, corr: int, pid: int, tid: int, ts: float) -> str:
    tail = ', "bp": "e"' if ph == "f" else ""
    return (
        f'  {{\n    "ph": "{ph}", "id": {corr}, "pid": {pid}, "tid": {tid}, "ts": {ts:.3f},'
        f' "cat": "ac2g", "name": "ac2g"{tail}\n  }}'
    )


def write_rank(
    path: Path,
    rank: int,
    pp: int,
    dp: int,
    steps: int,
    layers: int = 8,
    microbatches: int = 4,
    python_events: bool = True,
    seed: int = 0,
    target_bytes: int | None = None,
) -> int:
    """Write one rank's trace; return the number of events. With ``target_bytes``, keep adding
    steps until the file reaches that size (``steps`` is then a minimum)."""
    world = pp * dp
    stage = rank // dp
    rnd = random.Random(seed * 1000 + rank)
    pid, tid = 4000 + rank, 4000 + rank
    bwd_tid = tid + 11
    pg_config = [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl", "pg_size": world,
                  "ranks": list(range(world))}]
    for d in range(dp):
        pg_config.append({"pg_name": f"pp{d}", "pg_desc": PIPELINE_DESC, "backend_config": "cuda:nccl", "pg_size": pp,
                          "ranks": [s * dp + d for s in range(pp)]})
    for s in range(pp):
        pg_config.append({"pg_name": f"dp{s}", "pg_desc": DATA_DESC, "backend_config": "cuda:nccl", "pg_size": dp,
                          "ranks": [s * dp + d for d in range(dp)]})
    header = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85024112640,
                              "computeMajor": 9, "computeMinor": 0, "maxThreadsPerBlock": 1024, "numSms": 132}],
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world, "pg_count": len(pg_config),
                            "pg_config": pg_config, "nccl_version": "2.21.5"},
        "record_shapes": 1,
    }
    w = _Writer(path, header)
    n = 0
    ext = 1
    corr = 1
    host = 1_000_000.0 + rank * 3.0
    gpu = {7: host, 20: host, 24: host}

    def op(name: str, ts: float, dur: float, t: int = tid) -> None:
        nonlocal ext, n
        w.event(_x("cpu_op", name, pid, t, ts, dur,
                   f'"External id": {ext},"Record function id": 0, "Sequence number": {ext}, "Fwd thread id": 0, '
                   f'"Concrete Inputs": ["", "", ""], "Input type": ["c10::BFloat16", "c10::BFloat16", ""], '
                   f'"Input Dims": [[4096, 4096], [4096, 4096], []], "Ev Idx": {ext}'))
        ext += 1
        n += 1

    def pyfn(name: str, ts: float, dur: float) -> None:
        nonlocal n
        if python_events:
            w.event(_x("python_function", name, pid, tid, ts, dur, f'"Python parent id": {n}, "Python id": {n + 1}, "Ev Idx": {n}'))
            n += 1

    def launch(kname: str, cat: str, kdur: float, ts: float, stream: int = 7, extra: str = "", t: int = tid,
               runtime: str = "cudaLaunchKernel") -> float:
        """A launch call at host time ts, its flow events and the device event; returns the call's end."""
        nonlocal corr, n
        ldur = 4.0 + rnd.random() * 3.0
        w.event(_x("cuda_runtime", runtime, pid, t, ts, ldur, f'"External id": {ext}, "cbid": 211, "correlation": {corr}'))
        w.event(_flow("s", corr, pid, t, ts))
        start = max(ts + ldur + 2.0, gpu[stream])
        if cat == "kernel":
            kargs = (f'"External id": {ext}, "queued": 0, "device": 0, "context": 1, "stream": {stream}, '
                     f'"correlation": {corr}, "registers per thread": 168, "shared memory": 213248, '
                     f'"blocks per SM": 1.0, "warps per SM": 12.0, "grid": [132, 1, 1], "block": [384, 1, 1], '
                     f'"est. achieved occupancy %": 19{extra}')
        else:
            kargs = (f'"External id": {ext}, "device": 0, "context": 1, "stream": {stream}, "correlation": {corr}, '
                     f'"bytes": 33554432, "memory bandwidth (GB/s)": 40.5')
        w.event(_x(cat, kname, 0, stream, start, kdur, kargs))
        w.event(_flow("f", corr, 0, stream, start))
        gpu[stream] = start + kdur
        corr += 1
        n += 4
        return ts + ldur

    def nccl(coll: str, pg: str, desc: str, stream: int, kdur: float, ts: float, t: int = tid) -> float:
        kname = {"send": "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)",
                 "recv": "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)",
                 "allreduce": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"}[coll]
        extra = (f', "Collective name": "{coll}", "In msg nelems": 4194304, "Out msg nelems": 4194304, '
                 f'"Group size": 2, "dtype": "BFloat16", "Process Group Name": "{pg}", '
                 f'"Process Group Description": "{desc}"')
        op("record_param_comms", ts, 12.0, t)
        w.event(_x("user_annotation", f"nccl:{coll}", pid, t, ts + 1.0, 10.0, f'"External id": {ext}'))
        end = launch(kname, "kernel", kdur, ts + 2.0, stream=stream, extra=extra, t=t)
        return end + 1.0

    step = 0
    while step < steps or (target_bytes is not None and w.size < target_bytes):
        s0 = host
        # data loading and the batch's copy to the device
        w.event(_x("user_annotation", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", pid, tid,
                   host, 300.0 + rnd.random() * 50, f'"External id": {ext}'))
        n += 1
        host += 360.0
        op("aten::to", host, 30.0)
        host = launch("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy", 40.0, host + 5.0, runtime="cudaMemcpyAsync") + 30.0
        for _mb in range(microbatches):
            if stage > 0:  # receive activations from the previous stage: waits on it
                gpu[20] = max(gpu[20], gpu[7]) + 150.0 * stage
                host = nccl("recv", f"pp{rank % dp}", PIPELINE_DESC, 20, 120.0, host)
                gpu[7] = max(gpu[7], gpu[20])
            for layer in range(layers):
                pyfn(f"nn.Module: Linear_{layer}", host, 60.0)
                op("aten::linear", host, 55.0)
                op("aten::addmm", host + 3.0, 40.0)
                host = launch(_GEMM, "kernel", 90.0 + rnd.random() * 20, host + 8.0) + 40.0
                op("aten::gelu", host, 20.0)
                host = launch(_ELEMWISE, "kernel", 15.0 + rnd.random() * 5, host + 4.0) + 18.0
            if stage < pp - 1:
                gpu[20] = max(gpu[20], gpu[7])
                host = nccl("send", f"pp{rank % dp}", PIPELINE_DESC, 20, 80.0, host)
        # backward on the autograd thread, with the data-parallel all-reduce overlapping it
        for mb in range(microbatches):
            for layer in range(layers):
                op("autograd::engine::evaluate_function: AddmmBackward0", host, 70.0, bwd_tid)
                host = launch(_GEMM, "kernel", 180.0 + rnd.random() * 30, host + 5.0, t=bwd_tid) + 60.0
                if mb == microbatches - 1 and layer % 4 == 3:
                    gpu[24] = max(gpu[24], gpu[7])
                    host = nccl("allreduce", f"dp{stage}", DATA_DESC, 24, 400.0 + rnd.random() * 50, host, t=bwd_tid)
        gpu[7] = max(gpu[7], gpu[24])
        w.event(_x("user_annotation", "Optimizer.step#FusedAdam.step", pid, tid, host, 200.0, f'"External id": {ext}'))
        n += 1
        for _ in range(4):
            host = launch(_OPTIM, "kernel", 60.0, host + 5.0) + 20.0
        # the step ends by waiting for the device
        end = max(host + 10.0, max(gpu.values()))
        w.event(_x("cuda_runtime", "cudaStreamSynchronize", pid, tid, host, end - host, f'"External id": {ext}, "cbid": 131, "correlation": {corr}'))
        corr += 1
        n += 1
        host = end + 20.0
        w.event(_x("user_annotation", f"ProfilerStep#{step + 10}", pid, tid, s0, host - s0, f'"External id": {ext}, "Record function id": 0'))
        n += 1
        host += 5.0
        for k in gpu:
            gpu[k] = max(gpu[k], host)
        step += 1
    w.close({"traceName": str(path), "displayTimeUnit": "ms", "baseTimeNanoseconds": 1700000000000000000})
    return n


def write_run(directory: Path, pp: int = 2, dp: int = 2, steps: int = 3, target_bytes_per_rank: int | None = None,
              gz: bool = False, **kw: object) -> list[Path]:
    """One trace per rank of a pp x dp run under ``directory``; returns the paths."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for rank in range(pp * dp):
        p = directory / f"rank{rank}.pt.trace.json"
        write_rank(p, rank, pp, dp, steps, target_bytes=target_bytes_per_rank, **kw)  # type: ignore[arg-type]
        if gz:
            import gzip
            import shutil

            gp = p.with_name(p.name + ".gz")
            with open(p, "rb") as src, gzip.open(gp, "wb", compresslevel=1) as dst:
                shutil.copyfileobj(src, dst)
            p.unlink()
            p = gp
        paths.append(p)
    return paths
