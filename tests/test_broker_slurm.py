"""The broker's launch path on the Slurm backend, against a real Slurm (slurmctld + slurmd on this machine).

Skips where Slurm is not installed and cannot be started (see tests/test_slurm_backend.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from attune.control.plane import LaunchRequest
from attune.core import ledger
from broker.campaigns import CampaignHandle
from tests._broker_helpers import make_campaign, search, wait_for
from tests.test_slurm_backend import slurm_node  # noqa: F401 - the fixture that starts Slurm


@pytest.mark.usefixtures("slurm_node")
def test_calibration_and_a_candidate_through_slurm(tmp_path: Path) -> None:
    d = make_campaign(
        tmp_path,
        replace={"cluster": {"backend": "slurm", "gpus": 1, "gpus_per_node": 1, "accelerator": "cpu",
                             "settings": {"gpu_request": "none", "time_limit_s": 300}}},
        baseline={"command": [sys.executable, "tests/fake_trainer.py", "--world-size", "{gpus}"]},
        control={"poll_interval_s": 0.2, "hang_timeout_s": 60.0},
        budget={"concurrency": 5},
    )
    h = CampaignHandle(d)
    assert h.backend.name == "slurm"
    for _ in range(5):
        assert h.launch(LaunchRequest(kind="calibration"))["admitted"]
    wait_for(lambda: h.state().calibration is not None and not h.state().in_flight, timeout_s=120, step=h.poll,
             interval_s=0.2)
    out = h.launch(LaunchRequest.model_validate(search({"--fake-step-ms": 8}, lever="fast")))
    assert out["admitted"] and out["backend_id"].isdigit()  # a Slurm job id
    wait_for(lambda: not h.state().in_flight, timeout_s=60, step=h.poll, interval_s=0.2)
    s = h.state()
    run = s.runs[out["run_id"]]
    assert run.outcome == "ok" and run.verdict == "leader" and s.leader_run_id == run.run_id
    assert run.nodes and run.charge_gpu_hours == pytest.approx((run.ended_at - run.started_at) / 3600, abs=2e-9)
    types = [r.type for r in ledger.read(d).rows]
    assert types.count("run_submitted") == 6 and types.count("run_started") == 6 and "budget_set" in types
    assert "#SBATCH --output=" in (d / "runs" / run.run_id / "job.sbatch").read_text()
