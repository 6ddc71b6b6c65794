"""The local backend: jobs are process groups on this machine, a "cluster" of N slots.

Each job runs `run_dir/job.sh` (what `render` prints, a script a person could run by hand) in
its own session and process group, so cancelling it kills the whole tree: torchrun and every
rank. The script sends the job's output to `run_dir/log.txt` and, when the command exits, writes
its exit status and the time to `run_dir/exit_status`. A job needs `gpus` slots; jobs that do not
fit wait in submission order and are not running (so not charged) while they wait.

A restarted broker can pick its jobs up again: `backend_id` is the run directory, where
`backend.json` (pid, start time) and `exit_status` say what became of the job.

The machine is one node, so `exclude_nodes` cannot be honoured here and is ignored.

Confinement: the job runs in its run directory (its working directory), never in the code's directory
or the campaign's. Where bubblewrap (`bwrap`) runs, the job runs inside it (`sandbox="auto"`, the
default, or `"bwrap"`, which refuses to start a job without it): the whole filesystem read-only, the
run directory the one writable place, the campaign's `.broker/` and the ledger keys hidden. Without it
(`"none"`, or `"auto"` where bwrap cannot run) only the rules hold: the run generator confines every
path a candidate names to the run directory. docs/security.md says what each backend guarantees.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from attune.core.campaign_paths import BROKER_DIR, RUN_JOB, RUNS_DIR
from attune.core.ledger import keys_dir
from broker.backends import proctree
from broker.backends.base import BackendError, JobSpec, JobState, JobStatus, env_name_problem, shell_comment

EXIT_FILE = "exit_status"
META_FILE = "backend.json"
SCRIPT_FILE = "job.sh"
# Variables a job inherits from the broker's environment; everything else comes from its spec.
INHERITED_ENV = ("HOME", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "TZ", "USER", "LOGNAME")
SANDBOXES = ("auto", "bwrap", "none")


@functools.cache
def bwrap_works() -> str | None:
    """The path of a bubblewrap that can build a sandbox here, or None (absent, or no user namespaces)."""
    path = shutil.which("bwrap")
    if path is None:
        return None
    try:
        ok = subprocess.run([path, "--ro-bind", "/", "/", "--dev", "/dev", "true"], capture_output=True,
                            timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return None
    return path if ok else None


def sandbox_argv(bwrap: str, spec: JobSpec) -> list[str]:
    """bubblewrap's command line for one job: `/` read-only, devices as they are (GPUs), the run directory
    writable and the working directory, the campaign's `.broker/` and the ledger keys hidden (empty)."""
    run_dir = str(spec.run_dir.resolve())
    argv = [bwrap, "--ro-bind", "/", "/", "--dev-bind", "/dev", "/dev", "--proc", "/proc"]
    hidden = [keys_dir()]
    if spec.run_dir.resolve().parent.name == RUNS_DIR:
        hidden.append(spec.run_dir.resolve().parent.parent / BROKER_DIR)
    for h in hidden:
        if h.is_dir():
            argv += ["--tmpfs", str(h.resolve())]
    return argv + ["--bind", run_dir, run_dir, "--chdir", run_dir, "--setenv", "TMPDIR", run_dir]


@dataclass
class _Job:
    spec: JobSpec
    backend_id: str
    state: JobState = JobState.PENDING
    proc: subprocess.Popen[bytes] | None = None
    pid: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    reason: str | None = None
    cancelled: bool = False
    adopted: bool = False  # found on disk after a restart: not our child


def _pgroup_alive(pgid: int) -> bool:
    """Whether any process of the group still runs (zombies, waiting to be reaped, do not count)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses, so split after the last ')'
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            return True
    return False


def _job_leader(pid: object, run_dir: Path) -> int | None:
    """The pid recorded in a run's backend.json, if it is this run's job: a live process that leads its own
    process group and runs this run's script. The run directory is the job's to write, so a recorded pid is a
    claim, not a fact: a forged one (the broker's, init's, another job's) is never signalled. None: no such
    process (the job is gone)."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1:
        return None
    try:
        if os.getpgid(pid) != pid:
            return None
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ProcessLookupError):
        return None
    return pid if str(run_dir.resolve() / SCRIPT_FILE).encode() in cmd else None


def _kill_group(pgid: int, sig: int, known: proctree.Known | None = None, walk: bool = True) -> None:
    """Signal the job's process group, and every process of its tree (as recorded in `known`, which is
    brought up to date): ranks that a launcher started in sessions of their own are in the tree only.
    `walk=False` once the group's leader was reaped: its pid may belong to another process by now."""
    if known is None:
        known = proctree.tree(pgid) if walk else {}
    elif walk:
        known.update(proctree.tree(pgid))
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
    proctree.signal_all(known, sig)


def _read_exit(run_dir: Path) -> tuple[int, float | None] | None:
    try:
        text = (run_dir / EXIT_FILE).read_text().split()
    except (FileNotFoundError, NotADirectoryError):
        return None
    if not text:
        return None
    try:
        rc = int(text[0])
    except ValueError:
        return None
    ended: float | None = None
    if len(text) > 1:
        try:
            ended = float(text[1])
        except ValueError:
            ended = None
    return rc, ended


class LocalBackend:
    """Runs jobs as process groups on this machine, with `slots` slots (CPU cores or GPUs)."""

    name = "local"

    def __init__(self, slots: int | None = None, kill_grace_s: float = 3.0, node: str | None = None,
                 sandbox: str = "auto") -> None:
        if sandbox not in SANDBOXES:
            raise BackendError(f"local backend: sandbox must be one of {', '.join(SANDBOXES)}, got {sandbox!r}")
        self.sandbox = sandbox
        if slots is not None and (not isinstance(slots, int) or isinstance(slots, bool) or slots <= 0):
            raise BackendError(f"local backend: slots must be a positive integer, got {slots!r}")
        if not isinstance(kill_grace_s, int | float) or kill_grace_s < 0:
            raise BackendError(f"local backend: kill_grace_s must be a non-negative number, got {kill_grace_s!r}")
        self.slots = slots or os.cpu_count() or 1
        self.kill_grace_s = float(kill_grace_s)
        self.node = node or socket.gethostname()
        self._jobs: dict[str, _Job] = {}
        self._queue: deque[str] = deque()
        self._lock = threading.RLock()

    # --- the script ---------------------------------------------------------------------------
    def render(self, spec: JobSpec) -> str:
        q = shlex.quote
        log = spec.log_path
        exit_file = spec.run_dir / EXIT_FILE
        lines = [
            "#!/bin/sh",
            shell_comment(f"attune local backend: job {spec.job_id} of campaign {spec.campaign}, {spec.gpus} slot(s)"),
            "# Runs in its own process group; cancel with: kill -TERM -<pid of this script>",
            f"exec >>{q(str(log))} 2>&1",
            "# The job works in its own run directory (never the code's or the campaign's).",
            f"cd {q(str(spec.run_dir))} || exit 97",
        ]
        for k in spec.env:
            if env_name_problem(k):
                raise BackendError(f"job {spec.job_id}: {env_name_problem(k)}")
        lines += [f"export {k}={q(str(v))}" for k, v in spec.env.items()]
        lines += [
            " ".join(q(a) for a in spec.argv),
            "rc=$?",
            f'printf "%s %s\\n" "$rc" "$(date +%s.%N)" >{q(str(exit_file))}.tmp && '
            f"mv {q(str(exit_file))}.tmp {q(str(exit_file))}",
            'exit "$rc"',
        ]
        return "\n".join(lines) + "\n"

    def _base_env(self) -> dict[str, str]:
        env = {k: os.environ[k] for k in INHERITED_ENV if k in os.environ}
        # The broker's own Python comes first, so a recipe's `python` is the environment attune runs in.
        path = [str(Path(sys.executable).parent)] + os.environ.get("PATH", os.defpath).split(os.pathsep)
        env["PATH"] = os.pathsep.join(dict.fromkeys(p for p in path if p))
        env["PYTHONUNBUFFERED"] = "1"  # log lines reach log.txt as they are printed (hang detection reads it)
        return env

    # --- the interface ------------------------------------------------------------------------
    def sandbox_command(self, spec: JobSpec) -> list[str]:
        """The OS sandbox's command line for this job (empty: none), by the backend's `sandbox` setting."""
        if self.sandbox == "none":
            return []
        bwrap = bwrap_works()
        if bwrap is None:
            if self.sandbox == "bwrap":
                raise BackendError(f"job {spec.job_id}: sandbox 'bwrap' asked for, but bubblewrap is not installed "
                                   "or cannot build a sandbox here (user namespaces)")
            return []
        return sandbox_argv(bwrap, spec)

    def submit(self, spec: JobSpec) -> str:
        if spec.gpus > self.slots:
            raise BackendError(f"job {spec.job_id} needs {spec.gpus} slots; this machine has {self.slots}")
        if not spec.argv:
            raise BackendError(f"job {spec.job_id} has no command")
        if not Path(spec.workdir).is_dir():
            raise BackendError(f"job {spec.job_id}: working directory {spec.workdir} does not exist")
        self.sandbox_command(spec)  # refuses now, not at start, when the sandbox asked for cannot run
        spec.run_dir.mkdir(parents=True, exist_ok=True)
        backend_id = str(spec.run_dir.resolve())
        with self._lock:
            if backend_id in self._jobs:
                raise BackendError(f"run directory {spec.run_dir} already holds a job")
            for stale in (EXIT_FILE, META_FILE):
                (spec.run_dir / stale).unlink(missing_ok=True)
            script = spec.run_dir / SCRIPT_FILE
            script.write_text(self.render(spec))
            script.chmod(0o755)
            job = self._jobs[backend_id] = _Job(spec=spec, backend_id=backend_id)
            self._queue.append(backend_id)
            try:
                self._schedule()
            except Exception as exc:
                # Reconcile by the pid: a job whose process started is tracked (and charged) whatever failed
                # after; one that never started is taken back, and the submission failed.
                if job.pid is not None or (spec.run_dir / META_FILE).exists():
                    return backend_id
                with contextlib.suppress(ValueError):
                    self._queue.remove(backend_id)
                self._jobs.pop(backend_id, None)
                raise BackendError(f"job {spec.job_id}: could not be started: {exc}") from None
        return backend_id

    def status(self, backend_id: str) -> JobStatus:
        with self._lock:
            job = self._jobs.get(backend_id) or self._adopt(backend_id)
            self._schedule()
            return JobStatus(
                job_id=job.spec.job_id,
                backend_id=backend_id,
                state=job.state,
                started_at=job.started_at,
                ended_at=job.ended_at,
                exit_code=job.exit_code,
                nodes=[self.node] if job.started_at is not None else [],
                reason=job.reason,
            )

    def cancel(self, backend_id: str) -> None:
        with self._lock:
            job = self._jobs.get(backend_id) or self._adopt(backend_id)
            if job.state.finished:
                return
            job.cancelled = True
            if job.state == JobState.PENDING:
                with contextlib.suppress(ValueError):
                    self._queue.remove(backend_id)
                job.state = JobState.CANCELLED
                job.ended_at = time.time()
                job.reason = "cancelled while waiting for slots"
                return
            pgid = job.pid
            if pgid is None:  # an adopted job whose recorded pid is not its own (gone, or forged): nothing to signal
                job.state, job.ended_at = JobState.CANCELLED, time.time()
                job.reason = "cancelled: its process was already gone"
                return
        # The tree as well as the group: a launcher such as torchrun puts each rank in a session of its own.
        known = proctree.tree(pgid)
        _kill_group(pgid, signal.SIGTERM, known)
        deadline = time.monotonic() + self.kill_grace_s
        while time.monotonic() < deadline and (self._alive(job) or proctree.alive(known)):
            known.update(proctree.tree(pgid))
            time.sleep(0.05)
        _kill_group(pgid, signal.SIGKILL, known)
        deadline = time.monotonic() + 10.0
        while (self._alive(job) or proctree.alive(known)) and time.monotonic() < deadline:
            proctree.signal_all(known, signal.SIGKILL)
            time.sleep(0.02)
        with self._lock:
            if not job.state.finished:
                job.state = JobState.CANCELLED
                job.ended_at = time.time()
                job.reason = "cancelled: its process group was killed"
            self._schedule()

    # --- internals ----------------------------------------------------------------------------
    def _alive(self, job: _Job) -> bool:
        if job.proc is not None and job.proc.poll() is None:
            return True
        return job.pid is not None and _pgroup_alive(job.pid)

    def _used(self) -> int:
        return sum(j.spec.gpus for j in self._jobs.values() if j.state == JobState.RUNNING)

    def _schedule(self) -> None:
        """Reap finished jobs, enforce time limits, start waiting jobs that fit (in order)."""
        now = time.time()
        for job in list(self._jobs.values()):
            if job.state != JobState.RUNNING:
                continue
            limit = job.spec.time_limit_s
            if limit is not None and job.started_at is not None and now - job.started_at > limit:
                assert job.pid is not None
                _kill_group(job.pid, signal.SIGKILL)
                if job.proc is not None:
                    job.proc.wait()
                job.state, job.ended_at = JobState.TIMEOUT, time.time()
                job.reason = f"time limit of {limit:g} s reached: its process group was killed"
                continue
            self._reap(job)
        while self._queue:
            job = self._jobs[self._queue[0]]
            if self._used() + job.spec.gpus > self.slots:
                break
            self._queue.popleft()
            self._start(job)

    def _reap(self, job: _Job) -> None:
        if job.proc is not None:
            rc = job.proc.poll()
            if rc is None:
                return
        elif job.pid is not None and _pgroup_alive(job.pid):
            return
        else:
            rc = None
        info = _read_exit(job.spec.run_dir)
        if job.pid is not None:
            _kill_group(job.pid, signal.SIGKILL, walk=False)  # stragglers the command left behind
        if info is not None:
            code, ended = info
            job.exit_code = code
            job.ended_at = ended or time.time()
            job.state = JobState.COMPLETED if code == 0 else JobState.FAILED
            job.reason = f"exit status {code}"
        elif job.cancelled:
            job.state, job.ended_at = JobState.CANCELLED, time.time()
            job.reason = "cancelled: its process group was killed"
        else:
            job.ended_at = time.time()
            if rc is not None and rc < 0:
                job.exit_code = 128 - rc
                job.state = JobState.FAILED
                job.reason = f"killed by signal {-rc} ({signal.Signals(-rc).name})"
            else:
                job.state = JobState.INFRASTRUCTURE
                job.reason = "the job's process is gone without an exit record"

    def _start(self, job: _Job) -> None:
        spec = job.spec
        try:
            proc = subprocess.Popen(
                [*self.sandbox_command(spec), "/bin/sh", str(spec.run_dir.resolve() / SCRIPT_FILE)],
                cwd=str(spec.run_dir),
                env=self._base_env(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except (OSError, BackendError) as exc:
            job.state, job.ended_at = JobState.INFRASTRUCTURE, time.time()
            job.reason = f"could not start the job: {exc}"
            return
        job.proc, job.pid = proc, proc.pid
        job.started_at = time.time()
        job.state = JobState.RUNNING
        meta = {"pid": proc.pid, "started_at": job.started_at, "node": self.node, "job_id": spec.job_id,
                "campaign": spec.campaign, "gpus": spec.gpus}
        (spec.run_dir / META_FILE).write_text(json.dumps(meta) + "\n")

    def _adopt(self, backend_id: str) -> _Job:
        """A job this process did not start (the broker restarted): rebuild it from its run directory."""
        run_dir = Path(backend_id)
        try:
            meta = json.loads((run_dir / META_FILE).read_text())
            doc = json.loads((run_dir / RUN_JOB).read_text())
        except (OSError, ValueError):
            raise BackendError(f"unknown local job {backend_id!r}") from None
        spec = JobSpec(
            job_id=str(doc.get("run_id", run_dir.name)), campaign=str(doc.get("campaign", "")),
            argv=tuple(doc.get("argv", [])), env=dict(doc.get("env", {})), workdir=Path(doc.get("workdir", run_dir)),
            run_dir=run_dir, gpus=int(meta.get("gpus", doc.get("gpus", 1))),
            gpus_per_node=int(doc.get("gpus_per_node", 1)), time_limit_s=doc.get("time_limit_s"),
        )
        job = _Job(spec=spec, backend_id=backend_id, state=JobState.RUNNING,
                   pid=_job_leader(meta.get("pid"), run_dir), started_at=float(meta["started_at"]), adopted=True)
        self._jobs[backend_id] = job
        self._reap(job)
        return job
