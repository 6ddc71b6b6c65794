"""The simulated world's defects and loss curves, against the correctness gate.

Layer 1 must refuse every Table B1 defect the world has (the ids match the gate's lists); layer 2 must
pass objective-preserving layouts (the same curve up to tiny noise) and catch the settings that change
the objective visibly, while the subtle ones pass it, as the paper's Table B2 reports.
"""

from __future__ import annotations

import pytest

from attune.control.spec import load_spec
from attune.knowledge.layouts import find_model
from attune.readers.metrics import read_resolved_args
from attune.sim.api import apply_overrides, resolve_accelerator
from attune.sim.defects import DEFECTS
from attune.sim.paperfit.paper import CAMPAIGNS
from attune.sim.recipe import build_recipe
from attune.sim.run import SimSettings, plan_run
from gate import check_convergence, check_recipe, check_resolved, load_list

SPECS = {m: load_spec(p) for m, p in CAMPAIGNS.items()}
LISTS = {"glm-4.5": "glm-4.5", "minimax-m2": "minimax-m2", "mixtral-8x22b": "mixtral-8x22b"}
_NO_DP = {"--overlap-grad-reduce": None, "--overlap-param-gather": None}
# A configuration that triggers each Table B1 defect on its model.
TRIGGERS = {
    ("fused-routing", "glm-4.5"): {"--moe-router-fusion": True},
    ("grad-accum-fusion-off", "minimax-m2"): {"--no-gradient-accumulation-fusion": True},
    ("ep1-etp4", "glm-4.5"): {"--expert-model-parallel-size": 1, "--expert-tensor-parallel-size": 4,
                              "--pipeline-model-parallel-size": 16, "--decoder-first-pipeline-num-layers": 4,
                              "--decoder-last-pipeline-num-layers": 4, **_NO_DP},
    ("cp8-virtual-stages", "mixtral-8x22b"): {"--context-parallel-size": 8, "--pipeline-model-parallel-size": 2,
                                              "--num-virtual-stages-per-pipeline-rank": 2},
    ("cp-above-4", "glm-4.5"): {"--context-parallel-size": 8, "--pipeline-model-parallel-size": 4,
                                "--expert-model-parallel-size": 8, "--decoder-first-pipeline-num-layers": None,
                                "--decoder-last-pipeline-num-layers": None, **_NO_DP},
    ("mbs-above-32", "minimax-m2"): {"--micro-batch-size": 64, "--global-batch-size": 1024},
    ("pp32", "glm-4.5"): {"--pipeline-model-parallel-size": 32, "--tensor-model-parallel-size": 1,
                          "--sequence-parallel": None, "--expert-model-parallel-size": 4,
                          "--decoder-first-pipeline-num-layers": 1, "--decoder-last-pipeline-num-layers": 1,
                          "--recompute-granularity": "full", "--recompute-method": "uniform",
                          "--recompute-num-layers": 1},
}


def _args(model: str, changes: dict) -> dict:
    return apply_overrides(SPECS[model].baseline.args, changes)


def _recipe(model: str, changes: dict):
    spec = SPECS[model]
    return build_recipe(find_model(spec.model), resolve_accelerator(spec.cluster.accelerator), spec.cluster.gpus,
                        _args(model, changes), spec.baseline.env)


@pytest.mark.parametrize("key", sorted(TRIGGERS), ids=lambda k: f"{k[0]}@{k[1]}")
def test_each_table_b1_defect_exists_in_the_world_and_layer_1_refuses_it(key):
    did, model = key
    r = _recipe(model, TRIGGERS[key])
    hits = [d.id for d in DEFECTS if d.applies(r)]
    assert did in hits
    spec = SPECS[model]
    res = check_recipe(load_list(LISTS[model]), spec.baseline.args, _args(model, TRIGGERS[key]),
                       spec.baseline.env, spec.baseline.env)
    assert not res.passed
    assert did in {d.id for d in res.defects} or any(r.klass in ("numeric", "frozen") for r in res.refusals)


def test_every_b1_defect_is_covered_by_a_trigger():
    b1 = {d.id for d in DEFECTS if "Table B1" in d.source}
    assert b1 == {k[0] for k in TRIGGERS} | {"tp16"}  # TP 16 cannot even divide MiniMax-M2's 8 query groups


def _run(model: str, changes: dict, key: str, steps: int = 20):
    spec = SPECS[model]
    s = SimSettings(**spec.cluster.settings)
    args = _args(model, {**changes, "--train-iters": steps})
    return plan_run(s, key, [], spec.baseline.env, spec.cluster.gpus, 0.0, args=args)


def _curve(model: str, changes: dict, key: str) -> dict[int, float]:
    p = _run(model, changes, key)
    assert p.outcome == "ok", p.reason
    return p.losses


BASE_GLM = _curve("glm-4.5", {}, "baseline")

PRESERVING = {
    "replicate": {},
    "EP 8, DeepEP": {"--expert-model-parallel-size": 8, "--moe-token-dispatcher-type": "flex",
                     "--moe-flex-dispatcher-backend": "deepep", "--moe-shared-expert-overlap": None, **_NO_DP},
    "TP 1, PP 16, full recompute": {"--tensor-model-parallel-size": 1, "--sequence-parallel": None,
                                    "--pipeline-model-parallel-size": 16, "--expert-model-parallel-size": 8,
                                    "--decoder-first-pipeline-num-layers": 4, "--decoder-last-pipeline-num-layers": 4,
                                    "--recompute-granularity": "full", "--recompute-method": "uniform",
                                    "--recompute-num-layers": 1},
}
CAUGHT = {  # Table B2: caught by the convergence check
    "EP 1 with ETP 4": TRIGGERS[("ep1-etp4", "glm-4.5")],
    "learning rate x10": {"--lr": 1e-5},
    "global batch halved": {"--global-batch-size": 1024},
    "capacity factor 1": {"--moe-expert-capacity-factor": 1.0},
}
MISSED = {  # Table B2: subtle, the convergence check passes them (layer 1 refuses them)
    "BF16 gradient reduction": {"--grad-reduce-in-bf16": True},
    "fused routing": {"--moe-router-fusion": True},
    "auxiliary-loss coefficient": {"--moe-aux-loss-coeff": 0.01},
}


@pytest.mark.parametrize("name", sorted(PRESERVING))
def test_objective_preserving_layouts_pass_the_convergence_check(name):
    res = check_convergence(BASE_GLM, _curve("glm-4.5", PRESERVING[name], f"p-{name}"))
    assert res.passed, res.model_dump()
    assert res.checks.correlation.value > 0.99


@pytest.mark.parametrize("name", sorted(CAUGHT))
def test_objective_changing_settings_fail_the_convergence_check(name):
    res = check_convergence(BASE_GLM, _curve("glm-4.5", CAUGHT[name], f"c-{name}"))
    assert not res.passed


@pytest.mark.parametrize("name", sorted(MISSED))
def test_subtle_changes_pass_layer_2_but_not_layer_1(name):
    res = check_convergence(BASE_GLM, _curve("glm-4.5", MISSED[name], f"m-{name}"))
    assert res.passed
    spec = SPECS["glm-4.5"]
    l1 = check_recipe(load_list("glm-4.5"), spec.baseline.args, _args("glm-4.5", MISSED[name]),
                      spec.baseline.env, spec.baseline.env)
    assert not l1.passed


def test_pp32_halves_the_load_balancing_loss_and_keeps_the_lm_loss():
    pp32 = _run("glm-4.5", TRIGGERS[("pp32", "glm-4.5")], "pp32")
    ok = _run("glm-4.5", {k: v for k, v in TRIGGERS[("pp32", "glm-4.5")].items() if k not in (
        "--pipeline-model-parallel-size", "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers")}
        | {"--pipeline-model-parallel-size": 16, "--decoder-first-pipeline-num-layers": 4,
           "--decoder-last-pipeline-num-layers": 4, **_NO_DP}, "pp16")
    assert pp32.outcome == ok.outcome == "ok"
    assert check_convergence(ok.losses, pp32.losses).passed
    aux32 = [line for _, line in pp32.lines if "load_balancing_loss" in line]
    aux16 = [line for _, line in ok.lines if "load_balancing_loss" in line]

    def value(line: str) -> float:
        return float(line.split("load_balancing_loss:")[1].split("|")[0])

    assert value(aux32[-1]) == pytest.approx(value(aux16[-1]) / 2, rel=0.02)


def test_resolved_recheck_sees_a_silent_rewrite(tmp_path):
    """--grad-reduce-in-bf16 also turns off FP32 accumulation: the resolved block shows it."""
    spec = SPECS["glm-4.5"]
    gl = load_list("glm-4.5")
    base = _run("glm-4.5", {}, "b")
    cand = _run("glm-4.5", {"--grad-reduce-in-bf16": True}, "c")
    blog, clog = tmp_path / "b.txt", tmp_path / "c.txt"
    blog.write_text("\n".join(line for _, line in base.lines))
    clog.write_text("\n".join(line for _, line in cand.lines))
    res = check_resolved(gl, read_resolved_args(blog, spec.framework), read_resolved_args(clog, spec.framework), spec.baseline.env, spec.baseline.env)
    names = {c.name for c in res.changes if not c.allowed}
    assert {"grad_reduce_in_bf16", "accumulate_allreduce_grads_in_fp32"} <= names
    ok = _run("glm-4.5", PRESERVING["EP 8, DeepEP"], "d")
    olog = tmp_path / "o.txt"
    olog.write_text("\n".join(line for _, line in ok.lines))
    assert check_resolved(gl, read_resolved_args(blog, spec.framework), read_resolved_args(olog, spec.framework), spec.baseline.env,
                          spec.baseline.env).passed
