"""One recipe's predicted outcome, throughput, memory and step-time terms (no run-to-run noise).

The order in which things go wrong follows a real job: argument validation and start-up failures
first (crash), then memory at model construction, then a defect that crashes the first layer of
step 0, then activation memory in step 0 (out of memory), then defects that hang or stall step 0. A recipe that survives all of them runs (`ok`), possibly
training another objective (`objective` names the defect or the changed settings).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from attune.sim.constants import DEFAULT, Constants
from attune.sim.defects import Defect, defects_for
from attune.sim.memory import MemoryReport, stage_memory
from attune.sim.recipe import ArgValue, RecipeError, SimRecipe, build_recipe, unmodelled_flags
from attune.sim.steptime import TERM_HELP, TERM_ORDER, StepTime, step_time

OUTCOMES = ("ok", "oom", "hang", "crash")


@dataclass
class Estimate:
    outcome: str
    reason: str
    recipe: SimRecipe | None = None
    step: StepTime | None = None
    memory: MemoryReport | None = None
    defects: list[Defect] = field(default_factory=list)
    failure_at: str | None = None  # start | init | step0 (where a failed run stops)
    stall: bool = False  # hang by a step that never ends (no watchdog message)

    @property
    def tokens_per_s_per_gpu(self) -> float | None:
        if self.step is None or self.recipe is None:
            return None
        return self.recipe.tokens_per_step / (self.recipe.gpus * self.step.seconds)

    def as_dict(self) -> dict[str, Any]:
        r = self.recipe
        out: dict[str, Any] = {
            "outcome": self.outcome,
            "reason": self.reason,
            "tokens_per_s_per_gpu": None,
            "step_time_ms": None,
            "mfu": None,
            "layout": None,
            "microbatches": None,
            "terms_ms": None,
            "memory": self.memory.as_dict() if self.memory else None,
            "defects": [{"id": d.id, "effect": d.effect, "detail": d.detail, "source": d.source}
                        for d in self.defects],
            "unmodelled_flags": unmodelled_flags(r.args) if r is not None else [],
        }
        if r is not None:
            lay = r.layout
            out["layout"] = {"tp": lay.tp, "pp": lay.pp, "vp": lay.vp, "cp": lay.cp, "dp": lay.dp,
                             "ep": r.ep, "etp": r.etp, "edp": r.edp,
                             "stage_layers": list(lay.split.per_stage) if lay.split else None}
            out["microbatches"] = r.microbatches
        if self.step is not None and r is not None:
            tps = self.tokens_per_s_per_gpu
            out["tokens_per_s_per_gpu"] = round(tps, 2) if tps else None
            out["step_time_ms"] = round(self.step.seconds * 1e3, 3)
            out["mfu"] = round(self.step.flops_per_token * (tps or 0) / r.acc.peak(r.precision), 4)
            out["terms_ms"] = {k: round(self.step.terms[k] * 1e3, 3) for k in TERM_ORDER}
            out["critical_stage"] = self.step.critical_stage
        return out


def estimate_recipe(r: SimRecipe, c: Constants = DEFAULT, deepep_internode: bool = False) -> Estimate:
    hits = defects_for(r, deepep_internode)
    for d in hits:
        if d.effect == "crash_start":
            return Estimate("crash", d.message, r, defects=hits, failure_at="start")
    mem = stage_memory(r, c)
    if not mem.fits:
        peak = mem.peak
        at = "init" if peak.weights_gib + peak.buffers_gib > mem.capacity_gib else "step0"
        crash = next((d for d in hits if d.effect == "crash_step0"), None)
        if at == "step0" and crash is not None:  # fails in the first layer, before activations pile up
            return Estimate("crash", crash.message, r, memory=mem, defects=hits, failure_at="step0")
        return Estimate(
            "oom",
            f"CUDA out of memory on pipeline stage {peak.stage}: needs {peak.peak_gib:.1f} GiB of "
            f"{mem.capacity_gib:.1f} GiB",
            r, memory=mem, defects=hits, failure_at=at,
        )
    for d in hits:
        if d.effect in ("hang", "stall"):
            return Estimate("hang", d.message, r, memory=mem, defects=hits, failure_at="step0",
                            stall=d.effect == "stall")
        if d.effect == "crash_step0":
            return Estimate("crash", d.message, r, memory=mem, defects=hits, failure_at="step0")
    st = step_time(r, c)
    reason = "runs"
    obj = [d for d in hits if d.effect == "objective"]
    if obj:
        reason = "runs, but trains another objective: " + "; ".join(d.message for d in obj)
    return Estimate("ok", reason, r, step=st, memory=mem, defects=hits)


def estimate(
    model: Any,
    acc: Any,
    gpus: int,
    args: Mapping[str, ArgValue],
    env: Mapping[str, str] | None = None,
    gpus_per_node: int = 8,
    c: Constants = DEFAULT,
    deepep_internode: bool = False,
) -> Estimate:
    """Estimate a recipe given as flags (model and accelerator by object or name); Megatron's argument
    validation failures come back as crashes."""
    from attune.sim.api import resolve_accelerator, resolve_model

    model = resolve_model(model) if isinstance(model, str) else model
    acc = resolve_accelerator(acc) if isinstance(acc, str) else acc
    try:
        r = build_recipe(model, acc, gpus, args, env, gpus_per_node)
    except RecipeError as exc:
        return Estimate("crash", f"AssertionError: {exc}", None, failure_at="start")
    return estimate_recipe(r, c, deepep_internode)


def terms_help() -> dict[str, str]:
    return dict(TERM_HELP)
