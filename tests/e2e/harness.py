"""Run the real Claude Code CLI against the plugin, with a scripted model (tests/e2e/model_server.py).

`claude_binary()` finds the pinned CLI (ATTUNE_CLAUDE, else the cache that
scripts/install_claude_code.sh fills), installing it with npm when it is missing; the e2e tests
skip, saying why, only when it cannot be installed. `run_session()` starts a headless session
(`claude -p --plugin-dir <repo> --output-format stream-json`) in a campaign directory, with HOME
in a temporary directory, the API pointed at the scripted model, and the MCP servers waited for at
start (MCP_CONNECTION_NONBLOCKING=false), and returns its events.

The servers run on this interpreter (ATTUNE_PYTHON), which has attune's dependencies: provisioning
a venv from the package index is covered by tests/test_launcher.py, by the installed-plugin sessions
of tests/e2e/test_e2e_plugin.py (a fresh HOME, no variables), and timed by
benchmarks/bench_plugin.py --provision, not repeated in every session.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.e2e.model_server import Block, ScriptedModel, Step

ROOT = Path(__file__).resolve().parents[2]
CLAUDE_CODE_VERSION = os.environ.get("CLAUDE_CODE_VERSION", "2.1.332")
INSTALL_SCRIPT = ROOT / "scripts" / "install_claude_code.sh"

_found: tuple[str | None, str] | None = None


def _works(path: str) -> bool:
    try:
        p = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return p.returncode == 0 and "Claude Code" in p.stdout


def claude_binary() -> tuple[str | None, str]:
    """(path to a working `claude`, "") or (None, why it could not be found or installed)."""
    global _found
    if _found is not None:
        return _found
    explicit = os.environ.get("ATTUNE_CLAUDE")
    if explicit:
        _found = (explicit, "") if _works(explicit) else (None, f"ATTUNE_CLAUDE={explicit} does not run")
        return _found
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attune"
    cached = cache / f"claude-code-{CLAUDE_CODE_VERSION}" / "node_modules" / ".bin" / "claude"
    if _works(str(cached)):
        _found = (str(cached), "")
        return _found
    if not shutil.which("npm"):
        _found = (None, "Claude Code is not installed and npm is not on PATH to install it "
                        "(run scripts/install_claude_code.sh, or set ATTUNE_CLAUDE)")
        return _found
    try:
        p = subprocess.run(["bash", str(INSTALL_SCRIPT)], capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        _found = (None, "npm install @anthropic-ai/claude-code timed out")
        return _found
    path = p.stdout.strip().splitlines()[-1] if p.returncode == 0 and p.stdout.strip() else ""
    if path and _works(path):
        _found = (path, "")
    else:
        _found = (None, f"npm install @anthropic-ai/claude-code@{CLAUDE_CODE_VERSION} failed: {p.stderr[-500:]}")
    return _found


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """An environment with nothing of the caller's Claude Code or attune settings.

    No API key unless given: with one, `claude plugin ...` commands stall ~17 s on a network call."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CLAUDE", "ANTHROPIC", "ATTUNE_", "MCP_")) and k not in ("PYTHONPATH",)}
    env.update({
        "HOME": str(home),
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        **extra,
    })
    return env


@dataclass
class Session:
    events: list[dict[str, Any]]
    returncode: int
    stderr: str
    model: ScriptedModel
    campaign: Path
    seconds: float = 0.0
    results: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for ev in self.events:
            if ev.get("type") != "user":
                continue
            content = (ev.get("message") or {}).get("content")
            for block in content if isinstance(content, list) else []:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    self.results[block["tool_use_id"]] = block

    @property
    def init(self) -> dict[str, Any]:
        return next(e for e in self.events if e.get("type") == "system" and e.get("subtype") == "init")

    @property
    def result(self) -> dict[str, Any]:
        return next(e for e in reversed(self.events) if e.get("type") == "result")

    def mcp_status(self) -> dict[str, str]:
        return {s["name"]: s["status"] for s in self.init.get("mcp_servers", [])}

    def result_text(self, tool_use_id: str) -> str:
        block = self.results[tool_use_id]
        c = block.get("content")
        if isinstance(c, str):
            return c
        return "".join(x.get("text", "") for x in c or [] if isinstance(x, dict))

    def hook_log(self) -> list[dict[str, Any]]:
        path = self.campaign / "hooks.log.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def describe(self) -> str:
        """What happened, for assertion messages."""
        lines = [f"rc={self.returncode} ({self.seconds:.1f}s); stderr: {self.stderr[-800:]}",
                 f"model errors: {self.model.errors}"]
        for ev in self.events:
            lines.append(json.dumps(ev)[:300])
        return "\n".join(lines[-40:])


def stream_events(stdout: str) -> list[dict[str, Any]]:
    """The events of `claude -p --output-format stream-json` (one JSON object a line; other lines skipped)."""
    events = []
    for line in stdout.splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    return events


def run_session(campaign: Path, steps: list[Step] | Callable[[ScriptedModel], Iterator[list[Block]]], tmp: Path, *, prompt: str = "Tune this campaign.",
                max_turns: int = 30, timeout: float = 240, extra_env: dict[str, str] | None = None,
                extra_args: list[str] | None = None) -> Session:
    import time

    claude, why = claude_binary()
    if claude is None:
        raise RuntimeError(why)
    model = ScriptedModel(steps)
    url = model.start()
    home = tmp / "home"
    home.mkdir(exist_ok=True)
    env = clean_env(home, ANTHROPIC_BASE_URL=url, ANTHROPIC_API_KEY="sk-ant-e2e-scripted", ATTUNE_PYTHON=sys.executable,
                    MCP_CONNECTION_NONBLOCKING="false", MCP_TIMEOUT="90000", MCP_CONNECT_TIMEOUT_MS="90000",
                    **(extra_env or {}))
    cmd = [claude, "-p", prompt, "--plugin-dir", str(ROOT), "--output-format", "stream-json", "--verbose",
           "--max-turns", str(max_turns), *(extra_args or [])]
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, cwd=campaign, env=env, capture_output=True, text=True, timeout=timeout)
    finally:
        model.stop()
    return Session(stream_events(p.stdout), p.returncode, p.stderr, model, campaign, time.monotonic() - t0)
