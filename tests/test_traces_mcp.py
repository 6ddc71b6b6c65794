"""The traces MCP server, driven by the official SDK's client over stdio (a real server process)."""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.trace_synth import write_run

ROOT = Path(__file__).resolve().parents[1]


def _params(campaign: Path) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable, args=["-m", "mcp_servers.traces_server"], cwd=str(ROOT),
        env={"PYTHONPATH": str(ROOT), "ATTUNE_CAMPAIGN_DIR": str(campaign)},
    )


def _with_client(campaign: Path, body):
    async def go():
        async with Client(_params(campaign), read_timeout_seconds=120) as client:
            return await body(client)

    return anyio.run(go)


def test_analyze_a_profiled_run_then_drill_down(tmp_path):
    write_run(tmp_path / "runs" / "r7" / "traces", pp=2, dp=2, steps=3, layers=2, microbatches=2, gz=True)
    (tmp_path / "runs" / "r8").mkdir()
    (tmp_path / "runs" / "r8" / "metrics.json").write_text('{"a": 1}')

    async def body(client):
        tools = {t.name: t for t in (await client.list_tools()).tools}
        runs = await client.call_tool("list_profiled_runs", {})
        summary = await client.call_tool("analyze_run", {"run_id": "r7"})
        details = await client.call_tool("rank_details", {"run_id": "r7", "rank": 2, "limit": 2})
        page2 = await client.call_tool("rank_details", {"run_id": "r7", "rank": 2, "offset": 2, "limit": 2})
        kernels = await client.call_tool("heaviest", {"run_id": "r7", "limit": 2})
        ops = await client.call_tool("heaviest", {"run_id": "r7", "what": "operators", "rank": 0})
        return tools, runs, summary, details, page2, kernels, ops

    tools, runs, summary, details, page2, kernels, ops = _with_client(tmp_path, body)
    assert set(tools) == {"list_profiled_runs", "analyze_run", "rank_details", "heaviest"}
    assert "slowest" in tools["analyze_run"].description and tools["analyze_run"].output_schema is not None
    assert runs.structured_content["result"] == [{"run_id": "r7", "trace_files": 4,
                                                  "trace_mb": runs.structured_content["result"][0]["trace_mb"]}]
    s = summary.structured_content
    assert not summary.is_error and s["files"] == 4 and s["ranks_total"] == 4
    assert s["stage_source"] == "process_groups" and [st["stage"] for st in s["stages"]] == [0, 1]
    assert s["slowest_stage"] in (0, 1) and s["bottleneck"] and s["slowest_waits"]
    assert s["summary"].startswith("4 rank trace(s), 2 stage(s)")
    assert all(r["compute_us"] is not None and r["comm_comp_overlap_pct"] is not None for r in s["ranks"])
    assert len(s["top_kernels"]) <= 5
    d = details.structured_content
    assert d["rank"] == 2 and d["stage"] == 1 and d["steps_total"] == 3 and len(d["steps"]) == 2
    assert d["next_offset"] == 2 and page2.structured_content["next_offset"] is None
    assert len(page2.structured_content["steps"]) == 1
    assert d["breakdown"]["comm_exposed_by_kind"]["pipeline_p2p"] > 0
    k = kernels.structured_content
    assert len(k["items"]) == 2 and k["next_offset"] == 2 and k["items"][0]["kind"] == "compute"
    assert ops.structured_content["items"][0]["name"].startswith(("autograd", "aten::"))


def test_refusals(tmp_path):
    (tmp_path / "runs" / "empty").mkdir(parents=True)
    (tmp_path / "outside").mkdir()

    async def body(client):
        out = {}
        for rid in ("../outside", "a/b", "..", ".hidden", "nope", "empty"):
            out[rid] = await client.call_tool("analyze_run", {"run_id": rid})
        return out

    out = _with_client(tmp_path, body)
    for rid in ("../outside", "a/b", "..", ".hidden"):
        assert out[rid].is_error and "not a run id" in out[rid].content[0].text
    assert out["nope"].is_error and "no run 'nope'" in out["nope"].content[0].text
    assert out["empty"].is_error and "no traces" in out["empty"].content[0].text
