"""Never success on nothing: a campaign without valid measurements ends failed, and says so everywhere.

Real processes (the stand-in trainer) through the real control plane and the broker's poll loop:
- every final re-measurement run crashes (the machine broke after calibration): the campaign ends
  with a `campaign_failed` row naming the reason, `evidence.json` is not complete, the report and
  `attune status` say FAILED, the Stop hook lets the session end but says it failed, and
  `attune tune` exits 1 with the reason on stderr;
- a campaign that stops with no calibrated baseline ends failed instead of shipping the baseline.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from attune.app import report
from attune.control import shipping
from attune.control.campaign import record_stop
from attune.core.state import load
from broker.campaigns import CampaignHandle
from tests._broker_helpers import ROOT, make_campaign, wait_for
from tests.test_launch import calibrate, rows

BUDGET = {"gpu_hours": 0.02, "reserve_gpu_hours": 0.002, "concurrency": 3}


def _attune(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "attune", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def _stop_hook(campaign: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLAUDE", "ATTUNE_"))}
    p = subprocess.run([sys.executable, "-I", "-S", str(ROOT / "hooks" / "stop.py")], input=json.dumps(
        {"session_id": "s", "cwd": str(campaign), "hook_event_name": "Stop", "stop_hook_active": False}),
        capture_output=True, text=True, timeout=60, env={**env, "CLAUDE_PROJECT_DIR": str(campaign)})
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout) if p.stdout.strip() else {}


def test_every_remeasurement_failing_ends_the_campaign_failed(tmp_path: Path) -> None:
    broken = tmp_path / "machine-broken"
    d = make_campaign(tmp_path, budget=BUDGET, baseline={"env": {"FAKE_FAIL_FILE": str(broken)}},
                      search_space={"--fake-step-ms": [10, 20]}, search_rules="off")  # stops at once
    h = CampaignHandle(d)
    calibrate(h)
    record_stop(d, ["step"], "stop at once: the baseline is what ships")
    broken.write_text("")  # from now on every run crashes at its first step
    wait_for(lambda: shipping.ended(h.state()) and h.state().failed is not None, timeout_s=90, step=h.poll)
    st = h.state()
    assert st.shipped is not None and st.shipped["run_id"] == "baseline"
    finals = [r for r in st.runs.values() if r.kind == "remeasure"]
    assert finals and all(r.outcome == "crash" for r in finals)
    assert not st.remeasurements and not shipping.done(st)
    [row] = rows(d, "campaign_failed")
    assert "no valid re-measurement of baseline" in row.data["reason"] and row.data["phase"] == "remeasurement"
    ev = json.loads((d / "shipped" / "evidence.json").read_text())
    assert ev["complete"] is False and ev["remeasurement"]["complete"] is False
    assert ev["failed"] == row.data["reason"] and any("no valid re-measurement" in x for x in ev["incomplete"])
    # nothing more runs: the failure is final
    h.poll()
    assert shipping.plan(h.state()).kind == "failed" and not h.state().in_flight
    # the report and `attune status` say so
    rep = report.build(d)
    assert rep.headline.outcome == "failed" and "no valid re-measurement" in (rep.headline.failure or "")
    assert dict(report.headline_lines(rep))["outcome"].startswith("FAILED: ")
    status = _attune("status", str(d), "--json")
    assert status.returncode == 0 and json.loads(status.stdout)["failed"]["reason"] == row.data["reason"]
    assert "FAILED" in _attune("status", str(d)).stdout
    # the Stop hook lets the session end (nothing can be done in it any more) but says it failed
    out = _stop_hook(d)
    assert out.get("decision") != "block" and "FAILED" in out.get("systemMessage", ""), out
    # `attune tune` on it (a rerun, as the nightly does) exits 1 with the reason on stderr
    tune = _attune("tune", str(d / "campaign.yaml"), "--tuner", "heuristic", "--json")
    assert tune.returncode == 1, tune.stderr[-2000:]
    assert "the campaign FAILED: no valid re-measurement of baseline" in tune.stderr
    assert json.loads(tune.stdout)["outcome"] == "failed"
    _attune("broker", "stop", str(d))


def test_a_stop_without_a_calibrated_baseline_ends_failed_not_shipped(tmp_path: Path) -> None:
    d = make_campaign(tmp_path, budget=BUDGET, baseline={"args": {"--fake-mode": "crash", "--fake-fail-at": 1}},
                      search_rules="off")  # the rules would refuse this stop; a black-box tuner's campaign may stop so
    h = CampaignHandle(d)
    for _ in range(3):
        h.launch({"kind": "calibration"})
    wait_for(lambda: not h.state().in_flight, timeout_s=30, step=h.poll)
    st = h.state()
    assert st.calibration is None and all(r.outcome == "crash" for r in st.runs.values())
    record_stop(d, ["none"], "the baseline crashes")
    wait_for(lambda: h.state().failed is not None, timeout_s=30, step=h.poll)
    st, _ = load(d)
    assert st.shipped is None and "no valid calibration: 0 of 5 good baseline runs" in st.failed["reason"]
    assert "crash" in st.failed["reason"] and st.failed["phase"] == "calibration"
    assert not (d / "shipped" / "evidence.json").exists()
    assert shipping.status(st)["failed"] and not shipping.status(st)["done"]


def test_a_workload_environment_that_cannot_run_the_baseline_ends_the_campaign_failed(tmp_path: Path,
                                                                                       monkeypatch) -> None:
    """Nothing can be measured when the spec's interpreter is unusable (only a person can fix it): the first
    refused calibration launch ends the campaign failed, so a headless session's Stop hook lets it end, as a
    failure, instead of blocking it up to Claude Code's block cap."""
    monkeypatch.setenv("CLAUDE_PLUGIN_DATA", str(tmp_path / "data"))
    d = make_campaign(tmp_path, environment={"python": str(tmp_path / "no-such-python"), "imports": ["json"]},
                      control={"expected_run_gpu_hours": 0.001})
    h = CampaignHandle(d)
    out = h.launch({"kind": "calibration"})
    assert out["admitted"] is False and out["code"] == "environment"
    [row] = rows(d, "campaign_failed")
    assert row.data["phase"] == "calibration" and "not an executable interpreter" in row.data["reason"]
    assert row.data["reason"].startswith("the baseline cannot be calibrated: the workload's Python environment")
    st, _ = load(d)
    assert st.failed is not None and not st.runs and st.budget.charged == 0
    again = h.launch({"kind": "calibration"})
    assert again["admitted"] is False and again["code"] == "failed"
    assert len(rows(d, "campaign_failed")) == 1
    hook = _stop_hook(d)
    assert hook.get("decision") != "block" and "FAILED" in hook["systemMessage"], hook
    assert "not an executable interpreter" in hook["systemMessage"]

    # an environment the agent can still build (missing, not built yet) only refuses the launch
    d2 = make_campaign(tmp_path, name="fake-b", environment={"imports": ["attune_no_such_module"],
                                                              "packages": ["no-such-pkg==1"]},
                       control={"expected_run_gpu_hours": 0.001})
    out2 = CampaignHandle(d2).launch({"kind": "calibration"})
    assert out2["code"] == "environment" and not rows(d2, "campaign_failed")
    assert _stop_hook(d2).get("decision") == "block"
