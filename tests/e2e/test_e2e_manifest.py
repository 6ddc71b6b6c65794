"""The plugin as the real Claude Code CLI sees it: validation for the public catalog, marketplace install."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from attune.core import plugin_servers
from tests.e2e.harness import ROOT, clean_env


def test_validate_strict_with_the_directory_profile(claude: str, tmp_path: Path) -> None:
    p = subprocess.run([claude, "plugin", "validate", str(ROOT), "--strict", "--profile", "directory"],
                       capture_output=True, text=True, env=clean_env(tmp_path), timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    for server in plugin_servers.SERVERS:
        assert f"mcpServers: {server} stdio" in p.stdout
    for event in ("SessionStart", "PreToolUse", "Stop"):
        assert f"hooks: {event}" in p.stdout


def test_a_team_adds_the_repository_as_a_marketplace_and_installs_attune(claude: str, tmp_path: Path) -> None:
    env = clean_env(tmp_path)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([claude, "plugin", *args], capture_output=True, text=True, env=env, timeout=180)

    added = cli("marketplace", "add", str(ROOT))
    assert added.returncode == 0, added.stdout + added.stderr
    installed = cli("install", "attune@attune")
    assert installed.returncode == 0, installed.stdout + installed.stderr
    listed = cli("list", "--json")
    assert listed.returncode == 0, listed.stderr
    plugins = json.loads(listed.stdout)
    entry = next(p for p in plugins if p["id"] == "attune@attune")
    version = json.loads((ROOT / ".claude-plugin" / "plugin.json").read_text())["version"]
    assert entry["version"] == version and entry["enabled"] is True
    assert set(entry["mcpServers"]) == set(plugin_servers.SERVERS)
