"""Layer 1: classification of every change, refusals with reasons, the resolved-argument re-check."""

from __future__ import annotations

import pytest

from attune.readers.metrics import read_resolved_args
from gate import conditions, config_check, lists
from gate.config_check import apply_changes, check_recipe, check_resolved, recipe_to_config
from gate.lists import AllCondition, CorrectnessList, load_list
from tests.gate_fixtures import BASELINES, GLM, LLAMA, MINIMAX, MIXTRAL, TINYGPT, megatron_log


def _check(model, changes, env=None, baseline=None):
    base = baseline if baseline is not None else BASELINES[model]
    return check_recipe(load_list(model), base, apply_changes(base, changes), {}, env or {})


def _refused(result):
    return {r.name: r for r in result.refusals}


@pytest.mark.parametrize("model", sorted(BASELINES))
def test_baseline_against_itself_passes_with_no_changes(model):
    r = _check(model, {})
    assert r.passed and r.changes == [] and r.refusals == []


def test_structural_changes_pass_and_are_each_classified():
    r = _check("glm-4.5", {"--tensor-model-parallel-size": 1, "--pipeline-model-parallel-size": 16,
                           "--sequence-parallel": None, "--recompute-granularity": "full",
                           "--recompute-method": "uniform", "--recompute-num-layers": 1,
                           "--num-layers-per-virtual-pipeline-stage": 3, "--overlap-grad-reduce": True},
               env={"NCCL_MIN_NCHANNELS": "16", "CUDA_DEVICE_MAX_CONNECTIONS": "1"})
    assert r.passed, r.summary()
    by = {c.name: c for c in r.changes}
    assert by["tensor_model_parallel_size"].baseline == 2 and by["tensor_model_parallel_size"].candidate == 1
    assert by["sequence_parallel"].baseline is True and by["sequence_parallel"].candidate is False
    assert by["overlap_grad_reduce"].baseline is False
    assert by["NCCL_MIN_NCHANNELS"].klass == "structural" and by["NCCL_MIN_NCHANNELS"].kind == "env"
    assert all(c.klass == "structural" and c.allowed for c in r.changes)
    assert len(r.changes) == 10


@pytest.mark.parametrize(("model", "change", "name", "klass", "words"), [
    ("glm-4.5", {"--lr": 3e-5}, "lr", "numeric", "learning rate"),
    ("glm-4.5", {"--global-batch-size": 1024}, "global_batch_size", "numeric", "batch"),
    ("glm-4.5", {"--grad-reduce-in-bf16": True}, "grad_reduce_in_bf16", "numeric", "FP32 accumulation"),
    ("glm-4.5", {"--seed": 7}, "seed", "numeric", "changes what is trained"),
    ("glm-4.5", {"--micro-batch-size": 2}, "micro_batch_size", "frozen", "load-balancing loss"),
    ("glm-4.5", {"--tp-comm-overlap": True}, "tp_comm_overlap", "frozen", "no component test"),
    ("llama31-405b", {"--tp-comm-overlap": None}, "tp_comm_overlap", "frozen", "frozen at True"),
    ("llama31-405b", {"--fp8-recipe": "mxfp8"}, "fp8_recipe", "frozen", "FP8"),
    ("minimax-m2", {"--lr-decay-style": "cosine"}, "lr_decay_style", "frozen", "constant learning rate"),
    ("minimax-m2", {"--moe-aux-loss-coeff": 0.001}, "moe_aux_loss_coeff", "frozen", "auxiliary-loss-free"),
    ("mixtral-8x22b", {"--moe-router-topk": 1}, "moe_router_topk", "numeric", "routing"),
    ("mixtral-8x22b", {"--moe-expert-capacity-factor": 1.0}, "moe_expert_capacity_factor", "numeric", "dropping"),
    ("glm-4.5", {"--my-secret-speedup": True}, "--my-secret-speedup", "unlisted", "anything unlisted"),
    ("glm-4.5", {"--tensor-model-parallel": 1}, "--tensor-model-parallel", "unlisted", "unlisted"),
])
def test_objective_changing_frozen_and_unlisted_changes_are_refused(model, change, name, klass, words):
    r = _check(model, change)
    assert not r.passed
    refusal = _refused(r)[name]
    assert refusal.klass == klass and words in refusal.reason, refusal.reason


def test_unlisted_and_numeric_environment_is_refused():
    r = _check("glm-4.5", {}, env={"NVIDIA_TF32_OVERRIDE": "1", "MY_FLAG": "x", "NCCL_ALGO": "Tree"})
    ref = _refused(r)
    assert ref["NVIDIA_TF32_OVERRIDE"].klass == "numeric"
    assert ref["MY_FLAG"].klass == "unlisted"
    assert "NCCL_ALGO" not in ref


@pytest.mark.parametrize(("model", "change", "allowed", "words"), [
    # DeepEP passed its component test on GLM-4.5 and MiniMax-M2 (paper Section 3)
    ("glm-4.5", {"--moe-token-dispatcher-type": "flex", "--moe-flex-dispatcher-backend": "deepep"}, True, ""),
    ("minimax-m2", {"--optimizer-cpu-offload": None}, True, ""),
    # outside the listed values
    ("glm-4.5", {"--moe-token-dispatcher-type": "flex", "--moe-flex-dispatcher-backend": "hybridep"}, False,
     "outside its listed values"),
    ("glm-4.5", {"--moe-token-dispatcher-type": "allgather"}, False, "outside its listed values"),
    # failed component test (Table B1)
    ("glm-4.5", {"--moe-router-fusion": True}, False, "component test failed"),
    ("minimax-m2", {"--no-gradient-accumulation-fusion": True}, False, "component test failed"),
    # untested on this model
    ("mixtral-8x22b", {"--moe-token-dispatcher-type": "flex", "--moe-flex-dispatcher-backend": "deepep"}, False,
     "has not run"),
    ("llama31-405b", {"--cross-entropy-loss-fusion": None}, False, "has not run"),
])
def test_same_math_swaps_need_their_values_and_a_passed_component_test(model, change, allowed, words):
    r = _check(model, change)
    swaps = [c for c in r.changes if c.klass == "same_math"]
    assert swaps
    if allowed:
        assert r.passed, r.summary()
    else:
        assert not r.passed
        assert any(words in c.reason for c in swaps if not c.allowed), [c.reason for c in swaps]


def test_values_compare_after_normalisation_and_bare_flags():
    base = dict(GLM)
    cand = {**GLM, "--tensor-model-parallel-size": "2", "--sequence-parallel": "true", "--lr": "1e-05"}
    r = check_recipe(load_list("glm-4.5"), base, cand)
    assert r.passed and r.changes == []
    # a flag given explicitly at its declared default is not a change
    r = check_recipe(load_list("glm-4.5"), base, {**GLM, "--context-parallel-size": 1})
    assert r.changes == []


def test_unchanged_unlisted_flags_in_the_baseline_are_not_changes():
    base = {**GLM, "--some-model-specific-flag": 3}
    r = check_recipe(load_list("glm-4.5"), base, {**base, "--tensor-model-parallel-size": 4})
    assert r.passed
    r = check_recipe(load_list("glm-4.5"), base, {**base, "--some-model-specific-flag": 4})
    assert not r.passed and _refused(r)["--some-model-specific-flag"].klass == "unlisted"


def test_negated_flag_maps_to_the_attribute_it_clears():
    clist = load_list("glm-4.5").clist
    cfg, unlisted = recipe_to_config(clist, {"--no-gradient-accumulation-fusion": True, "--no-rope-fusion": True})
    assert cfg["gradient_accumulation_fusion"] is False and cfg["apply_rope_fusion"] is False
    assert not unlisted
    cfg, _ = recipe_to_config(clist, {})
    assert cfg["gradient_accumulation_fusion"] is True


def test_frozen_pin_violated_by_baseline_and_candidate_alike_is_refused():
    base = {**GLM, "--micro-batch-size": 4}
    r = check_recipe(load_list("glm-4.5"), base, {**base, "--tensor-model-parallel-size": 4})
    assert not r.passed
    assert _refused(r)["micro_batch_size"].klass == "frozen" and "candidate has 4" in _refused(r)["micro_batch_size"].reason


def test_bad_recipe_keys_are_rejected():
    with pytest.raises(ValueError, match="not a flag"):
        check_recipe(load_list("glm-4.5"), GLM, {"tensor_model_parallel_size": 2})


def test_apply_changes_removes_with_none_or_false():
    out = apply_changes({"--a": 1, "--b": True}, {"--a": None, "--b": False, "--c": 2})
    assert out == {"--c": 2}


def test_explain_argument():
    loaded = load_list("glm-4.5")
    e = config_check.explain_arg(loaded, "--moe-router-fusion")
    assert e["class"] == "same_math" and e["component_test"] == "failed" and e["defects"] == ["fused-routing"]
    assert config_check.explain_arg(loaded, "no-rope-fusion")["name"] == "apply_rope_fusion"
    assert config_check.explain_arg(loaded, "micro_batch_size")["value"] == 1
    assert config_check.explain_arg(loaded, "NCCL_IB_HCA")["pattern"] == "NCCL_*"
    assert config_check.explain_arg(loaded, "--warp-speed")["class"] == "unlisted"


# ------------------------------------------------------------------ known defects, one by one (Table B1)

DEFECT_CASES = [
    # model, defect id, change that triggers it, a near miss that does not
    ("mixtral-8x22b", "fused-routing", {"--moe-router-fusion": True}, {}),
    ("mixtral-8x22b", "grad-accum-fusion-off", {"--no-gradient-accumulation-fusion": True}, {}),
    ("mixtral-8x22b", "ep1-etp4", {"--expert-model-parallel-size": 1, "--expert-tensor-parallel-size": 8},
     {"--expert-model-parallel-size": 1, "--expert-tensor-parallel-size": 2}),
    ("mixtral-8x22b", "ep1-etp4", {"--expert-model-parallel-size": 1, "--expert-tensor-parallel-size": 4},
     {"--expert-model-parallel-size": 2, "--expert-tensor-parallel-size": 4}),
    ("mixtral-8x22b", "cp8-virtual-stages", {"--context-parallel-size": 8, "--num-layers-per-virtual-pipeline-stage": 1},
     {"--context-parallel-size": 8}),
    ("mixtral-8x22b", "cp8-virtual-stages", {"--context-parallel-size": 8, "--num-virtual-stages-per-pipeline-rank": 2},
     {"--context-parallel-size": 4, "--num-virtual-stages-per-pipeline-rank": 2}),
    ("glm-4.5", "fused-routing", {"--moe-router-fusion": True}, {}),
    ("glm-4.5", "grad-accum-fusion-off", {"--no-gradient-accumulation-fusion": True}, {}),
    ("glm-4.5", "ep1-etp4", {"--expert-model-parallel-size": 1, "--expert-tensor-parallel-size": 4},
     {"--expert-model-parallel-size": 1, "--expert-tensor-parallel-size": 2}),
    ("glm-4.5", "cp-above-4", {"--context-parallel-size": 8}, {"--context-parallel-size": 4}),
    ("glm-4.5", "pp32", {"--pipeline-model-parallel-size": 32}, {"--pipeline-model-parallel-size": 16}),
    ("minimax-m2", "fused-routing", {"--moe-router-fusion": True}, {}),
    ("minimax-m2", "grad-accum-fusion-off", {"--no-gradient-accumulation-fusion": True}, {}),
    ("minimax-m2", "ep1-etp4", {"--expert-model-parallel-size": 1, "--expert-tensor-parallel-size": 4},
     {"--expert-model-parallel-size": 4, "--expert-tensor-parallel-size": 4}),
    ("minimax-m2", "tp16", {"--tensor-model-parallel-size": 16}, {"--tensor-model-parallel-size": 8}),
    ("minimax-m2", "mbs-above-32", {"--micro-batch-size": 64}, {"--micro-batch-size": 32}),
]


@pytest.mark.parametrize(("model", "defect", "trigger", "near_miss"), DEFECT_CASES)
def test_each_known_defect_is_refused_and_its_near_miss_is_not(model, defect, trigger, near_miss):
    r = _check(model, trigger)
    assert not r.passed
    hit = {d.id: d for d in r.defects}
    assert defect in hit, r.summary()
    assert defect in _refused(r) and _refused(r)[defect].klass == "defect"
    assert "known stack defect" in _refused(r)[defect].reason
    miss = _check(model, near_miss)
    assert defect not in {d.id for d in miss.defects}


def test_every_listed_defect_has_a_case():
    covered = {(m, d) for m, d, _, _ in DEFECT_CASES}
    for model in ("mixtral-8x22b", "glm-4.5", "minimax-m2", "llama31-405b"):
        for d in load_list(model).clist.defects:
            assert (model, d.id) in covered, (model, d.id)


def test_defects_are_evaluated_on_the_resolved_configuration_too():
    """ETP is not given in the recipe (the framework resolves it): the resolved re-check still sees the defect."""
    loaded = load_list("glm-4.5")
    base = {"expert_model_parallel_size": 16, "expert_tensor_parallel_size": 1, "tensor_model_parallel_size": 2}
    cand = {"expert_model_parallel_size": 1, "expert_tensor_parallel_size": 4, "tensor_model_parallel_size": 4}
    r = check_resolved(loaded, base, cand)
    assert "ep1-etp4" in {d.id for d in r.defects}
    assert r.defects[0].values == {"expert_model_parallel_size": 1, "expert_tensor_parallel_size": 4}


def test_tinygpt_dense_list_refuses_a_moe_configuration():
    r = _check("tinygpt", {"--num-experts": 4})
    assert {"num_experts", "moe-needs-moe-list"} <= set(_refused(r))


# ------------------------------------------------------------------ the condition interpreter


def _cond(data):
    return CorrectnessList.model_validate({
        "schema_version": 1, "model": "m", "description": "d",
        "args": {"a": {"class": "structural", "why": "w"}, "b": {"class": "structural", "why": "w"}},
        "defects": [{"id": "x", "description": "d", "shows": "s", "source": "s", "when": data}],
    }).defects[0].when


@pytest.mark.parametrize(("cond", "args", "env", "expected"), [
    ({"arg": "a", "op": "eq", "value": 1}, {"a": "1"}, {}, True),
    ({"arg": "a", "op": "eq", "value": 1}, {}, {}, False),
    ({"arg": "a", "op": "ne", "value": 1}, {}, {}, False),
    ({"arg": "a", "op": "ne", "value": 1}, {"a": 2}, {}, True),
    ({"arg": "a", "op": "ge", "value": 4}, {"a": 4}, {}, True),
    ({"arg": "a", "op": "gt", "value": 4}, {"a": 4}, {}, False),
    ({"arg": "a", "op": "lt", "value": 4}, {"a": "3"}, {}, True),
    ({"arg": "a", "op": "le", "value": 4}, {"a": True}, {}, False),
    ({"arg": "a", "op": "gt", "value": 4}, {"a": "__import__('os').system('false')"}, {}, False),
    ({"arg": "a", "op": "in", "value": ["x", "y"]}, {"a": "y"}, {}, True),
    ({"arg": "a", "op": "not_in", "value": ["x", "y"]}, {"a": "z"}, {}, True),
    ({"arg": "a", "op": "set"}, {"a": False}, {}, False),
    ({"arg": "a", "op": "set"}, {"a": 0}, {}, True),
    ({"arg": "a", "op": "unset"}, {"a": None}, {}, True),
    ({"env": "E", "op": "eq", "value": "1"}, {}, {"E": "1"}, True),
    ({"all": [{"arg": "a", "op": "eq", "value": 1}, {"arg": "b", "op": "ge", "value": 4}]}, {"a": 1, "b": 8}, {}, True),
    ({"all": [{"arg": "a", "op": "eq", "value": 1}, {"arg": "b", "op": "ge", "value": 4}]}, {"a": 1, "b": 2}, {}, False),
    ({"any": [{"arg": "a", "op": "eq", "value": 1}, {"arg": "b", "op": "eq", "value": 1}]}, {"b": 1}, {}, True),
    ({"not": {"arg": "a", "op": "eq", "value": 1}}, {"a": 2}, {}, True),
])
def test_condition_interpreter(cond, args, env, expected):
    assert conditions.evaluate(_cond(cond), args, env) is expected


def test_condition_descriptions_and_explanations():
    c = _cond({"all": [{"arg": "a", "op": "eq", "value": 1}, {"any": [{"arg": "b", "op": "set"},
                                                                       {"env": "E", "op": "ne", "value": "0"}]}]})
    assert isinstance(c, AllCondition)
    assert conditions.describe(c) == "a == 1 and (b is set or env E != '0')"
    info = conditions.explain(c, {"a": 1}, {"E": "1"})
    assert info["values"] == {"a": 1} and info["not_in_configuration"] == ["b"] and info["env"] == {"E": "1"}


# ------------------------------------------------------------------ the resolved-argument re-check


def _naive_list(tmp_path):
    """The generic list as a careless author might write it: --grad-reduce-in-bf16 as 'structural'."""
    text = (lists.LISTS_DIR / "megatron.yaml").read_text()
    old = "grad_reduce_in_bf16: {class: numeric,"
    assert old in text
    p = tmp_path / "naive.yaml"
    p.write_text(text.replace(old, "grad_reduce_in_bf16: {class: structural,"))
    return load_list(p)


RESOLVED_BASE = {
    "tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 8, "bf16": True, "grad_reduce_in_bf16": False,
    "accumulate_allreduce_grads_in_fp32": True, "main_grads_dtype": "torch.float32", "params_dtype": "torch.bfloat16",
    "micro_batch_size": 1, "global_batch_size": 256, "lr": 1e-05, "recompute_modules": "['core_attn']",
    "data_parallel_size": 8, "save": "/ckpt/run-1",
}


def test_resolved_recheck_catches_a_flag_that_silently_changes_another(tmp_path):
    naive = _naive_list(tmp_path)
    base = {"--tensor-model-parallel-size": 2, "--bf16": True}
    cand = {**base, "--grad-reduce-in-bf16": True}
    # the recipe-level dry run, with the careless list, lets it through ...
    assert check_recipe(naive, base, cand).passed
    # ... the check run's resolved arguments show what the flag did
    cand_resolved = {**RESOLVED_BASE, "grad_reduce_in_bf16": True, "accumulate_allreduce_grads_in_fp32": False,
                     "save": "/ckpt/run-2"}
    base_log = tmp_path / "base.log"
    cand_log = tmp_path / "cand.log"
    base_log.write_text(megatron_log(RESOLVED_BASE, {1: 10.0, 2: 9.0}, prefix="[rank0]: "))
    cand_log.write_text(megatron_log(cand_resolved, {1: 10.0, 2: 9.0}, prefix="[rank0]: "))
    r = check_resolved(naive, read_resolved_args(base_log, "megatron-lm"), read_resolved_args(cand_log, "megatron-lm"))
    assert not r.passed
    ref = _refused(r)
    assert set(ref) == {"accumulate_allreduce_grads_in_fp32"}
    assert ref["accumulate_allreduce_grads_in_fp32"].klass == "numeric"
    # the changed bookkeeping path is seen and allowed
    assert {c.name: c.allowed for c in r.changes}["save"] is True


def test_resolved_recheck_sees_derived_and_unlisted_attributes():
    loaded = load_list("megatron")
    cand = {**RESOLVED_BASE, "params_dtype": "torch.float16", "brand_new_attribute": 3, "data_parallel_size": 16,
            "tensor_model_parallel_size": 1}
    r = check_resolved(loaded, RESOLVED_BASE, cand)
    ref = _refused(r)
    assert ref["params_dtype"].klass == "numeric"
    assert ref["brand_new_attribute"].klass == "unlisted"
    assert "data_parallel_size" not in ref and "tensor_model_parallel_size" not in ref


def test_resolved_recheck_checks_frozen_pins_and_environment():
    loaded = load_list("glm-4.5")
    base = {"micro_batch_size": 1, "tp_comm_overlap": False, "seq_length": 4096}
    r = check_resolved(loaded, base, dict(base), {"NCCL_ALGO": "Ring"}, {"NCCL_ALGO": "Tree", "NVTE_FUSED_ATTN": "0"})
    ref = _refused(r)
    assert ref["NVTE_FUSED_ATTN"].klass == "same_math" and "has not run" in ref["NVTE_FUSED_ATTN"].reason
    assert "NCCL_ALGO" not in ref
    # in a resolved configuration, a pinned attribute that is missing is a violation (absent means unset)
    r = check_resolved(loaded, {"seq_length": 4096}, {"seq_length": 4096})
    assert "micro_batch_size" in _refused(r)


def test_resolved_values_print_forms_compare_equal():
    loaded = load_list("megatron")
    a = {"recompute_modules": "['core_attn']", "lr": "1e-05", "bf16": "True", "save": "None"}
    b = {"recompute_modules": ["core_attn"], "lr": 0.00001, "bf16": True, "save": None}
    assert check_resolved(loaded, a, b).changes == []


def test_same_check_catches_eval_model_baselines_unchanged():
    for model, base in (("llama31-405b", LLAMA), ("mixtral-8x22b", MIXTRAL), ("minimax-m2", MINIMAX),
                        ("tinygpt", TINYGPT)):
        assert check_recipe(load_list(model), base, dict(base)).passed


def test_pins_that_are_off_hold_when_the_attribute_is_absent():
    loaded = load_list("glm-4.5")
    r = check_resolved(loaded, {"micro_batch_size": 1, "world_size": 128, "seq_length": 4096},
                       {"micro_batch_size": 1, "world_size": 128, "seq_length": 4096})
    assert r.passed, r.summary()  # tp_comm_overlap and use_precision_aware_optimizer are pinned off
    r = check_resolved(loaded, {"micro_batch_size": 1, "world_size": 128, "seq_length": 4096},
                       {"micro_batch_size": 1, "world_size": 128, "seq_length": 4096, "tp_comm_overlap": True})
    assert _refused(r)["tp_comm_overlap"].klass == "frozen"


def test_conditions_read_printed_values_from_a_resolved_block():
    c = _cond({"arg": "a", "op": "set"})
    assert conditions.evaluate(c, {"a": "None"}, {}) is False
    assert conditions.evaluate(c, {"a": "False"}, {}) is False
    assert conditions.evaluate(c, {"a": "4"}, {}) is True
    assert conditions.evaluate(_cond({"arg": "a", "op": "ge", "value": 4}), {"a": "8"}, {}) is True
