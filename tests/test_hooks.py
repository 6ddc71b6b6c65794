"""The hook scripts as Claude Code runs them: a process per event, JSON on stdin and stdout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from attune.core.ledger import Ledger

ROOT = Path(__file__).resolve().parents[1]
HOOKS = ROOT / "hooks"


def run_hook(name: str, payload: dict[str, Any] | str, project: Path, *, project_env: bool = True,
             **env: str) -> tuple[dict[str, Any] | None, str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("ATTUNE_CAMPAIGN_DIR", "CLAUDE_PROJECT_DIR")}
    clean.update({"CLAUDE_PLUGIN_ROOT": str(ROOT), **env})
    if project_env:
        clean["CLAUDE_PROJECT_DIR"] = str(project)
    data = payload if isinstance(payload, str) else json.dumps({"cwd": str(project), "session_id": "s1", **payload})
    p = subprocess.run([sys.executable, "-I", "-S", str(HOOKS / f"{name}.py")], input=data, capture_output=True,
                       text=True, env=clean, timeout=30)
    assert p.returncode == 0, p.stderr
    return (json.loads(p.stdout) if p.stdout.strip() else None), p.stderr


def pre(tool: str, tool_input: Any, project: Path, **env: str) -> tuple[str, str]:
    out, _ = run_hook("pre_tool_use", {"tool_name": tool, "tool_input": tool_input}, project, **env)
    assert out is not None
    hso = out["hookSpecificOutput"]
    assert hso["hookEventName"] == "PreToolUse"
    return hso["permissionDecision"], hso["permissionDecisionReason"]


STARTED = {"name": "hooks-test", "spec_sha256": "0" * 64, "gpus": 2, "budget_gpu_hours": 1.0,
           "reserve_gpu_hours": 0.1, "calibration_runs": 5, "band_floor": 0.03, "band_k_sigma": 3.0}


@pytest.fixture
def camp(tmp_path: Path) -> Path:
    d = tmp_path / "camp"
    (d / "notes").mkdir(parents=True)
    (d / "campaign.yaml").write_text("name: hooks-test\n")
    Ledger(d).append("campaign_started", STARTED)
    return d


def _rows(d: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (d / "ledger.jsonl").read_text().splitlines()]


def _log(d: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (d / "hooks.log.jsonl").read_text().splitlines()]


def test_outside_a_campaign_every_hook_is_silent(tmp_path: Path) -> None:
    plain = tmp_path / "some-project"
    plain.mkdir()
    assert run_hook("pre_tool_use", {"tool_name": "Bash", "tool_input": {"command": "curl x"}}, plain)[0] is None
    assert run_hook("stop", {"stop_hook_active": False}, plain)[0] is None
    assert run_hook("session_start", {"source": "startup"}, plain)[0] is None
    assert not (plain / "hooks.log.jsonl").exists()


def test_stop_blocks_with_what_is_missing_until_stop_and_ship(camp: Path) -> None:
    led = Ledger(camp)
    led.append("launch_admitted", {"run_id": "r1", "kind": "search", "expected_gpu_hours": 0.01})
    out, _ = run_hook("stop", {"stop_hook_active": False}, camp)
    assert out is not None and out["decision"] == "block"
    reason = out["reason"]
    assert "budget is not spent" in reason and "no stop with evidence" in reason
    assert "r1" in reason and "in flight" in reason
    assert "shipping step has not run" in reason
    led.append("run_finished", {"run_id": "r1", "outcome": "ok", "charge_gpu_hours": 0.01})
    led.append("stop_recorded", {"leader": "baseline", "levers_tested": ["mbs"], "diagnosis": "compute bound"})
    out, _ = run_hook("stop", {"stop_hook_active": True}, camp)
    assert out is not None and out["decision"] == "block"
    assert "budget" not in out["reason"] and "in flight" not in out["reason"]
    assert "shipping step" in out["reason"]
    led.append("shipped", {"run_id": "baseline", "recipe": {}})
    out, _ = run_hook("stop", {"stop_hook_active": True}, camp)
    assert out is None  # the stop goes through
    assert [r["decision"] for r in _log(camp) if r["event"] == "Stop"] == ["block", "block", "allow"]


def test_stop_fails_closed_on_a_tampered_ledger(camp: Path) -> None:
    Ledger(camp).append("diagnosis_recorded", {"text": "x"})
    lines = (camp / "ledger.jsonl").read_text().splitlines()
    lines[1] = lines[1].replace('"x"', '"y"')
    (camp / "ledger.jsonl").write_text("\n".join(lines) + "\n")
    out, _ = run_hook("stop", {}, camp)
    assert out is not None and out["decision"] == "block"
    assert "could not check the campaign" in out["reason"] and "hash mismatch" in out["reason"]


def test_pre_tool_decisions_are_enforced_and_logged(camp: Path) -> None:
    assert pre("Bash", {"command": "ls -la"}, camp)[0] == "allow"
    decision, reason = pre("Bash", {"command": "s'b'atch job.sh"}, camp)
    assert decision == "deny" and "sbatch is a direct cluster" in reason
    decision, reason = pre("Edit", {"file_path": str(ROOT / "gate" / "lists" / "megatron.yaml")}, camp)
    assert decision == "deny" and "never writable" in reason
    assert pre("Write", {"file_path": str(camp / "notes" / "plan.md")}, camp)[0] == "allow"
    assert pre("Write", {"file_path": str(camp / "campaign.yaml")}, camp)[0] == "deny"
    assert pre("WebFetch", {"url": "https://x"}, camp)[0] == "deny"
    assert pre("mcp__plugin_attune_broker__launch_run", {}, camp)[0] == "allow"
    log = _log(camp)
    assert [r["decision"] for r in log] == ["allow", "deny", "deny", "allow", "deny", "deny", "allow"]
    assert log[1]["tool"] == "Bash" and log[1]["subject"] == "s'b'atch job.sh" and log[1]["session_id"] == "s1"


def test_ask_user_question_takes_the_default_and_records_it(camp: Path) -> None:
    q = {"questions": [
        {"question": "Which lever first?", "header": "Lever",
         "options": [{"label": "overlap", "description": "a"}, {"label": "mbs (Recommended)", "description": "b"}]},
        {"question": "Profile now?", "header": "Profile", "options": [{"label": "yes"}, {"label": "no"}]},
    ]}
    decision, reason = pre("AskUserQuestion", q, camp)
    assert decision == "deny" and "take the default" in reason
    assert "mbs (Recommended)" in reason and "'yes'" in reason
    rows = [r for r in _rows(camp) if r["type"] == "assumption_recorded"]
    assert [(r["data"]["question"], r["data"]["default"]) for r in rows] == [
        ("Which lever first?", "mbs (Recommended)"), ("Profile now?", "yes")]


def test_bad_input_or_policy_fails_closed(camp: Path) -> None:
    out, _ = run_hook("pre_tool_use", "this is not json", camp)
    assert out is not None and out["hookSpecificOutput"]["permissionDecision"] == "deny"
    (camp / "policy.yaml").write_text("commands: [ls\n")
    decision, reason = pre("Bash", {"command": "ls"}, camp)
    assert decision == "deny" and "policy.yaml line 1" in reason and "denied to be safe" in reason


def test_a_campaign_yaml_outside_the_subset_denies_every_write(camp: Path) -> None:
    """campaign.yaml is read only when a write is decided; one the control plane would refuse makes the
    write fail closed (the list it might name is never left writable), and no file is written."""
    (camp / "campaign.yaml").write_text("name: hooks-test\ngate: !!map {lists: x.yaml}\n")
    decision, reason = pre("Write", {"file_path": str(camp / "notes" / "a.md"), "content": "x"}, camp)
    assert decision == "deny" and "campaign.yaml" in reason
    decision, _ = pre("Bash", {"command": "echo hi > notes/a.md"}, camp)
    assert decision == "deny"
    assert not (camp / "notes" / "a.md").exists()


def test_campaign_found_from_a_subdirectory_or_named_explicitly(camp: Path, tmp_path: Path) -> None:
    assert pre("Bash", {"command": "curl x"}, camp / "notes")[0] == "deny"
    # Without CLAUDE_PROJECT_DIR the hook input's cwd decides.
    out, _ = run_hook("pre_tool_use", {"tool_name": "Bash", "tool_input": {"command": "curl x"}}, camp,
                      project_env=False)
    assert out is not None and out["hookSpecificOutput"]["permissionDecision"] == "deny"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert run_hook("stop", {}, elsewhere, project_env=False)[0] is None
    assert pre("Bash", {"command": "curl x"}, elsewhere, ATTUNE_CAMPAIGN_DIR=str(camp))[0] == "deny"


def test_session_start_restores_the_campaign_state(camp: Path) -> None:
    led = Ledger(camp)
    for i, v in enumerate([100.0, 101.0, 99.0, 100.5, 99.5]):
        led.append("calibration_run", {"run_id": f"cal{i}", "tokens_per_s_per_gpu": v})
    led.append("launch_admitted", {"run_id": "r1", "kind": "search", "expected_gpu_hours": 0.01, "lever": "mbs"})
    led.append("run_finished", {"run_id": "r1", "outcome": "ok", "charge_gpu_hours": 0.01})
    led.append("measurement", {"run_id": "r1", "tokens_per_s_per_gpu": 120.0, "valid": True})
    led.append("leader_changed", {"run_id": "r1", "tokens_per_s_per_gpu": 120.0})
    led.append("diagnosis_recorded", {"text": "exposed data-parallel communication dominates"})
    led.append("launch_admitted", {"run_id": "r2", "kind": "search", "expected_gpu_hours": 0.02, "lever": "overlap"})
    for source in ("startup", "compact"):
        out, _ = run_hook("session_start", {"source": source}, camp)
        assert out is not None
        hso = out["hookSpecificOutput"]
        assert hso["hookEventName"] == "SessionStart"
        text = hso["additionalContext"]
        assert f"at session {source}" in text
        assert "left for search 0.87" in text  # 1.0 total - 0.01 charged - 0.02 in flight - 0.1 reserve
        assert "Leader: r1 at 120 tokens/s/GPU, gain +20.00%" in text
        assert "Runs in flight: r2 (search, admitted, lever overlap)" in text
        assert "Last diagnosis: exposed data-parallel communication dominates" in text
        assert "Open items before this session may end:" in text and "shipping step" in text


def test_stop_at_the_block_cap_records_why_the_session_ended(camp: Path) -> None:
    """Claude Code overrides the block after its cap: that one is recorded as the session's end, a failure;
    a stop that does not follow a block starts the count again."""
    env = {"CLAUDE_CODE_STOP_HOOK_BLOCK_CAP": "2"}
    decisions = []
    for active in (False, True, True):
        out, _ = run_hook("stop", {"stop_hook_active": active}, camp, **env)
        assert out is not None
        decisions.append(out.get("decision", "end"))
    assert decisions == ["block", "block", "end"]
    assert "FAILED" in out["systemMessage"] and "ended its turn 3 times" in out["systemMessage"]
    rec = json.loads((camp / "session_end.json").read_text())
    assert rec["blocks"] == 3 and rec["session_id"] == "s1" and "no_stop" in rec["reason"]
    assert _log(camp)[-1]["outcome"] == "failed"
    out, _ = run_hook("stop", {"stop_hook_active": False}, camp, **env)  # a new turn: the count restarts
    assert out is not None and out["decision"] == "block"
    assert json.loads((camp / ".stop_blocks.json").read_text())["count"] == 1


def test_status_shows_why_the_last_session_ended(camp: Path) -> None:
    from attune.core import session_end

    session_end.record(str(camp), "the session ended unfinished: [no_stop] no stop recorded", "s1", 9)
    p = subprocess.run([sys.executable, "-m", "attune", "status", str(camp)], capture_output=True, text=True,
                       cwd=ROOT, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "the last agent session ended unfinished: the session ended unfinished: [no_stop]" in " ".join(
        p.stdout.split())


def test_fail_closed_blocks_count_toward_the_cap_too(camp: Path) -> None:
    Ledger(camp).append("diagnosis_recorded", {"text": "x"})
    lines = (camp / "ledger.jsonl").read_text().splitlines()
    lines[1] = lines[1].replace('"x"', '"y"')
    (camp / "ledger.jsonl").write_text("\n".join(lines) + "\n")
    env = {"CLAUDE_CODE_STOP_HOOK_BLOCK_CAP": "1"}
    out, _ = run_hook("stop", {"stop_hook_active": False}, camp, **env)
    assert out is not None and out["decision"] == "block"
    out, _ = run_hook("stop", {"stop_hook_active": True}, camp, **env)
    assert out is not None and "decision" not in out and "could not check the campaign" in out["systemMessage"]
    assert json.loads((camp / "session_end.json").read_text())["blocks"] == 2
