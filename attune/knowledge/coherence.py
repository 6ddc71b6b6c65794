"""Coherent recipes: the flags that must follow a lever when it moves, written once for every tuner.

A candidate is a whole recipe, not one flag: when a tuner moves a lever, the flags Megatron ties to it
must follow, or the launch is spent on a job the framework rejects or that hangs. The rules below are
read from the framework's own argument checks (`/work/shared/reference/megatron.md`, "Constraints read
from the source", and Megatron-LM's `arguments.py` validation):

- recomputation: full granularity needs `--recompute-method` and `--recompute-num-layers` and refuses
  `--recompute-modules` (selective recomputation's list); selective takes neither method nor layer
  count; no recomputation takes none of the three. `--recompute-activations` is selective recomputation's
  older spelling and goes with any explicit granularity. The block method's layer count cannot exceed
  the layers of one pipeline chunk.
- tensor parallelism: sequence parallelism is forced off at TP 1; `--tp-comm-overlap` needs sequence
  parallelism. When TP moves from 1 to more, sequence parallelism comes on (the launcher's co-change).
- pipeline depth: the layers divide across pipeline and virtual stages; the first/last-stage layer
  counts and the embedding/loss accounting describe one split; a split that no longer fits the new depth
  is replaced by one that does (even, else accounted, else the most balanced uneven split), and the
  virtual stages drop to the largest count that still divides the layers; PP 1 takes no virtual stages
  and no split flags; the interleaved schedule needs PP > 2 unless p2p overlap is on.
- expert parallelism: EP communication overlap needs EP > 1, an alltoall or flex dispatcher, virtual
  stages when PP > 1, no full recomputation, and shared-expert overlap off. The flex dispatcher needs a
  backend (DeepEP by default); other dispatchers take none, and DeepEP refuses shared-expert overlap.
- optimizer: `--overlap-param-gather` needs the distributed optimizer and `--overlap-grad-reduce`; CPU
  offload of the optimizer needs the distributed optimizer, and its copy overlap goes with it.

`cohere(args, before=...)` applies them to a recipe's full flags (absent flag: missing, None or False)
and returns the coherent flags; `problems(args)` lists what is incoherent (what a launch would be
refused for), so a caller can check a candidate before a launch is spent. Plain dicts only: this
module knows flags, not tuners.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from attune.knowledge.layouts import LayoutError, pipeline_split

TP = "--tensor-model-parallel-size"
PP = "--pipeline-model-parallel-size"
VP = "--num-virtual-stages-per-pipeline-rank"
VP_LAYERS = "--num-layers-per-virtual-pipeline-stage"
EP = "--expert-model-parallel-size"
SP = "--sequence-parallel"
TP_OVERLAP = "--tp-comm-overlap"
GRAN, METHOD, NUM, MODULES, ACTIVATIONS = ("--recompute-granularity", "--recompute-method",
                                           "--recompute-num-layers", "--recompute-modules",
                                           "--recompute-activations")
FIRST, LAST = "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers"
ACCOUNT = ("--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split")
DISPATCHER, FLEX_BACKEND = "--moe-token-dispatcher-type", "--moe-flex-dispatcher-backend"
SHARED_OVERLAP, EP_OVERLAP = "--moe-shared-expert-overlap", "--overlap-moe-expert-parallel-comm"
P2P_OVERLAP = "--overlap-p2p-communication"
DIST_OPT, GRAD_OVERLAP, PARAM_GATHER = ("--use-distributed-optimizer", "--overlap-grad-reduce",
                                        "--overlap-param-gather")
OFFLOAD, OFFLOAD_OVERLAP, OFFLOAD_FRACTION = ("--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d",
                                              "--optimizer-offload-fraction")
# Every flag a rule here may set or drop: a tuner that carries these along lets its moves stay coherent.
COUPLED_FLAGS = (TP, PP, VP, VP_LAYERS, EP, SP, TP_OVERLAP, GRAN, METHOD, NUM, MODULES, ACTIVATIONS, FIRST, LAST,
                 *ACCOUNT, DISPATCHER, FLEX_BACKEND, SHARED_OVERLAP, EP_OVERLAP, DIST_OPT, GRAD_OVERLAP,
                 PARAM_GATHER, OFFLOAD, OFFLOAD_OVERLAP, OFFLOAD_FRACTION)
# The flags that only follow a lever (never a lever of their own when a rule here forces them).
FOLLOWER_FLAGS = frozenset({SP, TP_OVERLAP, METHOD, NUM, MODULES, ACTIVATIONS, FIRST, LAST, *ACCOUNT, VP_LAYERS,
                            FLEX_BACKEND, SHARED_OVERLAP, EP_OVERLAP, PARAM_GATHER, OFFLOAD_OVERLAP})

Args = dict[str, Any]


def _on(args: Mapping[str, Any], flag: str) -> bool:
    return args.get(flag) not in (None, False)


def _int(args: Mapping[str, Any], flag: str, default: int = 1) -> int:
    v = args.get(flag)
    if v in (None, False, True):
        return default
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


def _drop(out: Args, *flags: str) -> None:
    for f in flags:
        if f in out:
            out[f] = None


def _recompute(out: Args, layers: int | None) -> None:
    gran = out.get(GRAN)
    if gran in (None, False, "none"):
        if gran == "none":
            out[GRAN] = None
        if not _on(out, ACTIVATIONS):
            _drop(out, METHOD, NUM, MODULES)
        else:
            _drop(out, METHOD, NUM)
        return
    _drop(out, ACTIVATIONS)
    if gran == "full":
        _drop(out, MODULES)
        if not _on(out, METHOD):
            out[METHOD] = "uniform"
        if not _on(out, NUM):
            out[NUM] = 1
        if out.get(METHOD) == "block" and layers:
            chunk = max(1, layers // max(1, _int(out, PP) * _int(out, VP)))
            out[NUM] = min(_int(out, NUM), chunk)
    else:
        _drop(out, METHOD, NUM)


def _tensor(out: Args, before: Mapping[str, Any] | None) -> None:
    tp = _int(out, TP)
    if tp <= 1:
        _drop(out, SP, TP_OVERLAP)
        return
    if before is not None and _int(before, TP) <= 1 and not _on(out, SP):
        out[SP] = True  # the launcher's co-change: TP > 1 runs with sequence parallelism
    if not _on(out, SP):
        _drop(out, TP_OVERLAP)


def _split_fits(out: Args, layers: int, pp: int, vp: int) -> bool:
    first, last = out.get(FIRST), out.get(LAST)
    first = int(first) if first not in (None, False, True) else None
    last = int(last) if last not in (None, False, True) else None
    accounted = _on(out, ACCOUNT[0])
    try:
        if pp < 2 and (first is not None or last is not None or accounted):
            return False
        return pipeline_split(layers, pp, vp, first=first, last=last, account_embedding_loss=accounted) is not None
    except LayoutError:
        return False


def _set_split(out: Args, layers: int, pp: int, vp: int) -> bool:
    """Replace the split flags with a split of `layers` over PP x VP; False when there is none."""
    split = pipeline_split(layers, pp, vp) if pp >= 1 else None
    if split is None:
        return False
    _drop(out, FIRST, LAST, *ACCOUNT)
    if split.kind == "accounted":
        for f in ACCOUNT:
            out[f] = True
    elif split.kind == "uneven":
        out[FIRST], out[LAST] = split.first, split.last
    return True


def _pipeline(out: Args, layers: int | None) -> None:
    pp = _int(out, PP)
    if pp <= 1:
        _drop(out, VP, VP_LAYERS, FIRST, LAST, *ACCOUNT, P2P_OVERLAP)
        return
    vp = _int(out, VP)
    if vp > 1 and pp <= 2 and not _on(out, P2P_OVERLAP):
        vp = 1
    if layers is None:
        if vp <= 1:
            _drop(out, VP)
        return
    # Keep the recipe's split and virtual stages where they still fit; else the most virtual stages
    # (up to the recipe's) that divide the layers, with the split that goes with them.
    for v in range(max(vp, 1), 0, -1):
        if _split_fits(out, layers, pp, v) or _set_split(out, layers, pp, v):
            vp = v
            break
    else:
        vp = 1
    if vp > 1:
        out[VP] = vp
        _drop(out, VP_LAYERS)
    else:
        _drop(out, VP, VP_LAYERS)


def _experts(out: Args) -> None:
    dispatcher = out.get(DISPATCHER)
    if dispatcher == "flex":
        if not _on(out, FLEX_BACKEND):
            out[FLEX_BACKEND] = "deepep"
        if out.get(FLEX_BACKEND) == "deepep":
            _drop(out, SHARED_OVERLAP)
    else:
        _drop(out, FLEX_BACKEND)
    if _on(out, EP_OVERLAP):
        ok = (_int(out, EP) > 1 and dispatcher in ("alltoall", "flex") and out.get(GRAN) != "full"
              and (_int(out, PP) <= 1 or _int(out, VP) > 1))
        if ok:
            _drop(out, SHARED_OVERLAP)
        else:
            _drop(out, EP_OVERLAP)


def _optimizer(out: Args) -> None:
    if not _on(out, DIST_OPT):
        _drop(out, PARAM_GATHER, OFFLOAD)
    if not _on(out, GRAD_OVERLAP):
        _drop(out, PARAM_GATHER)
    if not _on(out, OFFLOAD):
        _drop(out, OFFLOAD_OVERLAP)  # the fraction is read only with offload on: it may stay


def cohere(args: Mapping[str, Any], *, layers: int | None = None, before: Mapping[str, Any] | None = None) -> Args:
    """The recipe's full flags made coherent (module doc). `layers`: the model's transformer layers (the
    pipeline rules need it); `before`: the recipe the move started from (for the co-changes that only a
    move implies, such as sequence parallelism when TP leaves 1). A dropped flag is set to None, so that
    the result, diffed against a baseline, removes it."""
    out: Args = dict(args)
    if layers is None and _int(out, "--num-layers", 0) > 0:
        layers = _int(out, "--num-layers")
    _pipeline(out, layers)
    _recompute(out, layers)
    _tensor(out, before)
    _experts(out)
    _optimizer(out)
    return out


def problems(args: Mapping[str, Any], *, layers: int | None = None) -> list[str]:
    """Which flags of the recipe break a rule here (empty: coherent). Each item names the flag."""
    fixed = cohere(args, layers=layers)
    out: list[str] = []
    for flag in sorted(set(args) | set(fixed)):
        a, b = args.get(flag), fixed.get(flag)
        if (a in (None, False)) != (b in (None, False)) or (b not in (None, False) and str(a) != str(b)):
            out.append(f"{flag}: {a!r} is incoherent with the recipe (expected {b!r})")
    return out
