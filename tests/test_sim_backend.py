"""The sim backend behind the Backend protocol: the simulated clock, queueing, charging, failures,
and Megatron-LM logs that the metrics reader parses unchanged."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from attune.control.spec import load_spec
from attune.core.measure import gpu_hours
from attune.readers.metrics import read_metrics
from attune.sim.api import apply_overrides
from attune.sim.estimate import estimate
from attune.sim.paperfit.paper import CAMPAIGNS
from attune.sim.recipe import render_argv
from broker.backends import get_backend
from broker.backends.base import Backend, BackendError, JobSpec, JobState
from broker.backends.sim import SimBackend

GLM = load_spec(CAMPAIGNS["glm-4.5"])
MIX = load_spec(CAMPAIGNS["mixtral-8x22b"])
MM = load_spec(CAMPAIGNS["minimax-m2"])


def job(tmp: Path, spec, run_id: str, changes: dict | None = None, **kw) -> JobSpec:
    args = apply_overrides(spec.baseline.args, changes or {})
    argv = ("torchrun", "--nnodes", "16", "pretrain_gpt.py", *render_argv(args))
    return JobSpec(job_id=run_id, campaign=spec.name, argv=argv, env=dict(spec.baseline.env), workdir=tmp,
                   run_dir=tmp / run_id, gpus=spec.cluster.gpus, gpus_per_node=8, **kw)


def backend(spec, **over) -> SimBackend:
    return SimBackend(**{**spec.cluster.settings, **over})


def test_registry_builds_it_and_it_is_a_backend():
    be = get_backend("sim", dict(GLM.cluster.settings))
    assert isinstance(be, Backend) and be.name == "sim"
    with pytest.raises(BackendError, match="accelerator"):
        get_backend("sim", {"model": "glm-4.5", "accelerator": "TPU"})
    with pytest.raises(BackendError, match="nodes"):
        get_backend("sim", {"model": "glm-4.5", "accelerator": "B200", "nodes": 0})


def test_a_run_returns_in_milliseconds_and_parses_with_the_metrics_reader(tmp_path):
    be = backend(GLM)
    j = job(tmp_path, GLM, "r1")
    t0 = time.perf_counter()
    st = be.wait(be.submit(j))
    assert time.perf_counter() - t0 < 0.25  # milliseconds of wall time for a 14-step, 128-GPU run
    assert st.state == JobState.COMPLETED and st.exit_code == 0
    m = read_metrics(j.log_path, gpus=128)
    assert m.failure_class == "ok" and m.valid
    assert m.seq_length == 4096 and m.last_iteration == 14
    predicted = estimate("glm-4.5", "B200", 128, GLM.baseline.args).tokens_per_s_per_gpu
    assert m.tokens_per_s_per_gpu == pytest.approx(predicted, rel=0.04)  # ~0.5% run noise (Table D1)
    mem = m.memory_dict()
    assert len(m.memory_per_rank) == 8  # one line per pipeline stage
    assert {r.rank for r in m.memory_per_rank} == {s * 16 for s in range(8)}
    assert mem["peak_max_allocated_mib"] < 180 * 1024
    assert m.arguments["pipeline_model_parallel_size"] == "8"
    # charged from start to release, start-up included
    assert gpu_hours(128, st.ended_at - st.started_at) == pytest.approx(62.58, rel=0.1)  # Table D1


def test_the_clock_moves_step_by_step_when_polled(tmp_path):
    be = backend(GLM)
    j = job(tmp_path, GLM, "r1")
    bid = be.submit(j)
    seen = []
    while True:
        st = be.status(bid)
        seen.append(j.log_path.read_text().count("] iteration "))
        if st.state.finished:
            break
    assert seen == sorted(seen) and seen[-1] == 14 and len(set(seen)) >= 14


def test_same_seed_same_run_other_seed_other_noise(tmp_path):
    logs = []
    for k, seed in enumerate((5, 5, 6)):
        be = backend(GLM, seed=seed)
        j = job(tmp_path / str(k), GLM, "r1")
        be.wait(be.submit(j))
        logs.append(j.log_path.read_text())
    assert logs[0] == logs[1] and logs[0] != logs[2]


def test_throughput_noise_is_about_the_configured_sigma(tmp_path):
    be = backend(GLM, throughput_noise=0.01)
    vals = []
    for i in range(12):
        j = job(tmp_path, GLM, f"r{i}")
        be.wait(be.submit(j))
        vals.append(read_metrics(j.log_path, gpus=128).tokens_per_s_per_gpu)
    mean = sum(vals) / len(vals)
    sd = (sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) ** 0.5 / mean
    assert 0.003 < sd < 0.025


def test_queueing_is_not_charged(tmp_path):
    be = backend(GLM, nodes=16)
    a, b = job(tmp_path, GLM, "a"), job(tmp_path, GLM, "b")
    ia, ib = be.submit(a), be.submit(b)
    assert be.status(ib).state in (JobState.PENDING, JobState.RUNNING)
    sa, sb = be.wait(ia), be.wait(ib)
    assert sb.started_at >= sa.ended_at  # waited for the nodes
    assert sb.ended_at - sb.started_at == pytest.approx(sa.ended_at - sa.started_at, rel=0.05)
    with pytest.raises(BackendError, match="needs 16 node"):
        backend(GLM, nodes=8).submit(job(tmp_path, GLM, "c"))


def test_cancel_releases_and_charges_until_then(tmp_path):
    be = backend(GLM)
    j = job(tmp_path, GLM, "r1")
    bid = be.submit(j)
    be.advance(600.0)
    be.cancel(bid)
    st = be.status(bid)
    assert st.state == JobState.CANCELLED and st.ended_at - st.started_at == pytest.approx(600.0)
    be.cancel(bid)  # idempotent


def test_out_of_memory_run(tmp_path):
    be = backend(GLM)
    j = job(tmp_path, GLM, "oom", {"--tensor-model-parallel-size": 1, "--sequence-parallel": None})
    st = be.wait(be.submit(j))
    assert st.state == JobState.FAILED
    m = read_metrics(j.log_path, gpus=128, exit_status=st.exit_code)
    assert m.failure_class == "oom"
    assert st.ended_at - st.started_at < 900  # fails in step 0, well before a full run


def test_hang_at_step_0_is_a_watchdog_timeout(tmp_path):
    be = backend(MIX)
    j = job(tmp_path, MIX, "cp8", {"--context-parallel-size": 8, "--pipeline-model-parallel-size": 2,
                                   "--num-virtual-stages-per-pipeline-rank": 2, "--expert-model-parallel-size": 8})
    st = be.wait(be.submit(j))
    m = read_metrics(j.log_path, gpus=128, exit_status=st.exit_code)
    assert m.failure_class == "hang" and st.state == JobState.FAILED
    assert st.ended_at - st.started_at == pytest.approx(564 + 600 + 5, abs=2)


def test_a_step_that_never_ends_is_killed_for_no_progress(tmp_path):
    be = backend(GLM)
    j = job(tmp_path, GLM, "cp8", {"--context-parallel-size": 8, "--pipeline-model-parallel-size": 4,
                                   "--expert-model-parallel-size": 8, "--decoder-first-pipeline-num-layers": None,
                                   "--decoder-last-pipeline-num-layers": None, "--overlap-grad-reduce": None,
                                   "--overlap-param-gather": None})
    bid = be.submit(j)
    st = be.wait(bid)
    assert st.state == JobState.TIMEOUT
    since = (st.ended_at - st.started_at) - be.plan(bid).last_progress_s
    m = read_metrics(j.log_path, gpus=128, exit_status=st.exit_code, seconds_since_progress=since)
    assert m.failure_class == "hang"


@pytest.mark.parametrize("changes, where", [
    ({"--micro-batch-size": 64, "--global-batch-size": 1024}, "step0"),  # Table B1: RMSNorm overflow
    ({"--tensor-model-parallel-size": 3}, "start"),  # argument validation
    ({"--moe-token-dispatcher-type": "flex", "--moe-flex-dispatcher-backend": "deepep",
      "--expert-model-parallel-size": 16, "--tensor-model-parallel-size": 1, "--sequence-parallel": None}, "start"),
])
def test_crashes(tmp_path, changes, where):
    be = backend(MM)
    j = job(tmp_path, MM, "c", changes)
    st = be.wait(be.submit(j))
    m = read_metrics(j.log_path, gpus=64, exit_status=st.exit_code)
    assert st.state == JobState.FAILED and m.failure_class == "crash"
    assert (st.ended_at - st.started_at < 120) == (where == "start" and "--tensor-model-parallel-size" in changes
                                                  and changes["--tensor-model-parallel-size"] == 3)


def test_infrastructure_faults_at_the_configured_rate(tmp_path):
    be = backend(GLM, infra_fault_rate=5.0)  # node failures per node-hour: every job fails
    j = job(tmp_path, GLM, "r1")
    st = be.wait(be.submit(j))
    assert st.state == JobState.INFRASTRUCTURE
    m = read_metrics(j.log_path, gpus=128)
    assert m.failure_class == "infrastructure"


def test_profiled_run_writes_a_trace_per_profiled_rank(tmp_path):
    be = backend(GLM)
    ranks = " ".join(str(s * 16) for s in range(8))
    j = job(tmp_path, GLM, "p", {"--train-iters": 17, "--profile": True, "--use-pytorch-profiler": True,
                                 "--profile-step-start": 14, "--profile-step-end": 15, "--profile-ranks": ranks})
    st = be.wait(be.submit(j))
    assert st.state == JobState.COMPLETED
    assert sorted(p.name for p in (j.run_dir / "traces").iterdir()) == sorted(
        f"rank{s * 16}.pt.trace.json" for s in range(8))


def test_render_shows_the_command_and_says_it_is_simulated(tmp_path):
    text = backend(GLM).render(job(tmp_path, GLM, "r1"))
    assert "SIMULATED" in text and "pretrain_gpt.py" in text and "--tensor-model-parallel-size 2" in text


def test_a_step_slower_than_the_watchdog_is_killed_as_hung(tmp_path):
    be = backend(GLM, hang_kill_s=60.0)  # the GLM baseline's step takes ~90 s
    j = job(tmp_path, GLM, "slow")
    bid = be.submit(j)
    st = be.wait(bid)
    assert st.state == JobState.TIMEOUT
    since = (st.ended_at - st.started_at) - be.plan(bid).last_progress_s
    assert since == pytest.approx(60.0)
    m = read_metrics(j.log_path, gpus=128, exit_status=st.exit_code, seconds_since_progress=since, hang_after_s=60)
    assert m.failure_class == "hang"


def test_the_time_limit_ends_a_job(tmp_path):
    be = backend(GLM)
    j = job(tmp_path, GLM, "limited", time_limit_s=900.0)
    st = be.wait(be.submit(j))
    assert st.state == JobState.TIMEOUT and st.ended_at - st.started_at == pytest.approx(900.0)
    assert read_metrics(j.log_path, gpus=128, exit_status=st.exit_code).failure_class == "hang"
