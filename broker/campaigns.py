"""One campaign as the broker serves it: its control plane, its backend, its watchdog, its files.

`CampaignHandle.launch` runs the control plane's admission and submits admitted jobs to the
backend; `poll` (called by the broker's monitor thread) records when jobs start, kills jobs whose
log makes no progress for `control.hang_timeout_s` (classified as hangs), and hands every job that
ended to the control plane, which scores, charges and promotes it. `cancel` stops a job through
the backend and finishes it at once.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from attune.control.campaign import record_assumption, record_stop
from attune.control.plane import Admission, Control, JobFacts, LaunchRequest, charge_bound
from attune.core.campaign_paths import LEDGER_FILE, RUN_KILL_FILE, RUN_LOG
from attune.core.measure import PRUNER, partial_throughput
from attune.core.state import CampaignState, RunState
from attune.core.vocab import STOPPED_OUTCOMES, RunOutcome
from broker.backends import get_backend
from broker.backends.base import Backend, BackendError, BackendUnavailable, JobState, JobStatus
from broker.files import FileAccessError, FileTree, Root, compile_pattern, read_lines, search_file, tail_lines

log = logging.getLogger("attune.broker")

KILL_FILE = RUN_KILL_FILE
UNSUBMITTED_GRACE_S = 30.0  # an admitted run with no submission row after this long was lost


class NotFound(Exception):
    """No such run (or file) in this campaign."""


class CampaignHandle:
    """The broker's view of one campaign."""

    def __init__(self, campaign_dir: Path | str, backend: Backend | None = None) -> None:
        self.control = Control(campaign_dir)
        self.dir = self.control.dir
        self.spec = self.control.spec
        self.name = self.spec.name
        self.backend: Backend = backend or get_backend(self.spec.cluster.backend, self.spec.cluster.backend_settings())
        self.image = self._image_tree()
        self._lock = threading.RLock()
        self._finishing: set[str] = set()
        self._unreachable_since: dict[str, float] = {}  # run id -> when the backend first did not answer
        self._identity = self._first_row_hash()

    def _first_row_hash(self) -> str | None:
        """The campaign's identity: the hash of its first ledger row (a directory deleted and made
        again under a running broker is another campaign, whose runs this broker must not touch)."""
        try:
            with open(self.dir / LEDGER_FILE, "rb") as fh:
                return str(json.loads(fh.readline())["hash"])
        except (OSError, ValueError, KeyError):
            return None

    # --- the training image -----------------------------------------------------------------
    def _image_tree(self) -> FileTree | None:
        roots = self.spec.control.image_roots
        provider = getattr(self.backend, "image_tree", None)
        if callable(provider):
            return provider(self.spec)  # a backend with its own window into its image
        if roots:
            return FileTree([Root(n, (self.control.workdir / p).resolve()) for n, p in roots.items()])
        if self.spec.cluster.backend == "local":
            return FileTree([Root("workdir", self.control.workdir)])
        return None

    # --- launch -----------------------------------------------------------------------------
    def launch(self, request: LaunchRequest) -> dict[str, Any]:
        decision: Admission = self.control.admit(request)
        out = decision.as_dict()
        if not decision.admitted:
            return out
        return self._submit(decision, out)

    def _submit(self, decision: Admission, out: dict[str, Any]) -> dict[str, Any]:
        assert decision.job is not None and decision.run_id is not None
        job = decision.job
        spec = replace(job, exclude_nodes=tuple(decision.exclude_nodes))
        try:
            backend_id = self.backend.submit(spec)
        except BackendError as exc:
            result = self.control.finish(decision.run_id, JobFacts(state="infrastructure",
                                                                   reason=f"submission failed: {exc}"))
            out["submitted"] = False
            out["submit_error"] = str(exc)
            out["finished"] = result
            return out
        self.control.record_submitted(decision.run_id, self.backend.name, backend_id)
        out["submitted"] = True
        out["backend_id"] = backend_id
        return out

    # --- watching ---------------------------------------------------------------------------
    def _kill_record(self, run_id: str) -> dict[str, Any] | None:
        try:
            return json.loads((self.control.run_dir(run_id) / KILL_FILE).read_text())
        except (OSError, ValueError):
            return None

    def _mark_kill(self, run_id: str, why: str, detail: str) -> None:
        path = self.control.run_dir(run_id) / KILL_FILE
        if path.exists():
            return
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"killed_for": why, "reason": detail, "at": time.time()}) + "\n")
        os.replace(tmp, path)

    def log_progress(self, run: RunState, st: JobStatus | None) -> tuple[int, float | None]:
        """(log bytes, seconds since the log last grew, counted from the job's start)."""
        path = self.control.run_dir(run.run_id) / RUN_LOG
        started = (st.started_at if st else None) or run.started_at
        try:
            stat = path.stat()
            size, last = stat.st_size, stat.st_mtime
        except OSError:
            size, last = 0, None
        if started is None:
            return size, None
        ref = max(started, last) if last is not None else started
        return size, max(0.0, time.time() - ref)

    def poll(self) -> list[str]:
        """Advance every run in flight; returns what happened, for the broker's log."""
        events: list[str] = []
        if self._first_row_hash() != self._identity:
            return ["the campaign directory now holds another campaign: not watching it"]
        with self._lock:
            state = self.control.state()
            for run in state.in_flight:
                try:
                    events += self._poll_run(run)
                except Exception as exc:  # one bad run must not stop the watch of the others
                    log.exception("campaign %s: polling run %s failed", self.name, run.run_id)
                    events.append(f"{run.run_id}: poll error {exc}")
            try:
                events += self.advance_shipping()
            except Exception as exc:
                log.exception("campaign %s: shipping step failed", self.name)
                events.append(f"shipping error {exc}")
        return events

    def advance_shipping(self) -> list[str]:
        """After the stop: the control plane's shipping step (checks, ship, final re-measurement)."""
        from attune.control import shipper, shipping

        state = self.control.state()
        if not shipping.is_due(state) or state.in_flight:
            return []
        before = state.shipped
        decision = shipper.advance(self.control, self.backend)
        if decision is not None:
            out = self._submit(decision, decision.as_dict())
            return [f"shipping: {decision.kind} run {decision.run_id} submitted={out.get('submitted')}"]
        now = self.control.state()
        after = now.shipped
        if state.failed is None and now.failed is not None:
            return [f"shipping: the campaign failed ({now.failed.get('reason')})"]
        if before is None and after is not None:
            return [f"shipping: shipped {after.get('run_id')} ({after.get('reason')})"]
        return []

    def _poll_run(self, run: RunState) -> list[str]:
        if run.backend_id is None:
            admitted_for = time.time() - _row_time(self, run)
            if admitted_for > UNSUBMITTED_GRACE_S:
                self.control.finish(run.run_id, JobFacts(state="infrastructure",
                                                         reason="admitted but never submitted (the broker stopped?)"))
                return [f"{run.run_id}: lost before submission"]
            return []
        try:
            st = self.backend.status(run.backend_id)
        except BackendUnavailable as exc:
            since = self._unreachable_since.setdefault(run.run_id, time.time())
            if time.time() - since < self.spec.control.hang_timeout_s:
                return [f"{run.run_id}: backend unavailable, asking again ({exc})"]
            self.control.finish(run.run_id, JobFacts(state="infrastructure", reason=(
                f"the backend did not answer for {time.time() - since:.0f} s: {exc}")))
            return [f"{run.run_id}: lost with the backend"]
        except BackendError as exc:
            self.control.finish(run.run_id, JobFacts(state="infrastructure", reason=f"backend lost the job: {exc}"))
            return [f"{run.run_id}: lost by the backend"]
        self._unreachable_since.pop(run.run_id, None)
        events: list[str] = []
        if st.started_at is not None and run.status == "admitted":
            self.control.record_started(run.run_id, st.started_at, st.nodes)
            events.append(f"{run.run_id}: started on {','.join(st.nodes) or '?'}")
        if st.state.finished:
            events.append(self._finish(run, st))
            return events
        if st.state == JobState.RUNNING:
            _, idle = self.log_progress(run, st)
            limit = self.spec.control.hang_timeout_s
            if idle is not None and idle >= limit:
                detail = f"no log progress for {idle:.0f} s (limit {limit:g} s): killed by the broker's watchdog"
                return events + [self._kill(run, RunOutcome.HANG, detail, idle)]
            over = self._over_bound(run, st)
            if over is not None:
                return events + [self._kill(run, RunOutcome.OVERRUN, over, idle)]
            if run.prune_below is not None:
                partial = self.partial_throughput(run.run_id)
                if partial is not None and PRUNER.prune(partial, run.prune_below):
                    return events + [self._kill(run, RunOutcome.PRUNED, PRUNER.reason(partial, run.prune_below), idle)]
        return events

    def _clock(self) -> float:
        """Now, on the backend's clock (a simulated cluster keeps its own; the others, the wall clock)."""
        now = getattr(self.backend, "now", None)
        return float(now) if isinstance(now, (int, float)) else time.time()

    def _over_bound(self, run: RunState, st: JobStatus) -> str | None:
        """Why a running job must stop now: what it has used reached its charge bound (`charge_bound`)."""
        started = st.started_at if st.started_at is not None else run.started_at
        if started is None:
            return None
        bound = charge_bound(self.control.state(), run, self.spec.budget.overrun_factor)
        if bound is None:
            return None
        used = self.spec.cluster.gpus * max(0.0, self._clock() - started) / 3600.0
        if used < bound[0]:
            return None
        return (f"stopped by the monitor at its charge bound: used {used:.6g} GPU-h, bound {bound[0]:.6g} GPU-h "
                f"({bound[1]})")

    def _kill(self, run: RunState, why: str, detail: str, idle: float | None) -> str:
        assert run.backend_id is not None
        self._mark_kill(run.run_id, why, detail)
        self.backend.cancel(run.backend_id)
        st = self.backend.status(run.backend_id)
        return self._finish(run, st, idle=idle)

    def partial_throughput(self, run_id: str) -> tuple[float, int] | None:
        """(tokens/s/GPU over the measured steps logged so far, how many), for the early abort."""
        from attune.readers.metrics import MetricsInputError, get_parser

        path = self.control.run_dir(run_id) / RUN_LOG
        if not path.exists():
            return None
        try:
            parsed = get_parser(self.spec.framework).read(path)
        except (MetricsInputError, OSError):
            return None
        first, last = self.spec.workload.window
        times = {i: rec.step_time_ms for i, rec in parsed.steps.items()}
        return partial_throughput(times, (first, last), float(self.spec.workload.tokens), self.spec.cluster.gpus)

    def _finish(self, run: RunState, st: JobStatus, idle: float | None = None) -> str:
        kill = self._kill_record(run.run_id) or {}
        if idle is None:
            _, idle = self.log_progress(run, st)
        facts = JobFacts(
            state=st.state.value, started_at=st.started_at, ended_at=st.ended_at, exit_code=st.exit_code,
            nodes=list(st.nodes), killed_for=kill.get("killed_for"), reason=kill.get("reason") or st.reason,
            seconds_since_progress=idle,
        )
        result = self.control.finish(run.run_id, facts)
        return f"{run.run_id}: finished {result.get('outcome')} ({result.get('reason')})"

    def cancel(self, run_id: str, why: str = "cancelled") -> dict[str, Any]:
        """Stop a run now. `why`: cancelled (by the agent) or pruned (a tuner's early abort)."""
        if why not in STOPPED_OUTCOMES:
            raise FileAccessError("bad_request", f"reason must be cancelled or pruned, got {why!r}")
        with self._lock:
            state = self.control.state()
            run = state.runs.get(run_id)
            if run is None:
                raise NotFound(run_id)
            if run.status == "finished":
                return {"run_id": run_id, "cancelled": False, "reason": f"the run already finished ({run.outcome})"}
            if run.kind in ("check", "remeasure"):
                return {"run_id": run_id, "cancelled": False, "reason": (
                    f"{run_id} is a {run.kind} run of the control plane's shipping step; it cannot be cancelled")}
            self._mark_kill(run_id, why, "cancelled through the broker" if why == "cancelled"
                            else "stopped early by the tuner's early abort")
            if run.backend_id is not None:
                self.backend.cancel(run.backend_id)
                st = self.backend.status(run.backend_id)
                self._finish(run, st)
            else:
                self.control.finish(run_id, JobFacts(state="cancelled", killed_for=why,
                                                     reason="cancelled before submission"))
            run = self.control.state().runs[run_id]
            return {"run_id": run_id, "cancelled": True, "outcome": run.outcome,
                    "charge_gpu_hours": run.charge_gpu_hours}

    # --- reading ----------------------------------------------------------------------------
    def state(self) -> CampaignState:
        return self.control.state()

    def run(self, run_id: str) -> RunState:
        run = self.state().runs.get(run_id)
        if run is None:
            raise NotFound(run_id)
        return run

    def run_summary(self, run: RunState, live: bool = False) -> dict[str, Any]:
        out = {k: v for k, v in asdict(run).items() if k not in ("code_locations", "admitted_seq", "admitted_ts", "finished_seq")}
        if live and run.status != "finished":
            st: JobStatus | None = None
            if run.backend_id is not None:
                try:
                    st = self.backend.status(run.backend_id)
                except BackendError:
                    st = None
            size, idle = self.log_progress(run, st)
            out["backend_state"] = st.state.value if st else None
            out["log_bytes"] = size
            out["seconds_since_log_progress"] = None if idle is None else round(idle, 1)
            out["hang_timeout_s"] = self.spec.control.hang_timeout_s
        return out

    def run_file(self, run_id: str, rel: str) -> tuple[Path, str]:
        self.run(run_id)
        run_dir = self.control.run_dir(run_id)
        tree = FileTree([Root(run_id, run_dir)])
        _, real, shown = tree.locate(rel)
        return real, shown

    def read_log(self, run_id: str, tail: int | None, offset_line: int | None, max_lines: int) -> dict[str, Any]:
        real, shown = self.run_file(run_id, RUN_LOG)
        if not real.exists():
            return {"path": shown, "size_bytes": 0, "lines": [], "note": "the job has not written a log yet"}
        if offset_line is not None:
            return read_lines(real, offset_line, max_lines, shown_as=shown)
        return tail_lines(real, tail or 50, shown_as=shown)

    def search_log(self, run_id: str, pattern: str, max_results: int, regex: bool = True,
                   ignore_case: bool = False) -> dict[str, Any]:
        real, shown = self.run_file(run_id, RUN_LOG)
        rx = compile_pattern(pattern, regex=regex, ignore_case=ignore_case)
        if not real.exists():
            return {"pattern": pattern, "matches": [], "truncated": False, "note": "no log yet"}
        found, resume = search_file(real, rx, max(1, min(max_results, 200)), shown_as=shown)
        return {"pattern": pattern, "matches": found, "truncated": resume is not None, "resume_line": resume}

    def list_files(self, run_id: str) -> dict[str, Any]:
        self.run(run_id)
        tree = FileTree([Root(run_id, self.control.run_dir(run_id))])
        return tree.list("")

    def read_file(self, run_id: str, rel: str, offset_line: int, max_lines: int) -> dict[str, Any]:
        self.run(run_id)
        tree = FileTree([Root(run_id, self.control.run_dir(run_id))])
        return tree.read(rel, offset_line, max_lines)

    # --- records ----------------------------------------------------------------------------
    def assumption(self, question: str, default: str, context: str | None) -> dict[str, Any]:
        row = record_assumption(self.dir, question, default, context)
        return {"recorded": True, "seq": row.seq}

    def stop(self, levers_tested: list[str], diagnosis: str, leader: str | None) -> dict[str, Any]:
        row = record_stop(self.dir, levers_tested, diagnosis, leader)
        return {"recorded": True, "seq": row.seq, "leader": row.data["leader"]}


def _row_time(handle: CampaignHandle, run: RunState) -> float:
    """Epoch seconds of a run's admission row."""
    from datetime import datetime

    if run.admitted_ts is not None:
        return datetime.fromisoformat(run.admitted_ts).timestamp()
    return time.time()


__all__ = ["CampaignHandle", "FileAccessError", "NotFound"]
