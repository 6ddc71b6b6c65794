"""Every tuner's candidates made coherent before a launch is spent (`attune.knowledge.coherence`).

`coherent_changes(spec, changes)` turns a candidate's flag changes relative to the baseline into the
changes of the coherent recipe: the baseline with the changes applied, passed through the framework's
argument rules (`cohere`), and diffed against the baseline again (a flag the rules drop: None).
`CoherentPlane` puts that in front of a `ControlPlane` (`attune.tuners.driver`), so the heuristic, TPE
and random search all launch whole recipes, and a candidate the rules turn into one already launched is
answered from the control plane's identical-recipe rule rather than by a second launch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from attune.control.spec import CampaignSpec
from attune.knowledge.coherence import cohere
from attune.tuners.base import ArgValue, Candidate, Outcome, PlaneWrapper


def model_layers(spec: CampaignSpec) -> int | None:
    """The model's transformer layers: the baseline's --num-layers, else the layout catalog's."""
    v = spec.baseline.args.get("--num-layers")
    if v not in (None, False, True):
        try:
            return int(v)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            pass
    try:
        from attune.knowledge.layouts import find_model

        return int(find_model(spec.model).layers)
    except Exception:  # a model the catalog does not know: the pipeline rules that need layers are skipped
        return None


def full_args(baseline: Mapping[str, Any], changes: Mapping[str, ArgValue]) -> dict[str, Any]:
    args = {k: v for k, v in baseline.items() if v not in (None, False)}
    for k, v in changes.items():
        if not k.startswith("--"):
            continue
        if v is None or v is False:
            args.pop(k, None)
        else:
            args[k] = v
    return args


def coherent_changes(spec: CampaignSpec, changes: Mapping[str, ArgValue], layers: int | None = None
                     ) -> dict[str, ArgValue]:
    base = {k: v for k, v in spec.baseline.args.items() if v not in (None, False)}
    fixed = cohere(full_args(base, changes), layers=layers if layers is not None else model_layers(spec),
                   before=base)
    out: dict[str, ArgValue] = {k: v for k, v in changes.items() if not k.startswith("--")}
    for k in sorted(set(fixed) | set(base)):
        v = fixed.get(k)
        on = v not in (None, False)
        if on and str(base.get(k)) != str(v):
            out[k] = v
        elif not on and k in base:
            out[k] = None
    return out


class CoherentPlane(PlaneWrapper):
    """A `ControlPlane` that launches the coherent form of each candidate (module doc)."""

    def __init__(self, inner: Any, spec: CampaignSpec) -> None:
        super().__init__(inner)
        self.spec = spec
        self.layers = model_layers(spec)
        self.cohered = 0  # candidates whose flags the rules changed

    def evaluate(self, candidate: Candidate, prune_below: float | None) -> Outcome:
        fixed = coherent_changes(self.spec, candidate.changes, self.layers)
        if fixed != dict(candidate.changes):
            self.cohered += 1
            candidate = Candidate(changes=fixed, lever=candidate.lever, hypothesis=candidate.hypothesis,
                                  expected_gain=candidate.expected_gain, token=candidate.token)
        return self.inner.evaluate(candidate, prune_below)

    def stop_evidence(self) -> dict[str, Any]:
        return {"cohered_candidates": self.cohered}
