"""The simulated run's peak memory per pipeline stage: what a real run's allocator would report.

It builds on the pre-launch estimate (`attune.knowledge.memory_estimate`, the same formulas the skill and the
memory pre-filter use) and adds what that estimate leaves to its margin:

    peak(stage) = weights + gradients + optimizer state             (the estimate's)
                + (activations + routing excess) x FP8 factor x (1 + fragmentation)
                + logits                                              (the estimate's)
                + CUDA context and workspaces + communication buffers
                + (optimizer offload) a device staging copy of the offloaded shard's FP32 parameters

The routing excess is what the estimate's even spread of routed tokens misses: the busiest expert
rank of a dropless MoE layer holds more routed tokens than the mean, by `moe_act_imbalance` /
sqrt(local experts) of the MoE MLP's stored activations (one expert per rank: the full excess; many
local experts average it out). Fragmentation is the caching allocator's (smaller with `expandable_segments:True`); the buffers are
the CUDA context and NCCL communicators, DeepEP's dispatch buffers, and Transformer Engine's
userbuffers for tensor-parallel overlap. A stage whose peak exceeds the accelerator's memory runs out
of memory, as a real run would. `reserved` is what the allocator holds (peak + fragmentation slack).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from attune.knowledge.memory_estimate import (
    GIB,
    MODELLED_RECOMPUTE_MODULES,
    MemoryEstimate,
    MemoryOptions,
    estimate,
)
from attune.sim.constants import DEFAULT, Constants
from attune.sim.recipe import SimRecipe
from attune.sim.steptime import StepModel


@dataclass(frozen=True)
class StagePeak:
    stage: int
    first_rank: int
    weights_gib: float
    activations_gib: float
    buffers_gib: float
    peak_gib: float  # max allocated
    reserved_gib: float  # max reserved
    allocated_gib: float  # allocated between steps (weights, gradients, optimizer state, buffers)

    def as_dict(self) -> dict[str, float | int]:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class MemoryReport:
    stages: list[StagePeak]
    capacity_gib: float
    estimate: MemoryEstimate

    @property
    def peak(self) -> StagePeak:
        return max(self.stages, key=lambda s: s.peak_gib)

    @property
    def fits(self) -> bool:
        return self.peak.peak_gib <= self.capacity_gib

    def as_dict(self) -> dict[str, object]:
        return {
            "capacity_gib": round(self.capacity_gib, 3),
            "fits": self.fits,
            "peak_stage": self.peak.stage,
            "peak_gib": round(self.peak.peak_gib, 3),
            "stages": [s.as_dict() for s in self.stages],
        }


def memory_options(r: SimRecipe, margin: float = 0.0) -> MemoryOptions:
    """The pre-launch estimate's options for this recipe (also what the memory pre-filter uses)."""
    mods = tuple(m for m in r.recompute_modules if m in MODELLED_RECOMPUTE_MODULES)
    return MemoryOptions(
        seq_length=r.seq,
        micro_batch=r.mbs,
        num_microbatches=r.microbatches,
        distributed_optimizer=r.distributed_optimizer,
        sequence_parallel=r.sequence_parallel,
        recompute=r.recompute if (r.recompute != "selective" or mods) else "none",
        recompute_modules=mods or ("core_attn",),
        recompute_method=r.recompute_method,
        recompute_num_layers=r.recompute_num_layers,
        optimizer_offload_fraction=r.offload_fraction if r.cpu_offload else 0.0,
        param_bytes=1 if r.fp8_params else 2,
        grad_bytes=r.grad_bytes,
        margin=margin,
        gpu_memory_gib=r.acc.hbm_gib,
    )


def routing_excess_bytes(r: SimRecipe, opts: MemoryOptions, est: MemoryEstimate, c: Constants = DEFAULT) -> list[float]:
    """Per stage: the stored MoE MLP activations the busiest expert rank holds beyond the estimate's mean."""
    mods = set(opts.recompute_modules) if opts.recompute == "selective" else set()
    if not r.model.is_moe or opts.recompute == "full" or "moe" in mods or "mlp" in mods or c.moe_act_imbalance <= 0:
        return [0.0] * len(est.stages)
    # the MoE MLP's share: the estimate with and without the MoE layers' MLP activations stored
    without = estimate(r.model, r.layout, replace(opts, recompute="selective",
                                                  recompute_modules=tuple(sorted(mods | {"moe"}))))
    local = max(1.0, r.model.experts / (r.ep * r.etp))
    excess = c.moe_act_imbalance / math.sqrt(local)
    return [max(0.0, a.activation_bytes - b.activation_bytes) * excess
            for a, b in zip(est.stages, without.stages, strict=True)]


def stage_memory(r: SimRecipe, c: Constants = DEFAULT) -> MemoryReport:
    opts = memory_options(r)
    est = estimate(r.model, r.layout, opts)
    routing = routing_excess_bytes(r, opts, est, c)
    frag = c.fragmentation_expandable if r.expandable_segments else c.fragmentation
    act_factor = c.fp8_activation_factor if r.precision == "fp8" else 1.0
    buffers = c.context_gib
    if r.deepep:
        buffers += c.deepep_buffer_gib
    if r.tp_comm_overlap:
        buffers += c.userbuffers_gib
    stages = []
    params = StepModel(r, c).params_per_gpu() if r.cpu_offload else []
    for st in est.stages:
        weights = st.weights_bytes / GIB
        if r.cpu_offload:
            # the hybrid optimizer stages the offloaded shard's FP32 parameters on the device
            d, e = params[st.stage]
            shard = d / (r.dp * r.cp) + e / r.edp
            weights += shard * r.offload_fraction * c.offload_staging_bytes / GIB
        acts = (st.activation_bytes + routing[st.stage]) / GIB * act_factor
        logits = st.logits_bytes / GIB
        peak = weights + acts * (1.0 + frag) + logits + buffers
        reserved = peak + acts * frag * 0.5
        stages.append(StagePeak(
            stage=st.stage,
            first_rank=r.first_rank_of_stage(st.stage),
            weights_gib=weights,
            activations_gib=acts + logits,
            buffers_gib=buffers,
            peak_gib=peak,
            reserved_gib=reserved,
            allocated_gib=weights + buffers * 0.5,
        ))
    return MemoryReport(stages=stages, capacity_gib=r.acc.hbm_gib, estimate=est)
