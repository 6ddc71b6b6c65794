"""A broker left running on a directory that was deleted and made again does not touch the new
campaign's runs (it would otherwise finish them as lost, since its backend never saw them)."""

from __future__ import annotations

import shutil
from pathlib import Path

from attune.control.plane import LaunchRequest
from broker.campaigns import CampaignHandle
from tests._broker_helpers import make_campaign
from tests.test_launch import settle


def test_stale_handle_leaves_a_recreated_campaign_alone(tmp_path: Path) -> None:
    d = make_campaign(tmp_path, "same")
    stale = CampaignHandle(d)
    shutil.rmtree(d)
    d = make_campaign(tmp_path, "same")
    fresh = CampaignHandle(d)
    out = fresh.launch(LaunchRequest(kind="calibration"))
    assert out["admitted"] and out["submitted"]
    assert stale.poll() == ["the campaign directory now holds another campaign: not watching it"]
    settle(fresh)
    run = fresh.state().runs[out["run_id"]]
    assert run.outcome == "ok" and run.valid, (run.outcome, run.reason)
