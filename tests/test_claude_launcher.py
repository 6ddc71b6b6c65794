"""The headless launcher (`attune tune --tuner claude`): installed plugin, Stop-hook cap, resume.

`claude` is a stand-in script here (the launcher's side of the contract: its arguments, its
environment, its exit); tests/e2e runs the real Claude Code. The stand-in lists an installed attune
plugin, ends its first session "successfully" before the campaign is done (as Claude Code does once
a Stop hook has blocked too often), and records a stop in its second session.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from attune.app.headless import STOP_HOOK_BLOCK_CAP, ClaudeLauncher, agent_done
from attune.core.state import load
from tests._broker_helpers import ROOT, make_campaign

STUB = """#!{python}
import json, os, sys
log = os.path.join({log!r})
if sys.argv[1:3] == ["plugin", "list"]:
    print(json.dumps([{{"id": "other@x", "enabled": True, "installPath": "/nowhere"}},
                      {{"id": "attune@attune", "enabled": True, "installPath": {install!r}}}]))
    sys.exit(0)
calls = json.load(open(log)) if os.path.exists(log) else []
calls.append({{"argv": sys.argv[1:], "cap": os.environ.get("CLAUDE_CODE_STOP_HOOK_BLOCK_CAP"),
              "attune_python": os.environ.get("ATTUNE_PYTHON"), "campaign": os.environ.get("ATTUNE_CAMPAIGN_DIR")}})
json.dump(calls, open(log, "w"))
print(json.dumps({{"type": "system", "subtype": "init", "session_id": "sess-1"}}))
if len(calls) == 2:  # the resumed session finishes the agent's part
    sys.path.insert(0, {root!r})
    from attune.control.campaign import record_stop
    record_stop(os.environ["ATTUNE_CAMPAIGN_DIR"], ["step"], "measured enough")
print(json.dumps({{"type": "result", "subtype": "success", "is_error": False, "num_turns": 9, "session_id": "sess-1"}}))
"""


def test_the_launcher_uses_the_installed_plugin_raises_the_cap_and_resumes(tmp_path: Path) -> None:
    d = make_campaign(tmp_path, search_rules="off")  # the stand-in stops without calibrating: no rules here
    log = tmp_path / "calls.json"
    stub = tmp_path / "claude"
    stub.write_text(STUB.format(python=sys.executable, log=str(log), install=str(tmp_path / "installed"),
                                root=str(ROOT)))
    stub.chmod(0o755)
    out: list[str] = []

    class Say:
        def write(self, s: str) -> None:
            out.append(s)

        def flush(self) -> None:
            pass

    launcher = ClaudeLauncher(d, claude=str(stub), max_attempts=5, backoff_s=0, log=Say())
    assert launcher.installed and launcher.installed["id"] == "attune@attune"
    assert launcher.run() == 0
    calls = json.loads(log.read_text())
    assert len(calls) == 2, calls
    first, second = calls
    # the installed plugin is used: no --plugin-dir; the cap is raised; the servers need no build
    assert "--plugin-dir" not in first["argv"] and "--plugin-dir" not in second["argv"]
    assert first["cap"] == second["cap"] == STOP_HOOK_BLOCK_CAP and int(STOP_HOOK_BLOCK_CAP) > 8
    assert first["attune_python"] == sys.executable and first["campaign"] == str(d.resolve())
    assert first["argv"][1].startswith("/goal ") and "--resume" not in first["argv"]
    # the session ended "successfully" before the campaign's search was done: it was resumed
    assert second["argv"][second["argv"].index("--resume") + 1] == "sess-1"
    text = "".join(out)
    assert "installed plugin attune@attune" in text and "ended the session before" in text
    assert agent_done(load(d)[0])
    session = json.loads((d / "session.json").read_text())
    assert [a["resumed"] for a in session["attempts"]] == [False, True]


def test_a_failed_campaign_is_not_resumed(tmp_path: Path) -> None:
    d = make_campaign(tmp_path)
    from attune.core.ledger import Ledger

    Ledger(d).append("campaign_failed", {"reason": "no valid calibration", "phase": "calibration"})
    import io

    launcher = ClaudeLauncher(d, claude="/nonexistent/claude", plugin_dir=ROOT, max_attempts=3, backoff_s=0,
                              log=io.StringIO())
    assert launcher.run() == 0  # nothing to run: `attune tune` then reports the failure (exit 1)
    assert not (d / "session.json").exists()
