"""The OS sandbox settings attune gives Claude Code for a campaign session, and the launcher's refusal
to start without a sandbox (tests/e2e/test_e2e_sandbox.py runs them in the real Claude Code)."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from attune.app import sandbox
from attune.app.headless import ClaudeLauncher
from hooks import policy as policy_mod

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def camp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    c = tmp_path / "campaigns" / "c1"
    (c / "notes").mkdir(parents=True)
    (c / "runs").mkdir()
    (c / "campaign.yaml").write_text("name: c1\n")
    (c / "ledger.jsonl").write_text("")
    (c / "scratch-by-job").write_text("x")
    (tmp_path / "campaigns" / "c2").mkdir()
    (tmp_path / "campaigns" / "c2" / "campaign.yaml").write_text("name: c2\n")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("CLAUDE_PLUGIN_DATA", str(tmp_path / "data"))
    return c


def test_protected_names_match_the_policy() -> None:
    assert set(sandbox.PROTECTED_IN_CAMPAIGN) == set(policy_mod.PROTECTED_IN_CAMPAIGN)


def test_settings_confine_writes_reads_and_network(camp: Path, tmp_path: Path) -> None:
    s = sandbox.settings(camp, ROOT)["sandbox"]
    assert s["enabled"] and s["failIfUnavailable"] and s["allowUnsandboxedCommands"] is False
    fs = s["filesystem"]
    assert fs["allowWrite"] == [str(camp / "notes"), str(ROOT / "skills" / "attune" / "catalog")]
    deny_w = set(fs["denyWrite"])
    # every protected name, present or not, and whatever else is at the campaign's top level
    for name in ("policy.yaml", "ledger.jsonl", "campaign.yaml", "runs", ".broker", "session.json", "scratch-by-job"):
        assert str(camp / name) in deny_w, name
    assert str(camp / "notes") not in deny_w
    assert {str(ROOT / "hooks"), str(tmp_path / "data"), str(tmp_path / "state" / "attune")} <= deny_w
    deny_r = fs["denyRead"]
    assert str(camp / ".broker") in deny_r and str(tmp_path / "state" / "attune") in deny_r
    assert str(tmp_path / "data") in deny_r
    assert str(Path.home() / ".claude" / "plugins" / "data") in deny_r  # where Claude Code keeps plugin data
    # the other campaigns: the directory holding them is closed, this campaign and the plugin re-opened
    assert str(tmp_path / "campaigns") in deny_r and str(camp) in fs["allowRead"] and str(ROOT) in fs["allowRead"]
    assert s["network"]["allowedDomains"] == [] and s["network"]["allowLocalBinding"] is False


def test_policy_write_paths_are_opened_in_the_sandbox_too(camp: Path) -> None:
    (camp / "policy.yaml").write_text("write_paths: [scratch]\nread_paths: [/opt/fw]\n")
    fs = sandbox.settings(camp, ROOT)["sandbox"]["filesystem"]
    assert str(camp / "scratch") in fs["allowWrite"] and str(camp / "scratch") not in fs["denyWrite"]
    assert "/opt/fw" in fs["allowRead"]


def test_unavailable_without_bubblewrap(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    if not sys.platform.startswith("linux"):
        pytest.skip("Linux only")
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on PATH
    why = sandbox.unavailable()
    assert why and "bwrap" in why and "socat" in why and "apt-get install" in why


def test_launcher_refuses_to_start_without_a_sandbox(camp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox, "unavailable", lambda: "bwrap not found on PATH")
    log = io.StringIO()
    rc = ClaudeLauncher(camp, claude="/nonexistent/claude", log=log).run()
    assert rc == 3 and "sandbox is unavailable" in log.getvalue() and "bwrap" in log.getvalue()
    assert not (camp / "session.json").exists()  # no session was started


def test_launcher_passes_the_sandbox_settings(camp: Path) -> None:
    argv = ClaudeLauncher(camp, claude="claude", plugin_dir=ROOT).argv(None)
    settings = json.loads(argv[argv.index("--settings") + 1])
    assert settings["sandbox"]["filesystem"]["allowWrite"][0] == str(camp / "notes")


def test_only_the_lessons_file_stays_writable_in_the_plugin(camp: Path) -> None:
    fs = sandbox.settings(camp, ROOT)["sandbox"]["filesystem"]
    catalog = ROOT / "skills" / "attune" / "catalog"
    assert str(catalog) in fs["allowWrite"]  # add_lesson.py writes a temporary file there, then renames
    deny = set(fs["denyWrite"])
    for p in (catalog / "levers.yaml", catalog / "models.yaml", ROOT / "hooks", ROOT / "gate",
              ROOT / "skills" / "attune" / "SKILL.md", ROOT / "skills" / "attune" / "scripts", ROOT / "attune"):
        assert str(p) in deny, p
    assert str(catalog / "lessons.yaml") not in deny and str(ROOT) not in deny


def test_a_campaign_inside_the_plugin_keeps_its_notes_writable(tmp_path: Path) -> None:
    root = tmp_path / "plugin"
    camp = root / "examples" / "c"
    (camp / "notes").mkdir(parents=True)
    (camp / "campaign.yaml").write_text("name: c\n")
    (root / "hooks").mkdir()
    (root / "examples" / "other").mkdir()
    fs = sandbox.settings(camp, root)["sandbox"]["filesystem"]
    deny = set(fs["denyWrite"])
    assert str(camp / "notes") in fs["allowWrite"]
    assert not any(Path(d) in (camp / "notes").parents or d == str(camp / "notes") for d in deny), deny
    assert {str(root / "hooks"), str(root / "examples" / "other"), str(camp / "campaign.yaml")} <= deny


def test_cli_prints_the_settings_and_checks(camp: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    from attune.app.cli import main

    assert main(["sandbox", str(camp)]) == 0
    settings = json.loads(capsys.readouterr().out)
    assert settings["sandbox"]["filesystem"]["allowWrite"][0] == str(camp / "notes")
    assert main(["sandbox", str(camp / "notes")]) == 2
    assert "holds no campaign.yaml" in capsys.readouterr().err
    monkeypatch.setattr(sandbox, "unavailable", lambda: "socat not found on PATH")
    assert main(["sandbox", str(camp), "--check", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["available"] is False and "socat" in out["reason"]
