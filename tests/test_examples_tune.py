"""The simulated example campaigns through `attune tune --tuner heuristic` (issue 15): each starts and
ships, the GLM-4.5 search reaches the paper's winner through search rule 5 (the TP1 layout that ran out
of memory, retried with full recomputation), and a campaign whose calibration is always refused ends
with a clear failure instead of looping. MiniMax-M2 runs in tests/test_sim_broker.py.

Simulated clusters: a test bed, not a claim about GPUs (docs/sim.md)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from attune.core.state import load
from tests._broker_helpers import make_campaign

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "campaigns"
TP, PP, EP = "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--expert-model-parallel-size"


def _tune(d: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run([sys.executable, "-m", "attune", "tune", str(d / "campaign.yaml"), "--tuner",
                               "heuristic", "--quiet", "--json"], cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout)
    finally:
        subprocess.run([sys.executable, "-m", "attune", "broker", "stop", str(d)], cwd=ROOT, capture_output=True,
                       timeout=60)


def _example(tmp_path: Path, name: str) -> Path:
    d = tmp_path / name
    d.mkdir()
    shutil.copy(EXAMPLES / name / "campaign.yaml", d / "campaign.yaml")
    return d


def test_glm_heuristic_reaches_the_tp1_layout_through_the_rule5_retry(tmp_path: Path) -> None:
    d = _example(tmp_path, "glm45-128xb200")
    res = _tune(d)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    st, _ = load(d)
    shipped = st.runs[out["shipped"]]
    args = shipped.changes["args"]
    assert (args[TP], args[PP], args[EP], args["--recompute-granularity"]) == (1, 16, 8, "full")
    # TP1 ran out of memory first, without the full recomputation; the shipped layout got it back, either
    # as rule 5's retry of its own out-of-memory run or measured that way first (memory first: the estimate,
    # anchored by the out-of-memory run, says TP1 does not fit without it)
    oom = [r for r in st.runs.values() if r.kind == "search" and r.outcome == "oom" and r.changes["args"].get(TP) == 1
           and r.changes["args"].get("--recompute-granularity") != "full"]
    assert oom and oom[0].admitted_seq is not None and oom[0].admitted_seq < (shipped.admitted_seq or 0)
    same = [r for r in oom if (r.changes["args"].get(PP), r.changes["args"].get(EP)) == (16, 8)]
    assert same or "memory first" in (shipped.hypothesis or ""), shipped.hypothesis
    assert out["headline"]["gain"] > 0.25 and out["headline"]["remeasured"]
    # the stop passed the search rules (none refused), every search run carries a diagnosis, and the summary
    # for the next campaign was written where the agent may write
    assert st.stop is not None and st.stop_refusal is None
    assert all(r.run_id in st.diagnoses for r in st.runs.values() if r.kind == "search" and r.status == "finished")
    text = (d / "notes" / "summary.md").read_text()
    assert "model: glm-4.5" in text and out["shipped"] in text
    assert "diagnosis" in (d / "report.md").read_text()


@pytest.mark.parametrize("name", ["llama31-405b-128xb200", "mixtral-8x22b-128xh100"])
def test_example_campaign_starts_and_ships(tmp_path: Path, name: str) -> None:
    d = _example(tmp_path, name)
    res = _tune(d)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    st, _ = load(d)
    assert len(st.calibration_values) == 5 and st.launches_refused < 5
    assert st.shipped is not None and out["shipped"] == st.shipped["run_id"] and out["headline"]["remeasured"]


def test_refused_calibrations_end_the_runner_with_a_clear_failure(tmp_path: Path) -> None:
    d = make_campaign(tmp_path, gate={"lists": "no-such-list"}, search_space={"--fake-step-ms": [10, 20]})
    res = _tune(d, timeout=120)
    assert res.returncode != 0
    assert "refused 5 calibration launches in a row" in res.stderr and "no-such-list" in res.stderr
    st, _ = load(d)
    assert st.launches_refused == 5 and not st.runs


def test_validate_resolves_gate_list_names_like_the_broker(tmp_path: Path) -> None:
    ok = subprocess.run([sys.executable, "-m", "attune", "validate",
                         str(EXAMPLES / "llama31-405b-128xb200" / "campaign.yaml")],
                        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    bad = _example(tmp_path, "llama31-405b-128xb200")
    text = (bad / "campaign.yaml").read_text().replace("lists: llama31-405b", "lists: llama31-406b")
    (bad / "campaign.yaml").write_text(text)
    res = subprocess.run([sys.executable, "-m", "attune", "validate", str(bad / "campaign.yaml"), "--json"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    problems = json.loads(res.stdout)["problems"]
    assert problems[0]["field"] == "gate.lists" and "llama31-406b" in problems[0]["message"]
