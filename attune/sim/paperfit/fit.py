"""The simulator against the paper's measured points: each point's simulated value and its error.

`evaluate(c)` runs every point of `attune.sim.paperfit.paper.POINTS` through the noise-free estimate with
the constants `c`; `summarise` gives the mean and largest absolute error per table, separately for
the fitted and the held-out points. `benchmarks/fit_sim.py` fits the free constants on the fitted
points and prints these tables; `tests/test_sim_paperfit.py` holds the held-out errors to their bounds.

Errors: a throughput point's error is simulated / paper - 1; an outcome point (out of memory) is
right or wrong, and counts as a miss in the table's outcome column, not in its mean error. A point
the simulator refuses (argument validation) is reported as such and counts as a miss too.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from functools import cache
from typing import Any

from attune.core.campaign_paths import CAMPAIGN_FILE
from attune.readers.bounded import read_yaml
from attune.sim.api import apply_overrides, resolve_accelerator, resolve_model
from attune.sim.constants import DEFAULT, Constants
from attune.sim.estimate import estimate
from attune.sim.paperfit.paper import CAMPAIGNS, POINTS, PaperPoint


@dataclass(frozen=True)
class PointResult:
    point: PaperPoint
    outcome: str  # the simulator's: ok | oom | refused | ...
    tps: float | None
    peak_ratio: float | None  # the highest stage peak / the accelerator's memory
    public_tps: float | None  # the simulator's public recipe of the same model

    @property
    def error(self) -> float | None:
        """simulated / paper - 1 for a throughput point both sides ran; None otherwise."""
        if self.point.tps is None or self.tps is None:
            return None
        return self.tps / self.point.tps - 1.0

    @property
    def outcome_ok(self) -> bool:
        return self.outcome == self.point.outcome

    def sim_value(self) -> str:
        return f"{self.tps:.1f}" if self.tps is not None else self.outcome

    def paper_value(self) -> str:
        return f"{self.point.tps:.1f}" if self.point.tps is not None else self.point.outcome


@dataclass(frozen=True)
class _Example:
    """What the fit needs of an example campaign: the simulator sits below the control plane, so it reads
    the campaign file itself instead of through the spec model."""

    model: str
    accelerator: str
    gpus: int
    args: dict[str, Any]
    env: dict[str, str]


@cache
def _spec(model: str) -> _Example:
    raw = read_yaml(CAMPAIGNS[model] / CAMPAIGN_FILE, "the example campaign")
    return _Example(str(raw["model"]), str(raw["cluster"]["accelerator"]), int(raw["cluster"]["gpus"]),
                    dict(raw["baseline"].get("args") or {}), {k: str(v) for k, v in (raw["baseline"].get("env") or {}).items()})


def evaluate_point(p: PaperPoint, c: Constants = DEFAULT) -> tuple[str, float | None, float | None]:
    spec = _spec(p.model)
    args = apply_overrides(spec.args, p.changes)
    e = estimate(resolve_model(spec.model), resolve_accelerator(spec.accelerator), spec.gpus, args, spec.env, c=c)
    ratio = e.memory.peak.peak_gib / e.memory.capacity_gib if e.memory is not None else None
    outcome = "refused" if e.outcome == "crash" and e.memory is None else e.outcome
    return outcome, e.tokens_per_s_per_gpu, ratio


def evaluate(c: Constants = DEFAULT, points: tuple[PaperPoint, ...] = POINTS) -> list[PointResult]:
    raw = [(p, *evaluate_point(p, c)) for p in points]
    public = {p.model: tps for p, _, tps, _ in raw if p.kind == "calibration"}
    return [PointResult(p, o, tps, ratio, public.get(p.model)) for p, o, tps, ratio in raw]


@dataclass(frozen=True)
class TableError:
    table: str
    split: str
    points: int
    throughput_points: int
    mean_abs: float | None
    max_abs: float | None
    outcome_misses: int

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def summarise(results: list[PointResult]) -> list[TableError]:
    """Mean and largest absolute error per (table, split), with the outcome misses."""
    groups: dict[tuple[str, str], list[PointResult]] = {}
    for r in results:
        groups.setdefault((r.point.table, r.point.split), []).append(r)
        groups.setdefault(("all", r.point.split), []).append(r)
    out = []
    for (table, split), rs in sorted(groups.items(), key=lambda kv: (kv[0][0] == "all", kv[0])):
        errs = [abs(r.error) for r in rs if r.error is not None]
        out.append(TableError(
            table=table, split=split, points=len(rs), throughput_points=len(errs),
            mean_abs=statistics.fmean(errs) if errs else None, max_abs=max(errs) if errs else None,
            outcome_misses=sum(not r.outcome_ok for r in rs),
        ))
    return out


def log_error(r: PointResult) -> float:
    """Squared log error of a throughput point (0 where either side has no throughput)."""
    if r.point.tps is None or r.tps is None:
        return 0.0
    return math.log(r.tps / r.point.tps) ** 2
