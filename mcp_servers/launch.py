#!/usr/bin/env python3
"""Start one of attune's MCP servers on a machine that has only python3 and the plugin.

A Claude Code plugin is copied, not pip-installed, so the servers' Python dependencies
(the MCP SDK, pydantic, numpy, ...) are provisioned here, once, into a virtual environment in the
plugin's persistent data directory:

    ${CLAUDE_PLUGIN_DATA}/venv-<version>-<key>/     key: hash of the dependency list and Python version

`uv` is used when it is on PATH (much faster), `python3 -m venv` + pip otherwise. A marker file
(`.attune-ready`) is written last, so a half-built environment is never used; an exclusive lock
serialises concurrent first starts (Claude Code starts the four servers at once): one builds, the
others find its result, and a failure is recorded (`<env>.failed.json`) so the other servers report
that failure instead of building again (for FAILURE_TTL_S; `--provision` always retries). The build
runs in a detached process, so it completes even if Claude Code kills the launcher. The plugin's own
code is not installed: the server runs from the plugin directory (PYTHONPATH), so the environment
only changes when the dependencies do.
The data directory and the environment protocol (marker, lock, log, failure record, the build
steps) are attune/core/venvs.py's, the one the workload's environment (attune/control/workenv.py)
uses too; it is standard library only, like this launcher.

A warm start (the environment is ready) execs the server at once. On a first start the launcher
does not make Claude Code wait: it speaks MCP itself while the environment builds, answering
`initialize` and `tools/list` from the tool schemas recorded in `tool_schemas.json` (written by
`--write-schemas` from the real servers; a test keeps it current). A tool call waits until the
environment is ready; then the launcher starts the real server, replays the session's `initialize`
to it and from then on relays every message both ways. If the build fails, every tool call answers
with the failure (step, error, log, fix) as its error, which the agent sees; the SessionStart and
Stop hooks read the same recorded failure.

usage:
    python3 launch.py broker|metrics|traces|gate [server args...]
    python3 launch.py --module pkg.mod [args...]   run another module (development, tests)
    python3 launch.py --provision                  build the environment and exit (prints its path)
    python3 launch.py --where                      print the environment it would use and exit
    python3 launch.py --write-schemas              record the servers' initialize answers and tools (needs the deps)

Environment:
    CLAUDE_PLUGIN_DATA   where environments live (else $XDG_CACHE_HOME/attune or ~/.cache/attune)
    ATTUNE_PYTHON        an interpreter that already has the dependencies: no provisioning at all
    ATTUNE_NO_UV=1       do not use uv even when it is on PATH
    ATTUNE_PROVISION_TIMEOUT  seconds allowed for provisioning (default 900)

On failure it prints what failed, the log file, and how to fix it, and exits 1 (Claude Code then
shows the server as failed). Standard library only; stdout is left to the MCP transport.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script (.mcp.json): the plugin root holds attune's server list
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from attune.core import plugin_servers, venvs  # noqa: E402 - after the path, when run as a script
from attune.core.errors import PluginServerError

SERVERS = {name: plugin_servers.module(name) for name in plugin_servers.SERVERS}
MARKER = venvs.MARKER  # the data directory and environment protocol: attune/core/venvs.py
MIN_PYTHON = (3, 11)
LOCK_WAIT_S = 1200
FAILURE_TTL_S = 120.0  # a build that failed this recently is reported, not repeated, by the other servers
SCHEMAS = Path(__file__).resolve().parent / "tool_schemas.json"
FIX = ("python3 (3.11+) with the venv module is needed (Debian/Ubuntu: apt install python3-venv), and the "
       "package index must be reachable (PIP_INDEX_URL / UV_INDEX_URL for a mirror); or set ATTUNE_PYTHON to an "
       "interpreter that already has attune's dependencies. Then start a new session (or run: python3 "
       "<plugin>/mcp_servers/launch.py --provision).")


class ProvisionError(PluginServerError):
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
    return venvs.data_root()


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


venv_python, is_ready, failure_path = venvs.python_in, venvs.is_ready, venvs.failure_path


def record_failure(venv: Path, exc: ProvisionError) -> None:
    venvs.write_failure(venv, {"step": exc.step, "detail": exc.detail, "log": str(exc.log) if exc.log else None,
                               "fix": FIX, "when": time.strftime("%Y-%m-%dT%H:%M:%S")})


def recorded_failure(root: Path | None = None, max_age_s: float | None = None) -> dict | None:
    """The last failed build of this plugin's environment (step, detail, log, fix, at), while it is not ready."""
    try:
        venv = target(root or plugin_root())[3]
    except ProvisionError as exc:
        return {"step": exc.step, "detail": exc.detail, "log": None, "fix": FIX, "at": time.time()}
    if is_ready(venv):
        return None
    data = venvs.read_failure(venv)
    if data is None:
        return None
    if max_age_s is not None and time.time() - float(data.get("at") or 0) > max_age_s:
        return None
    return data


def build(venv: Path, deps: list[str], log: Path) -> None:
    """Create the environment at `venv` and install `deps` into it (no marker)."""
    deadline = time.monotonic() + float(os.environ.get("ATTUNE_PROVISION_TIMEOUT", "900"))
    uv = None if os.environ.get("ATTUNE_NO_UV") else shutil.which("uv")
    try:
        venvs.create(venv, deps, base_python(), deadline, uv=uv)
    except venvs.VenvBuildError as exc:
        detail = exc.detail + (" (ATTUNE_PROVISION_TIMEOUT)" if exc.detail == "timed out" else "")
        raise ProvisionError(exc.step, detail, exc.log or log) from None


def target(root: Path) -> tuple[str, list[str], str, Path]:
    """(version, dependencies, python tag, environment directory) for this plugin and interpreter."""
    version, deps = read_project(root)
    tag = python_tag()
    return version, deps, tag, data_dir() / env_name(version, deps, tag)


def provision(root: Path | None = None, retry: bool = True) -> Path:
    """The ready environment's directory, building it here (under the lock) if needed.

    With `retry=False`, a build that failed within FAILURE_TTL_S is reported instead of repeated."""
    root = root or plugin_root()
    version, deps, tag, venv = target(root)
    if is_ready(venv):
        return venv
    data = venv.parent
    try:
        data.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ProvisionError("creating the plugin data directory", f"{data}: {exc}") from None
    log = venvs.log_path(venv)
    try:
        with venvs.locked(venv, LOCK_WAIT_S, lambda: say(f"another start is provisioning {venv}; waiting for it")):
            return _provision_locked(root, version, deps, tag, venv, retry)
    except venvs.VenvBuildError as exc:
        raise ProvisionError("waiting for another start's provisioning", exc.detail, log) from None


def _provision_locked(root: Path, version: str, deps: list[str], tag: str, venv: Path, retry: bool) -> Path:
    """`provision` under the environment's build lock."""
    log = venvs.log_path(venv)
    if is_ready(venv):  # the start that held the lock built it
        return venv
    recent = None if retry else recorded_failure(root, FAILURE_TTL_S)
    if recent is not None:
        raise ProvisionError(str(recent.get("step")), str(recent.get("detail")),
                             Path(recent["log"]) if recent.get("log") else None)
    say(f"first start of attune {version}: installing its Python dependencies into {venv} "
        f"({'uv' if shutil.which('uv') and not os.environ.get('ATTUNE_NO_UV') else 'pip'}; log {log})")
    t0 = time.monotonic()
    with open(log, "ab") as fh:
        fh.write(f"\n== provisioning attune {version} at {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
    try:
        build(venv, deps, log)
    except ProvisionError as exc:
        record_failure(venv, exc)
        raise
    failure_path(venv).unlink(missing_ok=True)
    marker = {"version": version, "dependencies": deps, "python": tag,
              "seconds": round(time.monotonic() - t0, 1), "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
    venvs.write_marker(venv, marker)
    say(f"environment ready in {marker['seconds']}s")
    return venv


def start_builder(root: Path) -> tuple[subprocess.Popen[bytes], Path, Path]:
    """Start the detached builder process: (process, its status file, the environment it builds).

    Claude Code may kill a launcher (a slow first start, the session ending); the build runs in its
    own session and finishes anyway: the next start finds it ready."""
    _, _, _, venv = target(root)
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
    return builder, status, venv


def wait_builder(builder: subprocess.Popen[bytes], status: Path, venv: Path) -> Path:
    """The environment once the builder is done, or the ProvisionError it reported."""
    code = builder.wait()
    try:
        result = json.loads(status.read_text())
        status.unlink()
    except (OSError, ValueError):
        result = {}
    if code == 0 and is_ready(venv):
        return venv
    raise ProvisionError(result.get("step", "provisioning"), result.get("detail", f"the builder exited with {code}"),
                         Path(result["log"]) if result.get("log") else venv.parent / f"{venv.name}.log")


def provision_detached(root: Path) -> Path:
    """Provision in a detached builder process and wait for it."""
    venv = target(root)[3]
    if is_ready(venv):
        return venv
    return wait_builder(*start_builder(root))


def _provision_worker(status: Path) -> int:
    try:
        venv = provision(plugin_root(), retry=False)
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
    lines.append(f"  fix:   {FIX}")
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


def _spec_fields(spec: Path) -> tuple[str | None, str, str | None]:
    """(`gate.lists`, `model`, `gate.list_sha256`) of campaign.yaml, read with the core's strict YAML subset
    (the reader the hooks use; the control plane refuses a campaign.yaml it cannot read). Unreadable:
    nothing, and the gate server reports the missing list on its first call."""
    from attune.core import gatelists, yamlsubset

    try:
        data = yamlsubset.load_file(str(spec))
        lists, model = gatelists.spec_fields(data)
    except (OSError, ValueError):
        return None, "", None
    gate = data.get("gate") if isinstance(data.get("gate"), dict) else {}
    sha = gate.get("list_sha256")
    return lists, model, sha if isinstance(sha, str) and sha else None


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
        from attune.core import gatelists

        lists, model, spec_sha = _spec_fields(campaign / "campaign.yaml")
        sha = _pinned_list_sha(campaign) or spec_sha
        if (lists or model) and not os.environ.get("ATTUNE_GATE_MODEL"):
            # the control plane's rule: a bare name is a built-in list (the gate server knows it by name),
            # else a list file, relative to the campaign directory
            env["ATTUNE_GATE_MODEL"] = gatelists.source(lists, model, str(campaign))[1]
        if sha and not os.environ.get("ATTUNE_GATE_LIST_SHA256"):
            env["ATTUNE_GATE_LIST_SHA256"] = sha
    return env


def server_env(module: str, root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(campaign_env(module))
    env["PYTHONPATH"] = str(root)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("ATTUNE_PLUGIN_ROOT", str(root))
    return env


def exec_server(python: str, module: str, args: list[str], root: Path) -> None:
    os.execve(python, [python, "-m", module, *args], server_env(module, root))

# ----------------------------------------------------------------------------------- first start


def load_schemas(name: str) -> dict | None:
    """The recorded `initialize` result and tools of server `name` (None: not recorded)."""
    try:
        data = json.loads(SCHEMAS.read_text())
    except (OSError, ValueError):
        return None
    entry = data.get("servers", {}).get(name) if isinstance(data, dict) else None
    return entry if isinstance(entry, dict) and "initialize" in entry and "tools" in entry else None


class FirstStartProxy:
    """MCP over stdio while the environment builds, then a relay to the real server.

    Answers initialize, ping and the list methods from the recorded schemas at once; holds every other
    request until the build is done; then starts the server, replays `initialize` to it (its answer is
    not forwarded: the client has one), sends the held requests and relays both ways. On a failed
    build each held or later tool call is answered with the failure as a tool error."""

    INIT_ID = "attune-launch-initialize"

    def __init__(self, name: str, module: str, args: list[str], root: Path, schemas: dict) -> None:
        import threading

        self.name, self.module, self.args, self.root, self.schemas = name, module, args, root, schemas
        self.lock = threading.Lock()
        self.out_lock = threading.Lock()
        self.init_params: dict | None = None
        self.initialized = False
        self.pending: list[dict] = []
        self.child: subprocess.Popen[bytes] | None = None
        self.failure: str | None = None
        self.waiter: threading.Thread | None = None

    # --- output ------------------------------------------------------------------------------
    def send(self, obj: dict) -> None:
        data = (json.dumps(obj, separators=(",", ":")) + "\n").encode()
        with self.out_lock:
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()

    def reply(self, msg: dict, result: dict) -> None:
        self.send({"jsonrpc": "2.0", "id": msg["id"], "result": result})

    def error(self, msg: dict, code: int, text: str) -> None:
        self.send({"jsonrpc": "2.0", "id": msg["id"], "error": {"code": code, "message": text}})

    def tool_failure(self, msg: dict) -> None:
        if msg.get("method") == "tools/call":
            self.reply(msg, {"content": [{"type": "text", "text": self.failure or "attune is not available"}],
                             "isError": True})
        elif "id" in msg:
            self.error(msg, -32603, self.failure or "attune is not available")

    # --- before the server runs -------------------------------------------------------------------
    def handle_local(self, msg: dict) -> bool:
        """Answer `msg` here if it can be; False: it waits for the real server."""
        method = msg.get("method")
        if "id" not in msg:  # a notification
            if method == "notifications/initialized":
                self.initialized = True
            elif method == "notifications/cancelled":
                rid = (msg.get("params") or {}).get("requestId")
                self.pending = [m for m in self.pending if m.get("id") != rid]
            return True
        if method == "initialize":
            self.init_params = dict(msg.get("params") or {})
            result = json.loads(json.dumps(self.schemas["initialize"]))
            asked = self.init_params.get("protocolVersion")
            if isinstance(asked, str) and asked in self.schemas.get("protocol_versions", [asked]):
                result["protocolVersion"] = asked
            self.reply(msg, result)
            return True
        if method == "ping":
            self.reply(msg, {})
            return True
        if method == "tools/list":
            self.reply(msg, {"tools": self.schemas["tools"]})
            return True
        for lister, key in (("resources/list", "resources"), ("resources/templates/list", "resourceTemplates"),
                            ("prompts/list", "prompts")):
            if method == lister:
                self.reply(msg, {key: []})
                return True
        return False

    def start_waiter(self) -> None:
        import threading

        if self.waiter is None:
            self.waiter = threading.Thread(target=self._wait_then_start, name="attune-launch", daemon=True)
            self.waiter.start()

    def _wait_then_start(self) -> None:
        try:
            venv = wait_builder(*self.builder)
            self._start_child(venv)
        except ProvisionError as exc:
            say(failure_message(self.name, exc))
            with self.lock:
                self.failure = failure_message(self.name, exc)
                held, self.pending = self.pending, []
            for m in held:
                self.tool_failure(m)
        except Exception as exc:  # the server did not come up: say so to every held call
            msg = f"attune's MCP server {self.name!r} could not start: {type(exc).__name__}: {exc}"
            say(msg)
            with self.lock:
                self.failure = msg
                held, self.pending = self.pending, []
            for m in held:
                self.tool_failure(m)

    def _start_child(self, venv: Path) -> None:
        import threading

        env = server_env(self.module, self.root)
        py = str(venv_python(venv))
        child = subprocess.Popen([py, "-m", self.module, *self.args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 env=env)
        assert child.stdin is not None and child.stdout is not None
        init = {"jsonrpc": "2.0", "id": self.INIT_ID, "method": "initialize",
                "params": self.init_params or {"protocolVersion": self.schemas["initialize"].get("protocolVersion"),
                                               "capabilities": {}, "clientInfo": {"name": "attune-launch", "version": "1"}}}
        child.stdin.write((json.dumps(init) + "\n").encode())
        child.stdin.flush()
        while True:
            line = child.stdout.readline()
            if not line:
                raise RuntimeError(f"the server exited during initialize (status {child.wait()})")
            try:
                got = json.loads(line)
            except ValueError:
                continue
            if isinstance(got, dict) and got.get("id") == self.INIT_ID:
                if "error" in got:
                    raise RuntimeError(f"initialize failed: {got['error']}")
                break
        child.stdin.write((json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\n").encode())
        child.stdin.flush()
        threading.Thread(target=self._pump, args=(child,), name="attune-relay", daemon=True).start()
        with self.lock:
            for m in self.pending:
                child.stdin.write((json.dumps(m) + "\n").encode())
            child.stdin.flush()
            self.pending = []
            self.child = child
        say(f"server {self.name!r} ready; relaying")

    def _pump(self, child: subprocess.Popen[bytes]) -> None:
        assert child.stdout is not None
        for line in child.stdout:
            with self.out_lock:
                sys.stdout.buffer.write(line)
                sys.stdout.buffer.flush()
        os._exit(child.wait() or 0)  # the server ended: so does the session's connection

    # --- the loop --------------------------------------------------------------------------------
    def serve(self) -> int:
        self.builder = start_builder(self.root)
        self.start_waiter()
        for raw in sys.stdin.buffer:
            try:
                msg = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(msg, dict):
                continue
            with self.lock:
                child = self.child
                if child is None and self.failure is None:
                    if not self.handle_local(msg):
                        self.pending.append(msg)
                    continue
            if child is not None:
                assert child.stdin is not None
                try:
                    child.stdin.write(raw if raw.endswith(b"\n") else raw + b"\n")
                    child.stdin.flush()
                except OSError:
                    return 1
            elif not self.handle_local(msg):
                self.tool_failure(msg)
        with self.lock:
            child = self.child
        if child is not None and child.stdin is not None:
            try:
                child.stdin.close()
                child.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                child.kill()
        return 0


def write_schemas(root: Path) -> dict:
    """Ask each real server (on this interpreter, which must have the deps) for its initialize answer and tools."""
    out: dict = {"note": "written by mcp_servers/launch.py --write-schemas; served on a first start", "servers": {}}
    versions: list[str] = []
    for name, module in SERVERS.items():
        env = server_env(module, root)
        p = subprocess.Popen([sys.executable, "-m", module], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, env=env, cwd=str(root))
        assert p.stdin is not None and p.stdout is not None
        reqs = [{"jsonrpc": "2.0", "id": 1, "method": "initialize",
                 "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                            "clientInfo": {"name": "attune-schemas", "version": "1"}}},
                {"jsonrpc": "2.0", "method": "notifications/initialized"},
                {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}]
        for r in reqs:
            p.stdin.write((json.dumps(r) + "\n").encode())
        p.stdin.flush()
        got: dict = {}
        while len(got) < 2:
            line = p.stdout.readline()
            if not line:
                raise RuntimeError(f"server {name} exited before answering")
            msg = json.loads(line)
            if msg.get("id") in (1, 2):
                got[msg["id"]] = msg["result"]
        p.stdin.close()
        p.wait(timeout=30)
        init = got[1]
        init.pop("protocolVersion", None)
        out["servers"][name] = {"initialize": {"protocolVersion": "2025-06-18", **init}, "tools": got[2]["tools"]}
        versions.append(name)
    for entry in out["servers"].values():
        entry["protocol_versions"] = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"]
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        sys.stderr.write(__doc__ or "")
        return 2 if not argv else 0
    root = plugin_root()
    if argv[0] == "--provision-worker" and len(argv) == 2:
        return _provision_worker(Path(argv[1]))
    if argv[0] == "--write-schemas":
        data = write_schemas(root)
        SCHEMAS.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        print(SCHEMAS)
        return 0
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
        venv = target(root)[3]
    except ProvisionError as exc:
        say(failure_message(name, exc))
        return 1
    if is_ready(venv):  # a warm start: the server itself, at once
        exec_server(str(venv_python(venv)), module, rest, root)
    schemas = load_schemas(name)
    if schemas is None:  # no recorded schemas (a --module run): build first, then start
        try:
            venv = provision_detached(root)
        except ProvisionError as exc:
            say(failure_message(name, exc))
            return 1
        exec_server(str(venv_python(venv)), module, rest, root)
    try:
        return FirstStartProxy(name, module, rest, root, schemas).serve()
    except ProvisionError as exc:
        say(failure_message(name, exc))
        return 1


if __name__ == "__main__":
    sys.exit(main())
