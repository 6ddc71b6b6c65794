"""The metrics MCP server, driven by the MCP SDK's own client over stdio."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from attune.core.ledger import Ledger
from attune.readers.metrics import read_metrics
from tests._metrics_logs import OOM_TAIL, megatron_lm_log, step_times, write

ROOT = Path(__file__).resolve().parents[1]

SPEC = {
    "name": "metrics-mcp-test",
    "model": "tinygpt",
    "framework": "megatron-lm",
    "cluster": {"backend": "local", "gpus": 4, "gpus_per_node": 4, "accelerator": "cpu"},
    "baseline": {"command": ["python", "train.py"], "args": {"--seq-length": 1024, "--global-batch-size": 16}},
    "workload": {"seq_length": 1024, "global_batch": 16, "precision": "bf16", "steps_per_run": 14,
                 "window": [4, 13]},
}
CALIBRATION = {"cal0": 1000.0, "cal1": 1010.0, "cal2": 990.0, "cal3": 1005.0, "cal4": 995.0}


def _run_log(d: Path, run_id: str, lines: list[str]) -> Path:
    (d / "runs" / run_id).mkdir(parents=True)
    return Path(write(d / "runs" / run_id / "log.txt", lines))


@pytest.fixture
def campaign(tmp_path: Path) -> Path:
    d = tmp_path / "campaign"
    d.mkdir()
    (d / "campaign.yaml").write_text(yaml.safe_dump(SPEC))
    led = Ledger(d)
    led.append("campaign_started", {"name": SPEC["name"], "spec_sha256": "0" * 64, "gpus": 4,
                                    "budget_gpu_hours": 100.0, "reserve_gpu_hours": 6.0})
    for rid, base in CALIBRATION.items():
        path = _run_log(d, rid, megatron_lm_log(times=step_times(base=base)))
        m = read_metrics(path, gpus=4)
        led.append("launch_admitted", {"run_id": rid, "kind": "calibration", "expected_gpu_hours": 1.0})
        led.append("run_finished", {"run_id": rid, "outcome": "ok", "charge_gpu_hours": 1.0})
        led.append("measurement", {"run_id": rid, "tokens_per_s_per_gpu": m.tokens_per_s_per_gpu, "valid": True})
        led.append("calibration_run", {"run_id": rid, "tokens_per_s_per_gpu": m.tokens_per_s_per_gpu})
    # a faster candidate that became the leader, a slower one, an OOM, one still running
    for rid, base in (("fast", 880.0), ("slow", 1100.0)):
        values = [v - 0.001 for v in (10.5 - 0.35 * i for i in range(14))] if rid == "fast" else None
        path = _run_log(d, rid, megatron_lm_log(times=step_times(base=base), loss_values=values))
        m = read_metrics(path, gpus=4)
        led.append("launch_admitted", {"run_id": rid, "kind": "search", "expected_gpu_hours": 1.0,
                                       "lever": "parallel layout", "changes": {"--pipeline-model-parallel-size": 1}})
        led.append("run_finished", {"run_id": rid, "outcome": "ok", "charge_gpu_hours": 1.0})
        led.append("measurement", {"run_id": rid, "tokens_per_s_per_gpu": m.tokens_per_s_per_gpu, "valid": True})
        if rid == "fast":
            led.append("leader_changed", {"run_id": rid, "tokens_per_s_per_gpu": m.tokens_per_s_per_gpu})
    lines = megatron_lm_log()
    oom = lines[: next(n for n, x in enumerate(lines) if "iteration        3/" in x)] + OOM_TAIL
    _run_log(d, "oom", oom)
    led.append("launch_admitted", {"run_id": "oom", "kind": "search", "expected_gpu_hours": 1.0})
    led.append("run_finished", {"run_id": "oom", "outcome": "oom", "charge_gpu_hours": 0.2})
    stuck = _run_log(d, "stuck", lines[: next(n for n, x in enumerate(lines) if "iteration        7/" in x)])
    old = time.time() - 3 * 3600
    os.utime(stuck, (old, old))
    led.append("launch_admitted", {"run_id": "stuck", "kind": "search", "expected_gpu_hours": 1.0})
    led.append("run_started", {"run_id": "stuck"})
    return d


def call(campaign: Path, calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    """Start the server as a subprocess and make the calls over stdio with the SDK's client."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "mcp_servers.metrics_server"],
        env={"ATTUNE_CAMPAIGN_DIR": str(campaign), "PYTHONPATH": str(ROOT)},
        cwd=str(ROOT),
    )

    async def go() -> list[Any]:
        async with Client(params, read_timeout_seconds=60) as client:
            tools = await client.list_tools()
            assert {t.name for t in tools.tools} == {"run_metrics", "compare_runs", "campaign_measurements"}
            assert all(t.description and t.output_schema for t in tools.tools)
            return [await client.call_tool(name, args) for name, args in calls]

    return asyncio.run(go())


def test_run_metrics(campaign: Path) -> None:
    ok, page2, oom, stuck, bad, missing = call(campaign, [
        ("run_metrics", {"run_id": "cal0", "steps_limit": 5, "arguments": ["--seq-length", "world_size", "tensor_*"]}),
        ("run_metrics", {"run_id": "cal0", "steps_offset": 10, "steps_limit": 5}),
        ("run_metrics", {"run_id": "oom"}),
        ("run_metrics", {"run_id": "stuck"}),
        ("run_metrics", {"run_id": "../campaign/runs/cal0"}),
        ("run_metrics", {"run_id": "nope"}),
    ])
    r = ok.structured_content
    expected = read_metrics(campaign / "runs" / "cal0" / "log.txt", gpus=4)
    assert not ok.is_error and r["valid"] is True and r["failure_class"] == "ok"
    assert r["tokens_per_s_per_gpu"] == pytest.approx(expected.tokens_per_s_per_gpu)
    assert r["window_iterations"] == [5, 14]
    assert [s["iteration"] for s in r["steps"]] == [1, 2, 3, 4, 5]
    assert r["steps_page"] == {"offset": 0, "limit": 5, "total": 14, "next_offset": 5}
    assert r["arguments"] == {"seq_length": "1024", "world_size": "4", "tensor_model_parallel_size": "1"}
    assert r["argument_count"] == 14
    assert [s["max_allocated_mib"] for s in r["memory"]["per_stage"]] == [6102.25, 5202.75]
    assert r["ledger_status"] == "finished" and r["ledger_outcome"] == "ok"
    p = page2.structured_content
    assert [s["iteration"] for s in p["steps"]] == [11, 12, 13, 14] and p["steps_page"]["next_offset"] is None
    o = oom.structured_content
    assert o["failure_class"] == "oom" and not o["valid"]
    assert "CUDA out of memory" in o["failure_evidence"][0]["text"]
    # in flight per the ledger, and its log quiet for hours: a hang
    s = stuck.structured_content
    assert s["failure_class"] == "hang" and "no log progress" in s["failure_reason"]
    assert s["ledger_status"] == "running"
    assert bad.is_error and "no path separators" in bad.content[0].text
    assert missing.is_error and "no log at runs/nope/log.txt" in missing.content[0].text


def test_compare_runs(campaign: Path) -> None:
    (res,) = call(campaign, [("compare_runs", {"run_a": "cal0", "run_b": "fast"})])
    c = res.structured_content
    a = read_metrics(campaign / "runs" / "cal0" / "log.txt", gpus=4)
    b = read_metrics(campaign / "runs" / "fast" / "log.txt", gpus=4)
    assert c["gain_b_over_a"] == pytest.approx(b.tokens_per_s_per_gpu / a.tokens_per_s_per_gpu - 1)
    assert c["gain_b_over_a"] > 0.1
    assert c["band"] == pytest.approx(0.03) and c["beyond_band"] is True
    assert c["step_time_ms_delta"] == pytest.approx(-120.0)
    assert c["loss"]["iterations_compared"] == 14
    assert c["loss"]["max_abs_diff"] == pytest.approx(0.001)
    assert c["a"]["stage_max_allocated_mib"] == [6102.25, 5202.75]
    assert c["notes"] == []


def test_campaign_measurements(campaign: Path) -> None:
    full, page, calib = call(campaign, [
        ("campaign_measurements", {}),
        ("campaign_measurements", {"offset": 5, "limit": 2}),
        ("campaign_measurements", {"kind": "calibration"}),
    ])
    m = full.structured_content
    values = [read_metrics(campaign / "runs" / rid / "log.txt", gpus=4).tokens_per_s_per_gpu for rid in CALIBRATION]
    assert m["band"]["values"] == pytest.approx(values)
    assert m["band"]["mean"] == pytest.approx(sum(values) / 5) and m["band"]["band"] == pytest.approx(0.03)
    fast = read_metrics(campaign / "runs" / "fast" / "log.txt", gpus=4).tokens_per_s_per_gpu
    assert m["leader"]["run_id"] == "fast"
    assert m["leader"]["gain_over_baseline"] == pytest.approx(fast / (sum(values) / 5) - 1)
    verdicts = {r["run_id"]: (r["verdict"], r["verdict_source"]) for r in m["runs"]}
    assert verdicts == {
        **{rid: ("calibration", "derived") for rid in CALIBRATION},
        "fast": ("leader", "ledger"),
        "slow": ("slower", "derived"),
        "oom": ("failed", "derived"),
        "stuck": ("in_flight", "derived"),
    }
    assert m["verdict_counts"] == {"calibration": 5, "leader": 1, "slower": 1, "failed": 1, "in_flight": 1}
    assert m["page"]["total"] == 9
    assert next(r for r in m["runs"] if r["run_id"] == "oom")["outcome"] == "oom"
    assert [r["run_id"] for r in page.structured_content["runs"]] == ["fast", "slow"]
    assert page.structured_content["page"]["next_offset"] == 7
    assert [r["run_id"] for r in calib.structured_content["runs"]] == list(CALIBRATION)


def test_without_a_ledger(tmp_path: Path) -> None:
    d = tmp_path / "c"
    d.mkdir()
    (d / "campaign.yaml").write_text(yaml.safe_dump(SPEC))
    _run_log(d, "r1", megatron_lm_log())
    res, run = call(d, [("campaign_measurements", {}), ("run_metrics", {"run_id": "r1"})])
    assert res.is_error and "the campaign has not started" in res.content[0].text
    assert run.structured_content["valid"] is True and run.structured_content["ledger_status"] is None
