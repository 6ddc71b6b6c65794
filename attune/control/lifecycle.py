"""A run's lifecycle, owned by the control plane from admission to its final row, shipping included.

    admitted --submitted--> (queued) --started--> running --ended/killed--> finished

The broker is transport and backends: it submits what the lifecycle admits (`admit`, `shipping_step`)
and hands what it observes of each run to one entry point, `on_backend_event(run_id, RunEvent)`. The
lifecycle writes the rows (`run_submitted`, `run_started`, then `Control.finish`'s) and applies its rules:

- an admitted run with no submission after `UNSUBMITTED_GRACE_S` was lost (the broker stopped);
- a backend that does not answer is asked again until `control.hang_timeout_s` has passed, then the run
  ended on infrastructure; a job the backend no longer knows ended on infrastructure at once;
- a running job whose log has not grown for `control.hang_timeout_s` is killed as a hang, and a black-box
  tuner's run that `PRUNER` rules out is pruned: the lifecycle writes the kill record (runs/<id>/
  broker_kill.json) and answers `Reaction.cancel`; the broker cancels the job and reports its state
  again, and the run is finished with the kill's outcome;
- a cancel (`stop`) of the agent's or a tuner's: refused for the shipping step's own runs;
- after the stop, `shipping_step` takes the shipping step (`attune.control.shipper.advance`) and hands
  the next check or re-measurement run, admitted by the same rule pipeline, to the broker to submit.
"""

from __future__ import annotations

import enum
import json
import os
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from attune.control import shipper, shipping
from attune.control.plane import Control, JobFacts, LaunchAnswer, RunRequest, charge_bound
from attune.core.campaign_paths import RUN_KILL_FILE, RUN_LOG
from attune.core.measure import PRUNER, gpu_hours, partial_throughput
from attune.core.state import RunState
from attune.core.vocab import FINAL_KINDS, STOPPED_OUTCOMES, RunOutcome

UNSUBMITTED_GRACE_S = 30.0  # an admitted run with no submission row after this long was lost
KILL_FILE = RUN_KILL_FILE
LIVE_STATES = ("pending", "running")  # a backend's job states before its end (broker.backends.base.JobState)


class EventKind(enum.StrEnum):
    """What the broker observed of one run."""

    SUBMITTED = "submitted"  # the backend took the job (`backend`, `backend_id`)
    SUBMIT_FAILED = "submit_failed"  # the backend refused the job (`reason`)
    NOT_SUBMITTED = "not_submitted"  # a run in flight has no backend id (its submission was never recorded)
    STATUS = "status"  # the job's state (`state`, `started_at`, `ended_at`, `exit_code`, `nodes`, `reason`)
    UNREACHABLE = "unreachable"  # the backend did not answer (`reason`): the job's state is unknown
    LOST = "lost"  # the backend does not know the job (`reason`)


@dataclass(frozen=True)
class RunEvent:
    """One backend observation of one run, as the broker hands it to the lifecycle."""

    kind: EventKind
    backend: str | None = None
    backend_id: str | None = None
    state: str | None = None  # a broker.backends.base.JobState value
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    nodes: tuple[str, ...] = ()
    reason: str | None = None
    now: float | None = None  # the backend's clock when it was observed (a simulated cluster keeps its own)

    @property
    def ended(self) -> bool:
        return self.kind == EventKind.STATUS and self.state is not None and self.state not in LIVE_STATES

    @property
    def running(self) -> bool:
        return self.kind == EventKind.STATUS and self.state == "running"


@dataclass
class Reaction:
    """What the lifecycle did with an event, and what the broker must do next."""

    notes: list[str] = field(default_factory=list)  # for the broker's log
    cancel: bool = False  # stop the job on the backend, then report its state again
    finished: dict[str, Any] | None = None  # `Control.finish`'s answer, when the run ended

    def then(self, other: Reaction) -> Reaction:
        return Reaction(self.notes + other.notes, other.cancel, other.finished or self.finished)


@dataclass
class StopAnswer:
    """A cancel request's answer: refused with the reason, or stopping (`cancel`: the broker stops the job)."""

    refused: str | None = None
    cancel: bool = False


class Lifecycle:
    """The runs of one campaign, from admission to their final rows. `backend`: the campaign's backend,
    only to render the shipped recipe's job script (`shipper.write_shipped`)."""

    def __init__(self, control: Control, backend: Any = None) -> None:
        self.control = control
        self.backend = backend
        self._unreachable_since: dict[str, float] = {}  # run id -> when the backend first did not answer
        self._kill_idle: dict[str, float | None] = {}  # run id -> the log's idle seconds when it was killed
        self._last_seen: dict[str, float] = {}  # run id -> the backend clock at its last running observation

    # --- admission ----------------------------------------------------------------------------
    def admit(self, request: RunRequest | dict[str, Any]) -> LaunchAnswer:
        return self.control.admit(request)

    def in_flight(self) -> list[RunState]:
        return self.control.state().in_flight

    # --- the one entry point ------------------------------------------------------------------
    def on_backend_event(self, run_id: str, event: RunEvent) -> Reaction:
        """Apply one backend observation of a run: its rows, and what the broker must do next."""
        run = self.control.state().runs.get(run_id)
        if run is None or run.status == "finished":
            return Reaction()
        if event.kind == EventKind.SUBMITTED:
            assert event.backend is not None and event.backend_id is not None
            self.control.record_submitted(run_id, event.backend, event.backend_id)
            return Reaction()
        if event.kind == EventKind.SUBMIT_FAILED:
            return self._lost(run_id, f"submission failed: {event.reason}", "")
        if event.kind == EventKind.NOT_SUBMITTED:
            if time.time() - admitted_at(run) > UNSUBMITTED_GRACE_S:
                return self._lost(run_id, "admitted but never submitted (the broker stopped?)", "lost before submission")
            return Reaction()
        if event.kind == EventKind.UNREACHABLE:
            since = self._unreachable_since.setdefault(run_id, time.time())
            if time.time() - since < self.control.spec.control.hang_timeout_s:
                return Reaction([f"{run_id}: backend unavailable, asking again ({event.reason})"])
            return self._lost(run_id, f"the backend did not answer for {time.time() - since:.0f} s: {event.reason}",
                              "lost with the backend")
        if event.kind == EventKind.LOST:
            return self._lost(run_id, f"backend lost the job: {event.reason}", "lost by the backend")
        return self._on_status(run, event)

    def _lost(self, run_id: str, reason: str, note: str) -> Reaction:
        self._unreachable_since.pop(run_id, None)
        result = self.control.finish(run_id, JobFacts(state="infrastructure", reason=reason))
        return Reaction([f"{run_id}: {note}"] if note else [], finished=result)

    def _on_status(self, run: RunState, event: RunEvent) -> Reaction:
        self._unreachable_since.pop(run.run_id, None)
        out = Reaction()
        if event.started_at is not None and run.status == "admitted":
            self.control.record_started(run.run_id, event.started_at, list(event.nodes))
            out.notes.append(f"{run.run_id}: started on {','.join(event.nodes) or '?'}")
        if event.ended or self.kill_record(run.run_id) is not None:  # a killed job ends with its kill
            return out.then(self._finish(run, event))
        if event.running:
            _, idle = self.log_progress(run, event.started_at)
            limit = self.control.spec.control.hang_timeout_s
            if idle is not None and idle >= limit:
                detail = f"no log progress for {idle:.0f} s (limit {limit:g} s): killed by the broker's watchdog"
                return out.then(self._kill(run.run_id, RunOutcome.HANG, detail, idle))
            over = self._over_bound(run, event)
            if over is not None:
                return out.then(self._kill(run.run_id, RunOutcome.OVERRUN, over, idle))
            if run.prune_below is not None:
                partial = self.partial_throughput(run.run_id)
                if partial is not None and PRUNER.prune(partial, run.prune_below):
                    return out.then(self._kill(run.run_id, RunOutcome.PRUNED,
                                               PRUNER.reason(partial, run.prune_below), idle))
        return out

    def _over_bound(self, run: RunState, event: RunEvent) -> str | None:
        """Why a running job must stop now: what it has used reached its charge bound (`charge_bound`)."""
        started = event.started_at if event.started_at is not None else run.started_at
        if started is None:
            return None
        spec = self.control.spec
        bound = charge_bound(self.control.state(), run, spec.budget.overrun_factor,
                             gpu_hours(spec.cluster.gpus, spec.budget.overrun_grace_s))
        if bound is None:
            return None
        now = event.now if event.now is not None else time.time()
        used = gpu_hours(spec.cluster.gpus, now - started)
        # What it will have used by the next observation (the monitor's last interval again): a run is
        # stopped before it would pass its bound, not one monitor step after.
        last = self._last_seen.get(run.run_id)
        self._last_seen[run.run_id] = now
        ahead = gpu_hours(spec.cluster.gpus, now - last) if last is not None and now > last else 0.0
        if used + ahead < bound[0]:
            return None
        return (f"stopped by the monitor at its charge bound: used {used:.6g} GPU-h (about {used + ahead:.6g} by "
                f"the next monitor step), bound {bound[0]:.6g} GPU-h ({bound[1]})")

    def _kill(self, run_id: str, why: str, detail: str, idle: float | None) -> Reaction:
        self.mark_kill(run_id, why, detail)
        self._kill_idle[run_id] = idle
        return Reaction(cancel=True)

    def _finish(self, run: RunState, event: RunEvent) -> Reaction:
        kill = self.kill_record(run.run_id) or {}
        idle = self._kill_idle.pop(run.run_id, None)  # the log's idle time when the watchdog killed it
        if idle is None:
            _, idle = self.log_progress(run, event.started_at)
        facts = JobFacts(state=event.state or "infrastructure", started_at=event.started_at, ended_at=event.ended_at,
                         exit_code=event.exit_code, nodes=list(event.nodes), killed_for=kill.get("killed_for"),
                         reason=kill.get("reason") or event.reason, seconds_since_progress=idle)
        result = self.control.finish(run.run_id, facts)
        return Reaction([f"{run.run_id}: finished {result.get('outcome')} ({result.get('reason')})"], finished=result)

    # --- cancel -------------------------------------------------------------------------------
    def stop(self, run: RunState, why: str) -> StopAnswer:
        """A cancel (`why`: cancelled or pruned) of a run in this campaign. A run not yet submitted
        finishes at once; a submitted one gets its kill record, and the broker stops its job and reports
        its state (`on_backend_event`), which finishes it."""
        if why not in STOPPED_OUTCOMES:
            raise ValueError(f"reason must be cancelled or pruned, got {why!r}")
        if run.status == "finished":
            return StopAnswer(refused=f"the run already finished ({run.outcome})")
        if run.kind in FINAL_KINDS:
            return StopAnswer(refused=(
                f"{run.run_id} is a {run.kind} run of the control plane's shipping step; it cannot be cancelled"))
        self.mark_kill(run.run_id, why, "cancelled through the broker" if why == RunOutcome.CANCELLED
                       else "stopped early by the tuner's early abort")
        if run.backend_id is not None:
            return StopAnswer(cancel=True)
        self.control.finish(run.run_id, JobFacts(state="cancelled", killed_for=why,
                                                 reason="cancelled before submission"))
        return StopAnswer()

    # --- shipping -----------------------------------------------------------------------------
    def shipping_step(self) -> tuple[LaunchAnswer | None, list[str]]:
        """After the stop, with nothing in flight: the shipping step (checks, ship, final re-measurement).
        Answers the next run to submit (admitted, or None) and what happened, for the broker's log."""
        state = self.control.state()
        if not shipping.is_due(state) or state.in_flight:
            return None, []
        before = state.shipped
        decision = shipper.advance(self.control, self.backend)
        if decision is not None:
            return decision, []
        now = self.control.state()
        if state.failed is None and now.failed is not None:
            return None, [f"shipping: the campaign failed ({now.failed.get('reason')})"]
        if before is None and now.shipped is not None:
            return None, [f"shipping: shipped {now.shipped.get('run_id')} ({now.shipped.get('reason')})"]
        return None, []

    # --- what the lifecycle reads of a run ----------------------------------------------------
    def kill_record(self, run_id: str) -> dict[str, Any] | None:
        try:
            return json.loads((self.control.run_dir(run_id) / KILL_FILE).read_text())
        except (OSError, ValueError):
            return None

    def mark_kill(self, run_id: str, why: str, detail: str) -> None:
        """Why the run is being stopped (written once, before the job is cancelled)."""
        path = self.control.run_dir(run_id) / KILL_FILE
        if path.exists():
            return
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"killed_for": why, "reason": detail, "at": time.time()}) + "\n")
        os.replace(tmp, path)

    def log_progress(self, run: RunState, started_at: float | None) -> tuple[int, float | None]:
        """(log bytes, seconds since the log last grew, counted from the job's start)."""
        path = self.control.run_dir(run.run_id) / RUN_LOG
        started = started_at or run.started_at
        try:
            stat = path.stat()
            size, last = stat.st_size, stat.st_mtime
        except OSError:
            size, last = 0, None
        if started is None:
            return size, None
        ref = max(started, last) if last is not None else started
        return size, max(0.0, time.time() - ref)

    def partial_throughput(self, run_id: str) -> tuple[float, int] | None:
        """(tokens/s/GPU over the measured steps logged so far, how many), for the early abort."""
        from attune.readers.metrics import MetricsInputError, get_parser

        spec = self.control.spec
        path = self.control.run_dir(run_id) / RUN_LOG
        if not path.exists():
            return None
        try:
            parsed = get_parser(spec.framework).read(path)
        except (MetricsInputError, OSError):
            return None
        times = {i: rec.step_time_ms for i, rec in parsed.steps.items()}
        return partial_throughput(times, spec.workload.window, float(spec.workload.tokens), spec.cluster.gpus)


def admitted_at(run: RunState) -> float:
    """Epoch seconds of a run's admission row."""
    if run.admitted_ts is not None:
        return datetime.fromisoformat(run.admitted_ts).timestamp()
    return time.time()


__all__ = ["EventKind", "Lifecycle", "Reaction", "RunEvent", "StopAnswer", "UNSUBMITTED_GRACE_S"]
