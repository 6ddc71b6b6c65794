"""The tuner interface: a tuner proposes candidates and learns from their outcomes.

Tuners never launch anything themselves and decide nothing that counts: the driver hands each
candidate to the control plane (the same admission, gate, ledger and promotion rule the agent
uses), and the control plane's verdict comes back as an `Outcome`.

A candidate is a flat mapping of changes relative to the baseline: keys starting with `--` are
training arguments, other keys are environment variables (`OMP_NUM_THREADS`).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

from attune.core.recipe import ArgValue, Recipe, split_flat
from attune.core.vocab import RunOutcome


def split_changes(flat: dict[str, ArgValue]) -> dict[str, dict[str, Any]]:
    """{"--x": 1, "ENV": "2"} -> {"args": {"--x": 1}, "env": {"ENV": "2"}} (env values as strings, None: unset)."""
    args, env = split_flat(flat)
    out: dict[str, dict[str, Any]] = {}
    if args:
        out["args"] = args
    if env:
        out["env"] = env
    return out


def recipe_key(flat: dict[str, ArgValue], base: Recipe | None = None) -> str:
    """The identity of the recipe the flat changes make of `base` (`Recipe.key`, the control plane's key:
    4 and "4" are the same, and a change to the baseline's own value is no change)."""
    return (base or Recipe()).with_flat(flat).key


@dataclass
class Candidate:
    changes: dict[str, ArgValue]
    lever: str
    hypothesis: str
    expected_gain: float | None = None
    token: Any = None  # the tuner's own handle (an Optuna trial, a lever position, ...)


@dataclass
class Outcome:
    run_id: str | None
    outcome: str  # a RunOutcome: ok | oom | hang | crash | infrastructure | pruned | refused
    tokens_per_s_per_gpu: float | None = None
    valid: bool = False
    promoted: bool = False  # the control plane made it the leader
    reason: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    code: str | None = None  # a refusal's stable code (the broker's; "budget": the launch does not fit)

    @property
    def score(self) -> float:
        """What a black-box tuner optimises: throughput, and zero for a run that failed."""
        if self.outcome != RunOutcome.OK or not self.valid or self.tokens_per_s_per_gpu is None:
            return 0.0
        return float(self.tokens_per_s_per_gpu)


class Tuner(abc.ABC):
    """Proposes candidates one at a time; `ask` returning None means it has nothing left to try."""

    name: str = "tuner"

    def __init__(self, space: dict[str, list[ArgValue]], baseline: dict[str, ArgValue], seed: int = 0,
                 base: Recipe | None = None) -> None:
        if not space:
            raise ValueError("the search space is empty: declare search_space in campaign.yaml")
        for k, values in space.items():
            if not values:
                raise ValueError(f"search_space.{k}: expected at least one value")
        self.space = space
        self.baseline = baseline  # the baseline's value of each lever in the space
        self.seed = seed
        # The recipe candidates change: the campaign's baseline where given (then `key` is the control
        # plane's recipe key), else the levers' baseline values (the same identity over the space).
        self.base = base if base is not None else Recipe().with_flat(baseline)
        self.tried: set[str] = set()  # keys of the recipes proposed so far

    @abc.abstractmethod
    def ask(self) -> Candidate | None: ...

    @abc.abstractmethod
    def tell(self, candidate: Candidate, outcome: Outcome) -> None: ...

    def summary(self) -> dict[str, Any]:
        """Evidence for the stop record: what was tested."""
        return {"tuner": self.name, "levers_tested": sorted(self.space)}

    def key(self, changes: dict[str, ArgValue]) -> str:
        """The identity of the recipe `changes` make of the baseline (`recipe_key`)."""
        return recipe_key(changes, self.base)

    def diff(self, full: dict[str, ArgValue]) -> dict[str, ArgValue]:
        """Only the levers whose value differs from the baseline."""
        return {k: v for k, v in full.items() if self.baseline.get(k) != v}


class PlaneWrapper:
    """A control plane in front of another (the driver's `ControlPlane`): it rewrites candidates in
    `evaluate` and adds its own counts to the stop's evidence (`stop_evidence`); everything else is the
    inner plane's."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.concurrency = inner.concurrency

    def evaluate(self, candidate: Candidate, prune_below: float | None) -> Outcome:
        return self.inner.evaluate(candidate, prune_below)

    def can_launch(self) -> bool:
        return bool(self.inner.can_launch())

    def baseline_tps(self) -> float:
        return float(self.inner.baseline_tps())

    def leader_tps(self) -> float:
        return float(self.inner.leader_tps())

    def stop_evidence(self) -> dict[str, Any]:
        return {}

    def record_stop(self, evidence: dict[str, Any]) -> None:
        self.inner.record_stop({**evidence, **self.stop_evidence()})

