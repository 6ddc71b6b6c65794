"""The correctness lists: schema sync, every built-in list valid, model facts, hash pinning."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jsonschema
import pytest
import yaml
from pydantic import ValidationError

from gate import lists
from gate.lists import CorrectnessList, ListError, list_sha256, load_list

MODELS = ["glm-4.5", "llama31-405b", "megatron", "minimax-m2", "mixtral-8x22b", "tinygpt", "tinygpt-moe"]


def _raw(model: str) -> dict:
    return yaml.safe_load((lists.LISTS_DIR / f"{model}.yaml").read_text())


def test_schema_file_is_generated_from_the_model():
    on_disk = json.loads(lists.SCHEMA_PATH.read_text())
    assert on_disk == json.loads(json.dumps(lists.json_schema())), "regenerate with: python -m gate.lists"


def test_builtin_models_are_the_expected_ones():
    assert lists.builtin_models() == sorted(MODELS)


@pytest.mark.parametrize("model", MODELS)
def test_each_list_matches_the_json_schema_and_the_model(model):
    schema = json.loads(lists.SCHEMA_PATH.read_text())
    data = _raw(model)
    jsonschema.Draft202012Validator(schema).validate(data)
    loaded = load_list(model)
    assert loaded.clist.model == model
    assert loaded.sha256 == list_sha256(loaded.path)


@pytest.mark.parametrize("model", MODELS)
def test_schema_and_pydantic_agree_on_a_broken_list(model):
    """A list the JSON Schema rejects is also rejected by the loader, and vice versa."""
    schema = json.loads(lists.SCHEMA_PATH.read_text())
    data = _raw(model)
    name = next(iter(data["args"]))
    data["args"][name] = {"class": "frozen", "why": "no value"}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(schema).validate(data)
    with pytest.raises(ValidationError):
        CorrectnessList.model_validate(data)


# Classes from shared/reference/megatron.md, as flags: the generic list must agree.
STRUCTURAL = ["--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank", "--pipeline-model-parallel-layout", "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers", "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split", "--context-parallel-size", "--cp-comm-type", "--expert-model-parallel-size", "--expert-tensor-parallel-size", "--sequence-parallel", "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather", "--ddp-bucket-size", "--recompute-granularity", "--recompute-method", "--recompute-num-layers", "--recompute-modules", "--distribute-saved-activations", "--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute", "--moe-shared-expert-overlap", "--manual-gc", "--manual-gc-interval", "--cuda-graph-impl", "--cuda-graph-scope"]
SAME_MATH = ["--moe-token-dispatcher-type", "--moe-flex-dispatcher-backend", "--moe-deepep-num-sms", "--moe-grouped-gemm", "--moe-permute-fusion", "--moe-router-fusion", "--cross-entropy-loss-fusion", "--no-gradient-accumulation-fusion", "--optimizer-cpu-offload", "--optimizer-offload-fraction", "--tp-comm-overlap"]
NUMERIC = ["--micro-batch-size", "--global-batch-size", "--lr", "--min-lr", "--bf16", "--fp16", "--grad-reduce-in-bf16", "--accumulate-allreduce-grads-in-fp32", "--calculate-per-token-loss", "--moe-aux-loss-coeff", "--moe-z-loss-coeff", "--moe-expert-capacity-factor", "--moe-router-topk", "--moe-router-dtype", "--moe-router-force-load-balancing", "--seq-length", "--seed", "--data-path", "--tokenizer-type"]


@pytest.mark.parametrize(("flags", "klass"), [(STRUCTURAL, "structural"), (SAME_MATH, "same_math"),
                                              (NUMERIC, "numeric")])
def test_generic_list_classes_match_the_reference(flags, klass):
    clist = load_list("megatron").clist
    for flag in flags:
        dest = clist.flag_index.get(flag)
        assert dest is not None, f"{flag} missing from the generic list"
        assert clist.args[dest].klass == klass, f"{flag}: {clist.args[dest].klass} != {klass}"


def test_generic_list_has_no_tested_swaps_and_no_pins():
    clist = load_list("megatron").clist
    for dest, e in clist.args.items():
        assert e.klass != "frozen", dest
        if e.klass == "same_math":
            assert e.component_test == "untested", dest


def test_negated_flags_map_to_their_attribute():
    clist = load_list("megatron").clist
    assert clist.flag_index["--no-gradient-accumulation-fusion"] == "gradient_accumulation_fusion"
    assert clist.flag_index["--no-rope-fusion"] == "apply_rope_fusion"
    assert clist.flag_index["--disable-bias-linear"] == "add_bias_linear"
    assert clist.args["gradient_accumulation_fusion"].negated
    # a derived attribute has no flag at all
    assert "params_dtype" in clist.args and clist.args["params_dtype"].derived
    assert "params_dtype" not in clist.flag_index.values()


# Appendix B: the frozen settings and Table B1's defects, per evaluation model.
EXPECTED_DEFECTS = {
    "mixtral-8x22b": {"fused-routing", "grad-accum-fusion-off", "ep1-etp4", "cp8-virtual-stages"},
    "glm-4.5": {"fused-routing", "grad-accum-fusion-off", "ep1-etp4", "cp-above-4", "pp32"},
    "minimax-m2": {"fused-routing", "grad-accum-fusion-off", "ep1-etp4", "tp16", "mbs-above-32"},
    "llama31-405b": set(),
}
EXPECTED_FROZEN = {
    "mixtral-8x22b": {"micro_batch_size": 1, "seq_length": 4096, "world_size": 128},
    "glm-4.5": {"micro_batch_size": 1, "tp_comm_overlap": False, "seq_length": 4096, "world_size": 128},
    "llama31-405b": {"fp8": "hybrid", "fp8_recipe": "tensorwise", "tp_comm_overlap": True, "seq_length": 8192},
    "minimax-m2": {"moe_router_load_balancing_type": "none", "moe_aux_loss_coeff": 0.0, "lr_decay_style": "constant",
                   "seq_length": 8192, "world_size": 64},
}


@pytest.mark.parametrize("model", sorted(EXPECTED_DEFECTS))
def test_evaluation_models_carry_table_b1_and_their_pins(model):
    clist = load_list(model).clist
    assert {d.id for d in clist.defects} == EXPECTED_DEFECTS[model]
    for dest, value in EXPECTED_FROZEN[model].items():
        e = clist.args[dest]
        assert e.klass == "frozen" and e.value == value, (model, dest)
    if model != "llama31-405b":
        assert clist.args["moe_router_fusion"].component_test == "failed"
        assert clist.args["gradient_accumulation_fusion"].component_test == "failed"


def test_microbatch_is_structural_where_no_loss_is_per_microbatch():
    assert load_list("minimax-m2").clist.args["micro_batch_size"].klass == "structural"
    assert load_list("llama31-405b").clist.args["micro_batch_size"].klass == "structural"
    assert load_list("megatron").clist.args["micro_batch_size"].klass == "numeric"


# ---------------------------------------------------------------- malformed lists


def _minimal() -> dict:
    return {
        "schema_version": 1, "model": "m", "description": "d",
        "args": {"tensor_model_parallel_size": {"class": "structural", "why": "w"},
                 "lr": {"class": "numeric", "why": "w"}},
    }


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda d: d["args"].update(x={"class": "sideways", "why": "w"}), "class"),
    (lambda d: d["args"].update(x={"class": "frozen", "why": "w"}), "value"),
    (lambda d: d["args"].update(x={"class": "same_math", "why": "w", "values": [1]}), "component_test"),
    (lambda d: d["args"].update(x={"class": "same_math", "why": "w", "values": [], "component_test": "passed"}),
     "values"),
    (lambda d: d["args"].update(x={"class": "structural", "why": "w", "colour": "red"}), "colour"),
    (lambda d: d["args"].update(x={"class": "structural", "why": ""}), "why"),
    (lambda d: d["args"].update(BadName={"class": "structural", "why": "w"}), "lower_snake_case"),
    (lambda d: d["args"].update(tp={"class": "structural", "why": "w", "flag": "--tensor-model-parallel-size"}),
     "also the flag"),
    (lambda d: d["args"].update(x={"class": "structural", "why": "w", "flag": "-x"}), "flag"),
    (lambda d: d["args"].update(x={"class": "same_math", "why": "w", "values": [1], "component_test": "passed",
                                   "default": 2}), "one of its values"),
    (lambda d: d.update(defects=[{"id": "a", "description": "d", "shows": "s", "source": "s",
                                  "when": {"arg": "nope", "op": "eq", "value": 1}}]), "unlisted argument"),
    (lambda d: d.update(defects=[{"id": "a", "description": "d", "shows": "s", "source": "s",
                                  "when": {"arg": "lr", "op": "gt", "value": "big"}}]), "number"),
    (lambda d: d.update(defects=[{"id": "a", "description": "d", "shows": "s", "source": "s",
                                  "when": {"arg": "lr", "op": "in", "value": 1}}]), "list"),
    (lambda d: d.update(defects=[{"id": "a", "description": "d", "shows": "s", "source": "s",
                                  "when": {"arg": "lr", "op": "set", "value": 1}}]), "no value"),
    (lambda d: d.update(defects=[{"id": "a", "description": "d", "shows": "s", "source": "s",
                                  "when": {"arg": "lr", "op": "eq"}}]), "needs a value"),
    (lambda d: d.update(defects=[{"id": "a", "description": "d", "shows": "s", "source": "s",
                                  "when": {"arg": "lr", "op": "eq", "value": 1}}] * 2), "duplicate id"),
    (lambda d: d.update(defects=[{"id": "a", "description": "d", "shows": "s", "source": "s",
                                  "when": "lr > 1"}]), "when"),
    (lambda d: d.update(schema_version=2), "schema_version"),
])
def test_malformed_lists_are_refused_with_the_field_named(mutate, message):
    d = _minimal()
    CorrectnessList.model_validate(copy.deepcopy(d))  # the minimal list itself is valid
    mutate(d)
    with pytest.raises(ValidationError) as info:
        CorrectnessList.model_validate(d)
    assert message in str(info.value)


# ---------------------------------------------------------------- hash pinning


def test_pinned_hash_accepts_the_same_list_and_refuses_a_changed_one(tmp_path: Path):
    src = lists.LISTS_DIR / "glm-4.5.yaml"
    pinned = list_sha256(src)
    assert load_list("glm-4.5", expected_sha256=pinned).sha256 == pinned
    assert load_list("glm-4.5", expected_sha256=pinned.upper()).sha256 == pinned

    copy_path = tmp_path / "glm.yaml"
    copy_path.write_bytes(src.read_bytes())
    assert load_list(copy_path, expected_sha256=pinned).clist.model == "glm-4.5"

    # an edit that loosens the list (micro batch no longer frozen) changes the hash: refused
    text = src.read_text().replace("micro_batch_size: {class: frozen, value: 1,", "micro_batch_size: {class: structural,")
    assert text != src.read_text()
    copy_path.write_text(text)
    with pytest.raises(ListError) as info:
        load_list(copy_path, expected_sha256=pinned)
    assert pinned in str(info.value) and list_sha256(copy_path) in str(info.value)
    assert "refusing" in str(info.value)
    # without a pin the edited list still loads (it is a valid list)
    assert load_list(copy_path).clist.args["micro_batch_size"].klass == "structural"


def test_unknown_model_and_bad_yaml_are_clear_errors(tmp_path: Path):
    with pytest.raises(ListError, match="no correctness list for model 'gpt-5'"):
        load_list("gpt-5")
    bad = tmp_path / "bad.yaml"
    bad.write_text("args: [unclosed\n")
    with pytest.raises(ListError, match="not valid YAML"):
        load_list(bad)
    bad.write_text("schema_version: 1\nmodel: x\n")
    with pytest.raises(ListError, match="does not match the schema"):
        load_list(bad)
