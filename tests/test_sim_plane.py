"""Simulated campaigns through the in-process control plane: the paper's budgets, charging, the gate,
shipping; a whole 1,880 GPU-hour campaign in well under a minute of wall time."""

from __future__ import annotations

import time

import pytest

from attune.spec import load_spec
from broker.sim_plane import CAMPAIGNS, Infeasible, knob_space, run_campaign


def test_a_whole_glm_campaign_runs_in_under_a_minute(tmp_path):
    t0 = time.perf_counter()
    r = run_campaign("glm-4.5", "tpe", 1, run_root=tmp_path)
    wall = time.perf_counter() - t0
    assert wall < 60.0
    assert r.budget_gpu_hours == 1880
    # it ran to the budget: the next launch (one baseline run, ~63 GPU-h) no longer fit after the reserve
    assert 1880 - 4 * 63 - 80 < r.gpu_hours_used <= 1880
    assert r.launches >= 15
    search = [x for x in r.records if x.kind == "search"]
    assert r.gpu_hours_used == pytest.approx(sum(x.charge_gpu_hours for x in r.records if x.charged_to == "campaign"))
    assert r.failed_launches == sum(x.outcome in ("oom", "hang", "crash") for x in search)
    assert r.pruned == sum(x.outcome == "pruned" for x in search)
    assert all(x.charge_gpu_hours > 0 for x in search)


def test_campaigns_are_deterministic_given_the_seed(tmp_path):
    a = run_campaign("minimax-m2", "random", 2, run_root=tmp_path / "a")
    b = run_campaign("minimax-m2", "random", 2, run_root=tmp_path / "b")
    c = run_campaign("minimax-m2", "random", 3, run_root=tmp_path / "c")
    assert a.as_dict() | {"wall_seconds": 0} == b.as_dict() | {"wall_seconds": 0}
    assert [x.changes for x in a.records] != [x.changes for x in c.records]


def test_the_heuristic_tuner_ships_a_faster_recipe_that_passed_the_gate(tmp_path):
    r = run_campaign("minimax-m2", "heuristic", 1, run_root=tmp_path)
    assert r.shipped_changes and r.gain > 0.03
    assert r.checks >= 1
    assert r.gpu_hours_used <= 530


def test_the_launcher_applies_co_changes_and_refuses_infeasible_draws():
    space = knob_space(load_spec(CAMPAIGNS["glm-4.5"]))
    base = space.baseline()
    assert space.to_args(base) == dict(load_spec(CAMPAIGNS["glm-4.5"]).baseline.args)
    tp1 = space.to_args({**base, "--tensor-model-parallel-size": 1, "--expert-model-parallel-size": 8})
    assert "--sequence-parallel" not in tp1
    assert "--overlap-grad-reduce" not in tp1  # expert data parallelism 2 on GLM-4.5: the overlaps hang
    dep = space.to_args({**base, "--expert-model-parallel-size": 8, "dispatcher": "deepep"})
    assert dep["--moe-token-dispatcher-type"] == "flex" and "--moe-shared-expert-overlap" not in dep
    with pytest.raises(Infeasible, match="within a node"):
        space.to_args({**base, "dispatcher": "deepep"})  # EP 16 spans two nodes
    with pytest.raises(Infeasible):
        space.to_args({**base, "--expert-model-parallel-size": 1, "--expert-tensor-parallel-size": 4})
    light = space.to_args({**base, "--pipeline-model-parallel-size": 16, "split": "light_both"})
    assert light["--decoder-first-pipeline-num-layers"] < 6 and light["--decoder-last-pipeline-num-layers"] < 6
