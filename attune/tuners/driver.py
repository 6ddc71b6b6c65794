"""Drive a tuner against the control plane, with up to `concurrency` runs in flight.

The control plane (admission, the gate's layer 1, the ledger, scoring and the promotion rule) is
the same one the agent's MCP tools reach; the driver only asks the tuner for candidates and
reports outcomes back. The baseline is never launched as a search candidate: its value is the
calibration mean (and the control plane refuses identical recipes anyway).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from attune.core.measure import EARLY_ABORT_STEPS, PRUNER
from attune.core.vocab import RECIPE_FAILURES, RunOutcome
from attune.tuners.base import Candidate, Outcome, Tuner

__all__ = ["EARLY_ABORT_STEPS", "ControlPlane", "DriveResult", "drive"]  # the constant: attune.core.measure's


class ControlPlane(Protocol):
    concurrency: int

    def can_launch(self) -> bool:
        """Whether the budget still admits another search run (admission re-checks atomically)."""

    def baseline_tps(self) -> float:
        """The calibration mean."""

    def leader_tps(self) -> float:
        """The current leader's throughput."""

    def evaluate(self, candidate: Candidate, prune_below: float | None) -> Outcome:
        """Launch the candidate through the control plane, wait for it, score it. Blocking."""

    def record_stop(self, evidence: dict[str, Any]) -> None:
        """Write the stop record with its evidence."""


# How many times a refused stop is answered with the runs it asks for before the refusal stands.
STOP_REPAIRS = 2


@dataclass
class DriveResult:
    launches: int = 0
    failed: int = 0
    pruned: int = 0
    refused: int = 0
    stop_reason: str = ""
    outcomes: list[tuple[Candidate, Outcome]] = field(default_factory=list)


def drive(
    tuner: Tuner,
    cp: ControlPlane,
    early_abort: bool = False,
    on_outcome: Callable[[Candidate, Outcome], None] | None = None,
    _repairs: int = 0,
    _before: DriveResult | None = None,
) -> DriveResult:
    res = DriveResult()
    exhausted = False
    budget_out = False
    width = max(1, cp.concurrency)
    # One run at a time is evaluated in this thread: the order of outcomes, hence the campaign, is then
    # determined by the tuner's seed and the control plane alone.
    with (cf.ThreadPoolExecutor(max_workers=width) if width > 1 else contextlib.nullcontext()) as pool:
        inflight: dict[cf.Future[Outcome], Candidate] = {}
        while True:
            while not exhausted and not budget_out and len(inflight) < width:
                if not cp.can_launch():
                    budget_out = True
                    break
                cand = tuner.ask()
                if cand is None:
                    exhausted = True
                    break
                if not cand.changes:
                    base = cp.baseline_tps()
                    tuner.tell(cand, Outcome(run_id=None, outcome=RunOutcome.OK, tokens_per_s_per_gpu=base, valid=True))
                    continue
                prune = PRUNER.floor(cp.leader_tps()) if early_abort else None
                if pool is None:
                    fut: cf.Future[Outcome] = cf.Future()
                    fut.set_result(cp.evaluate(cand, prune))
                else:
                    fut = pool.submit(cp.evaluate, cand, prune)
                inflight[fut] = cand
            if not inflight:
                break
            done, _ = cf.wait(list(inflight), return_when=cf.FIRST_COMPLETED)
            for fut in done:
                cand = inflight.pop(fut)
                out = fut.result()
                if out.outcome == RunOutcome.REFUSED:
                    res.refused += 1
                    if out.code == "budget":  # the code, never the words of the reason
                        budget_out = True
                else:
                    res.launches += 1
                    if out.outcome in RECIPE_FAILURES:
                        res.failed += 1
                    elif out.outcome == RunOutcome.PRUNED:
                        res.pruned += 1
                if out.tokens_per_s_per_gpu is not None:  # what the tuner compares a measurement with
                    out.extra.setdefault("leader_tps", cp.leader_tps())
                tuner.tell(cand, out)
                exhausted = False  # an outcome can give the tuner new work (rule 5's retry of an OOM layout)
                res.outcomes.append((cand, out))
                if on_outcome is not None:
                    on_outcome(cand, out)
    res.stop_reason = (
        "the budget is spent" if budget_out else
        "the tuner found nothing more to try that could beat the leader" if exhausted else "stopped"
    )
    total = res if _before is None else _merged(_before, res)
    if _stopped(tuner, cp, total, repairable=not budget_out and _repairs < STOP_REPAIRS):
        return total
    return drive(tuner, cp, early_abort, on_outcome, _repairs=_repairs + 1, _before=total)


def _stopped(tuner: Tuner, cp: ControlPlane, total: DriveResult, repairable: bool) -> bool:
    """Record the stop. False: the control plane refused it and the tuner queued the runs it asked for (the
    search goes on); a refusal that cannot be answered is raised."""
    try:
        cp.record_stop({**tuner.summary(), "reason": total.stop_reason, "launches": total.launches,
                        "failed": total.failed})
    except Exception as exc:
        if not repairable or not _repaired(tuner, exc):
            raise
        return False
    return True


def _repaired(tuner: Tuner, exc: Exception) -> bool:
    """A stop the control plane's search rules refuse lists what it misses (`refusals`); a tuner that can answer
    with those runs (`repair`) gets them. True: it queued some, the search goes on."""
    repair = getattr(tuner, "repair", None)
    refusals = getattr(exc, "refusals", None)
    return refusals is not None and callable(repair) and bool(repair(refusals))


def _merged(first: DriveResult, then: DriveResult) -> DriveResult:
    """A drive's counts with its continuation's after a refused stop was answered: the stop is the continuation's."""
    return DriveResult(launches=first.launches + then.launches, failed=first.failed + then.failed,
                       pruned=first.pruned + then.pruned, refused=first.refused + then.refused,
                       stop_reason=then.stop_reason, outcomes=first.outcomes + then.outcomes)
