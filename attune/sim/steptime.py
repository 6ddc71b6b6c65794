"""The step-time model: one training step of a layout, as a sum of named terms.

Per layer, microbatch and GPU, three passes are costed: forward, backward and the recomputed
forward. Each pass has device time (compute: GEMMs at a shape-dependent efficiency, flash
attention, memory-bound kernels; and the communication it cannot hide: tensor/sequence-parallel
collectives, the context-parallel KV exchange, the expert all-to-all) and host time (kernels x
the host's cost per kernel). A pass whose host waits on the device (the all-to-all dispatcher
reads the token counts of every dispatch back to the host) costs device + host time; any other
pass costs max(device, host), the host running ahead of the device.

A pipeline stage's time per microbatch adds its layers' passes, the embedding or the loss, the
send/receive handoffs of each of its chunks and the host's per-microbatch work. The step is
M x (slowest stage) + (PP - 1) x (mean stage) / VP (the bubble), plus the data-parallel
reductions not hidden under the backward pass, the optimizer (on the GPU, or on the CPU with
offload) and the training loop's fixed work between steps.

Every term is reported in seconds per step for the slowest stage, so that the terms add up to
the step time (`StepTime.terms`). docs/sim.md gives every formula and constant.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from attune.sim.constants import DEFAULT, Constants
from attune.sim.recipe import SimRecipe

COMM_KINDS = ("tp", "cp", "ep")
TERM_ORDER = (
    "compute",
    "recompute",
    "tp_comm",
    "cp_comm",
    "ep_a2a",
    "host_launch",
    "pipeline_p2p",
    "pipeline_bubble",
    "dp_grad_reduce",
    "dp_param_gather",
    "optimizer",
    "optimizer_offload",
    "step_overhead",
)
TERM_HELP = {
    "compute": "forward and backward compute of the slowest stage (GEMMs, attention, memory-bound kernels)",
    "recompute": "recomputed forward passes (activation recomputation)",
    "tp_comm": "tensor/sequence-parallel collectives not hidden under GEMMs",
    "cp_comm": "context-parallel key/value exchange not hidden under attention",
    "ep_a2a": "expert dispatch and combine (all-to-all or DeepEP) not hidden",
    "host_launch": "device idle while the host launches kernels (launch-bound passes, host syncs)",
    "pipeline_p2p": "pipeline send/receive handoffs on the critical path",
    "pipeline_bubble": "pipeline fill and drain: (PP - 1) x the mean stage time / VP",
    "dp_grad_reduce": "data-parallel gradient reduction not hidden under the last backward",
    "dp_param_gather": "distributed-optimizer parameter all-gather not hidden under the first forward",
    "optimizer": "optimizer step on the GPU",
    "optimizer_offload": "optimizer step on the CPU and its host<->device copies (optimizer offload)",
    "step_overhead": "the training loop's fixed work between steps",
}


def _sat(x: float, half: float) -> float:
    return x / (x + half) if x > 0 else 0.0


@dataclass
class Pass:
    """One pass of one layer for one microbatch on one GPU (seconds)."""

    compute: float = 0.0
    comm: dict[str, float] = field(default_factory=lambda: dict.fromkeys(COMM_KINDS, 0.0))
    host: float = 0.0
    kernels: int = 0
    sync: bool = False

    @property
    def device(self) -> float:
        return self.compute + sum(self.comm.values())

    sync_s: float = 0.0  # what one host sync costs beyond the lost overlap
    sync_frac: float = 0.0  # share of the shorter of host and device time a sync exposes

    @property
    def time(self) -> float:
        t = max(self.device, self.host)
        if self.sync:
            # the host waits mid-pass and no longer runs ahead: part of the shorter side is exposed
            t += self.sync_s + self.sync_frac * min(self.device, self.host)
        return t

    @property
    def host_exposed(self) -> float:
        return self.time - self.device

    def add(self, other: Pass) -> None:
        self.compute += other.compute
        for k, v in other.comm.items():
            self.comm[k] += v
        self.host += other.host
        self.kernels += other.kernels
        self.sync = self.sync or other.sync


@dataclass
class StageCost:
    """One stage's time per microbatch (summed over its chunks), by component."""

    stage: int
    layers: int
    compute: float = 0.0
    recompute: float = 0.0
    comm: dict[str, float] = field(default_factory=lambda: dict.fromkeys(COMM_KINDS, 0.0))
    host_exposed: float = 0.0
    p2p: float = 0.0
    fwd: float = 0.0  # forward time of one microbatch through the stage (all chunks)
    bwd: float = 0.0  # backward incl. recomputation

    @property
    def total(self) -> float:
        return self.compute + self.recompute + sum(self.comm.values()) + self.host_exposed + self.p2p


@dataclass
class StepTime:
    seconds: float
    terms: dict[str, float]
    stages: list[StageCost]
    critical_stage: int
    microbatches: int
    flops_per_token: float
    details: dict[str, Any] = field(default_factory=dict)

    def terms_ms(self) -> dict[str, float]:
        return {k: round(v * 1e3, 3) for k, v in self.terms.items()}


class StepModel:
    """Costs one recipe. Build once per recipe; `step()` is the whole model."""

    def __init__(self, r: SimRecipe, c: Constants = DEFAULT) -> None:
        self.r = r
        self.c = c
        m = r.model
        self.prec = r.precision
        self.peak = r.acc.peak(self.prec)
        self.peak16 = r.acc.peak_bf16
        self.hbm = r.acc.hbm_bw * c.hbm_eff
        self.T = r.mbs * r.seq / r.cp  # tokens of one microbatch on one CP rank (GEMM rows after SP gather)
        self.T_local = self.T / r.tp if r.sequence_parallel else self.T  # tokens a GPU holds
        self.h = m.hidden
        self.q = m.q_width
        self.kv = m.kv_width
        self.bpe = 1.0 if self.prec == "fp8" else 2.0  # GEMM operand bytes
        # DeepEP reserves SMs for its kernels: the rest of the compute runs on fewer SMs
        self.sm_factor = r.acc.sms / (r.acc.sms - r.deepep_sms) if r.deepep else 1.0
        self.imbalance = 1.0 + c.expert_imbalance * (1.0 - 1.0 / r.ep) if m.is_moe else 1.0

    # ------------------------------------------------------------------ device primitives
    def gemm(self, m_: float, n: float, k: float, count: float = 1.0) -> float:
        """Seconds for `count` GEMMs of (m x k) @ (k x n) on one GPU."""
        if m_ <= 0 or n <= 0 or k <= 0 or count <= 0:
            return 0.0
        c = self.c
        half = c.gemm_half_dim
        eff = (c.gemm_eff_fp8 if self.prec == "fp8" else c.gemm_eff_bf16) * _sat(m_, half) * _sat(n, half) * _sat(k, half)
        t_flops = 2.0 * m_ * n * k * count / (self.peak * eff)
        t_bytes = (m_ * k + k * n + m_ * n) * self.bpe * count / self.hbm
        return max(t_flops, t_bytes) * self.sm_factor

    def membound(self, nbytes: float) -> float:
        return nbytes / self.hbm * self.sm_factor

    def attention_fwd(self) -> float:
        r, c = self.r, self.c
        flops = 2.0 * r.mbs * r.seq * r.seq * self.q / (r.cp * r.tp)  # causal: half of 4 x s^2 x width
        eff = c.attn_eff_fwd * _sat(r.seq / r.cp, 256.0)
        return flops / (self.peak16 * eff) * self.sm_factor

    def attention_bwd(self) -> float:
        r, c = self.r, self.c
        flops = 5.0 * r.mbs * r.seq * r.seq * self.q / (r.cp * r.tp)
        eff = c.attn_eff_bwd * _sat(r.seq / r.cp, 256.0)
        return flops / (self.peak16 * eff) * self.sm_factor

    def _link(self, nodes: int) -> tuple[float, float]:
        """(bandwidth, latency) of a ring collective over a group spanning `nodes` nodes."""
        acc, c = self.r.acc, self.c
        if nodes <= 1:
            return acc.nvlink_bw * c.nvlink_eff, c.coll_latency_s
        return acc.nic_bw * c.nic_eff, c.coll_latency_inter_s

    def ring(self, nbytes: float, n: int, nodes: int) -> float:
        """All-gather or reduce-scatter of a tensor of `nbytes` (the full tensor) over n ranks."""
        if n <= 1:
            return 0.0
        bw, lat = self._link(nodes)
        return (n - 1) / n * nbytes / bw + lat

    # ------------------------------------------------------------------ per-layer passes
    def attention_block(self) -> tuple[Pass, Pass, dict[str, float]]:
        """(forward, backward, recompute-able pieces) of the attention block of one layer."""
        r, c, m = self.r, self.c, self.r.model
        T, tp, h = self.T, r.tp, self.h
        fwd, bwd = Pass(), Pass()
        g_qkv = self.gemm(T, (self.q + 2 * self.kv) / tp, h)
        g_proj = self.gemm(T, h, self.q / tp)
        a_f, a_b = self.attention_fwd(), self.attention_bwd()
        passes = c.elementwise_passes * 0.5 + (c.fp8_cast_passes * 0.5 if self.prec == "fp8" else 0.0)
        mem = self.membound(self.T_local * h * 2.0 * passes)
        fwd.compute = g_qkv + g_proj + a_f + mem
        bwd.compute = 2 * (g_qkv + g_proj) + a_b + 2 * mem
        # tensor / sequence parallelism: 2 collectives forward (AG before QKV, RS after proj), 2 backward
        tp_f = tp_b = 0.0
        if tp > 1:
            full = T * h * 2.0
            if r.sequence_parallel:
                ag = self.ring(full * (0.5 if self.prec == "fp8" else 1.0), tp, r.tp_nodes)
                rs = self.ring(full, tp, r.tp_nodes)
                tp_f = tp_b = ag + rs
            else:
                tp_f = tp_b = 2 * self.ring(full, tp, r.tp_nodes)  # one all-reduce = RS + AG
            if r.tp_comm_overlap:
                hide_f = min(c.tp_overlap_frac * tp_f, g_qkv + g_proj)
                hide_b = min(c.tp_overlap_frac * tp_b, 2 * (g_qkv + g_proj))
                tp_f, tp_b = tp_f - hide_f, tp_b - hide_b
        fwd.comm["tp"], bwd.comm["tp"] = tp_f, tp_b
        # context parallelism: ring exchange of K and V, overlapped with attention
        if r.cp > 1:
            bw, lat = self._link(r.cp_nodes)
            kv_bytes = 2.0 * T * self.kv / tp * 2.0
            x_f = (r.cp - 1) * kv_bytes / bw
            x_b = 2 * x_f
            fwd.comm["cp"] = max(0.0, x_f - c.cp_overlap_frac * a_f) + (r.cp - 1) * lat
            bwd.comm["cp"] = max(0.0, x_b - c.cp_overlap_frac * a_b) + 2 * (r.cp - 1) * lat
        K = self.c.kernels
        k = K["attention"] + (K["qk_norm"] if m.qk_norm else 0) + (K["tp_collectives"] if tp > 1 else 0)
        k += K["fp8_attention"] if self.prec == "fp8" else 0
        k += K["cp_step"] * (r.cp - 1) if r.cp > 1 else 0
        fwd.kernels, bwd.kernels = k, round(k * K["backward_ratio"])
        pieces = {"core_attn": a_f, "layernorm": self.membound(self.T_local * h * 2.0 * 4)}
        return fwd, bwd, pieces

    def dense_mlp(self) -> tuple[Pass, Pass]:
        r, c, m = self.r, self.c, self.r.model
        T, tp, h, f = self.T, r.tp, self.h, m.ffn or 0
        fwd, bwd = Pass(), Pass()
        width1 = (2 if m.gated_mlp else 1) * f
        g = self.gemm(T, width1 / tp, h) + self.gemm(T, h, f / tp)
        mem = self.membound(self.T_local * h * 2.0 * c.elementwise_passes * 0.5 + T * f / tp * 2.0 * 3)
        fwd.compute, bwd.compute = g + mem, 2 * (g + mem)
        if tp > 1:
            full = T * h * 2.0
            if r.sequence_parallel:
                t = self.ring(full * (0.5 if self.prec == "fp8" else 1.0), tp, r.tp_nodes) + self.ring(full, tp, r.tp_nodes)
            else:
                t = 2 * self.ring(full, tp, r.tp_nodes)
            fwd.comm["tp"] = bwd.comm["tp"] = t
            if r.tp_comm_overlap:
                fwd.comm["tp"] = t - min(c.tp_overlap_frac * t, g)
                bwd.comm["tp"] = t - min(c.tp_overlap_frac * t, 2 * g)
        K = self.c.kernels
        k = K["dense_mlp"] + (K["tp_collectives"] if tp > 1 else 0) + (K["fp8_mlp"] if self.prec == "fp8" else 0)
        fwd.kernels, bwd.kernels = k, round(k * K["backward_ratio"])
        return fwd, bwd

    def a2a_time(self, nbytes: float) -> float:
        """One dispatch or combine of `nbytes` per GPU over the expert group."""
        r, c, acc = self.r, self.c, self.r.acc
        group = r.ep * r.etp
        if group <= 1:
            return 0.0
        gpn = r.gpus_per_node
        remote = max(0.0, 1.0 - gpn / group) if group > gpn else 0.0
        inter = r.ep_nodes > 1
        if r.deepep:
            nodes = r.ep_nodes
            # DeepEP sends a token once per destination node, not once per expert copy
            dedup = nodes * (1 - (1 - 1 / nodes) ** r.model.topk) / r.model.topk if inter else 1.0
            t = nbytes * (1 - remote) / (acc.nvlink_bw * c.deepep_nvlink_eff)
            t += nbytes * remote * dedup / (acc.nic_bw * c.deepep_nic_eff)
            return t + (c.a2a_latency_inter_s if inter else c.a2a_latency_s) * 0.5
        if r.dispatcher == "allgather":
            # every rank gathers every token of the group, then reduce-scatters the outputs
            bw, lat = self._link(r.ep_nodes)
            return (group - 1) * nbytes / r.model.topk / bw + lat
        t = nbytes * (1 - remote) / (acc.nvlink_bw * c.a2a_nvlink_eff)
        t += nbytes * remote / (acc.nic_bw * c.a2a_nic_eff)
        return t + (c.a2a_latency_inter_s if inter else c.a2a_latency_s)

    def moe_block(self) -> tuple[Pass, Pass, dict[str, float], dict[str, Pass]]:
        """(forward, backward, small recompute pieces, recompute passes of whole modules) of a MoE MLP."""
        r, c, m = self.r, self.c, self.r.model
        T, tp, h = self.T, r.tp, self.h
        fwd, bwd = Pass(), Pass()
        E, k = m.experts, m.topk
        local = E / r.ep
        width = (m.moe_ffn or 0) / r.etp
        m_e = T * k * r.ep * r.etp / (tp * E) * self.imbalance  # tokens per local expert on the busiest rank
        g_exp = self.gemm(m_e, (2 if m.gated_mlp else 1) * width, h, local) + self.gemm(m_e, h, width, local)
        g_router = self.gemm(self.T_local, E, h)
        g_shared = 0.0
        if m.shared_expert_ffn:
            fs = m.shared_expert_ffn
            g_shared = self.gemm(T, (2 if m.gated_mlp else 1) * fs / tp, h) + self.gemm(T, h, fs / tp)
        routed = self.T_local * k * self.imbalance  # routed token copies this GPU sends (and receives)
        perm = c.permute_passes_fused if r.permute_fusion or r.deepep else c.permute_passes_unfused
        mem = self.membound(routed * h * 2.0 * perm + m_e * local * width * 2.0 * 3
                            + self.T_local * h * 2.0 * c.elementwise_passes * 0.5)
        act = self.membound(m_e * local * width * 2.0 * 3)
        fwd.compute = g_exp + g_router + mem + g_shared
        bwd.compute = 2 * (g_exp + g_router + g_shared) + 2 * mem
        # expert dispatch + combine: twice forward, twice backward
        a2a = 2 * self.a2a_time(routed * h * 2.0)
        a2a_f, a2a_b = a2a, a2a
        if r.shared_expert_overlap and g_shared:
            hide = min(g_shared, a2a)  # the shared expert runs while tokens travel
            fwd.compute -= hide
            bwd.compute -= min(2 * g_shared, a2a)
        if r.ep_comm_overlap:
            a2a_f -= c.ep_overlap_frac * min(a2a_f, fwd.compute)
            a2a_b -= c.ep_overlap_frac * min(a2a_b, bwd.compute)
        fwd.comm["ep"], bwd.comm["ep"] = a2a_f, a2a_b
        tp_shared = 0.0
        if m.shared_expert_ffn and tp > 1:
            full = T * h * 2.0
            tp_shared = self.ring(full, tp, r.tp_nodes) * 2
            if r.tp_comm_overlap:
                tp_shared -= min(c.tp_overlap_frac * tp_shared, g_shared)
        fwd.comm["tp"], bwd.comm["tp"] = tp_shared, tp_shared
        # kernels: router (+ aux loss), permutation, dispatch, experts, shared expert, combine
        K = self.c.kernels
        kern = K["router"] + (K["aux_loss"] if r.aux_loss else 0)
        if r.deepep:
            kern += K["dispatch_deepep"]
        else:
            kern += K["dispatch_alltoall"] if r.dispatcher == "alltoall" else K["dispatch_allgather"]
            kern += K["permute_fused"] if r.permute_fusion else K["permute_unfused"]
        if r.grouped_gemm:  # Transformer Engine's grouped linear still issues one GEMM per local expert
            kern += K["experts_grouped"] + K["experts_grouped_per_local"] * local
        else:
            kern += K["experts_per_local_expert"] * max(1.0, local)
        kern += (K["shared_expert"] + (K["tp_collectives"] if tp > 1 else 0)) if m.shared_expert_ffn else 0
        kern += K["shared_expert_overlap"] if r.shared_expert_overlap else 0
        kern += K["ep_comm_overlap"] if r.ep_comm_overlap else 0
        kern += K["fp8_mlp"] if self.prec == "fp8" else 0
        fwd.kernels, bwd.kernels = round(kern), round(kern * K["backward_ratio"])
        # the all-to-all and allgather dispatchers read the token counts back to the host, and so does
        # DeepEP's normal (not low-latency) dispatch; HybridEP does not
        fwd.sync = (r.ep * r.etp > 1 or r.dispatcher == "allgather") and r.flex_backend != "hybridep"
        pieces = {"moe_act": act, "shared_experts": g_shared}
        whole = Pass(compute=fwd.compute, comm=dict(fwd.comm), kernels=fwd.kernels, sync=fwd.sync)
        return fwd, bwd, pieces, {"moe": whole}

    # ------------------------------------------------------------------ layers, stages, the step
    def _host(self, p: Pass, kind: str) -> None:
        c = self.c
        per = c.launch_fwd_s if kind == "fwd" else c.launch_bwd_s
        if self.r.cuda_graphs:
            per *= c.cuda_graph_factor
        p.host = p.kernels * per
        p.sync_s = c.host_sync_s
        p.sync_frac = c.sync_exposed_frac

    def layer_passes(self, kind: str) -> tuple[Pass, Pass, Pass]:
        """(forward, backward, recompute) of one layer of `kind` ('dense' or 'moe')."""
        cached = self._layer_cache.get(kind) if hasattr(self, "_layer_cache") else None
        if cached is not None:
            return cached
        if not hasattr(self, "_layer_cache"):
            self._layer_cache: dict[str, tuple[Pass, Pass, Pass]] = {}
        r = self.r
        a_f, a_b, a_pieces = self.attention_block()
        if kind == "dense":
            m_f, m_b = self.dense_mlp()
            m_pieces: dict[str, float] = {}
            wholes: dict[str, Pass] = {"mlp": Pass(compute=m_f.compute, comm=dict(m_f.comm), kernels=m_f.kernels)}
        else:
            m_f, m_b, m_pieces, wholes = self.moe_block()
        fwd, bwd = Pass(), Pass()
        fwd.add(a_f)
        fwd.add(m_f)
        bwd.add(a_b)
        bwd.add(m_b)
        self._host(fwd, "fwd")
        self._host(bwd, "bwd")
        rec = Pass()
        if r.recompute == "full":
            rec = Pass(compute=fwd.compute, comm=dict(fwd.comm), kernels=fwd.kernels, sync=fwd.sync)
        elif r.recompute == "selective":
            pieces = {**a_pieces, **m_pieces}
            for mod in r.recompute_modules:
                if mod in pieces:
                    rec.compute += pieces[mod]
                    rec.kernels += 3
                elif mod in wholes:
                    rec.add(wholes[mod])
        self._host(rec, "fwd")
        # the recomputed forward runs inside the backward's autograd engine: part of the forward's
        # Python-side work (module hooks, bookkeeping) is not repeated
        rec.host *= self.c.recompute_host_frac
        self._layer_cache[kind] = (fwd, bwd, rec)
        return fwd, bwd, rec

    def _recomputed(self, chunk_layers: int, index: int) -> bool:
        """Whether layer `index` of a chunk of `chunk_layers` layers is recomputed."""
        r = self.r
        if r.recompute != "full":
            return r.recompute == "selective"
        if r.recompute_method == "block":
            return index < r.recompute_num_layers
        return True

    def output_layer(self) -> tuple[float, float, int]:
        """(forward, backward, kernels) of the output layer and the loss on the last stage."""
        r, c, m = self.r, self.c, self.r.model
        v = m.padded_vocab(r.tp)
        g = self.gemm(self.T, v / r.tp, self.h)
        passes = c.ce_passes_fused if r.cross_entropy_fusion else c.ce_passes_unfused
        ce = self.membound(self.T * v / r.tp * 4.0 * passes)
        kern = 6 if r.cross_entropy_fusion else 16
        return g + ce * 0.4, 2 * g + ce * 0.6, kern

    def stage_costs(self) -> list[StageCost]:
        r, c = self.r, self.c
        kinds = r.model.layer_kinds()
        split = r.layout.split
        assert split is not None
        out: list[StageCost] = []
        for s, rng in enumerate(split.stage_layers()):
            stage_kinds = [kinds[i] for i in rng]
            st = StageCost(stage=s, layers=len(stage_kinds))
            per_chunk = len(stage_kinds) // r.vp if r.vp > 1 else len(stage_kinds)
            chunks = [stage_kinds[i * per_chunk:(i + 1) * per_chunk] for i in range(r.vp)] if r.vp > 1 else [stage_kinds]
            for chunk in chunks:
                for idx, kind in enumerate(chunk):
                    fwd, bwd, rec = self.layer_passes(kind)
                    st.compute += fwd.compute + bwd.compute
                    for k_ in COMM_KINDS:
                        st.comm[k_] += fwd.comm[k_] + bwd.comm[k_]
                    st.host_exposed += fwd.host_exposed + bwd.host_exposed
                    st.fwd += fwd.time
                    st.bwd += bwd.time
                    if self._recomputed(len(chunk), idx) and (rec.compute or rec.kernels):
                        st.recompute += rec.compute
                        for k_ in COMM_KINDS:
                            st.comm[k_] += rec.comm[k_]
                        st.host_exposed += rec.host_exposed
                        st.bwd += rec.time
                # per chunk: host bookkeeping and the two handoffs (activation forward, gradient back)
                st.host_exposed += 2 * c.microbatch_host_s
                st.fwd += c.microbatch_host_s
                st.bwd += c.microbatch_host_s
                if r.pp > 1:
                    p2p = self.p2p_handoff(s)
                    st.p2p += 2 * p2p
                    st.fwd += p2p
                    st.bwd += p2p
            if s == r.pp - 1:
                f, b, kern = self.output_layer()
                host = kern * (c.launch_fwd_s + 1.6 * c.launch_bwd_s)
                st.compute += f + b
                st.host_exposed += max(0.0, host - (f + b))
                st.fwd += f
                st.bwd += b
            if s == 0:
                emb = self.membound(self.T_local * self.h * 2.0 * 3)
                st.compute += emb
            out.append(st)
        return out

    def p2p_handoff(self, stage: int) -> float:
        r, c, acc = self.r, self.c, self.r.acc
        nbytes = self.T_local * self.h * 2.0
        inter = r.boundary_crosses_nodes(stage)
        if inter:
            lat, bw = c.p2p_latency_inter_s, acc.nic_bw * c.nic_eff
        else:
            lat, bw = c.p2p_latency_s, acc.nvlink_bw * c.nvlink_eff
        hidden = c.p2p_overlap_frac if (r.overlap_p2p and r.vp > 1) else 0.0
        return lat + nbytes / bw * (1.0 - hidden)

    # ------------------------------------------------------------------ data parallel and optimizer
    def params_per_gpu(self) -> list[tuple[float, float]]:
        """(dense, expert) parameters one GPU of each stage holds."""
        r, m = self.r, self.r.model
        kinds = m.layer_kinds()
        assert r.layout.split is not None
        out = []
        vocab = m.padded_vocab(r.tp)
        for s, rng in enumerate(r.layout.split.stage_layers()):
            d = e = 0.0
            for i in rng:
                pd, pe = m.layer_params(kinds[i])
                d += pd / r.tp
                e += pe / (r.ep * r.etp)
            if s == 0:
                d += vocab * m.hidden / r.tp
            if s == r.pp - 1 and (not m.tied_embeddings or r.pp > 1):
                d += vocab * m.hidden / r.tp
            out.append((d, e))
        return out

    def data_parallel(self, stages: list[StageCost]) -> tuple[float, float, dict[str, float]]:
        """(exposed gradient reduction, exposed parameter gather, details) on the critical path."""
        r, c = self.r, self.c
        worst_rs = worst_ag = 0.0
        info: dict[str, float] = {}
        for (d, e), st in zip(self.params_per_gpu(), stages, strict=True):
            n_d, n_e = r.dp * r.cp, r.edp
            rs = self.ring(d * r.grad_bytes, n_d, r.dp_nodes if r.cp == 1 else max(r.dp_nodes, r.cp_nodes))
            rs += self.ring(e * r.grad_bytes, n_e, r.edp_nodes)
            pbytes = 1.0 if r.fp8_params else 2.0
            if r.distributed_optimizer:
                ag = self.ring(d * pbytes, n_d, r.dp_nodes) + self.ring(e * pbytes, n_e, r.edp_nodes)
            else:
                rs *= 2  # an all-reduce
                ag = 0.0
            if r.overlap_grad_reduce:  # buckets reduce while the last microbatch's backward runs
                rs -= min(c.dp_overlap_frac * rs, st.bwd)
            if r.overlap_param_gather:
                ag -= min(c.dp_overlap_frac * ag, st.fwd)
            # the first stage finishes its last backward last: its reduction is the one exposed
            weight = 1.0 if st.stage == 0 else 0.0
            worst_rs = max(worst_rs, rs * weight)
            worst_ag = max(worst_ag, ag)
            info[f"stage{st.stage}_dense_params"] = d
            info[f"stage{st.stage}_expert_params"] = e
        return worst_rs, worst_ag, info

    def optimizer(self) -> tuple[float, float]:
        """(GPU optimizer seconds, CPU-offload seconds) on the busiest GPU."""
        r, c = self.r, self.c
        worst_gpu = worst_cpu = 0.0
        for d, e in self.params_per_gpu():
            shard = d / (r.dp * r.cp) + e / r.edp if r.distributed_optimizer else d + e
            on_cpu = shard * r.offload_fraction
            gpu = (shard - on_cpu) * c.optimizer_bytes_per_param / self.hbm
            cpu = 0.0
            if on_cpu:
                cpu = on_cpu * r.gpus_per_node / c.cpu_adam_params_per_s
                copies = on_cpu * (r.grad_bytes + 2.0) / (r.acc.pcie_bw * c.pcie_eff)
                cpu += copies * (1.0 - c.offload_copy_overlap if r.offload_overlap else 1.0)
            worst_gpu = max(worst_gpu, gpu)
            worst_cpu = max(worst_cpu, cpu)
        return worst_gpu, worst_cpu

    def flops_per_token(self) -> float:
        """Model FLOPs per token (the paper's Appendix D): 6 x (dense params without the input
        embedding + active expert params) + causal attention matmuls (forward + backward)."""
        r, m = self.r, self.r.model
        n = 0.0
        for kind in m.layer_kinds():
            d, e = m.layer_params(kind)
            n += d + (e * m.topk / m.experts if e else 0.0)
        n += m.hidden * m.vocab if not m.tied_embeddings else m.hidden * m.vocab
        attn = m.layers * 3 * 2 * r.seq * m.q_width  # causal: half of 4 x s x width per token, x3
        return 6.0 * n + attn

    def step(self) -> StepTime:
        r, c = self.r, self.c
        stages = self.stage_costs()
        M = r.microbatches
        crit = max(stages, key=lambda s: (s.total, -s.stage))
        mean = sum(s.total for s in stages) / len(stages)
        bubble = (r.pp - 1) * mean / r.vp if r.pp > 1 else 0.0
        rs, ag, dp_info = self.data_parallel(stages)
        opt_gpu, opt_cpu = self.optimizer()
        terms = {
            "compute": M * crit.compute,
            "recompute": M * crit.recompute,
            "tp_comm": M * crit.comm["tp"],
            "cp_comm": M * crit.comm["cp"],
            "ep_a2a": M * crit.comm["ep"],
            "host_launch": M * crit.host_exposed,
            "pipeline_p2p": M * crit.p2p,
            "pipeline_bubble": bubble,
            "dp_grad_reduce": max(0.0, rs),
            "dp_param_gather": max(0.0, ag),
            "optimizer": opt_gpu,
            "optimizer_offload": opt_cpu,
            "step_overhead": c.step_overhead_s,
        }
        seconds = math.fsum(terms.values())
        return StepTime(
            seconds=seconds,
            terms=terms,
            stages=stages,
            critical_stage=crit.stage,
            microbatches=M,
            flops_per_token=self.flops_per_token(),
            details={"mean_stage_s": mean, "critical_stage_s": crit.total, **dp_info},
        )


def step_time(r: SimRecipe, c: Constants = DEFAULT) -> StepTime:
    return StepModel(r, c).step()
