"""A campaign session in the real Claude Code, driven by a scripted model.

One headless session (`claude -p --plugin-dir <repo>`) in a tinygpt campaign on the local backend
(real PyTorch training processes on this machine):
- the plugin loads, its four MCP servers connect, and the SessionStart hook's campaign state reaches
  the model;
- the PreToolUse hook, inside the real client, refuses a network command and an edit of the
  correctness list, and allows a read-only command and the skill's own script;
- the scripted agent launches a candidate through the broker tools (the baseline's calibration is
  seeded in the ledger: see `seed_calibration`), waits for the real training run, and reads its
  metrics through the metrics server;
- its first attempt to end the session is blocked by the Stop hook with the hook's reason; after
  `record_stop` the control plane ships (checks, shipped recipe, final re-measurement); a stop
  attempted before that is blocked with only the shipping step named, and once the campaign has
  shipped the stop goes through and the session ends.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from attune.control import campaign as campaign_mod
from attune.core import plugin_servers
from attune.core.ledger import Ledger
from attune.core.state import load as load_state
from tests._broker_helpers import wait_for
from tests.e2e.harness import ROOT, run_session
from tests.e2e.model_server import Block, ScriptedModel, all_text, result_text, text, tool_results, tool_use

SERVERS = plugin_servers.SERVERS
TINYGPT = ROOT / "examples" / "tinygpt" / "train.py"
EXAMPLE = ROOT / "examples" / "campaigns" / "tinygpt-local" / "campaign.yaml"
# The stand-in trainer (tests/fake_trainer.py) replaces tinygpt only when asked, for developing the script.
FAKE = bool(os.environ.get("ATTUNE_E2E_FAKE_TRAINER"))


def mcp(server: str, tool: str) -> str:
    return f"mcp__plugin_attune_{server}__{tool}"


def _tinygpt_campaign(d: Path) -> tuple[dict[str, Any], str]:
    """The example campaign, made small enough for CI's 2 cores: one rank per job, two jobs at once,
    a smaller model and batch. Still real torchrun + PyTorch training of tinygpt."""
    spec = yaml.safe_load(EXAMPLE.read_text())
    spec["cluster"].update(gpus=1, gpus_per_node=1, settings={"slots": 2})
    spec["baseline"]["args"].update({"--num-layers": 2, "--hidden-size": 64, "--num-attention-heads": 2,
                                     "--global-batch-size": 4})
    spec["workload"]["global_batch"] = 4
    spec["budget"] = {**spec.get("budget", {}), "concurrency": 2}
    spec["control"] = {**spec.get("control", {}), "poll_interval_s": 0.2}
    # One candidate is measured: 2 rows per microbatch is this space's limit, so search rule 4 lets the
    # lever be ruled out after it (the control plane enforces the rule at record_stop).
    spec["search_space"] = {"--micro-batch-size": [1, 2]}
    return spec, "--micro-batch-size"


def _fake_campaign(d: Path) -> tuple[dict[str, Any], str]:
    from tests._broker_helpers import FAKE_LIST, FAKE_SPEC

    (d / "fake.yaml").write_text(FAKE_LIST)
    spec = json.loads(json.dumps(FAKE_SPEC))
    spec["baseline"]["command"] = ["python", str(ROOT / "tests" / "fake_trainer.py")]
    spec["search_space"] = {"--fake-step-ms": [spec["baseline"]["args"]["--fake-step-ms"], 10]}  # 10: the limit
    return spec, "--fake-step-ms"


def seed_calibration(d: Path, values: list[float], run_gpu_hours: float) -> None:
    """Record a finished baseline calibration in the ledger, as the broker writes one.

    Five real tinygpt runs would take minutes on CI's two cores (and a loaded machine makes their
    step times too uneven to count); the session then needs one real training run, the candidate's.
    The agent-driven calibration path runs in full with ATTUNE_E2E_FAKE_TRAINER=1 and in the broker's
    own tests."""
    led = Ledger(d)
    for i, v in enumerate(values):
        rid = f"r{i + 1:03d}-calibration"
        led.append("launch_admitted", {"run_id": rid, "kind": "calibration", "expected_gpu_hours": run_gpu_hours,
                                       "changes": {}, "base_run_id": "baseline"})
        led.append("run_finished", {"run_id": rid, "outcome": "ok", "charge_gpu_hours": run_gpu_hours,
                                    "charged_to": "budget"})
        led.append("measurement", {"run_id": rid, "tokens_per_s_per_gpu": v, "valid": True,
                                   "verdict": "calibration"})
        led.append("calibration_run", {"run_id": rid, "tokens_per_s_per_gpu": v})
    led.append("budget_set", {"gpu_hours": 30 * run_gpu_hours, "reserve_gpu_hours": 3 * run_gpu_hours,
                              "run_cost_gpu_hours": run_gpu_hours, "reason": "e2e: seeded calibration"})


@pytest.fixture
def campaign(tmp_path: Path) -> tuple[Path, str]:
    if not FAKE and not TINYGPT.exists():
        pytest.skip("examples/tinygpt is not present yet (the tinygpt workload the e2e campaign runs)")
    d = tmp_path / "campaign"
    d.mkdir()
    spec, flag = (_fake_campaign if FAKE else _tinygpt_campaign)(d)
    (d / "campaign.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    campaign_mod.start(d)
    if not FAKE:
        seed_calibration(d, [6000.0, 6100.0, 5900.0, 6050.0, 5950.0], run_gpu_hours=0.006)
    return d, flag


class Agent:
    """Helpers for the scripted agent: make a call, then read what came back."""

    def __init__(self, model: ScriptedModel) -> None:
        self.model = model
        self.out = ""
        self.is_error = False

    def call(self, name: str, tool_input: dict[str, Any]) -> Iterator[list[Block]]:
        block = tool_use(name, tool_input)
        yield [block]
        got = [r for r in tool_results(self.model.current) if r.get("tool_use_id") == block["id"]]
        self.out = result_text(got[0]) if got else ""
        self.is_error = bool(got[0].get("is_error")) if got else True

    def data(self) -> dict[str, Any]:
        try:
            return json.loads(self.out)
        except ValueError:
            return {}


def test_campaign_session(claude: str, campaign: tuple[Path, str], tmp_path: Path) -> None:
    missing = [s for s in SERVERS if not (ROOT / "mcp_servers" / f"{s}_server.py").exists()]
    assert not missing, f"MCP server module(s) missing: {missing}"
    camp, flag = campaign
    gate_list = camp / "fake.yaml" if FAKE else ROOT / "gate" / "lists" / "tinygpt.yaml"
    seen: dict[str, Any] = {}

    def script(model: ScriptedModel) -> Iterator[list[Block]]:
        a = Agent(model)
        seen["context"] = all_text(model.current) + json.dumps(model.current.get("system", ""))
        yield from a.call("Bash", {"command": "curl -s http://example.com", "description": "fetch"})
        seen["curl"] = (a.out, a.is_error)
        yield from a.call("Read", {"file_path": str(gate_list)})
        seen["read_list"] = (a.out, a.is_error)
        first = gate_list.read_text().splitlines()[0]  # unique, so the client's own input checks pass
        yield from a.call("Edit", {"file_path": str(gate_list), "old_string": first, "new_string": "# mine"})
        seen["edit_list"] = (a.out, a.is_error)
        yield from a.call("Bash", {"command": "ls", "description": "list the campaign"})
        seen["ls"] = (a.out, a.is_error)
        script_path = ROOT / "skills" / "attune" / "scripts" / "levers.py"
        yield from a.call("Bash", {"command": f"python3 {script_path} --search overlap", "description": "levers"})
        seen["skill_script"] = (a.out, a.is_error)
        # Calibrate the baseline through the broker, then launch one candidate.
        for _ in range(60):
            yield from a.call(mcp("broker", "campaign_status"), {})
            status = a.data()
            cal = status.get("calibration") or {}
            if cal.get("band") is not None:
                break
            flying = len(status.get("in_flight") or [])
            if cal.get("runs", 0) + flying < cal.get("required_runs", 5) and flying < status.get("concurrency", 1):
                yield from a.call(mcp("broker", "launch_calibration"), {})
                if a.data().get("admitted"):
                    continue
            yield from a.call("Bash", {"command": "sleep 1", "description": "wait for runs"})
        seen["calibration"] = status.get("calibration")
        yield from a.call(mcp("broker", "launch_candidate"), {
            "changes": {"args": {flag: 2 if not FAKE else 10}},
            "hypothesis": "the step is bound by per-microbatch overhead; fewer, larger microbatches cut it",
            "lever": "micro-batch-size", "expected_gain": 0.05,
            "code_locations": {flag: "examples/tinygpt/config.py:47" if not FAKE else "tests/fake_trainer.py:30"},
        })
        launch = a.data()
        seen["launch"] = (a.out, a.is_error)
        run_id = launch.get("run_id")
        for _ in range(120):
            yield from a.call(mcp("broker", "run_status"), {"run_id": run_id})
            if a.data().get("status") == "finished":
                break
            yield from a.call("Bash", {"command": "sleep 1", "description": "wait for the candidate"})
        seen["run_status"] = a.data()
        yield from a.call(mcp("metrics", "run_metrics"), {"run_id": run_id, "steps_limit": 3})
        seen["metrics"] = (a.data(), a.is_error)
        yield [text("The candidate is measured; I am done.")]
        seen["first_stop"] = all_text(model.current)
        yield from a.call(mcp("broker", "record_stop"), {
            "levers_tested": ["micro-batch-size"],
            "diagnosis": "per-step overhead dominates; the remaining levers cannot beat the band on this machine"})
        seen["record_stop"] = (a.data(), a.is_error)
        yield [text("Stop recorded; done.")]
        # Blocked again only while the control plane has not shipped yet (it ships after the stop).
        seen["second_stop"] = all_text(model.current)
        for _ in range(600):
            yield from a.call(mcp("broker", "campaign_status"), {})
            if (a.data().get("shipping") or {}).get("done"):
                break
            yield from a.call("Bash", {"command": "sleep 1", "description": "wait for shipping"})
        seen["shipping"] = a.data().get("shipping")
        yield [text("Shipped; done.")]

    session = run_session(camp, script, tmp_path, max_turns=400, timeout=600)
    detail = session.describe()
    status = session.mcp_status()
    assert {f"plugin:attune:{n}": "connected" for n in SERVERS}.items() <= status.items(), detail
    assert not session.init.get("plugin_errors"), detail
    assert not session.model.errors, detail
    # The SessionStart hook's campaign state reached the model with the first request.
    assert "state rebuilt from its ledger" in seen["context"] and "Open items before this session" in seen["context"]
    out, err = seen["curl"]
    assert err and "curl is a network tool" in out, out
    assert not seen["read_list"][1], seen["read_list"][0]
    out, err = seen["edit_list"]
    assert err and "never writable" in out, out
    assert not seen["ls"][1] and "campaign.yaml" in seen["ls"][0]
    assert not seen["skill_script"][1], seen["skill_script"][0]  # the skill's own script runs
    assert seen["calibration"]["band"] is not None, seen["calibration"]
    out, err = seen["launch"]
    assert not err and json.loads(out)["admitted"] is True, out
    assert seen["run_status"]["outcome"] == "ok", seen["run_status"]
    metrics, err = seen["metrics"]
    # The measurement itself (valid or not: a loaded machine can make the window too uneven) is the
    # metrics reader's; here it must have come back through the real client.
    assert not err and metrics["tokens_per_s_per_gpu"] > 0 and metrics["window_iterations"] == [5, 14], metrics
    # The premature stop was blocked with the Stop hook's reason, naming what is missing.
    assert "Stop hook feedback" in seen["first_stop"]
    assert "no stop with evidence is recorded" in seen["first_stop"]
    assert not seen["record_stop"][1] and seen["record_stop"][0]["recorded"] is True
    stops = [r["decision"] for r in session.hook_log() if r["event"] == "Stop"]
    if "second_stop" in seen and stops.count("block") == 2:  # the stop came before the control plane was done
        second = seen["second_stop"].rsplit("Stop hook feedback", 1)[-1]
        # what is left is the control plane's: the shipping step, or its re-measurement runs in flight
        assert "no stop with evidence" not in second
        assert "shipping step has not run" in second or "remeasure" in second, second[-600:]
    # ... and once the campaign has shipped (the control plane's step after the stop), the session ended.
    assert session.result["subtype"] == "success" and session.returncode == 0, detail
    assert stops[-1] == "allow" and stops.count("block") in (1, 2), stops
    state, _ = load_state(camp)
    assert state.stop is not None and state.runs[seen["run_status"]["run_id"]].outcome == "ok"
    # The session may end once a recipe has shipped; the final re-measurement goes on under the broker.
    assert state.shipped is not None
    wait_for(lambda: not load_state(camp)[0].in_flight, timeout_s=300, interval_s=0.5)
    subprocess.run([sys.executable, "-m", "attune", "broker", "stop", str(camp)], cwd=ROOT, capture_output=True,
                   timeout=60)
    shutil.rmtree(camp / "runs", ignore_errors=True)
