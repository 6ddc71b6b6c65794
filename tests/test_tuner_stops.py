"""The heuristic ends a campaign itself (issue 23): on a small simulated campaign it records its own stop
with evidence, with budget left; and a campaign whose remaining search budget falls below one
launch stops and ships the leader (`attune tune` exits 0), instead of neither launching nor stopping.

Simulated cluster (the MiniMax-M2 example, 64 simulated GPUs, concurrency 1, in process): a test bed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from attune.core.state import load

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "campaigns" / "minimax-m2-64xb200" / "campaign.yaml"


def _campaign(tmp_path: Path, gpu_hours: float | None = None) -> Path:
    spec = yaml.safe_load(EXAMPLE.read_text())
    spec["budget"]["concurrency"] = 1
    spec["cluster"]["settings"]["seed"] = 1017
    if gpu_hours is not None:
        spec["budget"]["gpu_hours"] = gpu_hours
    d = tmp_path / "c"
    d.mkdir()
    (d / "campaign.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return d


def _tune(d: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "attune", "tune", str(d / "campaign.yaml"), "--tuner", "heuristic",
                           "--transport", "in-process", "--quiet", "--json"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


def test_heuristic_records_its_own_stop_with_budget_left(tmp_path: Path) -> None:
    d = _campaign(tmp_path)
    out = _tune(d)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    st, _ = load(d)
    assert st.stop is not None
    assert "nothing more to try" in st.stop["diagnosis"], st.stop  # the tuner's own stop, not the budget's
    assert st.stop["levers_tested"], st.stop  # with evidence: what it tested
    assert st.shipped is not None and st.shipped.get("run_id") not in (None, "baseline")
    search = [r for r in st.runs.values() if r.kind == "search"]
    # It stopped with budget left: at least one more launch would have fitted.
    one_launch = max(r.charge_gpu_hours for r in st.runs.values() if r.kind == "calibration")
    assert search and st.budget.charged + one_launch < st.budget.total


def test_budget_below_one_launch_stops_and_ships(tmp_path: Path) -> None:
    # 5 calibration runs (~90 GPU-h) + the check reserve (~154) + three launches, and less than a fourth.
    d = _campaign(tmp_path, gpu_hours=300)
    out = _tune(d)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    doc = json.loads(out.stdout)
    st, _ = load(d)
    assert st.stop is not None and "budget" in st.stop["diagnosis"], st.stop
    search = [r for r in st.runs.values() if r.kind == "search"]
    assert search and st.shipped is not None
    assert st.shipped.get("run_id") in {r.run_id for r in search}, st.shipped  # the leader found, shipped
    assert st.budget.charged <= st.budget.total + 1e-6
    assert doc  # a JSON document came back
