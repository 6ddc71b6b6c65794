"""Kineto traces of profiled simulated runs: the trace analyzer reads them unchanged, places each rank
on its stage from the traces' process groups, and its breakdown matches the step-time model's terms."""

from __future__ import annotations

from pathlib import Path

import pytest

from attune.control.spec import load_spec
from attune.readers.traces import analyze_paths
from attune.sim.api import apply_overrides
from attune.sim.paperfit.paper import CAMPAIGNS
from attune.sim.recipe import render_argv
from broker.backends.base import JobSpec
from broker.backends.sim import SimBackend


def profiled_run(tmp: Path, model: str, changes: dict | None = None):
    spec = load_spec(CAMPAIGNS[model])
    pp = int(apply_overrides(spec.baseline.args, changes or {})["--pipeline-model-parallel-size"])
    per_stage = spec.cluster.gpus // pp
    args = apply_overrides(spec.baseline.args, {
        **(changes or {}), "--train-iters": 17, "--profile": True, "--use-pytorch-profiler": True,
        "--profile-step-start": 14, "--profile-step-end": 16,
        "--profile-ranks": " ".join(str(s * per_stage + 1) for s in range(pp)),
    })
    be = SimBackend(**spec.cluster.settings)
    job = JobSpec(job_id="prof", campaign=spec.name, argv=("pretrain_gpt.py", *render_argv(args)), env={},
                  workdir=tmp, run_dir=tmp / "prof", gpus=spec.cluster.gpus, gpus_per_node=8)
    bid = be.submit(job)
    be.wait(bid)
    plan = be.plan(bid)
    return plan, job.run_dir / "traces", pp


@pytest.mark.parametrize("model, changes", [
    ("glm-4.5", {"--global-batch-size": 256}),  # fewer microbatches: a smaller trace
    ("minimax-m2", {}),
])
def test_trace_breakdown_matches_the_model_terms(tmp_path, model, changes):
    plan, traces, pp = profiled_run(tmp_path, model, changes)
    assert plan.outcome == "ok"
    report = analyze_paths([traces])
    assert report.stage_source == "process_groups"
    assert [s.stage for s in report.stages] == list(range(pp))
    step = plan.estimate.step
    crit = next(s for s in report.stages if s.stage == step.critical_stage)
    b = crit.breakdown
    # the traced steps ran with the run's noise and the profiler's overhead: compare shares of the step
    total = step.seconds
    share = {k: v / total for k, v in step.terms.items()}
    us = b.step_us
    assert b.compute_us / us == pytest.approx(share["compute"] + share["recompute"] + share["optimizer"], abs=0.01)
    kinds = b.comm_exposed_by_kind
    assert kinds.get("all_to_all", 0.0) / us == pytest.approx(share["ep_a2a"], abs=0.01)
    assert kinds.get("tp_collective", 0.0) / us == pytest.approx(share["tp_comm"], abs=0.01)
    assert kinds.get("pipeline_p2p", 0.0) / us == pytest.approx(share["pipeline_p2p"] + share["pipeline_bubble"],
                                                                abs=0.01)
    assert kinds.get("dp_reduce", 0.0) / us == pytest.approx(share["dp_grad_reduce"] + share["dp_param_gather"],
                                                             abs=0.01)
    assert b.launch_us / us == pytest.approx(share["host_launch"], abs=0.01)
    assert (b.python_us + b.memcpy_exposed_us) / us == pytest.approx(
        share["step_overhead"] + share["optimizer_offload"], abs=0.01)
    # the slowest stage's largest wait is the model's largest non-compute term
    biggest = max((k for k in step.terms if k not in ("compute", "recompute", "optimizer")), key=step.terms.get)
    expected = {"host_launch": "host_launch", "ep_a2a": "all_to_all", "optimizer_offload": "host_python",
                "step_overhead": "host_python", "pipeline_p2p": "pipeline_p2p", "pipeline_bubble": "pipeline_p2p"}
    assert report.stages[step.critical_stage].waits_on[0].what == expected[biggest]
