#!/usr/bin/env python3
"""Start one of attune's MCP servers on a machine that has only python3 and the plugin.

A Claude Code plugin is copied, not pip-installed, so the servers' Python dependencies
(the MCP SDK, pydantic, numpy, ...) are provisioned here, once, into a virtual environment in the
plugin's persistent data directory:

    ${CLAUDE_PLUGIN_DATA}/venv-<version>-<key>/     key: hash of the dependency list and Python version

`uv` is used when it is on PATH (much faster), `python3 -m venv` + pip otherwise. A marker file
(`.attune-ready`) is written last, so a half-built environment is never used; an exclusive lock
serialises concurrent first starts (Claude Code starts the four servers at once), and the others
wait for the first to finish. The build runs in a detached process, so it completes even when Claude
Code gives up on a slow first start (MCP_TIMEOUT) and kills the launcher; the next start finds it. The plugin's own code is not installed: the server runs from the
plugin directory (PYTHONPATH), so the environment only changes when the dependencies do.

usage:
    python3 launch.py broker|metrics|traces|gate [server args...]
    python3 launch.py --module pkg.mod [args...]   run another module (development, tests)
    python3 launch.py --provision                  build the environment and exit (prints its path)
    python3 launch.py --where                      print the environment it would use and exit

Environment:
    CLAUDE_PLUGIN_DATA   where environments live (else $XDG_CACHE_HOME/attune or ~/.cache/attune)
    ATTUNE_PYTHON        an interpreter that already has the dependencies: no provisioning at all
    ATTUNE_NO_UV=1       do not use uv even when it is on PATH
    ATTUNE_PROVISION_TIMEOUT  seconds allowed for provisioning (default 900)

On failure it prints what failed, the log file, and how to fix it, and exits 1 (Claude Code then
shows the server as failed). Standard library only; stdout is left to the MCP transport.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

SERVERS = {name: f"mcp_servers.{name}_server" for name in ("broker", "metrics", "traces", "gate")}
MARKER = ".attune-ready"
MIN_PYTHON = (3, 11)
LOCK_WAIT_S = 1200


class ProvisionError(Exception):
    def __init__(self, step: str, detail: str, log: Path | None = None) -> None:
        super().__init__(f"{step}: {detail}")
        self.step, self.detail, self.log = step, detail, log


def say(msg: str) -> None:
    sys.stderr.write(f"attune-mcp: {msg}\n")
    sys.stderr.flush()


def plugin_root() -> Path:
    env = os.environ.get("CLAUDE_PLUGIN_ROOT")
    return Path(env).resolve() if env else Path(__file__).resolve().parents[1]


def data_dir() -> Path:
    env = os.environ.get("CLAUDE_PLUGIN_DATA")
    if env:
        return Path(env)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "attune"


def read_project(root: Path) -> tuple[str, list[str]]:
    """(version, dependencies) from the plugin's pyproject.toml."""
    import tomllib

    path = root / "pyproject.toml"
    try:
        with open(path, "rb") as fh:
            project = tomllib.load(fh)["project"]
        version = str(project["version"])
        deps = [str(d) for d in project.get("dependencies", [])]
    except (OSError, KeyError, ValueError) as exc:
        raise ProvisionError("reading the plugin's pyproject.toml", f"{path}: {exc}") from None
    return version, deps


def env_name(version: str, deps: list[str], python: str) -> str:
    key = hashlib.sha256(json.dumps([version, sorted(deps), python]).encode()).hexdigest()[:12]
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", version)
    return f"venv-{safe}-{key}"


def base_python() -> str:
    """An interpreter new enough to build the environment from."""
    if sys.version_info >= MIN_PYTHON:
        return sys.executable
    for name in ("python3.13", "python3.12", "python3.11"):
        found = shutil.which(name)
        if found:
            return found
    raise ProvisionError(
        "finding Python", f"attune needs Python {'.'.join(map(str, MIN_PYTHON))}+, python3 here is "
        f"{sys.version.split()[0]} and no python3.11-3.13 is on PATH"
    )


def python_tag() -> str:
    """Which interpreter the environment is built from: part of its key."""
    py = base_python()
    if py == sys.executable:
        return f"{sys.implementation.name}-{'.'.join(map(str, sys.version_info[:2]))}"
    return os.path.basename(py)


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def is_ready(venv: Path) -> bool:
    py = venv_python(venv)
    return (venv / MARKER).is_file() and os.access(py, os.X_OK)


def _run(cmd: list[str], log: Path, step: str, deadline: float) -> None:
    with open(log, "ab") as fh:
        fh.write(f"\n$ {' '.join(cmd)}\n".encode())
        fh.flush()
        try:
            proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  timeout=max(1.0, deadline - time.monotonic()))
        except FileNotFoundError as exc:
            raise ProvisionError(step, f"{exc}", log) from None
        except subprocess.TimeoutExpired:
            raise ProvisionError(step, "timed out (ATTUNE_PROVISION_TIMEOUT)", log) from None
    if proc.returncode != 0:
        raise ProvisionError(step, f"exit status {proc.returncode}", log)


def build(venv: Path, deps: list[str], log: Path) -> None:
    """Create the environment at `venv` and install `deps` into it (no marker)."""
    timeout = float(os.environ.get("ATTUNE_PROVISION_TIMEOUT", "900"))
    deadline = time.monotonic() + timeout
    py = base_python()
    if venv.exists():
        shutil.rmtree(venv)
    uv = None if os.environ.get("ATTUNE_NO_UV") else shutil.which("uv")
    if uv:
        _run([uv, "venv", "--quiet", "--python", py, str(venv)], log, "uv venv", deadline)
        if deps:
            _run([uv, "pip", "install", "--quiet", "--python", str(venv_python(venv)), *deps], log,
                 "uv pip install", deadline)
    else:
        _run([py, "-m", "venv", str(venv)], log, "python3 -m venv", deadline)
        if deps:
            _run([str(venv_python(venv)), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                  "--no-input", *deps], log, "pip install", deadline)


def target(root: Path) -> tuple[str, list[str], str, Path]:
    """(version, dependencies, python tag, environment directory) for this plugin and interpreter."""
    version, deps = read_project(root)
    tag = python_tag()
    return version, deps, tag, data_dir() / env_name(version, deps, tag)


def provision(root: Path | None = None) -> Path:
    """The ready environment's directory, building it here (under the lock) if needed."""
    root = root or plugin_root()
    version, deps, tag, venv = target(root)
    if is_ready(venv):
        return venv
    data = venv.parent
    try:
        data.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ProvisionError("creating the plugin data directory", f"{data}: {exc}") from None
    log = data / f"{venv.name}.log"
    with open(data / f"{venv.name}.lock", "a+b") as lock:
        waited = 0.0
        while True:
            try:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if waited == 0.0:
                    say(f"another start is provisioning {venv}; waiting for it")
                if waited > LOCK_WAIT_S:
                    raise ProvisionError("waiting for another start's provisioning",
                                         f"still locked after {LOCK_WAIT_S}s", log) from None
                time.sleep(0.2)
                waited += 0.2
        if is_ready(venv):  # the start that held the lock built it
            return venv
        say(f"first start of attune {version}: installing its Python dependencies into {venv} "
            f"({'uv' if shutil.which('uv') and not os.environ.get('ATTUNE_NO_UV') else 'pip'}; log {log})")
        t0 = time.monotonic()
        with open(log, "ab") as fh:
            fh.write(f"\n== provisioning attune {version} at {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
        build(venv, deps, log)
        marker = {"version": version, "dependencies": deps, "python": tag,
                  "seconds": round(time.monotonic() - t0, 1), "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
        tmp = venv / (MARKER + ".tmp")
        tmp.write_text(json.dumps(marker, indent=1) + "\n")
        os.replace(tmp, venv / MARKER)
        say(f"environment ready in {marker['seconds']}s")
    return venv


def provision_detached(root: Path) -> Path:
    """Provision in a detached builder process and wait for it.

    Claude Code gives a server a limited time to connect (MCP_TIMEOUT) and kills it after that. A
    first start may need longer (a minute with pip), so the build runs in its own session and
    finishes even if this launcher is killed: the next start (or /mcp reconnect) finds it ready.
    """
    _, _, _, venv = target(root)
    if is_ready(venv):
        return venv
    data = venv.parent
    try:
        data.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ProvisionError("creating the plugin data directory", f"{data}: {exc}") from None
    status = data / f"{venv.name}.status-{os.getpid()}.json"
    say(f"preparing attune's Python environment in {venv} (first start only; log {data / (venv.name + '.log')})")
    with open(data / f"{venv.name}.builder.err", "ab") as err:
        builder = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--provision-worker", str(status)],
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                   start_new_session=True, env=dict(os.environ, CLAUDE_PLUGIN_ROOT=str(root)))
    code = builder.wait()
    try:
        result = json.loads(status.read_text())
        status.unlink()
    except (OSError, ValueError):
        result = {}
    if code == 0 and is_ready(venv):
        return venv
    raise ProvisionError(result.get("step", "provisioning"), result.get("detail", f"the builder exited with {code}"),
                         Path(result["log"]) if result.get("log") else data / f"{venv.name}.log")


def _provision_worker(status: Path) -> int:
    try:
        venv = provision(plugin_root())
        status.write_text(json.dumps({"ok": True, "venv": str(venv)}))
        return 0
    except ProvisionError as exc:
        status.write_text(json.dumps({"ok": False, "step": exc.step, "detail": exc.detail,
                                      "log": str(exc.log) if exc.log else None}))
        return 1
    except Exception as exc:  # anything else: report it the same way
        status.write_text(json.dumps({"ok": False, "step": "provisioning", "detail": f"{type(exc).__name__}: {exc}"}))
        return 1


def failure_message(server: str, exc: ProvisionError) -> str:
    lines = [f"cannot start attune's MCP server {server!r}: provisioning its Python environment failed",
             f"  step:  {exc.step}", f"  error: {exc.detail}"]
    if exc.log is not None:
        lines.append(f"  log:   {exc.log}")
        try:
            tail = exc.log.read_text(errors="replace").strip().splitlines()[-8:]
            lines += ["  last lines of the log:"] + [f"    {t}" for t in tail]
        except OSError:
            pass
    lines += [
        "  fix:   python3 (3.11+) with the venv module is needed (Debian/Ubuntu: apt install python3-venv),",
        "         and the package index must be reachable (PIP_INDEX_URL / UV_INDEX_URL for a mirror);",
        "         or set ATTUNE_PYTHON to an interpreter that already has attune's dependencies.",
        "         Then start a new session (or run: python3 <plugin>/mcp_servers/launch.py --provision).",
    ]
    return "\n".join(lines)


def find_campaign() -> Path | None:
    """The session's campaign directory: ATTUNE_CAMPAIGN_DIR, else the nearest directory holding a
    campaign.yaml from the project directory (CLAUDE_PROJECT_DIR, else the working directory) upwards."""
    explicit = os.environ.get("ATTUNE_CAMPAIGN_DIR")
    if explicit:
        return Path(explicit).resolve()
    d = Path(os.environ.get("CLAUDE_PROJECT_DIR") or os.getcwd()).resolve()
    for cand in (d, *d.parents):
        if (cand / "campaign.yaml").is_file():
            return cand
    return None


def _spec_scalars(spec: Path) -> dict[str, str]:
    """Top-level `model` and `gate.lists` / `gate.list_sha256` of campaign.yaml, by a line scan (no YAML here)."""
    out: dict[str, str] = {}
    section = ""
    try:
        lines = spec.read_text(encoding="utf-8").splitlines()
    except OSError:
        return out
    for line in lines:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, val = line.strip().partition(":")
        val = val.split(" #", 1)[0].strip().strip("'\"")
        if not line[0].isspace():
            section = key
            if key == "model" and sep and val:
                out["model"] = val
        elif section == "gate" and key in ("lists", "list_sha256") and val:
            out[f"gate.{key}"] = val
    return out


def _pinned_list_sha(campaign: Path) -> str | None:
    """The list hash the campaign pinned when it started (first ledger row), if any."""
    try:
        with open(campaign / "ledger.jsonl", "rb") as fh:
            first = json.loads(fh.readline() or b"{}")
    except (OSError, ValueError):
        return None
    data = first.get("data") if isinstance(first, dict) and first.get("type") == "campaign_started" else None
    sha = data.get("list_sha256") if isinstance(data, dict) else None
    return sha if isinstance(sha, str) and sha else None


def campaign_env(module: str) -> dict[str, str]:
    """Settings the servers read from the environment, derived from the session's campaign."""
    env: dict[str, str] = {}
    campaign = find_campaign()
    if campaign is None:
        return env
    env["ATTUNE_CAMPAIGN_DIR"] = str(campaign)
    if module == SERVERS["gate"]:
        spec = _spec_scalars(campaign / "campaign.yaml")
        lists = spec.get("gate.lists")
        model = spec.get("model")
        if lists:
            cands = [campaign / lists, plugin_root() / lists]
            model = str(next((c.resolve() for c in cands if c.is_file()), cands[0]))
        sha = _pinned_list_sha(campaign) or spec.get("gate.list_sha256")
        if model and not os.environ.get("ATTUNE_GATE_MODEL"):
            env["ATTUNE_GATE_MODEL"] = model
        if sha and not os.environ.get("ATTUNE_GATE_LIST_SHA256"):
            env["ATTUNE_GATE_LIST_SHA256"] = sha
    return env


def exec_server(python: str, module: str, args: list[str], root: Path) -> None:
    env = dict(os.environ)
    env.update(campaign_env(module))
    env["PYTHONPATH"] = str(root)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("ATTUNE_PLUGIN_ROOT", str(root))
    os.execve(python, [python, "-m", module, *args], env)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        sys.stderr.write(__doc__ or "")
        return 2 if not argv else 0
    root = plugin_root()
    if argv[0] == "--provision-worker" and len(argv) == 2:
        return _provision_worker(Path(argv[1]))
    if argv[0] in ("--provision", "--where"):
        try:
            if argv[0] == "--where":
                print(target(root)[3])
                return 0
            print(provision(root))
            return 0
        except ProvisionError as exc:
            say(failure_message("(provisioning only)", exc))
            return 1
    if argv[0] == "--module":
        if len(argv) < 2:
            say("--module needs a module name")
            return 2
        name, module, rest = argv[1], argv[1], argv[2:]
    else:
        name, rest = argv[0], argv[1:]
        if name not in SERVERS:
            say(f"unknown server {name!r}; expected one of {', '.join(SERVERS)}")
            return 2
        module = SERVERS[name]
    explicit = os.environ.get("ATTUNE_PYTHON")
    if explicit:
        python = shutil.which(explicit) or explicit
        if not os.access(python, os.X_OK):
            say(f"ATTUNE_PYTHON={explicit!r} is not an executable interpreter")
            return 1
        exec_server(python, module, rest, root)
    try:
        venv = provision_detached(root)
    except ProvisionError as exc:
        say(failure_message(name, exc))
        return 1
    exec_server(str(venv_python(venv)), module, rest, root)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
