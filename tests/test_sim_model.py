"""The simulator's models: calibration against the paper, step-time terms, memory, recipes.

The simulated cluster is a test bed; these tests hold it to what docs/sim.md promises: the public
recipes of the paper's Table 1 within 15%, the paper's fitted shipped recipes above their public
recipes by more than the band, out of memory where the paper reports it, and terms that add up.
"""

from __future__ import annotations

import math
import time

import pytest

from attune.control.spec import load_spec
from attune.core.recipe import parse_argv
from attune.knowledge.layouts import find_model
from attune.knowledge.memory_estimate import GIB
from attune.knowledge.memory_estimate import estimate as memory_estimate
from attune.sim.api import apply_overrides, resolve_accelerator
from attune.sim.estimate import estimate
from attune.sim.memory import memory_options, stage_memory
from attune.sim.paperfit.paper import CAMPAIGNS, POINTS, PUBLIC_TPS, points
from attune.sim.recipe import RecipeError, build_recipe, render_argv, resolved_arguments
from attune.sim.steptime import TERM_ORDER, step_time

SPECS = {m: load_spec(p) for m, p in CAMPAIGNS.items()}


def est(model: str, changes: dict | None = None, env: dict | None = None):
    spec = SPECS[model]
    args = apply_overrides(spec.baseline.args, changes or {})
    return estimate(find_model(spec.model), resolve_accelerator(spec.cluster.accelerator), spec.cluster.gpus, args,
                    {**spec.baseline.env, **(env or {})})


def recipe(model: str, changes: dict | None = None, env: dict | None = None):
    spec = SPECS[model]
    args = apply_overrides(spec.baseline.args, changes or {})
    return build_recipe(find_model(spec.model), resolve_accelerator(spec.cluster.accelerator), spec.cluster.gpus,
                        args, {**spec.baseline.env, **(env or {})})


# ------------------------------------------------------------------ calibration (the paper's Show)


@pytest.mark.parametrize("model", sorted(PUBLIC_TPS))
def test_public_recipes_within_15_percent_of_table_1(model):
    e = est(model)
    assert e.outcome == "ok", e.reason
    assert e.tokens_per_s_per_gpu == pytest.approx(PUBLIC_TPS[model], rel=0.15)


# the fitted ones: held-out points are held to their error bounds instead (tests/test_sim_paperfit.py)
@pytest.mark.parametrize("point", [p for p in points(kind="shipped", split="fit") if not p.disagreement],
                         ids=lambda p: f"{p.model}:{p.label}")
def test_shipped_recipes_beat_their_public_recipe_by_more_than_the_band(point):
    public = est(point.model).tokens_per_s_per_gpu
    e = est(point.model, point.changes)
    assert e.outcome == "ok", e.reason
    assert e.tokens_per_s_per_gpu > public * 1.03, (e.tokens_per_s_per_gpu, public)


@pytest.mark.parametrize("point", [p for p in POINTS if p.outcome == "oom" and not p.disagreement],
                         ids=lambda p: f"{p.model}:{p.label}")
def test_out_of_memory_where_the_paper_reports_it(point):
    e = est(point.model, point.changes)
    assert e.outcome == "oom", (e.outcome, e.memory.peak.peak_gib if e.memory else None)
    assert e.memory is not None and e.memory.peak.peak_gib > e.memory.capacity_gib


def test_glm_tp1_fits_again_with_full_recomputation():
    tp1 = {"--tensor-model-parallel-size": 1, "--sequence-parallel": None, "--pipeline-model-parallel-size": 16,
           "--expert-model-parallel-size": 8, "--decoder-first-pipeline-num-layers": 4,
           "--decoder-last-pipeline-num-layers": 4}
    assert est("glm-4.5", tp1).outcome == "oom"
    full = est("glm-4.5", {**tp1, "--recompute-granularity": "full", "--recompute-method": "uniform",
                           "--recompute-num-layers": 1})
    assert full.outcome == "ok"
    assert full.tokens_per_s_per_gpu > est("glm-4.5").tokens_per_s_per_gpu * 1.2


def test_every_paper_point_is_estimated_quickly():
    t0 = time.perf_counter()
    for p in POINTS:
        est(p.model, p.changes)
    assert (time.perf_counter() - t0) / len(POINTS) < 0.05


# ------------------------------------------------------------------ step-time terms


@pytest.mark.parametrize("model", sorted(PUBLIC_TPS))
def test_terms_add_up_to_the_step_and_are_non_negative(model):
    st = step_time(recipe(model))
    assert list(st.terms) == list(TERM_ORDER)
    assert all(v >= 0 for v in st.terms.values())
    assert math.fsum(st.terms.values()) == pytest.approx(st.seconds)
    assert st.terms["compute"] > 0


def test_cross_node_expert_all_to_all_costs_more_than_inside_a_node():
    inter = step_time(recipe("glm-4.5"))  # EP 16: two nodes
    intra = step_time(recipe("glm-4.5", {"--expert-model-parallel-size": 8, "--overlap-grad-reduce": None,
                                         "--overlap-param-gather": None}))
    per_mb_inter = inter.terms["ep_a2a"] / inter.microbatches
    per_mb_intra = intra.terms["ep_a2a"] / intra.microbatches
    assert per_mb_inter > 3 * per_mb_intra


def test_virtual_stages_shrink_the_bubble_and_add_handoffs():
    base = step_time(recipe("llama-3.1-405b", {"--num-virtual-stages-per-pipeline-rank": 2}))
    more = step_time(recipe("llama-3.1-405b"))  # VP 8
    assert more.terms["pipeline_bubble"] < base.terms["pipeline_bubble"]
    assert more.terms["pipeline_p2p"] > base.terms["pipeline_p2p"]


def test_launch_overhead_dominates_many_small_microbatches():
    one = step_time(recipe("minimax-m2"))
    four = step_time(recipe("minimax-m2", {"--micro-batch-size": 4}))
    assert four.microbatches == one.microbatches // 4
    assert four.terms["host_launch"] < one.terms["host_launch"] / 2
    assert one.terms["host_launch"] > one.terms["compute"]


def test_optimizer_offload_is_a_term_of_its_own():
    on = step_time(recipe("minimax-m2"))
    off = step_time(recipe("minimax-m2", {"--optimizer-cpu-offload": None}))
    assert on.terms["optimizer_offload"] > 5.0 and off.terms["optimizer_offload"] == 0.0
    assert off.seconds < on.seconds


def test_overlaps_hide_data_parallel_communication():
    r_on = recipe("minimax-m2", {"--overlap-grad-reduce": True, "--overlap-param-gather": True})
    on, off = step_time(r_on), step_time(recipe("minimax-m2"))
    assert on.terms["dp_grad_reduce"] < off.terms["dp_grad_reduce"]
    assert on.terms["dp_param_gather"] < off.terms["dp_param_gather"]


def test_recomputation_costs_compute():
    sel = step_time(recipe("glm-4.5"))
    full = step_time(recipe("glm-4.5", {"--recompute-granularity": "full", "--recompute-method": "uniform",
                                        "--recompute-num-layers": 1}))
    assert full.terms["recompute"] > 5 * sel.terms["recompute"]


def test_tp_comm_overlap_hides_tensor_parallel_collectives():
    on = step_time(recipe("mixtral-8x22b"))
    off = step_time(recipe("mixtral-8x22b", {"--tp-comm-overlap": None}))
    assert on.terms["tp_comm"] < off.terms["tp_comm"]


def test_context_parallelism_adds_its_exchange():
    cp = step_time(recipe("glm-4.5", {"--context-parallel-size": 2, "--expert-model-parallel-size": 8,
                                      "--pipeline-model-parallel-size": 4, "--decoder-first-pipeline-num-layers": None,
                                      "--decoder-last-pipeline-num-layers": None}))
    assert cp.terms["cp_comm"] > 0
    assert step_time(recipe("glm-4.5")).terms["cp_comm"] == 0


# ------------------------------------------------------------------ memory


def test_simulated_memory_builds_on_the_estimate():
    r = recipe("glm-4.5")
    mem = stage_memory(r)
    pre = memory_estimate(r.model, r.layout, memory_options(r))
    for ours, theirs in zip(mem.stages, pre.stages, strict=True):
        assert ours.peak_gib > theirs.total_bytes / GIB  # plus buffers and fragmentation
        assert ours.peak_gib < theirs.total_bytes / GIB * 1.3 + 6


def test_expandable_segments_lower_the_peak():
    plain = stage_memory(recipe("glm-4.5")).peak.peak_gib
    exp = stage_memory(recipe("glm-4.5", env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})).peak.peak_gib
    assert exp < plain


# ------------------------------------------------------------------ recipes


def test_argv_round_trip():
    args = {"--tensor-model-parallel-size": 2, "--sequence-parallel": True, "--lr": 1e-5,
            "--recompute-modules": "core_attn moe_act", "--no-gradient-accumulation-fusion": True}
    prog, back = parse_argv(["pretrain_gpt.py", *render_argv(args)])
    assert prog == ["pretrain_gpt.py"]
    assert back == {"--tensor-model-parallel-size": "2", "--sequence-parallel": True, "--lr": "1e-05",
                    "--recompute-modules": "core_attn moe_act", "--no-gradient-accumulation-fusion": True}


@pytest.mark.parametrize("changes, words", [
    ({"--tensor-model-parallel-size": 3}, "divisible"),
    ({"--global-batch-size": 2047}, "--global-batch-size"),
    ({"--sequence-parallel": None}, "sequence parallelism must be enabled"),
    ({"--use-distributed-optimizer": None}, "--overlap-param-gather needs"),
    ({"--expert-model-parallel-size": 7}, "EP 7"),
    ({"--num-layers": 90}, "size mismatch"),
    ({"--recompute-granularity": "sometimes"}, "--recompute-granularity"),
])
def test_megatron_validation_failures(changes, words):
    with pytest.raises(RecipeError, match=words):
        recipe("glm-4.5", changes)
    e = est("glm-4.5", changes)
    assert e.outcome == "crash" and "AssertionError" in e.reason


def test_resolved_arguments_show_megatrons_silent_rewrites():
    r = recipe("glm-4.5", {"--tensor-model-parallel-size": 1, "--grad-reduce-in-bf16": True})
    res = resolved_arguments(r)
    assert res["sequence_parallel"] is False  # forced off at TP 1
    assert res["accumulate_allreduce_grads_in_fp32"] is False
    assert res["data_parallel_size"] == 16 and res["world_size"] == 128
    assert res["recompute_granularity"] == "selective" and res["recompute_modules"] == ["core_attn"]
