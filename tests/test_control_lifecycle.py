"""Unit tests of the run lifecycle (attune/control/lifecycle.py): backend events handed to its one entry
point by hand, no backend, and the rows each writes; and single shipping actions (attune/control/shipper.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from attune.control import lifecycle, shipper, shipping
from attune.control.lifecycle import EventKind, Lifecycle, RunEvent
from attune.control.plane import Control, FinalRunRequest, LaunchRequest
from attune.core import ledger
from tests._broker_helpers import make_campaign


def _types(d: Path) -> list[str]:
    return [r.type for r in ledger.read(d).rows]


def _admitted(tmp_path: Path, **over: object) -> tuple[Path, Lifecycle, str]:
    d = make_campaign(tmp_path, **over)  # type: ignore[arg-type]
    lc = Lifecycle(Control(d))
    out = lc.admit(LaunchRequest(kind="calibration"))
    assert out.admitted and out.run_id is not None
    return d, lc, out.run_id


def _status(state: str, started_at: float | None = None, **kw: object) -> RunEvent:
    return RunEvent(EventKind.STATUS, state=state, started_at=started_at, **kw)  # type: ignore[arg-type]


def test_submission_and_start_are_recorded_once(tmp_path: Path) -> None:
    d, lc, run_id = _admitted(tmp_path)
    assert lc.on_backend_event(run_id, RunEvent(EventKind.SUBMITTED, backend="local", backend_id="b-1")).notes == []
    assert lc.control.state().runs[run_id].backend_id == "b-1"
    assert lc.on_backend_event(run_id, _status("pending")).notes == []
    t0 = time.time()
    r = lc.on_backend_event(run_id, _status("running", t0, nodes=("n1",)))
    assert r.notes == [f"{run_id}: started on n1"] and not r.cancel
    lc.on_backend_event(run_id, _status("running", t0, nodes=("n1",)))
    assert _types(d).count("run_started") == 1 and lc.control.state().runs[run_id].status == "running"


def test_a_silent_log_is_killed_as_a_hang_and_finished_with_its_kill(tmp_path: Path) -> None:
    d, lc, run_id = _admitted(tmp_path)  # the campaign's hang timeout: 2 s
    lc.on_backend_event(run_id, RunEvent(EventKind.SUBMITTED, backend="local", backend_id="b-1"))
    started = time.time() - 10.0  # no log at all for 10 s
    r = lc.on_backend_event(run_id, _status("running", started))
    assert r.cancel and r.finished is None
    kill = json.loads((d / "runs" / run_id / lifecycle.KILL_FILE).read_text())
    assert kill["killed_for"] == "hang" and "no log progress" in kill["reason"]
    assert lc.control.state().runs[run_id].status == "running"  # nothing is finished before the job is stopped
    done = lc.on_backend_event(run_id, _status("cancelled", started, ended_at=time.time()))
    run = lc.control.state().runs[run_id]
    assert run.outcome == "hang" and run.charge_gpu_hours > 0 and done.finished is not None
    assert lc.on_backend_event(run_id, _status("cancelled", started)).notes == []  # finished: events are ignored


def test_an_unanswering_backend_is_asked_again_until_the_hang_timeout(tmp_path: Path) -> None:
    d, lc, run_id = _admitted(tmp_path)
    lc.on_backend_event(run_id, RunEvent(EventKind.SUBMITTED, backend="local", backend_id="b-1"))
    r = lc.on_backend_event(run_id, RunEvent(EventKind.UNREACHABLE, reason="dashboard restarting"))
    assert "asking again" in r.notes[0] and lc.control.state().runs[run_id].status != "finished"
    lc._unreachable_since[run_id] = time.time() - 60.0
    r = lc.on_backend_event(run_id, RunEvent(EventKind.UNREACHABLE, reason="dashboard restarting"))
    run = lc.control.state().runs[run_id]
    assert r.notes == [f"{run_id}: lost with the backend"] and run.outcome == "infrastructure"
    assert "did not answer for 60 s" in (run.reason or "") and run.charge_gpu_hours == 0


@pytest.mark.parametrize(("event", "reason"), [
    (RunEvent(EventKind.LOST, reason="unknown job"), "backend lost the job: unknown job"),
    (RunEvent(EventKind.SUBMIT_FAILED, reason="sbatch refused"), "submission failed: sbatch refused"),
])
def test_a_lost_or_refused_job_ends_on_infrastructure(tmp_path: Path, event: RunEvent, reason: str) -> None:
    _, lc, run_id = _admitted(tmp_path)
    r = lc.on_backend_event(run_id, event)
    run = lc.control.state().runs[run_id]
    assert run.outcome == "infrastructure" and run.reason == reason and r.finished is not None


def test_an_admitted_run_never_submitted_is_lost_after_the_grace(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    _, lc, run_id = _admitted(tmp_path)
    assert lc.on_backend_event(run_id, RunEvent(EventKind.NOT_SUBMITTED)).notes == []
    assert lc.control.state().runs[run_id].status == "admitted"
    monkeypatch.setattr(lifecycle, "UNSUBMITTED_GRACE_S", -1.0)
    r = lc.on_backend_event(run_id, RunEvent(EventKind.NOT_SUBMITTED))
    assert r.notes == [f"{run_id}: lost before submission"]
    assert lc.control.state().runs[run_id].outcome == "infrastructure"


def test_stop_finishes_an_unsubmitted_run_and_refuses_the_shipping_steps_runs(tmp_path: Path) -> None:
    d, lc, run_id = _admitted(tmp_path, budget={"concurrency": 3})
    with pytest.raises(ValueError, match="cancelled or pruned"):
        lc.stop(lc.control.state().runs[run_id], "bored")
    assert lc.stop(lc.control.state().runs[run_id], "cancelled").cancel is False
    run = lc.control.state().runs[run_id]
    assert run.outcome == "cancelled" and run.charge_gpu_hours == 0
    assert "already finished" in (lc.stop(run, "cancelled").refused or "")
    check = lc.admit(FinalRunRequest(kind="remeasure", of="baseline"))
    assert check.admitted and check.run_id is not None
    refused = lc.stop(lc.control.state().runs[check.run_id], "cancelled")
    assert refused.refused is not None and "shipping step" in refused.refused
    assert not (d / "runs" / check.run_id / lifecycle.KILL_FILE).exists()


def test_the_shipping_step_waits_for_the_stop(tmp_path: Path) -> None:
    _, lc, _ = _admitted(tmp_path)
    assert lc.shipping_step() == (None, [])


def test_the_fail_action_records_one_failure_and_ends_shipping(tmp_path: Path) -> None:
    d = make_campaign(tmp_path)
    c = Control(d)
    shipper.fail(c, "no valid measurement")
    shipper.fail(c, "again")  # once
    failed = [r.data for r in ledger.read(d).rows if r.type == "campaign_failed"]
    assert failed == [{"reason": "no valid measurement", "phase": "calibration", "shipped": None}]
    assert shipping.plan(c.state()).kind == "failed" and shipping.ended(c.state())
    assert Lifecycle(c).shipping_step() == (None, [])
    out = c.admit(LaunchRequest(kind="calibration"))
    assert not out.admitted and out.code == "failed"
