"""A Megatron-LM command line, read the way the simulator needs it.

`parse_argv` (`attune.core.recipe`) turns `--flag value` / bare `--flag` / `--no-flag` tokens into a flag mapping;
`build_recipe` resolves that mapping (with the model's shapes, the accelerator and the GPU count)
into a `SimRecipe`: the parallel layout, the schedule, recomputation, the MoE dispatcher, the
overlaps, optimizer offload, precision and the objective-defining settings. It applies Megatron's
own defaults and silent rewrites (sequence parallelism forced off at TP 1, `--grad-reduce-in-bf16`
turning off FP32 accumulation, ...) so that the resolved-arguments block a simulated run prints
shows what a real run would, and raises `RecipeError` where Megatron's argument validation would
stop a real job at start-up (the run then crashes with that message).

Unknown flags are kept (a real Megatron would reject a misspelt one; the gate refuses unlisted
flags before launch anyway) and printed in the arguments block.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from attune.core.errors import SimError
from attune.core.recipe import ArgValue, render_args
from attune.knowledge.layouts import Layout, LayoutError, ModelDims, layout_from_degrees
from attune.knowledge.memory_estimate import RECOMPUTE_MODULES
from attune.sim.hardware import GPUS_PER_NODE, Accelerator


class RecipeError(SimError, ValueError):
    """What Megatron's argument validation (or model construction) would refuse at start-up."""


# ------------------------------------------------------------------------------------ argv


render_argv = render_args  # the one argv renderer; `parse_argv` (attune.core.recipe) is its parser


def shell_line(argv: Sequence[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)


# ------------------------------------------------------------------------------------ values


def _flag_value(args: Mapping[str, ArgValue], flag: str) -> ArgValue:
    """A flag's value: None when absent (or given as false/null)."""
    v = args.get(flag)
    if v is False:
        return None
    return v


def _as_bool(args: Mapping[str, ArgValue], flag: str, default: bool = False) -> bool:
    neg = "--no-" + flag[2:]
    if args.get(neg) not in (None, False):
        return False
    v = args.get(flag)
    if v is None:
        return default
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in ("true", "1", "yes", "on"):
        return True
    if s in ("false", "0", "no", "off"):
        return False
    raise RecipeError(f"{flag}: expected a bare flag or true/false, got {v!r}")


def _as_int(args: Mapping[str, ArgValue], flag: str, default: int | None = None) -> int | None:
    v = _flag_value(args, flag)
    if v is None or v is True:
        if v is True:
            raise RecipeError(f"{flag}: expected an integer value")
        return default
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise RecipeError(f"{flag}: expected an integer, got {v!r}") from None
    if not math.isfinite(f) or f != int(f):
        raise RecipeError(f"{flag}: expected an integer, got {v!r}")
    return int(f)


def _as_float(args: Mapping[str, ArgValue], flag: str, default: float | None = None) -> float | None:
    v = _flag_value(args, flag)
    if v is None:
        return default
    if v is True:
        raise RecipeError(f"{flag}: expected a number")
    try:
        return float(v)
    except (TypeError, ValueError):
        raise RecipeError(f"{flag}: expected a number, got {v!r}") from None


def _as_str(args: Mapping[str, ArgValue], flag: str, default: str | None = None) -> str | None:
    v = _flag_value(args, flag)
    if v is None or v is True:
        return default
    return str(v)


def _as_list(args: Mapping[str, ArgValue], flag: str) -> tuple[str, ...] | None:
    v = _flag_value(args, flag)
    if v is None or v is True:
        return None
    return tuple(p for p in str(v).replace(",", " ").replace("[", " ").replace("]", " ").replace("'", " ").split() if p)


# ------------------------------------------------------------------------------------ the recipe

# Flags whose value changes what is trained (the world's view; the gate keeps its own lists).
# kind: "lr" (learning speed), "data" (other rows or initialisation), "batch" (rows per step),
# "subtle" (a rounding- or weighting-level change), "strong" (a visible change of the loss),
# "aux" (only the MoE load-balancing loss).
OBJECTIVE_FLAGS: dict[str, str] = {
    "--lr": "lr",
    "--min-lr": "subtle",
    "--lr-decay-style": "subtle",
    "--lr-warmup-iters": "lr",
    "--lr-warmup-fraction": "lr",
    "--lr-warmup-init": "lr",
    "--seed": "data",
    "--data-path": "data",
    "--train-data-path": "data",
    "--split": "data",
    "--tokenizer-model": "strong",
    "--tokenizer-type": "strong",
    "--load": "strong",
    "--global-batch-size": "batch",
    "--grad-reduce-in-bf16": "subtle",
    "--accumulate-allreduce-grads-in-fp32": "subtle",
    "--calculate-per-token-loss": "subtle",
    "--moe-aux-loss-coeff": "aux",
    "--moe-z-loss-coeff": "subtle",
    "--moe-router-dtype": "subtle",
    "--moe-expert-capacity-factor": "strong",
    "--moe-pad-expert-input-to-capacity": "strong",
    "--moe-router-force-load-balancing": "strong",
    "--moe-router-topk": "strong",
    "--moe-router-topk-scaling-factor": "strong",
    "--moe-router-enable-expert-bias": "subtle",
    "--moe-router-load-balancing-type": "aux",
    "--clip-grad": "subtle",
    "--weight-decay": "subtle",
    "--adam-beta1": "subtle",
    "--adam-beta2": "subtle",
    "--adam-eps": "subtle",
    "--bf16": "subtle",
    "--fp16": "subtle",
    "--fp8-format": "subtle",
    "--fp8-recipe": "subtle",
    "--fp8-param-gather": "subtle",
    "--attention-softmax-in-fp32": "subtle",
    "--hidden-dropout": "strong",
    "--attention-dropout": "strong",
    "--eod-mask-loss": "subtle",
    "--use-precision-aware-optimizer": "subtle",
}
# Architecture flags: a value that disagrees with the model cannot load its checkpoint.
ARCH_FLAGS: dict[str, str] = {
    "--num-layers": "layers",
    "--hidden-size": "hidden",
    "--num-attention-heads": "heads",
    "--num-query-groups": "groups",
    "--kv-channels": "kv_channels",
    "--ffn-hidden-size": "ffn",
    "--num-experts": "experts",
    "--moe-ffn-hidden-size": "moe_ffn",
    "--moe-router-topk": "topk",
    "--seq-length": None,  # checked against the campaign's workload elsewhere
}
# Flags the simulator reads (besides OBJECTIVE_FLAGS and ARCH_FLAGS), and flags it knows change
# nothing it models (bookkeeping, logging, architecture details the model data already holds).
MODELLED_FLAGS = frozenset({
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
    "--expert-model-parallel-size", "--expert-tensor-parallel-size", "--num-layers-per-virtual-pipeline-stage",
    "--num-virtual-stages-per-pipeline-rank", "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers", "--account-for-embedding-in-pipeline-split",
    "--account-for-loss-in-pipeline-split", "--sequence-parallel", "--micro-batch-size", "--train-iters",
    "--recompute-granularity", "--recompute-method", "--recompute-num-layers", "--recompute-modules",
    "--recompute-activations", "--moe-token-dispatcher-type", "--moe-flex-dispatcher-backend",
    "--moe-deepep-num-sms", "--moe-grouped-gemm", "--moe-permute-fusion", "--moe-shared-expert-overlap",
    "--overlap-moe-expert-parallel-comm", "--tp-comm-overlap", "--overlap-grad-reduce", "--overlap-param-gather",
    "--overlap-p2p-communication", "--no-overlap-p2p-communication", "--use-distributed-optimizer",
    "--optimizer-cpu-offload", "--optimizer-offload-fraction", "--overlap-cpu-optimizer-d2h-h2d",
    "--cross-entropy-loss-fusion", "--gradient-accumulation-fusion", "--no-gradient-accumulation-fusion",
    "--moe-router-fusion", "--cuda-graph-impl", "--profile", "--use-pytorch-profiler", "--profile-step-start",
    "--profile-step-end", "--profile-ranks",
})
IGNORED_FLAGS = frozenset({
    "--log-interval", "--log-throughput", "--log-timers-to-tensorboard", "--log-memory-to-tensorboard",
    "--tensorboard-dir", "--wandb-project", "--wandb-exp-name", "--save", "--save-interval", "--eval-interval",
    "--eval-iters", "--exit-duration-in-mins", "--manual-gc", "--manual-gc-interval", "--num-workers",
    "--data-cache-path", "--moe-router-score-function", "--moe-shared-expert-intermediate-size",
    "--moe-layer-freq", "--max-position-embeddings", "--position-embedding-type", "--rotary-base",
    "--rotary-percent", "--normalization", "--swiglu", "--untie-embeddings-and-output-weights",
    "--disable-bias-linear", "--add-qkv-bias", "--qk-layernorm", "--group-query-attention",
    "--make-vocab-size-divisible-by", "--vocab-size", "--cp-comm-type", "--cuda-graph-scope",
    "--distributed-timeout-minutes", "--timing-log-level", "--use-mcore-models", "--transformer-impl",
})


def unmodelled_flags(args: Mapping[str, ArgValue]) -> list[str]:
    """Flags given that the simulator neither models nor knows to be irrelevant."""
    known = MODELLED_FLAGS | IGNORED_FLAGS | set(OBJECTIVE_FLAGS) | set(ARCH_FLAGS)
    return sorted(f for f, v in args.items() if v not in (None, False) and f not in known)


@dataclass(frozen=True)
class SimRecipe:
    """Everything the step-time, memory and loss models read, resolved."""

    model: ModelDims
    acc: Accelerator
    gpus: int
    gpus_per_node: int
    layout: Layout
    seq: int
    gbs: int
    mbs: int
    train_iters: int
    precision: str  # bf16 | fp8
    fp8_params: bool
    sequence_parallel: bool
    recompute: str  # none | selective | full
    recompute_modules: tuple[str, ...]
    recompute_method: str  # uniform | block
    recompute_num_layers: int
    dispatcher: str  # alltoall | allgather | flex
    flex_backend: str | None  # deepep | hybridep
    deepep_sms: int
    grouped_gemm: bool
    permute_fusion: bool
    shared_expert_overlap: bool
    ep_comm_overlap: bool
    tp_comm_overlap: bool
    overlap_grad_reduce: bool
    overlap_param_gather: bool
    overlap_p2p: bool
    distributed_optimizer: bool
    grad_bytes: int  # 4 (FP32 accumulation and reduction) or 2 (BF16)
    cpu_offload: bool
    offload_fraction: float
    offload_overlap: bool
    cross_entropy_fusion: bool
    grad_accum_fusion: bool
    router_fusion: bool
    cuda_graphs: bool
    expandable_segments: bool
    max_connections: int | None
    aux_loss: bool  # the model computes a load-balancing loss (per microbatch)
    profile: bool
    profile_steps: tuple[int, int]  # [start, end) in iterations, as Megatron reads them
    profile_ranks: tuple[int, ...]
    args: dict[str, ArgValue] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)

    # ---- derived
    @property
    def tp(self) -> int:
        return self.layout.tp

    @property
    def pp(self) -> int:
        return self.layout.pp

    @property
    def vp(self) -> int:
        return self.layout.vp

    @property
    def cp(self) -> int:
        return self.layout.cp

    @property
    def dp(self) -> int:
        return self.layout.dp

    @property
    def ep(self) -> int:
        return self.layout.ep or 1

    @property
    def etp(self) -> int:
        return self.layout.etp or 1

    @property
    def edp(self) -> int:
        return self.layout.edp or 1

    @property
    def microbatches(self) -> int:
        return self.gbs // (self.mbs * self.dp)

    @property
    def tokens_per_step(self) -> int:
        return self.gbs * self.seq

    @property
    def nodes(self) -> int:
        return max(1, -(-self.gpus // self.gpus_per_node))

    @property
    def deepep(self) -> bool:
        return self.dispatcher == "flex" and self.flex_backend in ("deepep", "hybridep")

    def stage_of_rank(self, rank: int) -> int:
        """Megatron's default rank order (tp-cp-ep-dp-pp): the pipeline stage is outermost."""
        return rank // (self.gpus // self.pp)

    def first_rank_of_stage(self, stage: int) -> int:
        return stage * (self.gpus // self.pp)

    def group_nodes(self, size: int, stride: int) -> int:
        """Nodes spanned by a group of `size` ranks `stride` apart (ranks fill nodes in order)."""
        if size <= 1:
            return 1
        span = (size - 1) * stride + 1
        if stride >= self.gpus_per_node:
            return size
        return max(1, -(-span // self.gpus_per_node))

    @property
    def tp_nodes(self) -> int:
        return self.group_nodes(self.tp, 1)

    @property
    def cp_nodes(self) -> int:
        return self.group_nodes(self.cp, self.tp)

    @property
    def ep_nodes(self) -> int:
        """Nodes an expert group (ETP x EP consecutive expert ranks) spans."""
        return self.group_nodes(self.ep * self.etp, 1)

    @property
    def dp_nodes(self) -> int:
        return self.group_nodes(self.dp, self.tp * self.cp)

    @property
    def edp_nodes(self) -> int:
        return self.group_nodes(self.edp, self.ep * self.etp)

    def boundary_crosses_nodes(self, stage: int) -> bool:
        """Whether the pipeline boundary after `stage` (to stage + 1, or back to 0) crosses nodes."""
        stride = self.gpus // self.pp
        nxt = (stage + 1) % self.pp
        return (stage * stride) // self.gpus_per_node != (nxt * stride) // self.gpus_per_node

    def objective_settings(self) -> dict[str, ArgValue]:
        """The objective-defining flags this run sets (the world's view; used by the loss model)."""
        return {f: self.args[f] for f in OBJECTIVE_FLAGS if self.args.get(f) not in (None, False)}


def _vp_from_args(args: Mapping[str, ArgValue], model: ModelDims, pp: int, first: int | None, last: int | None,
                  accounted: bool) -> int:
    vp = _as_int(args, "--num-virtual-stages-per-pipeline-rank")
    per_vstage = _as_int(args, "--num-layers-per-virtual-pipeline-stage")
    if vp is not None and per_vstage is not None:
        raise RecipeError(
            "--num-layers-per-virtual-pipeline-stage and --num-virtual-stages-per-pipeline-rank are exclusive"
        )
    if per_vstage is not None:
        if per_vstage <= 0:
            raise RecipeError("--num-layers-per-virtual-pipeline-stage must be positive")
        if first is not None or last is not None:
            raise RecipeError("--num-layers-per-virtual-pipeline-stage cannot be combined with an uneven split; "
                              "use --num-virtual-stages-per-pipeline-rank")
        slots = model.layers + (2 if accounted else 0)
        if slots % (pp * per_vstage):
            raise RecipeError(
                f"number of layers per pipeline stage ({slots}/{pp}) must be divisible by "
                f"--num-layers-per-virtual-pipeline-stage ({per_vstage})"
            )
        vp = slots // (pp * per_vstage)
    vp = vp or 1
    if vp < 1:
        raise RecipeError("virtual stages must be positive")
    if vp > 1 and pp < 2:
        raise RecipeError("virtual pipeline stages need --pipeline-model-parallel-size > 1")
    return vp


def _first_refusal(rules: Iterable[tuple[bool, str]]) -> None:
    """Raise the message of the first broken rule (rules: (broken?, message), checked in order)."""
    for broken, message in rules:
        if broken:
            raise RecipeError(message)


def _check_architecture(model: ModelDims, a: Mapping[str, ArgValue]) -> None:
    """Architecture flags that disagree with the model cannot load its weights."""
    expect = {
        "layers": model.layers, "hidden": model.hidden, "heads": model.heads, "groups": model.groups,
        "kv_channels": model.kv_channels, "ffn": model.ffn, "experts": model.experts or None,
        "moe_ffn": model.moe_ffn, "topk": model.topk or None,
    }
    for flag, key in ARCH_FLAGS.items():
        if key is None or a.get(flag) in (None, False):
            continue
        got = _as_int(a, flag)
        want = expect.get(key)
        if want is not None and got != want:
            raise RecipeError(
                f"{flag} {got} does not match the model {model.name} ({key} = {want}): "
                "size mismatch while loading the checkpoint"
            )


@dataclass(frozen=True)
class _Sizes:
    """The batch shape and the parallel degrees a command line asks for."""

    seq: int
    gbs: int
    mbs: int
    iters: int
    tp: int
    pp: int
    cp: int
    ep: int
    etp: int


def _sizes(model: ModelDims, a: Mapping[str, ArgValue]) -> _Sizes:
    seq = _as_int(a, "--seq-length") or model.seq_length
    if not seq:
        raise RecipeError("--seq-length is required")
    gbs = _as_int(a, "--global-batch-size")
    if not gbs:
        raise RecipeError("--global-batch-size is required")
    mbs = _as_int(a, "--micro-batch-size", 1) or 1
    iters = _as_int(a, "--train-iters", 14) or 14
    tp = _as_int(a, "--tensor-model-parallel-size", 1) or 1
    pp = _as_int(a, "--pipeline-model-parallel-size", 1) or 1
    cp = _as_int(a, "--context-parallel-size", 1) or 1
    ep = _as_int(a, "--expert-model-parallel-size", 1) or 1
    etp = _as_int(a, "--expert-tensor-parallel-size")
    for name, v in (("--tensor-model-parallel-size", tp), ("--pipeline-model-parallel-size", pp),
                    ("--context-parallel-size", cp), ("--expert-model-parallel-size", ep),
                    ("--micro-batch-size", mbs), ("--global-batch-size", gbs), ("--train-iters", iters)):
        if v <= 0:
            raise RecipeError(f"{name} must be positive, got {v}")
    if etp is None:
        etp = tp if model.is_moe else 1  # Megatron-LM's default: expert TP follows TP
    return _Sizes(seq, gbs, mbs, iters, tp, pp, cp, ep, etp)


def _layout(model: ModelDims, gpus: int, a: Mapping[str, ArgValue], s: _Sizes) -> tuple[Layout, int]:
    """The parallel layout and the virtual pipeline stages per rank."""
    first = _as_int(a, "--decoder-first-pipeline-num-layers")
    last = _as_int(a, "--decoder-last-pipeline-num-layers")
    accounted = _as_bool(a, "--account-for-embedding-in-pipeline-split") or _as_bool(
        a, "--account-for-loss-in-pipeline-split"
    )
    if accounted and not (
        _as_bool(a, "--account-for-embedding-in-pipeline-split") and _as_bool(a, "--account-for-loss-in-pipeline-split")
    ):
        raise RecipeError("the simulator models embedding and loss accounting only together")
    tp, pp, cp = s.tp, s.pp, s.cp
    if gpus % (tp * pp * cp):
        raise RecipeError(
            f"world size ({gpus}) is not divisible by tensor ({tp}) x pipeline ({pp}) x context ({cp}) "
            "model parallel size"
        )
    vp = _vp_from_args(a, model, pp, first, last, accounted)
    if cp > 1 and s.seq % (2 * cp):
        raise RecipeError(f"--seq-length ({s.seq}) must be divisible by 2 x --context-parallel-size ({2 * cp})")
    try:
        layout = layout_from_degrees(
            model, gpus, tp=tp, pp=pp, cp=cp, vp=vp,
            ep=s.ep if model.is_moe else None, etp=s.etp if model.is_moe else None,
            first=first, last=last, account_embedding_loss=accounted,
        )
    except LayoutError as exc:
        raise RecipeError(str(exc)) from None
    dp = layout.dp
    if s.gbs % (s.mbs * dp):
        raise RecipeError(
            f"--global-batch-size ({s.gbs}) is not divisible by micro batch size ({s.mbs}) x data parallel size ({dp})"
        )
    return layout, vp


@dataclass(frozen=True)
class _Recompute:
    granularity: str
    modules: tuple[str, ...]
    method: str
    num_layers: int


def _recompute_granularity(a: Mapping[str, ArgValue]) -> tuple[str, tuple[str, ...]]:
    gran = _as_str(a, "--recompute-granularity")
    if _as_bool(a, "--recompute-activations"):
        gran = gran or "selective"
    gran = gran or "none"
    if gran not in ("none", "full", "selective"):
        raise RecipeError(f"--recompute-granularity: expected full or selective, got {gran!r}")
    modules = _as_list(a, "--recompute-modules") or (("core_attn",) if gran == "selective" else ())
    bad = [m for m in modules if m not in RECOMPUTE_MODULES]
    if bad:
        raise RecipeError(f"--recompute-modules: unknown module(s) {bad}; known: {list(RECOMPUTE_MODULES)}")
    return gran, modules


def _full_recompute(model: ModelDims, layout: Layout, vp: int, pp: int, method: str | None,
                    n_rec: int | None) -> tuple[str, int]:
    """--recompute-method and --recompute-num-layers for full recomputation, checked against a pipeline chunk."""
    method = method or "uniform"
    if method not in ("uniform", "block"):
        raise RecipeError(f"--recompute-method: expected uniform or block, got {method!r}")
    n_rec = n_rec or 1
    per_chunk = min(layout.split.per_stage) // vp if layout.split else model.layers
    if method == "block" and n_rec > max(layout.split.per_stage) // vp:
        raise RecipeError(
            f"--recompute-num-layers ({n_rec}) exceeds the layers of a pipeline chunk "
            f"({max(layout.split.per_stage) // vp})"
        )
    if n_rec <= 0 or (method == "uniform" and n_rec > max(per_chunk, 1) * vp * pp):
        raise RecipeError(f"--recompute-num-layers ({n_rec}) is out of range")
    return method, n_rec


def _recompute(a: Mapping[str, ArgValue], model: ModelDims, layout: Layout, vp: int, pp: int) -> _Recompute:
    gran, modules = _recompute_granularity(a)
    method = _as_str(a, "--recompute-method")
    n_rec = _as_int(a, "--recompute-num-layers")
    if gran == "full":
        method, n_rec = _full_recompute(model, layout, vp, pp, method, n_rec)
    else:
        method = method or "uniform"
        n_rec = n_rec or 1
        if gran == "none" and _as_str(a, "--recompute-method") is not None:
            raise RecipeError("--recompute-method needs --recompute-granularity full")
    if gran == "full" and modules and _as_list(a, "--recompute-modules"):
        raise RecipeError("--recompute-modules is for --recompute-granularity selective")
    return _Recompute(gran, modules, method, n_rec)


@dataclass(frozen=True)
class _Moe:
    dispatcher: str
    flex_backend: str | None
    deepep_sms: int
    shared_expert_overlap: bool
    ep_comm_overlap: bool


def _flex_backend(a: Mapping[str, ArgValue], dispatcher: str, layout: Layout) -> str | None:
    backend = _as_str(a, "--moe-flex-dispatcher-backend")
    if dispatcher != "flex":
        return None
    backend = backend or "deepep"
    if backend not in ("deepep", "hybridep"):
        raise RecipeError(f"--moe-flex-dispatcher-backend: expected deepep or hybridep, got {backend!r}")
    if layout.tp > 1 and (layout.etp or 1) != 1:
        raise RecipeError("the flex dispatcher supports expert tensor parallelism 1 only")
    return backend


def _moe(a: Mapping[str, ArgValue], model: ModelDims, acc: Accelerator, layout: Layout, s: _Sizes, vp: int,
         gran: str) -> _Moe:
    """The MoE dispatcher and its companions."""
    dispatcher = _as_str(a, "--moe-token-dispatcher-type", "allgather" if model.is_moe else "none") or "none"
    if model.is_moe and dispatcher not in ("allgather", "alltoall", "flex"):
        raise RecipeError(f"--moe-token-dispatcher-type: expected allgather, alltoall or flex, got {dispatcher!r}")
    backend = _flex_backend(a, dispatcher, layout)
    sms = _as_int(a, "--moe-deepep-num-sms", 20) or 20
    if sms <= 0 or sms >= acc.sms or sms % 2:
        raise RecipeError(f"--moe-deepep-num-sms must be an even number below {acc.sms}, got {sms}")
    seo = _as_bool(a, "--moe-shared-expert-overlap")
    _first_refusal((
        (seo and not model.shared_expert_ffn, "--moe-shared-expert-overlap needs a shared expert"),
        (seo and dispatcher == "flex", "--moe-shared-expert-overlap is not supported with the flex dispatcher"),
    ))
    ep_overlap = _as_bool(a, "--overlap-moe-expert-parallel-comm")
    if ep_overlap:
        _first_refusal((
            (s.ep <= 1 or dispatcher not in ("alltoall", "flex"),
             "--overlap-moe-expert-parallel-comm needs EP > 1 and the alltoall or flex dispatcher"),
            (s.pp > 1 and vp <= 1, "--overlap-moe-expert-parallel-comm needs virtual pipeline stages when PP > 1"),
            (gran == "full", "--overlap-moe-expert-parallel-comm does not support full recomputation"),
            (seo, "--overlap-moe-expert-parallel-comm needs --moe-shared-expert-overlap off"),
        ))
    return _Moe(dispatcher, backend, sms, seo, ep_overlap)


@dataclass(frozen=True)
class _Optimizer:
    distributed: bool
    overlap_grad_reduce: bool
    overlap_param_gather: bool
    tp_comm_overlap: bool
    cpu_offload: bool
    offload_fraction: float


def _offload_fraction(a: Mapping[str, ArgValue], offload: bool, dist_opt: bool) -> float:
    fraction = _as_float(a, "--optimizer-offload-fraction", 1.0 if offload else 0.0) or 0.0
    if not offload:
        return 0.0
    if not dist_opt:
        raise RecipeError("--optimizer-cpu-offload needs --use-distributed-optimizer")
    if not _as_bool(a, "--use-precision-aware-optimizer"):
        raise RecipeError("--optimizer-cpu-offload needs --use-precision-aware-optimizer")
    if not 0.0 <= fraction <= 1.0:
        raise RecipeError("--optimizer-offload-fraction must be within [0, 1]")
    return fraction


def _optimizer(a: Mapping[str, ArgValue], sp: bool) -> _Optimizer:
    """The communication overlaps and the optimizer."""
    dist_opt = _as_bool(a, "--use-distributed-optimizer")
    ogr = _as_bool(a, "--overlap-grad-reduce")
    opg = _as_bool(a, "--overlap-param-gather")
    if opg and not (dist_opt and ogr):
        raise RecipeError("--overlap-param-gather needs --use-distributed-optimizer and --overlap-grad-reduce")
    tpo = _as_bool(a, "--tp-comm-overlap")
    if tpo and not sp:
        raise RecipeError("tensor-parallel communication overlap requires sequence parallelism (and TP > 1)")
    offload = _as_bool(a, "--optimizer-cpu-offload")
    fraction = _offload_fraction(a, offload, dist_opt)
    return _Optimizer(dist_opt, ogr, opg, tpo, offload, fraction)


def _profiling(a: Mapping[str, ArgValue], gpus: int) -> tuple[bool, tuple[int, int], tuple[int, ...]]:
    """Megatron's --profile with --use-pytorch-profiler: steps [start, end) as iterations, and the ranks."""
    profile = _as_bool(a, "--profile")
    start = _as_int(a, "--profile-step-start", 10) or 10
    end = _as_int(a, "--profile-step-end", 12) or 12
    if profile and not (0 <= start < end):
        raise RecipeError("--profile-step-start must be below --profile-step-end")
    ranks = _as_list(a, "--profile-ranks")
    prof_ranks = tuple(int(r) for r in ranks) if ranks else (0,)
    if any(r < 0 or r >= gpus for r in prof_ranks):
        raise RecipeError(f"--profile-ranks must be ranks of the job (0..{gpus - 1})")
    return profile, (start, end), prof_ranks


def build_recipe(
    model: ModelDims,
    acc: Accelerator,
    gpus: int,
    args: Mapping[str, ArgValue],
    env: Mapping[str, str] | None = None,
    gpus_per_node: int = GPUS_PER_NODE,
) -> SimRecipe:
    """Resolve a Megatron command line for `model` on `gpus` GPUs of `acc`. Raises RecipeError.

    The sections below run in a fixed order, and each raises at its first problem: a command line
    with several problems is always refused with the same one."""
    env = dict(env or {})
    a = dict(args)
    _check_architecture(model, a)
    s = _sizes(model, a)
    layout, vp = _layout(model, gpus, a, s)
    # precision
    fp8 = _as_str(a, "--fp8-format") is not None
    precision = "fp8" if fp8 else "bf16"
    fp8_params = fp8 and _as_bool(a, "--fp8-param-gather")
    # sequence parallelism: forced off at TP 1 (Megatron warns and turns it off)
    sp = _as_bool(a, "--sequence-parallel") and s.tp > 1
    if model.is_moe and s.tp > 1 and not sp:
        raise RecipeError("during training, sequence parallelism must be enabled when using MoE with tensor parallelism")
    rc = _recompute(a, model, layout, vp, s.pp)
    moe = _moe(a, model, acc, layout, s, vp, rc.granularity)
    opt = _optimizer(a, sp)
    grad_bf16 = _as_bool(a, "--grad-reduce-in-bf16")
    profile, profile_steps, prof_ranks = _profiling(a, gpus)
    lb_type = _as_str(a, "--moe-router-load-balancing-type", "aux_loss")
    aux_coeff = _as_float(a, "--moe-aux-loss-coeff", 0.0) or 0.0
    alloc = env.get("PYTORCH_CUDA_ALLOC_CONF", "")
    conns = env.get("CUDA_DEVICE_MAX_CONNECTIONS")
    return SimRecipe(
        model=model,
        acc=acc,
        gpus=gpus,
        gpus_per_node=gpus_per_node,
        layout=layout,
        seq=s.seq,
        gbs=s.gbs,
        mbs=s.mbs,
        train_iters=s.iters,
        precision=precision,
        fp8_params=fp8_params,
        sequence_parallel=sp,
        recompute=rc.granularity,
        recompute_modules=tuple(rc.modules) if rc.granularity == "selective" else (),
        recompute_method=rc.method,
        recompute_num_layers=rc.num_layers,
        dispatcher=moe.dispatcher,
        flex_backend=moe.flex_backend,
        deepep_sms=moe.deepep_sms,
        grouped_gemm=_as_bool(a, "--moe-grouped-gemm"),
        permute_fusion=_as_bool(a, "--moe-permute-fusion"),
        shared_expert_overlap=moe.shared_expert_overlap,
        ep_comm_overlap=moe.ep_comm_overlap,
        tp_comm_overlap=opt.tp_comm_overlap,
        overlap_grad_reduce=opt.overlap_grad_reduce,
        overlap_param_gather=opt.overlap_param_gather,
        overlap_p2p=_as_bool(a, "--overlap-p2p-communication", default=True),
        distributed_optimizer=opt.distributed,
        grad_bytes=2 if grad_bf16 else 4,
        cpu_offload=opt.cpu_offload,
        offload_fraction=opt.offload_fraction,
        offload_overlap=_as_bool(a, "--overlap-cpu-optimizer-d2h-h2d"),
        cross_entropy_fusion=_as_bool(a, "--cross-entropy-loss-fusion"),
        grad_accum_fusion=_as_bool(a, "--gradient-accumulation-fusion", default=True),
        router_fusion=_as_bool(a, "--moe-router-fusion"),
        cuda_graphs=(_as_str(a, "--cuda-graph-impl", "none") or "none") != "none",
        expandable_segments="expandable_segments:true" in alloc.replace(" ", "").lower(),
        max_connections=int(conns) if conns and conns.isdigit() else None,
        aux_loss=model.is_moe and lb_type != "none" and aux_coeff > 0,
        profile=profile,
        profile_steps=profile_steps,
        profile_ranks=prof_ranks,
        args=dict(a),
        env=env,
    )


# ------------------------------------------------------------------------------------ resolved arguments

_DERIVED_ORDER = (
    "world_size", "tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
    "data_parallel_size", "expert_model_parallel_size", "expert_tensor_parallel_size",
    "virtual_pipeline_model_parallel_size", "sequence_parallel",
)


def padded_vocab(r: SimRecipe) -> int:
    """Megatron's padded vocabulary: a multiple of --make-vocab-size-divisible-by (128) x TP."""
    raw = r.args.get("--make-vocab-size-divisible-by")
    div = int(raw) if raw not in (None, True, False) else 128
    m = max(div, 1) * r.tp
    return -(-r.model.vocab // m) * m


EXPLICIT_DESTS = {"--fp8-format": "fp8"}  # Megatron's add_argument(..., dest=...) where it differs


def flag_dest(flag: str) -> tuple[str, bool]:
    """(attribute name, stored value for a bare flag): `--no-x` stores False into x."""
    if flag in EXPLICIT_DESTS:
        return EXPLICIT_DESTS[flag], True
    name = flag[2:]
    if name.startswith("no-"):
        return name[3:].replace("-", "_"), False
    return name.replace("-", "_"), True


def resolved_arguments(r: SimRecipe) -> dict[str, Any]:
    """The arguments block a Megatron-LM run of this recipe prints (attribute -> value)."""
    m = r.model
    out: dict[str, Any] = {}
    for flag, value in r.args.items():
        if value is None or value is False:
            continue
        dest, bare = flag_dest(flag)
        out[dest] = bare if value is True else value
    # Megatron's defaults for what the simulator models, then what it derives or rewrites
    defaults = {
        "num_layers": m.layers, "hidden_size": m.hidden, "num_attention_heads": m.heads,
        "num_query_groups": m.groups, "kv_channels": m.kv_channels, "ffn_hidden_size": m.ffn or m.moe_ffn,
        "seq_length": r.seq, "max_position_embeddings": r.seq, "micro_batch_size": r.mbs,
        "global_batch_size": r.gbs, "train_iters": r.train_iters, "log_interval": 1,
        "use_distributed_optimizer": r.distributed_optimizer, "overlap_grad_reduce": r.overlap_grad_reduce,
        "overlap_param_gather": r.overlap_param_gather, "tp_comm_overlap": r.tp_comm_overlap,
        "gradient_accumulation_fusion": r.grad_accum_fusion, "cross_entropy_loss_fusion": r.cross_entropy_fusion,
        "recompute_granularity": None if r.recompute == "none" else r.recompute,
        "recompute_method": r.recompute_method if r.recompute == "full" else None,
        "recompute_num_layers": r.recompute_num_layers if r.recompute == "full" else None,
        "recompute_modules": list(r.recompute_modules) if r.recompute == "selective" else None,
        "optimizer_cpu_offload": r.cpu_offload, "optimizer_offload_fraction": r.offload_fraction,
        "bf16": True, "fp16": False, "lr": 1e-5, "seed": 1234,
        "decoder_first_pipeline_num_layers": None, "decoder_last_pipeline_num_layers": None,
    }
    if m.is_moe:
        defaults.update({
            "num_experts": m.experts, "moe_ffn_hidden_size": m.moe_ffn, "moe_router_topk": m.topk,
            "moe_token_dispatcher_type": r.dispatcher, "moe_grouped_gemm": r.grouped_gemm,
            "moe_permute_fusion": r.permute_fusion, "moe_shared_expert_overlap": r.shared_expert_overlap,
            "overlap_moe_expert_parallel_comm": r.ep_comm_overlap, "moe_router_fusion": r.router_fusion,
            "moe_flex_dispatcher_backend": r.flex_backend,
        })
    for k, v in defaults.items():
        out.setdefault(k, v)
    out.update({
        "world_size": r.gpus,
        "tensor_model_parallel_size": r.tp,
        "pipeline_model_parallel_size": r.pp,
        "context_parallel_size": r.cp,
        "data_parallel_size": r.dp,
        "expert_model_parallel_size": r.ep,
        "expert_tensor_parallel_size": r.etp,
        "virtual_pipeline_model_parallel_size": r.vp if r.vp > 1 else None,
        "sequence_parallel": r.sequence_parallel,
        "padded_vocab_size": padded_vocab(r),
        "params_dtype": "torch.bfloat16",
        "accumulate_allreduce_grads_in_fp32": r.grad_bytes == 4,
        "transformer_pipeline_model_parallel_size": r.pp,
    })
    if r.recompute == "selective":
        out["recompute_granularity"] = "selective"
    first = {k: out[k] for k in _DERIVED_ORDER}
    rest = {k: out[k] for k in sorted(out) if k not in first}
    return {**first, **rest}
