"""A campaign started from inside the plugin, and its jobs' Python environment.

- `start_campaign` (the broker MCP server, over stdio with the SDK's client) starts a campaign as
  `attune init` does; a bad spec comes back as the field-path list `attune validate` prints; the other
  broker tools say to call it first.
- The workload's environment (`environment` in the spec): a launch whose interpreter cannot import
  the workload's modules is refused before admission (code `environment`, with the fix), nothing is
  charged; a named interpreter that can runs the job (the command's `python` is replaced by it).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from attune.control import workenv
from attune.control.plane import LaunchRequest
from attune.control.spec import load_spec
from attune.core import ledger
from broker.campaigns import CampaignHandle
from tests._broker_helpers import FAKE_LIST, FAKE_SPEC, ROOT, deep_update, make_campaign, wait_for


def _params(campaign: Path) -> StdioServerParameters:
    env = {"ATTUNE_CAMPAIGN_DIR": str(campaign), "PYTHONPATH": str(ROOT), "PATH": os.environ["PATH"],
           "HOME": os.environ.get("HOME", "/tmp")}
    return StdioServerParameters(command=sys.executable, args=["-m", "mcp_servers.broker_server"], env=env,
                                 cwd=str(ROOT))


def _write(d: Path, spec: dict[str, Any]) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / "fake.yaml").write_text(FAKE_LIST)
    (d / "campaign.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))


def test_start_campaign_tool_starts_it_like_attune_init_and_lists_every_spec_problem(tmp_path: Path) -> None:
    bad, good = tmp_path / "bad", tmp_path / "good"
    spec = deep_update(FAKE_SPEC, {"name": "started-here"})
    _write(good, spec)
    _write(bad, deep_update(spec, {"workload": {"window": [4, 20]}, "budget": {"concurrency": 0}}))

    async def go(d: Path, calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
        async with Client(_params(d), read_timeout_seconds=90) as client:
            return [await client.call_tool(name, args) for name, args in calls]

    before, started, again = asyncio.run(go(good, [("campaign_status", {}), ("start_campaign", {}),
                                                  ("start_campaign", {})]))
    assert before.is_error and "call start_campaign first" in before.content[0].text
    s = started.structured_content
    assert not started.is_error and s["started"] and not s["already_started"] and s["name"] == "started-here"
    rows = ledger.read(good).rows
    assert [r.type for r in rows] == ["campaign_started"] and rows[0].data["spec_sha256"] == s["spec_sha256"]
    assert again.structured_content["already_started"] is True and len(ledger.read(good).rows) == 1
    assert s["environment"] is None and "launch_calibration" in s["next"]  # no environment in this spec

    [refused] = asyncio.run(go(bad, [("start_campaign", {})]))
    validate = subprocess.run([sys.executable, "-m", "attune", "validate", str(bad / "campaign.yaml")],
                              cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert refused.is_error and validate.returncode == 2
    text = refused.content[0].text
    assert "workload: " in text and "budget.concurrency" in text
    for line in validate.stderr.strip().splitlines()[1:]:  # every problem, with its field path
        assert line.strip() in text, (line, text)
    assert not (bad / ledger.LEDGER_NAME).exists()


def test_a_launch_without_the_workload_environment_is_refused_before_admission(tmp_path: Path) -> None:
    d = make_campaign(tmp_path, environment={"imports": ["attune_no_such_module"], "packages": ["no-such-pkg==1"]},
                      control={"expected_run_gpu_hours": 0.001})
    h = CampaignHandle(d)
    out = h.launch(LaunchRequest(kind="calibration"))
    assert out["admitted"] is False and out["code"] == "environment"
    assert "cannot import attune_no_such_module" in out["reason"]
    assert "workload_environment tool with build: true" in out["reason"]  # the fix
    st = h.state()
    assert not st.runs and st.budget.charged == 0 and st.budget.in_flight == 0
    assert [r.data["code"] for r in ledger.read(d).rows if r.type == "launch_refused"] == ["environment"]
    env = workenv.status(load_spec(d / "campaign.yaml"), d)
    assert env.state == "missing" and env.directory and "no-such-pkg==1" in env.reason


def test_a_named_interpreter_that_has_the_modules_runs_the_jobs(tmp_path: Path) -> None:
    venv = tmp_path / "wl"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    d = make_campaign(tmp_path, environment={"python": str(venv / "bin" / "python"), "imports": ["json", "argparse"]})
    h = CampaignHandle(d)
    out = h.launch(LaunchRequest(kind="calibration"))
    assert out["admitted"], out
    wait_for(lambda: not h.state().in_flight, timeout_s=30, step=h.poll)
    run = h.state().runs[out["run_id"]]
    assert run.outcome == "ok", run
    job = json.loads((d / "runs" / out["run_id"] / "job.json").read_text())
    assert job["argv"][0] == str(venv / "bin" / "python")
    # the same interpreter without a module the spec names: refused, with the interpreter named
    d2 = make_campaign(tmp_path, name="fake-b",
                       environment={"python": str(venv / "bin" / "python"), "imports": ["yaml"]})
    out2 = CampaignHandle(d2).launch(LaunchRequest(kind="calibration"))
    assert out2["code"] == "environment" and str(venv / "bin" / "python") in out2["reason"]
    assert "No module named 'yaml'" in out2["reason"]


def test_the_recorded_tool_schemas_are_the_servers_own() -> None:
    """mcp_servers/tool_schemas.json (what a first start lists while it builds) matches the servers."""
    from mcp_servers import launch

    recorded = json.loads((ROOT / "mcp_servers" / "tool_schemas.json").read_text())
    live = json.loads(json.dumps(launch.write_schemas(ROOT)))
    assert recorded["servers"].keys() == live["servers"].keys() == set(launch.SERVERS)
    for name, entry in live["servers"].items():
        assert recorded["servers"][name] == entry, (
            f"{name}: tool_schemas.json is stale; run: python mcp_servers/launch.py --write-schemas")
