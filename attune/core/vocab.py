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
# A profiled run that ended so left no profile, and says nothing about the recipe: a calibration run lost
# this way does not use up the campaign's one profile of the baseline (diagnosis first).
PROFILE_LOST_OUTCOMES: frozenset[RunOutcome] = frozenset({RunOutcome.INFRASTRUCTURE, RunOutcome.CANCELLED})


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


class RunStatus(StrEnum):
    """Where a run is in its life (the fold's `RunState.status`)."""

    ADMITTED = "admitted"  # admitted and written; the backend has not reported it started
    RUNNING = "running"
    FINISHED = "finished"  # its run_finished row is written: outcome, charge, verdict


class RefusalCode(StrEnum):
    """Why admission refused a launch (the ledger's `launch_refused.code`, the wire's `code`).

    The agent-facing lists (broker/wire.py's field description, hence the MCP tools' schemas) are
    written from this enum (`refusal_codes_text`); tests/test_vocab.py fails on a code the control plane
    writes that is not here."""

    NOT_STARTED = "not_started"  # the campaign has not started
    FAILED = "failed"  # the campaign has ended failed
    CONCURRENCY = "concurrency"
    BAD_REQUEST = "bad_request"
    BAD_CHANGE = "bad_change"
    CALIBRATION_FULL = "calibration_full"
    STOPPED = "stopped"
    NOT_CALIBRATED = "not_calibrated"
    NO_CHANGE = "no_change"
    RULE2_ONE_LEVER = "rule2_one_lever"  # search rule 2: one lever per candidate
    GATE = "gate"
    CODE_LOCATIONS = "code_locations"
    IDENTICAL = "identical"
    BUDGET_UNSET = "budget_unset"
    NO_ESTIMATE = "no_estimate"
    BUDGET = "budget"
    SHAPE = "shape"
    PINNED = "pinned"
    STACK_FIX = "stack_fix"
    PROFILE_FLAG = "profile_flag"
    ENV_NOT_ALLOWLISTED = "env_not_allowlisted"
    PATH_OUTSIDE_RUN = "path_outside_run"
    SPEC_CHANGED = "spec_changed"
    ENVIRONMENT = "environment"  # the jobs' Python lacks the workload's modules
    REPLICATE_DONE = "replicate_done"  # a candidate's one replicate check run was already asked for


REFUSAL_NOTES: dict[RefusalCode, str] = {
    RefusalCode.ENVIRONMENT: "the jobs' Python lacks the workload's modules: see workload_environment",
    RefusalCode.RULE2_ONE_LEVER: "search rule 2: one lever per candidate",
}


def refusal_codes_text() -> str:
    """Every refusal code, for the agent (a field description): generated, so none is left out."""
    return ", ".join(f"{c.value} ({REFUSAL_NOTES[c]})" if c in REFUSAL_NOTES else c.value for c in RefusalCode)


class ShipAction(StrEnum):
    """What shipping does next (`attune.control.shipping.plan`'s `Action.kind`)."""

    NOT_DUE = "not_due"
    WAIT = "wait"
    CHECK = "check"  # launch a check run of the baseline (reference, replicates) or of a candidate
    # launch ONE replicate check run of a candidate whose check was borderline (`shipping.borderline_replicate`)
    CHECK_REPLICATE = "check_replicate"
    JUDGE = "judge"  # record the gate's verdict on a finished check run
    REJUDGE = "rejudge"  # judge a candidate again with its replicate check run's spread in the noise model
    RECORD = "record"
    REMEASURE = "remeasure"
    SHIP = "ship"
    DONE = "done"
    FAIL = "fail"
    FAILED = "failed"
