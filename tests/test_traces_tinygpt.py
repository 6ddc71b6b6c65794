"""The analyzer on a real tinygpt profile: two data-parallel ranks over gloo, traced by the trainer.

Runs only where examples/tinygpt (with ``--profile``) is present; skipped otherwise.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from attune.readers.traces import analyze_paths

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "examples" / "tinygpt" / "train.py"


@pytest.mark.slow
@pytest.mark.skipif(not TRAIN.exists(), reason="examples/tinygpt is not in this checkout")
def test_tinygpt_profile_adds_up(tmp_path):
    run_dir = tmp_path / "runs" / "r1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(TRAIN),
           "--train-iters", "6", "--global-batch-size", "8", "--profile", "--profile-steps", "3",
           "--run-dir", str(run_dir)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = analyze_paths([run_dir])
    assert sorted(r.rank for r in report.ranks) == [0, 1]
    for r in report.ranks:
        assert r.kind == "cpu" and r.steps == 3
        for b in (*r.per_step, r.breakdown):
            parts = b.compute_us + b.comm_exposed_us + b.memcpy_exposed_us + b.other_exposed_us + b.idle_us
            assert math.isclose(parts, b.step_us, rel_tol=1e-6)
            assert math.isclose(b.data_loading_us + b.sync_wait_us + b.launch_us + b.python_us, b.idle_us,
                                rel_tol=1e-6, abs_tol=1e-6)
        assert r.breakdown.compute_us > 0.3 * r.breakdown.step_us  # a training step is mostly compute
        assert r.breakdown.comm_us > 0  # the data-parallel gradient reduction
        assert r.breakdown.comm_exposed_by_kind["dp_reduce"] + r.breakdown.comm_hidden_us > 0
    assert report.slowest_stage is not None and report.slowest_stage.waits_on
