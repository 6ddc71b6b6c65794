"""The broker MCP server, driven by the MCP SDK's own client over stdio.

The server starts the campaign's local broker on demand (the embedded default), and every tool
goes through it over HTTP with the campaign's token.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from attune.core import ledger
from broker.campaigns import CampaignHandle
from tests._broker_helpers import ROOT, make_campaign, wait_for
from tests.test_launch import CALIBRATED_BUDGET, calibrate

TOOLS = {
    "launch_candidate", "launch_calibration", "run_status", "list_runs", "cancel_run", "read_run_log",
    "search_run_log", "list_image_dir", "read_image_file", "search_image", "record_assumption", "record_stop",
    "campaign_status", "ttb_best_known_recipe", "record_diagnosis", "start_campaign", "workload_environment",
    "verify_ledger",
}


@pytest.fixture
def campaign(tmp_path: Path) -> Iterator[Path]:
    d = make_campaign(tmp_path, budget=CALIBRATED_BUDGET)
    calibrate(CampaignHandle(d))
    yield d
    endpoint = d / ".broker" / "endpoint.json"
    if endpoint.exists():  # stop the local broker the MCP server started
        pid = json.loads(endpoint.read_text())["pid"]
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not endpoint.exists(), timeout_s=20)


def params(campaign: Path) -> StdioServerParameters:
    env = {"ATTUNE_CAMPAIGN_DIR": str(campaign), "PYTHONPATH": str(ROOT), "PATH": os.environ["PATH"]}
    return StdioServerParameters(command=sys.executable, args=["-m", "mcp_servers.broker_server"], env=env,
                                 cwd=str(ROOT))


async def wait_finished(client: Client, run_id: str, timeout_s: float = 30.0) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        res = await client.call_tool("run_status", {"run_id": run_id})
        s = res.structured_content
        assert not res.is_error, res
        if s["status"] == "finished" and s["verdict"] is not None:
            return s
        assert loop.time() < deadline, s
        await asyncio.sleep(0.2)


def test_the_agent_tools_over_stdio(campaign: Path) -> None:
    async def go() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with Client(params(campaign), read_timeout_seconds=90) as client:
            tools = (await client.list_tools()).tools
            assert {t.name for t in tools} == TOOLS
            assert all(t.description and t.output_schema for t in tools)
            out["status"] = (await client.call_tool("campaign_status", {})).structured_content
            out["ledger"] = (await client.call_tool("verify_ledger", {})).structured_content
            fast = await client.call_tool("launch_candidate", {
                "changes": {"args": {"--fake-step-ms": 8}}, "hypothesis": "the step is bound by its sleep",
                "lever": "step time", "expected_gain": 1.0})
            out["fast"] = fast.structured_content
            out["fast_done"] = await wait_finished(client, out["fast"]["run_id"])
            out["gate"] = await client.call_tool("launch_candidate", {
                "changes": {"args": {"--lr": 0.01}}, "hypothesis": "h", "lever": "lr", "expected_gain": 0.1})
            out["calib"] = (await client.call_tool("launch_calibration", {})).structured_content
            rid = out["fast"]["run_id"]
            out["tail"] = (await client.call_tool("read_run_log", {"run_id": rid, "tail": 3})).structured_content
            out["page"] = (await client.call_tool("read_run_log", {"run_id": rid, "offset_line": 1,
                                                                   "max_lines": 4})).structured_content
            out["grep"] = (await client.call_tool("search_run_log", {"run_id": rid,
                                                                     "pattern": r"iteration +1[0-4]/"})).structured_content
            out["runs"] = (await client.call_tool("list_runs", {"status": "finished", "limit": 2})).structured_content
            out["ls"] = (await client.call_tool("list_image_dir", {})).structured_content
            out["find"] = (await client.call_tool("search_image", {"pattern": "fake-fail-at",
                                                                    "glob": "*.py"})).structured_content
            out["read"] = (await client.call_tool("read_image_file", {"path": "fake_trainer.py",
                                                                      "max_lines": 2})).structured_content
            out["escape"] = await client.call_tool("read_image_file", {"path": "../attune/launch.py"})
            out["missing"] = await client.call_tool("run_status", {"run_id": "r999-nope"})
            out["cancel_done"] = (await client.call_tool("cancel_run", {"run_id": rid})).structured_content
            out["assume"] = (await client.call_tool("record_assumption", {
                "question": "may I use more nodes?", "default": "no: the GPU count is pinned"})).structured_content
            out["diag"] = (await client.call_tool("record_diagnosis", {
                "run_id": rid, "diagnosis": "the step is now bound by the data path",
                "bottleneck": "data path"})).structured_content
            out["refused_stop"] = await client.call_tool("record_stop", {
                "levers_tested": ["never-launched"], "diagnosis": "d"})
            out["blocked"] = (await client.call_tool("campaign_status", {})).structured_content
            out["stop"] = (await client.call_tool("record_stop", {
                "levers_tested": ["step time"], "diagnosis": "the step is now bound by the data path"})).structured_content
            out["after_stop"] = (await client.call_tool("launch_candidate", {
                "changes": {"args": {"--fake-variant": 2}}, "hypothesis": "h", "lever": "v", "expected_gain": 0.01,
                "code_locations": {"--fake-variant": "tests/fake_trainer.py:35"}})).structured_content
            out["final"] = (await client.call_tool("campaign_status", {})).structured_content
        return out

    out = asyncio.run(go())
    st = out["status"]
    assert st["name"] == "fake-a" and st["calibration"]["runs"] == 5 and st["leader"]["run_id"] == "baseline"
    assert st["budget"]["search_remaining_gpu_hours"] > 0 and st["image_roots"] == ["trainer"]
    assert out["fast"]["admitted"] and out["fast"]["submitted"] and out["fast"]["gate_summary"].startswith("layer 1 passes")
    done = out["fast_done"]
    assert done["outcome"] == "ok" and done["verdict"] == "leader" and done["charge_gpu_hours"] > 0

    gate = out["gate"]
    assert not gate.is_error  # a refusal is an ordinary result
    g = gate.structured_content
    assert g["admitted"] is False and g["code"] == "gate" and "lr [numeric]" in g["reason"]
    assert g["gate_refusals"][0]["klass"] == "numeric"
    assert out["calib"]["admitted"] is False and out["calib"]["code"] == "calibration_full"

    assert len(out["tail"]["lines"]) == 3 and "iteration       14/" in out["tail"]["lines"][-1]
    assert out["page"]["next_line"] == 5 and "arguments" in out["page"]["lines"][0]
    assert len(out["grep"]["matches"]) == 5 and not out["grep"]["truncated"]
    assert [r["run_id"] for r in out["runs"]["runs"]] == ["r001-calibration", "r002-calibration"]
    assert out["runs"]["next_offset"] == 2 and out["runs"]["total"] == 6
    assert "fake_trainer.py" in [e["name"] for e in out["ls"]["entries"]]
    assert out["find"]["matches"][0]["path"] == "trainer/fake_trainer.py"
    assert len(out["read"]["lines"]) == 2 and out["read"]["next_line"] == 3
    assert out["escape"].is_error and "leaves its root" in out["escape"].content[0].text
    assert out["missing"].is_error and "no run 'r999-nope'" in out["missing"].content[0].text
    assert out["cancel_done"]["cancelled"] is False and "already finished" in out["cancel_done"]["reason"]
    assert out["diag"]["recorded"]
    assert out["refused_stop"].is_error and "levers_not_run" in out["refused_stop"].content[0].text
    assert {"code": "levers_not_run", "items": ["never-launched"]}.items() <= next(
        b for b in out["blocked"]["stop_blockers"] if b["code"] == "levers_not_run").items()
    assert out["assume"]["recorded"] and out["stop"]["recorded"] and out["stop"]["leader"] == done["run_id"]
    assert out["after_stop"]["admitted"] is False and out["after_stop"]["code"] == "stopped"
    assert out["final"]["stop_recorded"] and out["final"]["leader"]["run_id"] == done["run_id"]
    # the ledger checked by the broker with the key the agent never reads (issue 24, class 7)
    assert out["ledger"]["ok"] and out["ledger"]["authenticated"] and out["ledger"]["rows"] >= 1

    types = [r.type for r in ledger.read(campaign).rows]
    assert types.count("assumption_recorded") == 1 and types.count("stop_recorded") == 1
    audit = [json.loads(x) for x in (campaign / "audit.jsonl").read_text().splitlines()]
    assert {e["route"] for e in audit} >= {"launch", "run_status", "read_run_log", "search_run_log", "image_search",
                                          "image_read", "image_list", "record_assumption", "record_stop",
                                          "campaign_status", "list_runs", "cancel", "record_diagnosis"}
