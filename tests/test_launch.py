"""The control plane's launch path with real processes on the local backend.

Runs are `tests/fake_trainer.py` (a real process that logs like Megatron-LM); the gate is the real
layer 1; scoring is the real metrics reader; every step is checked in the real ledger.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from attune.control.campaign import RecordError, StopRefusedError
from attune.control.plane import Control, FinalRunRequest, JobFacts, LaunchRequest
from attune.core import ledger
from attune.core.state import fold
from attune.readers.metrics import read_metrics
from broker.backends.local import _pgroup_alive
from broker.campaigns import CampaignHandle
from tests._broker_helpers import ROOT, make_campaign, search, wait_for

CALIBRATED_BUDGET = {"gpu_hours": 0.0035, "reserve_gpu_hours": 0.0001, "concurrency": 40,
                     "infra_reserve_gpu_hours": 0.01, "overrun_factor": 20.0}  # the hang test waits 2 s


def rows(d: Path, type_: str | None = None) -> list[ledger.Row]:
    return [r for r in ledger.read(d).rows if type_ is None or r.type == type_]


def settle(h: CampaignHandle, timeout_s: float = 30.0) -> None:
    """Poll until nothing is in flight."""
    wait_for(lambda: not h.state().in_flight, timeout_s=timeout_s, step=h.poll)


def calibrate(h: CampaignHandle) -> None:
    def step() -> None:
        h.poll()
        s = h.state()
        cal_open = sum(1 for r in s.in_flight if r.kind == "calibration")
        if len(s.calibration_values) + cal_open < s.calibration_runs_required:
            h.launch(LaunchRequest(kind="calibration"))

    wait_for(lambda: h.state().calibration is not None and not h.state().in_flight, timeout_s=60, step=step)


@pytest.fixture(scope="module")
def calibrated_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = make_campaign(tmp_path_factory.mktemp("tmpl"), budget=CALIBRATED_BUDGET)
    calibrate(CampaignHandle(d))
    return d


@pytest.fixture
def calibrated(calibrated_template: Path, tmp_path: Path) -> CampaignHandle:
    d = tmp_path / "fake-a"
    shutil.copytree(calibrated_template, d)
    ledger.adopt(d, calibrated_template)  # ledger keys are filed by the directory's path
    return CampaignHandle(d)


def test_calibration_sets_the_budget_and_every_run_is_scored_and_charged(tmp_path: Path) -> None:
    d = make_campaign(tmp_path)
    h = CampaignHandle(d)
    first = [h.launch(LaunchRequest(kind="calibration")) for _ in range(4)]
    assert [a["admitted"] for a in first] == [True, True, True, False]
    assert first[3]["code"] == "concurrency" and "allows 3 at once" in first[3]["reason"]
    calibrate(h)
    s = h.state()
    cal_runs = [s.runs[r] for r in s.calibration_run_ids]
    assert len(cal_runs) == 5
    for run in cal_runs:
        fin = next(r.data for r in rows(d, "run_finished") if r.data["run_id"] == run.run_id)
        assert fin["outcome"] == "ok" and fin["charged_to"] == "budget" and fin["exit_code"] == 0
        # charged GPUs x (release - admission)
        assert fin["charge_gpu_hours"] == pytest.approx(2 * (fin["ended_at"] - fin["started_at"]) / 3600, abs=2e-9)
        assert 0 < fin["ended_at"] - fin["started_at"] < 10
        # scored by the metrics reader on the run's own log
        m = read_metrics(d / "runs" / run.run_id / "log.txt", gpus=2, window=(4, 13))
        assert run.tokens_per_s_per_gpu == pytest.approx(m.tokens_per_s_per_gpu) and run.valid
        # the stack fix reached the job
        assert f"--run-dir {d / 'runs' / run.run_id}" in (d / "runs" / run.run_id / "job.sh").read_text()
    # the first calibration run is also the baseline's reference check run: 20 steps (its admission row says
    # so), the others the workload's 14; its window is measured like theirs
    ref = [r for r in cal_runs if r.purpose == "reference"]
    assert [r.run_id for r in ref] == [first[0]["run_id"]] and s.calibration_reference() is ref[0]
    admitted = {r.data["run_id"]: r.data for r in rows(d, "launch_admitted")}
    assert admitted[ref[0].run_id]["steps"] == 20 and "purpose" not in admitted[first[1]["run_id"]]
    for run in cal_runs:
        last = "iteration       20/" if run.purpose == "reference" else "iteration       14/"
        assert last in (d / "runs" / run.run_id / "log.txt").read_text()
    (budget_row,) = rows(d, "budget_set")
    # one run of the workload's length: the longer reference run is left out of the mean
    mean_cost = sum(r.charge_gpu_hours for r in cal_runs if r.purpose != "reference") / 4
    assert budget_row.data["gpu_hours"] == pytest.approx(30 * mean_cost, rel=1e-6)
    # 3 checks and the baseline's replicates (none where the calibration runs cover the check's judged steps),
    # 20 steps each; no reference check run of the baseline: a calibration run is the reference
    from attune.control import shipping
    from attune.control.spec import load_spec

    checks = 3 + shipping.replicate_check_runs(load_spec(d / "campaign.yaml"))
    assert "the baseline's reference curve is a calibration run's" in budget_row.data["reason"]
    assert budget_row.data["reserve_gpu_hours"] == pytest.approx(checks * mean_cost * 20 / 14, rel=1e-6)
    assert s.leader_run_id == "baseline" and s.calibration is not None
    more = h.launch(LaunchRequest(kind="calibration"))
    assert not more["admitted"] and more["code"] == "calibration_full"


def test_search_promotion_identical_recipes_and_profiling(calibrated: CampaignHandle) -> None:
    h, d = calibrated, calibrated.dir
    fast = h.launch(_req(search({"--fake-step-ms": 8}, lever="fast")))
    assert fast["admitted"] and fast["submitted"] and fast["expected_gpu_hours"] > 0
    settle(h)
    s = h.state()
    assert s.runs[fast["run_id"]].verdict == "leader" and s.leader_run_id == fast["run_id"]
    (lead,) = rows(d, "leader_changed")
    assert lead.data["previous_run_id"] == "baseline" and lead.data["gain_over_baseline"] > 0.5

    # The next candidate builds on the leader; a slower one does not take over.
    slow = h.launch(_req(search({"--fake-variant": 1}, lever="variant")))
    assert slow["changes"]["args"] == {"--fake-step-ms": 8, "--fake-variant": 1}
    on_baseline = h.launch(_req(search({"--fake-step-ms": 30}, lever="slow", base="baseline")))
    assert on_baseline["changes"]["args"] == {"--fake-step-ms": 30}
    settle(h)
    s = h.state()
    assert s.runs[on_baseline["run_id"]].verdict == "slower" and s.leader_run_id == fast["run_id"]
    assert s.runs[slow["run_id"]].verdict in ("within_band", "slower", "leader")

    again = h.launch(_req(search({"--fake-step-ms": "8"}, lever="fast", base="baseline")))
    assert not again["admitted"] and again["code"] == "identical" and fast["run_id"] in again["reason"]
    nothing = h.launch(_req(search({"--fake-step-ms": 20}, lever="none", base="baseline")))
    assert nothing["code"] == "no_change"

    profiled = h.launch(_req(search({}, lever="profile the leader", profile=True)))
    assert profiled["admitted"]
    assert profiled["expected_gpu_hours"] == pytest.approx(fast["expected_gpu_hours"] * 17 / 14, rel=0.5)
    assert "--profile" in (d / "runs" / profiled["run_id"] / "job.sh").read_text()
    settle(h)
    refused = [r.data["code"] for r in rows(d, "launch_refused")]
    assert refused == ["identical", "no_change"]


def test_refusals_are_clear_and_recorded(calibrated: CampaignHandle, tmp_path: Path) -> None:
    h, d = calibrated, calibrated.dir
    cases: list[tuple[dict[str, Any], str, str]] = [
        (search({"--lr": 0.01}, lever="lr"), "gate", "lr [numeric]"),
        (search({"--seq-length": 64}), "pinned", "--seq-length is pinned"),
        (search({"--fake-variant": 5}, code_locations={}), "code_locations", "missing for --fake-variant"),
        ({**search({"--fake-step-ms": 5}), "hypothesis": " "}, "bad_request", "hypothesis"),
        ({**search({}), "changes": {"env": {"LD_PRELOAD": "x.so"}}}, "env_not_allowlisted", "LD_PRELOAD"),
        ({**search({}), "changes": {"env": {"NCCL_ALGO": "Ring"}}}, "gate", "NCCL_ALGO [unlisted]"),
        (search({"--fake-step-ms": 5}, base="r999-nope"), "bad_request", "no search run 'r999-nope'"),
    ]
    for body, code, words in cases:
        out = h.launch(_req(body))
        assert not out["admitted"] and out["code"] == code and words in out["reason"], out
    refused = rows(d, "launch_refused")
    assert [r.data["code"] for r in refused] == [c for _, c, _ in cases]
    assert not (d / "runs").exists() or len(list((d / "runs").iterdir())) == 5  # only calibration runs

    fresh = make_campaign(tmp_path / "fresh")
    out = CampaignHandle(fresh).launch(_req(search({"--fake-step-ms": 5})))
    assert out["code"] == "not_calibrated" and "0/5 calibration runs" in out["reason"]

    with pytest.raises(StopRefusedError) as early:  # a stop before calibration (search rules, issue 15)
        CampaignHandle(fresh).stop(["step"], "nothing left to try", None)
    assert [r.code for r in early.value.refusals] == ["calibration_incomplete"]
    with pytest.raises(StopRefusedError) as unrun:  # levers_tested names a lever no run changed
        h.stop(["step"], "nothing left to try", None)
    assert [(r.code, r.items) for r in unrun.value.refusals] == [("levers_not_run", ["step"])]
    assert rows(d, "stop_refused")[-1].data["codes"] == ["levers_not_run"]
    for ms in (5, 40):  # two values of the lever (rule 4), then the stop is accepted
        assert h.launch(_req(search({"--fake-step-ms": ms}, lever="step")))["admitted"]
        settle(h)
    h.stop(["step"], "nothing left to try", None)
    out = h.launch(_req(search({"--fake-step-ms": 5})))
    assert out["code"] == "stopped"
    with pytest.raises(RecordError, match="already recorded"):
        h.stop(["step"], "again", None)


def test_a_job_that_stops_logging_is_killed_as_a_hang(calibrated: CampaignHandle) -> None:
    h, d = calibrated, calibrated.dir
    out = h.launch(_req(search({"--fake-mode": "hang", "--fake-fail-at": 2}, lever="hang")))
    run_dir = d / "runs" / out["run_id"]
    wait_for(lambda: (run_dir / "backend.json").exists(), step=h.poll)
    pgid = json.loads((run_dir / "backend.json").read_text())["pid"]
    settle(h, timeout_s=30)
    run = h.state().runs[out["run_id"]]
    assert run.outcome == "hang" and run.verdict == "failed" and run.charged_to == "budget"
    assert "no log progress" in (run.reason or "")
    assert run.ended_at - run.started_at >= 2.0  # the watchdog waited hang_timeout_s of silence
    assert run.charge_gpu_hours == pytest.approx(2 * (run.ended_at - run.started_at) / 3600, abs=2e-9)
    assert not _pgroup_alive(pgid)  # the whole process group is gone (zombies aside)
    assert "iteration        2/" in (run_dir / "log.txt").read_text()


def test_out_of_memory_and_crash_are_classified(calibrated: CampaignHandle) -> None:
    h = calibrated
    oom = h.launch(_req(search({"--fake-mode": "oom"}, lever="oom")))
    crash = h.launch(_req(search({"--fake-mode": "crash"}, lever="crash")))
    settle(h)
    s = h.state()
    r_oom, r_crash = s.runs[oom["run_id"]], s.runs[crash["run_id"]]
    assert r_oom.outcome == "oom" and r_oom.exit_code == 1 and "CUDA out of memory" in (r_oom.reason or "")
    assert r_crash.outcome == "crash" and r_crash.exit_code == 3
    for r in (r_oom, r_crash):
        assert r.verdict == "failed" and r.charged_to == "budget" and r.charge_gpu_hours > 0
    assert s.as_dict()["failed_launches"] == 2


def test_infrastructure_failures_get_one_retry(calibrated: CampaignHandle) -> None:
    h = calibrated
    body = search({"--fake-mode": "infra"}, lever="infra")
    first = h.launch(_req(body))
    settle(h)
    s = h.state()
    r1 = s.runs[first["run_id"]]
    assert r1.outcome == "infrastructure" and r1.charged_to == "infra" and r1.charge_gpu_hours > 0
    assert s.budget.infra_charged == pytest.approx(r1.charge_gpu_hours)
    charged_before = s.budget.charged

    retry = h.launch(_req(body))
    assert retry["admitted"] and retry["retry_of"] == first["run_id"] and retry["exclude_nodes"] == r1.nodes
    settle(h)
    s = h.state()
    r2 = s.runs[retry["run_id"]]
    assert r2.outcome == "infrastructure" and r2.charged_to == "budget"  # the retry is a normal launch
    assert r2.recipe_failure is False  # same node both times (this machine is one node)
    assert s.budget.charged == pytest.approx(charged_before + r2.charge_gpu_hours)

    third = h.launch(_req(body))
    assert third["code"] == "identical" and "failed on infrastructure twice" in third["reason"]


def test_cancel_charges_and_records(calibrated: CampaignHandle) -> None:
    h = calibrated
    out = h.launch(_req(search({"--fake-mode": "hang", "--fake-fail-at": 12}, lever="cancel me")))
    wait_for(lambda: h.state().runs[out["run_id"]].status == "running", step=h.poll)
    res = h.cancel(out["run_id"])
    assert res["cancelled"] and res["outcome"] == "cancelled" and res["charge_gpu_hours"] > 0
    assert h.state().runs[out["run_id"]].verdict == "cancelled"
    assert h.cancel(out["run_id"])["cancelled"] is False


ADMIT_WORKER = """
import json, sys
sys.path.insert(0, {root!r})
from attune.control.plane import Control, JobFacts, LaunchRequest
c = Control({d!r})
out = []
for i in range({n}):
    a = c.admit({{"kind": "search", "changes": {{"args": {{"--fake-variant": {base} + i}}}}, "hypothesis": "h",
                 "lever": "variant", "expected_gain": 0.01, "code_locations": {{"--fake-variant": "x.py:1"}}}})
    out.append(a.code or "admitted")
print(json.dumps(out))
"""


def test_admission_is_atomic_across_processes(calibrated: CampaignHandle) -> None:
    """Four processes admit at once, straight through the control plane (no broker between them)."""
    d = calibrated.dir
    procs = [
        subprocess.Popen([sys.executable, "-c", ADMIT_WORKER.format(root=str(ROOT), d=str(d), n=6, base=100 * k)],
                         stdout=subprocess.PIPE, text=True)
        for k in range(1, 5)
    ]
    results = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    codes = [c for r in results for c in r]
    assert codes.count("admitted") >= 1 and codes.count("budget") >= 1, codes
    assert set(codes) <= {"admitted", "budget"}
    assert_budget_never_overrun(d)
    # clean up the admitted (never submitted) runs
    for run in fold(ledger.read(d).rows).in_flight:
        Control(d).finish(run.run_id, JobFacts(state="cancelled", killed_for="cancelled"))


STOP_SLACK_S = 1.0  # docs/campaign.md: what a stopped run may use past its bound (monitor step, job exit)


def gpus_of(d: Path) -> int:
    from attune.control.spec import load_spec

    return load_spec(d / "campaign.yaml").cluster.gpus


def assert_budget_never_overrun(d: Path) -> None:
    """Replay the ledger: every admission fitted what was left for search when it was made."""
    state = fold([])
    admitted = 0
    for row in ledger.read(d).rows:
        if row.type == "launch_admitted" and row.data["kind"] == "search":
            left = state.budget.search_remaining
            assert left is not None and row.data["expected_gpu_hours"] <= left + 1e-9, (row.seq, left)
            assert len(state.in_flight) < 40
            admitted += 1
        state.apply(row)
    assert state.budget.total is not None
    committed = state.budget.charged + state.budget.in_flight + state.budget.reserve_left
    # A run the monitor stopped at its charge bound is charged to its release: the stop's latency (the
    # monitor's step and the job's exit, STOP_SLACK_S) is the documented slack past the bound.
    overruns = sum(1 for r in state.runs.values() if r.outcome == "overrun")
    slack = overruns * gpus_of(d) * STOP_SLACK_S / 3600
    assert committed <= state.budget.total + slack + 1e-9 or not state.in_flight
    assert admitted >= 1


def _req(body: dict[str, Any]) -> LaunchRequest:
    return LaunchRequest.model_validate(body)


def test_a_changed_spec_is_refused(calibrated: CampaignHandle) -> None:
    from attune.control.plane import ControlError

    h, d = calibrated, calibrated.dir
    (d / "campaign.yaml").write_text((d / "campaign.yaml").read_text() + "\nnotes: edited\n")
    out = h.launch(_req(search({"--fake-variant": 4})))
    assert out["code"] == "spec_changed" and "frozen" in out["reason"]
    with pytest.raises(ControlError, match="changed after the campaign started"):
        Control(d)


def test_a_changed_correctness_list_is_refused(tmp_path: Path) -> None:
    import hashlib

    from tests._broker_helpers import FAKE_LIST

    pin = hashlib.sha256(FAKE_LIST.encode()).hexdigest()
    d = make_campaign(tmp_path, gate={"lists": "fake.yaml", "list_sha256": pin})
    h = CampaignHandle(d)
    assert h.launch(LaunchRequest(kind="calibration"))["admitted"]
    (d / "fake.yaml").write_text(FAKE_LIST.replace("class: numeric, why: 'the learning rate", "class: structural, "
                                                   "why: 'the learning rate"))
    out = h.launch(LaunchRequest(kind="calibration"))
    assert out["code"] == "gate" and "the campaign pins" in out["reason"]
    settle(h)


def test_a_restarted_broker_picks_up_its_runs(calibrated: CampaignHandle) -> None:
    first = calibrated
    out = first.launch(_req(search({"--fake-step-ms": 60}, lever="restart")))
    wait_for(lambda: first.state().runs[out["run_id"]].status == "running", step=first.poll)
    second = CampaignHandle(first.dir)  # a new broker process: a fresh backend that never saw the job
    settle(second)
    run = second.state().runs[out["run_id"]]
    assert run.outcome == "ok" and run.exit_code == 0 and run.verdict == "slower" and run.charge_gpu_hours > 0


def test_check_runs_are_paid_from_the_reserve_alone(tmp_path: Path) -> None:
    """A check run fits what is left of the check reserve (check runs in flight count), not what is left
    of the whole budget; a search that overran into the reserve is named, with by how much."""
    budget = {"gpu_hours": 1.0, "reserve_gpu_hours": 0.05, "concurrency": 5}
    # before any run finishes, one run is expected to cost 0.014 GPU-h: a 20-step check 0.014 x 20/14 = 0.02
    d = make_campaign(tmp_path, budget=budget, control={"expected_run_gpu_hours": 0.014})
    c = Control(d)
    assert [c.admit(FinalRunRequest(kind="check", of="baseline")).admitted for _ in range(2)] == [True, True]
    b = c.state().budget
    assert b.check_in_flight == pytest.approx(0.04) and b.reserve_left == pytest.approx(0.01)
    assert b.remaining == pytest.approx(0.96)  # the budget could pay, the reserve cannot
    third = c.admit(FinalRunRequest(kind="check", of="baseline"))
    assert not third.admitted and third.code == "budget"
    assert "check reserve has 0.01 GPU-h left" in third.reason and "overran" not in third.reason

    # calibration and search charged beyond total - reserve: the reserve is short by exactly that
    d2 = make_campaign(tmp_path / "over", budget=budget, control={"expected_run_gpu_hours": 0.014})
    c2 = Control(d2)
    c2.ledger.append("launch_admitted", {"run_id": "s1", "kind": "search", "expected_gpu_hours": 0.014})
    c2.ledger.append("run_finished", {"run_id": "s1", "outcome": "ok", "charge_gpu_hours": 0.99})
    b2 = c2.state().budget
    assert b2.reserve_overrun == pytest.approx(0.04) and b2.check_left == pytest.approx(0.01)
    assert b2.as_dict()["reserve_overrun_gpu_hours"] == pytest.approx(0.04)
    out = c2.admit(FinalRunRequest(kind="check", of="baseline"))
    assert not out.admitted and out.code == "budget"
    assert "overran their share of the budget (total 1 - reserve 0.05 = 0.95 GPU-h) by 0.04 GPU-h" in out.reason
    refused = rows(d2, "launch_refused")[-1].data
    assert refused["kind"] == "check" and refused["reason"] == out.reason
