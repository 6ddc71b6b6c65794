"""The workload's Python environment on the local backend: which interpreter runs the jobs.

The plugin's own environment (the MCP SDK, pydantic, ...) is not the workload's: tinygpt needs
PyTorch, which the plugin does not install. A campaign names its jobs' environment in
`environment` (attune/control/spec.py):

- `environment.python` set: that interpreter, and nothing else;
- otherwise attune's own interpreter when it can import `environment.imports` (a development
  checkout set up with scripts/setup.sh has PyTorch), else the environment attune builds from
  `environment.packages` into its data directory (the plugin's `${CLAUDE_PLUGIN_DATA}`, else
  `~/.cache/attune`), keyed by the packages and the Python version.

The build runs on request (the broker's `workload_environment` tool with `build: true`, or
`attune tune` before it starts the agent) in a detached process, so it survives the caller; a
marker file written last means ready, a `.failed.json` records a failure with its fix, and the
log (pip's own lines) is the progress shown to the caller.

`resolve(spec, campaign_dir)` answers which interpreter a job gets, or why none can run it; the
control plane refuses a launch (code `environment`) with that reason before anything is admitted.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from attune.control.spec import CampaignSpec
from attune.core import venvs

MARKER = venvs.MARKER  # the data directory and environment protocol: attune/core/venvs.py
CHECK_TIMEOUT_S = 120.0
BUILD_TIMEOUT_S = float(os.environ.get("ATTUNE_WORKLOAD_BUILD_TIMEOUT", "1800"))
_checked: dict[tuple[str, float, tuple[str, ...]], tuple[bool, str, float]] = {}


@dataclass
class EnvStatus:
    """Where the workload's environment stands."""

    state: str  # ready | missing | building | failed | unchecked
    python: str | None = None
    source: str | None = None  # spec | attune | built
    imports: list[str] = field(default_factory=list)
    packages: list[str] = field(default_factory=list)
    directory: str | None = None  # where attune builds it
    reason: str = ""
    fix: str | None = None
    log: str | None = None
    progress: list[str] = field(default_factory=list)
    elapsed_s: float | None = None

    @property
    def terminal(self) -> bool:
        """Broken beyond what the agent can do: a build that failed, or the spec's interpreter unusable (only
        a person can fix those: a reachable package index, an installed interpreter)."""
        return self.state == "failed" or (self.state == "missing" and self.source == "spec")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def build_dir(packages: list[str]) -> Path:
    tag = f"{sys.implementation.name}-{sys.version_info[0]}.{sys.version_info[1]}"
    key = hashlib.sha256(json.dumps([sorted(packages), tag]).encode()).hexdigest()[:12]
    return venvs.data_root() / f"workload-{key}"


is_ready = venvs.is_ready


def can_import(python: str, imports: list[str]) -> tuple[bool, str]:
    """(True, "") when `python` imports every module, else (False, what failed). Successes are cached."""
    try:
        mtime = os.stat(python).st_mtime
    except OSError as exc:
        return False, f"{python}: {exc.strerror or exc}"
    key = (python, mtime, tuple(imports))
    hit = _checked.get(key)
    if hit is not None and (hit[0] or time.monotonic() - hit[2] < 30.0):
        return hit[0], hit[1]
    code = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\n"
    try:
        p = subprocess.run([python, "-c", code, *imports], capture_output=True, text=True, timeout=CHECK_TIMEOUT_S,
                           stdin=subprocess.DEVNULL)
        ok = p.returncode == 0
        why = "" if ok else (p.stderr.strip().splitlines() or [f"exit status {p.returncode}"])[-1][:300]
    except (OSError, subprocess.TimeoutExpired) as exc:
        ok, why = False, f"{type(exc).__name__}: {exc}"
    _checked[key] = (ok, why, time.monotonic())
    return ok, why


def _which(python: str, campaign_dir: Path) -> str | None:
    if os.sep in python:
        p = Path(python)
        p = p if p.is_absolute() else campaign_dir / p
        return str(p) if os.access(p, os.X_OK) else None
    return shutil.which(python)


def _tail(path: Path, n: int = 6) -> list[str]:
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, os.path.getsize(path) - 16384))
            lines = fh.read().decode(errors="replace").splitlines()
    except OSError:
        return []
    keep = [ln.strip() for ln in lines if ln.strip() and not ln.startswith(" ")]
    return [re.sub(r"\s+", " ", ln)[:200] for ln in keep[-n:]]


def status(spec: CampaignSpec, campaign_dir: Path | str) -> EnvStatus:
    """Which interpreter the campaign's jobs run with, or why none can (no build is started)."""
    d = Path(campaign_dir)
    env = spec.environment
    if env is None or spec.cluster.backend != "local":
        return EnvStatus("unchecked", reason="no environment in the spec (or not the local backend): the jobs run "
                         "with attune's own interpreter (local) or the job's image (cluster)")
    imports, packages = list(env.imports), list(env.packages)
    base = EnvStatus("missing", imports=imports, packages=packages)
    if env.python:
        py = _which(env.python, d)
        if py is None:
            return EnvStatus("missing", env.python, "spec", imports, packages, reason=(
                f"environment.python {env.python!r} is not an executable interpreter"),
                fix="set environment.python in campaign.yaml to an interpreter that exists")
        ok, why = can_import(py, imports)
        if ok:
            return EnvStatus("ready", py, "spec", imports, packages)
        return EnvStatus("missing", py, "spec", imports, packages, reason=f"{py} cannot import the workload's "
                         f"modules ({why})", fix=f"install {' '.join(packages) or ', '.join(imports)} into {py}")
    ok, _ = can_import(sys.executable, imports)
    if ok:
        return EnvStatus("ready", sys.executable, "attune", imports, packages)
    venv = build_dir(packages)
    base.directory = str(venv)
    base.log = str(venv.parent / f"{venv.name}.log")
    if is_ready(venv):
        py = str(venvs.python_in(venv))
        ok, why = can_import(py, imports)
        if ok:
            return EnvStatus("ready", py, "built", imports, packages, directory=str(venv))
        base.reason = f"the built environment {venv} cannot import the workload's modules ({why})"
        base.fix = f"delete {venv} and build it again (the broker's workload_environment tool, build: true)"
        return base
    if venvs.is_locked(venv):
        base.state = "building"
        base.reason = f"attune is building the workload's environment ({', '.join(packages)}) in {venv}"
        base.progress = _tail(Path(base.log))
        base.elapsed_s = _elapsed(venv)
        base.fix = "wait for it: call workload_environment again to follow its progress"
        return base
    failed = venvs.read_failure(venv)
    if failed is not None:
        base.state = "failed"
        base.reason = f"building the workload's environment failed: {failed.get('detail')}"
        base.progress = _tail(Path(base.log))
        base.fix = ("make the package index reachable (PIP_INDEX_URL for a mirror) and build again, or set "
                    "environment.python in campaign.yaml to an interpreter that has " + ", ".join(imports))
        return base
    base.reason = (f"attune's interpreter {sys.executable} cannot import {', '.join(imports)}, and the workload's "
                   f"environment ({', '.join(packages) or 'no packages listed'}) is not built yet")
    base.fix = ("build it: the broker's workload_environment tool with build: true (a few minutes, once per "
                "machine), or set environment.python in campaign.yaml to an interpreter that has "
                + ", ".join(imports))
    return base


def _elapsed(venv: Path) -> float | None:
    try:
        return round(time.time() - venvs.started_path(venv).stat().st_mtime, 1)
    except OSError:
        return None


def start_build(spec: CampaignSpec, campaign_dir: Path | str) -> EnvStatus:
    """Start building the workload's environment (detached) unless it is ready or building; its status."""
    st = status(spec, campaign_dir)
    if st.state not in ("missing", "failed") or st.directory is None or not st.packages:
        return st
    venv = Path(st.directory)
    venv.parent.mkdir(parents=True, exist_ok=True)
    venvs.failure_path(venv).unlink(missing_ok=True)
    venvs.started_path(venv).write_text(time.strftime("%Y-%m-%dT%H:%M:%S") + "\n")
    with open(venv.parent / f"{venv.name}.builder.err", "ab") as err:
        subprocess.Popen([sys.executable, "-m", "attune.control.workenv", str(venv), json.dumps(st.packages)],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
                         cwd=str(Path(__file__).resolve().parents[2]),
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    deadline = time.monotonic() + 10.0
    while (time.monotonic() < deadline and not venvs.is_locked(venv) and not is_ready(venv)
           and venvs.read_failure(venv) is None):
        time.sleep(0.05)
    return status(spec, campaign_dir)


def build(venv: Path, packages: list[str]) -> None:
    """Build `venv` with `packages` (under its lock; a marker last). Raises RuntimeError on failure."""
    log = venvs.log_path(venv)
    with venvs.locked(venv):
        if is_ready(venv):
            return
        with open(log, "ab") as fh:
            fh.write(f"\n== building the workload environment at {time.strftime('%Y-%m-%d %H:%M:%S')}: "
                     f"{' '.join(packages)}\n".encode())
        t0 = time.monotonic()
        try:  # pip's progress lines stay in the log: they are the progress shown to the caller
            venvs.create(venv, packages, sys.executable, t0 + BUILD_TIMEOUT_S, quiet=False)
        except venvs.VenvBuildError as exc:
            detail = f"{exc.step}: {exc.detail} (log {log})"
            venvs.write_failure(venv, {"detail": detail, "log": str(log)})
            raise RuntimeError(detail) from None
        venvs.write_marker(venv, {"packages": packages, "seconds": round(time.monotonic() - t0, 1)})
        with open(log, "ab") as fh:
            fh.write(f"== ready in {time.monotonic() - t0:.0f}s\n".encode())


def build_and_wait(spec: CampaignSpec, campaign_dir: Path | str, say: Any = None, poll_s: float = 2.0) -> EnvStatus:
    """Build (or wait for) the environment, reporting progress lines through `say`; the final status."""
    st = start_build(spec, campaign_dir)
    seen: set[str] = set()
    while st.state == "building":
        for line in st.progress:
            if line not in seen and say is not None:
                seen.add(line)
                say(f"workload environment: {line}")
        time.sleep(poll_s)
        st = status(spec, campaign_dir)
    return st


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m attune.control.workenv VENV PACKAGES_JSON", file=sys.stderr)
        return 2
    with contextlib.suppress(RuntimeError):
        build(Path(argv[0]), list(json.loads(argv[1])))
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
