"""Issue 24, class 2: one decision per Claude Code tool, checked against the pinned client's own tool
inventory (tests/data/claude_code_tools.json: the init event of Claude Code 2.1.332, plugin loaded).

A tool the table has not decided is denied, so a tool a later client adds is refused until someone
decides it; the tools that touch no files are allowed; content search is confined like Read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hooks.policy import DENIED_TOOLS, TOOLS, Policy, tool_kind

INVENTORY = json.loads((Path(__file__).parent / "data" / "claude_code_tools.json").read_text())
NO_FILE_TOOLS = ("ScheduleWakeup", "TaskStop", "SendMessage", "ListAgents")


@pytest.fixture
def policy(tmp_path: Path) -> Policy:
    camp = tmp_path / "camp"
    for d in ("notes", "runs/r001", ".broker"):
        (camp / d).mkdir(parents=True)
    (camp / ".broker" / "token").write_text("secret-token\n")
    return Policy.for_campaign(str(camp))


def test_the_inventory_is_the_pinned_clients() -> None:
    assert INVENTORY["version"] == "2.1.332" and "Bash" in INVENTORY["builtin_tools"]
    assert len(INVENTORY["builtin_tools"]) >= 20


@pytest.mark.parametrize("tool", INVENTORY["builtin_tools"])
def test_every_tool_of_the_pinned_client_is_decided(tool: str) -> None:
    assert tool_kind(tool) is not None, f"{tool} is offered by Claude Code 2.1.332 but not decided in hooks/policy.py"


@pytest.mark.parametrize("tool", INVENTORY["plugin_tools"])
def test_every_plugin_tool_is_allowed(policy: Policy, tool: str) -> None:
    assert policy.decide(tool, {}).decision == "allow"


@pytest.mark.parametrize("tool", ["FutureTool", "Bash2", "ReadSecrets", "", "read", "mcp__other__x"])
def test_a_tool_not_decided_is_denied(policy: Policy, tool: str) -> None:
    assert policy.decide(tool, {}).decision == "deny"


@pytest.mark.parametrize("tool", NO_FILE_TOOLS)
def test_tools_that_touch_no_files_are_allowed(policy: Policy, tool: str) -> None:
    assert tool in INVENTORY["builtin_tools"]
    assert policy.decide(tool, {"seconds": 60, "message": "x"}).decision == "allow"


@pytest.mark.parametrize("tool", sorted(DENIED_TOOLS))
def test_denied_tools_say_why(policy: Policy, tool: str) -> None:
    d = policy.decide(tool, {})
    assert d.decision == "deny" and DENIED_TOOLS[tool] in d.reason


def test_every_decided_kind_is_handled(policy: Policy) -> None:
    kinds = set(TOOLS.values())
    assert kinds <= {"shell", "read", "search", "write", "web", "resource", "safe", "denied"}


@pytest.mark.parametrize("tool,inp", [
    ("Grep", {"pattern": "secret"}),  # at the campaign root (the session's cwd): .broker/ is below
    ("Glob", {"pattern": "**/*"}),
    ("Glob", {"pattern": ".broker/*"}),
    ("Glob", {"pattern": "**/.broker/token", "path": "notes"}),
    ("Grep", {"pattern": "x", "glob": ".broker/**", "path": "notes"}),
    ("Grep", {"pattern": "x", "path": ".broker"}),
])
def test_content_search_never_reaches_a_closed_place(policy: Policy, tool: str, inp: dict[str, str]) -> None:
    assert policy.decide(tool, inp).decision == "deny"


@pytest.mark.parametrize("tool,inp", [
    ("Grep", {"pattern": "x", "path": "notes"}),
    ("Grep", {"pattern": "x", "path": "runs", "glob": "*.txt"}),
    ("Glob", {"pattern": "**/*.md", "path": "notes"}),
    ("Glob", {"pattern": "runs/*/log.txt", "path": "runs"}),
])
def test_content_search_inside_the_campaign_is_allowed(policy: Policy, tool: str, inp: dict[str, str]) -> None:
    assert policy.decide(tool, inp).decision == "allow"


def test_free_is_allowed(policy: Policy) -> None:
    for cmd in ("free -g", "free -h", "free"):
        assert policy.decide("Bash", {"command": cmd}).decision == "allow", cmd
    assert policy.decide("Bash", {"command": "free -s 1"}).decision == "deny"


def test_an_absolute_glob_is_judged_by_its_own_folder(policy: Policy) -> None:
    camp = policy.campaign
    assert policy.decide("Glob", {"pattern": f"{camp}/**", "path": f"{camp}/notes"}).decision == "deny"
    assert policy.decide("Glob", {"pattern": f"{camp}/notes/*.md"}).decision == "allow"
    assert policy.decide("Glob", {"pattern": "/etc/**"}).decision == "deny"
