"""Kineto (PyTorch profiler) traces of a simulated run: one file per profiled rank.

A traced step of pipeline stage s is laid out from the step-time model's terms, so that the trace
analyzer (`attune.readers.traces`) reads back the model's breakdown:

- per microbatch and virtual chunk, a forward and a backward piece: compute kernels (GEMMs; the
  recomputed forward before the backward), the exposed expert all-to-all (EXPERT group), the
  tensor-parallel collectives (TENSOR group), the context-parallel exchange (CONTEXT group), the
  device idle while the host launches kernels (covered by `cudaLaunchKernel` on the host), and the
  pipeline send/receive (PIPELINE group);
- per microbatch, the wait for the slowest stage (a pipeline receive);
- the pipeline fill before the first microbatch and the drain after the last (receives);
- the data-parallel reduce-scatter and all-gather (DATA group) left exposed, the optimizer (a fused
  Adam kernel; with offload, host-device copies and the CPU step with the device idle), and the
  loop's own work between steps (host only).

So per step: compute = compute + recompute + optimizer terms; exposed communication by kind =
the ep_a2a, tp_comm, cp_comm, dp terms and pipeline = pipeline_p2p + pipeline_bubble + the stage's
wait for the slowest stage; launch = host_launch; the rest is host-side time.
The rank's process groups (`distributedInfo.pg_config`) name its pipeline, so the analyzer places it
on its stage without being told the layout.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from attune.core.campaign_paths import RUN_TRACES_DIR
from attune.sim.estimate import Estimate
from attune.sim.recipe import SimRecipe
from attune.sim.steptime import COMM_KINDS

GEMM = "sm100_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize256x128x64_cluster2x1x1_execute_kernel__5x_cublas"
ATTN = "flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t>>"
ADAM = "void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float, 4>>"
NCCL = {
    "a2a": ("ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)", "all_to_all", "EXPERT_MODEL_PARALLEL_GROUP"),
    "tp": ("ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", "_allgather_base",
           "TENSOR_MODEL_PARALLEL_GROUP"),
    "cp": ("ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)", "send", "CONTEXT_PARALLEL_GROUP"),
    "pp": ("ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)", "recv", "PIPELINE_MODEL_PARALLEL_GROUP"),
    "dp_rs": ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
              "_reduce_scatter_base", "DATA_PARALLEL_GROUP"),
    "dp_ag": ("ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", "_allgather_base",
              "DATA_PARALLEL_GROUP"),
}
DEVICE_NAMES = {"H100": "NVIDIA H100 80GB HBM3", "H200": "NVIDIA H200", "B200": "NVIDIA B200"}
COMPUTE_STREAM, P2P_STREAM, COLL_STREAM = 7, 20, 24


class _Trace:
    def __init__(self, rank: int, pid: int) -> None:
        self.rank = rank
        self.pid = pid
        self.events: list[str] = []
        self.corr = 1

    def host(self, cat: str, name: str, ts: float, dur: float) -> None:
        self.events.append(
            f'{{"ph":"X","cat":"{cat}","name":{json.dumps(name)},"pid":{self.pid},"tid":{self.pid},'
            f'"ts":{ts:.3f},"dur":{dur:.3f},"args":{{}}}}'
        )

    def kernel(self, name: str, ts: float, dur: float, stream: int, nccl: tuple[str, str, str] | None = None,
               launch: bool = True) -> None:
        """A device kernel and the host call that launched it (just before it)."""
        if dur <= 0:
            return
        corr = self.corr
        self.corr += 1
        extra = ""
        if nccl is not None:
            _, coll, desc = nccl
            extra = (f',"Collective name":"{coll}","Process Group Name":"{desc.lower()}",'
                     f'"Process Group Description":"{desc}","dtype":"BFloat16"')
        self.events.append(
            f'{{"ph":"X","cat":"kernel","name":{json.dumps(name)},"pid":0,"tid":{stream},'
            f'"ts":{ts:.3f},"dur":{dur:.3f},"args":{{"device":0,"stream":{stream},"correlation":{corr}{extra}}}}}'
        )
        if launch:
            lt = max(ts - 6.0, 0.0)
            self.events.append(
                f'{{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":{self.pid},"tid":{self.pid},'
                f'"ts":{lt:.3f},"dur":4.000,"args":{{"correlation":{corr}}}}}'
            )


def _groups(r: SimRecipe, rank: int) -> list[dict[str, object]]:
    per_stage = r.gpus // r.pp
    local = rank % per_stage
    pipeline = [s * per_stage + local for s in range(r.pp)]
    base = (rank // per_stage) * per_stage
    tp0 = rank - rank % r.tp
    groups: list[dict[str, object]] = [
        {"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl", "pg_size": r.gpus,
         "ranks": list(range(r.gpus))},
        {"pg_name": "pipeline_model_parallel_group", "pg_desc": "PIPELINE_MODEL_PARALLEL_GROUP",
         "backend_config": "cuda:nccl", "pg_size": r.pp, "ranks": pipeline},
        {"pg_name": "tensor_model_parallel_group", "pg_desc": "TENSOR_MODEL_PARALLEL_GROUP",
         "backend_config": "cuda:nccl", "pg_size": r.tp, "ranks": list(range(tp0, tp0 + r.tp))},
    ]
    stride = r.tp * r.cp
    dp_ranks = [base + (local % stride) + i * stride for i in range(r.dp)]
    groups.append({"pg_name": "data_parallel_group", "pg_desc": "DATA_PARALLEL_GROUP", "backend_config": "cuda:nccl",
                   "pg_size": r.dp, "ranks": dp_ranks})
    if r.model.is_moe:
        size = r.ep * r.etp
        e0 = base + (local // size) * size
        groups.append({"pg_name": "expert_model_parallel_group", "pg_desc": "EXPERT_MODEL_PARALLEL_GROUP",
                       "backend_config": "cuda:nccl", "pg_size": size, "ranks": list(range(e0, e0 + size))})
    return groups


def trace_writer(
    r: SimRecipe, est: Estimate, step_times: list[float], prof_start: int, prof_end: int,
    start_epoch: float, startup: float, factor: float,
) -> Callable[[Path], list[Path]]:
    """A function that writes the traces under `<run_dir>/traces/` and returns their paths."""

    def write(run_dir: Path) -> list[Path]:
        out_dir = Path(run_dir) / RUN_TRACES_DIR
        out_dir.mkdir(parents=True, exist_ok=True)
        paths = []
        for rank in r.profile_ranks:
            p = out_dir / f"rank{rank}.pt.trace.json"
            _write_rank(p, r, est, rank, step_times, prof_start, prof_end, start_epoch, startup)
            paths.append(p)
        return paths

    return write


def _write_rank(path: Path, r: SimRecipe, est: Estimate, rank: int, step_times: list[float], prof_start: int,
                prof_end: int, start_epoch: float, startup: float) -> None:
    assert est.step is not None
    step = est.step
    stage = r.stage_of_rank(rank)
    st = step.stages[stage]
    crit = step.stages[step.critical_stage]
    M, vp = step.microbatches, r.vp
    tr = _Trace(rank, 1000 + rank)
    us = 1e6
    t0 = (start_epoch + startup + sum(step_times[:prof_start])) * us
    for k in range(prof_start, min(prof_end, len(step_times))):
        scale = step_times[k] / step.seconds
        ts = t0
        tr.host("user_annotation", f"ProfilerStep#{k}", ts, step_times[k] * us)

        def dev(seconds: float, scale: float = scale) -> float:
            return seconds * scale * us

        # pipeline fill: wait for the first activation
        bubble = step.terms["pipeline_bubble"]
        fill = bubble * stage / (r.pp - 1) if r.pp > 1 else 0.0
        drain = bubble - fill
        # the data-parallel parameter all-gather runs before the first forward
        ag = dev(step.terms["dp_param_gather"])
        tr.kernel(NCCL["dp_ag"][0], ts, ag, COLL_STREAM, NCCL["dp_ag"])
        ts += ag
        tr.kernel(NCCL["pp"][0], ts, dev(fill), P2P_STREAM, NCCL["pp"])
        ts += dev(fill)
        chunks = vp
        f_comp = (st.compute / 3.0) / chunks
        b_comp = (st.compute * 2.0 / 3.0) / chunks
        rec = st.recompute / chunks
        comm_f = {k_: st.comm[k_] / 2.0 / chunks for k_ in COMM_KINDS}
        host_f = st.host_exposed / 2.0 / chunks
        p2p = st.p2p / 2.0 / chunks
        wait = max(0.0, crit.total - st.total)
        for _mb in range(M):
            for _c in range(chunks):
                for phase in ("fwd", "bwd"):
                    if phase == "bwd" and rec > 0:
                        tr.kernel(GEMM, ts, dev(rec), COMPUTE_STREAM)
                        ts += dev(rec)
                    comp = f_comp if phase == "fwd" else b_comp
                    tr.kernel(GEMM if phase == "bwd" else ATTN, ts, dev(comp), COMPUTE_STREAM)
                    ts += dev(comp)
                    for kind, key in (("ep", "a2a"), ("tp", "tp"), ("cp", "cp")):
                        d = dev(comm_f[kind])
                        tr.kernel(NCCL[key][0], ts, d, COLL_STREAM, NCCL[key])
                        ts += d
                    gap = dev(host_f)
                    if gap > 0:
                        tr.host("cuda_runtime", "cudaLaunchKernel", ts, gap)
                        ts += gap
                    d = dev(p2p)
                    tr.kernel(NCCL["pp"][0], ts, d, P2P_STREAM, NCCL["pp"])
                    ts += d
            if wait > 0:
                d = dev(wait)
                tr.kernel(NCCL["pp"][0], ts, d, P2P_STREAM, NCCL["pp"])
                ts += d
        tr.kernel(NCCL["pp"][0], ts, dev(drain), P2P_STREAM, NCCL["pp"])
        ts += dev(drain)
        rs = dev(step.terms["dp_grad_reduce"])
        tr.kernel(NCCL["dp_rs"][0], ts, rs, COLL_STREAM, NCCL["dp_rs"])
        ts += rs
        opt = dev(step.terms["optimizer"])
        tr.kernel(ADAM, ts, opt, COMPUTE_STREAM)
        ts += opt
        off = dev(step.terms["optimizer_offload"])
        if off > 0:
            copy = off * 0.1
            tr.kernel("Memcpy DtoH (Device -> Pinned)", ts, copy / 2, COMPUTE_STREAM)
            tr.host("cpu_op", "HybridDeviceOptimizer.step (CPU Adam)", ts + copy / 2, off - copy)
            tr.kernel("Memcpy HtoD (Pinned -> Device)", ts + off - copy / 2, copy / 2, COMPUTE_STREAM)
            ts += off
        over = dev(step.terms["step_overhead"])
        tr.host("cpu_op", "train_step bookkeeping (between steps)", ts, over)
        ts += over
        t0 += step_times[k] * us
    header = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": DEVICE_NAMES.get(r.acc.name, r.acc.name),
                              "totalGlobalMem": int(r.acc.hbm_gib * 2**30), "numSms": r.acc.sms}],
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": r.gpus,
                            "pg_count": len(_groups(r, rank)), "pg_config": _groups(r, rank),
                            "nccl_version": "2.28.9"},
        "record_shapes": 0,
        "traceName": str(path.name),
        "simulated": "attune sim: a test bed, not a real GPU profile",
    }
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("{\n")
        for key, value in header.items():
            fh.write(f'  "{key}": {json.dumps(value)},\n')
        fh.write('  "traceEvents": [\n')
        fh.write(",\n".join(tr.events))
        fh.write('\n  ],\n  "displayTimeUnit": "ms"\n}\n')
