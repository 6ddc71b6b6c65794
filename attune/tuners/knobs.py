"""Frozen knob spaces for the tuner comparison (the paper's Table E1), on the tuner's side of the plane.

The paper's black-box tuners searched a frozen space of knobs per model (Appendix E, Table E1): the
parallel degrees, the pipeline split, virtual stages, micro batch, recomputation presets, the MoE
dispatcher and (MiniMax-M2) optimizer offload. Some knobs are composite: `split` (balanced, or a light
first and/or last stage), `dispatcher` (alltoall, or DeepEP through the flex dispatcher), `offload`, and
the recomputation presets of `--recompute-granularity`; `KnobSpace.to_args` turns a draw into the
recipe's flags with the co-changes the paper's launcher applied (sequence parallelism with TP, the
dispatcher's companion flags, the data-parallel overlaps off where they hang with expert data
parallelism on GLM-4.5). A draw that breaks a constraint read from the framework (the layout rules of
`attune.knowledge.layouts`, the split, the dispatcher's reach) raises `Infeasible`.

`KnobPlane` puts that translation in front of any `ControlPlane` (`attune.tuners.driver`): it hands the
control plane the draw's flag changes relative to the baseline, and answers an infeasible draw as
refused, scored zero, without a launch. Everything else (admission, the gate, the identical-recipe
rule, charging, the early abort, promotion, shipping) is the production control plane's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from attune.control.spec import CampaignSpec
from attune.core.errors import TunerError
from attune.core.recipe import DEGREE_FLAGS, ParallelDims, Recipe
from attune.knowledge.layouts import LayoutError, find_model, pipeline_split
from attune.tuners.base import ArgValue, Candidate, Outcome, PlaneWrapper
from attune.tuners.prefilter import recipe_layout, recipe_memory

# The memory pre-filter's margins (Appendix E): the largest that admit every bring-up layout that fit.
PREFILTER_MARGIN = {"glm-4.5": 0.058, "minimax-m2": 0.117}

RECOMPUTE = {
    None: {},
    "selective": {"--recompute-granularity": "selective"},  # Megatron's default modules: core_attn
    "selective:layernorm": {"--recompute-granularity": "selective", "--recompute-modules": "layernorm"},
    "selective:moe_act": {"--recompute-granularity": "selective", "--recompute-modules": "moe_act"},
    "selective:moe": {"--recompute-granularity": "selective", "--recompute-modules": "moe"},
    "full": {"--recompute-granularity": "full", "--recompute-method": "uniform", "--recompute-num-layers": 1},
    "full:2": {"--recompute-granularity": "full", "--recompute-method": "uniform", "--recompute-num-layers": 2},
}
_RECOMPUTE_FLAGS = ("--recompute-granularity", "--recompute-method", "--recompute-num-layers", "--recompute-modules",
                    "--recompute-activations")
SPLITS = ("balanced", "light_first", "light_last", "light_both")
# Table E1, per model: knob -> values. Flags keep their names; `split`, `dispatcher` and `offload` are
# composite knobs the launcher turns into flags.
SPACES: dict[str, dict[str, list[ArgValue]]] = {
    "glm-4.5": {
        "--tensor-model-parallel-size": [1, 2, 4, 8],
        "--pipeline-model-parallel-size": [1, 2, 4, 8, 16],
        "--expert-model-parallel-size": [1, 2, 4, 8, 16, 32],
        "--expert-tensor-parallel-size": [1, 2, 4, 8],
        "--num-virtual-stages-per-pipeline-rank": [1, 2, 4, 23],
        "split": list(SPLITS),
        "--context-parallel-size": [1, 2, 4],
        "--micro-batch-size": [1],
        "--recompute-granularity": list(RECOMPUTE),
        "dispatcher": ["alltoall", "deepep"],
    },
    "minimax-m2": {
        "--tensor-model-parallel-size": [1, 2, 4, 8],
        "--pipeline-model-parallel-size": [1, 2, 4, 8, 16],
        "--expert-model-parallel-size": [1, 2, 4, 8, 16, 32, 64],
        "--expert-tensor-parallel-size": [1, 2, 4, 8],
        "--num-virtual-stages-per-pipeline-rank": [1, 2, 31],
        "split": list(SPLITS),
        "--context-parallel-size": [1, 2, 4, 8],
        "--micro-batch-size": [1, 2, 4, 32],
        "--recompute-granularity": list(RECOMPUTE),
        "dispatcher": ["alltoall", "deepep"],
        "offload": ["on", "off"],
    },
}
# The heuristic tuner's lever order over the knobs: the catalog's expected-gain order for these levers.
KNOB_PRIORITY = ("dispatcher", "--expert-model-parallel-size", "offload", "--tensor-model-parallel-size",
            "--pipeline-model-parallel-size", "--recompute-granularity", "--micro-batch-size",
            "--num-virtual-stages-per-pipeline-rank", "--context-parallel-size", "split",
            "--expert-tensor-parallel-size")


class Infeasible(TunerError, ValueError):
    """A draw that violates a constraint read from the framework: scored zero, never launched."""


def _split_flags(layers: int, pp: int, vp: int, kind: str) -> dict[str, ArgValue]:
    """Flags for a pipeline split of `kind`; raises Infeasible where none exists."""
    none = {"--decoder-first-pipeline-num-layers": None, "--decoder-last-pipeline-num-layers": None,
            "--account-for-embedding-in-pipeline-split": None, "--account-for-loss-in-pipeline-split": None}
    if kind == "balanced":
        split = pipeline_split(layers, pp, vp)
        if split is None:
            raise Infeasible(f"{layers} layers cannot be split over PP {pp} x VP {vp}")
        if split.kind == "accounted":
            return {**none, "--account-for-embedding-in-pipeline-split": True, "--account-for-loss-in-pipeline-split": True}
        if split.kind == "uneven":
            return {**none, "--decoder-first-pipeline-num-layers": split.first,
                    "--decoder-last-pipeline-num-layers": split.last}
        return none
    if pp < 2 or (kind == "light_both" and pp < 3):
        raise Infeasible(f"a {kind} split needs more pipeline stages than {pp}")
    ends = 2 if kind == "light_both" else 1
    inner = pp - ends
    for m in range(-(-layers // pp), layers + 1):
        rest = layers - inner * m
        if rest <= 0:
            break
        if rest % ends:
            continue
        f = rest // ends
        if 1 <= f < m and f % vp == 0 and m % vp == 0:
            first = f if kind in ("light_first", "light_both") else None
            last = f if kind in ("light_last", "light_both") else None
            return {**none, "--decoder-first-pipeline-num-layers": first, "--decoder-last-pipeline-num-layers": last}
    raise Infeasible(f"no {kind} split of {layers} layers over PP {pp} x VP {vp}")


@dataclass
class KnobSpace:
    """A model's frozen search space and the launcher that turns knob values into flag changes."""

    model: str
    space: dict[str, list[ArgValue]]
    baseline_args: dict[str, ArgValue]
    layers: int
    gpus: int
    gpus_per_node: int
    spec: CampaignSpec

    def baseline(self) -> dict[str, ArgValue]:
        a = self.baseline_args
        rec: str | None = None
        gran = a.get("--recompute-granularity")
        if gran == "selective":
            mods = str(a.get("--recompute-modules") or "core_attn")
            rec = "selective" if mods == "core_attn" else f"selective:{mods}"
        elif gran == "full":
            rec = "full" if int(a.get("--recompute-num-layers") or 1) == 1 else "full:2"
        out: dict[str, ArgValue] = {
            "--tensor-model-parallel-size": int(a.get("--tensor-model-parallel-size") or 1),
            "--pipeline-model-parallel-size": int(a.get("--pipeline-model-parallel-size") or 1),
            "--expert-model-parallel-size": int(a.get("--expert-model-parallel-size") or 1),
            "--expert-tensor-parallel-size": int(a.get("--expert-tensor-parallel-size") or 1),
            "--num-virtual-stages-per-pipeline-rank": int(a.get("--num-virtual-stages-per-pipeline-rank") or 1),
            "split": "balanced",
            "--context-parallel-size": int(a.get("--context-parallel-size") or 1),
            "--micro-batch-size": int(a.get("--micro-batch-size") or 1),
            "--recompute-granularity": rec,
            "dispatcher": "deepep" if a.get("--moe-token-dispatcher-type") == "flex" else "alltoall",
            "offload": "on" if a.get("--optimizer-cpu-offload") else "off",
        }
        return {k: v for k, v in out.items() if k in self.space}

    def to_args(self, full: Mapping[str, ArgValue]) -> dict[str, ArgValue]:
        """The candidate's full arguments for knob values `full` (missing knobs: the baseline's)."""
        base = self.baseline()
        knobs = {**base, **{k: v for k, v in full.items() if k in self.space}}
        edits: dict[str, ArgValue] = {}
        dims = ParallelDims.from_args(knobs, self.gpus)
        tp, pp, vp, ep, etp, cp = dims.tp, dims.pp, dims.vp, dims.ep, dims.etp, dims.cp
        if ep == 1 and etp > 2:
            raise Infeasible("expert parallelism 1 is searched only with expert-tensor parallelism <= 2")
        edits.update(dims.flags(("tp", "pp", "ep", "etp", "cp")))
        edits["--micro-batch-size"] = int(knobs["--micro-batch-size"])
        edits[DEGREE_FLAGS["vp"]] = vp if vp > 1 else None
        edits["--num-layers-per-virtual-pipeline-stage"] = None
        if pp * vp > self.layers:
            raise Infeasible(f"PP {pp} x VP {vp} exceeds the {self.layers} layers")
        edits.update(_split_flags(self.layers, pp, vp, str(knobs["split"])))
        for f in _RECOMPUTE_FLAGS:
            edits[f] = None
        edits.update(RECOMPUTE[knobs["--recompute-granularity"]])  # type: ignore[index]
        # co-changes the launcher applies (Appendix E)
        if tp == 1:
            edits["--sequence-parallel"] = None
            edits["--tp-comm-overlap"] = None
        else:
            edits["--sequence-parallel"] = True
        if knobs["dispatcher"] == "deepep":
            edits["--moe-token-dispatcher-type"] = "flex"
            edits["--moe-flex-dispatcher-backend"] = "deepep"
            edits["--moe-shared-expert-overlap"] = None
            # offered within a node only on GLM-4.5: it cannot initialise across nodes there
            if self.model == "glm-4.5" and ep * etp > self.gpus_per_node:
                raise Infeasible("DeepEP is offered only within a node on GLM-4.5")
        else:
            edits["--moe-token-dispatcher-type"] = "alltoall"
            edits["--moe-flex-dispatcher-backend"] = None
        if "offload" in knobs:
            on = knobs["offload"] == "on"
            edits["--optimizer-cpu-offload"] = True if on else None
            edits["--overlap-cpu-optimizer-d2h-h2d"] = True if on else None
        args = {**self.baseline_args, **{k: v for k, v in edits.items() if v is not None}}
        for k, v in edits.items():
            if v is None:
                args.pop(k, None)
        if self.model == "glm-4.5":
            dense = tp * cp * dims.dp if self.gpus % dims.model_parallel == 0 else 0
            if dense and dense % (ep * etp) == 0 and dense // (ep * etp) > 1:
                # the data-parallel overlaps hang with expert data parallelism > 1 on this stack
                args.pop("--overlap-grad-reduce", None)
                args.pop("--overlap-param-gather", None)
        try:
            recipe_layout(self.spec, args)
        except LayoutError as exc:
            raise Infeasible(str(exc)) from None
        return args

    def prefilter(self, margin: float | None = None) -> Callable[[dict[str, ArgValue]], str | None]:
        """The memory pre-filter over knob draws: the skill's estimate of the draw's recipe with the
        model's margin (PREFILTER_MARGIN) must fit; the baseline is exempt; an infeasible draw is skipped."""
        m = PREFILTER_MARGIN.get(self.model, 0.10) if margin is None else margin
        base = self.baseline()

        def check(full: dict[str, ArgValue]) -> str | None:
            if all(full.get(k, v) == v for k, v in base.items()):
                return None
            try:
                args = self.to_args(full)
            except Infeasible as exc:
                return f"infeasible: {exc}"
            est, why = recipe_memory(self.spec, args, m)
            if est is None:
                return f"infeasible: {why}"
            if est.fits is False:
                return (f"estimated {est.peak.with_margin_bytes / 2**30:.1f} GiB with a {m:.1%} margin exceeds "
                        "the GPU")
            return None

        return check


def knob_space(spec: CampaignSpec) -> KnobSpace:
    """The campaign's model's Table E1 space; ValueError for a model without one."""
    try:
        model = find_model(spec.model)
    except (LayoutError, KeyError) as exc:
        raise ValueError(f"model: {exc}") from None
    if model.name not in SPACES:
        raise ValueError(f"model: no Table E1 knob space for {model.name}; known: {sorted(SPACES)}")
    return KnobSpace(model.name, SPACES[model.name], dict(spec.baseline.args), model.layers, spec.cluster.gpus,
                     spec.cluster.gpus_per_node, spec)


def flag_changes(baseline: Mapping[str, ArgValue], args: Mapping[str, ArgValue]) -> dict[str, ArgValue]:
    """A recipe's full flags as changes relative to the baseline (a flag the recipe drops: None)."""
    changed = Recipe(args).diff(Recipe(baseline))[0]
    return {k: changed[k] for k in dict.fromkeys([*args, *baseline]) if k in changed}  # in the recipe's order


class KnobPlane(PlaneWrapper):
    """A `ControlPlane` over knob draws: translates each to flag changes for the inner plane (module doc)."""

    def __init__(self, inner: Any, space: KnobSpace) -> None:
        super().__init__(inner)
        self.space = space
        self.infeasible = 0

    def evaluate(self, candidate: Candidate, prune_below: float | None) -> Outcome:
        try:
            args = self.space.to_args(candidate.changes)
        except Infeasible as exc:
            self.infeasible += 1
            return Outcome(run_id=None, outcome="refused", reason=f"infeasible: {exc}")
        flags = Candidate(changes=flag_changes(self.space.baseline_args, args), lever=candidate.lever,
                          hypothesis=candidate.hypothesis, expected_gain=candidate.expected_gain,
                          token=candidate.token)
        return self.inner.evaluate(flags, prune_below)

    def stop_evidence(self) -> dict[str, Any]:
        return {"infeasible_draws": self.infeasible}
