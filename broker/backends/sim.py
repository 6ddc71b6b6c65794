"""The sim backend: a simulated GPU cluster at Megatron scale, for testing and evaluating tuners.

It is a test bed and evaluation harness, not a claim about real GPUs. A cluster of `nodes` nodes of
`gpus_per_node` GPUs of one accelerator (H100, H200, B200) runs Megatron-LM jobs on a simulated
clock: `attune.sim` predicts each job's outcome (runs, out of memory, hangs, crashes), its step times
(with run-to-run noise) and its loss curve, and the backend writes the job's Megatron-LM log (and,
for profiled runs, Kineto traces) into its run directory as the clock passes each line.

The clock. Time is simulated and advances only through the backend: `status` of a job that has not
finished moves the clock to the next event of any job (a start, a logged step, an end), so a caller
that polls until its job is done sees every step of it go by, in milliseconds of wall time;
`advance(seconds)`, `advance_to(epoch)` and `wait(backend_id)` move it explicitly. Jobs queue (in
submission order, a later job may start first when it fits) while the cluster lacks free nodes;
queueing is never charged.

Charging. `started_at` is the moment a job gets its nodes and `ended_at` the moment it releases
them, both on the simulated clock (epoch seconds from `epoch`): the broker charges GPUs x (ended_at -
started_at), start-up included, failures included. Infrastructure faults strike at
`infra_fault_rate` node failures per node-hour; such a job ends in the `infrastructure` state with a
node-failure line in its log, and a retry with `exclude_nodes` runs elsewhere.
"""

from __future__ import annotations

import bisect
import itertools
import shlex
import threading
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from attune.sim.run import RunPlan, SimSettings, plan_run
from broker.backends.base import BackendError, JobSpec, JobState, JobStatus, env_name_problem, shell_comment

_STATES = {
    "completed": JobState.COMPLETED,
    "failed": JobState.FAILED,
    "timeout": JobState.TIMEOUT,
    "infrastructure": JobState.INFRASTRUCTURE,
}


@dataclass
class _Job:
    spec: JobSpec
    backend_id: str
    submitted_at: float
    nodes_needed: int
    state: JobState = JobState.PENDING
    nodes: list[str] = field(default_factory=list)
    started_at: float | None = None
    ended_at: float | None = None
    plan: RunPlan | None = None
    written: int = 0  # lines of the plan already in the log
    traces_written: bool = False
    reason: str | None = None
    exit_code: int | None = None
    cancelled: bool = False


class SimBackend:
    """A simulated cluster behind the Backend protocol (see the module doc)."""

    name = "sim"

    def __init__(self, **settings: Any) -> None:
        try:
            self.settings = SimSettings(**settings)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(settings)'}: {e['msg']}" for e in exc.errors())
            raise BackendError(f"sim backend settings: {problems}") from None
        self.now = self.settings.epoch
        self._lock = threading.RLock()
        self._jobs: dict[str, _Job] = {}
        self._order: list[str] = []  # submission order
        self._ids = itertools.count(1)
        n = self.settings.nodes
        self._node_names = [f"sim-node-{i:03d}" for i in range(n)] if n else []
        self._busy: set[str] = set()
        self._fresh = itertools.count()  # node names for an unbounded cluster

    # ------------------------------------------------------------------ the protocol
    def submit(self, spec: JobSpec) -> str:
        with self._lock:
            if spec.gpus <= 0:
                raise BackendError(f"job {spec.job_id}: gpus must be positive")
            if spec.gpus_per_node != self.settings.gpus_per_node:
                raise BackendError(
                    f"job {spec.job_id}: gpus_per_node {spec.gpus_per_node} does not match the simulated "
                    f"cluster's {self.settings.gpus_per_node}"
                )
            need = spec.nodes
            excluded = set(getattr(spec, "exclude_nodes", ()) or ())
            if self.settings.nodes is not None and need > self.settings.nodes - len(excluded & set(self._node_names)):
                raise BackendError(
                    f"job {spec.job_id}: needs {need} node(s); the simulated cluster has {self.settings.nodes}"
                    + (f" ({len(excluded)} excluded)" if excluded else "")
                )
            bid = f"sim-{next(self._ids):06d}"
            job = _Job(spec=spec, backend_id=bid, submitted_at=self.now, nodes_needed=need)
            self._jobs[bid] = job
            self._order.append(bid)
            spec.run_dir.mkdir(parents=True, exist_ok=True)
            spec.log_path.write_text("", encoding="utf-8")
            self._schedule(self.now)
            return bid

    def status(self, backend_id: str) -> JobStatus:
        with self._lock:
            job = self._job(backend_id)
            if not job.state.finished:
                nxt = self._next_event()
                if nxt is not None:
                    self._advance_to(max(nxt, self.now))
            return self._status(job)

    def cancel(self, backend_id: str) -> None:
        with self._lock:
            job = self._job(backend_id)
            if job.state.finished:
                return
            job.cancelled = True
            if job.state == JobState.RUNNING:
                self._flush(job, self.now)
                self._append(job, [f"[sim] job cancelled at {self.now:.1f} (simulated clock)"])
                self._release(job, self.now, JobState.CANCELLED, None, "cancelled")
            else:
                job.state = JobState.CANCELLED
                job.ended_at = None
                job.reason = "cancelled while queued"
            self._schedule(self.now)

    def render(self, spec: JobSpec) -> str:
        from attune.sim.recipe import shell_line

        s = self.settings
        for k in spec.env:
            if env_name_problem(k):
                raise BackendError(f"job {spec.job_id}: {env_name_problem(k)}")
        return "\n".join([
            "#!/bin/bash",
            shell_comment(f"attune sim backend: a SIMULATED cluster of {s.nodes or 'unbounded'} node(s) x "
                          f"{s.gpus_per_node} {s.accelerator} (a test bed, not real GPUs)."),
            shell_comment(f"model {s.model}; job {spec.job_id} of campaign {spec.campaign}; {spec.gpus} GPUs on "
                          f"{spec.nodes} node(s)."),
            "# The simulator reads this command line, predicts the run and writes its Megatron-LM log to",
            shell_comment(f"{spec.log_path}. On a real cluster the same command would be (in the run directory):"),
            f"cd {shlex.quote(str(spec.run_dir))} || exit 97",
            *(f"export {k}={shlex.quote(str(v))}" for k, v in sorted(spec.env.items())),
            shell_line(list(spec.argv)),
            "",
        ])

    # ------------------------------------------------------------------ the clock
    def advance(self, seconds: float) -> float:
        """Move the simulated clock forward; returns the new time (epoch seconds)."""
        if seconds < 0:
            raise BackendError("the simulated clock only moves forward")
        with self._lock:
            self._advance_to(self.now + seconds)
            return self.now

    def advance_to(self, epoch: float) -> float:
        with self._lock:
            if epoch > self.now:
                self._advance_to(epoch)
            return self.now

    def wait(self, backend_id: str) -> JobStatus:
        """Run the clock until the job has finished; returns its final status."""
        with self._lock:
            job = self._job(backend_id)
            while not job.state.finished:
                nxt = self._next_event()
                if nxt is None:
                    raise BackendError(f"{backend_id}: can never start (not enough nodes)")
                self._advance_to(max(nxt, self.now))
            return self._status(job)

    def run_until_idle(self) -> float:
        with self._lock:
            while (nxt := self._next_event()) is not None:
                self._advance_to(max(nxt, self.now))
            return self.now

    def plan(self, backend_id: str) -> RunPlan | None:
        """What the simulator decided for a started job (for tests and evaluation tools)."""
        with self._lock:
            return self._job(backend_id).plan

    def in_flight(self) -> int:
        with self._lock:
            return sum(1 for j in self._jobs.values() if not j.state.finished)

    # ------------------------------------------------------------------ internals
    def _job(self, backend_id: str) -> _Job:
        job = self._jobs.get(backend_id)
        if job is None:
            raise BackendError(f"unknown sim job {backend_id!r}")
        return job

    def _status(self, job: _Job) -> JobStatus:
        return JobStatus(
            job_id=job.spec.job_id,
            backend_id=job.backend_id,
            state=job.state,
            started_at=job.started_at,
            ended_at=job.ended_at,
            exit_code=job.exit_code,
            nodes=list(job.nodes),
            reason=job.reason,
        )

    def _free_nodes(self, excluded: set[str]) -> list[str]:
        return [n for n in self._node_names if n not in self._busy and n not in excluded]

    def _schedule(self, t: float) -> None:
        """Start every queued job that fits, in submission order (a small job may pass a big one)."""
        for bid in self._order:
            job = self._jobs[bid]
            if job.state != JobState.PENDING:
                continue
            excluded = set(getattr(job.spec, "exclude_nodes", ()) or ())
            if self.settings.nodes is None:
                nodes = [f"sim-node-{next(self._fresh):03d}" for _ in range(job.nodes_needed)]
            else:
                free = self._free_nodes(excluded)
                if len(free) < job.nodes_needed:
                    continue
                nodes = free[: job.nodes_needed]
            self._start(job, nodes, t)

    def _start(self, job: _Job, nodes: list[str], t: float) -> None:
        job.nodes = nodes
        self._busy.update(nodes)
        job.started_at = t
        job.state = JobState.RUNNING
        spec = job.spec
        job.plan = plan_run(
            self.settings, f"{spec.campaign}/{spec.job_id}", list(spec.argv), spec.env, spec.gpus, t, nodes,
            spec.time_limit_s,
        )
        self._flush(job, t)

    def _flush(self, job: _Job, t: float) -> None:
        """Write the plan's lines up to time t into the log."""
        plan = job.plan
        if plan is None or job.started_at is None:
            return
        upto = t - job.started_at + 1e-6  # absolute times lose the last bits of the relative ones
        times = [tt for tt, _ in plan.lines]
        end = bisect.bisect_right(times, upto)
        if end > job.written:
            self._append(job, [line for _, line in plan.lines[job.written:end]])
            job.written = end
        if plan.write_traces is not None and not job.traces_written and plan.trace_at_s is not None \
                and upto >= plan.trace_at_s:
            plan.write_traces(job.spec.run_dir)
            job.traces_written = True

    def _append(self, job: _Job, lines: list[str]) -> None:
        with open(job.spec.log_path, "a", encoding="utf-8") as fh:
            fh.write("".join(line + "\n" for line in lines))

    def _release(self, job: _Job, t: float, state: JobState, exit_code: int | None, reason: str | None) -> None:
        job.state = state
        job.ended_at = t
        job.exit_code = exit_code
        job.reason = reason
        self._busy.difference_update(job.nodes)

    def _next_event(self) -> float | None:
        best: float | None = None
        for job in self._jobs.values():
            if job.state != JobState.RUNNING or job.plan is None or job.started_at is None:
                continue
            plan = job.plan
            cand = job.started_at + plan.duration_s
            if job.written < len(plan.lines):
                cand = min(cand, job.started_at + plan.lines[job.written][0])
            if best is None or cand < best:
                best = cand
        return best

    def _advance_to(self, t: float) -> None:
        while True:
            # finish every running job that ends by t, in time order, starting queued ones as nodes free up
            ending = [(j.started_at + j.plan.duration_s, j.backend_id) for j in self._jobs.values()
                      if j.state == JobState.RUNNING and j.plan is not None and j.started_at is not None
                      and j.started_at + j.plan.duration_s <= t]
            if not ending:
                break
            end_t, bid = min(ending)
            job = self._jobs[bid]
            self._flush(job, end_t)
            plan = job.plan
            assert plan is not None
            if plan.write_traces is not None and not job.traces_written and plan.trace_at_s is not None:
                plan.write_traces(job.spec.run_dir)
                job.traces_written = True
            self._release(job, end_t, _STATES[plan.state], plan.exit_code, None if plan.state == "completed"
                          else plan.reason)
            self.now = max(self.now, end_t)
            self._schedule(end_t)
        for job in self._jobs.values():
            if job.state == JobState.RUNNING:
                self._flush(job, t)
        self.now = max(self.now, t)

