"""The hooks' one fail-closed skeleton (hooks.runtime.run_hook), and codes, not prose, to the Stop hook."""

from __future__ import annotations

import ast
import io
import json
import os
from pathlib import Path
from typing import Any

import pytest

from attune.control import search_rules
from attune.core import state
from hooks import runtime, stop

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def camp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "c"
    d.mkdir()
    (d / "campaign.yaml").write_text("name: c\n")
    monkeypatch.setenv("ATTUNE_CAMPAIGN_DIR", str(d))
    return d


def _run(decide: Any, refuse: Any, text: str, fail: str | None = "deny") -> tuple[dict[str, Any] | None, Any]:
    out = io.StringIO()
    rc = runtime.run_hook("Test", decide, refuse, fail_decision=fail, stdin=io.StringIO(text), stdout=out)
    assert rc == 0
    return (json.loads(out.getvalue()) if out.getvalue() else None), out


def _refuse(run: runtime.HookRun, exc: BaseException) -> dict[str, Any]:
    return {"decision": "deny", "reason": f"{type(exc).__name__}: {exc}"}


def test_decide_gets_the_payload_and_campaign_and_its_answer_is_printed(camp: Path) -> None:
    seen: list[tuple[dict[str, Any], str | None]] = []

    def decide(run: runtime.HookRun) -> dict[str, Any]:
        seen.append((run.payload, run.campaign))
        return {"decision": "allow", "n": run.payload["n"]}

    out, _ = _run(decide, _refuse, json.dumps({"n": 3}))
    assert out == {"decision": "allow", "n": 3}
    assert seen == [({"n": 3}, os.path.realpath(camp))]


def test_any_exception_is_answered_by_refuse_and_logged(camp: Path) -> None:
    def decide(run: runtime.HookRun) -> dict[str, Any]:
        run.after = lambda: (_ for _ in ()).throw(AssertionError("after must not run on a refusal"))
        raise KeyError("boom")

    out, _ = _run(decide, _refuse, "{}")
    assert out == {"decision": "deny", "reason": "KeyError: 'boom'"}
    logged = [json.loads(line) for line in (camp / "hooks.log.jsonl").read_text().splitlines()]
    assert logged[-1]["decision"] == "deny" and "boom" in logged[-1]["error"] and logged[-1]["event"] == "Test"


def test_malformed_or_oversized_input_fails_closed(camp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def decide(run: runtime.HookRun) -> dict[str, Any]:
        raise AssertionError("decide must not run")

    out, _ = _run(decide, _refuse, "[1, 2")
    assert out is not None and out["decision"] == "deny"
    monkeypatch.setattr(runtime, "MAX_INPUT_CHARS", 16)
    out, _ = _run(decide, _refuse, json.dumps({"tool_name": "x" * 40}))
    assert out is not None and out["decision"] == "deny" and "over 16 characters" in out["reason"]


def test_outside_a_campaign_nothing_is_printed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ATTUNE_CAMPAIGN_DIR", raising=False)
    monkeypatch.setenv("CLAUDE_PROJECT_DIR", str(tmp_path))
    out, raw = _run(lambda run: {"decision": "allow"}, _refuse, "not even json")
    assert out is None and raw.getvalue() == ""


def test_after_runs_once_the_answer_is_written(camp: Path) -> None:
    order: list[str] = []
    buf = io.StringIO()

    def decide(run: runtime.HookRun) -> dict[str, Any]:
        run.after = lambda: order.append("after:" + buf.getvalue().strip())
        return {"systemMessage": "x"}

    runtime.run_hook("Test", decide, _refuse, stdin=io.StringIO("{}"), stdout=buf)
    assert order == ['after:{"systemMessage": "x"}']


def test_every_hook_runs_through_the_skeleton() -> None:
    for name in ("pretool", "stop", "session_start"):
        src = (ROOT / "hooks" / f"{name}.py").read_text()
        assert "run_hook(" in src, name
        assert "sys.stdin" not in src and "except BaseException" not in src.replace(
            "except BaseException as exc:  # fail closed even when the skeleton cannot be imported", ""), name


# ---------------------------------------------------------------- codes, not prose


def _stop_refusal_codes() -> set[str]:
    """Every code `search_rules.stop_refusals` can return, read from its source: its own refusals and
    those of each rule it runs (`STOP_RULES`)."""
    tree = ast.parse(Path(search_rules.__file__).read_text())
    names = {"stop_refusals"} | {f.__name__ for f in search_rules.STOP_RULES}
    fns = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    assert len(fns) == len(names)
    return {c.args[0].value for fn in fns for c in ast.walk(fn) if isinstance(c, ast.Call)
            and getattr(c.func, "id", "") == "RuleRefusal" and c.args and isinstance(c.args[0], ast.Constant)}


def test_stop_hints_cover_every_stop_code() -> None:
    assert _stop_refusal_codes() == set(search_rules.STOP_RULE_CODES)
    assert set(stop.RULE_HINTS) == set(search_rules.STOP_RULE_CODES)
    for code in state.STOP_BLOCKER_CODES:
        assert stop._hint([code]), code
    for code in search_rules.STOP_RULE_CODES:
        assert stop.RULE_HINTS[code] in stop._hint(["no_stop", code])


def test_stop_hook_reads_codes_never_messages() -> None:
    """The Stop hook chooses by `code`; a blocker's message is only shown, never matched."""
    tree = ast.parse((ROOT / "hooks" / "stop.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            assert not (isinstance(node.left, ast.Constant) and isinstance(node.left.value, str)
                        and " " in node.left.value), ast.unparse(node)


def test_blocker_codes_are_the_declared_ones(tmp_path: Path) -> None:
    st = state.CampaignState()
    assert [b["code"] for b in st.stop_blockers()] == ["not_started"]
    st.name = "c"
    codes = {b["code"] for b in st.stop_blockers()}
    assert codes <= set(state.STOP_BLOCKER_CODES) and "no_stop" in codes and "not_shipped" in codes
