"""Coherent moves (attune.knowledge.coherence) and the tuner fixes of issue 23 that come with them."""

from __future__ import annotations

from attune.knowledge.coherence import cohere, problems
from attune.tuners.base import Outcome
from attune.tuners.heuristic import FULL_RECOMPUTE, HeuristicTuner
from attune.tuners.tpe import TPETuner


def test_full_recompute_drops_modules() -> None:
    out = cohere({"--recompute-granularity": "full", "--recompute-modules": "moe_act"})
    assert out["--recompute-modules"] is None
    assert out["--recompute-method"] == "uniform" and out["--recompute-num-layers"] == 1
    sel = cohere({"--recompute-granularity": "selective", "--recompute-method": "uniform", "--recompute-num-layers": 1})
    assert sel["--recompute-method"] is None and sel["--recompute-num-layers"] is None


def test_tp1_drops_sequence_parallel_and_tp_overlap() -> None:
    out = cohere({"--tensor-model-parallel-size": 1, "--sequence-parallel": True, "--tp-comm-overlap": True})
    assert out["--sequence-parallel"] is None and out["--tp-comm-overlap"] is None
    up = cohere({"--tensor-model-parallel-size": 2}, before={"--tensor-model-parallel-size": 1})
    assert up["--sequence-parallel"] is True
    assert problems({"--tensor-model-parallel-size": 1, "--tp-comm-overlap": True})


def test_deeper_pipeline_keeps_virtual_stages_dividing_layers() -> None:
    args = {"--pipeline-model-parallel-size": 16, "--num-virtual-stages-per-pipeline-rank": 8,
            "--account-for-embedding-in-pipeline-split": True, "--account-for-loss-in-pipeline-split": True}
    out = cohere(args, layers=126)
    vp = int(out.get("--num-virtual-stages-per-pipeline-rank") or 1)
    first = out.get("--decoder-first-pipeline-num-layers")
    last = out.get("--decoder-last-pipeline-num-layers")
    per = [first or 0, last or 0]
    inner = 16 - sum(1 for x in (first, last) if x)
    rest = 126 - sum(per)
    assert rest % inner == 0 and (rest // inner) % vp == 0 and all(p % vp == 0 for p in per if p)
    assert not problems(out, layers=126)
    flat = cohere({"--pipeline-model-parallel-size": 1, "--num-virtual-stages-per-pipeline-rank": 4,
                   "--decoder-first-pipeline-num-layers": 4}, layers=32)
    assert flat["--num-virtual-stages-per-pipeline-rank"] is None and flat["--decoder-first-pipeline-num-layers"] is None


def test_oom_retry_is_coherent() -> None:
    """The heuristic's rule-5 retry adds full recomputation and drops the selective module list."""
    base = {"--tensor-model-parallel-size": 2, "--recompute-granularity": "selective", "--recompute-modules": "moe_act"}
    space = {"--tensor-model-parallel-size": [1, 2, 4], "--recompute-granularity": ["selective", "full"]}

    def coh(full: dict, before: dict) -> dict:
        return cohere(full, before=before)

    t = HeuristicTuner(space, {k: base[k] for k in space}, extra_baseline=base, cohere=coh, memory_retry=True)
    c = t.ask()
    assert c is not None
    t.tell(c, Outcome(run_id="r1", outcome="oom"))
    retry = t.ask()
    assert retry is not None and retry.changes.get("--recompute-granularity") == "full"
    assert retry.changes.get("--recompute-modules", "kept") is None
    assert retry.changes.get("--recompute-method") == FULL_RECOMPUTE["--recompute-method"]


def test_tpe_with_unset_searched_flag() -> None:
    space = {"--recompute-granularity": ["selective", "full"], "--tensor-model-parallel-size": [1, 2]}
    t = TPETuner(space, {"--recompute-granularity": None, "--tensor-model-parallel-size": 2}, seed=1)
    seen = set()
    for _ in range(4):
        c = t.ask()
        assert c is not None and c.changes
        seen.add(t.key(c.changes))
        t.tell(c, Outcome(run_id="x", outcome="ok", tokens_per_s_per_gpu=1.0, valid=True))
    assert len(seen) == 4
