from __future__ import annotations

import itertools
import json

import pytest

from attune.knowledge.layouts import (
    LayoutError,
    LayoutOptions,
    ModelDims,
    enumerate_layouts,
    find_model,
    layout_from_degrees,
    load_models,
    pipeline_split,
)
from tests.skill_helpers import run_script


def dense(layers: int = 8, heads: int = 8, groups: int | None = None) -> ModelDims:
    return ModelDims(name="t", layers=layers, hidden=64 * heads, heads=heads, query_groups=groups or heads,
                     ffn=256 * heads, vocab=1000, seq_length=4096)


def triples(n: int) -> set[tuple[int, ...]]:
    """Ordered factorizations of n into three factors, by brute force."""
    return {(a, b, c) for a, b, c in itertools.product(range(1, n + 1), repeat=3) if a * b * c == n}


def test_eight_gpus_dense_has_ten_tp_pp_dp_layouts() -> None:
    # 8 = 2^3 into (TP, PP, DP): C(3 + 2, 2) = 10 ordered factorizations
    reps = enumerate_layouts(dense(), LayoutOptions(gpus=8, gpus_per_node=8, allowed={"cp": {1}}, max_vp=1))
    got = {(r.layout.tp, r.layout.pp, r.layout.dp) for r in reps}
    assert len(reps) == 10 and got == triples(8)
    assert all(r.layout.ep is None and r.layout.edp is None for r in reps)


def test_eight_gpus_dense_with_cp_has_twenty() -> None:
    # (TP, PP, CP, DP): C(3 + 3, 3) = 20
    reps = enumerate_layouts(dense(), LayoutOptions(gpus=8, gpus_per_node=8, max_vp=1))
    assert len(reps) == 20
    assert {(r.layout.tp, r.layout.pp, r.layout.cp, r.layout.dp) for r in reps} == {
        q for q in itertools.product((1, 2, 4, 8), repeat=4) if q[0] * q[1] * q[2] * q[3] == 8
    }


def test_heads_and_groups_limit_tp() -> None:
    # 12 heads, 4 query groups: TP in {1, 2, 4}; then PP x DP = 8, 4, 2 -> 4 + 3 + 2 = 9
    reps = enumerate_layouts(dense(heads=12, groups=4), LayoutOptions(gpus=8, gpus_per_node=8, allowed={"cp": {1}},
                                                                      max_vp=1))
    assert len(reps) == 9 and max(r.layout.tp for r in reps) == 4


def test_tp_stays_in_a_node_unless_allowed() -> None:
    m = dense(layers=16, heads=16)
    inside = enumerate_layouts(m, LayoutOptions(gpus=16, gpus_per_node=4, allowed={"cp": {1}, "pp": {1}}))
    assert sorted(r.layout.tp for r in inside) == [1, 2, 4]
    across = enumerate_layouts(m, LayoutOptions(gpus=16, gpus_per_node=4, tp_within_node=False,
                                                allowed={"cp": {1}, "pp": {1}}))
    assert sorted(r.layout.tp for r in across) == [1, 2, 4, 8, 16]
    assert {r.layout.tp: r.tp_in_node for r in across} == {1: True, 2: True, 4: True, 8: False, 16: False}


def test_virtual_stages_need_divisible_stages() -> None:
    # 8 layers on 4 GPUs, CP 1: PP 1 (VP 1), PP 2 (4 per stage: VP 1, 2, 4), PP 4 (2 per stage: VP 1, 2)
    reps = enumerate_layouts(dense(), LayoutOptions(gpus=4, gpus_per_node=4, allowed={"cp": {1}, "tp": {1}}))
    assert sorted((r.layout.pp, r.layout.vp) for r in reps) == [(1, 1), (2, 1), (2, 2), (2, 4), (4, 1), (4, 2)]
    notes = {(r.layout.pp, r.layout.vp): r.notes for r in reps}
    assert any("overlap-p2p-comm" in n for n in notes[(2, 2)]) and not notes[(4, 2)]


def test_cp_needs_sequence_divisible_by_twice_cp() -> None:
    m = dense()
    reps = enumerate_layouts(m, LayoutOptions(gpus=8, gpus_per_node=8, seq_length=12, max_vp=1,
                                              allowed={"tp": {1}, "pp": {1}}))
    assert sorted(r.layout.cp for r in reps) == [1, 2]  # 12 % 4 == 0, 12 % 8 != 0, 12 % 16 != 0


def test_global_batch_must_divide_by_micro_batch_times_dp() -> None:
    reps = enumerate_layouts(dense(), LayoutOptions(gpus=8, gpus_per_node=8, global_batch=12, micro_batch=1,
                                                    max_vp=1, allowed={"cp": {1}}))
    assert {r.layout.dp for r in reps} == {1, 2, 4}  # 12 is not divisible by 8
    assert all(r.num_microbatches == 12 // r.layout.dp for r in reps)


def test_moe_expert_layouts_by_hand() -> None:
    m = ModelDims(name="moe", layers=4, hidden=256, heads=8, ffn=None, vocab=1000, experts=8, topk=2, moe_ffn=64,
                  seq_length=256)
    reps = enumerate_layouts(m, LayoutOptions(gpus=8, gpus_per_node=8, max_vp=1,
                                              allowed={"tp": {1}, "pp": {1}, "cp": {1}}))
    # TP x CP x DP = 8 ranks; (ETP, EP) with ETP x EP | 8, EP | 8 experts, ETP | 64
    expected = {(etp, ep) for etp in (1, 2, 4, 8) for ep in (1, 2, 4, 8) if 8 % (etp * ep) == 0}
    assert len(expected) == 10
    assert {(r.layout.etp, r.layout.ep) for r in reps} == expected
    for r in reps:
        lay = r.layout
        assert lay.etp * lay.ep * lay.edp == lay.tp * lay.cp * lay.dp


def test_moe_experts_must_divide_by_ep() -> None:
    m = ModelDims(name="moe6", layers=4, hidden=256, heads=8, vocab=1000, experts=6, topk=2, moe_ffn=64)
    reps = enumerate_layouts(m, LayoutOptions(gpus=8, gpus_per_node=8, max_vp=1, allowed={"pp": {1}, "cp": {1}}))
    assert {r.layout.ep for r in reps} == {1, 2}
    in_node = enumerate_layouts(m, LayoutOptions(gpus=16, gpus_per_node=8, ep_within_node=True, max_vp=1,
                                                 allowed={"pp": {1}, "cp": {1}, "tp": {1}}))
    assert all(r.layout.etp * r.layout.ep <= 8 for r in in_node) and {r.layout.etp for r in in_node} == {1, 2, 4, 8}


@pytest.mark.parametrize(
    ("name", "gpus"), [("glm-4.5", 128), ("minimax-m2", 64), ("llama-3.1-405b", 128), ("qwen3-30b-a3b", 16)]
)
def test_every_listed_layout_satisfies_the_rules(name: str, gpus: int) -> None:
    m = find_model(name)
    reps = enumerate_layouts(m, LayoutOptions(gpus=gpus, gpus_per_node=8, max_vp=4))
    assert reps
    for r in reps:
        lay = r.layout
        assert lay.tp * lay.pp * lay.cp * lay.dp == gpus
        assert m.heads % lay.tp == 0 and m.groups % lay.tp == 0 and lay.tp <= 8
        assert m.seq_length % (2 * lay.cp) == 0 or lay.cp == 1
        assert sum(lay.split.per_stage) == m.layers and len(lay.split.per_stage) == lay.pp
        slots = list(lay.split.per_stage)
        if lay.split.kind == "accounted":  # the embedding and the loss take one slot each
            slots[0] += 1
            slots[-1] += 1
        assert all(n % lay.vp == 0 and n > 0 for n in slots)
        if m.is_moe:
            assert m.experts % lay.ep == 0 and m.moe_ffn % lay.etp == 0
            assert lay.etp * lay.ep * lay.edp == lay.tp * lay.cp * lay.dp


def test_public_recipes_are_in_the_lists() -> None:
    glm = find_model("glm-4.5")
    reps = enumerate_layouts(glm, LayoutOptions(gpus=128, gpus_per_node=8, global_batch=2048, max_vp=1))
    base = [r for r in reps if (r.layout.tp, r.layout.pp, r.layout.ep, r.layout.etp, r.layout.cp) == (2, 8, 16, 1, 1)]
    assert len(base) == 1 and base[0].layout.split.per_stage == (10,) + (12,) * 6 + (10,)
    assert base[0].ep_in_node is False and base[0].num_microbatches == 256
    llama = find_model("llama-3.1-405b")
    reps = enumerate_layouts(llama, LayoutOptions(gpus=128, gpus_per_node=8, global_batch=64,
                                                  allowed={"tp": {4}, "pp": {8}, "cp": {2}, "vp": {8}}))
    assert len(reps) == 1 and reps[0].layout.split.kind == "accounted" and reps[0].layout.dp == 2


def test_pipeline_splits_by_hand() -> None:
    assert pipeline_split(92, 8).per_stage == (10,) + (12,) * 6 + (10,)
    assert pipeline_split(92, 16).per_stage == (4,) + (6,) * 14 + (4,)
    assert pipeline_split(92, 16, 2).per_stage == (4,) + (6,) * 14 + (4,)
    acc = pipeline_split(126, 8, 8)  # 126 + 2 = 128 = 8 x 8 x 2
    assert acc.kind == "accounted" and acc.per_stage == (15,) + (16,) * 6 + (15,)
    assert acc.flags() == ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"]
    explicit = pipeline_split(126, 8, 2, first=16, last=14)
    assert explicit.per_stage == (16,) + (16,) * 6 + (14,) and explicit.kind == "uneven"
    assert pipeline_split(62, 8, first=7, last=7).per_stage == (7,) + (8,) * 6 + (7,)
    assert pipeline_split(62, 2).per_stage == (31, 31)
    assert pipeline_split(7, 2, 2) is None  # no split of 7 layers into chunks of 2
    assert pipeline_split(12, 4, first=3, last=4) is None  # 5 layers do not split over 2 stages


def test_layout_from_degrees_names_what_is_wrong() -> None:
    glm = find_model("glm-4.5")
    with pytest.raises(LayoutError, match="EP 3 must divide the routed experts"):
        layout_from_degrees(glm, 96, tp=2, pp=4, ep=3)
    with pytest.raises(LayoutError, match="TP 16 must divide"):
        layout_from_degrees(glm, 128, tp=16)
    with pytest.raises(LayoutError, match="ETP x EP"):
        layout_from_degrees(glm, 128, tp=2, pp=8, ep=32, etp=1)
    lay = layout_from_degrees(glm, 128, tp=2, pp=8, ep=16)
    assert (lay.dp, lay.edp, lay.etp) == (8, 1, 1)
    tiny = find_model("tinygpt")
    with pytest.raises(LayoutError, match="data parallelism only"):
        layout_from_degrees(tiny, 2, tp=2)
    assert [(r.layout.tp, r.layout.pp, r.layout.cp, r.layout.dp)
            for r in enumerate_layouts(tiny, LayoutOptions(gpus=4, gpus_per_node=4))] == [(1, 1, 1, 4)]


# Parameter counts computed in models-and-hardware.md section 1c (total, active), in billions.
PUBLISHED = {
    "llama-3.1-405b": (405.85, 405.85),
    "mixtral-8x22b": (140.62, 39.15),
    "glm-4.5": (352.80, 33.63),
    "minimax-m2": (228.69, 11.03),
    "qwen3-30b-a3b": (30.53, 3.35),
    "gpt-oss-120b": (116.83, 5.71),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_model_shapes_reproduce_the_reference_parameter_counts(name: str) -> None:
    m = find_model(name)
    total, active = PUBLISHED[name]
    assert m.total_params() / 1e9 == pytest.approx(total, rel=2e-3)
    assert m.active_params() / 1e9 == pytest.approx(active, rel=2e-3)


def test_models_file_has_the_paper_models_and_tinygpt() -> None:
    names = {m.name for m in load_models().values()}
    assert {"llama-3.1-405b", "mixtral-8x22b", "glm-4.5", "minimax-m2", "tinygpt"} <= names


def test_layouts_script_json_without_heavy_packages() -> None:
    res = run_script("layouts.py", "--model", "glm-4.5", "--gpus", "128", "--global-batch", "2048",
                     "--tp", "2", "--pp", "8", "--cp", "1", "--max-vp", "1", "--ep-within-node", "--memory",
                     "--accelerator", "b200", "--limit", "0", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["model"]["name"] == "glm-4.5" and out["count"] == out["shown"] == len(out["layouts"]) > 0
    for lay in out["layouts"]:
        assert lay["etp"] * lay["ep"] <= 8 and lay["ep_in_node"] is True
        assert set(lay["memory"]) == {"peak_gib", "peak_stage", "fits"}
        assert lay["split"]["kind"] == "uneven" and lay["split"]["flags"]


def test_layouts_script_text_and_bad_input() -> None:
    res = run_script("layouts.py", "--layers", "8", "--hidden", "512", "--heads", "8", "--gpus", "8",
                     "--cp", "1", "--max-vp", "1")
    assert res.returncode == 0, res.stderr
    assert "10 feasible layout(s)" in res.stdout
    bad = run_script("layouts.py", "--model", "glm-4.5", "--gpus", "12", "--gpus-per-node", "8", "--json")
    assert bad.returncode == 2 and "multiple of gpus_per_node" in bad.stderr
    assert json.loads(bad.stdout)["ok"] is False
    unknown = run_script("layouts.py", "--model", "no-such-model", "--gpus", "8")
    assert unknown.returncode == 2 and "unknown model" in unknown.stderr
    missing = run_script("layouts.py", "--gpus", "8", "--layers", "4")
    assert missing.returncode == 2 and "--hidden" in missing.stderr
