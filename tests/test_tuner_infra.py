"""Infrastructure outcomes never count against a lever (issue 26): the heuristic tuner asks a faulted
candidate again instead of ruling its lever out, and names in its stop only levers that were measured."""

from __future__ import annotations

from typing import Any

from attune.core.vocab import RunOutcome
from attune.tuners.base import Outcome
from attune.tuners.heuristic import HeuristicTuner

SPACE: dict[str, list[Any]] = {"--micro-batch-size": [1, 2, 4], "OMP_NUM_THREADS": ["1", "2"]}
BASELINE = {"--micro-batch-size": 1, "OMP_NUM_THREADS": "1"}


def test_two_infrastructure_faults_on_one_lever_do_not_rule_it_out() -> None:
    t = HeuristicTuner(SPACE, BASELINE, priority=["--micro-batch-size", "OMP_NUM_THREADS"])
    seen: list[tuple[str, Any]] = []
    faulted: set[Any] = set()
    while (cand := t.ask()) is not None:
        lever = cand.lever
        value = cand.changes.get(lever)
        seen.append((lever, value))
        if lever == "--micro-batch-size" and value not in faulted:  # each value's first run faults
            faulted.add(value)
            t.tell(cand, Outcome(run_id=f"r{len(seen)}", outcome=RunOutcome.INFRASTRUCTURE, reason="STOPPED"))
            continue
        tps = 1000.0 * (1.5 if value == 2 else 1.0)
        t.tell(cand, Outcome(run_id=f"r{len(seen)}", outcome=RunOutcome.OK, tokens_per_s_per_gpu=tps, valid=True,
                             promoted=value == 2 and lever == "--micro-batch-size"))
    # Each faulted candidate was asked again and measured; the lever won, and kept going its way.
    assert seen[:4] == [("--micro-batch-size", 2)] * 2 + [("--micro-batch-size", 4)] * 2
    assert len(faulted) == 2
    s = t.summary()
    assert "--micro-batch-size" in s["levers_won"]
    assert "--micro-batch-size" not in s["ruled_out"] or s["ruled_out"]["--micro-batch-size"] != \
        "two values did not beat the leader"
    assert t.leader == {"--micro-batch-size": 2}


def test_a_lever_faulted_every_time_is_not_named_as_tested() -> None:
    t = HeuristicTuner({"--micro-batch-size": [1, 2]}, {"--micro-batch-size": 1})
    asked = 0
    while (cand := t.ask()) is not None:
        asked += 1
        t.tell(cand, Outcome(run_id=None, outcome=RunOutcome.INFRASTRUCTURE, reason="submission failed"))
    assert asked == 2  # the candidate, and its one retry
    s = t.summary()
    assert s["levers_tested"] == []  # a stop naming it would be refused (levers_not_run)
    assert t.failures.get("--micro-batch-size", 0) == 0


def test_a_resumed_tuner_replays_faults_then_the_retry_and_launches_neither() -> None:
    """ReplayPlane on a rerun: a recipe's infrastructure failure and its measured retry come back from the
    ledger in order; nothing is launched again."""
    from attune.app.campaign_runner import ReplayPlane
    from attune.control.spec import load_spec
    from attune.core.state import CampaignState, RunState
    from tests.conftest import EXAMPLE_CAMPAIGN

    spec = load_spec(EXAMPLE_CAMPAIGN)

    class Inner:
        concurrency = 1
        launched: list[Any] = []

        def evaluate(self, cand: Any, prune: Any) -> Outcome:
            self.launched.append(cand)
            return Outcome(run_id="new", outcome=RunOutcome.OK, tokens_per_s_per_gpu=1.0, valid=True)

    probe = ReplayPlane(Inner(), spec, CampaignState())
    t = HeuristicTuner({"--micro-batch-size": [1, 2]}, {"--micro-batch-size": 1})
    cand = t.ask()
    assert cand is not None
    key = probe._key(cand)
    st = CampaignState()
    st.runs["r006"] = RunState("r006", "search", status="finished", outcome="infrastructure", recipe_key=key,
                               admitted_seq=6, reason="STOPPED from outside the broker")
    st.runs["r007"] = RunState("r007", "search", status="finished", outcome="ok", recipe_key=key, admitted_seq=7,
                               tokens_per_s_per_gpu=2.0, valid=True, verdict="leader", retry_of="r006")
    inner = Inner()
    plane = ReplayPlane(inner, spec, st)
    first = plane.evaluate(cand, None)
    t.tell(cand, first)
    retry = t.ask()
    assert first.outcome == RunOutcome.INFRASTRUCTURE and first.run_id == "r006"
    assert retry is not None and retry.changes == cand.changes
    second = plane.evaluate(retry, None)
    assert second.run_id == "r007" and second.promoted and not inner.launched
