"""`attune tune` end to end on the local backend: calibration, a built-in tuner through the broker,
the stop, shipping, the report; and resuming after the command is killed mid-campaign.

The jobs are real processes of the stand-in trainer (tests/fake_trainer.py, milliseconds per step);
the real tinygpt runs in tests/test_campaign_tinygpt.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attune.control import shipping
from attune.core import ledger
from attune.core.state import load
from tests._broker_helpers import ROOT, make_campaign, wait_for

SPACE = {"--fake-step-ms": [30, 20, 14, 10], "--fake-variant": [0, 1]}


def _tune(d: Path, *extra: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "attune", "tune", str(d / "campaign.yaml"), *extra],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def _stop_broker(d: Path) -> None:
    """A broker `attune tune` did not stop (one started by a killed command) stops here."""
    from broker.client import stop_local_broker

    stop_local_broker(d)


def _brokers(d: Path) -> list[int]:
    """Live `attune broker serve` processes for this campaign (zombies are dead)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and b"serve" in argv and str(d.resolve()).encode() in argv and b"broker" in argv:
            found.append(int(proc.name))
    return found


def _search_keys(d: Path) -> list[str]:
    st, _ = load(d)
    return [r.recipe_key or "" for r in st.runs.values() if r.kind == "search"]


@pytest.fixture
def campaigns(tmp_path: Path):  # type: ignore[no-untyped-def]
    made: list[Path] = []

    def make(name: str, **over: object) -> Path:
        d = make_campaign(tmp_path, name, **{"search_space": SPACE, **over})
        made.append(d)
        return d

    yield make
    for d in made:
        _stop_broker(d)


def test_tune_heuristic_whole_campaign(campaigns) -> None:  # type: ignore[no-untyped-def]
    d = campaigns("tune-h", budget={"concurrency": 1})
    res = _tune(d, "--tuner", "heuristic", "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    st, _ = load(d)
    # calibration: 5 good baseline runs; default budget 30 x one run, with the check reserve
    assert len(st.calibration_values) == 5 and st.budget.total is not None
    budget_row = next(r for r in ledger.read(d).rows if r.type == "budget_set")
    assert budget_row.data["gpu_hours"] == pytest.approx(30 * budget_row.data["run_cost_gpu_hours"], rel=1e-5)
    # the heuristic walked the step-time lever down to 10 ms; no recipe ran twice
    keys = _search_keys(d)
    assert len(keys) == len(set(keys)) >= 3
    assert st.stop is not None and st.stop["levers_tested"] == ["--fake-step-ms", "--fake-variant"]
    assert out["shipped"] == st.shipped["run_id"] != "baseline"
    assert st.runs[out["shipped"]].changes["args"]["--fake-step-ms"] == 10
    assert shipping.done(st) and not st.in_flight
    h = out["headline"]
    assert h["remeasured"] and h["gain"] > 0.5 and h["launches"] == len(keys)
    assert Path(out["report_html"]).is_file() and (d / "shipped" / "run.sh").is_file()
    assert "calibration complete" in res.stderr and "shipped " in res.stderr
    assert _brokers(d) == [], "attune tune left the broker it started running"


def test_killed_mid_campaign_resumes_without_losing_or_repeating_a_run(campaigns) -> None:  # type: ignore[no-untyped-def]
    # Steps of 60 ms make each run last about a second, so the kill lands mid-search.
    slow = {"baseline": {"command": ["python", "tests/fake_trainer.py"],
                         "args": {"--seq-length": 128, "--global-batch-size": 16, "--train-iters": 14,
                                  "--fake-step-ms": 60}},
            "search_space": {"--fake-step-ms": [90, 60, 45, 30], "--fake-variant": [0, 1]},
            "budget": {"concurrency": 1}}
    d = campaigns("tune-kill", **slow)
    proc = subprocess.Popen([sys.executable, "-m", "attune", "tune", str(d / "campaign.yaml"), "--tuner",
                             "heuristic"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            start_new_session=True)
    try:
        wait_for(lambda: len(_search_keys(d)) >= 2, timeout_s=120, interval_s=0.1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the command and anything it started in its session
        proc.wait(timeout=30)
    before = load(d)[0]
    assert before.stop is None and before.shipped is None
    res = _tune(d, "--tuner", "heuristic", "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    st, _ = load(d)
    keys = _search_keys(d)
    assert len(keys) == len(set(keys)), "a recipe ran twice"
    assert all(r.status == "finished" for r in st.runs.values()), "a run was lost"
    assert set(before.runs) <= set(st.runs)
    assert out["replayed"] >= 1 and "answered from the ledger" in res.stderr
    assert not [r for r in ledger.read(d).rows if r.type == "launch_refused" and r.data.get("code") == "identical"]
    assert st.shipped is not None and st.runs[st.shipped["run_id"]].changes["args"]["--fake-step-ms"] == 30
    # the same tuner uninterrupted launches the same recipes in the same order
    ref = campaigns("tune-ref", **slow)
    assert _tune(ref, "--tuner", "heuristic", "--quiet").returncode == 0
    assert _search_keys(ref) == keys


def test_tune_stops_the_broker_it_started_but_not_one_it_found(campaigns) -> None:  # type: ignore[no-untyped-def]
    from broker.client import ensure_local_broker, stop_local_broker

    d = campaigns("tune-own", budget={"concurrency": 1})
    proc = subprocess.Popen([sys.executable, "-m", "attune", "tune", str(d / "campaign.yaml"), "--tuner",
                             "heuristic", "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT)
    try:
        wait_for(lambda: bool(load(d)[0].runs) and bool(_brokers(d)), timeout_s=120, interval_s=0.1)
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C: the command ends, and so does the broker it started
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted" in err, err[-2000:]
    assert _brokers(d) == []
    # A broker already serving the campaign (a Claude Code session's, say) is left running, here by a
    # campaign whose baseline crashes (the command fails).
    crash = {"baseline": {"command": ["python", "tests/fake_trainer.py"],
                          "args": {"--seq-length": 128, "--global-batch-size": 16, "--train-iters": 14,
                                   "--fake-mode": "crash", "--fake-fail-at": 1}},
             "budget": {"concurrency": 2}}
    d = campaigns("tune-found", **crash)
    ep = ensure_local_broker(d)
    try:
        res = _tune(d, "--tuner", "heuristic", "--quiet")
        assert res.returncode == 1 and "baseline failed" in res.stderr, res.stderr[-3000:]
        assert _brokers(d) == [ep.pid]
    finally:
        assert stop_local_broker(d) == ep.pid
    assert _brokers(d) == []
    # Run again with none running: the command starts one, fails at once, and stops it.
    starts = (d / ".broker" / "broker.log").read_text().count("attune broker serving")
    res = _tune(d, "--tuner", "heuristic", "--quiet")
    assert res.returncode == 1 and "baseline failed" in res.stderr, res.stderr[-3000:]
    assert (d / ".broker" / "broker.log").read_text().count("attune broker serving") == starts + 1
    assert _brokers(d) == []


def test_tune_refuses_a_campaign_without_a_search_space(tmp_path: Path) -> None:
    d = make_campaign(tmp_path, "nospace")
    t0 = time.monotonic()
    res = _tune(d, "--tuner", "tpe")
    assert res.returncode == 2 and "search_space" in res.stderr
    assert time.monotonic() - t0 < 30 and not (d / "runs").exists()
