"""Unit tests of single admission rules (attune/control/plane.py `ADMISSION_RULES`): each rule on a real
campaign's state, and the one pipeline admitting every run kind (the shipping step's too)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attune.control import plane
from attune.control.plane import AdmitContext, Control, FinalRunRequest, LaunchRequest
from attune.control.rungen import RunGenError
from attune.core import ledger
from attune.core.vocab import FINAL_KINDS, RunKind
from tests._broker_helpers import make_campaign


def _ctx(c: Control, request: LaunchRequest | FinalRunRequest) -> AdmitContext:
    return AdmitContext(c, c.state(), request)


def _kinds(rule: plane.AdmissionRule) -> frozenset[RunKind]:
    return next(k for r, k in plane.ADMISSION_RULES if r is rule)


def test_every_run_kind_goes_through_the_one_pipeline_with_the_rules_for_its_kind() -> None:
    rules = [r for r, _ in plane.ADMISSION_RULES]
    assert len(rules) == len(set(rules))
    for kind in RunKind:
        assert any(kind in kinds for _, kinds in plane.ADMISSION_RULES)
    for always in (plane.rule_started, plane.rule_concurrency, plane.rule_expected_cost, plane.rule_shape):
        assert _kinds(always) == plane.ALL_KINDS
    # the shipping step's runs: no gate at admission, no identical-recipe rule, no search rules
    for agent_only in (plane.rule_gate, plane.rule_identical, plane.rule_one_lever, plane.rule_code_locations,
                       plane.rule_paths_confined, plane.rule_budget):
        assert not (_kinds(agent_only) & FINAL_KINDS), agent_only.__name__
    assert _kinds(plane.rule_check_reserve) == {RunKind.CHECK}
    assert _kinds(plane.rule_final_candidate) == FINAL_KINDS


def test_rule_concurrency_names_the_runs_in_flight_for_every_kind(tmp_path: Path) -> None:
    c = Control(make_campaign(tmp_path, budget={"concurrency": 1}))
    assert plane.rule_concurrency(_ctx(c, LaunchRequest(kind="calibration"))) is None
    c.ledger.append("launch_admitted", {"run_id": "s1", "kind": "calibration", "expected_gpu_hours": 0.01})
    for req in (LaunchRequest(kind="calibration"), FinalRunRequest(kind="check", of="baseline")):
        refusal = plane.rule_concurrency(_ctx(c, req))
        assert refusal is not None and refusal.code == "concurrency" and "(s1)" in refusal.reason


def test_rule_search_request_names_what_a_search_launch_lacks(tmp_path: Path) -> None:
    c = Control(make_campaign(tmp_path))
    refusal = plane.rule_search_request(_ctx(c, LaunchRequest(kind="search", lever="tp")))
    assert refusal is not None and refusal.code == "bad_request"
    assert "hypothesis, expected_gain" in refusal.reason
    ok = LaunchRequest(kind="search", lever="tp", hypothesis="h", expected_gain=0.1)
    assert plane.rule_search_request(_ctx(c, ok)) is None


def test_rule_search_open_refuses_before_calibration_and_after_the_stop(tmp_path: Path) -> None:
    c = Control(make_campaign(tmp_path))
    refusal = plane.rule_search_open(_ctx(c, LaunchRequest(kind="search")))
    assert refusal is not None and refusal.code == "not_calibrated" and "0/" in refusal.reason
    c.ledger.append("stop_recorded", {"levers_tested": [], "diagnosis": "d", "leader": None})
    refusal = plane.rule_search_open(_ctx(c, LaunchRequest(kind="search")))
    assert refusal is not None and refusal.code == "stopped"


def test_rule_final_candidate_runs_a_measured_recipe_as_it_was(tmp_path: Path) -> None:
    c = Control(make_campaign(tmp_path, gate={"convergence_steps": 20}))
    with pytest.raises(RunGenError) as exc:
        plane.rule_final_candidate(_ctx(c, FinalRunRequest(kind="check", of="r999-nothing")))
    assert exc.value.code == "bad_request" and "r999-nothing" in exc.value.message
    check = _ctx(c, FinalRunRequest(kind="check", of="baseline"))
    assert plane.rule_final_candidate(check) is None
    assert check.cand.args["--train-iters"] == 20 and check.cand.changes.empty  # the gate's convergence steps
    again = _ctx(c, FinalRunRequest(kind="remeasure", of="baseline"))
    assert plane.rule_final_candidate(again) is None and again.cand.args["--train-iters"] == 14


def test_rule_check_reserve_pays_a_check_from_the_reserve_alone(tmp_path: Path) -> None:
    c = Control(make_campaign(tmp_path))
    ctx = _ctx(c, FinalRunRequest(kind="check", of="baseline"))
    ctx.expected = 0.01
    refusal = plane.rule_check_reserve(ctx)
    assert refusal is not None and refusal.code == "budget" and "not set yet" in refusal.reason
    c.ledger.append("budget_set", {"gpu_hours": 1.0, "reserve_gpu_hours": 0.05, "run_cost_gpu_hours": 0.01, "reason": "test"})
    ctx = _ctx(c, FinalRunRequest(kind="check", of="baseline"))
    ctx.expected = 0.04
    assert plane.rule_check_reserve(ctx) is None
    ctx.expected = 0.06
    refusal = plane.rule_check_reserve(ctx)
    assert refusal is not None and refusal.expected_gpu_hours == 0.06 and "0.05 GPU-h left" in refusal.reason


def test_a_remeasurement_is_admitted_outside_the_search_budget(tmp_path: Path) -> None:
    d = make_campaign(tmp_path, control={"expected_run_gpu_hours": 0.014})
    c = Control(d)
    c.ledger.append("budget_set", {"gpu_hours": 0.001, "reserve_gpu_hours": 0.0, "run_cost_gpu_hours": 0.014, "reason": "test"})
    search = plane.rule_budget(_costed(c, "search"))  # what is left for search cannot pay a run
    assert search is not None and search.code == "budget"
    out = c.admit(FinalRunRequest(kind="remeasure", of="baseline"))
    assert out.admitted and out.kind == "remeasure" and out.run_id == "r001-remeasure-baseline"
    row = [r for r in ledger.read(d).rows if r.type == "launch_admitted"][-1].data
    assert row["kind"] == "remeasure" and row["base_run_id"] == "baseline" and row["steps"] == 14
    assert row["gate"] is None and row["hypothesis"] == "final re-measurement of baseline"
    job = json.loads((d / "runs" / out.run_id / "job.json").read_text())
    assert job["request"] == {"kind": "remeasure", "of": "baseline", "steps": 14}
    wire = out.model_dump(mode="json", exclude_unset=True)
    assert "job" not in wire and "submitted" not in wire and wire["budget"]["total_gpu_hours"] == 0.001


def test_a_refused_final_run_is_recorded_with_what_it_was_of(tmp_path: Path) -> None:
    d = make_campaign(tmp_path)
    out = Control(d).admit(FinalRunRequest(kind="check", of="r404-gone"))
    assert not out.admitted and out.code == "bad_request" and out.kind == "check"
    row = [r for r in ledger.read(d).rows if r.type == "launch_refused"][-1].data
    assert row["of"] == "r404-gone" and row["kind"] == "check" and row["code"] == "bad_request"
    assert not (d / "runs").exists() or not any((d / "runs").iterdir())  # nothing half-written


def _costed(c: Control, kind: str) -> AdmitContext:
    ctx = _ctx(c, LaunchRequest(kind=kind))  # type: ignore[arg-type]
    assert plane.rule_expected_cost(ctx) is None and ctx.expected is not None
    return ctx


def test_the_agent_cannot_ask_for_the_shipping_steps_run_kinds(tmp_path: Path) -> None:
    from pydantic import ValidationError

    c = Control(make_campaign(tmp_path))
    for kind in ("check", "remeasure"):
        with pytest.raises(ValidationError):
            c.admit({"kind": kind, "of": "baseline"})  # what the broker passes on: the agent's request model
    assert not any(r.type == "launch_admitted" for r in ledger.read(c.dir).rows)
