"""The Slurm backend: one sbatch script per job, driven by Slurm's own CLIs.

`render(spec)` writes the job as a plain sbatch script a person can read and submit by hand;
`submit` stores that script as `<run_dir>/job.sbatch` and runs `sbatch --parsable`; `status` reads
`scontrol show job -o` and, once Slurm has forgotten the job (MinJobAge), `sacct` where accounting is
on, then the exit marker the script itself writes (`<run_dir>/job.exit`); `cancel` runs `scancel`.

Charging: `started_at` is Slurm's StartTime (the moment the allocation began; time spent queueing is
never charged) and `ended_at` its EndTime (the moment the allocation was released).
See docs/slurm.md for the settings, the script and the state mapping.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import subprocess
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from attune.core.campaign_paths import RUN_LOG
from broker.backends.base import BackendError, JobSpec, JobState, JobStatus, env_name_problem, shell_comment

SCRIPT_NAME = "job.sbatch"
EXIT_MARKER = "job.exit"

# Slurm job states (scontrol's JobState / sacct's State, first word) -> ours.
_STATE_MAP: dict[str, JobState] = {
    "PENDING": JobState.PENDING,
    "CONFIGURING": JobState.PENDING,
    "RUNNING": JobState.RUNNING,
    "COMPLETING": JobState.RUNNING,
    "SIGNALING": JobState.RUNNING,
    "STAGE_OUT": JobState.RUNNING,
    "RESIZING": JobState.RUNNING,
    "SUSPENDED": JobState.RUNNING,
    "STOPPED": JobState.RUNNING,
    "COMPLETED": JobState.COMPLETED,
    "FAILED": JobState.FAILED,
    "OUT_OF_MEMORY": JobState.FAILED,
    "SPECIAL_EXIT": JobState.FAILED,
    "CANCELLED": JobState.CANCELLED,
    "TIMEOUT": JobState.TIMEOUT,
    "DEADLINE": JobState.TIMEOUT,
    "NODE_FAIL": JobState.INFRASTRUCTURE,
    "BOOT_FAIL": JobState.INFRASTRUCTURE,
    "PREEMPTED": JobState.INFRASTRUCTURE,
    "REQUEUED": JobState.INFRASTRUCTURE,
    "REQUEUE_HOLD": JobState.INFRASTRUCTURE,
    "REQUEUE_FED": JobState.INFRASTRUCTURE,
    "REVOKED": JobState.INFRASTRUCTURE,
}
# Reasons that turn a FAILED (or held) job into an infrastructure failure: the job's own command
# never ran, or ran on a node that failed under it.
_INFRA_REASONS = {"JobLaunchFailure", "NodeDown", "SystemFailure", "launch_failed_requeued_held"}

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_JOB_ID = re.compile(r"^[0-9]+$")
# `scontrol -o` prints `Key=Value` pairs separated by single spaces; a key starts a word.
_SCONTROL_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_/:]*)=")
_UNSET_TIMES = {"", "Unknown", "None", "N/A", "(null)"}


class SlurmSettings(BaseModel):
    """The backend's settings: the campaign's `cluster.settings` when `cluster.backend` is slurm."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    partition: str | None = Field(None, min_length=1, description="sbatch --partition")
    account: str | None = Field(None, min_length=1, description="sbatch --account")
    time_limit_s: float | None = Field(
        None, gt=0, description="default time limit (a job's own time_limit_s wins); rounded up to minutes"
    )
    gpu_request: Literal["gpus-per-node", "gres", "none"] = Field(
        "gpus-per-node",
        description="how GPUs are asked for: --gpus-per-node=N, --gres=gpu:N, or not at all (CPU ranks)",
    )
    gpu_type: str | None = Field(None, min_length=1, description="GPU type in the request, e.g. h100")
    cpus_per_task: int | None = Field(
        None, gt=0, description="sbatch --cpus-per-task; default with gpu_request none: the ranks per node"
    )
    container_runtime: Literal["pyxis"] | None = Field(
        None, description="pyxis: run the command in `srun --container-image=<image>`"
    )
    container_mounts: tuple[str, ...] = Field((), description="extra pyxis mounts, src:dst[:flags]")
    extra_sbatch: tuple[str, ...] = Field((), description="more sbatch options, one `--opt[=value]` each")
    job_name_prefix: str = Field("attune", pattern=r"^[A-Za-z0-9._-]+$")
    sbatch: tuple[str, ...] = Field(("sbatch",), min_length=1, description="the sbatch command")
    scontrol: tuple[str, ...] = Field(("scontrol",), min_length=1, description="the scontrol command")
    scancel: tuple[str, ...] = Field(("scancel",), min_length=1, description="the scancel command")
    sacct: tuple[str, ...] | None = Field(
        ("sacct",), description="the sacct command, for jobs scontrol has forgotten; null: never"
    )
    command_timeout_s: float = Field(30.0, gt=0, description="timeout of every Slurm command")

    @field_validator("sbatch", "scontrol", "scancel", "sacct", mode="before")
    @classmethod
    def _split_command(cls, v: Any) -> Any:
        return shlex.split(v) if isinstance(v, str) else v

    @field_validator("extra_sbatch")
    @classmethod
    def _options(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for opt in v:
            if not opt.startswith("-") or "\n" in opt:
                raise ValueError(f"each extra sbatch option must be one line starting with '-', got {opt!r}")
        return v


class SlurmBackend:
    """Runs jobs with sbatch on a Slurm cluster. Construct with the campaign's `cluster.settings`."""

    name = "slurm"

    def __init__(self, **settings: Any) -> None:
        try:
            self.settings = SlurmSettings(**settings)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'settings'}: {e['msg']}" for e in exc.errors()
            )
            raise BackendError(f"invalid slurm settings: {problems}") from None
        # Slurm job id -> (our job id, run_dir): names the job in statuses and finds its exit marker.
        self._jobs: dict[str, tuple[str, Path]] = {}

    # ---- render ------------------------------------------------------------------------------------

    def _checked_run_dir(self, spec: JobSpec) -> Path:
        """Refuse a job the script cannot express safely; its run directory, resolved."""
        if not spec.argv:
            raise BackendError(f"job {spec.job_id}: empty command (argv)")
        for key in spec.env:
            if not _ENV_NAME.match(key):
                raise BackendError(f"job {spec.job_id}: env name {key!r} is not a valid variable name")
        if spec.image is not None and self.settings.container_runtime is None:
            raise BackendError(
                f"job {spec.job_id} asks for container image {spec.image!r} but the slurm backend has no "
                "container_runtime setting (set container_runtime: pyxis)"
            )
        run_dir = spec.run_dir.resolve()
        if re.search(r"[\s%]", str(run_dir)):
            # #SBATCH lines are not shell-quoted and sbatch expands %j-style patterns in --output.
            raise BackendError(
                f"job {spec.job_id}: run_dir {str(run_dir)!r} must not contain whitespace or '%'"
            )
        return run_dir

    def _sbatch_options(self, spec: JobSpec, run_dir: Path) -> list[str]:
        """The #SBATCH options: name, nodes, GPUs and CPUs, limits, placement, output and environment."""
        s = self.settings
        per_node = spec.gpus // spec.nodes
        sb: list[str] = [
            f"--job-name={s.job_name_prefix}-{_name_part(spec.campaign)}-{_name_part(spec.job_id)}",
            f"--nodes={spec.nodes}",
            "--ntasks-per-node=1",  # one launcher (e.g. torchrun) per node; it starts the ranks
        ]
        if s.gpu_request == "gpus-per-node":
            sb.append(f"--gpus-per-node={s.gpu_type + ':' if s.gpu_type else ''}{per_node}")
        elif s.gpu_request == "gres":
            sb.append(f"--gres=gpu:{s.gpu_type + ':' if s.gpu_type else ''}{per_node}")
        cpus = s.cpus_per_task or (per_node if s.gpu_request == "none" else None)
        if cpus:
            sb.append(f"--cpus-per-task={cpus}")
        limit = spec.time_limit_s if spec.time_limit_s is not None else s.time_limit_s
        if limit is not None:
            sb.append(f"--time={_slurm_time(limit)}")
        if s.partition:
            sb.append(f"--partition={s.partition}")
        if s.account:
            sb.append(f"--account={s.account}")
        if spec.exclude_nodes:
            # The retry of an infrastructure failure runs on other nodes.
            sb.append(f"--exclude={','.join(spec.exclude_nodes)}")
        return sb + [
            f"--output={run_dir / RUN_LOG}",  # stdout and stderr together
            f"--chdir={run_dir}",
            "--export=NONE",  # the submitter's environment (the broker's) never reaches the job
            "--no-requeue",  # a node failure ends the job as NODE_FAIL; the broker decides on retries
            *s.extra_sbatch,
        ]

    def render(self, spec: JobSpec) -> str:
        s = self.settings
        run_dir = self._checked_run_dir(spec)
        use_container = spec.image is not None
        nodes = spec.nodes
        q = shlex.quote
        units = "CPU ranks" if s.gpu_request == "none" else "GPUs"
        sb = self._sbatch_options(spec, run_dir)

        lines = [
            "#!/bin/bash",
            shell_comment(f"attune job {spec.job_id} of campaign {spec.campaign}: {spec.gpus} {units} on {nodes} node(s)."),
            shell_comment(f"Generated by broker.backends.slurm; submit by hand with: sbatch {q(str(run_dir / SCRIPT_NAME))}"),
            *(shell_comment(f"SBATCH {opt}").replace("# ", "#", 1) for opt in sb),
            "",
            "# The job's environment, on top of the user's login environment on the node.",
            *(f"export {k}={q(str(v))}" for k, v in sorted(spec.env.items())),
        ]
        for k in spec.env:
            if env_name_problem(k):
                raise BackendError(f"job {spec.job_id}: {env_name_problem(k)}")
        if nodes > 1 and "MASTER_ADDR" not in spec.env:
            lines.append('export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)')
        marker = q(str(run_dir / EXIT_MARKER))
        lines += [
            "",
            "started_at=$(date +%s.%N)",
        ]
        # srun --export=ALL: sbatch --export=NONE sets SLURM_EXPORT_ENV=NONE, which srun would obey.
        srun = ["srun", "--export=ALL", "--kill-on-bad-exit=1"]
        if use_container:
            mounts = [*s.container_mounts, f"{run_dir}:{run_dir}"]
            srun += [
                f"--container-image={spec.image}",
                f"--container-workdir={run_dir}",  # the job works in its run directory
                f"--container-mounts={','.join(mounts)}",
            ]
        else:
            # The job works in its own run directory, never the code's or the campaign's.
            lines.append(f"cd {q(str(run_dir))} || {{ echo 'attune: cannot enter the run directory' >&2; exit 97; }}")
        lines += [
            " ".join(q(a) for a in [*srun, *spec.argv]),
            "rc=$?",
            "",
            "# Exit marker: read by the broker once Slurm has forgotten the job.",
            'printf \'{"slurm_job_id": "%s", "exit_code": %d, "started_at": %s, "ended_at": %s}\\n\' \\',
            f'  "$SLURM_JOB_ID" "$rc" "$started_at" "$(date +%s.%N)" > {marker}.tmp && mv {marker}.tmp {marker}',
            'exit "$rc"',
            "",
        ]
        return "\n".join(lines)

    # ---- submit / status / cancel ------------------------------------------------------------------

    def submit(self, spec: JobSpec) -> str:
        script = self.render(spec)
        run_dir = spec.run_dir.resolve()
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / EXIT_MARKER).unlink(missing_ok=True)  # from an earlier submission, if any
            path = run_dir / SCRIPT_NAME
            path.write_text(script)
            path.chmod(0o755)
        except OSError as exc:
            raise BackendError(f"job {spec.job_id}: cannot write {run_dir / SCRIPT_NAME}: {exc}") from None
        try:
            out = self._run([*self.settings.sbatch, "--parsable", str(path)], cwd=run_dir).stdout.strip()
        except BackendError:
            found = self.reconcile(spec, run_dir)
            if found is None:
                raise
            out = found  # sbatch failed or timed out, but Slurm queued the job: track it
        backend_id = out.split(";", 1)[0].strip()  # --parsable prints "<id>" or "<id>;<cluster>"
        if not _JOB_ID.match(backend_id):
            raise BackendError(f"sbatch --parsable printed {out!r}, expected a job id")
        self._jobs[backend_id] = (spec.job_id, run_dir)
        return backend_id

    def reconcile(self, spec: JobSpec, run_dir: Path) -> str | None:
        """After an sbatch error: the id of a job Slurm holds under this run's job name and working directory
        (the submission went through after all), or None. Read from `scontrol show job -o` (every job)."""
        name = f"{self.settings.job_name_prefix}-{_name_part(spec.campaign)}-{_name_part(spec.job_id)}"
        try:
            proc = self._run([*self.settings.scontrol, "show", "job", "-o"], check=False)
        except BackendError:
            return None
        ids = []
        for line in proc.stdout.splitlines():
            f = parse_scontrol(line)
            if f.get("JobName") == name and f.get("WorkDir") == str(run_dir) and _JOB_ID.match(f.get("JobId", "")):
                ids.append(f["JobId"])
        return max(ids, key=int) if ids else None

    def status(self, backend_id: str) -> JobStatus:
        self._check_id(backend_id)
        proc = self._run([*self.settings.scontrol, "show", "job", "-o", backend_id], check=False)
        if proc.returncode == 0 and proc.stdout.strip():
            return self._from_scontrol(backend_id, parse_scontrol(proc.stdout))
        if "invalid job id" not in (proc.stderr + proc.stdout).lower():
            raise _command_error([*self.settings.scontrol, "show", "job", "-o", backend_id], proc)
        # Slurm has forgotten the job (older than MinJobAge): accounting, then the exit marker.
        if self.settings.sacct is not None:
            status = self._from_sacct(backend_id)
            if status is not None:
                return status
        status = self._from_marker(backend_id)
        if status is not None:
            return status
        raise BackendError(
            f"Slurm job {backend_id} is unknown: scontrol no longer lists it, sacct has no record, and "
            + (
                f"no exit marker {self._jobs[backend_id][1] / EXIT_MARKER} was written "
                "(killed before its end, e.g. cancelled)"
                if backend_id in self._jobs
                else "it was not submitted by this backend instance"
            )
        )

    def cancel(self, backend_id: str) -> None:
        self._check_id(backend_id)
        proc = self._run([*self.settings.scancel, backend_id], check=False)
        # scancel on a finished job says so and may exit non-zero: cancelling is idempotent.
        text = (proc.stderr + proc.stdout).lower()
        if (
            proc.returncode != 0
            and "already completing or completed" not in text
            and "invalid job id" not in text
        ):
            raise _command_error([*self.settings.scancel, backend_id], proc)

    def run_dir_of(self, backend_id: str) -> Path | None:
        """The run_dir of a job submitted through this instance (None when unknown)."""
        job = self._jobs.get(backend_id)
        return job[1] if job else None

    def _job_id(self, backend_id: str, slurm_name: str) -> str:
        job = self._jobs.get(backend_id)
        return job[0] if job else slurm_name  # after a restart: Slurm's job name (attune-<campaign>-<id>)

    # ---- internals ---------------------------------------------------------------------------------

    def _from_scontrol(self, backend_id: str, fields: dict[str, str]) -> JobStatus:
        slurm_state = fields.get("JobState", "")
        reason = fields.get("Reason") or None
        state = map_state(slurm_state, reason)
        node_list = fields.get("NodeList", "")
        nodes = expand_hostlist(node_list, self.settings.scontrol, self.settings.command_timeout_s)
        # StartTime of a queued job is Slurm's estimate; a job cancelled in the queue has a StartTime
        # but no nodes. Only a job that held nodes has started.
        ran = state is not JobState.PENDING and bool(nodes)
        started = _parse_time(fields.get("StartTime", "")) if ran else None
        ended = _parse_time(fields.get("EndTime", "")) if state.finished else None
        stdout = fields.get("StdOut", "")
        if backend_id not in self._jobs and stdout.endswith("/" + RUN_LOG):
            # Submitted before this instance existed (broker restart): remember where its marker goes.
            self._jobs[backend_id] = (fields.get("JobName", ""), Path(stdout).parent)
        return JobStatus(
            job_id=self._job_id(backend_id, fields.get("JobName", "")),
            backend_id=backend_id,
            state=state,
            started_at=started,
            ended_at=ended,
            exit_code=_parse_exit_code(fields.get("ExitCode")) if state.finished else None,
            nodes=nodes,
            reason=_describe(slurm_state, reason),
        )

    def _from_sacct(self, backend_id: str) -> JobStatus | None:
        assert self.settings.sacct is not None
        cmd = [
            *self.settings.sacct,
            "-n",
            "-P",
            "-X",
            "-j",
            backend_id,
            "-o",
            "JobName,State,Start,End,NodeList,ExitCode,Reason",
        ]
        try:
            proc = self._run(cmd, check=False)
        except BackendError:
            return None  # no sacct on this machine
        line = proc.stdout.strip().splitlines()[0] if proc.returncode == 0 and proc.stdout.strip() else ""
        parts = line.split("|")
        if len(parts) != 7:
            return None  # accounting is off ("Slurm accounting storage is disabled") or no record
        name, raw_state, start, end, node_list, exit_code, reason = parts
        slurm_state = raw_state.split()[0] if raw_state else ""  # "CANCELLED by 0"
        state = map_state(slurm_state, reason or None)
        nodes = expand_hostlist(node_list, self.settings.scontrol, self.settings.command_timeout_s)
        return JobStatus(
            job_id=self._job_id(backend_id, name),
            backend_id=backend_id,
            state=state,
            started_at=_parse_time(start) if nodes and state is not JobState.PENDING else None,
            ended_at=_parse_time(end) if state.finished else None,
            exit_code=_parse_exit_code(exit_code) if state.finished else None,
            nodes=nodes,
            reason=_describe(slurm_state, reason or None),
        )

    def _from_marker(self, backend_id: str) -> JobStatus | None:
        if backend_id not in self._jobs:
            return None
        job_id, run_dir = self._jobs[backend_id]
        try:
            data = json.loads((run_dir / EXIT_MARKER).read_text())
        except (OSError, ValueError):
            return None
        if str(data.get("slurm_job_id")) != backend_id:
            return None  # a marker of another submission into the same run_dir
        code = int(data["exit_code"])
        return JobStatus(
            job_id=job_id,
            backend_id=backend_id,
            state=JobState.COMPLETED if code == 0 else JobState.FAILED,
            started_at=float(data["started_at"]),
            ended_at=float(data["ended_at"]),
            exit_code=code,
            nodes=[],
            reason="from exit marker (Slurm no longer lists the job)",
        )

    def _check_id(self, backend_id: str) -> None:
        if not _JOB_ID.match(str(backend_id)):
            raise BackendError(f"not a Slurm job id: {backend_id!r} (expected digits)")

    def _run(
        self, cmd: Sequence[str], *, cwd: Path | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return run_command(cmd, timeout=self.settings.command_timeout_s, cwd=cwd, check=check)


# ---- helpers (pure, tested directly) -------------------------------------------------------------


def run_command(
    cmd: Sequence[str], *, timeout: float, cwd: Path | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run one Slurm command; every failure becomes a BackendError naming the command."""
    shown = shlex.join(cmd)
    try:
        proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, cwd=cwd)
    except FileNotFoundError:
        raise BackendError(f"`{shown}`: command {cmd[0]!r} not found (is Slurm installed?)") from None
    except subprocess.TimeoutExpired:
        raise BackendError(f"`{shown}` did not answer within {timeout:g}s") from None
    except OSError as exc:
        raise BackendError(f"`{shown}` could not run: {exc}") from None
    if check and proc.returncode != 0:
        raise _command_error(cmd, proc)
    return proc


def _command_error(cmd: Sequence[str], proc: subprocess.CompletedProcess[str]) -> BackendError:
    detail = (proc.stderr or proc.stdout).strip() or "(no output)"
    return BackendError(f"`{shlex.join(cmd)}` exited with {proc.returncode}: {detail}")


def map_state(slurm_state: str, reason: str | None = None) -> JobState:
    """Slurm's job state (and reason) -> ours. Unknown states count as infrastructure failures."""
    base = slurm_state.split("+", 1)[0].split()[0] if slurm_state.strip() else ""
    if reason in _INFRA_REASONS and base in ("FAILED", "PENDING"):
        return JobState.INFRASTRUCTURE  # never launched, or its node failed: not the recipe's fault
    return _STATE_MAP.get(base, JobState.INFRASTRUCTURE)


def parse_scontrol(text: str) -> dict[str, str]:
    """`scontrol show job -o <id>` (one line of Key=Value pairs) -> dict."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    matches = list(_SCONTROL_KEY.finditer(line))
    fields: dict[str, str] = {}
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        fields.setdefault(m.group(1), line[m.end() : end].strip())
    return fields


def expand_hostlist(
    node_list: str, scontrol: Sequence[str] = ("scontrol",), timeout: float = 30.0
) -> list[str]:
    """A Slurm hostlist ("gpu[01-03],login") -> host names; bracket ranges through scontrol."""
    node_list = node_list.strip()
    if node_list in _UNSET_TIMES or node_list == "None assigned":
        return []
    if "[" not in node_list:
        return [n for n in node_list.split(",") if n]
    proc = run_command([*scontrol, "show", "hostnames", node_list], timeout=timeout)
    return proc.stdout.split()


def _parse_time(value: str) -> float | None:
    """Slurm's local-time timestamps (2026-11-29T09:57:37) -> epoch seconds."""
    value = value.strip()
    if value in _UNSET_TIMES:
        return None
    try:
        return datetime.strptime(value, "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        return None


def _parse_exit_code(value: str | None) -> int | None:
    """Slurm's "code:signal" -> the exit code, or minus the signal when a signal ended the job."""
    if not value or ":" not in value:
        return None
    code, _, sig = value.partition(":")
    try:
        code_i, sig_i = int(code), int(sig)
    except ValueError:
        return None
    return -sig_i if sig_i else code_i


def _describe(slurm_state: str, reason: str | None) -> str:
    return slurm_state if not reason or reason == "None" else f"{slurm_state} ({reason})"


def _slurm_time(seconds: float) -> str:
    """Seconds -> sbatch --time, rounded up to whole minutes (Slurm's resolution): D-HH:MM:00."""
    minutes = max(1, math.ceil(seconds / 60))
    days, minutes = divmod(minutes, 24 * 60)
    hours, minutes = divmod(minutes, 60)
    return f"{days}-{hours:02d}:{minutes:02d}:00" if days else f"{hours}:{minutes:02d}:00"


def _name_part(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", text)


__all__ = [
    "EXIT_MARKER",
    "SCRIPT_NAME",
    "SlurmBackend",
    "SlurmSettings",
    "expand_hostlist",
    "map_state",
    "parse_scontrol",
]
