"""The simulator on the production control plane, in process (broker/inprocess.py): the broker's own
handlers and monitor step, `attune tune`'s runner, the tuner-side knob spaces and memory pre-filter,
and the one tuner registry. The same campaign through the HTTP broker and in process writes the same
ledger rows. Simulated clusters: a test bed, not a claim about GPUs (docs/sim.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from attune.app.campaign_runner import CampaignRunner
from attune.control.campaign import start
from attune.control.spec import load_spec
from attune.core.state import load
from attune.tuners.base import Candidate, Outcome
from attune.tuners.factory import TunerSetupError, make_tuner
from attune.tuners.knobs import Infeasible, KnobPlane, knob_space
from attune.tuners.prefilter import memory_prefilter
from attune.tuners.registry import BLACK_BOX, BUILT_IN, TUNE_CHOICES
from broker.inprocess import InProcessBroker

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "campaigns"
GLM = EXAMPLES / "glm45-128xb200" / "campaign.yaml"
MINIMAX = EXAMPLES / "minimax-m2-64xb200" / "campaign.yaml"
TP, PP, EP = "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--expert-model-parallel-size"


def _campaign(d: Path, example: Path, **over: Any) -> Path:
    spec = yaml.safe_load(example.read_text())
    for section, values in over.items():
        if isinstance(values, dict) and isinstance(spec.get(section), dict):
            spec[section].update(values)
        else:
            spec[section] = values
    d.mkdir(parents=True)
    (d / "campaign.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return d


def _rows(d: Path) -> list[tuple[str, dict[str, Any]]]:
    """The ledger's rows without what only wall-clock time and the key decide (ts, hash, mac, prev)."""
    return [(r["type"], r["data"]) for r in map(json.loads, (d / "ledger.jsonl").read_text().splitlines())]


def test_the_same_campaign_writes_the_same_ledger_rows_over_http_and_in_process(tmp_path: Path) -> None:
    # MiniMax-M2, one run at a time, the heuristic over the four parallel degrees (rule 4 is met, so the
    # tuner stops before the budget runs out and the stop precedes shipping on both paths).
    over = {"budget": {"gpu_hours": 530, "concurrency": 1},
            "search_space": {TP: [1, 2], PP: [2, 4], EP: [8, 16], "--context-parallel-size": [1, 2]}}
    http = _campaign(tmp_path / "http", MINIMAX, **over)
    inproc = _campaign(tmp_path / "inproc", MINIMAX, **over)
    try:
        res = subprocess.run([sys.executable, "-m", "attune", "tune", str(http / "campaign.yaml"), "--tuner",
                              "heuristic", "--transport", "http", "--quiet", "--json"], cwd=ROOT, capture_output=True,
                             text=True, timeout=600)
    finally:
        subprocess.run([sys.executable, "-m", "attune", "broker", "stop", str(http)], cwd=ROOT, capture_output=True,
                       timeout=60)
    assert res.returncode == 0, res.stderr[-3000:]
    out = CampaignRunner(inproc, "heuristic", say=None, transport="in-process").run()
    assert out.failed is None and out.shipped == json.loads(res.stdout)["shipped"]
    a, b = _rows(http), _rows(inproc)
    assert [t for t, _ in a] == [t for t, _ in b]
    for (t, da), (_, db) in zip(a, b, strict=True):
        assert da == db, t  # run ids, kinds, changes, outcomes, charges (simulated clock), verdicts
    st, _ = load(inproc)
    searches = [r for r in st.runs.values() if r.kind == "search"]
    assert len(searches) >= 4 and st.shipped is not None and st.stop is not None
    assert any(r.kind == "check" for r in st.runs.values()) and st.budget.charged > 100
    # the in-process client audits its requests like the HTTP app
    audit = [json.loads(x) for x in (inproc / "audit.jsonl").read_text().splitlines()]
    assert {"launch", "campaign_status", "run_status", "record_stop"} <= {e["route"] for e in audit}
    assert all(e["client"] == "in-process" for e in audit)


def test_the_heuristic_reaches_the_paper_glm_winner_in_process(tmp_path: Path) -> None:
    # The benchmark's campaign for seed 1 (benchmarks/bench_sim_tuners.py): sim seed 1017, node faults.
    d = _campaign(tmp_path / "glm", GLM, budget={"concurrency": 1},
                  cluster={**yaml.safe_load(GLM.read_text())["cluster"]})
    spec = yaml.safe_load((d / "campaign.yaml").read_text())
    spec["cluster"]["settings"].update({"seed": 1017, "infra_fault_rate": 0.002})
    (d / "campaign.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    out = CampaignRunner(d, "heuristic", seed=1, say=None).run()  # auto: in process (sim, concurrency 1)
    assert out.failed is None and out.shipped
    st, _ = load(d)
    args = st.runs[out.shipped].changes["args"]
    assert (args[TP], args[PP], args[EP], args["--recompute-granularity"]) == (1, 16, 8, "full")
    assert out.headline["remeasured"] and out.headline["gain"] > 0.25
    assert not (d / ".broker" / "endpoint.json").exists()  # no HTTP broker was started


def test_the_in_process_client_answers_like_the_http_app(tmp_path: Path) -> None:
    d = _campaign(tmp_path / "m", MINIMAX)
    start(d)
    with InProcessBroker(d) as b:
        c = b.client()
        assert c.call("GET", "/v1/health")[0] == 200
        status, p = c.call("GET", "/v1/campaign")
        assert status == 200 and p["backend"] == "sim" and p["calibration"]["mean"] is None
        status, p = c.launch(kind="search", changes={"args": {TP: 1}})
        assert status == 409 and p["admitted"] is False  # admission: not calibrated yet
        status, p = c.launch(kind="nonsense")
        assert status == 422 and p["error"] == "bad_request" and "kind" in p["reason"]
        assert c.run("r999-nothing")[0] == 404
        assert c.call("DELETE", "/v1/runs")[0] == 404
        status, p = c.launch(kind="calibration")
        assert status == 201 and p["submitted"]
        run = c.wait(p["run_id"], timeout_s=120)  # drives the monitor: the simulated clock moves
        assert run["outcome"] == "ok" and run["charge_gpu_hours"] > 10
        with pytest.raises(Exception, match="already served"):
            InProcessBroker(d)  # the serve lock: one broker per campaign


def test_knob_space_translates_composite_knobs_and_refuses_infeasible_draws() -> None:
    spec = load_spec(GLM)
    space = knob_space(spec)
    base = space.baseline()
    assert space.to_args(base) == dict(spec.baseline.args)
    tp1 = space.to_args({**base, TP: 1, EP: 8})
    assert "--sequence-parallel" not in tp1
    assert "--overlap-grad-reduce" not in tp1  # expert data parallelism 2 on GLM-4.5: the overlaps hang
    full = space.to_args({**base, "--recompute-granularity": "full"})
    assert (full["--recompute-granularity"], full["--recompute-method"], full["--recompute-num-layers"]) == (
        "full", "uniform", 1)
    dep = space.to_args({**base, EP: 8, "dispatcher": "deepep"})
    assert dep["--moe-token-dispatcher-type"] == "flex" and "--moe-shared-expert-overlap" not in dep
    with pytest.raises(Infeasible, match="within a node"):
        space.to_args({**base, "dispatcher": "deepep"})  # EP 16 spans two nodes
    with pytest.raises(Infeasible):
        space.to_args({**base, EP: 1, "--expert-tensor-parallel-size": 4})
    with pytest.raises(Infeasible):
        space.to_args({**base, "--context-parallel-size": 4, PP: 16, TP: 8})  # more GPUs than the cluster
    light = space.to_args({**base, TP: 1, PP: 16, EP: 8, "split": "light_both"})
    assert light["--decoder-first-pipeline-num-layers"] < 6 and light["--decoder-last-pipeline-num-layers"] < 6

    class Inner:
        concurrency = 1
        seen: list[Candidate] = []

        def evaluate(self, c: Candidate, prune_below: float | None) -> Outcome:
            self.seen.append(c)
            return Outcome(run_id="r1", outcome="ok", tokens_per_s_per_gpu=1.0, valid=True)

    inner = Inner()
    plane = KnobPlane(inner, space)
    out = plane.evaluate(Candidate({"dispatcher": "deepep"}, "dispatcher", "h"), None)
    assert out.outcome == "refused" and out.score == 0.0 and not inner.seen and plane.infeasible == 1
    plane.evaluate(Candidate({TP: 1, EP: 8}, TP, "h"), None)
    (sent,) = inner.seen  # flag changes relative to the baseline, a dropped flag as None
    assert sent.changes[TP] == 1 and sent.changes[EP] == 8 and sent.changes["--sequence-parallel"] is None


def test_the_memory_prefilter_is_a_direct_estimate() -> None:
    spec = load_spec(GLM)
    skip, why = memory_prefilter(spec)
    assert skip is not None and "memory estimate" in why
    split = {"--decoder-first-pipeline-num-layers": 4, "--decoder-last-pipeline-num-layers": 4}
    assert skip({}) is None  # the baseline is exempt
    assert "does not fit" in (skip({TP: 1, PP: 16, EP: 8, **split}) or "")
    assert skip({TP: 1, PP: 16, EP: 8, **split, "--recompute-granularity": "full"}) is None
    assert "infeasible" in (skip({TP: 3}) or "")
    check = knob_space(spec).prefilter()  # over knobs, with the model's margin
    base = knob_space(spec).baseline()
    assert check(base) is None and "exceeds" in (check({**base, TP: 1, PP: 16, EP: 8}) or "")


def test_one_tuner_registry_everywhere(tmp_path: Path) -> None:
    from attune.app.campaign_runner import EARLY_ABORT_TUNERS, TUNERS

    assert BUILT_IN == ("heuristic", "tpe", "tpe-prefilter", "random") and TUNERS == TUNE_CHOICES
    assert set(BLACK_BOX) == set(EARLY_ABORT_TUNERS) == {"tpe", "tpe-prefilter", "random"}
    spec = load_spec(MINIMAX)
    knobs = knob_space(spec)
    for name in BUILT_IN:
        assert make_tuner(spec, name).name == name
        assert make_tuner(spec, name, knobs=knobs).name == name
    with pytest.raises(TunerSetupError, match="claude, heuristic, tpe, tpe-prefilter, random"):
        make_tuner(spec, "bayes")
    res = subprocess.run([sys.executable, "-m", "attune", "tune", str(tmp_path), "--tuner", "bayes"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "tpe-prefilter" in res.stderr


def test_in_process_on_a_real_backend_steps_the_monitor_at_its_interval(tmp_path: Path) -> None:
    # The local backend runs real processes (tests/fake_trainer.py): the in-process runner's monitor steps
    # wait the poll interval as the monitor thread would, and the campaign goes start to end.
    from tests._broker_helpers import make_campaign

    d = make_campaign(tmp_path, budget={"concurrency": 1, "gpu_hours": 1.0},
                      search_space={"--fake-step-ms": [10, 20, 40]}, search_rules="off")
    out = CampaignRunner(d, "random", say=None, transport="in-process").run()
    st, _ = load(d)
    assert out.failed is None and out.shipped and st.runs[out.shipped].kind == "search"
    assert out.headline["remeasured"] and out.headline["gain"] > 0.5  # 10 ms steps against the baseline's 20
    assert not (d / ".broker" / "endpoint.json").exists()
