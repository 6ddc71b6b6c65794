"""The headless launcher: run a campaign with Claude Code and resume it until it is done.

`attune tune campaign.yaml --tuner claude` starts `claude -p "/goal ..."` in the campaign
directory with the attune plugin, records the session id in `session.json`, and whenever the
process ends (a crash, a forced stop, a turn limit, the machine's reboot followed by a rerun of the
same command) while the ledger lacks a stop and a shipped result, resumes that session with
`--resume`. Once the stop is recorded the agent's part is over: the broker's control plane ships
(checks, shipped recipe, final re-measurement) and `attune tune` waits for it. The ledger, not the session, is the source of truth: a resumed or fresh session
rebuilds the campaign from it (the SessionStart hook gives the agent its state).

The plugin: the one installed in Claude Code (`claude plugin list`) when there is one, else this
checkout's (`--plugin-dir`). Its MCP servers run on attune's own interpreter (ATTUNE_PYTHON), so no
environment is built for them. Claude Code ends a session after a Stop hook has blocked it
CLAUDE_CODE_STOP_HOOK_BLOCK_CAP times in a row (8 by default): the launcher raises that cap so the
hook can keep the session going, and when Claude Code ends a session anyway before the agent's part
is done, the launcher resumes it. A campaign that ended failed is over: nothing is resumed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from attune.core import plugin_servers
from attune.core.campaign_paths import SESSION_FILE
from attune.core.state import CampaignState, load

STOP_HOOK_BLOCK_CAP = "1000"  # Claude Code's default is 8 consecutive blocks
GOAL = (
    "/goal Tune the training recipe of the attune campaign in this directory (campaign.yaml) for "
    "throughput with the attune skill, until the campaign's ledger has a stop recorded with evidence "
    "(or the budget is spent) and a shipped result. Never change what the model learns."
)
RESUME_PROMPT = (
    "Continue the attune campaign in this directory where it left off: read its state from the "
    "campaign status tool, then carry on with the campaign loop of the attune skill."
)


def agent_done(state: CampaignState) -> bool:
    """The agent's part is over: a stop is recorded (or the budget is spent), or the campaign failed.
    Shipping is the control plane's (the broker runs it after the stop), so a session that ends after
    this is not resumed."""
    return (state.stop is not None or state.shipped is not None or state.failed is not None
            or (state.budget.spent and not state.in_flight))


def default_plugin_dir() -> Path | None:
    """The plugin root when attune runs from a checkout (an editable install) of the plugin."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / ".claude-plugin" / "plugin.json").is_file() else None


def installed_plugin(claude: str, env: dict[str, str] | None = None) -> dict[str, Any] | None:
    """The attune plugin installed (and enabled) in Claude Code, from `claude plugin list --json`."""
    try:
        p = subprocess.run([claude, "plugin", "list", "--json"], capture_output=True, text=True, timeout=120,
                           env=env, stdin=subprocess.DEVNULL)
        plugins = json.loads(p.stdout) if p.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None
    for entry in plugins if isinstance(plugins, list) else []:
        if (isinstance(entry, dict) and str(entry.get("id", "")).split("@")[0] == "attune"
                and entry.get("enabled", True) and entry.get("installPath")):
            return entry
    return None


@dataclass
class SessionRecord:
    session_id: str | None = None
    attempts: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def load(cls, campaign_dir: Path) -> SessionRecord:
        p = campaign_dir / SESSION_FILE
        if not p.exists():
            return cls()
        try:
            data = json.loads(p.read_text())
        except ValueError:
            return cls()  # a torn write: start a fresh session; the ledger carries the state
        return cls(session_id=data.get("session_id"), attempts=list(data.get("attempts", [])))

    def save(self, campaign_dir: Path) -> None:
        p = campaign_dir / SESSION_FILE
        tmp = p.with_suffix(".tmp")
        tmp.write_text(json.dumps({"session_id": self.session_id, "attempts": self.attempts}, indent=2))
        os.replace(tmp, p)


class ClaudeLauncher:
    def __init__(
        self,
        campaign_dir: Path | str,
        claude: str = "claude",
        plugin_dir: Path | None = None,
        max_attempts: int = 20,
        backoff_s: float = 5.0,
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        log: Any = sys.stderr,
    ) -> None:
        self.dir = Path(campaign_dir).resolve()
        self.claude = claude
        self.installed: dict[str, Any] | None = None
        if plugin_dir is None:
            self.installed = installed_plugin(claude, {**os.environ, **(env or {})})
        self.plugin_dir = plugin_dir if plugin_dir is not None or self.installed else default_plugin_dir()
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.extra_args = list(extra_args)
        self.env = env
        self.log = log

    def _say(self, msg: str) -> None:
        print(f"attune tune: {msg}", file=self.log, flush=True)

    def argv(self, session_id: str | None) -> list[str]:
        allowed = ",".join(
            [plugin_servers.tool_prefix(s) for s in plugin_servers.SERVERS] + ["Read", "Grep", "Glob", "Bash", "Edit", "Write"]
        )
        cmd = [self.claude, "-p", RESUME_PROMPT if session_id else GOAL]
        if session_id:
            cmd += ["--resume", session_id]
        cmd += ["--output-format", "stream-json", "--verbose", "--allowedTools", allowed]
        if self.plugin_dir is not None:
            cmd += ["--plugin-dir", str(self.plugin_dir)]
        return cmd + self.sandbox_args() + self.extra_args

    def sandbox_args(self) -> list[str]:
        """Claude Code's OS sandbox for this campaign (attune/app/sandbox.py): writes only to notes/, no
        reads of the broker's token, the ledger keys, the plugin's data or other campaigns, no network."""
        from attune.app import sandbox

        return ["--settings", sandbox.settings_json(self.dir, self.plugin_dir)]

    def session_env(self) -> dict[str, str]:
        return {
            **os.environ,
            # Wait for the plugin's MCP servers before the first turn.
            "MCP_CONNECTION_NONBLOCKING": "false",
            "MCP_TIMEOUT": os.environ.get("MCP_TIMEOUT", "180000"),
            "MCP_CONNECT_TIMEOUT_MS": os.environ.get("MCP_CONNECT_TIMEOUT_MS", "180000"),
            # The Stop hook keeps the session going until the campaign is done: raise Claude Code's cap.
            "CLAUDE_CODE_STOP_HOOK_BLOCK_CAP": os.environ.get("CLAUDE_CODE_STOP_HOOK_BLOCK_CAP", STOP_HOOK_BLOCK_CAP),
            # The servers run on attune's own interpreter, which has their dependencies: nothing to build.
            "ATTUNE_PYTHON": os.environ.get("ATTUNE_PYTHON", sys.executable),
            **(self.env or {}),
            "ATTUNE_CAMPAIGN_DIR": str(self.dir),
        }

    def run_once(self, record: SessionRecord) -> int:
        argv = self.argv(record.session_id)
        started = datetime.now(UTC).isoformat()
        env = self.session_env()
        proc = subprocess.Popen(argv, cwd=self.dir, stdout=subprocess.PIPE, stderr=None, text=True, env=env)
        assert proc.stdout is not None
        result: dict[str, Any] = {}
        for line in proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            sid = event.get("session_id")
            if sid and sid != record.session_id:
                record.session_id = sid
                record.save(self.dir)
            if event.get("type") == "result":
                result = {k: event.get(k) for k in ("subtype", "is_error", "num_turns", "total_cost_usd")}
        rc = proc.wait()
        record.attempts.append({"started": started, "exit_code": rc, "resumed": "--resume" in argv, **result})
        record.save(self.dir)
        return rc

    def run(self) -> int:
        from attune.app import sandbox

        why = sandbox.unavailable()
        if why:
            self._say(f"refusing to start: Claude Code's OS sandbox is unavailable here ({why}); a campaign "
                      "session runs only inside it")
            return 3
        record = SessionRecord.load(self.dir)
        where = (f"the installed plugin {self.installed['id']} ({self.installed['installPath']})" if self.installed
                 else f"the plugin at {self.plugin_dir}")
        self._say(f"Claude Code runs the campaign with {where}")
        for attempt in range(self.max_attempts):
            state, _ = load(self.dir)
            if agent_done(state):
                self._say(f"campaign {state.name}: the search is over (stop recorded); shipping is the control plane's")
                return 0
            how = f"resuming session {record.session_id}" if record.session_id else "starting a new session"
            self._say(f"attempt {attempt + 1}/{self.max_attempts}: {how}")
            rc = self.run_once(record)
            state, _ = load(self.dir)
            if agent_done(state):
                continue
            if rc != 0:
                self._say(f"claude exited with {rc}; resuming after {self.backoff_s:.0f}s")
                time.sleep(self.backoff_s)
            else:
                self._say("Claude Code ended the session before the campaign's search was done "
                          f"(missing: {'; '.join(state.missing_for_stop())}); resuming it")
        state, _ = load(self.dir)
        if agent_done(state):
            return 0
        self._say(f"gave up after {self.max_attempts} attempts; missing: {'; '.join(state.missing_for_stop())}")
        return 1
