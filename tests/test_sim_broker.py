"""A whole simulated campaign through the real broker over HTTP (`--transport http`): `attune tune` on the
MiniMax-M2 example with the sim backend. Calibration, the heuristic search, the stop, shipping with
the gate's check runs, the final re-measurement and the report all go through the same control plane
as a real cluster's campaign; only the cluster is simulated (a test bed, not a claim about GPUs)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from attune.core import ledger
from attune.core.state import load
from attune.readers.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "campaigns" / "minimax-m2-64xb200" / "campaign.yaml"


def test_simulated_campaign_through_the_broker_ships_a_checked_recipe(tmp_path: Path) -> None:
    d = tmp_path / "minimax"
    d.mkdir()
    shutil.copy(EXAMPLE, d / "campaign.yaml")
    res = subprocess.run([sys.executable, "-m", "attune", "tune", str(d / "campaign.yaml"), "--tuner", "heuristic",
                          "--transport", "http", "--quiet", "--json"], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    try:
        assert res.returncode == 0, res.stderr[-3000:]
        out = json.loads(res.stdout)
        state, _ = load(d)
        assert ledger.verify(d).ok
        h = out["headline"]
        assert state.shipped is not None and out["shipped"] == state.shipped["run_id"] != "baseline"
        assert h["gain"] > h["band"] and h["remeasured"]
        checks = [c for c in state.checks if c["candidate_run_id"] == out["shipped"]]
        assert checks and checks[-1]["passed"]  # the gate's layer-1 re-check and convergence check passed
        assert len(state.calibration_values) >= 5 and h["launches"] >= 3
        # The backend's logs are read by the same metrics reader as any Megatron-LM log.
        shipped_run = state.runs[out["shipped"]]
        m = read_metrics(d / "runs" / shipped_run.run_id / "log.txt", gpus=64, window=(4, 13))
        assert m.valid and m.tokens_per_s_per_gpu == shipped_run.tokens_per_s_per_gpu
        # Charged on the simulated clock: GPU-hours of a 64-GPU job, far beyond the wall time it took.
        assert state.budget.charged > 10.0
        assert (d / "report.html").exists() and (d / "shipped" / "evidence.json").exists()
    finally:
        subprocess.run([sys.executable, "-m", "attune", "broker", "stop", str(d)], cwd=ROOT,
                       capture_output=True, timeout=60)
