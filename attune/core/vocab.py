"""The control plane's words: run outcomes, run kinds and run verdicts, defined once.

Standard library only (hooks may import it). Each member is a `StrEnum`: it compares equal to
its string and serialises as it, so the ledger's JSON keeps the same values and rows written
before these enums existed read back unchanged.
"""

from __future__ import annotations

from enum import StrEnum


class RunOutcome(StrEnum):
    """How a run ended (the ledger's `run_finished.outcome`)."""

    OK = "ok"
    OOM = "oom"  # out of memory (the GPU's, or the host's)
    HANG = "hang"  # no progress: a watchdog, the backend's time limit
    CRASH = "crash"
    INFRASTRUCTURE = "infrastructure"  # a node or network fault: not the recipe's (retried once)
    CANCELLED = "cancelled"
    PRUNED = "pruned"  # stopped early: slower than the early-abort threshold
    OVERRUN = "overrun"  # stopped by the monitor at its charge bound (attune.control.plane.charge_bound)
    # The tuner side only (never in the ledger): the control plane refused the candidate.
    REFUSED = "refused"


# The failure classes a run's log, exit status and progress can show (attune.readers.metrics.failure).
FAILURE_CLASSES: tuple[RunOutcome, ...] = (
    RunOutcome.OK, RunOutcome.OOM, RunOutcome.HANG, RunOutcome.CRASH, RunOutcome.INFRASTRUCTURE,
)
# The recipe failed: its own fault, counted against it (a lever that OOMs, hangs or crashes).
RECIPE_FAILURES: frozenset[RunOutcome] = frozenset({RunOutcome.OOM, RunOutcome.HANG, RunOutcome.CRASH})
# The run failed (its verdict is `failed`): a recipe failure or an infrastructure fault. Cancelled
# and pruned runs are stopped, not failed.
FAILED_OUTCOMES: frozenset[RunOutcome] = RECIPE_FAILURES | {RunOutcome.INFRASTRUCTURE}
# The control plane stopped the run on purpose; the verdict is the outcome itself.
STOPPED_OUTCOMES: frozenset[RunOutcome] = frozenset({RunOutcome.CANCELLED, RunOutcome.PRUNED})
# The control plane cut the run short (the early abort, the charge bound): charged what it used, and
# counted with the failed runs in the accounting of GPU-hours that bought no measurement.
CUT_OUTCOMES: frozenset[RunOutcome] = frozenset({RunOutcome.PRUNED, RunOutcome.OVERRUN})


class RunKind(StrEnum):
    """Why a run was launched (the ledger's `run_admitted.kind`)."""

    CALIBRATION = "calibration"  # a baseline run that measures the noise band
    SEARCH = "search"  # a candidate recipe
    CHECK = "check"  # a correctness (convergence) check of a recipe, or of the baseline (the reference)
    REMEASURE = "remeasure"  # the shipped recipe's final re-measurement


# Kinds launched by shipping, after the search, out of the check reserve.
FINAL_KINDS: frozenset[RunKind] = frozenset({RunKind.CHECK, RunKind.REMEASURE})


class Verdict(StrEnum):
    """What a finished run's measurement means (the ledger's `measurement.verdict`).

    A run that is not a search candidate gets its kind as its verdict (calibration, check, remeasure);
    a cancelled or pruned run gets its outcome.
    """

    LEADER = "leader"  # beat the leader of its time beyond the noise band: promoted
    WITHIN_BAND = "within_band"  # no better than the leader beyond the noise
    SLOWER = "slower"
    UNCALIBRATED = "uncalibrated"  # no noise band yet to judge it against
    INVALID = "invalid"  # measured, but not a valid measurement
    FAILED = "failed"  # the outcome says how (one of FAILED_OUTCOMES)
    CANCELLED = "cancelled"
    PRUNED = "pruned"
    OVERRUN = "overrun"
    CALIBRATION = "calibration"
    CHECK = "check"
    REMEASURE = "remeasure"
    # Derived by readers for runs the ledger has no verdict for (yet).
    IN_FLIGHT = "in_flight"
    UNMEASURED = "unmeasured"
