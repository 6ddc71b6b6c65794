"""Tuner logic against a synthetic control plane.

The synthetic control plane stands in for the cluster ONLY to test the tuners' search logic fast
and deterministically (the real control plane, with real tinygpt runs, is exercised by the broker
and campaign tests). It applies the real promotion rule (`attune.core.measure.beats`), refuses identical
recipes, and charges one unit per launch.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from attune.core.measure import beats
from attune.tuners.base import Candidate, Outcome, recipe_key, split_changes
from attune.tuners.driver import drive
from attune.tuners.heuristic import HeuristicTuner
from attune.tuners.random_search import RandomTuner
from attune.tuners.tpe import TPETuner

SPACE: dict[str, list[Any]] = {
    "--micro-batch-size": [1, 2, 4, 8, 16],
    "OMP_NUM_THREADS": ["1", "2"],
    "--optimizer-impl": ["for-loop", "foreach", "fused"],
    "--recompute-granularity": [None, "full"],
}
BASELINE = {"--micro-batch-size": 1, "OMP_NUM_THREADS": "1", "--optimizer-impl": "for-loop",
            "--recompute-granularity": None}


def objective(full: dict[str, Any]) -> tuple[str, float | None]:
    mbs = full["--micro-batch-size"]
    rec = full["--recompute-granularity"] == "full"
    if mbs == 16 and not rec:
        return "oom", None
    tps = 1000.0 * {1: 1.0, 2: 1.3, 4: 1.5, 8: 1.6, 16: 2.2}[mbs]
    tps *= 1.25 if full["OMP_NUM_THREADS"] == "2" else 1.0
    tps *= {"for-loop": 1.0, "foreach": 1.1, "fused": 1.12}[full["--optimizer-impl"]]
    tps *= 0.8 if rec else 1.0
    return "ok", tps


class SyntheticControlPlane:
    def __init__(self, budget_launches: int = 100, concurrency: int = 1, delay: float = 0.0) -> None:
        self.concurrency = concurrency
        self.budget = budget_launches
        self.used = 0
        self.lock = threading.Lock()
        self.leader = 1000.0
        self.band = 0.03
        self.seen: set[str] = {recipe_key({})}
        self.launched: list[dict[str, Any]] = []
        self.inflight = 0
        self.max_inflight = 0
        self.delay = delay
        self.stop: dict[str, Any] | None = None
        self.objective = objective
        self.baseline: dict[str, Any] = dict(BASELINE)

    def can_launch(self) -> bool:
        with self.lock:
            return self.used + self.inflight < self.budget

    def baseline_tps(self) -> float:
        return 1000.0

    def leader_tps(self) -> float:
        return self.leader

    def evaluate(self, cand: Candidate, prune_below: float | None) -> Outcome:
        with self.lock:
            if recipe_key(cand.changes) in self.seen:
                return Outcome(None, "refused", reason="identical recipe")
            if self.used + self.inflight >= self.budget:
                return Outcome(None, "refused", reason="budget: admission refused", code="budget")
            self.seen.add(recipe_key(cand.changes))
            self.inflight += 1
            self.max_inflight = max(self.max_inflight, self.inflight)
            self.launched.append(dict(cand.changes))
        time.sleep(self.delay)
        outcome, tps = self.objective({**self.baseline, **cand.changes})
        with self.lock:
            self.inflight -= 1
            self.used += 1
            if outcome != "ok":
                return Outcome(f"r{len(self.launched)}", outcome)
            if prune_below is not None and tps < prune_below:
                return Outcome(f"r{len(self.launched)}", "pruned", tps, valid=False)
            promoted = beats(tps, self.leader, self.band)
            if promoted:
                self.leader = tps
            return Outcome(f"r{len(self.launched)}", "ok", tps, valid=True, promoted=promoted)

    def record_stop(self, evidence: dict[str, Any]) -> None:
        self.stop = evidence


def best_possible() -> float:
    import itertools

    best = 0.0
    for combo in itertools.product(*SPACE.values()):
        outcome, tps = objective(dict(zip(SPACE, combo, strict=True)))
        if outcome == "ok" and tps:
            best = max(best, tps)
    return best


def test_split_changes() -> None:
    assert split_changes({"--a": 1, "OMP_NUM_THREADS": 2}) == {"args": {"--a": 1}, "env": {"OMP_NUM_THREADS": "2"}}


def test_heuristic_is_deterministic_and_finds_the_optimum_with_few_launches() -> None:
    runs = []
    for _ in range(2):
        cp = SyntheticControlPlane()
        res = drive(HeuristicTuner(SPACE, BASELINE), cp)
        runs.append((cp.launched, cp.leader, res))
    (l1, lead1, res1), (l2, lead2, _) = runs
    assert l1 == l2 and lead1 == lead2  # deterministic
    # mbs 16 only fits with recompute (rule 5); fused vs foreach (1.8%) lies inside the 3% band.
    assert best_possible() / 1.03 <= lead1 <= best_possible()
    assert lead1 > objective({**BASELINE, "--micro-batch-size": 8, "OMP_NUM_THREADS": "2",
                              "--optimizer-impl": "fused"})[1]
    assert res1.launches < 24  # the full space has 60 recipes
    assert res1.stop_reason.startswith("the tuner found nothing")
    assert len({recipe_key(c) for c in l1}) == len(l1)  # never the same recipe twice


def test_heuristic_retries_an_oom_with_the_memory_saver() -> None:
    cp = SyntheticControlPlane()
    drive(HeuristicTuner(SPACE, BASELINE), cp)
    oom_at = next(i for i, c in enumerate(cp.launched) if c.get("--micro-batch-size") == 16)
    retry = cp.launched[oom_at + 1]
    assert retry.get("--micro-batch-size") == 16 and retry.get("--recompute-granularity") == "full"
    assert cp.stop is not None and "--micro-batch-size" in cp.stop["levers_won"]


def test_heuristic_changes_one_lever_from_the_leader_at_a_time() -> None:
    cp = SyntheticControlPlane()
    tuner = HeuristicTuner(SPACE, BASELINE)
    leader: dict[str, Any] = {}
    res = drive(tuner, cp)
    for cand, out in res.outcomes:
        moved = {k for k in set(cand.changes) | set(leader) if cand.changes.get(k) != leader.get(k)}
        moved -= {"--recompute-method", "--recompute-num-layers"}  # full recomputation's own details (rule 5)
        assert len(moved) == 1 or (len(moved) == 2 and "--recompute-granularity" in moved), (cand.changes, leader)
        if out.promoted:
            leader = dict(cand.changes)


def test_random_respects_budget_and_never_repeats() -> None:
    cp = SyntheticControlPlane(budget_launches=15)
    res = drive(RandomTuner(SPACE, BASELINE, seed=3), cp)
    assert res.launches == 15 and res.stop_reason == "the budget is spent"
    assert len({recipe_key(c) for c in cp.launched}) == 15 and {} not in cp.launched


def test_tpe_starts_from_the_baseline_without_launching_it() -> None:
    tuner = TPETuner(SPACE, BASELINE, seed=1)
    first = tuner.ask()
    assert first is not None and first.changes == {} and first.lever == "baseline"
    cp = SyntheticControlPlane(budget_launches=20)
    tuner = TPETuner(SPACE, BASELINE, seed=1)
    res = drive(tuner, cp)
    assert {} not in cp.launched and res.launches == 20
    assert len({recipe_key(c) for c in cp.launched}) == 20
    values = [t.value for t in tuner.study.trials if t.value is not None]
    assert values[0] == pytest.approx(1000.0)  # the baseline trial carries the calibration mean
    assert 0.0 in values  # the OOM scored zero
    assert cp.leader > 1500.0


def test_tpe_prefilter_skips_what_the_estimate_rules_out() -> None:
    def too_big(full: dict[str, Any]) -> str | None:
        if full["--micro-batch-size"] == 16 and full["--recompute-granularity"] is None:
            return "estimated peak memory exceeds the device"
        return None

    cp = SyntheticControlPlane(budget_launches=30)
    tuner = TPETuner(SPACE, BASELINE, seed=2, prefilter=too_big)
    drive(tuner, cp)
    assert tuner.name == "tpe-prefilter"
    assert not [c for c in cp.launched if c.get("--micro-batch-size") == 16 and "--recompute-granularity" not in c]


def test_early_abort_prunes_slow_runs() -> None:
    cp = SyntheticControlPlane(budget_launches=25)
    res = drive(TPETuner(SPACE, BASELINE, seed=5), cp, early_abort=True)
    assert res.pruned > 0
    assert all(out.tokens_per_s_per_gpu is None or out.outcome != "pruned" or out.tokens_per_s_per_gpu < cp.leader
               for _, out in res.outcomes)


def test_driver_keeps_concurrency_limit() -> None:
    cp = SyntheticControlPlane(budget_launches=12, concurrency=3, delay=0.05)
    drive(RandomTuner(SPACE, BASELINE, seed=0), cp)
    assert cp.max_inflight == 3 and cp.used == 12


def test_empty_space_is_refused() -> None:
    with pytest.raises(ValueError, match="search space is empty"):
        RandomTuner({}, {})
    with pytest.raises(ValueError, match="search_space.--x"):
        HeuristicTuner({"--x": []}, {})


def test_heuristic_late_outcome_of_another_lever_does_not_rule_out_the_lever_being_probed() -> None:
    """With runs overlapping, an earlier lever's outcomes can arrive while the next lever is probed. They
    count against their own lever: the lever being probed keeps its second value (the CI failure of the
    Mixtral example, where CP lost its only real value and the stop was refused by rule 4)."""
    from attune.tuners.heuristic import HeuristicTuner

    t = HeuristicTuner({"--a": [1, 2, 3], "--context-parallel-size": [1, 2]}, {"--a": 2})
    a1, a2 = t.ask(), t.ask()
    assert a1 is not None and a2 is not None and a1.lever == a2.lever == "--a"
    cp = t.ask()
    # an unset parallel degree is 1, so the first CP candidate is the only new one: CP=2
    assert cp is not None and cp.changes == {"--context-parallel-size": 2}
    t.tell(a1, Outcome(run_id="r1", outcome="ok", tokens_per_s_per_gpu=1.0, valid=True))
    t.tell(a2, Outcome(run_id="r2", outcome="crash"))
    assert t.ruled_out.get("--a") == "two values did not beat the leader"
    assert "--context-parallel-size" not in t.ruled_out


def test_heuristic_probes_every_parallel_degree_before_it_stops() -> None:
    """Rule 4 at the stop: a degree whose move from the leader has no feasible layout (the coupler says
    so) is probed from the baseline instead, once, before the tuner gives up."""
    from attune.tuners.heuristic import HeuristicTuner

    def couple(full: dict, lever: str, value: object) -> dict | None:
        # CP 2 fits only with TP 1 (the baseline's TP); the leader moved to TP 2
        if full.get("--context-parallel-size") == 2 and full.get("--tensor-model-parallel-size") != 1:
            return None
        return full

    t = HeuristicTuner({"--tensor-model-parallel-size": [1, 2], "--context-parallel-size": [1, 2]},
                       {"--tensor-model-parallel-size": 1}, couple=couple)
    tp = t.ask()
    assert tp is not None and tp.changes == {"--tensor-model-parallel-size": 2}
    t.tell(tp, Outcome(run_id="r1", outcome="ok", tokens_per_s_per_gpu=2.0, valid=True, promoted=True))
    asked = []
    while (c := t.ask()) is not None:
        asked.append(c.changes)
        t.tell(c, Outcome(run_id=f"r{len(asked) + 1}", outcome="ok", tokens_per_s_per_gpu=1.0, valid=True))
    # CP 2 from the leader (TP 2) is infeasible: the probe ran it from the baseline's layout, exactly once
    assert asked.count({"--context-parallel-size": 2}) == 1


TP_, PP_, RG_ = "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--recompute-granularity"


def sharded_objective(full: dict[str, Any]) -> tuple[str, float | None]:
    """A model whose memory needs TP x PP >= 4 shards, or 2 with full recomputation; a narrower TP is
    faster, a deeper pipeline a little slower, full recomputation costs a quarter. Baseline TP4/PP1/full."""
    tp, pp, full_rc = full[TP_], full[PP_], full[RG_] == "full"
    if tp * pp * (2 if full_rc else 1) < 4:
        return "oom", None
    tps = 1000.0 * {4: 1.0, 2: 1.2, 1: 1.35}[tp] * {1: 1.0, 2: 0.97, 4: 0.93}[pp] * (1.0 if full_rc else 1.3)
    return "ok", tps


def test_heuristic_pays_for_an_out_of_memory_move_with_more_sharding() -> None:
    """A move that ran out of memory, whose rule-5 retry (full recomputation) does not lead, is tried again
    with another placement degree one step up and its recomputation kept low: a coupled move of its own
    (less recomputation paid for by sharding). No chain of single-lever moves reaches selective
    recomputation below TP4 here (each runs out of memory alone); the coupled moves reach the best recipe.
    The memory estimate picks which degree pays (it never rules a single move out)."""
    import itertools

    space = {TP_: [1, 2, 4], PP_: [1, 2, 4], RG_: ["selective", "full"]}
    base = {TP_: 4, PP_: 1, RG_: "full"}
    cp = SyntheticControlPlane()
    cp.objective, cp.baseline = sharded_objective, dict(base)

    def fits(f: dict[str, Any]) -> bool:  # the memory estimate: here exact
        return sharded_objective({**base, **f})[0] != "oom"

    drive(HeuristicTuner(space, base, fits=fits), cp)
    full = [{**base, **c} for c in cp.launched]
    ooms = [f for f in full if sharded_objective(f)[0] == "oom"]
    paid = [f for f in full if f[RG_] == "selective" and f[TP_] < 4 and sharded_objective(f)[0] == "ok"]
    assert ooms and paid, full
    best = max(t for combo in itertools.product(*space.values())
               if (t := sharded_objective(dict(zip(space, combo, strict=True)))[1]) is not None)
    assert cp.leader == pytest.approx(best)
    assert cp.stop is not None and len(cp.launched) <= 16


@pytest.mark.parametrize("retry_share, pays", [(0.78, False), (0.9, True)])
def test_heuristic_pays_for_memory_only_when_the_recomputation_it_saves_can_win(retry_share: float, pays: bool) -> None:
    """A move that ran out of memory under selective recomputation, retried with full recomputation: paying
    for it with sharding instead keeps selective recomputation, so it can gain at most the difference of the
    two recomputations' shares of the compute (the diagnosis' constants). A retry a fifth of the step
    slower than the leader cannot be rescued that way: no coupled move is launched; a retry a tenth slower
    can, and the coupled moves are launched."""
    space = {TP_: [1, 2, 4], PP_: [1, 2, 4], RG_: ["selective", "full"]}
    t = HeuristicTuner(space, {TP_: 4, PP_: 1, RG_: "selective"})
    first = t.ask()
    assert first is not None and first.changes == {TP_: 2}
    t.tell(first, Outcome(run_id="r1", outcome="oom"))
    retry = t.ask()
    assert retry is not None and retry.changes.get(RG_) == "full" and retry.changes.get(TP_) == 2
    t.tell(retry, Outcome(run_id="r2", outcome="ok", tokens_per_s_per_gpu=1000.0 * retry_share, valid=True,
                          extra={"leader_tps": 1000.0}))
    asked = []
    while (c := t.ask()) is not None and len(asked) < 30:
        asked.append({**{TP_: 4, PP_: 1, RG_: "selective"}, **c.changes})
        t.tell(c, Outcome(run_id=f"r{len(asked) + 2}", outcome="ok", tokens_per_s_per_gpu=900.0, valid=True,
                          extra={"leader_tps": 1000.0}))
    paid = [f for f in asked if f[TP_] == 2 and f[RG_] == "selective" and f[PP_] > 1]
    assert bool(paid) is pays, asked


EP_ = "--expert-model-parallel-size"


def _peak(full: dict[str, Any]) -> float:
    """A memory estimate for the tests below: weights and activations sharded by TP and EP, halved by full
    recomputation (its figure is relative: the tests' cluster draws the line elsewhere)."""
    return 100.0 / (full.get(TP_) or 1) / (full.get(EP_) or 1) * (0.4 if full.get(RG_) == "full" else 1.0)


@pytest.mark.parametrize("gpu_memory, plain_follows", [(35.0, False), (45.0, True)])
def test_heuristic_measures_a_move_the_anchored_estimate_rules_out_of_memory_with_its_savings_first(
        gpu_memory: float, plain_follows: bool) -> None:
    """Memory first: once a run has run out of memory, the estimate is anchored by it and by the baseline
    (which ran): a later move whose estimated peak lies nearer the one that ran out of memory is measured with
    full recomputation added back first (rule 5's retry before, not after, its out-of-memory run). The move
    as it is follows only where that retry ran, did not lead, and left it room to beat the leader (here TP1
    with full recomputation is 2.5% below the leader, within what the recomputation costs); a retry that ran
    out of memory says the move (which saves less) would too, and it is not launched."""
    space = {TP_: [1, 2, 4], RG_: ["selective", "full"]}
    base = {TP_: 4, RG_: "selective"}

    def objective(full: dict[str, Any]) -> tuple[str, float | None]:
        if _peak(full) > gpu_memory:
            return "oom", None
        return "ok", 1000.0 * {4: 1.0, 2: 1.1, 1: 1.3}[full[TP_]] * (0.75 if full[RG_] == "full" else 1.0)

    cp = SyntheticControlPlane()
    cp.objective, cp.baseline = objective, dict(base)
    drive(HeuristicTuner(space, base, peak=_peak), cp)
    full = [{**base, **c} for c in cp.launched]
    assert full[0] == {TP_: 2, RG_: "selective"} and objective(full[0])[0] == "oom", full  # the anchor
    tp1 = [f for f in full if f[TP_] == 1]
    assert tp1 and tp1[0][RG_] == "full", full  # memory first
    assert ({TP_: 1, RG_: "selective"} in tp1) is plain_follows, full


def test_heuristic_skips_values_beyond_one_that_ran_out_of_memory_with_every_saving() -> None:
    """A value that ran out of memory with full recomputation already on (a coupled move with a deeper
    pipeline is queued to pay for it): the values beyond it (fewer expert shards) need more memory still by
    the estimate, and the lever has its two measured values (rule 4), so they are not launched."""
    space = {EP_: [1, 2, 4, 8, 16], PP_: [1, 2], RG_: ["selective", "full"]}
    base = {EP_: 8, PP_: 1, RG_: "full"}

    def peak(full: dict[str, Any]) -> float:
        return _peak(full) / (full.get(PP_) or 1)

    def objective(full: dict[str, Any]) -> tuple[str, float | None]:
        if peak(full) > 8.0:
            return "oom", None
        return "ok", 1000.0 * {16: 0.95, 8: 1.0, 4: 1.0, 2: 1.0, 1: 1.0}[full[EP_]] * (0.9 if full[PP_] == 2 else 1.0)

    cp = SyntheticControlPlane()
    cp.objective, cp.baseline = objective, dict(base)
    drive(HeuristicTuner(space, base, peak=peak), cp)
    full = [{**base, **c} for c in cp.launched]
    assert {**base, EP_: 16} in full and {**base, EP_: 4} in full, full
    assert {**base, EP_: 2} not in full and {**base, EP_: 1} not in full, full
    assert {**base, EP_: 4, PP_: 2} in full and cp.stop is not None, full  # the coupled move paid for it


def test_heuristic_does_not_probe_again_a_value_that_lost_clearly_on_an_earlier_layout() -> None:
    """A lever's value measured a quarter or more below the leader (the early abort's clear-loss line) is a
    lesson kept across layouts: after a pipeline win moves the layout, the lever's other values are probed
    from the new leader, that one is not."""
    space = {TP_: [1, 2, 4], PP_: [1, 2, 4]}
    base = {TP_: 2, PP_: 1}

    def objective(full: dict[str, Any]) -> tuple[str, float | None]:
        return "ok", 1000.0 * {4: 0.5, 2: 1.0, 1: 0.97}[full[TP_]] * {1: 1.0, 2: 1.2, 4: 1.1}[full[PP_]]

    cp = SyntheticControlPlane()
    cp.objective, cp.baseline = objective, dict(base)
    drive(HeuristicTuner(space, base), cp)
    full = [{**base, **c} for c in cp.launched]
    assert {TP_: 4, PP_: 1} in full and {TP_: 1, PP_: 2} in full, full  # probed again from the new layout ...
    assert {TP_: 4, PP_: 2} not in full, full  # ... save the value that lost clearly
    assert cp.leader == pytest.approx(1200.0) and cp.stop is not None


def test_heuristic_does_not_probe_past_two_clear_losses_that_worsen() -> None:
    """Two values of a lever in one direction lost clearly, the farther one more: after a pipeline win moves
    the layout, the values past them in that direction are not launched (the measured trend), and the two
    are not probed again either."""
    space = {TP_: [1, 2, 4, 8, 16], PP_: [1, 2]}
    base = {TP_: 1, PP_: 1}

    def objective(full: dict[str, Any]) -> tuple[str, float | None]:
        return "ok", 1000.0 * {1: 1.0, 2: 0.7, 4: 0.5, 8: 0.4, 16: 0.3}[full[TP_]] * {1: 1.0, 2: 1.2}[full[PP_]]

    cp = SyntheticControlPlane()
    cp.objective, cp.baseline = objective, dict(base)
    drive(HeuristicTuner(space, base), cp)
    full = [{**base, **c} for c in cp.launched]
    assert {TP_: 2, PP_: 1} in full and {TP_: 4, PP_: 1} in full and {TP_: 1, PP_: 2} in full, full
    assert not [f for f in full if f[TP_] > 1 and f[PP_] == 2], full
    assert cp.leader == pytest.approx(1200.0) and cp.stop is not None


CP_ = "--context-parallel-size"


def node_objective(full: dict[str, Any]) -> tuple[str, float | None]:
    """Eight GPUs a node: a recipe whose TP x CP group spans two nodes is a third slower (its per-layer
    collectives cross the slower fabric); otherwise a wider TP is faster and a deeper pipeline a little
    slower. Baseline TP4/CP2/PP8: TP8 alone crosses the node and loses; TP8 with CP1 wins."""
    tp, cp, pp = full[TP_], full[CP_], full[PP_]
    tps = 1000.0 * {2: 0.9, 4: 1.0, 8: 1.15}[tp] * {1: 1.0, 2: 1.0, 4: 0.98}[cp] * {4: 1.06, 8: 1.0}[pp]
    return "ok", tps * (0.66 if tp * cp > 8 else 1.0)


@pytest.mark.parametrize("node_gpus", [8, None])
def test_heuristic_rebalances_a_move_that_pushed_its_node_group_across_nodes(node_gpus: int | None) -> None:
    """A placement move that lost after it pushed the TP x CP group across nodes is measured again at once with
    the group's other degree moved the other way (TP8 with CP1: the data-parallel size stays), and that
    re-balanced move is not counted against the lever. Without the cluster's GPUs per node there is no
    such move, and the search needs more launches to get there, if it does."""
    space = {TP_: [2, 4, 8], CP_: [1, 2, 4], PP_: [4, 8]}
    base = {TP_: 4, CP_: 2, PP_: 8}
    cp = SyntheticControlPlane()
    cp.objective, cp.baseline = node_objective, dict(base)
    drive(HeuristicTuner(space, base, node_gpus=node_gpus), cp)
    full = [{**base, **c} for c in cp.launched]
    assert full[0] == {TP_: 8, CP_: 2, PP_: 8}  # TP first (catalog order here: the space's)
    rebalanced = {TP_: 8, CP_: 1, PP_: 8}
    best = 1000.0 * 1.15 * 1.06
    if node_gpus:
        assert full[1] == rebalanced, full  # right after the loss
        assert cp.leader == pytest.approx(best) and cp.stop is not None
        assert full.index({TP_: 8, CP_: 1, PP_: 4}) <= 5
        # the partner keeps the direction that won: CP is not moved back across the node from TP8
        assert not [f for f in full[2:] if f[TP_] == 8 and f[CP_] > 1], full
    else:
        assert full[1] != rebalanced


EP_ = "--expert-model-parallel-size"


@pytest.mark.parametrize("node_gpus", [8, None])
def test_heuristic_measures_first_the_value_that_brings_a_node_group_inside_a_node(node_gpus: int | None) -> None:
    """The expert group spans eight nodes (EP64, expert TP following TP 1); narrowing it helps little until it
    fits one node of eight GPUs, then a lot (the all-to-all moves onto the node's own links). Nearest values
    first would rule EP out on EP32 and EP16 and never measure EP8; with the cluster's GPUs per node, the
    value that brings the group inside a node is measured first."""
    space = {EP_: [8, 16, 32, 64]}
    base = {EP_: 64}

    def objective(full: dict[str, Any]) -> tuple[str, float | None]:
        return "ok", 1000.0 * {64: 1.0, 32: 1.01, 16: 1.02, 8: 1.5}[full[EP_]]

    cp = SyntheticControlPlane()
    cp.objective, cp.baseline = objective, dict(base)
    drive(HeuristicTuner(space, base, node_gpus=node_gpus), cp)
    if node_gpus:
        assert cp.launched[0] == {EP_: 8} and cp.leader == pytest.approx(1500.0)
    else:
        assert {EP_: 8} not in cp.launched and cp.leader == pytest.approx(1000.0)


def tp_pp_shards(base: dict[str, Any], shards: int, tp_speed: dict[int, float]) -> SyntheticControlPlane:
    """Drive the heuristic (no recomputation to fall back on, an exact memory estimate) on a model that needs
    TP x PP >= `shards` to fit, with TP's speed-up `tp_speed` and a deeper pipeline a little slower."""
    space = {TP_: [1, 2, 4], PP_: [1, 2, 4, 8]}

    def objective(full: dict[str, Any]) -> tuple[str, float | None]:
        tp, pp = full[TP_], full[PP_]
        if tp * pp < shards:
            return "oom", None
        return "ok", 1000.0 * tp_speed[tp] * {1: 1.0, 2: 0.99, 4: 0.98, 8: 0.97}[pp]

    def fits(f: dict[str, Any]) -> bool:  # the memory estimate: here exact
        return objective({**base, **f})[0] != "oom"

    cp = SyntheticControlPlane()
    cp.objective, cp.baseline = objective, dict(base)
    drive(HeuristicTuner(space, base, fits=fits, memory_retry=False), cp)
    return cp


def test_heuristic_reaches_a_narrower_tp_whose_memory_needs_a_pipeline_two_steps_deeper() -> None:
    """A narrower TP needs TP x PP >= 8 shards: TP2 is paid for by the next pipeline depth up (PP4), and TP1 needs
    PP8, two steps up from the baseline's PP2. The search gets there one paid step at a time (TP2/PP4 leads, then
    TP1 from it is paid for by PP8), with no recomputation lever to fall back on."""
    cp = tp_pp_shards({TP_: 4, PP_: 2}, 8, {4: 1.0, 2: 1.2, 1: 1.4})
    assert {TP_: 1, PP_: 8} in cp.launched, cp.launched
    assert cp.leader == pytest.approx(1000.0 * 1.4 * 0.97)


def test_heuristic_measures_a_value_back_inside_the_node_after_the_layout_moved_on() -> None:
    """EP won going up (4 -> 32, across nodes) while CP was 8; once CP 1 leads, the layout has moved on and the
    expert group crosses nodes: EP8, back inside a node of eight GPUs, is measured though it lies in the direction
    EP's earlier win measured as slower (that win was measured on another layout)."""
    space = {EP_: [4, 8, 16, 32], CP_: [1, 8]}
    base = {EP_: 4, CP_: 8}

    def objective(full: dict[str, Any]) -> tuple[str, float | None]:
        ep, cp = full[EP_], full[CP_]
        if cp == 8:
            return "ok", 1000.0 * {4: 1.0, 8: 1.18, 16: 1.25, 32: 1.30}[ep]
        return "ok", 4000.0 * {4: 1.1, 8: 1.3, 16: 1.05, 32: 1.0}[ep]

    cp = SyntheticControlPlane()
    cp.objective, cp.baseline = objective, dict(base)
    drive(HeuristicTuner(space, base, node_gpus=8), cp)
    assert {EP_: 8, CP_: 1} in cp.launched, cp.launched
    assert cp.leader == pytest.approx(5200.0)


@pytest.mark.parametrize("node_gpus", [8, None])
def test_heuristic_measures_first_a_degree_whose_feasible_layout_brings_a_group_inside_a_node(
        node_gpus: int | None) -> None:
    """64 GPUs, experts across eight nodes (EP64 at PP1). A deeper pipeline leaves fewer data-parallel ranks, so
    its nearest feasible layout narrows EP with it (PP8 -> EP8): that value of PP, the one that brings the expert
    group inside a node, is measured first, though PP itself is in no node-local group. Narrowing EP alone runs
    out of memory (the experts need PP x EP >= 64 shards) and deepening the pipeline a step at a time loses."""
    space = {PP_: [1, 2, 4, 8], EP_: [8, 16, 32, 64]}
    base = {PP_: 1, EP_: 64}

    def couple(full: dict[str, Any], lever: str, value: Any) -> dict[str, Any] | None:
        out = dict(full)
        if lever == PP_:
            out[EP_] = min(out[EP_], 64 // value)
        return out if out[PP_] * out[EP_] <= 64 else None

    def objective(full: dict[str, Any]) -> tuple[str, float | None]:
        pp, ep = full[PP_], full[EP_]
        if pp * ep < 64:
            return "oom", None
        inside = 1.5 if ep <= 8 else {64: 1.0, 32: 1.01, 16: 1.02}[ep]
        return "ok", 1000.0 * {1: 1.0, 2: 0.98, 4: 0.96, 8: 0.94}[pp] * inside

    cp = SyntheticControlPlane()
    cp.objective, cp.baseline = objective, dict(base)
    drive(HeuristicTuner(space, base, couple=couple, node_gpus=node_gpus), cp)
    if node_gpus:
        assert cp.launched[0] == {PP_: 8, EP_: 8}, cp.launched
        assert cp.leader == pytest.approx(1000.0 * 0.94 * 1.5)
    else:
        assert cp.launched[0] != {PP_: 8, EP_: 8}, cp.launched


def test_heuristic_pays_for_memory_with_the_smallest_step_up_the_estimate_says_fits() -> None:
    """TP1 alone runs out of memory and needs TP x PP >= 4, two pipeline steps up; TP2 (one step up) is no
    faster, so no leader on the way carries the search there. The coupled move that pays for TP1 takes the
    smallest pipeline depth the memory estimate says fits (PP4), not the next one (PP2), which does not."""
    cp = tp_pp_shards({TP_: 4, PP_: 1}, 4, {4: 1.0, 2: 0.98, 1: 1.4})
    assert {TP_: 1, PP_: 4} in cp.launched, cp.launched
    assert cp.leader == pytest.approx(1000.0 * 1.4 * 0.98)


def test_heuristic_retests_on_the_final_layout_a_value_that_won_along_with_another_lever() -> None:
    """TP2 ran out of memory under selective recomputation and rule 5's retry (full recomputation added back)
    led: full recomputation won with TP on TP2/PP1. Selective recomputation then led again, paid for with PP2:
    the final layout is TP2/PP2 and the recompute lever's own win ran from full to selective there. The control
    plane's stop rule 6 asks for every flag a winner changed to be measured on the final layout, so the tuner
    measures full recomputation on TP2/PP2 once before it stops (it would otherwise never: going back on the
    lever's own win is what it measured as slower)."""
    from attune.tuners.base import Outcome

    space = {TP_: [1, 2, 4], PP_: [1, 2], RG_: ["selective", "full"]}
    base = {TP_: 4, PP_: 1, RG_: "selective"}
    tuner = HeuristicTuner(space, base)
    retry = Candidate(changes={TP_: 2, RG_: "full"}, lever=TP_, hypothesis="rule 5 retry",
                      token={"lever": TP_, "value": 2, "retried": True, "oom_changes": {TP_: 2}})
    tuner.tried.add(tuner.key(retry.changes))
    tuner.tell(retry, Outcome("r1", "ok", 1040.0, valid=True, promoted=True))
    paid = Candidate(changes={TP_: 2, PP_: 2}, lever=RG_, hypothesis="coupled move",
                     token={"lever": RG_, "value": "selective", "retried": True, "paid": True})
    tuner.tried.add(tuner.key(paid.changes))
    tuner.tell(paid, Outcome("r2", "ok", 1261.0, valid=True, promoted=True))
    asked = []
    for n in range(40):
        cand = tuner.ask()
        if cand is None:
            break
        asked.append({k: {**base, **cand.changes}.get(k) for k in space})
        tuner.tell(cand, Outcome(f"q{n}", "ok", 1000.0, valid=True, extra={"leader_tps": 1261.0}))
    assert {TP_: 2, PP_: 2, RG_: "full"} in asked, asked
    assert asked.count({TP_: 2, PP_: 2, RG_: "full"}) == 1, asked


def test_heuristic_a_payer_going_back_on_its_win_is_judged_by_the_degrees_sizes() -> None:
    """A degree's win can come from a value outside the space (a coupled move set CP4 where the space holds 1, 2
    and 8): moving it up again from CP1 goes back the way it won all the same, and so does TP after TP 2 -> 1;
    PP, whose win took it down from 16 to 2, goes back by moving up; a degree that never won does not."""
    space = {TP_: [1, 2, 4], PP_: [2, 4, 8, 16], CP_: [1, 2, 8]}
    tuner = HeuristicTuner(space, {TP_: 2, PP_: 16, CP_: 8})
    tuner.win_dir.update({CP_: (4, 1), TP_: (2, 1)})
    assert tuner._goes_back(CP_, 1, 8) and tuner._goes_back(CP_, 1, 2)
    assert tuner._goes_back(TP_, 1, 4) and not tuner._goes_back(TP_, 2, 4)  # from another value: not its win
    assert not tuner._goes_back(PP_, 2, 8)
    tuner.win_dir[PP_] = (16, 2)
    assert tuner._goes_back(PP_, 2, 8) and not tuner._goes_back(PP_, 4, 2)


def test_heuristic_retries_with_full_recomputation_a_coupled_move_made_after_a_memory_first_retry() -> None:
    """Rule 5 holds for every layout that ran out of memory, a coupled move's included. The move behind a
    memory-first retry (TP1 as it is, after TP1 with full recomputation ran) ran out of memory and is paid for
    with a deeper pipeline; when that coupled move runs out of memory too, it is measured again with full
    recomputation (the control plane refuses the stop otherwise: `rule5_oom_not_retried`), not just paid for
    once more."""
    space = {TP_: [1, 2, 4], PP_: [1, 2, 4], RG_: ["selective", "full"]}
    base = {TP_: 4, PP_: 1, RG_: "selective"}
    tuner = HeuristicTuner(space, base)
    plain = Candidate(changes={TP_: 1}, lever=TP_, hypothesis="the move behind its memory-first retry",
                      token={"lever": TP_, "value": 1, "retried": True, "after_retry": True})
    tuner.tried.add(tuner.key(plain.changes))
    tuner.tell(plain, Outcome("r1", "oom"))
    asked: list[dict[str, Any]] = []
    coupled: dict[str, Any] | None = None
    for n in range(40):
        cand = tuner.ask()
        if cand is None:
            break
        full = {k: {**base, **cand.changes}.get(k) for k in space}
        asked.append(full)
        if coupled is None and cand.hypothesis.startswith("coupled move") and full[TP_] == 1:
            coupled = full
            tuner.tell(cand, Outcome(f"q{n}", "oom"))
            continue
        tuner.tell(cand, Outcome(f"q{n}", "ok", 900.0, valid=True, extra={"leader_tps": 1000.0}))
    assert coupled is not None and coupled[RG_] == "selective", asked
    after = asked[asked.index(coupled) + 1:]
    assert {**coupled, RG_: "full"} in after, asked


def test_heuristic_measures_a_value_past_one_that_ran_out_of_memory_when_the_estimate_says_it_fits() -> None:
    """16 GPUs, EP x PP <= 16 (the pipeline follows EP; no other degree moves, so nothing else can pay). From
    EP2/PP8, EP4 forces PP4 and runs out of memory, and EP1 runs out of memory: two values, both out of memory,
    say nothing of EP's speed. EP8 (at PP2, the shallower pipeline it forces) lies past the first, and the memory
    estimate, anchored by the baseline that ran and the EP4 layout that did not, says it fits: it is measured
    before EP is ruled out, and it is the fastest recipe."""
    space = {EP_: [1, 2, 4, 8]}
    base = {EP_: 2, PP_: 8}

    def couple(full: dict[str, Any], lever: str, value: Any) -> dict[str, Any] | None:
        out = dict(full)
        if lever == EP_:
            out[PP_] = min(out[PP_], 16 // value)
        return out if out[PP_] * out[EP_] <= 16 else None

    def peak(full: dict[str, Any]) -> float:  # the estimate; the layout EP4/PP4 is what it misjudges least
        return {(2, 8): 10.0, (4, 4): 30.0, (8, 2): 12.0, (1, 8): 50.0, (2, 4): 25.0, (2, 2): 40.0}.get(
            (full[EP_], full[PP_]), 60.0)

    def objective(full: dict[str, Any]) -> tuple[str, float | None]:
        if peak(full) >= 25.0:
            return "oom", None
        return "ok", 1000.0 * {2: 1.0, 8: 1.6}[full[EP_]]

    cp = SyntheticControlPlane()
    cp.objective, cp.baseline = objective, dict(base)
    drive(HeuristicTuner(space, {EP_: 2}, extra_baseline={PP_: 8}, couple=couple, peak=peak), cp)
    assert {EP_: 4, PP_: 4} in cp.launched and {EP_: 1} in cp.launched, cp.launched
    assert {EP_: 8, PP_: 2} in cp.launched, cp.launched
    assert cp.leader == pytest.approx(1600.0)


def test_heuristic_pays_for_a_degree_of_one_when_the_step_toward_it_ran_out_of_memory() -> None:
    """Eight GPUs, experts need EP x PP >= 8 to fit. EP 8 -> 4 and 4 -> 2 run out of memory, and every value
    between keeps the expert all-to-all (slower than the baseline even where a deeper pipeline pays for it); past
    them the estimate says EP1 needs more memory still, so it is not launched as it is. At EP1 the all-to-all is
    gone: the degree at 1 is tried as a coupled move paid for like the step toward it (PP8, the smallest depth
    the anchored estimate says fits), and it leads."""
    space = {EP_: [1, 2, 4, 8], PP_: [1, 2, 4, 8]}
    base = {EP_: 8, PP_: 1}

    def couple(full: dict[str, Any], lever: str, value: Any) -> dict[str, Any] | None:
        return full if full[PP_] * full[EP_] <= 8 else None  # a deeper pipeline needs a narrower EP first

    def objective(full: dict[str, Any]) -> tuple[str, float | None]:
        ep, pp = full[EP_], full[PP_]
        if ep * pp < 8:
            return "oom", None
        return "ok", 1000.0 * {8: 1.0, 4: 0.97, 2: 0.96, 1: 1.5}[ep] * {1: 1.0, 2: 0.98, 4: 0.96, 8: 0.94}[pp]

    def peak(full: dict[str, Any]) -> float:  # the estimate: experts' memory over EP x PP shards
        return 64.0 / full[EP_] / full[PP_]

    cp = SyntheticControlPlane()
    cp.objective, cp.baseline = objective, dict(base)
    drive(HeuristicTuner(space, base, couple=couple, peak=peak), cp)
    assert {EP_: 4} in cp.launched and {EP_: 1} not in cp.launched, cp.launched
    assert {EP_: 1, PP_: 8} in cp.launched, cp.launched
    assert cp.leader == pytest.approx(1000.0 * 1.5 * 0.94)


def test_heuristic_answers_a_refused_stop_with_the_runs_it_asks_for() -> None:
    """The net under the tuner's own rules: a stop the control plane refuses lists what it misses
    (`RuleRefusal` items), and the heuristic answers with those runs, once each: rule 5's out-of-memory layout
    retried with full recomputation, rule 6's winning value measured on the final layout."""
    from attune.control.search_rules import RuleRefusal

    space = {TP_: [1, 2, 4], RG_: ["selective", "full"]}
    base = {TP_: 4, RG_: "selective"}
    tuner = HeuristicTuner(space, base)
    oom = Candidate(changes={TP_: 1}, lever=TP_, hypothesis="TP1", token={"lever": TP_, "value": 1, "retried": True})
    tuner.tried.add(tuner.key(oom.changes))
    tuner.tell(oom, Outcome("r7-tensor", "oom"))
    rule5 = RuleRefusal("rule5_oom_not_retried", "search rule 5", ["r7-tensor TP1/PP1 (...)"],
                        [{"run_id": "r7-tensor"}])
    assert tuner.repair([rule5])
    retry = tuner.ask()
    assert retry is not None and retry.changes[TP_] == 1 and retry.changes[RG_] == "full", retry
    assert not tuner.repair([rule5])  # once: that recipe was asked for already

    won = Candidate(changes={TP_: 2}, lever=TP_, hypothesis="TP2", token={"lever": TP_, "value": 2})
    tuner.tried.add(tuner.key(won.changes))
    tuner.tell(won, Outcome("r8-tensor", "ok", 1200.0, valid=True, promoted=True))
    rule6 = RuleRefusal("rule6_winners_not_retested", "search rule 6", ["--recompute-granularity=full (...)"],
                        [{"name": RG_, "value": "full"}])
    assert tuner.repair([rule6])
    retest = tuner.ask()
    assert retest is not None and retest.changes[TP_] == 2 and retest.changes[RG_] == "full", retest
    unknown = RuleRefusal("rule6_winners_not_retested", "search rule 6", ["--not-in-space=1 (...)"],
                          [{"name": "--not-in-space", "value": "1"}])
    assert not tuner.repair([unknown])


class _OneMoreTuner:
    """A tuner with nothing to try until a refused stop names one recipe (drive's plumbing, without the
    heuristic's search around it)."""

    def __init__(self) -> None:
        self.queue: list[Candidate] = []
        self.repairs = 0

    def ask(self) -> Candidate | None:
        return self.queue.pop() if self.queue else None

    def tell(self, candidate: Candidate, outcome: Outcome) -> None:
        pass

    def summary(self) -> dict[str, Any]:
        return {"tuner": "one-more"}

    def repair(self, refusals: list[Any]) -> bool:
        self.repairs += 1
        self.queue.append(Candidate(changes={"--micro-batch-size": 2 ** self.repairs}, lever="--micro-batch-size",
                                    hypothesis="asked for by the refused stop"))
        return True


@pytest.mark.parametrize("refusals, accepted", [(1, True), (10, False)])
def test_drive_answers_a_refused_stop_at_most_stop_repairs_times(refusals: int, accepted: bool) -> None:
    """`drive` hands a refused stop's `refusals` to the tuner's `repair`, runs what it queued and stops again; a
    refusal that still stands after `STOP_REPAIRS` answers is raised (the campaign fails, saying why)."""
    from attune.control.campaign import StopRefusedError
    from attune.control.search_rules import RuleRefusal
    from attune.tuners.driver import STOP_REPAIRS

    class Refusing(SyntheticControlPlane):
        stops = 0

        def record_stop(self, evidence: dict[str, Any]) -> None:
            self.stops += 1
            if self.stops <= refusals:
                raise StopRefusedError([RuleRefusal("rule5_oom_not_retried", "search rule 5", ["r1 TP1/PP1"])])
            super().record_stop(evidence)

    cp, tuner = Refusing(), _OneMoreTuner()
    if accepted:
        res = drive(tuner, cp)  # type: ignore[arg-type]
        assert cp.stop is not None and cp.stops == 2 and res.launches == 1 and len(cp.launched) == 1
    else:
        with pytest.raises(StopRefusedError):
            drive(tuner, cp)  # type: ignore[arg-type]
        assert cp.stops == STOP_REPAIRS + 1 and len(cp.launched) == STOP_REPAIRS
