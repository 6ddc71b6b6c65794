"""The memory estimate against numbers computed by hand from the documented formulas."""

from __future__ import annotations

import json

import pytest

from attune.knowledge.layouts import LayoutError, ModelDims, find_model, layout_from_degrees
from attune.knowledge.memory_estimate import GIB, MemoryOptions, accelerator_gib, estimate, in_flight
from tests.skill_helpers import run_script

# A small dense model: 4 layers, hidden 1024, 16 heads (no grouping), two-matrix MLP of 4096,
# RMSNorm, vocab 32000 (already a multiple of 128 x TP for TP 2), untied embeddings.
DENSE = ModelDims(name="d", layers=4, hidden=1024, heads=16, ffn=4096, vocab=32000, gated_mlp=False)
H, F, V, S = 1024, 4096, 32000, 2048


def layer_params() -> int:
    attention = H * (H + 2 * H) + H * H  # QKV and output projection
    norms = 2 * H
    mlp = 2 * H * F
    return attention + norms + mlp


def test_dense_tp2_pp2_by_hand() -> None:
    lay = layout_from_degrees(DENSE, 8, tp=2, pp=2)  # DP = 2
    est = estimate(DENSE, lay, MemoryOptions(seq_length=S, micro_batch=1, num_microbatches=8, margin=0.1,
                                             gpu_memory_gib=80.0))
    assert layer_params() == 12_584_960
    bytes_per_param = 6 + 12 / 2  # distributed optimizer over DP x CP = 2
    embedding = V * H / 2  # padded vocab x hidden / TP
    stage0_params = 2 * layer_params() / 2 + embedding
    stage1_params = 2 * layer_params() / 2 + H + embedding  # + final norm + output layer
    tokens_h = S * 1 * H
    k = (18 + 4 * F / H) / 2  # sequence parallelism at TP 2 shards all of it
    per_layer = k * tokens_h
    stage0 = stage0_params * bytes_per_param + 2 * per_layer * 2  # 2 layers, 2 microbatches in flight
    logits = S * 1 * V / 2 * 4
    stage1 = stage1_params * bytes_per_param + 2 * per_layer * 1 + logits
    s0, s1 = est.stages
    assert s0.params == pytest.approx(28_968_960) and s0.total_bytes == pytest.approx(stage0)
    assert s1.total_bytes == pytest.approx(stage1) and s1.logits_bytes == pytest.approx(131_072_000)
    assert stage0 == pytest.approx(490_233_856) and stage1 == pytest.approx(550_014_976)
    assert s1.with_margin_bytes == pytest.approx(stage1 * 1.1)
    assert est.peak.stage == 1 and est.fits is True
    d = est.as_dict()
    assert d["peak_stage"] == 1 and d["stages"][1]["total_gib"] == pytest.approx(stage1 / GIB, abs=1e-3)


def test_no_distributed_optimizer_is_eighteen_bytes() -> None:
    lay = layout_from_degrees(DENSE, 8, tp=2, pp=2)
    with_do = estimate(DENSE, lay, MemoryOptions(seq_length=S))
    without = estimate(DENSE, lay, MemoryOptions(seq_length=S, distributed_optimizer=False))
    assert without.stages[0].weights_bytes == pytest.approx(with_do.stages[0].params * 18)
    assert with_do.stages[0].weights_bytes == pytest.approx(with_do.stages[0].params * 12)
    offload = estimate(DENSE, lay, MemoryOptions(seq_length=S, optimizer_offload_fraction=1.0))
    assert offload.stages[0].weights_bytes == pytest.approx(offload.stages[0].params * 6)


def test_without_sequence_parallelism_ten_stays_replicated() -> None:
    lay = layout_from_degrees(DENSE, 8, tp=2, pp=2)
    est = estimate(DENSE, lay, MemoryOptions(seq_length=S, sequence_parallel=False))
    k = 10 + (8 + 4 * F / H) / 2  # megatron.md's 10 + 24/TP for f = 4h
    assert k == 10 + 24 / 2
    assert est.stages[1].activation_bytes == pytest.approx(2 * k * S * H)


def test_full_recompute_keeps_layer_inputs_plus_one_working_layer() -> None:
    lay = layout_from_degrees(DENSE, 8, tp=2, pp=2)
    est = estimate(DENSE, lay, MemoryOptions(seq_length=S, recompute="full", recompute_num_layers=1,
                                             num_microbatches=8))
    tokens_h = S * H
    inputs = 2 * tokens_h / 2  # BF16 input of each layer, sharded by sequence parallelism
    working = (18 + 4 * F / H) / 2 * tokens_h
    assert est.stages[0].activation_bytes == pytest.approx(2 * inputs * 2 + working)
    block = estimate(DENSE, lay, MemoryOptions(seq_length=S, recompute="full", recompute_method="block",
                                               recompute_num_layers=1, num_microbatches=8))
    # block: the first layer stores its input, the second all its activations
    assert block.stages[0].activation_bytes == pytest.approx((inputs + working) * 2 + working)


def test_selective_modules_drop_their_share() -> None:
    m = ModelDims(name="g", layers=2, hidden=1024, heads=16, ffn=2048, vocab=1024, gated_mlp=True)
    lay = layout_from_degrees(m, 1)
    base = estimate(m, lay, MemoryOptions(seq_length=S)).stages[0].activation_bytes
    assert base == pytest.approx(2 * (18 + 6 * 2048 / 1024) * S * H)  # gated MLP: 6 f/h
    no_mlp = estimate(m, lay, MemoryOptions(seq_length=S, recompute_modules=("mlp",))).stages[0].activation_bytes
    assert no_mlp == pytest.approx(2 * 18 * S * H)
    ln = estimate(m, lay, MemoryOptions(seq_length=S, recompute_modules=("layernorm",))).stages[0]
    assert ln.activation_bytes == pytest.approx(2 * (14 + 12) * S * H)
    scores = estimate(m, lay, MemoryOptions(seq_length=S, recompute="none", flash_attention=False)).stages[0]
    assert scores.activation_bytes == pytest.approx(2 * (18 + 12 + 5 * 16 * S / H) * S * H)


def test_moe_layer_by_hand() -> None:
    m = ModelDims(name="m", layers=2, hidden=256, heads=4, vocab=1024, experts=8, topk=2, moe_ffn=128)
    lay = layout_from_degrees(m, 4, ep=4)  # TP 1, DP 4, EP 4, ETP 1, EDP 1
    assert (lay.dp, lay.ep, lay.etp, lay.edp) == (4, 4, 1, 1)
    est = estimate(m, lay, MemoryOptions(seq_length=512, recompute="none", logits=False))
    experts = 8 * 3 * 256 * 128 / 4  # all experts of a layer / (EP x ETP)
    dense = 4 * 256 * 256 + 2 * 256 + 256 * 8  # attention, norms, router
    non_expert = 2 * dense + 1024 * 256 + 256 + 1024 * 256  # + embedding, final norm, output layer
    assert est.stages[0].weights_bytes == pytest.approx(non_expert * (6 + 12 / 4) + 2 * experts * (6 + 12 / 1))
    k = 10 + 8 + 6 * (2 * 128) / 256 + 4 * 2  # TP 1: nothing to shard; routed copies 4 x top-k
    assert est.stages[0].activation_bytes == pytest.approx(2 * k * 512 * 256)


def test_microbatches_in_flight() -> None:
    lay = layout_from_degrees(DENSE, 4, pp=4)
    assert [in_flight(i, lay, None) for i in range(4)] == [4, 3, 2, 1]
    assert [in_flight(i, lay, 2) for i in range(4)] == [2, 2, 2, 1]
    m8 = ModelDims(name="d8", layers=8, hidden=1024, heads=16, ffn=4096, vocab=32000)
    vlay = layout_from_degrees(m8, 4, pp=4, vp=2)
    assert in_flight(0, vlay, None) == pytest.approx(4 * (1 + 3 / (4 * 2)))  # megatron.md's first-stage factor
    assert in_flight(3, vlay, None) == pytest.approx((0 + 4 + 1) / 2)


def test_bad_options_name_the_field() -> None:
    lay = layout_from_degrees(DENSE, 8, tp=2, pp=2)
    with pytest.raises(LayoutError, match="recompute must be"):
        estimate(DENSE, lay, MemoryOptions(seq_length=S, recompute="some"))
    with pytest.raises(LayoutError, match="optimizer offload needs the distributed optimizer"):
        estimate(DENSE, lay, MemoryOptions(seq_length=S, distributed_optimizer=False, optimizer_offload_fraction=0.5))
    with pytest.raises(LayoutError, match="seq_length"):
        estimate(DENSE, layout_from_degrees(DENSE, 8, cp=2), MemoryOptions(seq_length=1001))
    with pytest.raises(LayoutError, match="unknown accelerator"):
        accelerator_gib("a100")


def test_rule_five_story_on_the_paper_model() -> None:
    """The public recipe fits; TP 1 runs out of memory with selective recompute and fits with full recompute
    (the retry of search rule 5), on 180 GB GPUs at the default margin."""
    glm = find_model("glm-4.5")
    b200 = accelerator_gib("b200")

    def fits(recompute: str, **deg: int) -> bool | None:
        lay = layout_from_degrees(glm, 128, **deg)
        return estimate(glm, lay, MemoryOptions(seq_length=4096, num_microbatches=2048 // lay.dp,
                                                recompute=recompute, gpu_memory_gib=b200)).fits

    assert fits("selective", tp=2, pp=8, ep=16, first=10, last=10) is True
    assert fits("selective", tp=1, pp=16, ep=8, first=4, last=4) is False
    assert fits("full", tp=1, pp=16, ep=8, first=4, last=4) is True


def test_memory_script_json_and_exit_codes() -> None:
    args = ["--model", "glm-4.5", "--gpus", "128", "--tp", "1", "--pp", "16", "--ep", "8",
            "--first-stage-layers", "4", "--last-stage-layers", "4", "--global-batch", "2048",
            "--accelerator", "b200", "--json"]
    res = run_script("memory.py", *args)
    assert res.returncode == 1, res.stderr  # selective recompute does not fit
    out = json.loads(res.stdout)
    assert out["fits"] is False and len(out["stages"]) == 16 and out["layout"]["edp"] == 1
    assert out["options"]["recompute"] == "selective" and out["options"]["num_microbatches"] == 256
    ok = run_script("memory.py", *args, "--recompute", "full")
    assert ok.returncode == 0 and json.loads(ok.stdout)["fits"] is True
    text = run_script("memory.py", *args[:-1], "--recompute", "full")
    assert text.returncode == 0 and "fits" in text.stdout and "stage" in text.stdout
    bad = run_script("memory.py", "--model", "glm-4.5", "--gpus", "128", "--tp", "2", "--pp", "8", "--ep", "3")
    assert bad.returncode == 2 and "EP 3" in bad.stderr
    gb = run_script("memory.py", "--model", "tinygpt", "--gpus", "2", "--global-batch", "15")
    assert gb.returncode == 2 and "--global-batch" in gb.stderr
