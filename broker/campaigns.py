"""One campaign as the broker serves it: transport to its backend, and its files.

The control plane owns each run from admission to its final row (`attune.control.lifecycle.Lifecycle`);
this handle is its transport. `launch` asks the lifecycle to admit a request and submits the admitted
job to the backend; `poll` (called by the broker's monitor) observes every run in flight on the backend
and hands each observation to the lifecycle's one entry point, `on_backend_event`, which records starts,
kills hangs and pruned runs (the broker then cancels the job), and finishes runs that ended; then it
submits the shipping step's next run, if any. `cancel` asks the lifecycle, then stops the job.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from attune.control.campaign import record_assumption, record_stop
from attune.control.lifecycle import EventKind, Lifecycle, Reaction, RunEvent
from attune.control.plane import Control, LaunchAnswer, LaunchRequest
from attune.core.campaign_paths import LEDGER_FILE, RUN_LOG
from attune.core.errors import BrokerError
from attune.core.state import CampaignState, RunState
from attune.core.vocab import STOPPED_OUTCOMES
from broker.backends import get_backend
from broker.backends.base import Backend, BackendError, BackendUnavailable, JobStatus
from broker.files import FileAccessError, FileTree, Root, compile_pattern, read_lines, search_file, tail_lines

log = logging.getLogger("attune.broker")


class NotFound(BrokerError):
    """No such run (or file) in this campaign."""


class CampaignHandle:
    """The broker's view of one campaign."""

    def __init__(self, campaign_dir: Path | str, backend: Backend | None = None) -> None:
        self.control = Control(campaign_dir)
        self.dir = self.control.dir
        self.spec = self.control.spec
        self.name = self.spec.name
        self.backend: Backend = backend or get_backend(self.spec.cluster.backend, self.spec.cluster.backend_settings())
        self.lifecycle = Lifecycle(self.control, self.backend)
        self.image = self._image_tree()
        self._lock = threading.RLock()
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
    def admit(self, request: LaunchRequest | dict[str, Any]) -> LaunchAnswer:
        """The control plane's answer to a launch request; an admitted run is submitted to the backend."""
        decision = self.lifecycle.admit(request)
        return self._submit(decision) if decision.admitted else decision

    def launch(self, request: LaunchRequest | dict[str, Any]) -> dict[str, Any]:
        """`admit`, as the wire carries the answer (JSON)."""
        return self.admit(request).model_dump(mode="json", exclude_unset=True)

    def _submit(self, decision: LaunchAnswer) -> LaunchAnswer:
        assert decision.job is not None and decision.run_id is not None
        try:
            backend_id = self.backend.submit(decision.job)
        except BackendError as exc:
            done = self.lifecycle.on_backend_event(decision.run_id, RunEvent(EventKind.SUBMIT_FAILED, reason=str(exc)))
            decision.submitted, decision.submit_error, decision.finished = False, str(exc), done.finished
            return decision
        self.lifecycle.on_backend_event(decision.run_id, RunEvent(EventKind.SUBMITTED, backend=self.backend.name,
                                                                  backend_id=backend_id))
        decision.submitted, decision.backend_id = True, backend_id
        return decision

    # --- watching ---------------------------------------------------------------------------
    def observe(self, run: RunState) -> RunEvent:
        """What the backend says of a run now, as the lifecycle takes it."""
        if run.backend_id is None:
            return RunEvent(EventKind.NOT_SUBMITTED)
        try:
            st = self.backend.status(run.backend_id)
        except BackendUnavailable as exc:
            return RunEvent(EventKind.UNREACHABLE, reason=str(exc))
        except BackendError as exc:
            return RunEvent(EventKind.LOST, reason=str(exc))
        return RunEvent(EventKind.STATUS, state=st.state.value, started_at=st.started_at, ended_at=st.ended_at,
                        exit_code=st.exit_code, nodes=tuple(st.nodes), reason=st.reason, now=self._clock())

    def _clock(self) -> float:
        """Now, on the backend's clock (a simulated cluster keeps its own; the others, the wall clock)."""
        now = getattr(self.backend, "now", None)
        return float(now) if isinstance(now, (int, float)) else time.time()

    def _report(self, run: RunState) -> Reaction:
        """Hand the backend's view of a run to the lifecycle; stop the job when it says so, and report again."""
        reaction = self.lifecycle.on_backend_event(run.run_id, self.observe(run))
        if reaction.cancel:
            assert run.backend_id is not None
            self.backend.cancel(run.backend_id)
            reaction = reaction.then(self.lifecycle.on_backend_event(run.run_id, self.observe(run)))
        return reaction

    def poll(self) -> list[str]:
        """Advance every run in flight, then shipping; returns what happened, for the broker's log."""
        events: list[str] = []
        if self._first_row_hash() != self._identity:
            return ["the campaign directory now holds another campaign: not watching it"]
        with self._lock:
            for run in self.lifecycle.in_flight():
                try:
                    events += self._report(run).notes
                except Exception as exc:  # one bad run must not stop the watch of the others
                    log.exception("campaign %s: polling run %s failed", self.name, run.run_id)
                    events.append(f"{run.run_id}: poll error {exc}")
            try:
                decision, notes = self.lifecycle.shipping_step()
                if decision is not None:
                    self._submit(decision)
                    notes = [f"shipping: {decision.kind} run {decision.run_id} submitted={decision.submitted}"]
                events += notes
            except Exception as exc:
                log.exception("campaign %s: shipping step failed", self.name)
                events.append(f"shipping error {exc}")
        return events

    def cancel(self, run_id: str, why: str = "cancelled") -> dict[str, Any]:
        """Stop a run now. `why`: cancelled (by the agent) or pruned (a tuner's early abort)."""
        if why not in STOPPED_OUTCOMES:
            raise FileAccessError("bad_request", f"reason must be cancelled or pruned, got {why!r}")
        with self._lock:
            run = self.run(run_id)
            answer = self.lifecycle.stop(run, why)
            if answer.refused is not None:
                return {"run_id": run_id, "cancelled": False, "reason": answer.refused}
            if answer.cancel:
                assert run.backend_id is not None
                self.backend.cancel(run.backend_id)
                self.lifecycle.on_backend_event(run_id, self.observe(run))
            run = self.run(run_id)
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
            size, idle = self.lifecycle.log_progress(run, st.started_at if st else None)
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


__all__ = ["CampaignHandle", "FileAccessError", "NotFound"]
