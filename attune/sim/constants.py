"""The simulator's constants: achieved fractions of the datasheet, latencies, host costs.

Each field says where its value comes from. "assumed" values are round figures from public
practice (cuBLAS and NCCL achieve roughly these fractions of peak); "fitted" values were chosen by
`benchmarks/fit_sim.py` on the fitted points of `attune/sim/paperfit/paper.py` (the ATTUNE paper's Table 1
baselines, shipped recipes of Tables D2/D3, Table F1's launches and its out-of-memory cases; the
held-out points only check the fit). docs/sim.md lists every point, its error and each constant.
They describe the paper's software stack on its clusters as the simulator sees it; they are not
measurements of any GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

# Kernels (host-side operations) per layer and forward pass, by module, counted from Megatron-Core's
# modules with Transformer Engine; a backward pass launches `backward_ratio` times as many.
KERNELS: dict[str, float] = {
    "attention": 12,  # norm + QKV GEMM (fused), split, RoPE (q, k), flash attention, projection, bias-dropout-add
    "qk_norm": 4,
    "tp_collectives": 4,  # two sequence-parallel collectives and their bookkeeping
    "fp8_attention": 4,  # casts and amax reductions around the FP8 GEMMs
    "cp_step": 3,  # per ring step of context parallelism
    "dense_mlp": 6,  # norm, FC1, activation, FC2, bias-dropout-add
    "fp8_mlp": 4,
    "router": 12,  # router GEMM, score function, expert bias, top-k, scaling, routing map
    "aux_loss": 8,  # load-balancing loss terms
    "dispatch_alltoall": 16,  # token counts, their all-to-all and host copy, splits, dispatch, combine, sorting
    "dispatch_allgather": 12,
    "dispatch_deepep": 30,  # fitted (at the search bound): DeepEP layout, notify, dispatch, combine (permutation fused in)
    "permute_fused": 4,
    "permute_unfused": 16,
    "experts_grouped": 6,  # grouped FC1 and FC2 set-up, activation, splits
    "experts_grouped_per_local": 1.297,  # fitted: GEMMs (and their bookkeeping) per local expert in a grouped linear
    "experts_per_local_expert": 5,  # without grouped GEMM: a loop over local experts
    "shared_expert": 8,
    "shared_expert_overlap": 4.095,  # fitted: side streams, events, waits
    "ep_comm_overlap": 8,
    "backward_ratio": 1.5,
}


@dataclass(frozen=True)
class Constants:
    # ---- device compute (assumed, except where marked fitted)
    gemm_eff_bf16: float = 0.8  # fitted (at the search bound): large BF16 GEMMs, fraction of the dense peak
    gemm_eff_fp8: float = 0.416  # fitted: large FP8 GEMMs with current scaling, fraction of the FP8 peak
    gemm_half_dim: float = 96.0  # a GEMM dimension of this size runs at half efficiency (per dimension)
    attn_eff_fwd: float = 0.50  # flash attention forward, fraction of the BF16 peak
    attn_eff_bwd: float = 0.40  # flash attention backward (2.5x the forward FLOPs)
    hbm_eff: float = 0.75  # memory-bound kernels, fraction of HBM bandwidth
    elementwise_passes: float = 28.0  # bytes moved by a layer's norms, residuals, RoPE, activations: x (tokens x hidden x 2)
    fp8_cast_passes: float = 10.0  # extra passes for FP8 casts and amax reductions
    permute_passes_fused: float = 4.0  # routed-token copies for permute + unpermute, fused
    permute_passes_unfused: float = 10.0
    ce_passes_fused: float = 2.0  # cross-entropy passes over the FP32 logits, fused
    ce_passes_unfused: float = 6.0
    expert_imbalance: float = 0.02349  # fitted: the busiest expert rank's extra compute at large EP
    # ---- collectives (assumed, except where marked fitted)
    nvlink_eff: float = 0.75  # ring collectives inside a node, fraction of NVLink bandwidth
    nic_eff: float = 0.80  # ring collectives between nodes, fraction of the NIC bandwidth
    a2a_nvlink_eff: float = 0.2402  # fitted: NCCL all-to-all inside a node (with its token-count exchange)
    a2a_nic_eff: float = 0.8515  # fitted: NCCL all-to-all between nodes
    deepep_nvlink_eff: float = 0.3  # fitted (at the search bound): DeepEP dispatch/combine inside a node
    deepep_nic_eff: float = 0.65  # DeepEP between nodes (where it can initialise)
    coll_latency_s: float = 25e-6  # per collective inside a node
    coll_latency_inter_s: float = 60e-6  # per collective between nodes
    a2a_latency_s: float = 60e-6
    a2a_latency_inter_s: float = 250e-6
    tp_overlap_frac: float = 0.80  # share of TP communication userbuffers overlap hides under GEMMs
    cp_overlap_frac: float = 0.85  # share of the context-parallel KV exchange hidden under attention
    ep_overlap_frac: float = 0.80  # share of the all-to-all hidden by --overlap-moe-expert-parallel-comm
    dp_overlap_frac: float = 0.90  # share of a bucketed reduction hidden under the compute it overlaps
    # ---- pipeline (fitted: Llama-3.1-405B's public recipe is bound by cross-node send/receive)
    p2p_latency_s: float = 0.3e-3  # a send/receive pair inside a node
    p2p_latency_inter_s: float = 0.002048  # fitted: a send/receive pair across nodes, with the partner wait
    p2p_overlap_frac: float = 0.5  # share of the transfer hidden with --overlap-p2p-communication (VP > 1)
    # ---- host (fitted: the MoE recipes are bound by kernel launches and host syncs)
    launch_fwd_s: float = 0.0001284  # fitted: host time per forward kernel (Python, framework, launch)
    launch_bwd_s: float = 1e-05  # fitted (at the search bound): host time per backward kernel (autograd engine, launch)
    recompute_host_frac: float = 0.5393  # fitted: share of the forward's host time a recomputed forward pays
    cuda_graph_factor: float = 0.2  # host time left for graph-captured kernels
    microbatch_host_s: float = 0.000431  # fitted: host time per microbatch and chunk (schedule, p2p bookkeeping)
    sync_exposed_frac: float = 1.0  # fitted (at the search bound): share of the shorter of host and device time a host sync exposes
    host_sync_s: float = 0.0001199  # fitted: a device-to-host copy the host waits on (the dispatcher's token counts)
    # ---- optimizer and the step (fitted where marked)
    cpu_adam_params_per_s: float = 1.71e+09  # fitted: CPU Adam throughput per node (MiniMax-M2 offload)
    pcie_eff: float = 0.5  # achieved share of PCIe for optimizer offload copies (8 GPUs share host links)
    offload_copy_overlap: float = 0.7  # share of offload copies hidden with --overlap-cpu-optimizer-d2h-h2d
    optimizer_bytes_per_param: float = 36.0  # GPU Adam: FP32 param, moments, grad read/write
    # the training loop's work between steps: 30% of Llama-3.1-405B's gap to its published figure (Section 6)
    step_overhead_s: float = 1.2
    warmup_step0: float = 2.5  # step 0 runs this many times longer (compilation, allocator warm-up)
    warmup_steps13: float = 0.04  # steps 1-3 run this much longer
    # ---- memory (assumed, except where marked fitted: a hinge keeps the paper's OOM cases out of memory)
    fragmentation: float = 0.08157  # fitted: allocator fragmentation on activations (expandable segments: 0.03)
    fragmentation_expandable: float = 0.03
    context_gib: float = 3.0  # CUDA context, cuBLAS/cuDNN workspaces, NCCL communicators
    deepep_buffer_gib: float = 2.0
    userbuffers_gib: float = 1.5
    moe_act_imbalance: float = 0.4747  # fitted: the busiest expert rank's excess of routed activations (one local expert)
    fp8_activation_factor: float = 0.80  # FP8 recipes keep some saved inputs in FP8
    offload_staging_bytes: float = 4.0  # per offloaded optimizer-shard parameter kept on the device

    kernels: dict[str, float] = field(default_factory=lambda: dict(KERNELS))

    def with_overrides(self, **kw: Any) -> Constants:
        """A copy with some constants replaced; `kernels.<name>` replaces one kernel count."""
        known = {f.name for f in fields(self)}
        kern = dict(self.kernels)
        plain = {}
        for k, v in kw.items():
            if k.startswith("kernels."):
                name = k.split(".", 1)[1]
                if name not in kern:
                    raise ValueError(f"unknown kernel count {name!r}")
                kern[name] = v
            elif k in known:
                plain[k] = v
            else:
                raise ValueError(f"unknown constant {k!r}")
        return replace(self, kernels=kern, **plain)

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


DEFAULT = Constants()
