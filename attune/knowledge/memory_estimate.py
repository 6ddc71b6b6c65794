"""A pre-launch estimate of each pipeline stage's peak GPU memory for one layout.

Standard library only (plus attune.knowledge.layouts): the skill's `scripts/memory.py` runs it with a bare
`python3`. The formulas follow `../shared/reference/megatron.md` ("Memory per GPU"); every
number is in bytes until the report converts to GiB (2**30 bytes).

Weights, gradients and optimizer state, per parameter held on a GPU:
    18 bytes without the distributed optimizer (BF16 weight 2 + FP32 gradient 4 + FP32 main
    weight and two Adam moments 12); with it, 6 + 12/(DP x CP) for the dense part (the
    optimizer shards over the data-parallel group with context parallelism; megatron.md writes
    DP, which is the same at CP 1) and 6 + 12/EDP for the experts. Offloading a fraction f of
    the optimizer to the host leaves 6 + 12(1-f)/shards. `param_bytes` (1 with FP8 weights)
    and `grad_bytes` (2 with BF16 gradient reduction) replace the 2 and the 4.
Parameters per GPU on a stage:
    (non-expert parameters of its layers) / TP + (expert parameters of its layers) / (EP x ETP),
    plus the input embedding (padded vocabulary x hidden / TP) on the first stage and the output
    layer on the last (a tied embedding still needs a copy there when PP > 1).
Activations of one layer for one microbatch, in bytes: s' x b x h x k, with s' = seq / CP and
    k = 10 + 8 + m, where m is the MLP's share: 4 f/h for a two-matrix MLP (megatron.md's
    18 + 4 f/h), 6 f/h for a gated one (its first projection is twice as wide), f the MLP width
    (top-k x expert width + shared width on a MoE layer), and on a MoE layer 4 x top-k more for
    the routed copies of each token (permuted input and expert output, 2 bytes each).
    The 10 (layer-norm inputs 4, their outputs feeding QKV and FC1 4, dropout masks 2) sits on
    every tensor-parallel rank unless sequence parallelism shards it; the 8 + m is always
    sharded by TP. So k/TP with sequence parallelism, 10 + (8 + m)/TP without (megatron.md's
    10 + 24/TP for f = 4h). Selective recompute of `core_attn` drops the 5 a s'/h
    attention-score term, present only without flash attention; `layernorm` drops the 4 of the
    layer-norm outputs; `mlp` (or `moe` on MoE layers) drops m; `moe_act` drops 2 f/h on MoE
    layers.
    Full recompute keeps only each recomputed chunk's input (2 bytes per element, sharded by
    sequence parallelism), plus one chunk's activations as the working set during backward.
    `uniform` recomputes every layer in chunks of N layers; `block` recomputes the first N
    layers of each stage (of each virtual chunk) and stores the rest.
Microbatches in flight on stage i (0-based) of PP: min(PP - i, M) with 1F1B; with VP > 1
    virtual stages, ((PP - i - 1) x 2 + (VP - 1) x PP + 1) / VP, capped at M, which for the
    first stage is PP x (1 + (PP - 1)/(PP x VP)) as in megatron.md.
The last stage also holds one microbatch of FP32 logits: s' x b x V/TP x 4 bytes.
A margin (default 10%) covers the allocator's fragmentation and communication buffers, which
public estimators put at 10-15% of the peak; calibrate it from runs that fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from attune.knowledge.layouts import Layout, LayoutError, ModelDims

GIB = float(2**30)
# Total memory a training process sees (nvidia-smi totals, MiB -> GiB).
ACCELERATOR_GIB = {
    "h100": 81559 / 1024,
    "h200": 143771 / 1024,
    "b200": 183359 / 1024,
}
# Megatron's selective-recompute modules (`--recompute-modules`; megatron/core/transformer/
# transformer_config.py `recompute_modules`).
RECOMPUTE_MODULES = ("core_attn", "layernorm", "mlp", "moe", "moe_act", "shared_experts", "mla_up_proj")
# The ones whose saving this estimate models; the others are accepted and save nothing here (the
# estimate errs high).
MODELLED_RECOMPUTE_MODULES = RECOMPUTE_MODULES[:5]


@dataclass
class MemoryOptions:
    seq_length: int
    micro_batch: int = 1
    num_microbatches: int | None = None  # global batch / (micro batch x DP); caps the in-flight count
    distributed_optimizer: bool = True
    sequence_parallel: bool | None = None  # default: on when TP > 1
    recompute: str = "selective"  # none | selective | full
    recompute_modules: tuple[str, ...] = ("core_attn",)
    recompute_method: str = "uniform"  # uniform | block (full recompute)
    recompute_num_layers: int = 1
    flash_attention: bool = True
    optimizer_offload_fraction: float = 0.0
    param_bytes: int = 2  # 1 where FP8 weights are kept (--fp8-param-gather)
    grad_bytes: int = 4  # 2 where gradients are accumulated and reduced in BF16
    logits: bool = True
    margin: float = 0.10
    gpu_memory_gib: float | None = None

    def check(self, layout: Layout) -> None:
        for name in ("seq_length", "micro_batch", "recompute_num_layers"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise LayoutError(f"{name} must be a positive integer, got {v!r}")
        if self.num_microbatches is not None and self.num_microbatches <= 0:
            raise LayoutError(f"num_microbatches must be positive, got {self.num_microbatches}")
        if self.recompute not in ("none", "selective", "full"):
            raise LayoutError(f"recompute must be none, selective or full, got {self.recompute!r}")
        if self.recompute_method not in ("uniform", "block"):
            raise LayoutError(f"recompute_method must be uniform or block, got {self.recompute_method!r}")
        bad = [m for m in self.recompute_modules if m not in RECOMPUTE_MODULES]
        if bad:
            raise LayoutError(f"unknown recompute module(s) {bad}; known: {list(RECOMPUTE_MODULES)}")
        if not 0.0 <= self.optimizer_offload_fraction <= 1.0:
            raise LayoutError("optimizer_offload_fraction must be within [0, 1]")
        if self.optimizer_offload_fraction and not self.distributed_optimizer:
            raise LayoutError("optimizer offload needs the distributed optimizer")
        if self.param_bytes not in (1, 2, 4) or self.grad_bytes not in (2, 4):
            raise LayoutError("param_bytes must be 1, 2 or 4 and grad_bytes 2 or 4")
        if not 0.0 <= self.margin < 5.0:
            raise LayoutError(f"margin must be a fraction in [0, 5), got {self.margin}")
        if self.gpu_memory_gib is not None and self.gpu_memory_gib <= 0:
            raise LayoutError("gpu_memory_gib must be positive")
        if self.seq_length % layout.cp:
            raise LayoutError(f"seq_length ({self.seq_length}) must be divisible by CP ({layout.cp})")


@dataclass
class StageMemory:
    stage: int
    layers: int
    dense_layers: int
    moe_layers: int
    params: float  # parameters held by one GPU of the stage
    weights_bytes: float  # weights + gradients + optimizer state
    activation_bytes: float
    in_flight: float
    logits_bytes: float
    total_bytes: float = 0.0
    with_margin_bytes: float = 0.0
    fits: bool | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "layers": self.layers,
            "dense_layers": self.dense_layers,
            "moe_layers": self.moe_layers,
            "params_per_gpu": round(self.params),
            "weights_gib": round(self.weights_bytes / GIB, 3),
            "activations_gib": round(self.activation_bytes / GIB, 3),
            "microbatches_in_flight": round(self.in_flight, 3),
            "logits_gib": round(self.logits_bytes / GIB, 3),
            "total_gib": round(self.total_bytes / GIB, 3),
            "with_margin_gib": round(self.with_margin_bytes / GIB, 3),
            "fits": self.fits,
        }


@dataclass
class MemoryEstimate:
    stages: list[StageMemory] = field(default_factory=list)
    gpu_memory_gib: float | None = None
    margin: float = 0.0

    @property
    def peak(self) -> StageMemory:
        return max(self.stages, key=lambda s: s.with_margin_bytes)

    @property
    def fits(self) -> bool | None:
        if self.gpu_memory_gib is None:
            return None
        return all(s.fits for s in self.stages)

    def as_dict(self) -> dict[str, Any]:
        peak = self.peak
        return {
            "gpu_memory_gib": None if self.gpu_memory_gib is None else round(self.gpu_memory_gib, 3),
            "margin": self.margin,
            "fits": self.fits,
            "peak_stage": peak.stage,
            "peak_gib": round(peak.with_margin_bytes / GIB, 3),
            "stages": [s.as_dict() for s in self.stages],
        }


def bytes_per_param(
    dist_opt: bool, shards: int, offload: float = 0.0, param_bytes: int = 2, grad_bytes: int = 4
) -> float:
    """Weights + gradients + optimizer bytes per parameter (megatron.md: 18, or 6 + 12/shards)."""
    if not dist_opt:
        return float(param_bytes + grad_bytes + 12)
    return param_bytes + grad_bytes + 12.0 * (1.0 - offload) / shards


def layer_activation_coeff(model: ModelDims, kind: str, layout: Layout, opts: MemoryOptions) -> float:
    """k for one layer: bytes of stored activations per (token x hidden) for one microbatch."""
    h = model.hidden
    width = model.ffn if kind == "dense" else model.topk * (model.moe_ffn or 0) + model.shared_expert_ffn
    width = width or 0
    sp = opts.sequence_parallel if opts.sequence_parallel is not None else layout.tp > 1
    mods = set(opts.recompute_modules) if opts.recompute == "selective" else set()
    seq_local = opts.seq_length / layout.cp
    replicated = 10.0
    mlp = (6.0 if model.gated_mlp else 4.0) * width / h
    if kind == "moe":
        mlp += 4.0 * model.topk  # the routed copies: permuted inputs and expert outputs
    sharded = 8.0 + mlp
    if not opts.flash_attention and "core_attn" not in mods:
        sharded += 5.0 * model.heads * seq_local / h
    if "layernorm" in mods:
        replicated -= 4.0
    if "mlp" in mods or (kind == "moe" and "moe" in mods):
        sharded -= mlp
    elif kind == "moe" and "moe_act" in mods:
        sharded -= 2.0 * width / h
    if sp:
        return (replicated + sharded) / layout.tp
    return replicated + sharded / layout.tp


def in_flight(stage: int, layout: Layout, num_microbatches: int | None) -> float:
    pp, vp = layout.pp, layout.vp
    if pp == 1:
        return 1.0
    if vp == 1:
        n = float(pp - stage)
        return min(n, num_microbatches) if num_microbatches else n
    chunks = (pp - stage - 1) * 2 + (vp - 1) * pp + 1
    if num_microbatches:
        chunks = min(chunks, num_microbatches * vp)
    return chunks / vp


def estimate(model: ModelDims, layout: Layout, opts: MemoryOptions) -> MemoryEstimate:
    """Per-stage memory of `layout` (whose split says which layers each stage holds)."""
    opts.check(layout)
    if layout.split is None or layout.split.pp != layout.pp:
        raise LayoutError("the layout needs a pipeline split with PP stages")
    kinds = model.layer_kinds()
    tp, pp = layout.tp, layout.pp
    ep, etp = layout.ep or 1, layout.etp or 1
    edp = layout.edp or 1
    sp = opts.sequence_parallel if opts.sequence_parallel is not None else tp > 1
    seq_local = opts.seq_length / layout.cp
    tokens_h = seq_local * opts.micro_batch * model.hidden  # elements of one [s', b, h] tensor
    # The distributed optimizer shards the dense part over the data-parallel group with context
    # parallelism (DP x CP) and the experts over the expert-data-parallel group (EDP).
    dense_bpp = bytes_per_param(
        opts.distributed_optimizer, layout.dp * layout.cp, opts.optimizer_offload_fraction,
        opts.param_bytes, opts.grad_bytes,
    )
    expert_bpp = bytes_per_param(
        opts.distributed_optimizer, edp, opts.optimizer_offload_fraction, opts.param_bytes, opts.grad_bytes
    )
    vocab_padded = model.padded_vocab(tp)
    result = MemoryEstimate(gpu_memory_gib=opts.gpu_memory_gib, margin=opts.margin)
    for i, layer_range in enumerate(layout.split.stage_layers()):
        stage_kinds = [kinds[j] for j in layer_range]
        dense_p = 0.0
        expert_p = 0.0
        for kind in stage_kinds:
            d, e = model.layer_params(kind)
            dense_p += d / tp
            expert_p += e / (ep * etp)
        if i == 0:
            dense_p += vocab_padded * model.hidden / tp + model.position_embeddings * model.hidden
        if i == pp - 1:
            dense_p += model._norm(model.hidden)
            if not model.tied_embeddings or pp > 1:
                dense_p += vocab_padded * model.hidden / tp
        weights = dense_p * dense_bpp + expert_p * expert_bpp
        per_mb = _stage_activations(model, stage_kinds, layout, opts, tokens_h, sp)
        working = _full_recompute_working_set(model, stage_kinds, layout, opts, tokens_h)
        n_flight = in_flight(i, layout, opts.num_microbatches)
        acts = per_mb * n_flight + working
        logits = seq_local * opts.micro_batch * vocab_padded / tp * 4.0 if (opts.logits and i == pp - 1) else 0.0
        st = StageMemory(
            stage=i,
            layers=len(stage_kinds),
            dense_layers=stage_kinds.count("dense"),
            moe_layers=stage_kinds.count("moe"),
            params=dense_p + expert_p,
            weights_bytes=weights,
            activation_bytes=acts,
            in_flight=n_flight,
            logits_bytes=logits,
        )
        st.total_bytes = weights + acts + logits
        st.with_margin_bytes = st.total_bytes * (1.0 + opts.margin)
        if opts.gpu_memory_gib is not None:
            st.fits = st.with_margin_bytes <= opts.gpu_memory_gib * GIB
        result.stages.append(st)
    return result


def _chunks(stage_kinds: list[str], vp: int) -> list[list[str]]:
    per = len(stage_kinds) // vp if vp > 1 else len(stage_kinds)
    if vp <= 1 or per * vp != len(stage_kinds):
        return [stage_kinds]
    return [stage_kinds[c * per : (c + 1) * per] for c in range(vp)]


def _stage_activations(
    model: ModelDims, stage_kinds: list[str], layout: Layout, opts: MemoryOptions, tokens_h: float, sp: bool
) -> float:
    """Stored activations of one microbatch through the whole stage (all its virtual chunks)."""
    coeff = {k: layer_activation_coeff(model, k, layout, opts) for k in ("dense", "moe")}
    if opts.recompute != "full":
        return sum(coeff[k] for k in stage_kinds) * tokens_h
    input_bytes = 2.0 * tokens_h / (layout.tp if sp else 1)
    total = 0.0
    n = opts.recompute_num_layers
    for chunk in _chunks(stage_kinds, layout.vp):
        if opts.recompute_method == "uniform":
            total += math.ceil(len(chunk) / n) * input_bytes
        else:
            recomputed = min(n, len(chunk))
            total += recomputed * input_bytes + sum(coeff[k] for k in chunk[recomputed:]) * tokens_h
    return total


def _full_recompute_working_set(
    model: ModelDims, stage_kinds: list[str], layout: Layout, opts: MemoryOptions, tokens_h: float
) -> float:
    """With full recompute, one recomputed chunk's activations live during its backward."""
    if opts.recompute != "full" or not stage_kinds:
        return 0.0
    coeff = {k: layer_activation_coeff(model, k, layout, opts) for k in ("dense", "moe")}
    n = min(opts.recompute_num_layers, len(stage_kinds))
    heaviest = sorted((coeff[k] for k in stage_kinds), reverse=True)[:n]
    return sum(heaviest) * tokens_h


def accelerator_gib(name: str) -> float:
    try:
        return ACCELERATOR_GIB[name.strip().lower()]
    except KeyError:
        raise LayoutError(f"unknown accelerator {name!r}; known: {sorted(ACCELERATOR_GIB)}") from None
