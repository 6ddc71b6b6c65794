"""The Ray backend (broker/backends/ray.py) against a real one-machine Ray cluster running real tinygpt jobs.

The cluster is started by scripts/start-ray.sh (idempotent; see tests/_ray_helpers.py). The render,
settings and spec tests at the top need no cluster.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from attune.control.spec import SpecError, parse_spec
from broker.backends import get_backend
from broker.backends.base import BackendError, BackendUnavailable, JobSpec, JobState, JobStatus
from broker.backends.ray import ENTRYPOINT, META_FILE, SCRIPT_FILE, START_MARK, RayBackend, submission_id
from tests._ray_helpers import (
    RAY_ADDRESS,
    ROOT,
    processes_mentioning,
    ray_cluster,  # noqa: F401 - the fixture that starts Ray
    tinygpt_argv,
)

NODE_A, NODE_B = "a" * 56, "b" * 56


def _spec(run_dir: Path, *, campaign: str = "camp", job_id: str = "r7", argv: tuple[str, ...] = ("python", "train.py"),
          **kw: object) -> JobSpec:
    fields: dict = dict(job_id=job_id, campaign=campaign, argv=argv, env={"OMP_NUM_THREADS": "1", "NOTE": "it's"},
                        workdir=ROOT, run_dir=run_dir, gpus=1, gpus_per_node=1)
    fields.update(kw)
    return JobSpec(**fields)


# ---- no cluster needed ----------------------------------------------------------------------------


def test_render_cpu_ranks_and_resources(tmp_path: Path) -> None:
    b = get_backend("ray", {"gpu_request": "none", "memory_gb": 2, "resources": {"tinygpt": 1}})
    spec = _spec(tmp_path / "run", gpus=2, gpus_per_node=2)
    text = b.render(spec)
    assert text.startswith("#!/bin/bash\n")
    # the start marker comes first: it is the moment charging starts
    first_cmd = next(line for line in text.splitlines() if not line.startswith("#") and line.strip())
    assert first_cmd.startswith(f'echo "{START_MARK}')
    assert "export NOTE='it'\"'\"'s'" in text and "export OMP_NUM_THREADS=1" in text
    assert f"cd {spec.run_dir} ||" in text and text.rstrip().endswith('exit "$?"')  # works in its run directory
    assert "--submission-id attune-camp-r7" in text and "--entrypoint-num-cpus 2" in text
    assert b.resources(spec) == {"entrypoint_num_cpus": 2, "entrypoint_memory": 2 * 1024**3,
                                 "entrypoint_resources": {"tinygpt": 1.0}}
    gpu = RayBackend(cpus_per_job=8)
    assert gpu.resources(_spec(tmp_path / "run", gpus=8, gpus_per_node=8)) == {
        "entrypoint_num_cpus": 8, "entrypoint_num_gpus": 8}
    # the retry of an infrastructure failure avoids the failed node(s)
    retry = gpu.resources(_spec(tmp_path / "run", exclude_nodes=(NODE_A, NODE_B)))
    assert retry["entrypoint_label_selector"] == {"ray.io/node-id": f"!in({NODE_A},{NODE_B})"}
    assert "--entrypoint-label-selector" in gpu.render(_spec(tmp_path / "run", exclude_nodes=(NODE_A,)))
    # with the campaign's own working_dir the job starts there, not in the broker's workdir
    wd = RayBackend(runtime_env={"working_dir": "s3://bucket/code.zip", "env_vars": {"HF_HOME": "/cache"}})
    text = wd.render(_spec(tmp_path / "run"))
    assert f"cd {ROOT}" not in text and '"working_dir": "s3://bucket/code.zip"' in text
    assert "bash -c" not in ENTRYPOINT and "$ATTUNE_RAY_JOB_SCRIPT" in ENTRYPOINT  # never on a command line


def test_render_a_multi_node_job_as_a_driver_with_a_placement_group(tmp_path: Path) -> None:
    b = RayBackend(cpus_per_job=16, resources={"accelerator_type:H100": 0.001})
    spec = _spec(tmp_path / "run", gpus=16, gpus_per_node=8, exclude_nodes=(NODE_A,))
    assert b.resources(spec) == {}  # the driver asks for nothing; the nodes are the placement group's
    text = b.render(spec)
    launch = json.loads(shlex.split(next(line for line in text.splitlines()
                                         if line.startswith("export ATTUNE_RAY_LAUNCH=")).split("=", 1)[1])[0])
    assert launch["nodes"] == 2 and launch["strategy"] == "STRICT_SPREAD"
    assert launch["bundle"] == {"CPU": 16.0, "GPU": 8.0, "accelerator_type:H100": 0.001}
    assert launch["selector"] == {"ray.io/node-id": f"!in({NODE_A})"}
    assert f"cd {spec.run_dir} ||" in launch["node_script"] and START_MARK not in launch["node_script"]
    assert "exec python - <<'ATTUNE_RAY_LAUNCHER_END'" in text and text.rstrip().endswith("ATTUNE_RAY_LAUNCHER_END")
    assert "placement_group(" in text  # the launcher itself travels in the script


def test_submission_ids_are_derived_from_the_run() -> None:
    assert submission_id("attune", "tiny", "r0003") == "attune-tiny-r0003"
    odd = submission_id("attune", "a.b", "r1")
    assert odd.startswith("attune-a_b-r1-") and odd != submission_id("attune", "a_b", "r1")
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,100}", submission_id("p", "c" * 200, "r1"))


def test_bad_settings_and_jobs_are_refused(tmp_path: Path) -> None:
    with pytest.raises(BackendError, match="gpu_reqest"):
        get_backend("ray", {"gpu_reqest": "none"})
    with pytest.raises(BackendError, match="address"):
        RayBackend(address="127.0.0.1:8265")  # the Jobs API is http(s)
    with pytest.raises(BackendError, match="CPU"):
        RayBackend(resources={"CPU": 2})
    b = RayBackend()
    with pytest.raises(BackendError, match="env name"):
        b.render(_spec(tmp_path / "run", env={"BAD-NAME": "1"}))
    with pytest.raises(BackendError, match="image_uri"):
        b.render(_spec(tmp_path / "run", image="nvcr.io/nvidia/pytorch:24.05-py3"))
    with pytest.raises(BackendError, match="not Ray node ids"):
        b.resources(_spec(tmp_path / "run", exclude_nodes=("node07; rm",)))
    with pytest.raises(BackendError, match="not a Ray submission id"):
        b.status("x; rm -rf /")


def _cluster(**over: object) -> dict:
    base = {"name": "c", "model": "tinygpt", "framework": "megatron-lm",
            "cluster": {"backend": "ray", "gpus": 1, "gpus_per_node": 1, "accelerator": "cpu"},
            "baseline": {"command": ["python", "train.py"]},
            "workload": {"seq_length": 64, "global_batch": 4, "precision": "fp32"}}
    base["cluster"].update(over)
    return base


def test_the_spec_has_a_typed_ray_section() -> None:
    spec = parse_spec(_cluster(ray={"address": "http://head:8265", "gpu_request": "none",
                                    "runtime_env": {"env_vars": {"HF_HOME": "/cache"}, "pip": ["einops"]}}))
    settings = spec.cluster.backend_settings()
    assert settings["address"] == "http://head:8265" and settings["runtime_env"]["pip"] == ["einops"]
    assert RayBackend(**settings).settings.runtime_env.as_ray() == {"env_vars": {"HF_HOME": "/cache"},
                                                                    "pip": ["einops"]}
    assert parse_spec(_cluster()).cluster.backend_settings()["address"] == "http://127.0.0.1:8265"
    bad = [
        (_cluster(ray={"adress": "http://x:1"}), "cluster.ray.adress"),
        (_cluster(ray={"runtime_env": {"env_vars": {"RAY_ADDRESS": "x"}}}), "cluster.ray.runtime_env.env_vars"),
        (_cluster(ray={"runtime_env": {"container": {"image": "x"}}}), "cluster.ray.runtime_env.container"),
        (_cluster(settings={"slots": 2}), "cluster"),
        ({**_cluster(ray={}), "cluster": {**_cluster()["cluster"], "backend": "local", "ray": {}}}, "cluster"),
    ]
    for data, field in bad:
        with pytest.raises(SpecError) as err:
            parse_spec(data)
        assert field in [f for f, _ in err.value.problems], (field, err.value.problems)


def test_an_unreachable_cluster_is_a_clear_error(tmp_path: Path) -> None:
    pytest.importorskip("ray.job_submission", reason="Ray is not installed")
    b = RayBackend(address="http://127.0.0.1:9", request_timeout_s=5)
    with pytest.raises(BackendError, match=r"cannot reach the Ray cluster at http://127\.0\.0\.1:9"):
        b.submit(_spec(tmp_path / "run"))
    with pytest.raises(BackendUnavailable, match="cannot reach the Ray cluster"):
        b.status("attune-camp-r7")  # unknown, not lost: the broker asks again (up to control.hang_timeout_s)


# ---- against a real Ray cluster ---------------------------------------------------------------------


def _wait(backend: RayBackend, sid: str, until: Callable[[JobStatus], bool], timeout_s: float = 300.0,
          seen: list[JobStatus] | None = None) -> JobStatus:
    """Poll until `until` holds. A loaded machine makes the Jobs API slow: a request that times out is asked
    again (the backend's BackendUnavailable), and the deadline is generous; it fails saying what it saw."""
    deadline = time.monotonic() + timeout_s * float(os.environ.get("ATTUNE_TEST_TIMEOUT_SCALE", "1"))
    while True:
        try:
            st = backend.status(sid)
        except BackendUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)
            continue
        if seen is not None:
            seen.append(st)
        if until(st):
            return st
        if time.monotonic() > deadline:
            raise TimeoutError(f"{sid}: still {st.state} ({st.reason})")
        time.sleep(0.3)


def _campaign() -> str:
    return f"t{uuid.uuid4().hex[:8]}"


def _log_has(run_dir: Path, text: str) -> Callable[[JobStatus], bool]:
    def check(st: JobStatus) -> bool:
        p = run_dir / "log.txt"
        return st.state.finished or (p.exists() and text in p.read_text())
    return check


@pytest.mark.usefixtures("ray_cluster")
def test_queued_job_is_not_charged_until_it_runs(tmp_path: Path) -> None:
    b = RayBackend(address=RAY_ADDRESS, gpu_request="none", cpus_per_job=2)  # one job fills the cluster
    camp = _campaign()
    a, q = tmp_path / "a", tmp_path / "q"
    sid_a = b.submit(_spec(a, campaign=camp, job_id="a", argv=tinygpt_argv(a, 14), env={"OMP_NUM_THREADS": "1"}))
    sid_q = b.submit(_spec(q, campaign=camp, job_id="q", argv=tinygpt_argv(q, 6), env={"OMP_NUM_THREADS": "1"}))
    assert sid_a == f"attune-{camp}-a" and (a / SCRIPT_FILE).is_file()
    _wait(b, sid_a, lambda st: st.state is not JobState.PENDING)
    queued = b.status(sid_q)
    assert queued.state is JobState.PENDING and queued.started_at is None and queued.nodes == []
    seen: list[JobStatus] = []
    done_a = _wait(b, sid_a, lambda st: st.state.finished, seen=seen)
    assert done_a.state is JobState.COMPLETED and done_a.exit_code == 0, done_a.reason
    assert done_a.started_at is not None and done_a.ended_at is not None and done_a.ended_at > done_a.started_at
    assert len(done_a.nodes) == 1 and re.fullmatch(r"[0-9a-f]{56}", done_a.nodes[0])
    done_q = _wait(b, sid_q, lambda st: st.state.finished)
    assert done_q.state is JobState.COMPLETED, done_q.reason
    # the queued job's charge starts when it ran, after the first released the cluster
    assert done_q.started_at is not None and done_q.started_at >= done_a.ended_at - 0.5
    # the driver's log was streamed into the run directory: the marker once, then the training's lines
    log = (a / "log.txt").read_text()
    assert log.count(START_MARK) == 1 and " iteration       14/      14 |" in log
    from attune.readers.metrics import read_metrics

    m = read_metrics(a / "log.txt", gpus=1, window=(4, 13), max_spread=10.0)
    assert m.tokens_per_s_per_gpu and m.tokens_per_s_per_gpu > 0
    assert json.loads((a / META_FILE).read_text())["submission_id"] == sid_a


@pytest.mark.usefixtures("ray_cluster")
def test_cancel_stops_a_running_and_a_queued_job(tmp_path: Path) -> None:
    b = RayBackend(address=RAY_ADDRESS, gpu_request="none", cpus_per_job=2)
    camp = _campaign()
    a, q = tmp_path / "a", tmp_path / "q"
    sid_a = b.submit(_spec(a, campaign=camp, job_id="a", argv=tinygpt_argv(a, 100000, torchrun=True)))
    sid_q = b.submit(_spec(q, campaign=camp, job_id="q", argv=tinygpt_argv(q, 100000)))
    _wait(b, sid_a, _log_has(a, "iteration"))
    assert processes_mentioning(str(a)), "the training processes should be running"
    b.cancel(sid_q)  # still queued: never ran, never charged
    st_q = b.status(sid_q)
    assert st_q.state is JobState.CANCELLED and st_q.started_at is None
    b.cancel(sid_a)
    st = b.status(sid_a)
    assert st.state is JobState.CANCELLED and st.started_at is not None and st.ended_at is not None, st
    # the whole job is gone: torchrun and its rank
    deadline = time.monotonic() + 20
    while processes_mentioning(str(a)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_mentioning(str(a)) == []
    b.cancel(sid_a)  # idempotent on a finished job


@pytest.mark.usefixtures("ray_cluster")
def test_a_failing_job_is_the_job_s_failure(tmp_path: Path) -> None:
    b = RayBackend(address=RAY_ADDRESS, gpu_request="none")
    run = tmp_path / "f"
    # excluding another node (a retry's label selector) leaves this one: Ray takes the selector
    sid = b.submit(_spec(run, campaign=_campaign(), job_id="f", argv=tinygpt_argv(run, 6, "--no-such-flag"),
                         exclude_nodes=("0" * 56,)))
    st = _wait(b, sid, lambda st: st.state.finished)
    assert st.state is JobState.FAILED and st.exit_code == 2, st  # argparse's usage error
    assert st.started_at is not None and "unrecognized arguments: --no-such-flag" in (run / "log.txt").read_text()


@pytest.mark.usefixtures("ray_cluster")
def test_killed_from_outside_is_infrastructure(tmp_path: Path) -> None:
    from ray.job_submission import JobSubmissionClient

    b = RayBackend(address=RAY_ADDRESS, gpu_request="none")
    camp = _campaign()
    k, s = tmp_path / "k", tmp_path / "s"
    sid_k = b.submit(_spec(k, campaign=camp, job_id="k", argv=tinygpt_argv(k, 100000)))
    sid_s = b.submit(_spec(s, campaign=camp, job_id="s", argv=tinygpt_argv(s, 100000)))
    _wait(b, sid_k, _log_has(k, "iteration"))
    # killed on its node (an operator, the OOM killer on the driver): the script's process group
    pid = int(re.search(re.escape(START_MARK) + r"\S+ pid (\d+)", (k / "log.txt").read_text()).group(1))
    os.killpg(pid, signal.SIGKILL)
    st = _wait(b, sid_k, lambda st: st.state.finished)
    assert st.state is JobState.INFRASTRUCTURE and "killed by signal 9" in (st.reason or ""), st
    assert st.started_at is not None and st.nodes  # charged, and the node to avoid on the retry
    # stopped by someone else than the broker (ray job stop)
    _wait(b, sid_s, lambda st: st.state is not JobState.PENDING)
    JobSubmissionClient(RAY_ADDRESS).stop_job(sid_s)
    st = _wait(b, sid_s, lambda st: st.state.finished)
    assert st.state is JobState.INFRASTRUCTURE and "outside the broker" in (st.reason or ""), st
    # the retry avoids the failed node; on this one-node cluster no other node could hold it, and the node is
    # alive (Ray gives a restarted node a new id: the failure was not the node's), so it runs there again
    retry = tmp_path / "k2"
    sid_r = b.submit(_spec(retry, campaign=camp, job_id="k2", argv=tinygpt_argv(retry, 6),
                           exclude_nodes=tuple(st.nodes)))
    again = _wait(b, sid_r, lambda st: st.state.finished)
    assert again.state is JobState.COMPLETED and again.nodes == st.nodes, again
    with pytest.raises(BackendError, match=r"too few resources: job big needs one node with CPU 64"):
        RayBackend(address=RAY_ADDRESS, gpu_request="none", cpus_per_job=64).submit(
            _spec(tmp_path / "big", campaign=camp, job_id="big"))


@pytest.mark.usefixtures("ray_cluster")
def test_a_restarted_broker_adopts_a_running_job(tmp_path: Path) -> None:
    b = RayBackend(address=RAY_ADDRESS, gpu_request="none")
    run = tmp_path / "r"
    spec = _spec(run, campaign=_campaign(), job_id="r", argv=tinygpt_argv(run, 30))
    sid = b.submit(spec)
    first = _wait(b, sid, _log_has(run, "iteration"))
    assert first.state is JobState.RUNNING
    # a new backend instance: the broker restarted; the submission id is all it has
    again = RayBackend(address=RAY_ADDRESS, gpu_request="none")
    st = again.status(sid)
    assert st.state is JobState.RUNNING and st.job_id == "r" and st.started_at == pytest.approx(first.started_at)
    # resubmitting the same run adopts the running job (no second job)
    info = again.client().get_job_info(sid)
    assert again.submit(spec) == sid and again.client().get_job_info(sid).start_time == info.start_time
    done = _wait(again, sid, lambda st: st.state.finished)
    assert done.state is JobState.COMPLETED, done.reason
    log = (run / "log.txt").read_text()
    assert log.count(START_MARK) == 1 and log.count(" iteration       30/      30 |") == 1  # copied once


@pytest.mark.usefixtures("ray_cluster")
def test_the_time_limit_stops_a_job_as_timeout(tmp_path: Path) -> None:
    b = RayBackend(address=RAY_ADDRESS, gpu_request="none")
    run = tmp_path / "t"
    sid = b.submit(_spec(run, campaign=_campaign(), job_id="t", argv=("bash", "-c", "echo waiting; sleep 600"),
                         time_limit_s=2.0))
    st = _wait(b, sid, lambda st: st.state.finished, timeout_s=120)
    assert st.state is JobState.TIMEOUT and "time limit of 2 s" in (st.reason or ""), st
    assert st.started_at is not None and st.ended_at is not None and st.ended_at - st.started_at >= 2.0


@pytest.mark.usefixtures("ray_cluster")
def test_a_two_node_job_runs_on_a_placement_group_and_stops_whole(tmp_path: Path) -> None:
    # Two "nodes" of one CPU rank each; PACK lets both bundles share the one-machine cluster's only node.
    b = RayBackend(address=RAY_ADDRESS, gpu_request="none", placement_strategy="PACK")
    camp = _campaign()
    run = tmp_path / "m"
    with pytest.raises(BackendError, match=r"needs 2 nodes \(STRICT_SPREAD\) with CPU 1.*1 alive node"):
        RayBackend(address=RAY_ADDRESS, gpu_request="none").submit(
            _spec(run, campaign=camp, job_id="spread", gpus=2, gpus_per_node=1))
    # torchrun --nnodes 2 (static rendezvous): its node rank and master come from the driver's PET_* variables
    argv = (sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
            *tinygpt_argv(run, 100000)[1:])
    sid = b.submit(_spec(run, campaign=camp, job_id="m", argv=argv, gpus=2, gpus_per_node=1))
    st = _wait(b, sid, _log_has(run, "iteration        2/"))
    log = (run / "log.txt").read_text()
    assert st.state is JobState.RUNNING and "using world size: 2" in log, log[-2000:]
    assert len(st.nodes) == 2  # the placement group's nodes
    # charged from the driver's start line, printed once it held both nodes (not from Ray's RUNNING)
    marker = float(log.split(START_MARK, 1)[1].split()[0])
    assert st.started_at == pytest.approx(marker)
    assert len(processes_mentioning(str(run))) >= 4  # two torchruns, two ranks
    b.cancel(sid)
    st = b.status(sid)
    assert st.state is JobState.CANCELLED and st.ended_at is not None, st
    deadline = time.monotonic() + 20
    while processes_mentioning(str(run)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_mentioning(str(run)) == []
