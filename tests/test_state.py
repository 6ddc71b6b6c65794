from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attune.control import campaign
from attune.core import ledger, state
from attune.core.ledger import Ledger
from tests.conftest import run_cli

STARTED = {
    "name": "c",
    "spec_sha256": "0" * 64,
    "gpus": 8,
    "budget_gpu_hours": 100.0,
    "reserve_gpu_hours": 6.0,
    "calibration_runs": 5,
    "band_floor": 0.03,
    "band_k_sigma": 3.0,
}


@st.composite
def campaigns(draw: st.DrawFn) -> list[tuple[str, dict[str, Any]]]:
    events: list[tuple[str, dict[str, Any]]] = [("campaign_started", dict(STARTED))]
    open_runs: list[str] = []
    finished_ok: list[tuple[str, str]] = []
    n = draw(st.integers(min_value=0, max_value=40))
    for i in range(n):
        action = draw(st.sampled_from(["admit", "admit", "finish", "finish", "misc", "leader"]))
        if action == "admit":
            kind = draw(st.sampled_from(["search", "calibration", "check"]))
            rid = f"r{i}"
            events.append((
                "launch_admitted",
                {"run_id": rid, "kind": kind, "expected_gpu_hours": draw(st.floats(0.1, 5)),
                 "changes": {"args": {"--micro-batch-size": draw(st.integers(1, 8))}}, "lever": "mbs"},
            ))
            if draw(st.booleans()):
                events.append(("run_started", {"run_id": rid}))
            open_runs.append(rid)
        elif action == "finish" and open_runs:
            rid = open_runs.pop(draw(st.integers(0, len(open_runs) - 1)))
            outcome = draw(st.sampled_from(["ok", "ok", "oom", "hang", "infrastructure"]))
            events.append((
                "run_finished",
                {"run_id": rid, "outcome": outcome, "charge_gpu_hours": draw(st.floats(0, 6)),
                 "charged_to": "infra" if outcome == "infrastructure" else "budget"},
            ))
            if outcome == "ok":
                tps = draw(st.floats(50, 200))
                events.append(("measurement", {"run_id": rid, "tokens_per_s_per_gpu": tps, "valid": True}))
                kind = next(d["kind"] for t, d in events if t == "launch_admitted" and d["run_id"] == rid)
                if kind == "calibration":
                    events.append(("calibration_run", {"run_id": rid, "tokens_per_s_per_gpu": tps}))
                finished_ok.append((rid, str(tps)))
        elif action == "leader" and finished_ok:
            rid, tps = finished_ok[draw(st.integers(0, len(finished_ok) - 1))]
            events.append(("leader_changed", {"run_id": rid, "tokens_per_s_per_gpu": float(tps)}))
        else:
            kind = draw(st.sampled_from(["assumption", "diagnosis", "refused"]))
            if kind == "assumption":
                events.append(("assumption_recorded", {"question": f"q{i}?", "default": "yes"}))
            elif kind == "diagnosis":
                events.append(("diagnosis_recorded", {"text": f"d{i}"}))
            else:
                events.append(("launch_refused", {"reason": "identical recipe"}))
    if draw(st.booleans()):
        events.append(("stop_recorded", {"leader": "x", "levers_tested": ["mbs"], "diagnosis": "done"}))
        events.append(("shipped", {"run_id": "baseline", "recipe": {}}))
    return events


def _snapshot(s: state.CampaignState) -> str:
    return json.dumps(s.as_dict(), sort_keys=True, default=str)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(campaigns(), st.data())
def test_rebuild_equals_incremental(events: list[tuple[str, dict[str, Any]]], data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        led = Ledger(d)
        follower = state.Follower(d)
        for type_, payload in events:
            led.append(type_, payload)
            if data.draw(st.integers(0, 3)) == 0:
                follower.refresh()
        incremental = follower.refresh()
        rebuilt, _ = state.load(d)
        assert _snapshot(incremental) == _snapshot(rebuilt)
        # Budget invariants hold on the rebuilt state.
        finished = [r for r in rebuilt.runs.values() if r.status == "finished"]
        charged = sum(r.charge_gpu_hours for r in finished if r.charged_to != "infra")
        assert rebuilt.budget.charged == pytest.approx(charged)
        open_cost = sum(r.expected_gpu_hours for r in rebuilt.runs.values() if r.status != "finished")
        assert rebuilt.budget.in_flight == pytest.approx(open_cost, abs=1e-9)
        assert rebuilt.budget.remaining == pytest.approx(100.0 - charged - open_cost, abs=1e-9)


def _fill(d: Path, calib: list[float]) -> Ledger:
    led = Ledger(d)
    led.append("campaign_started", dict(STARTED))
    for i, v in enumerate(calib):
        rid = f"cal{i}"
        led.append("launch_admitted", {"run_id": rid, "kind": "calibration", "expected_gpu_hours": 1.0})
        led.append("run_finished", {"run_id": rid, "outcome": "ok", "charge_gpu_hours": 1.0})
        led.append("measurement", {"run_id": rid, "tokens_per_s_per_gpu": v, "valid": True})
        led.append("calibration_run", {"run_id": rid, "tokens_per_s_per_gpu": v})
    return led


def test_calibration_sets_band_and_baseline_leader(tmp_path: Path) -> None:
    _fill(tmp_path, [100.0, 102.0, 98.0, 101.0])
    s, _ = state.load(tmp_path)
    assert s.calibration is None and s.leader_run_id is None  # 4 of 5 runs
    Ledger(tmp_path).append("launch_admitted", {"run_id": "cal4", "kind": "calibration", "expected_gpu_hours": 1.0})
    s, _ = state.load(tmp_path)
    assert s.budget.in_flight == 1.0 and s.budget.remaining == pytest.approx(100 - 4 - 1)
    assert s.budget.search_remaining == pytest.approx(100 - 4 - 1 - 6)
    led = Ledger(tmp_path)
    led.append("run_finished", {"run_id": "cal4", "outcome": "ok", "charge_gpu_hours": 1.0})
    led.append("calibration_run", {"run_id": "cal4", "tokens_per_s_per_gpu": 99.0})
    s, _ = state.load(tmp_path)
    assert s.calibration is not None and s.calibration.mean == pytest.approx(100.0)
    assert s.leader_run_id == "baseline" and s.leader_tokens_per_s_per_gpu == pytest.approx(100.0)
    assert s.calibration.band == pytest.approx(max(0.03, 3 * s.calibration.rel_sigma))
    assert not s.would_promote(104.0) or s.calibration.band < 0.04
    assert s.would_promote(100.0 * (1 + s.calibration.band) + 0.01)


def test_checks_draw_on_the_reserve_and_infra_on_its_own(tmp_path: Path) -> None:
    led = _fill(tmp_path, [100.0] * 5)
    led.append("launch_admitted", {"run_id": "chk", "kind": "check", "expected_gpu_hours": 2.0})
    led.append("run_finished", {"run_id": "chk", "outcome": "ok", "charge_gpu_hours": 2.0})
    led.append("launch_admitted", {"run_id": "inf", "kind": "search", "expected_gpu_hours": 2.0})
    led.append("run_finished", {"run_id": "inf", "outcome": "infrastructure", "charge_gpu_hours": 3.0,
                                "charged_to": "infra"})
    s, _ = state.load(tmp_path)
    b = s.budget
    assert b.charged == pytest.approx(7.0) and b.infra_charged == pytest.approx(3.0)
    assert b.reserve_left == pytest.approx(4.0)
    assert b.search_remaining == pytest.approx(100 - 7 - 4)


def test_stop_needs_budget_or_evidence_and_shipping(tmp_path: Path) -> None:
    led = _fill(tmp_path, [100.0] * 5)
    s, _ = state.load(tmp_path)
    missing = s.missing_for_stop()
    assert any("budget is not spent" in m for m in missing) and any("shipping" in m for m in missing)
    led.append("stop_recorded", {"leader": "baseline", "levers_tested": ["mbs", "dp"], "diagnosis": "flat"})
    s, _ = state.load(tmp_path)
    assert [m for m in s.missing_for_stop() if "shipping" in m] == s.missing_for_stop()
    led.append("shipped", {"run_id": "baseline", "recipe": {}})
    s, _ = state.load(tmp_path)
    assert s.missing_for_stop() == []


def test_events_about_unknown_runs_are_errors(tmp_path: Path) -> None:
    led = Ledger(tmp_path)
    led.append("campaign_started", dict(STARTED))
    led.append("run_finished", {"run_id": "ghost", "outcome": "ok", "charge_gpu_hours": 1.0})
    with pytest.raises(ledger.LedgerError, match="ghost.*never admitted"):
        state.load(tmp_path)


def test_init_and_status_cli(campaign_dir: Path) -> None:
    res = run_cli("status", str(campaign_dir))
    assert res.returncode == 2 and "attune init" in res.stderr
    res = run_cli("init", str(campaign_dir), "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["rows"] == 1
    assert run_cli("init", str(campaign_dir)).returncode == 0  # idempotent: same spec
    st_json = json.loads(run_cli("status", str(campaign_dir), "--json").stdout)
    assert st_json["name"] == "tinygpt-local" and st_json["gpus"] == 2
    assert st_json["calibration"]["required_runs"] == 5 and st_json["budget"]["total_gpu_hours"] is None
    assert st_json["missing_for_stop"]
    human = run_cli("status", str(campaign_dir))
    assert human.returncode == 0 and "tinygpt-local" in human.stdout
    # The spec is frozen once the campaign has started.
    spec = campaign_dir / "campaign.yaml"
    spec.write_text(spec.read_text().replace("price_per_gpu_hour: 0.05", "price_per_gpu_hour: 0.06"))
    res = run_cli("init", str(campaign_dir))
    assert res.returncode == 2 and "changed after the campaign started" in res.stderr
    with pytest.raises(campaign.CampaignError):
        campaign.start(campaign_dir)


def test_a_follower_folds_rows_another_process_appends_and_its_snapshots_stay_put(tmp_path: Path) -> None:
    import subprocess
    import sys

    led = _fill(tmp_path, [100.0] * 5)
    follower = state.Follower(tmp_path)
    before = follower.snapshot()
    again = follower.snapshot()
    assert before.calibration is not None and again is not before and again.runs == before.runs
    again.calibration_values.append(1.0)  # a caller's change to its copy stays there
    assert follower.snapshot().calibration_values == [100.0] * 5
    led.append("launch_admitted", {"run_id": "s1", "kind": "search", "expected_gpu_hours": 1.0})
    admitted = follower.snapshot()
    assert admitted is not before and admitted.runs["s1"].status == "admitted" and "s1" not in before.runs
    writer = Path(__file__).resolve().parent / "ledger_writer.py"
    subprocess.run([sys.executable, str(writer), str(tmp_path), "3", "10"], check=True, capture_output=True)
    led.append("run_finished", {"run_id": "s1", "outcome": "ok", "charge_gpu_hours": 1.0})
    after = follower.snapshot()
    rebuilt, _ = state.load(tmp_path)
    assert _snapshot(after) == _snapshot(rebuilt) and after.last_seq == before.last_seq + 5
    assert after.runs["s1"].status == "finished" and admitted.runs["s1"].status == "admitted"  # copied on write
    assert admitted.budget.in_flight == 1.0 and after.budget.in_flight == 0.0
    assert follower.full_reads == 0


def test_a_follower_rereads_a_ledger_replaced_by_a_valid_one(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    _fill(a, [100.0] * 2)
    follower = state.Follower(a)
    assert len(follower.refresh().calibration_values) == 2
    # A harmless rewrite a full read accepts (the same rows, re-serialised with spaces): folded again.
    path = a / ledger.LEDGER_NAME
    path.write_bytes(b"".join(json.dumps(json.loads(x)).encode() + b"\n" for x in path.read_bytes().splitlines()))
    assert len(follower.refresh().calibration_values) == 2 and follower.full_reads == 1


@pytest.mark.parametrize("copy_max", [state.PREFIX_COPY_MAX, 0])
def test_a_follower_notices_a_same_size_edit_of_a_row_it_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               copy_max: int) -> None:
    """Two rows' MACs swapped: the file keeps its size and its last row; the rows read before are compared
    (with a copy, or past PREFIX_COPY_MAX with their SHA-256) and a full read names the tampering."""
    monkeypatch.setattr(state, "PREFIX_COPY_MAX", copy_max)
    _fill(tmp_path, [100.0] * 3)
    follower = state.Follower(tmp_path)
    follower.refresh()
    path = tmp_path / ledger.LEDGER_NAME
    rows = [json.loads(x) for x in path.read_bytes().splitlines()]
    rows[2]["mac"], rows[3]["mac"] = rows[3]["mac"], rows[2]["mac"]
    path.write_bytes(b"".join(ledger.canonical(r) + b"\n" for r in rows))
    with pytest.raises(ledger.LedgerError) as exc:
        follower.refresh()
    assert exc.value.kind == "rewritten"
