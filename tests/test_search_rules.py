"""Search rules 2, 4, 5 and 6 enforced by the control plane (issue 15), each refusal and its waiver.

The campaigns are the GLM-4.5 simulated example with a ledger written row by row (no jobs run), so
each rule is checked on exactly the history it is about: the real spec, lever catalog, layout
enumerator and step-time estimate decide, through `record_stop` and `Control.admit`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from attune.control import search_rules
from attune.control.campaign import StopRefusedError, record_stop, start
from attune.control.plane import Control
from attune.core.ledger import Ledger
from attune.core.state import load
from tests.test_hooks import run_hook

ROOT = Path(__file__).resolve().parents[1]
GLM = ROOT / "examples" / "campaigns" / "glm45-128xb200" / "campaign.yaml"
TP, PP, EP, CP = ("--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--expert-model-parallel-size",
                  "--context-parallel-size")
DISPATCHER = "--moe-token-dispatcher-type"
SPLIT = {"--decoder-first-pipeline-num-layers": 4, "--decoder-last-pipeline-num-layers": 4}
FULL = {"--recompute-granularity": "full", "--recompute-method": "uniform", "--recompute-num-layers": 1}
RUN_GPU_H = 62.0


class Book:
    """Writes a campaign's history into its ledger as the control plane would."""

    def __init__(self, d: Path) -> None:
        self.d = d
        self.led = Ledger(d)
        self.n = 0

    def run(self, args: dict[str, Any] | None = None, *, kind: str = "search", outcome: str = "ok",
            tps: float | None = 700.0, verdict: str | None = "slower", lever: str | None = None,
            charge: float = RUN_GPU_H, base: str = "baseline") -> str:
        self.n += 1
        rid = f"r{self.n:03d}"
        self.led.append("launch_admitted", {
            "run_id": rid, "kind": kind, "expected_gpu_hours": charge, "changes": {"args": args or {}, "env": {}},
            "lever": lever or (next(iter(args)) if args else None), "base_run_id": base})
        self.led.append("run_finished", {"run_id": rid, "outcome": outcome, "charge_gpu_hours": charge,
                                         "charged_to": "budget"})
        ok = outcome == "ok" and tps is not None
        self.led.append("measurement", {"run_id": rid, "tokens_per_s_per_gpu": tps if ok else None, "valid": ok,
                                        "verdict": kind if kind == "calibration" else (verdict if ok else "failed")})
        if kind == "calibration":
            self.led.append("calibration_run", {"run_id": rid, "tokens_per_s_per_gpu": tps})
        elif verdict == "leader" and ok:
            self.led.append("leader_changed", {"run_id": rid, "tokens_per_s_per_gpu": tps})
        return rid

    def calibrate(self) -> None:
        for tps in (721.5, 728.8, 726.8, 728.1, 724.4):
            self.run(kind="calibration", tps=tps)
        self.led.append("budget_set", {"gpu_hours": 1880.0, "reserve_gpu_hours": 357.0, "reason": "test"})


@pytest.fixture
def glm(tmp_path: Path):  # type: ignore[no-untyped-def]
    def make(search_rules: str = "enforced", calibrate: bool = True) -> tuple[Path, Book]:
        d = tmp_path / f"glm-{search_rules}-{calibrate}"
        d.mkdir()
        shutil.copy(GLM, d / "campaign.yaml")
        start(d, search_rules=search_rules)
        book = Book(d)
        if calibrate:
            book.calibrate()
        return d, book

    return make


def _refusals(d: Path, levers: list[str]) -> list[Any]:
    with pytest.raises(StopRefusedError) as exc:
        record_stop(d, levers, "the leader is bound by host launches")
    return list(exc.value.refusals)


def _codes(d: Path, levers: list[str]) -> dict[str, list[str]]:
    return {r.code: r.items for r in _refusals(d, levers)}


def _probe_layout(book: Book) -> None:
    """Runs that move each of TP, PP, EP, CP (and so DP), each with two values or at its limit."""
    book.run({TP: 4})
    book.run({TP: 8})
    book.run({PP: 16, EP: 8, **SPLIT})
    book.run({PP: 4, EP: 32, "--decoder-first-pipeline-num-layers": None, "--decoder-last-pipeline-num-layers": None})
    book.run({CP: 2})


def _spend(book: Book) -> None:
    """Charge the rest of the search budget (1880 - 357 reserve - what ran)."""
    st, _ = load(book.d)
    left = st.budget.search_remaining or 0.0
    book.run({"--moe-permute-fusion": None}, charge=left - 1.0)  # less than one run's cost is left


def test_no_stop_before_calibration_and_none_naming_levers_that_never_ran(glm) -> None:  # type: ignore[no-untyped-def]
    d, book = glm(calibrate=False)
    assert _codes(d, ["--tensor-model-parallel-size"]) == {"calibration_incomplete": ["0/5 good calibration runs"]}
    book.calibrate()
    codes = _codes(d, ["--tensor-model-parallel-size", "dispatcher"])
    assert codes["levers_not_run"] == ["--tensor-model-parallel-size", "dispatcher"]
    # the refusal is a ledger row, so the state (and the Stop hook) show its codes and items
    st, _ = load(d)
    assert st.stop_refusal is not None and "levers_not_run" in st.stop_refusal["codes"]
    blockers = {b["code"]: b["items"] for b in st.stop_blockers()}
    assert blockers["no_stop"] == [] and blockers["levers_not_run"] == ["--tensor-model-parallel-size", "dispatcher"]


def test_rule4_every_parallel_degree_probed_and_waived_once_the_budget_is_spent(glm) -> None:  # type: ignore[no-untyped-def]
    d, book = glm()
    book.run({DISPATCHER: "flex"}, outcome="crash")  # the last value of its space: at its limit
    codes = _codes(d, [DISPATCHER])
    assert set(codes) == {"rule4_layout_unprobed"}
    assert [i.split(" ")[0] for i in codes["rule4_layout_unprobed"]] == ["TP", "PP", "EP", "CP", "DP"]
    _spend(book)
    assert search_rules.budget_exhausted(load(d)[0])
    row = record_stop(d, [DISPATCHER], "the budget is spent")
    assert row.type == "stop_recorded"


def test_rule4_a_lever_needs_two_values_or_its_feasible_limit(glm) -> None:  # type: ignore[no-untyped-def]
    d, book = glm()
    _probe_layout(book)
    book.run({"--moe-grouped-gemm": None, "--moe-permute-fusion": None}, lever="gemm")
    book.run({"--recompute-granularity": "full", "--recompute-method": "uniform", "--recompute-num-layers": 2},
             lever="recompute-granularity")
    book.run({"--moe-router-topk-scaling-factor": 2.0}, lever="bad-ruler")
    codes = _codes(d, [TP, PP, CP, "gemm", "recompute-granularity", "bad-ruler"])
    # TP has two values, PP and CP sit at a limit of the space, "gemm" removes flags (a toggle),
    # recompute's "full" ends its space; one scaling-factor value is neither two values nor a limit
    assert codes == {"rule4_lever_values": ["bad-ruler (tried --moe-router-topk-scaling-factor=2.0)"]}
    book.run({"--moe-router-topk-scaling-factor": 3.0}, lever="bad-ruler")
    assert record_stop(d, [TP, PP, CP, "gemm", "bad-ruler"], "converged").type == "stop_recorded"


def test_rule5_an_oom_layout_ranked_faster_is_retried_with_memory_savings(glm) -> None:  # type: ignore[no-untyped-def]
    d, book = glm()
    _probe_layout(book)
    tp1 = {TP: 1, PP: 16, EP: 8, **SPLIT}
    oom = book.run(tp1, outcome="oom", lever="tp1")
    book.run({TP: 4, PP: 16, EP: 8, **SPLIT}, outcome="oom")  # the estimate ranks it slower: no retry needed
    codes = _codes(d, [TP, PP, CP])
    assert list(codes) == ["rule5_oom_not_retried"] and len(codes["rule5_oom_not_retried"]) == 1
    assert codes["rule5_oom_not_retried"][0].startswith(f"{oom} TP1/PP16/CP1/EP8")
    assert [r.targets for r in _refusals(d, [TP, PP, CP])] == [[{"run_id": oom}]]  # what a tuner acts on
    book.run({**tp1, **FULL}, tps=1070.0, verdict="leader", lever="tp1")  # the paper's winner
    # a layout that ran out of memory with full recomputation already, and no offload the leader uses:
    # nothing is left to add back
    book.run({TP: 1, PP: 2, EP: 8, "--decoder-first-pipeline-num-layers": None,
              "--decoder-last-pipeline-num-layers": None, **FULL}, outcome="oom")
    assert record_stop(d, [TP, PP, CP], "converged").type == "stop_recorded"


def test_rule6_flags_that_won_on_an_earlier_layout_are_retested_on_the_final_one(glm) -> None:  # type: ignore[no-untyped-def]
    d, book = glm()
    _probe_layout(book)
    flex = book.run({DISPATCHER: "flex"}, tps=760.0, verdict="leader")
    book.run({PP: 16, EP: 8, **SPLIT, TP: 1, **FULL}, tps=1000.0, verdict="leader", base="baseline")
    codes = _codes(d, [TP, PP, CP])
    assert codes == {"rule6_winners_not_retested": [
        f"{DISPATCHER}=flex (won in {flex} on TP2/PP8/CP1/EP16/ETP1/VP1/MBS1)"]}
    assert [r.targets for r in _refusals(d, [TP, PP, CP])] == [[{"name": DISPATCHER, "value": "flex"}]]
    book.run({PP: 16, EP: 8, **SPLIT, TP: 1, **FULL, DISPATCHER: "flex"}, tps=990.0, verdict="within_band")
    assert record_stop(d, [TP, PP, CP, DISPATCHER], "converged").type == "stop_recorded"


def test_black_box_campaigns_are_not_bound_by_the_skill_rules(glm) -> None:  # type: ignore[no-untyped-def]
    d, book = glm(search_rules="off")
    book.run({TP: 4, DISPATCHER: "flex"})
    assert record_stop(d, [TP], "random search ran to its end").type == "stop_recorded"


def test_rule2_one_lever_or_one_coupled_set_relative_to_the_leader(glm) -> None:  # type: ignore[no-untyped-def]
    d, book = glm()
    c = Control(d)

    def ask(args: dict[str, Any]) -> Any:
        return c.admit({"kind": "search", "changes": {"args": args}, "hypothesis": "h", "lever": "l",
                        "expected_gain": 0.1, "code_locations": {k: "x.py:1" for k in args}})

    two = ask({TP: 4, DISPATCHER: "flex"})
    assert not two.admitted and two.code == "rule2_one_lever"
    assert sorted(two.items) == sorted([f"{TP} (data-parallel, tensor-parallel)", f"{DISPATCHER} (moe-dispatcher)"])
    # a deeper pipeline with a narrower EP and its split is one coupled set; so is TP with recomputation (rule 5)
    pp16 = ask({PP: 16, EP: 8, **SPLIT})
    assert pp16.admitted
    assert ask({TP: 1, PP: 16, EP: 8, **SPLIT, **FULL}).code in ("concurrency", None)
    # a profiled re-run of an earlier recipe is no new candidate: rule 2 does not apply to it, even when
    # the leader has moved on since (here to no permute fusion: two sets away from the PP16 recipe)
    book.n = 100
    book.run({"--moe-permute-fusion": None}, tps=800.0, verdict="leader")
    prof = c.admit({"kind": "search", "changes": {}, "base": pp16.run_id, "profile": True, "hypothesis": "h",
                    "lever": "profile", "expected_gain": 0.0})
    assert prof.admitted, (prof.code, prof.reason)
    again = ask({PP: 16, EP: 8, **SPLIT, CP: 2})  # a candidate two sets from the new leader
    assert again.code in ("rule2_one_lever", "concurrency")
    refused = [json.loads(x) for x in (d / "ledger.jsonl").read_text().splitlines() if '"launch_refused"' in x]
    assert refused[0]["data"]["code"] == "rule2_one_lever" and refused[0]["data"]["items"]
    off, _ = glm(search_rules="off")
    assert Control(off).admit({"kind": "search", "changes": {"args": {TP: 4, DISPATCHER: "flex"}},
                               "hypothesis": "h", "lever": "l", "expected_gain": 0.1,
                               "code_locations": {}}).admitted


def test_a_profiled_run_traces_three_steps_after_the_window_on_one_rank_per_stage(glm) -> None:  # type: ignore[no-untyped-def]
    d, _ = glm()
    out = Control(d).admit({"kind": "search", "changes": {"args": {PP: 16, EP: 8, **SPLIT}}, "hypothesis": "h",
                            "lever": "pp", "expected_gain": 0.1, "code_locations": {}, "profile": True})
    assert out.admitted, out.reason
    job = json.loads((d / "runs" / str(out.run_id) / "job.json").read_text())
    a = job["args"]
    # the scored window is steps 4-13 of 14: the trace covers 14, 15 and 16, after it
    assert (a["--profile-step-start"], a["--profile-step-end"], a["--train-iters"]) == (14, 17, 17)
    assert a["--profile-ranks"] == " ".join(str(8 * s) for s in range(16))  # 128 GPUs / PP 16
    argv = job["argv"]
    i = argv.index("--profile-ranks")
    assert argv[i + 1:i + 17] == [str(8 * s) for s in range(16)]


def test_the_stop_hook_shows_the_refusal_codes_and_items(glm) -> None:  # type: ignore[no-untyped-def]
    d, book = glm()
    (d / "notes").mkdir()
    _probe_layout(book)
    book.run({TP: 1, PP: 16, EP: 8, **SPLIT}, outcome="oom", lever="tp1")
    _codes(d, [TP])
    out, _ = run_hook("stop", {"stop_hook_active": False}, d)
    assert out is not None and out["decision"] == "block"
    assert "[no_stop]" in out["reason"] and "[rule5_oom_not_retried]" in out["reason"]
    assert "TP1/PP16/CP1/EP8" in out["reason"] and "retry each listed out-of-memory layout" in out["reason"]
    log = [json.loads(x) for x in (d / "hooks.log.jsonl").read_text().splitlines()]
    assert log[-1]["codes"] == ["no_stop", "rule5_oom_not_retried", "not_shipped"]


def test_summary_is_written_to_notes_and_offered_to_the_next_campaign_on_the_model(glm, tmp_path: Path,
                                                                                   monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from attune.app.summary import write_summary
    from attune.control.campaign import record_diagnosis

    d, book = glm()
    oom = book.run({TP: 1, PP: 16, EP: 8, **SPLIT}, outcome="oom", lever="tp1")
    win = book.run({TP: 1, PP: 16, EP: 8, **SPLIT, **FULL}, tps=1070.0, verdict="leader", lever="tp1")
    record_diagnosis(d, win, "host launches between one-row microbatches absorb the recompute", "host launches")
    history = tmp_path / "history"
    monkeypatch.setenv("ATTUNE_HISTORY_DIR", str(history))
    path = write_summary(d)
    text = path.read_text()
    assert path == d / "notes" / "summary.md" and text.splitlines()[2] == "model: glm-4.5"
    assert f"- {win}: " in text and f"- {oom}: " in text and "-> oom" in text and "host launches:" in text
    assert "--context-parallel-size" in text.split("## Levers left untried")[1]  # never changed
    assert (history / "glm45-128xb200-sim.md").read_text() == text
    (d / "notes" / "summary.md").write_text("model: glm-4.5\n\nthe agent's own summary\n")
    write_summary(d)  # an agent-written summary is kept
    assert (d / "notes" / "summary.md").read_text().endswith("the agent's own summary\n")

    nxt, _ = glm(search_rules="off", calibrate=False)  # a sibling campaign on the same model
    (nxt / "notes").mkdir()
    monkeypatch.delenv("ATTUNE_HISTORY_DIR")
    out, _ = run_hook("session_start", {"source": "startup"}, nxt)
    context = out["hookSpecificOutput"]["additionalContext"] if out else ""
    assert "earlier campaign(s) on the same model or stack" in context and "the agent's own summary" in context
    out, _ = run_hook("session_start", {"source": "startup"}, nxt, ATTUNE_HISTORY_DIR=str(history))
    context = out["hookSpecificOutput"]["additionalContext"] if out else ""
    assert "Summaries of 2 earlier campaign(s)" in context and str(history / "glm45-128xb200-sim.md") in context


def test_rule5_a_retry_that_is_the_calibrated_baseline_counts_as_retried(tmp_path: Path) -> None:
    """A baseline with full recomputation; a search run that drops to selective recomputation on the same
    layout runs out of memory. Its retry with the savings added back is the baseline itself, measured by
    calibration: rule 5 is answered. An out-of-memory layout the baseline does not cover stays open."""
    import yaml

    doc = yaml.safe_load(GLM.read_text())
    doc["baseline"]["args"].update(FULL)
    d = tmp_path / "glm-full"
    d.mkdir()
    (d / "campaign.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    start(d, search_rules="enforced")
    book = Book(d)
    book.calibrate()
    _probe_layout(book)
    book.run({"--recompute-granularity": "selective", "--recompute-method": None, "--recompute-num-layers": None},
             outcome="oom", lever="--recompute-granularity")
    other = book.run({TP: 1, PP: 16, EP: 8, **SPLIT, "--recompute-granularity": "selective",
                      "--recompute-method": None, "--recompute-num-layers": None}, outcome="oom", lever="tp1")
    codes = _codes(d, [TP, PP, CP])
    assert list(codes) == ["rule5_oom_not_retried"] and len(codes["rule5_oom_not_retried"]) == 1
    assert codes["rule5_oom_not_retried"][0].startswith(f"{other} TP1/PP16")
    book.run({TP: 1, PP: 16, EP: 8, **SPLIT}, tps=650.0, lever="tp1")  # its retry, measured: slower
    assert record_stop(d, [TP, PP, CP], "converged").type == "stop_recorded"


def test_a_refusals_targets_cross_the_broker_wire() -> None:
    """The 409 answer to a refused stop carries each rule's targets (what `HeuristicTuner.repair` acts on) and the
    broker's tuner plane reads them back as the control plane's own type."""
    from broker import wire
    from broker.tuner_plane import _rule_refusals

    sent = [search_rules.RuleRefusal("rule5_oom_not_retried", "search rule 5", ["r9 TP1/PP16 (...)"], [{"run_id": "r9"}]),
            search_rules.RuleRefusal("rule6_winners_not_retested", "search rule 6", ["--x=1 (...)"],
                                     [{"name": "--x", "value": "1"}])]
    answer = wire.StopRefused(reason="refused", refusals=[wire.StopBlocker(**r.as_dict()) for r in sent])
    assert _rule_refusals(json.loads(answer.model_dump_json())) == sent
