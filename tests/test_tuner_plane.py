"""A built-in tuner driven through the broker (the same control plane as the agent), with early abort."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from attune.core import ledger
from attune.tuners.driver import drive
from attune.tuners.random_search import RandomTuner
from broker.campaigns import CampaignHandle
from broker.client import BrokerClient, ensure_local_broker
from broker.tuner_plane import BrokerControlPlane
from tests._broker_helpers import make_campaign, wait_for
from tests.test_launch import CALIBRATED_BUDGET, calibrate


def test_random_search_through_the_broker_with_early_abort(tmp_path: Path) -> None:
    d = make_campaign(tmp_path, budget={**CALIBRATED_BUDGET, "concurrency": 2})
    calibrate(CampaignHandle(d))
    ep = ensure_local_broker(d, idle_exit_s=60)
    try:
        with BrokerClient(ep.url, ep.token) as client:
            plane = BrokerControlPlane(client, poll_s=0.1)
            assert plane.concurrency == 2 and plane.can_launch()
            tuner = RandomTuner({"--fake-step-ms": [10, 20, 60]}, {"--fake-step-ms": 20}, seed=3)
            res = drive(tuner, plane, early_abort=True)
        outcomes = {c.changes["--fake-step-ms"]: o for c, o in res.outcomes}
        assert set(outcomes) == {10, 60}
        assert outcomes[10].outcome == "ok" and outcomes[10].promoted
        # 60 ms steps run at a third of the leader's throughput: clearly lost, stopped after 2 measured steps
        assert outcomes[60].outcome == "pruned" and not outcomes[60].promoted
        assert res.launches == 2 and res.pruned == 1 and res.refused == 0
        rows = ledger.read(d).rows
        pruned = next(r.data for r in rows if r.type == "run_finished" and r.data["outcome"] == "pruned")
        assert "early abort" in pruned["reason"] and pruned["charge_gpu_hours"] > 0
        log = (d / "runs" / pruned["run_id"] / "log.txt").read_text()
        assert "iteration        6/" in log and "iteration       14/" not in log
        stop = next(r.data for r in rows if r.type == "stop_recorded")
        assert stop["levers_tested"] == ["--fake-step-ms"] and stop["diagnosis"].startswith("random:")
    finally:
        os.kill(ep.pid or json.loads((d / ".broker" / "endpoint.json").read_text())["pid"], signal.SIGTERM)
        wait_for(lambda: not (d / ".broker" / "endpoint.json").exists(), timeout_s=20)
