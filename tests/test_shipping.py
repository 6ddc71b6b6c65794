"""Shipping after the stop: checks fastest first, the gate on the check runs, the shipped recipe, the
final re-measurement. Real processes (the stand-in trainer), the real gate, the broker's own poll loop."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from attune.control import shipping
from attune.control.campaign import record_stop
from attune.control.plane import LaunchRequest
from broker.campaigns import CampaignHandle
from tests._broker_helpers import ROOT, make_campaign, search, wait_for
from tests.test_launch import calibrate, rows, settle

BUDGET = {"gpu_hours": 0.03, "reserve_gpu_hours": 0.008, "concurrency": 3}  # the reserve pays 5 check runs


def _ship(h: CampaignHandle, timeout_s: float = 90.0) -> None:
    wait_for(lambda: shipping.done(h.state()), timeout_s=timeout_s, step=h.poll)


def _search(h: CampaignHandle, **changes: object) -> str:
    out = h.launch(LaunchRequest.model_validate(search(dict(changes))))
    assert out["admitted"], out
    return str(out["run_id"])


def test_fastest_candidate_rejected_by_convergence_next_one_ships_and_is_remeasured(tmp_path: Path) -> None:
    d = make_campaign(tmp_path, budget=BUDGET)
    h = CampaignHandle(d)
    calibrate(h)
    # 10 ms: fastest but its loss drifts (a code fault layer 1 cannot see); 14 ms: passes; 19.8 ms: in the band.
    drift = _search(h, **{"--fake-step-ms": 10, "--fake-loss-drift": 0.06})
    good = _search(h, **{"--fake-step-ms": 14})
    _search(h, **{"--fake-step-ms": 19.8})
    settle(h)
    assert shipping.plan(h.state()).kind == "not_due"
    record_stop(d, ["step"], "the step time is the only lever; its neighbours are measured")
    _ship(h)
    st = h.state()
    assert [c.run_id for c in shipping.candidates(st)] == [drift, good]
    checks = {c["candidate_run_id"]: c for c in st.checks}
    assert not checks[drift]["passed"] and "convergence" in checks[drift]["reason"]
    assert checks[drift]["layer1"]["passed"] and not checks[drift]["convergence"]["passed"]
    assert checks[good]["passed"] and checks[good]["convergence"]["correlation"] > 0.99
    assert st.shipped is not None and st.shipped["run_id"] == good
    # the baseline's reference curve is the calibration run that ran 20 steps (no check run of the baseline is
    # bought); one check per candidate tried, each 20 steps long, from the reserve; the other calibration runs
    # cover more than half of the judged steps, so they are the replicates (the noise envelope) and no replicate
    # check run is bought
    assert st.replicate_check_runs == 0
    check_runs = [r for r in st.runs.values() if r.kind == "check"]
    assert sorted(r.base_run_id or "" for r in check_runs) == sorted([drift, good])
    ref = shipping.reference_run(st)
    assert ref is not None and ref.kind == "calibration" and ref.purpose == "reference"
    assert ref.run_id in st.calibration_run_ids and len(shipping.replicate_runs(st)) == 0
    assert "iteration       20/" in (d / "runs" / ref.run_id / "log.txt").read_text()
    assert checks[good]["baseline_check_run_id"] == ref.run_id
    noise = checks[good]["convergence"]["noise_aware"]
    # the calibration runs, the reference aside (never paired with itself)
    assert noise["passed"] and sorted(noise["noise_runs"]) == sorted(set(st.calibration_run_ids) - {ref.run_id})
    assert "reproduce the baseline's losses exactly (deterministic)" in noise["envelope"]
    bad = checks[drift]["convergence"]
    assert not bad["noise_aware"]["passed"] and "level" in bad["noise_aware"]["failed_checks"]
    assert any(r.startswith("noise-aware: level") for r in bad["reasons"])
    assert all("iteration       20/" in (d / "runs" / r.run_id / "log.txt").read_text() for r in check_runs)
    assert st.budget.reserve_used == pytest.approx(sum(r.charge_gpu_hours for r in check_runs))
    # the final re-measurement: 2 repeats each, interleaved in the campaign's seeded order, charged outside the budget
    order = [r.data["recipe_of"] for r in rows(d, "remeasurement")]
    assert order == shipping.remeasure_order(st) and sorted(order) == sorted(["baseline", "baseline", good, good])
    assert order[0] != order[1] and order[2] != order[3]
    finals = [r for r in st.runs.values() if r.kind == "remeasure"]
    assert st.budget.final_charged == pytest.approx(sum(r.charge_gpu_hours for r in finals))
    # shipped/: a runnable job and its evidence
    ev = json.loads((d / "shipped" / "evidence.json").read_text())
    assert ev["shipped"] == good and ev["remeasurement"]["complete"] and ev["remeasurement"]["gain"] > 0.2
    assert [c["candidate_run_id"] for c in ev["checks"]] == [drift, good]
    job = json.loads((d / "shipped" / "job.json").read_text())
    assert job["changes"]["args"] == {"--fake-step-ms": 14}
    out = subprocess.run(["sh", str(d / "shipped" / "run.sh")], env={"RUN_DIR": str(tmp_path / "prod"),
                         "PATH": "/usr/bin:/bin:" + str(Path(__import__("sys").executable).parent)},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "iteration       14/" in out.stdout and (tmp_path / "prod").is_dir()


def test_nothing_beats_the_band_the_baseline_ships(tmp_path: Path) -> None:
    # the jobs run with the workload's own interpreter (spec `environment.python`), and so does shipped/run.sh
    venv = tmp_path / "wl"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    wl_python = str(venv / "bin" / "python")
    d = make_campaign(tmp_path, budget=BUDGET, search_rules="off",
                      environment={"python": wl_python, "imports": ["argparse"]})
    h = CampaignHandle(d)
    calibrate(h)
    _search(h, **{"--fake-step-ms": 19.9})
    settle(h)
    record_stop(d, ["step"], "nothing beats the band")
    _ship(h)
    st = h.state()
    assert st.shipped["run_id"] == "baseline" and "no search run beat" in st.shipped["reason"]
    assert not [r for r in st.runs.values() if r.kind == "check"]  # nothing to check
    assert [r["recipe_of"] for r in st.remeasurements] == ["baseline", "baseline"]
    script = (d / "shipped" / "run.sh").read_text()
    assert "none (the baseline ships)" in script
    assert f"PYTHON=${{PYTHON:-{wl_python}}}" in script and 'exec "$PYTHON" tests/fake_trainer.py' in script
    assert json.loads((d / "shipped" / "job.json").read_text())["argv"][0] == wl_python
    # a `python` first on PATH that is not the workload's interpreter is not what the script runs
    stand_in = tmp_path / "bin"
    stand_in.mkdir()
    (stand_in / "python").write_text("#!/bin/sh\necho 'not the workload interpreter' >&2\nexit 3\n")
    (stand_in / "python").chmod(0o755)
    out = subprocess.run(["sh", str(d / "shipped" / "run.sh")], capture_output=True, text=True, timeout=60,
                         env={"RUN_DIR": str(tmp_path / "prod"), "PATH": f"{stand_in}:/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert "iteration       14/" in out.stdout
    # a TTB entry's copy names no interpreter of this machine: `python` on the user's PATH, or their PYTHON
    from attune.ttb.paths import Relocator, absolute_paths

    portable = Relocator(d, None, ROOT).run_sh(d / "shipped" / "run.sh")
    assert absolute_paths(portable) == [] and "PYTHON=${PYTHON:-python}" in portable.splitlines()
    assert 'exec "$PYTHON" tests/fake_trainer.py' in portable


def test_third_repeat_when_two_repeats_disagree_by_more_than_the_band(tmp_path: Path) -> None:
    d = make_campaign(tmp_path, budget=BUDGET, search_rules="off")
    h = CampaignHandle(d)
    calibrate(h)
    record_stop(d, ["step"], "stop at once")
    wait_for(lambda: h.state().shipped is not None, timeout_s=30, step=h.poll)
    settle(h)
    st = h.state()
    # Rewrite history on a copy of the state: the two baseline repeats 10% apart need a third.
    st.remeasurements = [{"recipe_of": "baseline", "tokens_per_s_per_gpu": 1000.0},
                         {"recipe_of": "baseline", "tokens_per_s_per_gpu": 1100.0}]
    assert shipping.next_remeasure(st) == "baseline"
    st.remeasurements.append({"recipe_of": "baseline", "tokens_per_s_per_gpu": 1050.0})
    assert shipping.next_remeasure(st) is None
    st.remeasurements = [{"recipe_of": "baseline", "tokens_per_s_per_gpu": 1000.0},
                         {"recipe_of": "baseline", "tokens_per_s_per_gpu": 1010.0}]
    assert shipping.next_remeasure(st) is None
    # A repeat flagged invalid (an uneven window on a busy machine) does not count: it runs again;
    # a recipe that never got a valid repeat falls back to the ones it got, and says so.
    st.remeasurements = [{"recipe_of": "baseline", "tokens_per_s_per_gpu": 900.0, "valid": False}]
    assert shipping.next_remeasure(st) == "baseline"
    assert shipping.recipe_values(st, "baseline") == ([900.0], False)


def test_the_policy_imports_nothing_of_the_control_plane_and_launch_nothing_of_shipping() -> None:
    code = ("import sys, attune.control.shipping; bad = [m for m in ('attune.control.plane', 'attune.control.shipper', 'broker') "
            "if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
    code = "import sys, attune.control.plane; assert 'attune.control.shipping' not in sys.modules and 'attune.control.shipper' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_a_finished_check_run_is_judged_and_a_remeasurement_recorded_before_anything_else() -> None:
    from attune.core.state import CampaignState, RunState

    st = CampaignState(name="c", stop={"seq": 1})
    st.runs["r1-check"] = RunState("r1-check", "check", status="finished", outcome="ok", base_run_id="r0")
    st.runs["r2-check"] = RunState("r2-check", "check", status="finished", outcome="ok", base_run_id="baseline")
    a = shipping.plan(st)
    assert (a.kind, a.of) == ("judge", "r1-check") and shipping.status(st)["phase"] == "checking"
    st.checks.append({"run_id": "r1-check", "candidate_run_id": "r0", "passed": True})
    assert shipping.plan(st).kind == "fail"  # judged; nothing else pending (no calibration here)
    st.runs["r3-re"] = RunState("r3-re", "remeasure", status="finished", outcome="ok", base_run_id="baseline",
                                tokens_per_s_per_gpu=900.0, valid=True)
    a = shipping.plan(st)
    assert (a.kind, a.of) == ("record", "r3-re")
    assert shipping.remeasurement_row(st.runs["r3-re"]) == {
        "run_id": "r3-re", "recipe_of": "baseline", "tokens_per_s_per_gpu": 900.0, "valid": True,
        "invalid_reasons": []}


def test_the_reference_is_the_calibration_run_that_ran_as_a_check_run_else_a_check_run_of_the_baseline() -> None:
    """The policy alone: a calibration run that ran as the baseline's reference check run (`purpose: reference`)
    and finished well is the reference, and no check run of the baseline is asked for; one that failed is not,
    and then the baseline's own check run is (the campaign before, or a calibration run that could not run
    long); a baseline check run beside a calibration reference is a replicate."""
    from attune.core.state import CampaignState, RunState

    st = CampaignState(name="c", stop={"seq": 1})
    st.runs["r1-cal"] = RunState("r1-cal", "calibration", status="finished", outcome="crash", purpose="reference")
    st.runs["r2-cal"] = RunState("r2-cal", "calibration", status="finished", outcome="ok")
    st.runs["r9"] = RunState("r9", "search", status="finished", outcome="ok", tokens_per_s_per_gpu=2000.0,
                             valid=True, base_run_id="baseline")
    assert st.calibration_reference() is None and shipping.reference_run(st) is None
    st.runs["r3-cal"] = RunState("r3-cal", "calibration", status="finished", outcome="ok", purpose="reference")
    ref = shipping.reference_run(st)
    assert ref is not None and ref.run_id == "r3-cal" and st.calibration_reference() is ref
    st.runs["r4-check"] = RunState("r4-check", "check", status="finished", outcome="ok", base_run_id="baseline")
    assert shipping.reference_run(st).run_id == "r3-cal"
    assert [r.run_id for r in shipping.replicate_runs(st)] == ["r4-check"]
    without = CampaignState(name="c", stop={"seq": 1})
    without.runs["r4-check"] = st.runs["r4-check"]
    assert shipping.reference_run(without).run_id == "r4-check" and shipping.replicate_runs(without) == []


def test_a_borderline_check_asks_for_one_replicate_of_the_candidate_then_judges_it_again() -> None:
    """The policy alone: a rejected check within the margin gets ONE replicate check run (a ShipAction of its
    own), the finished replicate is judged again, and no candidate ever gets a second one."""
    from attune.core.state import CampaignState, RunState
    from attune.core.vocab import ShipAction

    st = CampaignState(name="c", stop={"seq": 1})
    edge = {"borderline": True, "ratio": 1.2, "why": "trend 1.20x its limit"}
    verdict = {"run_id": "r5-check", "candidate_run_id": "r4", "passed": False, "borderline": edge}
    a = shipping.borderline_replicate(st, "r4", verdict)
    assert a is not None and (a.kind, a.of) == (ShipAction.CHECK_REPLICATE, "r4") and "borderline" in a.reason
    assert a.kind == "check_replicate"  # a StrEnum: the plan's words are unchanged strings
    # not borderline, or passed: no replicate
    assert shipping.borderline_replicate(st, "r4", {**verdict, "borderline": {**edge, "borderline": False}}) is None
    assert shipping.borderline_replicate(st, "r4", {**verdict, "passed": True}) is None
    # admitted and finished: judged again (rejudge), never judged as a check of its own
    st.runs["r6-rep"] = RunState("r6-rep", "check", status="finished", outcome="ok", base_run_id="r4",
                                 purpose="replicate")
    assert shipping.unjudged_check(st) is None
    a = shipping.plan(st)
    assert (a.kind, a.of) == (ShipAction.REJUDGE, "r6-rep") and shipping.status(st)["phase"] == "checking"
    # one per candidate: with a replicate run, or a refused one, none more
    assert shipping.borderline_replicate(st, "r4", verdict) is None
    st.checks.append({"run_id": "r6-rep", "candidate_run_id": "r4", "replicate_run_id": "r6-rep", "passed": False,
                      "borderline": edge})
    assert shipping.unjudged_replicate(st) is None
    assert shipping.borderline_replicate(st, "r4", st.checks[-1]) is None
    st2 = CampaignState(name="c", stop={"seq": 1})
    st2.refusals.append({"kind": "check", "of": "r4", "purpose": "replicate", "code": "budget", "reason": "x"})
    assert shipping.borderline_replicate(st2, "r4", verdict) is None


def test_a_borderline_candidate_gets_one_replicate_check_run_paid_from_the_reserve(tmp_path: Path) -> None:
    """A campaign on the stand-in trainer: the fastest candidate drifts just past the envelope on a noisy stack
    (its check is borderline); shipping admits ONE replicate check run of it through the admission pipeline,
    paid from the check reserve, and judges it again with the candidate's own spread in the noise model."""
    from attune.control.plane import Control, FinalRunRequest

    d = make_campaign(tmp_path, budget=BUDGET)
    h = CampaignHandle(d)
    calibrate(h)
    cand = _search(h, **{"--fake-step-ms": 10, "--fake-loss-drift": 0.00022, "--fake-loss-jitter": 0.001})
    settle(h)
    record_stop(d, ["step"], "the step time is the only lever")
    _ship(h, timeout_s=120)
    st = h.state()
    verdicts = [c for c in st.checks if c["candidate_run_id"] == cand]
    assert len(verdicts) == 2, verdicts
    first, again = verdicts
    assert not first["passed"] and first["layer1"]["passed"] and first["borderline"]["borderline"], first
    assert 1.0 < first["borderline"]["ratio"] <= 1.5
    reps = shipping.candidate_replicates(st, cand)
    assert len(reps) == 1 and reps[0].status == "finished"
    rep = reps[0]
    assert again["replicate_run_id"] == rep.run_id and again["replicate_of"] == first["run_id"]
    assert again["replicate"]["why"] == first["borderline"]["why"] and again["replicate"]["candidate_spread_rms"] > 0
    assert first["run_id"] in again["convergence"]["noise_aware"]["noise_runs"]
    assert rep.run_id in again["convergence_replicate"]["noise_aware"]["noise_runs"]
    assert "candidate_replicate" in again["convergence"]["noise_aware"]["envelope"]
    # the ledger says why: the admission row names the replicate and the borderline check
    admitted = [r.data for r in rows(d, "launch_admitted") if r.data["run_id"] == rep.run_id]
    assert admitted and admitted[0]["purpose"] == "replicate" and "borderline" in admitted[0]["hypothesis"]
    # paid from the check reserve: every check run, the replicate included, is charged to it
    check_runs = [r for r in st.runs.values() if r.kind == "check"]
    from attune.control.spec import load_spec

    # the baseline's reference is a calibration run: only its replicate check runs (if any) are check runs
    baseline_checks = shipping.replicate_check_runs(load_spec(d / "campaign.yaml"))
    assert sorted(r.base_run_id or "" for r in check_runs) == sorted(["baseline"] * baseline_checks + [cand, cand])
    assert st.budget.reserve_used == pytest.approx(sum(r.charge_gpu_hours for r in check_runs))
    # its verdict decides: with its own spread the candidate passes and ships
    assert again["passed"], again["reason"]
    assert st.shipped is not None and st.shipped["run_id"] == cand
    # never a second one: the admission pipeline refuses it, and the ledger records why
    out = Control(d).admit(FinalRunRequest(kind="check", of=cand, replicate=True))
    assert not out.admitted and out.code == "replicate_done" and "already had its one replicate" in out.reason
    refused = [r.data for r in rows(d, "launch_refused")][-1]
    assert refused["purpose"] == "replicate" and refused["of"] == cand
    # a "replicate" of the baseline is no candidate replicate: refused by the same pipeline
    out = Control(d).admit(FinalRunRequest(kind="check", of="baseline", replicate=True))
    assert not out.admitted and out.code == "bad_request"


def test_replicate_check_runs_default_follows_the_calibration_runs_coverage(tmp_path: Path) -> None:
    """Unset, the baseline's replicate check runs are bought only where the calibration runs' curves cover
    less than half of the check's judged steps; a number in the spec is honoured as given."""
    from attune.control.spec import load_spec

    d = make_campaign(tmp_path, budget=BUDGET)
    spec = load_spec(d / "campaign.yaml")
    steps = spec.gate.convergence_steps
    assert shipping.calibration_coverage(steps, steps) == 1.0
    assert shipping.calibration_coverage(int(steps * 0.2), steps) == 0.0
    covering = spec.model_copy(update={"workload": spec.workload.model_copy(update={"steps_per_run": steps})})
    assert shipping.replicate_check_runs(covering) == 0
    short = spec.model_copy(update={"workload": spec.workload.model_copy(update={"steps_per_run": 6})})
    assert shipping.calibration_coverage(6, steps) < shipping.CALIBRATION_COVERAGE_MIN
    assert shipping.replicate_check_runs(short) == shipping.DEFAULT_REPLICATE_CHECK_RUNS
    given = covering.model_copy(update={"gate": covering.gate.model_copy(update={"replicate_check_runs": 3})})
    assert shipping.replicate_check_runs(given) == 3
