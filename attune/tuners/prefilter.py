"""The memory pre-filter: the skill's memory estimate in front of a tuner, as a direct Python call.

`recipe_memory(spec, args)` estimates each pipeline stage's peak memory for a recipe's full flags with
`attune.knowledge.memory_estimate.estimate` (the formulas the skill's `memory.py` prints), after checking the
layout with the layout enumerator's rules (`attune.knowledge.layouts.layout_from_degrees`). `memory_prefilter`
turns it into the filter `tpe-prefilter` puts in front of TPE: a draw whose estimate, with the margin,
exceeds the GPU's memory, or whose layout is infeasible, is scored zero without a launch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from attune.control.spec import CampaignSpec
from attune.knowledge.layouts import Layout, LayoutError, ModelDims, find_model, layout_from_degrees
from attune.knowledge.memory_estimate import MemoryEstimate, MemoryOptions, accelerator_gib, estimate
from attune.tuners.base import ArgValue

DEFAULT_MARGIN = 0.10  # the memory estimate's default: allocator fragmentation and communication buffers


def _flag_int(args: dict[str, ArgValue], flag: str, default: int | None = 1) -> int | None:
    v = args.get(flag)
    return int(v) if v not in (None, False, True) else default


@functools.lru_cache(maxsize=16)
def _model(name: str) -> ModelDims:
    """The layout enumerator's model (its YAML catalog read once per name)."""
    return find_model(name)


def recipe_layout(spec: CampaignSpec, args: dict[str, ArgValue]) -> tuple[Layout, int]:
    """The layout of a recipe's full flags and its microbatches per step; LayoutError when the layout
    breaks a rule of the framework (degrees, pipeline split, batch divisibility) for this model."""
    model = _model(spec.model)
    layout = layout_from_degrees(
        model, spec.cluster.gpus, tp=_flag_int(args, "--tensor-model-parallel-size") or 1,
        pp=_flag_int(args, "--pipeline-model-parallel-size") or 1,
        cp=_flag_int(args, "--context-parallel-size") or 1,
        vp=_flag_int(args, "--num-virtual-stages-per-pipeline-rank") or 1,
        ep=_flag_int(args, "--expert-model-parallel-size", None) if model.is_moe else None,
        etp=_flag_int(args, "--expert-tensor-parallel-size", None) if model.is_moe else None,
        first=_flag_int(args, "--decoder-first-pipeline-num-layers", None),
        last=_flag_int(args, "--decoder-last-pipeline-num-layers", None),
        account_embedding_loss=bool(args.get("--account-for-embedding-in-pipeline-split")))
    per = (_flag_int(args, "--micro-batch-size") or 1) * layout.dp
    if spec.workload.global_batch % per:
        raise LayoutError(f"the global batch {spec.workload.global_batch} is not a multiple of micro batch x DP ({per})")
    return layout, spec.workload.global_batch // per


def recipe_memory(spec: CampaignSpec, args: dict[str, ArgValue], margin: float = DEFAULT_MARGIN,
                  ) -> tuple[MemoryEstimate | None, str | None]:
    """The skill's memory estimate (`attune.knowledge.memory_estimate.estimate`) for a recipe's full flags:
    (the estimate, None), or (None, why the layout is infeasible for the model and GPU count)."""
    try:
        layout, microbatches = recipe_layout(spec, args)
        tp = layout.tp
        gran = args.get("--recompute-granularity") or ("selective" if args.get("--recompute-activations") else None)
        mods = tuple(str(args.get("--recompute-modules") or "core_attn").replace(",", " ").split())
        offload = bool(args.get("--optimizer-cpu-offload"))
        fraction = args.get("--optimizer-offload-fraction")
        opts = MemoryOptions(
            seq_length=spec.workload.seq_length, micro_batch=_flag_int(args, "--micro-batch-size") or 1,
            num_microbatches=microbatches,
            distributed_optimizer=bool(args.get("--use-distributed-optimizer")),
            sequence_parallel=bool(args.get("--sequence-parallel")) and tp > 1,
            recompute=str(gran or "none"), recompute_modules=mods,
            recompute_method=str(args.get("--recompute-method") or "uniform"),
            recompute_num_layers=_flag_int(args, "--recompute-num-layers") or 1,
            optimizer_offload_fraction=(float(fraction) if fraction not in (None, True, False) else 1.0)
            if offload else 0.0,
            param_bytes=1 if args.get("--fp8-param-gather") else 2,
            margin=margin, gpu_memory_gib=accelerator_gib(spec.cluster.accelerator))
        return estimate(_model(spec.model), layout, opts), None
    except (LayoutError, ValueError) as exc:
        return None, str(exc)


def memory_prefilter(spec: CampaignSpec, margin: float = DEFAULT_MARGIN,
                     ) -> tuple[Callable[[dict[str, ArgValue]], str | None] | None, str]:
    """The skill's memory estimate as a filter over the campaign's flag space, where it applies;
    (None, why not) otherwise. A draw is skipped (scored 0, never launched) when a stage's estimate
    with the margin exceeds the GPU's memory, or when its layout is infeasible. The baseline is exempt."""
    try:
        _model(spec.model)
        accelerator_gib(spec.cluster.accelerator)
    except (LayoutError, KeyError, ValueError) as exc:
        return None, f"no memory estimate for {spec.model} on {spec.cluster.accelerator}: {exc}"

    def skip(full: dict[str, ArgValue]) -> str | None:
        flags = {k: v for k, v in full.items() if k.startswith("--")}
        args = {k: v for k, v in {**spec.baseline.args, **flags}.items() if v not in (None, False)}
        if args == {k: v for k, v in spec.baseline.args.items() if v not in (None, False)}:
            return None
        est, infeasible = recipe_memory(spec, args, margin)
        if infeasible is not None:
            return f"the layout is infeasible for this model and GPU count: {infeasible}"
        if est is not None and est.fits is False:
            return (f"the memory estimate says stage {est.peak.stage} needs "
                    f"{est.peak.with_margin_bytes / 2**30:.1f} GiB with a {margin:.1%} margin: it does not fit")
        return None

    return skip, "memory estimate of the skill's helpers"


