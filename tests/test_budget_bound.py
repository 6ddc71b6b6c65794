"""A budget no run can get around (issue 23, item 5), on real processes (tests/fake_trainer.py).

- a run far slower than expected is stopped by the monitor at its charge bound (`overrun`), charged
  what it used, and the campaign's charges stay within the budget plus the documented slack;
- a run whose own flags and printed lines carry every failure signature the reader knows, and which
  completes, is `ok` and charged; one that crashes is a crash, not an infrastructure failure;
- infrastructure failures are paid by the infrastructure reserve only while it covers them, then by
  the budget.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from attune.control.plane import OVERRUN_FACTOR, LaunchRequest, charge_bound
from attune.core import ledger
from attune.core.measure import gpu_hours
from attune.readers.metrics.failure import SIGNATURES
from broker.campaigns import CampaignHandle
from tests._broker_helpers import make_campaign, search, wait_for
from tests.test_launch import calibrate, settle

POLL_SLACK_S = 1.0  # the monitor's step here (h.poll every 50 ms, plus a loaded machine's delays)
EVERY_SIGNATURE = " | ".join(p.decode() for _, _, p in SIGNATURES)


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = make_campaign(tmp_path_factory.mktemp("budget"), budget={
        "gpu_hours": 0.01, "reserve_gpu_hours": 0.0001, "concurrency": 3, "infra_reserve_gpu_hours": 0.0,
        "overrun_grace_s": 0.0})  # the factor's arm alone: these runs last about a second
    calibrate(CampaignHandle(d))
    return d


def _copy(template: Path, tmp_path: Path) -> CampaignHandle:
    d = tmp_path / "fake-a"
    shutil.copytree(template, d)
    ledger.adopt(d, template)
    return CampaignHandle(d)


def _finished(d: Path) -> list[dict]:
    return [r.data for r in ledger.read(d).rows if r.type == "run_finished"]


def test_three_far_slower_candidates_are_stopped_at_their_bound(template: Path, tmp_path: Path) -> None:
    h = _copy(template, tmp_path)
    gpus = h.spec.cluster.gpus
    out = [h.launch(LaunchRequest.model_validate(search({"--fake-step-ms": 400 + i}, lever=f"slow {i}")))
           for i in range(3)]
    assert all(o["admitted"] and o["submitted"] for o in out), out
    # each would train 14 steps of 400 ms: about ten times the expected cost of a 20 ms-step run
    expected = [o["expected_gpu_hours"] for o in out]
    settle(h, timeout_s=60)
    s = h.state()
    slack = gpus * POLL_SLACK_S / 3600
    for o, exp in zip(out, expected, strict=True):
        run = s.runs[o["run_id"]]
        assert run.expected_gpu_hours == exp > 0  # the admitted row carries the expected cost
        assert run.outcome == "overrun" and run.verdict == "overrun", (run.outcome, run.reason)
        assert "charge bound" in (run.reason or "")
        assert run.charged_to == "budget"
        # charged what it used: at least up to its bound's lower arm's reach, never far past it
        assert run.charge_gpu_hours <= OVERRUN_FACTOR * exp + slack
        assert run.charge_gpu_hours > exp
        assert run.ended_at is not None and run.started_at is not None
        assert run.charge_gpu_hours == pytest.approx(gpus * (run.ended_at - run.started_at) / 3600, abs=1e-8)
    assert s.budget.total is not None
    assert s.budget.charged + s.budget.infra_charged <= s.budget.total + 3 * slack


def test_a_slow_run_never_takes_the_campaign_past_its_budget(tmp_path: Path) -> None:
    """With little budget left, the bound is what the budget allows, not twice the expected cost."""
    d = make_campaign(tmp_path, budget={"default_multiple": 9.0, "reserve_gpu_hours": 0.0, "concurrency": 1})
    h = CampaignHandle(d)
    calibrate(h)
    s = h.state()
    assert s.budget.search_remaining is not None
    out = h.launch(LaunchRequest.model_validate(search({"--fake-step-ms": 2000}, lever="very slow")))
    assert out["admitted"], out
    settle(h, timeout_s=60)
    s = h.state()
    run = s.runs[out["run_id"]]
    assert run.outcome == "overrun"
    assert s.budget.total is not None
    assert s.budget.charged <= s.budget.total + h.spec.cluster.gpus * POLL_SLACK_S / 3600


def test_signatures_the_job_prints_from_its_own_flags_do_not_classify_it(template: Path, tmp_path: Path) -> None:
    h = _copy(template, tmp_path)
    ok = h.launch(LaunchRequest.model_validate(search({"--fake-echo": EVERY_SIGNATURE}, lever="echo")))
    crash = h.launch(LaunchRequest.model_validate(search(
        {"--fake-echo": EVERY_SIGNATURE, "--fake-mode": "crash", "--fake-fail-at": 12}, lever="echo crash")))
    assert ok["admitted"] and crash["admitted"]
    settle(h)
    s = h.state()
    log = (h.control.run_dir(ok["run_id"]) / "log.txt").read_text()
    for _, _, pattern in SIGNATURES:  # the log does carry every signature, in the arguments and after the steps
        assert log.count(pattern.decode()) >= 3
    r_ok = s.runs[ok["run_id"]]
    assert r_ok.outcome == "ok" and r_ok.exit_code == 0 and r_ok.valid, r_ok.reason
    assert r_ok.charged_to == "budget" and r_ok.charge_gpu_hours > 0 and r_ok.tokens_per_s_per_gpu
    r_crash = s.runs[crash["run_id"]]
    assert r_crash.outcome == "crash" and r_crash.exit_code == 3, r_crash.reason
    assert r_crash.charged_to == "budget" and r_crash.charge_gpu_hours > 0


def test_infrastructure_failures_after_the_reserve_is_spent_are_charged_to_the_budget(tmp_path: Path) -> None:
    d = make_campaign(tmp_path, budget={"gpu_hours": 0.01, "reserve_gpu_hours": 0.0001, "concurrency": 3,
                                        "infra_reserve_gpu_hours": 0.0001})
    h = CampaignHandle(d)
    calibrate(h)
    before = h.state().budget.charged
    ids = []
    for i in range(4):
        out = h.launch(LaunchRequest.model_validate(search({"--fake-mode": "infra", "--fake-variant": i + 1},
                                                           lever=f"infra {i}")))
        assert out["admitted"], out
        ids.append(out["run_id"])
        settle(h)
    s = h.state()
    infra_used, to_budget = 0.0, 0.0
    for rid in ids:  # in order: the reserve pays while it covers the whole charge, then the budget does
        run = s.runs[rid]
        assert run.outcome == "infrastructure" and run.charge_gpu_hours > 0
        fits = infra_used + run.charge_gpu_hours <= 0.0001 + 1e-8
        assert run.charged_to == ("infra" if fits else "budget")
        if fits:
            infra_used += run.charge_gpu_hours
        else:
            to_budget += run.charge_gpu_hours
    assert to_budget > 0  # the reserve ran out
    assert s.budget.infra_charged == pytest.approx(infra_used, abs=1e-8) and s.budget.infra_charged <= 0.0001 + 1e-8
    assert s.budget.charged == pytest.approx(before + to_budget, abs=1e-8)


def test_the_bound_waits_on_a_run_that_has_not_started(template: Path, tmp_path: Path) -> None:
    """No start, no use: a queued job is never stopped by the bound (wait_for proves the poll runs)."""
    h = _copy(template, tmp_path)
    out = h.launch(LaunchRequest.model_validate(search({"--fake-step-ms": 21}, lever="fine")))
    wait_for(lambda: h.state().runs[out["run_id"]].status == "finished", step=h.poll)
    assert h.state().runs[out["run_id"]].outcome == "ok"


def test_a_short_run_slower_than_expected_stays_within_the_start_up_grace(tmp_path: Path) -> None:
    """On runs of about a second, twice the expected cost is within start-up jitter: with the default
    `budget.overrun_grace_s` a run three times slower than its expected cost finishes `ok`, and the bound
    it ran under is its expected cost plus the grace (the budget's arm being larger)."""
    d = make_campaign(tmp_path, budget={"gpu_hours": 1.0, "reserve_gpu_hours": 0.0001, "concurrency": 3})
    h = CampaignHandle(d)
    calibrate(h)
    out = h.launch(LaunchRequest.model_validate(search({"--fake-step-ms": 80}, lever="slower")))
    assert out["admitted"], out
    settle(h, timeout_s=60)
    s = h.state()
    run = s.runs[out["run_id"]]
    assert run.outcome == "ok", (run.outcome, run.reason)
    assert run.charge_gpu_hours > OVERRUN_FACTOR * run.expected_gpu_hours  # the factor's arm alone would stop it
    grace = gpu_hours(h.spec.cluster.gpus, h.spec.budget.overrun_grace_s)
    bound = charge_bound(s, run, h.spec.budget.overrun_factor, grace)
    assert bound is not None and bound[0] == pytest.approx(run.expected_gpu_hours + grace)
    assert "grace" in bound[1]


def test_the_grace_never_lifts_a_run_past_the_budget_arm(template: Path) -> None:
    s = CampaignHandle(template).state()
    run = next(r for r in s.runs.values() if r.expected_gpu_hours)
    left = s.budget.remaining
    assert left is not None
    lo = charge_bound(s, run, 2.0, 0.0)
    assert lo is not None and lo[0] == pytest.approx(2.0 * run.expected_gpu_hours)
    huge = charge_bound(s, run, 2.0, 1e6)  # a grace far above what the budget has left
    assert huge is not None and huge[0] < 1e6 and "share" in huge[1]
