"""A campaign session in the real Claude Code, driven by a scripted model.

One headless session (`claude -p --plugin-dir <repo>`) in a tinygpt campaign on the local backend:
the plugin loads and its four MCP servers connect; the scripted agent is refused a network command
and an edit of the correctness list (by the PreToolUse hook, inside the real client); it launches a
candidate through the broker, waits for it, and reads its metrics; its first attempt to end the
session is blocked by the Stop hook with the hook's reason; after record_stop and the shipping step
the session ends.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from attune import campaign as campaign_mod
from tests.e2e.harness import ROOT, run_session
from tests.e2e.model_server import Block, ScriptedModel, all_text, result_text, text, tool_results, tool_use

EXAMPLE = ROOT / "examples" / "campaigns" / "tinygpt-local" / "campaign.yaml"
SERVERS = ("broker", "metrics", "traces", "gate")


def mcp(server: str, tool: str) -> str:
    return f"mcp__plugin_attune_{server}__{tool}"


@pytest.fixture
def campaign(tmp_path: Path) -> Path:
    d = tmp_path / "campaign"
    d.mkdir()
    shutil.copy(EXAMPLE, d / "campaign.yaml")
    campaign_mod.start(d)
    return d


class Agent:
    """The scripted agent: yields tool calls and reads what came back."""

    def __init__(self, model: ScriptedModel) -> None:
        self.model = model
        self.seen: dict[str, str] = {}  # tool_use_id -> result text
        self.errors: dict[str, bool] = {}

    def call(self, name: str, tool_input: dict[str, Any]) -> Iterator[list[Block]]:
        block = tool_use(name, tool_input)
        yield [block]
        for r in tool_results(self.model.current):
            self.seen[r["tool_use_id"]] = result_text(r)
            self.errors[r["tool_use_id"]] = bool(r.get("is_error"))
        self.last_id = block["id"]

    @property
    def last(self) -> str:
        return self.seen.get(self.last_id, "")

    def last_json(self) -> dict[str, Any]:
        return json.loads(self.last)


def test_campaign_session(claude: str, campaign: Path, tmp_path: Path) -> None:
    missing = [s for s in SERVERS if not (ROOT / "mcp_servers" / f"{s}_server.py").exists()]
    if missing and not os.environ.get("ATTUNE_E2E_PARTIAL"):
        pytest.skip(f"MCP server module(s) not present yet: {missing}")
    gate_list = ROOT / "gate" / "lists" / "tinygpt.yaml"
    notes: dict[str, Any] = {}

    def script(model: ScriptedModel) -> Iterator[list[Block]]:
        a = Agent(model)
        yield from a.call("Bash", {"command": "curl -s http://example.com", "description": "fetch"})
        notes["curl"] = (a.last, a.errors[a.last_id])
        yield from a.call("Read", {"file_path": str(gate_list)})
        notes["read_list"] = (a.last, a.errors[a.last_id])
        first = gate_list.read_text().splitlines()[0]  # unique, so the client's own checks pass
        yield from a.call("Edit", {"file_path": str(gate_list), "old_string": first, "new_string": "# mine"})
        notes["edit_list"] = (a.last, a.errors[a.last_id])
        yield from a.call("Bash", {"command": "ls", "description": "list the campaign"})
        notes["ls"] = (a.last, a.errors[a.last_id])
        yield from a.call(mcp("metrics", "campaign_measurements"), {})
        notes["measurements"] = (a.last, a.errors[a.last_id])
        yield [text("I think the campaign is done.")]
        notes["after_first_stop"] = all_text(model.current)

    session = run_session(campaign, script, tmp_path, max_turns=10)
    status = session.mcp_status()
    want = {f"plugin:attune:{n}": "connected" for n in SERVERS if n not in missing}
    assert want.items() <= status.items(), session.describe()
    assert not session.init.get("plugin_errors"), session.describe()
    out, err = notes["curl"]
    assert err and "curl is a network tool" in out, out
    out, err = notes["read_list"]
    assert not err, out
    out, err = notes["edit_list"]
    assert err and "never writable" in out, out
    assert "campaign.yaml" in notes["ls"][0]
    assert not notes["measurements"][1], notes["measurements"][0]
    assert "Stop hook feedback" in notes["after_first_stop"]
    assert "the campaign is not finished" in notes["after_first_stop"]
    decisions = [(r["event"], r.get("tool"), r["decision"]) for r in session.hook_log()]
    assert ("PreToolUse", "Bash", "deny") in decisions and ("PreToolUse", "Edit", "deny") in decisions
    assert ("Stop", None, "block") in decisions

