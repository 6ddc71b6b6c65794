"""attune's data directory and the protocol of the virtual environments it builds there, once.

Two builders use it: the plugin's launcher (mcp_servers/launch.py: the MCP servers' own dependencies,
before any environment exists, so standard library only) and the workload's environment on the local
backend (attune/control/workenv.py: the jobs' PyTorch). One protocol for both:

- the data directory: `${CLAUDE_PLUGIN_DATA}`, else `$XDG_CACHE_HOME/attune`, else `~/.cache/attune`;
- an environment `<data>/<name>/` is ready when its marker (`.attune-ready`, written last, atomically)
  is there and its interpreter is executable, so a half-built one is never used;
- beside it: `<name>.lock` (an exclusive `flock` held while building: held means building),
  `<name>.log` (every step's command and output), `<name>.failed.json` (the last failure: step,
  detail, log, written atomically), `<name>.started` (when the current build began);
- a build removes what is there, creates the environment (`uv venv` when given uv, else
  `python -m venv`), installs the packages, and raises `VenvBuildError` naming the step that failed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from attune.core.errors import CoreError

TYPE_CHECKING = False  # no typing import at run time: the Stop and SessionStart hooks load this
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any

MARKER = ".attune-ready"


class VenvBuildError(CoreError):
    """A build step failed: `step` (which), `detail` (why), `log` (the build's log, when there is one)."""

    def __init__(self, step: str, detail: str, log: Path | None = None) -> None:
        super().__init__(f"{step}: {detail}")
        self.step, self.detail, self.log = step, detail, log


def data_root() -> Path:
    env = os.environ.get("CLAUDE_PLUGIN_DATA")
    if env:
        return Path(env)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "attune"


def python_in(venv: Path) -> Path:
    return venv / "bin" / "python"


def is_ready(venv: Path) -> bool:
    return (venv / MARKER).is_file() and os.access(python_in(venv), os.X_OK)


def _beside(venv: Path, suffix: str) -> Path:
    return venv.parent / f"{venv.name}{suffix}"


def log_path(venv: Path) -> Path:
    return _beside(venv, ".log")


def lock_path(venv: Path) -> Path:
    return _beside(venv, ".lock")


def failure_path(venv: Path) -> Path:
    return _beside(venv, ".failed.json")


def started_path(venv: Path) -> Path:
    return _beside(venv, ".started")


def _write_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def write_marker(venv: Path, data: dict[str, Any]) -> None:
    """Mark the environment ready (last, atomically)."""
    _write_atomic(venv / MARKER, data)


def write_failure(venv: Path, data: dict[str, Any]) -> None:
    """Record a failed build (`at`: when, added); best effort."""
    with contextlib.suppress(OSError):
        _write_atomic(failure_path(venv), {**data, "at": time.time()})


def read_failure(venv: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(failure_path(venv).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_locked(venv: Path) -> bool:
    """True while a build holds the environment's lock."""
    lock = lock_path(venv)
    if not lock.exists():
        return False
    with open(lock, "a+b") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
    return False


@contextlib.contextmanager
def locked(venv: Path, wait_s: float | None = None, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold the environment's build lock; `wait_s` bounds the wait (None: wait as long as it takes)."""
    with open(lock_path(venv), "a+b") as fh:
        if wait_s is None:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        else:
            waited = 0.0
            while True:
                try:
                    fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if waited == 0.0 and on_wait is not None:
                        on_wait()
                    if waited > wait_s:
                        raise VenvBuildError("waiting for another build", f"still locked after {wait_s:.0f}s",
                                             log_path(venv)) from None
                    time.sleep(0.2)
                    waited += 0.2
        yield


def run_step(cmd: list[str], log: Path, step: str, deadline: float) -> None:
    """Run one build step, its output appended to `log`; VenvBuildError naming the step on failure."""
    with open(log, "ab") as fh:
        fh.write(f"\n$ {' '.join(cmd)}\n".encode())
        fh.flush()
        try:
            proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  timeout=max(1.0, deadline - time.monotonic()))
        except OSError as exc:
            raise VenvBuildError(step, f"{type(exc).__name__}: {exc}", log) from None
        except subprocess.TimeoutExpired:
            raise VenvBuildError(step, "timed out", log) from None
    if proc.returncode != 0:
        raise VenvBuildError(step, f"exit status {proc.returncode}", log)


def create(venv: Path, packages: list[str], python: str, deadline: float, *, uv: str | None = None,
           quiet: bool = True) -> None:
    """Build the environment at `venv` from `python` with `packages` (no marker: the caller writes it
    when the environment is what it needs). `quiet=False` keeps pip's progress lines in the log."""
    log = log_path(venv)
    if venv.exists():
        shutil.rmtree(venv)
    if uv:
        run_step([uv, "venv", "--quiet", "--python", python, str(venv)], log, "uv venv", deadline)
        if packages:
            run_step([uv, "pip", "install", "--quiet", "--python", str(python_in(venv)), *packages], log,
                     "uv pip install", deadline)
        return
    run_step([python, "-m", "venv", str(venv)], log, "python3 -m venv", deadline)
    if packages:
        run_step([str(python_in(venv)), "-m", "pip", "install", "--quiet" if quiet else "--progress-bar=off",
                  "--disable-pip-version-check", "--no-input", *packages], log, "pip install", deadline)
