"""Build a built-in tuner for a campaign: its search space, the baseline's values, the skill's catalog.

The search space is the campaign's `search_space` (flag or environment variable -> values; `null`
means "flag absent"). The heuristic tuner takes its lever order and hypotheses from the skill's
lever catalog (`skills/attune/catalog/levers.yaml`): larger typical effects first, each lever's
mechanism and when it helps as the hypothesis. `tpe-prefilter` puts the skill's memory estimate in
front of TPE where the model's shapes and the accelerator's memory are known.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from attune.control.spec import CampaignSpec
from attune.core.errors import TunerError
from attune.core.recipe import DEGREE_FLAGS, Recipe, as_int
from attune.knowledge.coherence import COUPLED_FLAGS, cohere
from attune.tuners.base import ArgValue, Tuner
from attune.tuners.coherent import model_layers
from attune.tuners.heuristic import HeuristicTuner
from attune.tuners.knobs import KNOB_PRIORITY, KnobSpace
from attune.tuners.prefilter import memory_prefilter
from attune.tuners.random_search import RandomTuner
from attune.tuners.registry import REGISTRY, TUNE_CHOICES
from attune.tuners.tpe import TPETuner

SIZE_ORDER = {"large": 0, "medium": 1, "varies": 2, "small": 3, "negligible": 4}


class TunerSetupError(TunerError, ValueError):
    """The campaign cannot be searched by a built-in tuner (no or a bad search space)."""


def space_and_baseline(spec: CampaignSpec) -> tuple[dict[str, list[ArgValue]], dict[str, ArgValue]]:
    """The declared space with environment values as strings, and the baseline's value of each key."""
    if not spec.search_space:
        raise TunerSetupError(
            "search_space: the campaign declares no search space; the built-in tuners need one "
            "(flag or variable -> values), e.g. {\"--micro-batch-size\": [1, 2, 4]}")
    space: dict[str, list[ArgValue]] = {}
    baseline: dict[str, ArgValue] = {}
    for key, values in spec.search_space.items():
        is_flag = key.startswith("--")
        vals: list[ArgValue] = [v if is_flag or v is None else str(v) for v in values]
        if not vals:
            raise TunerSetupError(f"search_space.{key}: expected at least one value")
        base = spec.baseline.args.get(key) if is_flag else spec.baseline.env.get(key)
        if base is False:
            base = None
        # The baseline's value in the space's own spelling (4 and "4" are the same on a command line).
        same = [v for v in vals if v is not None and base is not None and str(v) == str(base)]
        baseline[key] = same[0] if same else base
        space[key] = vals
    return space, baseline


def _catalog_levers(spec: CampaignSpec, keys: list[str]) -> dict[str, Any] | None:
    """The catalog's lever for each of the space's keys (None: no catalog)."""
    try:
        from attune.knowledge.catalog import load_catalog

        catalog = load_catalog()
    except Exception:  # the tuner still runs without the catalog, in the campaign's order
        return None
    framework = "tinygpt" if spec.model.startswith("tinygpt") else "megatron"
    found: dict[str, Any] = {}
    for key in keys:
        matches = [lv for lv in catalog.levers if any(f.name == key for f in lv.flags)]
        matches.sort(key=lambda lv: 0 if framework in lv.frameworks else 1)
        if matches:
            found[key] = matches[0]
    return found


def catalog_attacks(spec: CampaignSpec, keys: list[str]) -> dict[str, list[str]]:
    """The exposed costs each of the space's keys attacks (the catalog's `attacks`), for diagnosis first."""
    found = _catalog_levers(spec, keys) or {}
    return {k: list(lv.attacks) for k, lv in found.items() if lv.attacks}


# Levers the catalog sizes "large" reshape the whole step (layout degrees): one exposed cost does not predict
# what they do, so a diagnosis leaves them in the catalog's order.
DIAGNOSIS_FIXED_SIZES = frozenset({"large"})


def catalog_gain_class(spec: CampaignSpec, keys: list[str]) -> dict[str, int]:
    """The expected-gain class of each of the space's keys that a diagnosis may reorder (the rank of its
    catalog lever's `rough_size`, as `catalog_guidance` orders them): a diagnosis reorders levers only
    inside one class. Keys of a "large" lever, and keys outside the catalog, are left out: they keep
    their place."""
    found = _catalog_levers(spec, keys) or {}
    return {k: SIZE_ORDER.get(found[k].rough_size.size, 5) for k in keys
            if k in found and found[k].rough_size.size not in DIAGNOSIS_FIXED_SIZES}


def catalog_guidance(spec: CampaignSpec, keys: list[str]) -> tuple[list[str], dict[str, str]]:
    """Lever order (larger typical effect first) and hypotheses for the space's keys, from the catalog."""
    found = _catalog_levers(spec, keys)
    if found is None:
        return list(keys), {}
    order = sorted(keys, key=lambda k: (SIZE_ORDER.get(found[k].rough_size.size, 5) if k in found else 6,
                                        keys.index(k)))
    hypotheses = {}
    for key, lv in found.items():
        helps = lv.helps_when[0] if lv.helps_when else ""
        hypotheses[key] = f"{lv.id}: {' '.join(lv.mechanism.split())} Helps when {helps}"
    return order, hypotheses


# The degrees the layout coupler moves (ETP and VP stay as the recipe has them).
COUPLED_DEGREE_FLAGS = {d: DEGREE_FLAGS[d] for d in ("tp", "pp", "cp", "ep")}
SPLIT_FLAGS = ("--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
               "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split")
RECOMPUTE_FLAGS = ("--recompute-method", "--recompute-num-layers", "--recompute-modules")


def _split_fits(layers: int, pp: int, args: dict[str, ArgValue]) -> bool:
    """Whether the recipe's pipeline-split flags still split the layers over `pp` stages."""
    from attune.knowledge.layouts import LayoutError, pipeline_split

    def num(flag: str) -> int | None:
        v = args.get(flag)
        return int(v) if v not in (None, False, True) else None

    first, last = num(SPLIT_FLAGS[0]), num(SPLIT_FLAGS[1])
    accounted = args.get(SPLIT_FLAGS[2]) not in (None, False)
    try:
        if pp < 2 and (first is not None or last is not None):
            return False
        return pipeline_split(layers, pp, first=first, last=last, account_embedding_loss=accounted) is not None
    except LayoutError:
        return False


def _degrees_of(lay: Any) -> dict[str, int]:
    return {"tp": lay.tp, "pp": lay.pp, "cp": lay.cp, "ep": lay.ep or 1}


def _nearest_layout(reports: list[Any], dim: str, want: int, cur: dict[str, int]) -> Any | None:
    """The feasible layout with `dim` at `want` that moves the fewest other degrees, then the least (log2)."""
    import math as _math

    best: tuple[tuple[int, float], Any] | None = None
    for rep in reports:
        lay = rep.layout
        got = _degrees_of(lay)
        if got[dim] != want:
            continue
        others = [d for d in got if d != dim and got[d] != cur[d]]
        dist = sum(abs(_math.log2(got[d] / cur[d])) for d in others)
        score = (len(others), dist)
        if best is None or score < best[0]:
            best = (score, lay)
    return None if best is None else best[1]


def _apply_layout(full: dict[str, ArgValue], lay: Any, cur: dict[str, int], lever: str, model: Any
                  ) -> dict[str, ArgValue]:
    """The recipe's flags moved to `lay`: the degrees that change (and the lever's), the pipeline split
    replaced by the layout's when the recipe's no longer fits."""
    out = dict(full)
    got = _degrees_of(lay)
    for d, f in COUPLED_DEGREE_FLAGS.items():
        if (got[d] != cur[d] or f == lever) and not (f == COUPLED_DEGREE_FLAGS["ep"] and not model.is_moe):
            out[f] = got[d]
    if lay.split is not None and not _split_fits(model.layers, lay.pp, out):
        for f in SPLIT_FLAGS:
            out[f] = None
        for text in lay.split.flags():
            name, _, val = text.partition("=")
            out[name] = int(val) if val else True
    return out


def layout_coupler(spec: CampaignSpec) -> Callable[[dict[str, ArgValue], str, ArgValue], dict[str, ArgValue] | None] | None:
    """Rule 2's coupled sets for parallel degrees: moving one degree moves the ones it forces.

    Given a recipe's flags and one degree's new value, the nearest feasible layout (per the layout
    enumerator) with that value: the fewest other degrees changed, then the smallest change, and the
    pipeline split recomputed when PP moves. None: no feasible layout has that value. Only where the
    enumerator knows the model (else no coupler, and degrees move alone)."""
    from attune.knowledge.layouts import LayoutError, LayoutOptions, enumerate_layouts, find_model

    try:
        model = find_model(spec.model)
    except (LayoutError, KeyError, ValueError):
        return None
    if not any(f in (spec.search_space or {}) for f in COUPLED_DEGREE_FLAGS.values()):
        return None
    cache: dict[tuple[int, int], list[Any]] = {}

    def deg(args: dict[str, ArgValue], flag: str) -> int:
        return as_int(args.get(flag, spec.baseline.args.get(flag)), 1)

    def layouts(etp: int, mbs: int) -> list[Any]:
        key = (etp, mbs)
        if key not in cache:
            try:
                cache[key] = enumerate_layouts(model, LayoutOptions(
                    gpus=spec.cluster.gpus, gpus_per_node=spec.cluster.gpus_per_node,
                    seq_length=spec.workload.seq_length, global_batch=spec.workload.global_batch,
                    micro_batch=mbs, allowed={"vp": {1}, "etp": {etp}} if model.is_moe else {"vp": {1}}))
            except LayoutError:
                cache[key] = []
        return cache[key]

    def couple(full: dict[str, ArgValue], lever: str, value: ArgValue) -> dict[str, ArgValue] | None:
        dim = next((d for d, f in COUPLED_DEGREE_FLAGS.items() if f == lever), None)
        if dim is None:
            return full
        cur = {d: deg(full, f) for d, f in COUPLED_DEGREE_FLAGS.items()}
        reports = layouts(deg(full, "--expert-tensor-parallel-size"), deg(full, "--micro-batch-size"))
        want = as_int(value, 1)
        lay = _nearest_layout(reports, dim, want, cur)
        return None if lay is None else _apply_layout(full, lay, cur, lever, model)

    return couple


def _base(spec: CampaignSpec, knobs: KnobSpace | None) -> Recipe | None:
    """The recipe a tuner's candidates change: the campaign's baseline (over a knob space: the knobs')."""
    return None if knobs is not None else Recipe(dict(spec.baseline.args), dict(spec.baseline.env))


def _heuristic(spec: CampaignSpec, seed: int, max_passes: int, knobs: KnobSpace | None) -> Tuner:
    if knobs is not None:
        return HeuristicTuner(knobs.space, knobs.baseline(), seed=seed, priority=list(KNOB_PRIORITY),
                              max_passes=max_passes, memory_retry=False)
    space, baseline = space_and_baseline(spec)
    order, hypotheses = catalog_guidance(spec, list(space))
    couple = layout_coupler(spec)
    extra = {}
    for f in (*SPLIT_FLAGS, *RECOMPUTE_FLAGS, "--recompute-granularity", *COUPLED_DEGREE_FLAGS.values(), *COUPLED_FLAGS):
        if f not in space:
            v = spec.baseline.args.get(f)
            extra[f] = None if v is False else v
    layers = model_layers(spec)

    def coherent(full: dict[str, ArgValue], before: dict[str, ArgValue]) -> dict[str, ArgValue]:
        return cohere(full, layers=layers, before=before)

    return HeuristicTuner(space, baseline, seed=seed, priority=order, hypotheses=hypotheses,
                          max_passes=max_passes, couple=couple, extra_baseline=extra,
                          memory_retry=spec.framework == "megatron-lm" or "--recompute-granularity" in space,
                          base=_base(spec, knobs), cohere=coherent if spec.framework == "megatron-lm" else None,
                          fits=memory_fit(spec), peak=memory_peak(spec), attacks=catalog_attacks(spec, list(space)),
                          gain_class=catalog_gain_class(spec, list(space)), node_gpus=spec.cluster.gpus_per_node)


def _memory_estimate(spec: CampaignSpec) -> Callable[[dict[str, ArgValue]], Any] | None:
    """The skill's memory estimate of a recipe's full flags (the campaign's baseline under them), or None
    where the campaign has no estimate."""
    from attune.tuners.prefilter import recipe_memory

    if memory_prefilter(spec)[0] is None:
        return None

    def estimate(full: dict[str, ArgValue]) -> Any:
        flags = {k: v for k, v in full.items() if k.startswith("--")}
        args = {k: v for k, v in {**spec.baseline.args, **flags}.items() if v not in (None, False)}
        return recipe_memory(spec, args)[0]

    return estimate


def memory_fit(spec: CampaignSpec) -> Callable[[dict[str, ArgValue]], bool | None] | None:
    """The skill's memory estimate as an ordering hint: a recipe's full flags -> fits (None: no estimate)."""
    estimate = _memory_estimate(spec)
    if estimate is None:
        return None

    def fits(full: dict[str, ArgValue]) -> bool | None:
        est = estimate(full)
        return None if est is None else est.fits

    return fits


def memory_peak(spec: CampaignSpec) -> Callable[[dict[str, ArgValue]], float | None] | None:
    """The skill's memory estimate's peak bytes per GPU of a recipe's full flags (None: no estimate): the
    heuristic compares it with the peaks of recipes measured to run and to run out of memory."""
    estimate = _memory_estimate(spec)
    if estimate is None:
        return None

    def peak(full: dict[str, ArgValue]) -> float | None:
        est = estimate(full)
        return None if est is None or not est.stages else float(est.peak.with_margin_bytes)

    return peak


def _space(spec: CampaignSpec, knobs: KnobSpace | None) -> tuple[dict[str, list[ArgValue]], dict[str, ArgValue]]:
    return (knobs.space, knobs.baseline()) if knobs is not None else space_and_baseline(spec)


def _tpe(spec: CampaignSpec, seed: int, max_passes: int, knobs: KnobSpace | None) -> Tuner:
    return TPETuner(*_space(spec, knobs), seed=seed, base=_base(spec, knobs))


def _tpe_prefilter(spec: CampaignSpec, seed: int, max_passes: int, knobs: KnobSpace | None) -> Tuner:
    prefilter = knobs.prefilter() if knobs is not None else memory_prefilter(spec)[0]
    tuner = TPETuner(*_space(spec, knobs), seed=seed, prefilter=prefilter, base=_base(spec, knobs))
    tuner.name = "tpe-prefilter"
    return tuner


def _random(spec: CampaignSpec, seed: int, max_passes: int, knobs: KnobSpace | None) -> Tuner:
    return RandomTuner(*_space(spec, knobs), seed=seed, base=_base(spec, knobs))


_BUILDERS: dict[str, Callable[[CampaignSpec, int, int, KnobSpace | None], Tuner]] = {
    "heuristic": _heuristic, "tpe": _tpe, "tpe-prefilter": _tpe_prefilter, "random": _random}
assert set(_BUILDERS) == set(REGISTRY), "every registered tuner has a builder here"


def make_tuner(spec: CampaignSpec, name: str, seed: int = 0, max_passes: int = 3,
               knobs: KnobSpace | None = None) -> Tuner:
    """The built-in tuner `name` (attune.tuners.registry) for the campaign: over its `search_space`, or
    over a frozen knob space (`attune.tuners.knobs`, Table E1) when `knobs` is given."""
    if name not in REGISTRY:
        raise TunerSetupError(f"--tuner: expected one of {', '.join(TUNE_CHOICES)}; got {name!r}")
    return _BUILDERS[name](spec, seed, max_passes, knobs)
