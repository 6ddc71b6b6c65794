"""attune's MCP server list is defined once (attune/core/plugin_servers.py); the static plugin files and
every reader agree with it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from attune.app import headless as launcher
from attune.core import plugin_servers
from hooks import policy
from mcp_servers import launch

ROOT = Path(__file__).resolve().parents[1]


def test_mcp_json_is_the_one_definition() -> None:
    assert json.loads((ROOT / ".mcp.json").read_text()) == plugin_servers.mcp_json(), (
        ".mcp.json differs from attune/core/plugin_servers.mcp_json()")


def test_the_plugin_name_gives_the_tool_prefix() -> None:
    assert json.loads((ROOT / ".claude-plugin" / "plugin.json").read_text())["name"] == plugin_servers.PLUGIN
    assert plugin_servers.tool_prefix("broker") == "mcp__plugin_attune_broker"


def test_every_server_has_its_module_and_recorded_schemas() -> None:
    assert tuple(launch.SERVERS) == plugin_servers.SERVERS
    recorded = json.loads((ROOT / "mcp_servers" / "tool_schemas.json").read_text())
    assert tuple(sorted(recorded["servers"])) == tuple(sorted(plugin_servers.SERVERS))
    for s in plugin_servers.SERVERS:
        assert (ROOT / (plugin_servers.module(s).replace(".", "/") + ".py")).is_file(), s


def test_the_hook_policy_and_the_tune_launcher_read_it(tmp_path: Path) -> None:
    camp = tmp_path / "c"
    camp.mkdir()
    (camp / "campaign.yaml").write_text("name: c\n")
    pol = policy.Policy.for_campaign(str(camp))
    for s in plugin_servers.SERVERS:
        assert pol.decide(plugin_servers.tool_prefix(s) + "__anything", {}).decision == "allow", s
    assert pol.decide("mcp__plugin_attune_other__x", {}).decision == "deny"
    assert pol.decide("ReadMcpResourceTool", {"server": "plugin:attune:gate"}).decision == "allow"
    assert "plugin_servers.SERVERS" in Path(launcher.__file__).read_text()


def test_no_other_copy_of_the_list() -> None:
    pattern = re.compile(r"""["']broker["'],\s*["']metrics["'],\s*["']traces["'],\s*["']gate["']""")
    hits = []
    for d in ("attune", "hooks", "mcp_servers", "broker", "gate", "tests", "benchmarks", "skills"):
        for p in (ROOT / d).rglob("*.py"):
            if p in (ROOT / "attune" / "core" / "plugin_servers.py", Path(__file__).resolve()):
                continue
            if pattern.search(p.read_text()):
                hits.append(str(p.relative_to(ROOT)))
    assert not hits, hits


def test_the_launcher_script_finds_the_list_without_an_installed_attune(tmp_path: Path) -> None:
    """.mcp.json runs launch.py as a script with any python3: it must find the list in the plugin root."""
    p = subprocess.run([sys.executable, "-I", "-S", str(ROOT / "mcp_servers" / "launch.py"), "nope"],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert p.returncode == 2
    assert "expected one of broker, metrics, traces, gate" in p.stderr
