"""`attune tune --tuner claude`, killed mid-campaign and resumed: no run lost, no run repeated.

The real Claude Code runs headless with the plugin (started by attune's launcher); the scripted
model server (tests/e2e/model_server.py) stands in for the model and outlives both launcher runs,
so the "agent" keeps its plan across the kill, as a resumed session keeps its conversation. The jobs
are real processes of the stand-in trainer on the local backend. The test kills the whole `attune
tune` process group (the launcher, claude and its MCP servers) while a candidate is in flight, then
runs the same command again: the launcher resumes the recorded session with `--resume`, the run
that was in flight has finished under the detached broker, and the agent's retry of the candidate
whose answer it never saw is refused as identical by the control plane.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from attune.control import campaign as campaign_mod
from attune.core import ledger
from attune.core.state import load
from tests._broker_helpers import FAKE_LIST, FAKE_SPEC, deep_update, wait_for
from tests.e2e.harness import ROOT, clean_env
from tests.e2e.model_server import Block, ScriptedModel, result_text, text, tool_results, tool_use

PLAN = [10, 14, 30]  # --fake-step-ms of the candidates, in the agent's order (the baseline runs 60 ms steps)


def mcp(tool: str) -> str:
    return f"mcp__plugin_attune_broker__{tool}"


class Agent:
    def __init__(self, model: ScriptedModel) -> None:
        self.model = model
        self.out = ""

    def call(self, name: str, tool_input: dict[str, Any]) -> Iterator[list[Block]]:
        block = tool_use(name, tool_input)
        yield [block]
        got = [r for r in tool_results(self.model.current) if r.get("tool_use_id") == block["id"]]
        self.out = result_text(got[0]) if got else ""  # no answer: the session died in between

    def data(self) -> dict[str, Any]:
        try:
            return json.loads(self.out)
        except ValueError:
            return {}


def test_killed_launcher_resumes_the_campaign_from_the_ledger(claude: str, tmp_path: Path) -> None:
    d = tmp_path / "campaign"
    d.mkdir()
    (d / "fake.yaml").write_text(FAKE_LIST)
    spec = deep_update(FAKE_SPEC, {"name": "e2e-tune", "budget": {"concurrency": 1}})
    spec["baseline"]["command"] = ["python", str(ROOT / "tests" / "fake_trainer.py")]
    spec["baseline"]["args"]["--fake-step-ms"] = 60
    (d / "campaign.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    campaign_mod.start(d)
    seen: dict[str, Any] = {"launches": []}

    def script(model: ScriptedModel) -> Iterator[list[Block]]:
        a = Agent(model)
        plan = list(PLAN)
        while True:
            yield from a.call(mcp("campaign_status"), {})
            st = a.data()
            cal = st.get("calibration") or {}
            if not st:
                continue
            if cal.get("band") is None:
                if len(st.get("in_flight") or []) < st.get("concurrency", 1):
                    yield from a.call(mcp("launch_calibration"), {})
                else:
                    yield from a.call("Bash", {"command": "sleep 0.5", "description": "wait"})
                continue
            if st.get("in_flight"):
                yield from a.call("Bash", {"command": "sleep 0.5", "description": "wait for the run"})
                continue
            if not plan:
                break
            v = plan[0]
            yield from a.call(mcp("launch_candidate"), {
                "changes": {"args": {"--fake-step-ms": v}}, "lever": "step-time", "expected_gain": 0.2,
                "hypothesis": "the step is bound by its fixed per-step cost; a shorter step cuts it",
                "code_locations": {}})
            got = a.data()
            seen["launches"].append((v, got.get("admitted"), got.get("code")))
            if got.get("admitted") or got.get("code") == "identical":
                plan.pop(0)  # measured (or already measured): next lever value
        yield from a.call(mcp("record_stop"), {"levers_tested": ["step-time"],
                                               "diagnosis": "the step-time values of the plan are measured"})
        for _ in range(300):
            yield from a.call(mcp("campaign_status"), {})
            if (a.data().get("shipping") or {}).get("done"):  # shipped and re-measured: nothing in flight
                break
            yield from a.call("Bash", {"command": "sleep 0.5", "description": "wait for shipping"})
        yield [text("Done: stop recorded and the recipe shipped.")]

    model = ScriptedModel(script)
    url = model.start()
    home = tmp_path / "home"
    home.mkdir()
    env = clean_env(home, ANTHROPIC_BASE_URL=url, ANTHROPIC_API_KEY="sk-ant-e2e-scripted", ATTUNE_PYTHON=sys.executable,
                    MCP_CONNECTION_NONBLOCKING="false", MCP_TIMEOUT="90000", MCP_CONNECT_TIMEOUT_MS="90000")
    cmd = [sys.executable, "-m", "attune", "tune", str(d / "campaign.yaml"), "--tuner", "claude", "--claude", claude,
           "--claude-args", "--max-turns 500", "--json"]

    def searches() -> list[Any]:
        return [r for r in load(d)[0].runs.values() if r.kind == "search"]

    try:
        first = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 start_new_session=True)
        try:
            # Kill while the second candidate is in flight.
            wait_for(lambda: len(searches()) >= 2 and searches()[-1].status != "finished", timeout_s=300,
                     interval_s=0.05)
        finally:
            os.killpg(first.pid, signal.SIGKILL)
            _, err1 = first.communicate(timeout=60)
        killed_at = load(d)[0]
        assert killed_at.stop is None and killed_at.in_flight, "the kill should land mid-campaign"
        session = json.loads((d / "session.json").read_text())
        assert session["session_id"], session

        second = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    finally:
        model.stop()
        subprocess.run([sys.executable, "-m", "attune", "broker", "stop", str(d)], cwd=ROOT, capture_output=True,
                       timeout=60)
    assert second.returncode == 0, second.stderr[-3000:] + "\n" + str(model.errors)
    assert not model.errors, model.errors
    st, _ = load(d)
    # Nothing lost: every admitted run finished and was scored, the one in flight at the kill included.
    assert all(r.status == "finished" and r.verdict is not None for r in st.runs.values())
    assert {r.run_id for r in killed_at.in_flight} <= {r.run_id for r in st.runs.values() if r.outcome == "ok"}
    # Nothing repeated: each recipe of the plan ran once; the agent's retry after the kill was refused.
    steps = [r.changes["args"]["--fake-step-ms"] for r in st.runs.values() if r.kind == "search"]
    assert sorted(steps) == sorted(PLAN), steps
    assert len(st.calibration_values) == 5 and sum(1 for r in st.runs.values() if r.kind == "calibration") == 5
    refused = [r.data for r in ledger.read(d).rows if r.type == "launch_refused"]
    # The only refusals are of repeats: a recipe already measured, a launch past the concurrency limit,
    # or a calibration asked for after the fifth was admitted (the status can show the band still
    # unset in the moment between the fifth run's end and its calibration row).
    assert all(x["code"] in ("identical", "concurrency", "calibration_full") for x in refused), refused
    # The launcher resumed the recorded session, and the control plane shipped after the stop.
    session = json.loads((d / "session.json").read_text())
    # (the killed launcher never wrote its attempt; the session id it recorded while running is what resumed)
    assert session["attempts"] and session["attempts"][0]["resumed"] is True, session
    assert st.stop is not None and st.shipped is not None
    assert st.runs[st.shipped["run_id"]].changes["args"]["--fake-step-ms"] == 10
    out = json.loads(second.stdout)
    assert out["shipped"] == st.shipped["run_id"] and Path(out["report_html"]).is_file()
