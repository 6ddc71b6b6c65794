"""The backend interface: submit a job, read its state, cancel it.

A backend knows nothing of campaigns, budgets or the gate: the broker service checks and charges;
the backend only runs processes somewhere and reports what happened to them. Modelled on Slurm's
own CLIs (sbatch, squeue/scontrol, scancel): every backend can say what it would run, in a form a
person could read and run by hand (`render`).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from attune.core.errors import BackendError
from attune.core.job import JobSpec

__all__ = ["Backend", "BackendError", "BackendUnavailable", "JobSpec", "JobState", "JobStatus", "env_name_problem",
           "shell_comment"]

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


def shell_comment(text: str) -> str:
    """One `# ...` line of a rendered script: every character that could end the line (or be read by a
    terminal) becomes '?', so no value in a comment can start a command."""
    return "# " + "".join(c if c.isprintable() else "?" for c in text)


def env_name_problem(name: object) -> str | None:
    """Why `name` cannot be exported by a rendered script (None: it can)."""
    if isinstance(name, str) and _ENV_NAME.fullmatch(name):
        return None
    return f"{str(name)[:80]!r} is not an environment variable name (letters, digits and '_')"


class BackendUnavailable(BackendError):
    """The cluster did not answer (a dashboard restarting, a network blip): the job's state is unknown, not lost.
    The broker asks again at its next poll, and gives the job up only after `control.hang_timeout_s`."""


class JobState(enum.StrEnum):
    PENDING = "pending"  # queued, not started: never charged
    RUNNING = "running"
    COMPLETED = "completed"  # exited 0
    FAILED = "failed"  # exited non-zero (the metrics reader classifies why from the log)
    CANCELLED = "cancelled"  # cancelled through the broker (or killed as a hang)
    TIMEOUT = "timeout"  # the backend's time limit
    INFRASTRUCTURE = "infrastructure"  # node failure, lost node, launch failure outside the job

    @property
    def finished(self) -> bool:
        return self not in (JobState.PENDING, JobState.RUNNING)


@dataclass
class JobStatus:
    job_id: str
    backend_id: str  # pid of the process group, Slurm job id, ...
    state: JobState
    started_at: float | None = None  # epoch seconds the job started running: charging starts here
    ended_at: float | None = None  # epoch seconds it released its resources
    exit_code: int | None = None
    nodes: list[str] = field(default_factory=list)
    reason: str | None = None  # the backend's own words (e.g. Slurm's NODE_FAIL)


@runtime_checkable
class Backend(Protocol):
    name: str

    def submit(self, spec: JobSpec) -> str:
        """Start (or queue) the job; returns the backend's id for it. Raises BackendError."""

    def status(self, backend_id: str) -> JobStatus:
        """The job's current state. Raises BackendError for an unknown id."""

    def cancel(self, backend_id: str) -> None:
        """Stop the job and everything it started. Idempotent on a finished job."""

    def render(self, spec: JobSpec) -> str:
        """What submit would run, as a script a person could read and run by hand."""
