"""The built-in tuners, in one place: their names and how the control plane treats each.

Everything that names a built-in tuner reads it from here: `attune tune --tuner` and `attune demo
--tuner` (their choices), the campaign runner (search rules, early abort), the factory that builds
them (`attune.tuners.factory.make_tuner`) and the tuner comparison (`benchmarks/bench_sim_tuners.py`).
Standard library only, so the command line can offer the choices without importing a tuner.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TunerKind:
    name: str
    # A black-box tuner samples the space: the skill's search rules (which bind the agent and the
    # heuristic) are off for its campaign, and the early abort prunes its runs below 0.9 x the leader.
    black_box: bool
    summary: str


REGISTRY: dict[str, TunerKind] = {t.name: t for t in (
    TunerKind("heuristic", False, "the skill's search rules applied mechanically, larger levers first"),
    TunerKind("tpe", True, "Optuna's multivariate TPE over the space"),
    TunerKind("tpe-prefilter", True, "TPE with the memory estimate in front: a draw that cannot fit scores 0 "
                                     "without a launch"),
    TunerKind("random", True, "uniform random search over the space, no repeats"),
)}
BUILT_IN: tuple[str, ...] = tuple(REGISTRY)
BLACK_BOX: tuple[str, ...] = tuple(n for n, t in REGISTRY.items() if t.black_box)
AGENT = "claude"  # not a built-in tuner: headless Claude Code with the plugin (`attune tune` only)
TUNE_CHOICES: tuple[str, ...] = (AGENT, *BUILT_IN)
# How `attune tune` reaches the broker: auto (in this process for a built-in tuner on a simulated
# cluster, else over HTTP), http (the campaign's local or shared broker), in-process (broker.inprocess).
TRANSPORTS: tuple[str, ...] = ("auto", "http", "in-process")


def tuner_kind(name: str) -> TunerKind:
    """The built-in tuner named `name`; ValueError naming the choices otherwise."""
    kind = REGISTRY.get(name)
    if kind is None:
        raise ValueError(f"--tuner: expected one of {', '.join(TUNE_CHOICES)}; got {name!r}")
    return kind
