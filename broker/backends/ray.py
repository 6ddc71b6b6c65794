"""The Ray backend: one Ray job per run, through the Ray Jobs API (the official `JobSubmissionClient`).

`render(spec)` writes the job's script (`<run_dir>/job.ray.sh`, a plain bash script a person can read and
submit by hand with `ray job submit`); `submit` sends that script as the entrypoint of a Ray job whose
submission id is derived from the campaign and run id (`<prefix>-<campaign>-<run>`), asking for the job's
CPUs / GPUs / memory / custom resources as the entrypoint's resources, with the campaign's runtime
environment (`cluster.ray.runtime_env`, an allowlist of runtime_env fields); the job's own environment
(the baseline's, the stack fixes', a candidate's allowlisted changes) is exported by the script.
A multi-node job's script is a driver instead (broker/backends/ray_launch.py): it holds one
placement-group bundle per node and runs the node script on each.

Status comes from the Jobs API: PENDING (queued, or its runtime environment being set up: never
charged), RUNNING, SUCCEEDED, FAILED, STOPPED. Charging starts when the script itself starts: its first
line, `attune-ray: job started <epoch> ...`, is the moment the job began running on its node (Ray's own
`start_time` is the submission); it ends at Ray's `end_time`. The driver's log is copied into
`<run_dir>/log.txt` as it grows, at every status call (the broker polls every `control.poll_interval_s`),
so the log reader, the hang watchdog and the agent see it without a shared filesystem.

Infrastructure failures: the job's supervisor (Ray's driver-side actor) lost or never started, its
runtime environment not set up, the script killed by a signal from outside, or the job stopped by
someone other than the broker. The broker retries such a run once, on other nodes: `exclude_nodes`
becomes the label selector `ray.io/node-id: !in(...)`.

A restarted broker adopts its jobs: the submission id is all it needs; the run directory is found from
the job's metadata. Submitting a run whose submission id already exists adopts the running job when it
is the same job (same script); a finished job of an earlier incarnation of the run keeps its id, and the
new one gets the next free `<id>-2`, `<id>-3`, ... (Ray ids are never reused).
See docs/ray.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shlex
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from attune.control.spec import RayCluster
from attune.core.campaign_paths import RUN_LOG
from broker.backends.base import (
    BackendError,
    BackendUnavailable,
    JobSpec,
    JobState,
    JobStatus,
    env_name_problem,
    shell_comment,
)

SCRIPT_FILE = "job.ray.sh"
META_FILE = "ray_job.json"
SCRIPT_ENV = "ATTUNE_RAY_JOB_SCRIPT"
START_MARK = "attune-ray: job started "
NODES_MARK = "attune-ray: nodes "
LAUNCHER_EOF = "ATTUNE_RAY_LAUNCHER_END"
# The entrypoint Ray runs (with a shell): the script travels in the job's runtime environment (never on a
# command line, where every user of the node would see it and the secrets it exports), is written to a
# private file (mode 0600, mktemp) and run from there; the variable is unset before the job starts.
ENTRYPOINT = (f'umask 077 && f=$(mktemp "${{TMPDIR:-/tmp}}/attune-job.XXXXXXXX") && '
              f'printf "%s" "${SCRIPT_ENV}" >"$f" && unset {SCRIPT_ENV} && exec 3<"$f" && rm -f "$f" && '
              'exec bash /dev/fd/3')
MAX_SCRIPT_BYTES = 100_000  # one environment string (Linux allows 128 KiB)
LOG_SYNC_INTERVAL_S = 1.0
NODE_LABEL = "ray.io/node-id"
MAX_ID_ATTEMPTS = 20
RECONCILE_MIN_S = 10.0  # after a submit error, how long at least to look for the job under its id

# Ray's error types that are not the job's own doing (the entrypoint never ran, or Ray lost it).
_INFRA_ERRORS = {
    "RUNTIME_ENV_SETUP_FAILURE",
    "JOB_SUPERVISOR_ACTOR_START_TIMEOUT",
    "JOB_SUPERVISOR_ACTOR_START_FAILURE",
    "JOB_SUPERVISOR_ACTOR_UNSCHEDULABLE",
    "JOB_SUPERVISOR_ACTOR_UNKNOWN_FAILURE",
    "JOB_SUPERVISOR_ACTOR_DIED",
    "JOB_ENTRYPOINT_COMMAND_START_ERROR",
}
_SUBMISSION_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
_NODE_ID = re.compile(r"^[0-9a-f]{8,64}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_START_LINE = re.compile(r"(?m)^" + re.escape(START_MARK) + r"([0-9]+(?:\.[0-9]+)?)")
_NODES_LINE = re.compile(r"(?m)^" + re.escape(NODES_MARK) + r"([0-9a-f,]+)$")


@dataclass
class _Job:
    job_id: str
    run_dir: Path
    submitted_at: float
    time_limit_s: float | None = None
    started_at: float | None = None  # from the script's first line
    first_running_seen: float | None = None  # fallback when the log cannot be read
    log_bytes: int = 0
    last_log_sync: float = 0.0
    log_sync_interval_s: float = LOG_SYNC_INTERVAL_S
    cancel_requested: bool = False
    cancelled_pending_at: float | None = None  # cancelled while queued: never ran, for the broker
    timed_out: bool = False
    node_count: int = 1
    nodes: list[str] = field(default_factory=list)  # a multi-node job's nodes, from its driver's first lines


def submission_id(prefix: str, campaign: str, job_id: str) -> str:
    """The Ray submission id of a run: `<prefix>-<campaign>-<run>`, made safe (and unique) where needed."""
    raw = f"{prefix}-{campaign}-{job_id}"
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", raw)
    if safe != raw or len(safe) > 100:
        digest = hashlib.sha256(f"{campaign}\0{job_id}".encode()).hexdigest()[:10]
        safe = f"{safe[:88]}-{digest}"
    return safe


class RayBackend:
    """Runs jobs on a Ray cluster through its Jobs API. Construct with the campaign's `cluster.ray`."""

    name = "ray"

    def __init__(self, **settings: Any) -> None:
        try:
            self.settings = RayCluster(**settings)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'settings'}: {e['msg']}" for e in exc.errors()
            )
            raise BackendError(f"invalid ray settings: {problems}") from None
        self._client: Any = None
        self._jobs: dict[str, _Job] = {}
        self._lock = threading.RLock()

    # ---- the Jobs API client -----------------------------------------------------------------------

    def client(self) -> Any:
        """The Jobs API client, connected on first use (a clear BackendError when the cluster is away)."""
        if self._client is not None:
            return self._client
        try:
            from ray.job_submission import JobSubmissionClient
        except ImportError as exc:
            raise BackendError(
                f"the ray backend needs Ray's job client: pip install 'attune[ray]' ({exc})"
            ) from None
        timeout = self.settings.request_timeout_s

        class _Client(JobSubmissionClient):  # type: ignore[misc, valid-type]
            # Every request with a timeout: a cluster that stops answering must not hang the broker.
            def _do_request(self, method: str, endpoint: str, **kwargs: Any) -> Any:
                kwargs.setdefault("timeout", timeout)
                return super()._do_request(method, endpoint, **kwargs)

        try:
            self._client = _Client(self.settings.address)
        except Exception as exc:
            raise BackendUnavailable(
                f"cannot reach the Ray cluster at {self.settings.address} (its dashboard / Jobs API): "
                f"{_one_line(exc)}"
            ) from None
        return self._client

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except BackendError:
            raise
        except Exception as exc:
            cls = BackendUnavailable if _unreachable(exc) else BackendError
            raise cls(f"Ray Jobs API at {self.settings.address}: {what} failed: {_one_line(exc)}") from None

    # ---- render ------------------------------------------------------------------------------------

    def bundle(self, spec: JobSpec) -> dict[str, float]:
        """What the job needs on each of its nodes, as Ray resources."""
        s = self.settings
        per_node = spec.gpus // spec.nodes
        cpus = s.cpus_per_job if s.cpus_per_job is not None else (per_node if s.gpu_request == "none" else 1)
        out: dict[str, float] = {"CPU": float(cpus)}
        if s.gpu_request == "gpus":
            out["GPU"] = float(per_node)
        if s.memory_gb is not None:
            out["memory"] = float(int(s.memory_gb * 1024**3))
        out.update({k: float(v) for k, v in s.resources.items()})
        return out

    def selector(self, spec: JobSpec) -> dict[str, str]:
        """The label selector of the job's node(s): the campaign's, and the nodes a retry avoids."""
        selector = dict(self.settings.label_selector)
        if spec.exclude_nodes:
            bad = [n for n in spec.exclude_nodes if not _NODE_ID.match(n)]
            if bad:
                raise BackendError(f"job {spec.job_id}: cannot exclude {bad}: not Ray node ids")
            # The retry of an infrastructure failure runs on other nodes.
            selector[NODE_LABEL] = f"!in({','.join(spec.exclude_nodes)})"
        return selector

    def resources(self, spec: JobSpec) -> dict[str, Any]:
        """What the job's entrypoint asks the cluster for (the arguments of submit_job). A multi-node job's
        entrypoint is its driver, which asks for nothing: its nodes are a placement group (see ray_launch)."""
        if spec.nodes > 1:
            self.selector(spec)  # refuse bad exclusions here too
            return {}
        b = self.bundle(spec)
        out: dict[str, Any] = {"entrypoint_num_cpus": _num(b.pop("CPU"))}
        if "GPU" in b:
            out["entrypoint_num_gpus"] = _num(b.pop("GPU"))
        if "memory" in b:
            out["entrypoint_memory"] = int(b.pop("memory"))
        if b:
            out["entrypoint_resources"] = b
        selector = self.selector(spec)
        if selector:
            out["entrypoint_label_selector"] = selector
        return out

    def render(self, spec: JobSpec) -> str:
        if not spec.argv:
            raise BackendError(f"job {spec.job_id}: empty command (argv)")
        for key in spec.env:
            if not _ENV_NAME.match(key):
                raise BackendError(f"job {spec.job_id}: env name {key!r} is not a valid variable name")
        if spec.image is not None and spec.image != self.settings.runtime_env.image_uri:
            raise BackendError(
                f"job {spec.job_id} asks for container image {spec.image!r}: on the ray backend the image is "
                "the campaign's cluster.ray.runtime_env.image_uri"
            )
        res = self.resources(spec)
        q = shlex.quote
        run_dir = spec.run_dir.resolve()
        sid = submission_id(self.settings.submission_id_prefix, spec.campaign, spec.job_id)
        units = "CPU ranks" if self.settings.gpu_request == "none" else "GPUs"
        flags = [f"--address {q(self.settings.address)}", f"--submission-id {q(sid)}"]
        flag_names = {"entrypoint_num_cpus": "--entrypoint-num-cpus", "entrypoint_num_gpus": "--entrypoint-num-gpus",
                      "entrypoint_memory": "--entrypoint-memory"}
        flags += [f"{flag_names[k]} {v:g}" for k, v in res.items() if k in flag_names]
        if "entrypoint_resources" in res:
            flags.append(f"--entrypoint-resources {q(json.dumps(res['entrypoint_resources']))}")
        if "entrypoint_label_selector" in res:
            flags.append(f"--entrypoint-label-selector {q(json.dumps(res['entrypoint_label_selector']))}")
        runtime_env = self.settings.runtime_env.as_ray()
        if runtime_env:
            flags.append(f"--runtime-env-json {q(json.dumps(runtime_env, sort_keys=True))}")
        where = "one node" if spec.nodes == 1 else f"{spec.nodes} nodes ({spec.gpus // spec.nodes} per node)"
        head = [
            "#!/bin/bash",
            shell_comment(f"attune job {spec.job_id} of campaign {spec.campaign}: {spec.gpus} {units} on {where} of "
                          f"the Ray cluster at {self.settings.address}."),
            "# Generated by broker.backends.ray; the broker submits it as the job's entrypoint. By hand:",
            shell_comment(f"  ray job submit {' '.join(flags)} -- bash {q(str(run_dir / SCRIPT_FILE))}"),
        ]
        body = [
            "# The job's environment, on top of the node's and the campaign's runtime_env.",
            *(f"export {k}={q(str(v))}" for k, v in sorted(spec.env.items())),
            f"mkdir -p {q(str(run_dir))} 2>/dev/null || true",
        ]
        for k in spec.env:
            if env_name_problem(k):
                raise BackendError(f"job {spec.job_id}: {env_name_problem(k)}")
        if self.settings.runtime_env.working_dir is None:
            # The job works in its own run directory, never the code's or the campaign's.
            body.append(f"cd {q(str(run_dir))} || {{ echo 'attune: cannot enter the run directory' >&2; exit 97; }}")
        else:
            body.append("# The job starts in the runtime environment's working_dir (an uploaded copy of the code).")
        body += [
            # Not exec: a command killed by a signal is the job's failure (exit 128+n); the script itself
            # killed by a signal is the infrastructure's (or someone's outside the broker).
            " ".join(q(a) for a in spec.argv),
            'exit "$?"',
        ]
        if spec.nodes == 1:
            lines = [
                *head,
                "# The first line marks the moment the job runs (charging starts here; the queue is never charged).",
                f'echo "{START_MARK}$(date +%s.%N) pid $$ on $(hostname)"',
                "",
                *body,
                "",
            ]
        else:
            launch = {"nodes": spec.nodes, "bundle": self.bundle(spec), "strategy": self.settings.placement_strategy,
                      "selector": self.selector(spec), "node_script": "\n".join(["#!/bin/bash", *body, ""])}
            lines = [
                *head,
                f"# A {spec.nodes}-node job: this script is its driver. It holds one placement-group bundle per node",
                f"# ({self.settings.placement_strategy}), prints the nodes and the start line (charging starts when every",
                "# node is held), and runs the node script (in ATTUNE_RAY_LAUNCH) on each node with NODE_RANK, NNODES,",
                "# MASTER_ADDR, MASTER_PORT (and torchrun's PET_* forms).",
                f"export ATTUNE_RAY_LAUNCH={q(json.dumps(launch, sort_keys=True))}",
                f"exec python - <<'{LAUNCHER_EOF}'",
                _launcher_source().rstrip("\n"),
                LAUNCHER_EOF,
                "",
            ]
        text = "\n".join(lines)
        if len(text.encode()) > MAX_SCRIPT_BYTES:
            raise BackendError(f"job {spec.job_id}: its script is over {MAX_SCRIPT_BYTES} bytes")
        return text

    # ---- submit / status / cancel ------------------------------------------------------------------

    def submit(self, spec: JobSpec) -> str:
        self.client()  # an unreachable cluster is named first, before its state API is asked anything
        spec = self.placeable(spec)
        script = self.render(spec)
        res = self.resources(spec)
        run_dir = spec.run_dir.resolve()
        base_sid = submission_id(self.settings.submission_id_prefix, spec.campaign, spec.job_id)
        digest = hashlib.sha256(script.encode()).hexdigest()
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            path = run_dir / SCRIPT_FILE
            # Private: the script exports the job's environment (secrets included).
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(script)
            path.chmod(0o600)
        except OSError as exc:
            raise BackendError(f"job {spec.job_id}: cannot write {run_dir / SCRIPT_FILE}: {exc}") from None
        client = self.client()
        metadata = {"attune_campaign": spec.campaign, "attune_run": spec.job_id, "attune_run_dir": str(run_dir),
                    "attune_script_sha256": digest}
        runtime_env = self.settings.runtime_env.as_ray()
        runtime_env["env_vars"] = {**runtime_env.get("env_vars", {}), SCRIPT_ENV: script}
        # The run's submission id, or (when a job of an earlier incarnation of the run, a campaign made again,
        # holds it) the next free one: Ray ids are never reused, so the cluster's history stays whole.
        for attempt in range(1, MAX_ID_ATTEMPTS + 1):
            sid = base_sid if attempt == 1 else f"{base_sid}-{attempt}"
            existing = self._info_or_none(sid)
            if existing is None:
                break
            same = (existing.metadata or {}).get("attune_script_sha256") == digest
            if same and not existing.status.is_terminal():
                self._remember(sid, spec, run_dir, existing, fresh=False)
                return sid  # the same job, submitted before (a broker restart, a repeated request): adopt it
        else:
            raise BackendError(f"job {spec.job_id}: submission ids {base_sid} to {base_sid}-{MAX_ID_ATTEMPTS} are "
                               "all taken on the cluster")
        try:
            client.submit_job(entrypoint=ENTRYPOINT, submission_id=sid, runtime_env=runtime_env,
                              metadata=metadata, **res)
        except Exception as exc:
            if self.reconcile(sid, spec, run_dir, digest, exc):
                return sid
            raise BackendError(f"Ray Jobs API at {self.settings.address}: submit_job {sid} failed: "
                               f"{_one_line(exc)}") from None
        info = self._info_or_none(sid)
        self._remember(sid, spec, run_dir, info, fresh=True)
        return sid

    def reconcile(self, sid: str, spec: JobSpec, run_dir: Path, digest: str, exc: BaseException) -> bool:
        """After a submit error: did the cluster take the job anyway? Its submission id is deterministic, so
        it is looked up (a few times, with backoff, while the head does not answer). The same job (same
        script) is adopted: True, and the broker tracks and charges it like any other. A job under that id
        with another script is stopped (it cannot be charged to this run); nothing under the id: False."""
        slow = _unreachable(exc)  # a timeout: the head may still be registering the job
        delay = 0.5
        deadline = time.monotonic() + max(RECONCILE_MIN_S, 2 * self.settings.request_timeout_s)
        while True:
            try:
                info = self._info_or_none(sid)
            except BackendUnavailable:
                if time.monotonic() + delay > deadline:
                    # The head still does not answer: the job may be queued there. Track it by its id (the
                    # broker's polls find it, or find it missing and end the run as an infrastructure failure).
                    self._remember(sid, spec, run_dir, None, fresh=True)
                    return True
                info = None
            else:
                if info is not None or not slow or time.monotonic() + delay > deadline:
                    break
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
        if info is None:
            with contextlib.suppress(Exception):  # should the slow request still land, it must not run untracked
                self.client().stop_job(sid)
            return False
        if (info.metadata or {}).get("attune_script_sha256") == digest:
            self._remember(sid, spec, run_dir, info, fresh=False)  # accepted after all: adopt it
            return True
        with contextlib.suppress(Exception):
            self.client().stop_job(sid)
        raise BackendError(f"Ray Jobs API at {self.settings.address}: submit_job {sid} failed "
                           f"({_one_line(exc)}), and the job found under that id runs another script: stopped it")

    def status(self, backend_id: str) -> JobStatus:
        self._check_id(backend_id)
        info = self._call(f"get_job_info {backend_id}", self.client().get_job_info, backend_id)
        with self._lock:
            job = self._jobs.get(backend_id) or self._adopt(backend_id, info)
            if job.cancelled_pending_at is not None:
                return JobStatus(job_id=job.job_id, backend_id=backend_id, state=JobState.CANCELLED,
                                 ended_at=job.cancelled_pending_at, reason="cancelled through the broker while queued")
            ray_state = str(info.status.value if hasattr(info.status, "value") else info.status)
            terminal = info.status.is_terminal()
            now = time.time()
            if ray_state != "PENDING":
                self._sync_log(backend_id, job, force=terminal)
            if ray_state == "RUNNING" and job.first_running_seen is None:
                job.first_running_seen = now
                self._save(backend_id, job)
            ended = info.end_time / 1000.0 if terminal and info.end_time else None
            started = self._started_at(job, info, ended)
            state, reason, code = self._map(job, info, started)
            if state is JobState.RUNNING and started is None:
                state, reason = JobState.PENDING, f"RUNNING: its driver waits for {job.node_count} nodes"
            if state is JobState.RUNNING and job.time_limit_s is not None and started is not None \
                    and now - started > job.time_limit_s and not job.timed_out:
                job.timed_out = True
                self._save(backend_id, job)
                reason = f"time limit of {job.time_limit_s:g} s reached: stopping the job"
                with contextlib.suppress(BackendError):
                    self._call(f"stop_job {backend_id}", self.client().stop_job, backend_id)
            if started is None:
                nodes: list[str] = []
            elif job.node_count > 1:
                nodes = list(job.nodes)
            else:
                nodes = [info.driver_node_id] if info.driver_node_id else []
            return JobStatus(
                job_id=job.job_id, backend_id=backend_id, state=state, started_at=started,
                ended_at=ended if started is not None or state.finished else None,
                exit_code=code, nodes=nodes, reason=reason,
            )

    def cancel(self, backend_id: str) -> None:
        self._check_id(backend_id)
        client = self.client()
        info = self._call(f"get_job_info {backend_id}", client.get_job_info, backend_id)
        with self._lock:
            job = self._jobs.get(backend_id) or self._adopt(backend_id, info)
            if info.status.is_terminal() or job.cancelled_pending_at is not None:
                return
            job.cancel_requested = True  # before stopping: a STOPPED job we asked for is cancelled, not lost
            pending = str(getattr(info.status, "value", info.status)) == "PENDING" and job.started_at is None
            if pending:
                # Ray stops a queued job only once its supervisor gets resources (it then ends at once): for
                # the broker the job is cancelled now, never having run, and is never charged.
                job.cancelled_pending_at = time.time()
            self._save(backend_id, job)
        self._call(f"stop_job {backend_id}", client.stop_job, backend_id)
        if pending:
            info = self._call(f"get_job_info {backend_id}", client.get_job_info, backend_id)
            if str(getattr(info.status, "value", info.status)) == "PENDING":
                return
            with self._lock:  # it started meanwhile: it ran, so it is stopped and charged like a running job
                job.cancelled_pending_at = None
                self._save(backend_id, job)
        # Ray stops the entrypoint and every process under it (SIGTERM, then SIGKILL after its grace).
        deadline = time.monotonic() + self.settings.stop_timeout_s
        while True:
            info = self._call(f"get_job_info {backend_id}", client.get_job_info, backend_id)
            if info.status.is_terminal():
                return
            if time.monotonic() > deadline:
                raise BackendError(f"Ray job {backend_id} is still {info.status} {self.settings.stop_timeout_s:g} s "
                                   "after it was stopped")
            time.sleep(0.2)

    # ---- admission of resources --------------------------------------------------------------------

    def placeable(self, spec: JobSpec) -> JobSpec:
        """The job as it can be placed. A retry avoids the nodes of the failure it retries; when too few other
        nodes could hold it and the excluded nodes are still alive (Ray gives a restarted node a new id, so
        the failure was not the node's: a stopped job, a dead supervisor), it runs on them again. A job no
        alive node could ever hold is refused now, naming the cluster (it would wait forever)."""
        if spec.exclude_nodes:
            try:
                self.check_capacity(spec)
                return spec
            except BackendUnavailable:
                raise
            except BackendError:
                spec = replace(spec, exclude_nodes=())
        self.check_capacity(spec)
        return spec

    def check_capacity(self, spec: JobSpec) -> None:
        """Refuse a job the cluster's alive nodes could never hold (it would wait forever)."""
        try:
            from ray.util.state import list_nodes
        except ImportError as exc:
            raise BackendError(f"the ray backend needs Ray's state API: pip install 'attune[ray]' ({exc})") from None
        nodes = self._call("list_nodes", list_nodes, address=self.settings.address, detail=True,
                           timeout=int(max(1, self.settings.request_timeout_s)), raise_on_missing_output=False)
        need = self.bundle(spec)
        alive = [n for n in nodes if str(getattr(n, "state", "")) in ("ALIVE", "NodeState.ALIVE")]
        if not alive:
            raise BackendError(f"the Ray cluster at {self.settings.address} has no alive node")
        candidates = [n for n in alive if n.node_id not in spec.exclude_nodes]

        def fits(n: Any) -> int:  # how many of the job's per-node shares the node can hold
            total = n.resources_total or {}
            return int(min((total.get(k, 0.0) // v if v > 0 else 10**6) for k, v in need.items()))

        held = [fits(n) for n in candidates]
        if spec.nodes == 1 or self.settings.placement_strategy == "STRICT_SPREAD":
            enough = sum(1 for h in held if h >= 1) >= spec.nodes
        else:
            enough = sum(held) >= spec.nodes
        if enough:
            return
        wanted = ", ".join(f"{k} {_fmt(k, v)}" for k, v in need.items())
        largest = max(alive, key=lambda n: (n.resources_total or {}).get("GPU", 0.0) * 1e6
                      + (n.resources_total or {}).get("CPU", 0.0))
        offers = ", ".join(f"{k} {_fmt(k, (largest.resources_total or {}).get(k, 0.0))}" for k in need)
        excluded = f" ({len(alive) - len(candidates)} excluded after an infrastructure failure)" \
            if len(candidates) < len(alive) else ""
        count = "one node" if spec.nodes == 1 else f"{spec.nodes} nodes ({self.settings.placement_strategy})"
        raise BackendError(
            f"too few resources: job {spec.job_id} needs {count} with {wanted}, and the Ray cluster at "
            f"{self.settings.address} has not{excluded}: {len(alive)} alive node(s), the largest offers {offers}"
        )

    # ---- internals ---------------------------------------------------------------------------------

    def _info_or_none(self, sid: str) -> Any:
        try:
            return self.client().get_job_info(sid)
        except BackendError:
            raise
        except Exception as exc:
            if "does not exist" in str(exc):
                return None
            cls = BackendUnavailable if _unreachable(exc) else BackendError
            raise cls(f"Ray Jobs API at {self.settings.address}: get_job_info {sid} failed: {_one_line(exc)}") from None

    def _remember(self, sid: str, spec: JobSpec, run_dir: Path, info: Any, fresh: bool) -> None:
        with self._lock:
            job = None if fresh else self._load(sid, run_dir)
            if job is None:
                submitted = (info.start_time / 1000.0) if info is not None and info.start_time else time.time()
                job = _Job(job_id=spec.job_id, run_dir=run_dir, submitted_at=submitted, time_limit_s=spec.time_limit_s,
                           node_count=spec.nodes)
                if fresh:
                    (run_dir / RUN_LOG).unlink(missing_ok=True)  # from an earlier submission, if any
            self._jobs[sid] = job
            self._save(sid, job)

    def _adopt(self, sid: str, info: Any) -> _Job:
        """A job submitted before this instance existed (the broker restarted): find its run directory."""
        meta = info.metadata or {}
        run_dir = Path(str(meta.get("attune_run_dir", "")))
        job = self._load(sid, run_dir) if run_dir.is_absolute() else None
        if job is None:
            raise BackendError(f"Ray job {sid} was not submitted by attune into a run directory this broker can see")
        self._jobs[sid] = job
        return job

    def _load(self, sid: str, run_dir: Path) -> _Job | None:
        try:
            data = json.loads((run_dir / META_FILE).read_text())
        except (OSError, ValueError):
            return None
        if data.get("submission_id") != sid:
            return None
        try:
            return _Job(job_id=str(data["job_id"]), run_dir=run_dir, submitted_at=float(data["submitted_at"]),
                        time_limit_s=data.get("time_limit_s"), first_running_seen=data.get("first_running_seen"),
                        log_bytes=int(data.get("log_bytes", 0)), cancel_requested=bool(data.get("cancel_requested")),
                        cancelled_pending_at=data.get("cancelled_pending_at"), timed_out=bool(data.get("timed_out")),
                        node_count=int(data.get("node_count", 1)), nodes=[str(n) for n in data.get("nodes", [])])
        except (KeyError, TypeError, ValueError):
            return None

    def _save(self, sid: str, job: _Job) -> None:
        data = {"submission_id": sid, "address": self.settings.address, "job_id": job.job_id,
                "submitted_at": job.submitted_at, "time_limit_s": job.time_limit_s,
                "first_running_seen": job.first_running_seen, "log_bytes": job.log_bytes,
                "cancel_requested": job.cancel_requested, "cancelled_pending_at": job.cancelled_pending_at,
                "timed_out": job.timed_out, "node_count": job.node_count, "nodes": job.nodes}
        path = job.run_dir / META_FILE
        try:
            tmp = path.with_name(META_FILE + ".tmp")
            tmp.write_text(json.dumps(data) + "\n")
            os.replace(tmp, path)
        except OSError as exc:
            raise BackendError(f"cannot write {path}: {exc}") from None

    def _sync_log(self, sid: str, job: _Job, force: bool) -> None:
        """Append what the driver logged since the last call to <run_dir>/log.txt."""
        now = time.monotonic()
        if not force and now - job.last_log_sync < job.log_sync_interval_s:
            return
        try:
            text = self.client().get_job_logs(sid)
        except Exception:
            return  # the driver's node may be gone: keep what was copied
        job.last_log_sync = time.monotonic()
        # The Jobs API returns the whole log each time: a huge log is fetched less often (at most a fifth
        # of the broker's time goes into copying it).
        job.log_sync_interval_s = max(LOG_SYNC_INTERVAL_S, 5 * (job.last_log_sync - now))
        if job.started_at is None:
            m = _START_LINE.search(text)  # the script's first line: nothing the job prints comes before it
            if m:
                job.started_at = float(m.group(1))
        if job.node_count > 1 and not job.nodes:
            m = _NODES_LINE.search(text)  # printed by the driver before any node's script starts
            if m:
                job.nodes = m.group(1).split(",")
        data = text.encode("utf-8", "replace")
        if len(data) <= job.log_bytes:
            return
        try:
            with open(job.run_dir / RUN_LOG, "ab") as fh:
                fh.write(data[job.log_bytes:])
        except OSError:
            return
        job.log_bytes = len(data)
        self._save(sid, job)

    def _started_at(self, job: _Job, info: Any, ended: float | None) -> float | None:
        """When the job began running, from its script's first line; never before the submission, never after
        its end or the first time the broker saw it running."""
        if job.node_count > 1:
            # Ray calls the job RUNNING when its driver starts, before the driver holds its nodes: a multi-node
            # job starts at its driver's start line only.
            if job.started_at is None:
                return None
            upper = min(x for x in (ended, time.time()) if x is not None)
            return min(max(job.started_at, job.submitted_at), upper)
        ran = job.started_at is not None or job.first_running_seen is not None
        if not ran:
            return None
        start = job.started_at if job.started_at is not None else job.first_running_seen
        assert start is not None
        upper = min(x for x in (ended, job.first_running_seen, time.time()) if x is not None)
        return min(max(start, job.submitted_at), upper)

    def _map(self, job: _Job, info: Any, started: float | None) -> tuple[JobState, str, int | None]:
        """Ray's job state -> ours, with the reason and exit code."""
        state = str(info.status.value if hasattr(info.status, "value") else info.status)
        error = str(info.error_type.value if hasattr(info.error_type, "value") else info.error_type or "")
        message = _one_line(info.message or "")
        code = info.driver_exit_code
        if state == "PENDING":
            return JobState.PENDING, "PENDING: waiting for resources or its runtime environment", None
        if state == "RUNNING":
            return JobState.RUNNING, "RUNNING", None
        if state == "SUCCEEDED":
            return JobState.COMPLETED, "SUCCEEDED", 0 if code is None else code
        if state == "STOPPED":
            if job.timed_out:
                return JobState.TIMEOUT, f"STOPPED: time limit of {job.time_limit_s:g} s reached", code
            if job.cancel_requested:
                return JobState.CANCELLED, "STOPPED: cancelled through the broker", code
            return JobState.INFRASTRUCTURE, "STOPPED from outside the broker (ray job stop, or the cluster)", code
        if state == "FAILED":
            if error in _INFRA_ERRORS:
                return JobState.INFRASTRUCTURE, f"FAILED ({error}): {message}"[:500], code
            if code is not None and code < 0:
                return (JobState.INFRASTRUCTURE,
                        f"FAILED: the job's driver was killed by signal {-code} from outside the job", code)
            if code is not None:
                return JobState.FAILED, f"FAILED: exit code {code}", code
            return JobState.INFRASTRUCTURE, f"FAILED ({error or 'no error type'}): {message}"[:500], code
        return JobState.INFRASTRUCTURE, f"unknown Ray job state {state!r}", code

    def _check_id(self, backend_id: str) -> None:
        if not _SUBMISSION_ID.match(str(backend_id)):
            raise BackendError(f"not a Ray submission id of this backend: {backend_id!r}")


def _unreachable(exc: BaseException) -> bool:
    """A failure to reach the cluster (connection refused or reset, a timeout), not an answer from it."""
    try:
        import requests
    except ImportError:  # pragma: no cover - Ray's client depends on requests
        return isinstance(exc, ConnectionError | TimeoutError)
    return isinstance(exc, ConnectionError | TimeoutError | requests.ConnectionError | requests.Timeout)


def _num(v: float) -> int | float:
    return int(v) if float(v).is_integer() else v


def _launcher_source() -> str:
    """ray_launch.py's text with proctree.py's text filled in (the driver ships both in one heredoc)."""
    here = Path(__file__).parent
    text = (here / "ray_launch.py").read_text()
    tree = (here / "proctree.py").read_text()
    slot = 'PROCTREE_SOURCE = ""\n'
    if text.count(slot) != 1:
        raise BackendError("broker/backends/ray_launch.py lacks its PROCTREE_SOURCE slot")
    text = text.replace(slot, f"PROCTREE_SOURCE = {tree!r}\n")
    if LAUNCHER_EOF in text:
        raise BackendError("broker/backends/ray_launch.py contains the heredoc terminator")
    return text


def _one_line(exc: object) -> str:
    text = str(exc).strip()
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:300]
    return type(exc).__name__ if isinstance(exc, BaseException) else ""


def _fmt(key: str, value: float) -> str:
    return f"{value / 1024**3:.3g} GiB" if key == "memory" else f"{value:g}"


__all__ = ["ENTRYPOINT", "META_FILE", "SCRIPT_FILE", "START_MARK", "RayBackend", "submission_id"]
