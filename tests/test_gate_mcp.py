"""The gate MCP server, driven by the official SDK's client over stdio (a real server process)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from gate.lists import LISTS_DIR, list_sha256
from tests.gate_fixtures import GLM, megatron_log

ROOT = Path(__file__).resolve().parents[1]


def _params(campaign: Path, **env: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable, args=["-m", "mcp_servers.gate_server"], cwd=str(ROOT),
        env={"PYTHONPATH": str(ROOT), "ATTUNE_CAMPAIGN_DIR": str(campaign), **env},
    )


def _with_client(params, body):
    async def go():
        async with Client(params, read_timeout_seconds=60) as client:
            return await body(client)

    return anyio.run(go)


def test_tools_are_listed_with_descriptions(tmp_path):
    async def body(client):
        return (await client.list_tools()).tools

    tools = {t.name: t for t in _with_client(_params(tmp_path, ATTUNE_GATE_MODEL="glm-4.5"), body)}
    assert set(tools) == {"check_change", "check_resolved_run", "explain_argument", "check_convergence",
                          "list_correctness_lists"}
    assert "before" in tools["check_change"].description.lower()
    assert tools["check_change"].output_schema is not None


def test_check_change_explain_and_pinning(tmp_path):
    sha = list_sha256(LISTS_DIR / "glm-4.5.yaml")

    async def body(client):
        ok = await client.call_tool("check_change", {"baseline": {"args": GLM},
                                                     "args": {"--tensor-model-parallel-size": 1,
                                                              "--sequence-parallel": None},
                                                     "env": {"NCCL_ALGO": "Ring"}})
        bad = await client.call_tool("check_change", {"baseline": {"args": GLM},
                                                      "args": {"--micro-batch-size": 2, "--expert-model-parallel-size": 1,
                                                               "--expert-tensor-parallel-size": 4}})
        exp = await client.call_tool("explain_argument", {"name": "--tp-comm-overlap"})
        other = await client.call_tool("explain_argument", {"name": "--lr", "model": "tinygpt"})
        return ok, bad, exp, other

    ok, bad, exp, other = _with_client(_params(tmp_path, ATTUNE_GATE_MODEL="glm-4.5",
                                               ATTUNE_GATE_LIST_SHA256=sha), body)
    assert not ok.is_error and ok.structured_content["passed"] is True
    assert ok.structured_content["list_sha256"] == sha
    assert {c["name"] for c in ok.structured_content["changes"]} == {"tensor_model_parallel_size", "sequence_parallel",
                                                                     "NCCL_ALGO"}
    s = bad.structured_content
    assert s["passed"] is False and "ep1-etp4" in s["defects"]
    assert {r["name"]: r["klass"] for r in s["refusals"]}["micro_batch_size"] == "frozen"
    assert exp.structured_content["klass"] == "frozen" and exp.structured_content["value"] is False
    assert other.is_error and "pinned to 'glm-4.5'" in other.content[0].text


def test_a_changed_list_is_refused_by_the_server(tmp_path):
    async def body(client):
        return await client.call_tool("check_change", {"baseline": {"args": GLM}, "args": {"--lr": 1.0}})

    r = _with_client(_params(tmp_path, ATTUNE_GATE_MODEL="glm-4.5", ATTUNE_GATE_LIST_SHA256="ab" * 32), body)
    assert r.is_error and "pins" in r.content[0].text


def test_convergence_and_resolved_run_with_campaign_files(tmp_path):
    base = {i: 10.0 - 0.2 * i for i in range(1, 21)}
    cand = {i: (v * 1.3 if i >= 12 else v) for i, v in base.items()}
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "baseline.json").write_text(json.dumps({str(k): v for k, v in base.items()}))
    resolved = {"tensor_model_parallel_size": 2, "micro_batch_size": 1, "world_size": 128, "seq_length": 4096,
                "accumulate_allreduce_grads_in_fp32": True}
    (runs / "base.log").write_text(megatron_log(resolved, base))
    (runs / "cand.log").write_text(megatron_log({**resolved, "accumulate_allreduce_grads_in_fp32": False}, cand))
    outside = tmp_path.parent / "outside.json"

    async def body(client):
        good = await client.call_tool("check_convergence", {"baseline": "runs/baseline.json",
                                                            "candidate": "runs/base.log"})
        badc = await client.call_tool("check_convergence", {"baseline": "runs/baseline.json",
                                                            "candidate": "runs/cand.log", "failures_limit": 3})
        page2 = await client.call_tool("check_convergence", {"baseline": "runs/baseline.json",
                                                             "candidate": "runs/cand.log", "failures_limit": 3,
                                                             "failures_offset": 3})
        inline = await client.call_tool("check_convergence", {"baseline_losses": {"1": 2.0, "2": 1.9},
                                                              "candidate_losses": {"1": "nan", "2": 1.9}})
        escape = await client.call_tool("check_convergence", {"baseline": str(outside), "candidate": "runs/base.log"})
        res = await client.call_tool("check_resolved_run", {"baseline_log": "runs/base.log",
                                                            "candidate_log": "runs/cand.log"})
        from_log = await client.call_tool("check_convergence", {"baseline": "runs/base.log",
                                                                "candidate": "runs/base.log"})
        given = await client.call_tool("check_convergence", {"baseline": "runs/baseline.json", "candidate": "runs/base.log",
                                                             "precision": "fp32", "change": "layout"})
        return good, badc, page2, inline, escape, res, from_log, given

    good, badc, page2, inline, escape, res, from_log, given = _with_client(
        _params(tmp_path, ATTUNE_GATE_MODEL="glm-4.5"), body)
    g = good.structured_content
    # JSON curves say nothing of precision: bf16 is assumed, and the result says so (not a silent fp32)
    assert g["precision"] == "bf16" and g["precision_source"] == "default" and g["noise_source"] == "floor"
    assert "precision bf16 (assumed" in g["assumed"] and "change unknown" in g["assumed"]
    fl = from_log.structured_content  # the log's arguments block has no --bf16: fp32, read from the log
    assert fl["precision"] == "fp32" and fl["precision_source"] == "log" and "read from the log" in fl["assumed"]
    gv = given.structured_content
    assert gv["precision"] == "fp32" and gv["precision_source"] == "given" and "change layout" in gv["assumed"]
    assert g["passed"] is True and g["correlation"] == pytest.approx(1.0) and g["failures_total"] == 0
    assert g["reference_passed"] is True and g["noise_aware_passed"] is True and abs(g["noise_level_z"]) < 1e-6
    assert "floor alone" in g["envelope_basis"]
    b = badc.structured_content
    assert b["passed"] is False and b["pointwise_failing_steps"] == 9 and b["failures_total"] == 9
    assert b["reference_passed"] is False and b["noise_aware_passed"] is False
    assert any(r.startswith("reference: ") for r in b["reasons"])
    assert any(r.startswith("noise-aware: ") for r in b["reasons"])
    assert [f["step"] for f in b["failures"]] == [12, 13, 14] and b["next_offset"] == 3
    assert [f["step"] for f in page2.structured_content["failures"]] == [15, 16, 17]
    i = inline.structured_content
    assert i["passed"] is False and any("non-finite" in p for p in i["data_problems"])
    assert escape.is_error and "outside the campaign directory" in escape.content[0].text
    r = res.structured_content
    assert r["passed"] is False and r["mode"] == "resolved"
    assert [x["name"] for x in r["refusals"]] == ["accumulate_allreduce_grads_in_fp32"]
