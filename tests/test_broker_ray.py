"""The broker on the Ray backend, against a real one-machine Ray cluster running real tinygpt jobs: a run
that outlives its broker (adopted by the next one, charged from the moment it ran) and a hung job killed by
the watchdog. A whole campaign shipped through Ray by `attune tune` is tests/test_ray_unattended.py's (with
faults injected from outside; a fault-free one here proved nothing more and cost as much). The cluster comes from scripts/start-ray.sh (see
tests/_ray_helpers.py); without Ray these tests skip and say why.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from attune.control.campaign import start
from attune.control.plane import LaunchRequest
from attune.core import ledger
from broker.backends.ray import START_MARK, RayBackend
from broker.campaigns import CampaignHandle
from tests._broker_helpers import make_campaign, wait_for
from tests._ray_helpers import (
    RAY_ADDRESS,
    ROOT,
    ray_cluster,  # noqa: F401 - the fixture that starts Ray
)

EXAMPLE = ROOT / "examples" / "campaigns" / "tinygpt-local" / "campaign.yaml"


def _tiny_ray_campaign(parent: Path, name: str, **control: object) -> dict:
    """The tinygpt example on the Ray backend, shrunk to fit two busy cores: 1 CPU rank per job."""
    spec = yaml.safe_load(EXAMPLE.read_text())
    spec["name"] = name
    spec["cluster"] = {"backend": "ray", "gpus": 1, "gpus_per_node": 1, "accelerator": "cpu",
                       "price_per_gpu_hour": 0.05, "ray": {"address": RAY_ADDRESS, "gpu_request": "none"}}
    spec["baseline"]["command"] = [sys.executable, "examples/tinygpt/train.py"]  # one process: no torchrun needed
    spec["baseline"]["args"].update({"--num-layers": 2, "--hidden-size": 64, "--num-attention-heads": 2,
                                     "--seq-length": 64, "--global-batch-size": 4})
    spec["workload"].update(seq_length=64, global_batch=4)
    spec["control"].update({"poll_interval_s": 0.5, **control})
    return spec


def _write(parent: Path, spec: dict) -> Path:
    d = parent / spec["name"]
    d.mkdir()
    (d / "campaign.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return d


@pytest.mark.usefixtures("ray_cluster")
def test_a_run_outlives_its_broker_and_is_charged_from_when_it_ran(tmp_path: Path) -> None:
    d = _write(tmp_path, _tiny_ray_campaign(tmp_path, f"ray-restart-{tmp_path.name[-6:]}".replace("_", "-")))
    start(d)
    h1 = CampaignHandle(d)
    assert h1.backend.name == "ray" and h1.image is not None  # the image window reads image_roots, as elsewhere
    out = h1.launch(LaunchRequest(kind="calibration"))
    assert out["admitted"] and out["submitted"], out
    run_id = out["run_id"]
    admitted_at = next(r.ts for r in ledger.read(d).rows if r.type == "launch_admitted")
    wait_for(lambda: h1.state().runs[run_id].status == "running", timeout_s=240, step=h1.poll, interval_s=0.5)
    # the broker stops here (h1 is never polled again); the job runs on
    h2 = CampaignHandle(d)  # the next broker: a new backend instance that knows only the submission id
    # the cluster does not answer for a moment: the run stays in flight (asked again), not lost
    backend, h2.backend = h2.backend, RayBackend(address="http://127.0.0.1:9", request_timeout_s=2)
    assert any("backend unavailable" in e for e in h2.poll()) and h2.state().runs[run_id].status == "running"
    h2.backend = backend
    wait_for(lambda: not h2.state().in_flight, timeout_s=240, step=h2.poll, interval_s=0.5)
    run = h2.state().runs[run_id]
    assert run.outcome == "ok" and run.verdict in ("calibration", "invalid"), run
    assert run.tokens_per_s_per_gpu and run.tokens_per_s_per_gpu > 0
    assert run.nodes and run.charge_gpu_hours == pytest.approx((run.ended_at - run.started_at) / 3600, abs=2e-9)
    # charged from the job's own start (its first log line), not from the admission: the queue is free
    log = (d / "runs" / run_id / "log.txt").read_text()
    marker = float(log.split(START_MARK, 1)[1].split()[0])
    assert run.started_at == pytest.approx(marker) and run.started_at > _epoch(admitted_at)
    # the campaign's first calibration run is also the baseline's reference check run: it runs a check run's
    # 20 steps (its window is measured like any calibration run's)
    assert run.purpose == "reference"
    assert log.count(START_MARK) == 1 and log.count(" iteration       20/      20 |") == 1
    types = [r.type for r in ledger.read(d).rows if r.data.get("run_id") == run_id]
    assert types[:4] == ["launch_admitted", "run_submitted", "run_started", "run_finished"]


def _epoch(ts: object) -> float:
    from datetime import datetime

    return datetime.fromisoformat(str(ts)).timestamp() if not isinstance(ts, int | float) else float(ts)


@pytest.mark.usefixtures("ray_cluster")
def test_a_hung_job_on_ray_is_killed_by_the_broker_s_watchdog(tmp_path: Path) -> None:
    d = make_campaign(
        tmp_path, name=f"ray-hang-{tmp_path.name[-6:]}".replace("_", "-"),
        replace={"cluster": {"backend": "ray", "gpus": 1, "gpus_per_node": 1, "accelerator": "cpu",
                             "ray": {"address": RAY_ADDRESS, "gpu_request": "none"}}},
        baseline={"command": [sys.executable, "tests/fake_trainer.py", "--world-size", "{gpus}"],
                  "args": {"--fake-mode": "hang", "--fake-fail-at": 3}},
        control={"poll_interval_s": 0.2, "hang_timeout_s": 3.0},
    )
    h = CampaignHandle(d)
    out = h.launch(LaunchRequest(kind="calibration"))
    assert out["submitted"], out
    wait_for(lambda: not h.state().in_flight, timeout_s=180, step=h.poll, interval_s=0.3)
    run = h.state().runs[out["run_id"]]
    assert run.outcome == "hang" and "watchdog" in (run.reason or ""), run
    assert run.started_at is not None and run.charge_gpu_hours > 0
    assert h.backend.status(run.backend_id).state.value == "cancelled"  # stopped through the Jobs API
