"""The Slurm backend against a real Slurm (slurmctld + slurmd on this machine).

The cluster is started by scripts/start-slurm.sh (idempotent; installs slurm-wlm with apt-get when
it is missing and we are root). Where Slurm is not installed and cannot be, the tests that need it
skip; the render/parse/mapping tests at the top run everywhere.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from broker.backends import get_backend
from broker.backends.base import Backend, BackendError, JobSpec, JobState, JobStatus
from broker.backends.slurm import (
    EXIT_MARKER,
    SCRIPT_NAME,
    SlurmBackend,
    _slurm_time,
    map_state,
    parse_scontrol,
)

ROOT = Path(__file__).resolve().parents[1]
START_SCRIPT = ROOT / "scripts" / "start-slurm.sh"

# A Megatron-like training job: per-iteration lines, a pid file, optional failure and sleep.
TRAIN = r"""
import os, sys, time
from datetime import datetime
iters, step_s, fail = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
open(os.path.join(os.environ["RUN_DIR"], "pid"), "w").write(str(os.getpid()))
print("using world size: 1, data-parallel size: 1", flush=True)
for i in range(1, iters + 1):
    time.sleep(step_s)
    print(f" [{datetime.now()}] iteration {i:8d}/{iters:8d} | consumed samples: {16 * i:12d} | "
          f"elapsed time per iteration (ms): {step_s * 1000:.1f} | learning rate: 1.000000E-03 | "
          f"global batch size: {16:5d} | lm loss: {10.5 - 0.1 * i:.6E} | loss scale: 1.0 | "
          "number of skipped iterations:   0 | number of nan iterations:   0 |", flush=True)
if fail:
    print("Traceback (most recent call last):\nRuntimeError: simulated crash", file=sys.stderr, flush=True)
    sys.exit(fail)
"""


# ---- no Slurm needed ------------------------------------------------------------------------------


def _spec(run_dir: Path, *, argv: tuple[str, ...] = ("python", "train.py"), **kw: object) -> JobSpec:
    fields: dict = dict(
        job_id="r7",
        campaign="camp",
        argv=argv,
        env={"OMP_NUM_THREADS": "1", "NOTE": "it's a test"},
        workdir=run_dir.parent,
        run_dir=run_dir,
        gpus=2,
        gpus_per_node=2,
    )
    fields.update(kw)
    return JobSpec(**fields)


def test_render_cpu_ranks_has_no_gpu_lines(tmp_path: Path) -> None:
    b = get_backend("slurm", {"gpu_request": "none", "partition": "debug", "time_limit_s": 90})
    text = b.render(_spec(tmp_path / "run"))
    sbatch = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    assert text.startswith("#!/bin/bash\n")
    assert "#SBATCH --nodes=1" in sbatch and "#SBATCH --ntasks-per-node=1" in sbatch
    assert "#SBATCH --cpus-per-task=2" in sbatch  # one core per CPU rank
    assert not any("gpu" in line for line in sbatch)
    assert "#SBATCH --time=0:02:00" in sbatch  # 90 s rounded up to whole minutes
    assert "#SBATCH --partition=debug" in sbatch
    assert f"#SBATCH --output={tmp_path / 'run' / 'log.txt'}" in sbatch
    assert "export NOTE='it'\"'\"'s a test'" in text  # shell-quoted
    assert "srun --export=ALL --kill-on-bad-exit=1 python train.py" in text
    assert EXIT_MARKER in text


def test_render_gpus_multinode_and_pyxis(tmp_path: Path) -> None:
    b = get_backend(
        "slurm",
        {"gpu_type": "h100", "container_runtime": "pyxis", "account": "llm", "extra_sbatch": ["--exclusive"]},
    )
    spec = _spec(
        tmp_path / "run",
        gpus=16,
        gpus_per_node=8,
        image="nvcr.io/nvidia/pytorch:24.05-py3",
        time_limit_s=3 * 86400 + 1,
    )
    text = b.render(spec)
    assert "#SBATCH --nodes=2" in text
    assert "#SBATCH --gpus-per-node=h100:8" in text
    assert "#SBATCH --account=llm" in text and "#SBATCH --exclusive" in text
    assert "#SBATCH --time=3-00:01:00" in text
    assert "--container-image=nvcr.io/nvidia/pytorch:24.05-py3" in text
    assert "MASTER_ADDR=$(scontrol show hostnames" in text
    gres = get_backend("slurm", {"gpu_request": "gres"}).render(
        _spec(tmp_path / "run", gpus=4, gpus_per_node=8)
    )
    assert "#SBATCH --gres=gpu:4" in gres and "MASTER_ADDR" not in gres
    assert "--exclude" not in text
    retry = b.render(_spec(tmp_path / "run", gpus=16, gpus_per_node=8, exclude_nodes=("node07", "node12")))
    assert "#SBATCH --exclude=node07,node12" in retry  # an infrastructure retry avoids the failed nodes


def test_render_and_settings_refuse_bad_input(tmp_path: Path) -> None:
    with pytest.raises(BackendError, match="gpu_reqest"):
        get_backend("slurm", {"gpu_reqest": "none"})
    with pytest.raises(BackendError, match="time_limit_s"):
        SlurmBackend(time_limit_s=-5)
    with pytest.raises(BackendError, match="extra_sbatch"):
        SlurmBackend(extra_sbatch=["exclusive"])
    b = SlurmBackend()
    with pytest.raises(BackendError, match="container_runtime"):
        b.render(_spec(tmp_path / "run", image="img:1"))
    with pytest.raises(BackendError, match="env name"):
        b.render(_spec(tmp_path / "run", env={"BAD-NAME": "1"}))
    with pytest.raises(BackendError, match="whitespace"):
        b.render(_spec(tmp_path / "my run"))
    with pytest.raises(BackendError, match="not a Slurm job id"):
        b.status("12; rm -rf /")


def test_state_mapping() -> None:
    table = {
        "PENDING": JobState.PENDING,
        "CONFIGURING": JobState.PENDING,
        "RUNNING": JobState.RUNNING,
        "COMPLETING": JobState.RUNNING,
        "COMPLETED": JobState.COMPLETED,
        "FAILED": JobState.FAILED,
        "OUT_OF_MEMORY": JobState.FAILED,
        "CANCELLED": JobState.CANCELLED,
        "TIMEOUT": JobState.TIMEOUT,
        "DEADLINE": JobState.TIMEOUT,
        "NODE_FAIL": JobState.INFRASTRUCTURE,
        "BOOT_FAIL": JobState.INFRASTRUCTURE,
        "PREEMPTED": JobState.INFRASTRUCTURE,
        "REQUEUED": JobState.INFRASTRUCTURE,
        "SOMETHING_NEW": JobState.INFRASTRUCTURE,
    }
    for slurm, ours in table.items():
        assert map_state(slurm) is ours, slurm
    assert map_state("CANCELLED by 0") is JobState.CANCELLED  # sacct's spelling
    assert map_state("FAILED", "NonZeroExitCode") is JobState.FAILED
    assert map_state("FAILED", "JobLaunchFailure") is JobState.INFRASTRUCTURE
    assert map_state("PENDING", "launch_failed_requeued_held") is JobState.INFRASTRUCTURE
    assert _slurm_time(1) == "0:01:00" and _slurm_time(3600) == "1:00:00"


def test_parse_scontrol_line() -> None:
    line = (
        "JobId=5 JobName=attune-c-r1 UserId=root(0) JobState=NODE_FAIL Reason=NodeDown "
        "ExitCode=0:15 StartTime=2026-11-29T09:57:37 EndTime=2026-11-29T09:57:38 "
        "ReqNodeList=(null) NodeList=vm BatchHost=vm AllocNode:Sid=localhost:7605 NodeList2= Power= \n"
    )
    f = parse_scontrol(line)
    assert f["JobState"] == "NODE_FAIL" and f["Reason"] == "NodeDown" and f["NodeList"] == "vm"
    assert f["ReqNodeList"] == "(null)" and f["AllocNode:Sid"] == "localhost:7605" and f["Power"] == ""


# ---- against a real Slurm -------------------------------------------------------------------------


def _idle_node() -> str | None:
    """The node's name when a Slurm cluster already answers with a usable node, else None."""
    if shutil.which("sinfo") is None:
        return None
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-o", "%N %T"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    parts = out.split()
    return parts[0] if len(parts) == 2 and parts[1] in ("idle", "mixed", "allocated") else None


@pytest.fixture(scope="module")
def slurm_node() -> str:
    """Start the one-machine Slurm cluster (idempotent); the node's name."""
    if os.geteuid() != 0:
        node = _idle_node()
        if node is None:
            pytest.skip("no running Slurm, and starting one needs root (run scripts/start-slurm.sh as root)")
        return node
    if shutil.which("slurmctld") is None and shutil.which("apt-get") is None:
        pytest.skip("slurmctld is not installed and cannot be installed here (no apt-get)")
    t0 = time.monotonic()
    proc = subprocess.run(["bash", str(START_SCRIPT)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"scripts/start-slurm.sh failed:\n{proc.stderr}"
    print(f"slurm started in {time.monotonic() - t0:.1f}s")
    node = _idle_node()
    assert node, "scripts/start-slurm.sh succeeded but sinfo shows no usable node"
    return node


@pytest.fixture
def backend(slurm_node: str) -> Iterator[SlurmBackend]:
    b = SlurmBackend(gpu_request="none", time_limit_s=300)
    yield b
    # Leave nothing behind: cancel whatever this test submitted that still runs.
    for backend_id in list(b._jobs):
        b.cancel(backend_id)


def _train_spec(tmp_path: Path, name: str, *, iters: int, step_s: float, fail: int = 0) -> JobSpec:
    run_dir = tmp_path / name
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    return JobSpec(
        job_id=name,
        campaign=f"test-{uuid.uuid4().hex[:6]}",
        argv=(sys.executable, str(script), str(iters), str(step_s), str(fail)),
        env={"RUN_DIR": str(run_dir), "PYTHONUNBUFFERED": "1"},
        workdir=tmp_path,
        run_dir=run_dir,
        gpus=1,
        gpus_per_node=1,
    )


def _wait(b: Backend, backend_id: str, until: Callable[[JobStatus], bool], timeout: float = 30) -> JobStatus:
    deadline = time.monotonic() + timeout
    while True:
        st = b.status(backend_id)
        if until(st):
            return st
        if time.monotonic() > deadline:
            raise AssertionError(f"job {backend_id} still {st} after {timeout}s")
        time.sleep(0.2)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait_gone(pid: int, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while _alive(pid):
        assert time.monotonic() < deadline, f"process {pid} still alive {timeout}s after the job ended"
        time.sleep(0.1)


def test_job_runs_to_completion_and_queueing_is_not_charged(
    backend: SlurmBackend, tmp_path: Path, slurm_node: str
) -> None:
    # Occupy the whole node so that our job has to queue.
    blocker = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--exclusive",
            "--no-requeue",
            "--job-name=attune-test-blocker",
            f"--output={tmp_path / 'blocker.txt'}",
            "--wrap",
            "sleep 120",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.strip()
    try:
        _wait(backend, blocker, lambda s: s.state is JobState.RUNNING)
        spec = _train_spec(tmp_path, "ok", iters=4, step_s=0.5)
        submitted = time.time()
        bid = backend.submit(spec)
        assert (spec.run_dir / SCRIPT_NAME).read_text() == backend.render(spec)
        time.sleep(3)
        st = backend.status(bid)
        assert st.state is JobState.PENDING and st.started_at is None and st.job_id == "ok", st
        assert "Resources" in (st.reason or "") or "Priority" in (st.reason or ""), st.reason
        # A job cancelled while still queued never started: nothing to charge.
        queued = backend.submit(_train_spec(tmp_path, "queued", iters=1, step_s=0.1))
        backend.cancel(queued)
        gone = _wait(backend, queued, lambda s: s.state.finished)
        assert gone.state is JobState.CANCELLED and gone.started_at is None and gone.nodes == [], gone
    finally:
        backend.cancel(blocker)
    released = time.time()
    running = _wait(backend, bid, lambda s: s.state is not JobState.PENDING)
    assert running.state in (JobState.RUNNING, JobState.COMPLETED)
    done = _wait(backend, bid, lambda s: s.state.finished)
    assert done.state is JobState.COMPLETED and done.exit_code == 0, done
    assert done.nodes == [slurm_node]
    assert done.started_at is not None and done.ended_at is not None
    # Charging starts at StartTime: after the 3 s in the queue (Slurm's times have 1 s resolution).
    assert done.started_at >= int(released) - 1 and done.started_at - submitted >= 2.0, (submitted, done)
    assert 1.0 <= done.ended_at - done.started_at <= 20, done
    log = spec.log_path.read_text()
    assert (
        log.count("] iteration ") == 4
        and "iteration        4/       4 | consumed samples:           64" in log
    )
    marker = (spec.run_dir / EXIT_MARKER).read_text()
    assert '"exit_code": 0' in marker and f'"slurm_job_id": "{bid}"' in marker


def test_failing_job_is_failed_with_its_exit_code(backend: SlurmBackend, tmp_path: Path) -> None:
    spec = _train_spec(tmp_path, "crash", iters=2, step_s=0.1, fail=3)
    bid = backend.submit(spec)
    st = _wait(backend, bid, lambda s: s.state.finished)
    assert st.state is JobState.FAILED and st.exit_code == 3, st
    assert "NonZeroExitCode" in (st.reason or "")
    log = spec.log_path.read_text()
    assert "RuntimeError: simulated crash" in log and "iteration        2/" in log


def test_cancel_running_job_kills_its_processes(backend: SlurmBackend, tmp_path: Path) -> None:
    spec = _train_spec(tmp_path, "cancel", iters=100, step_s=1.0)
    bid = backend.submit(spec)
    _wait(backend, bid, lambda s: s.state is JobState.RUNNING)
    pid_file = spec.run_dir / "pid"
    deadline = time.monotonic() + 20
    while not pid_file.exists():
        assert time.monotonic() < deadline, "the job never wrote its pid"
        time.sleep(0.1)
    pid = int(pid_file.read_text())
    assert _alive(pid)
    backend.cancel(bid)
    st = _wait(backend, bid, lambda s: s.state.finished)
    assert st.state is JobState.CANCELLED and st.ended_at is not None and st.started_at is not None, st
    _wait_gone(pid)
    backend.cancel(bid)  # idempotent on a finished job
    assert not (spec.run_dir / EXIT_MARKER).exists()


def test_exit_marker_once_slurm_forgot_the_job(slurm_node: str, tmp_path: Path) -> None:
    # Slurm forgets a finished job MinJobAge (300 s) after its end; waiting that long does not fit a
    # test, so this backend's scontrol answers "Invalid job id" for `show job` (as it would then) and
    # passes everything else to the real scontrol. sbatch and the job itself are real.
    forgetful = tmp_path / "scontrol-forgot"
    forgetful.write_text(
        '#!/bin/sh\nif [ "$1" = show ] && [ "$2" = job ]; then\n'
        '  echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1\nfi\nexec scontrol "$@"\n'
    )
    forgetful.chmod(0o755)
    b = SlurmBackend(gpu_request="none", scontrol=str(forgetful))
    spec = _train_spec(tmp_path, "forgot", iters=1, step_s=0.1)
    bid = b.submit(spec)
    deadline = time.monotonic() + 30
    while True:  # until the job has written its marker, the job is unknown to this backend
        marker_there = (spec.run_dir / EXIT_MARKER).exists()
        try:
            st = b.status(bid)
            break
        except BackendError as exc:
            assert "unknown" in str(exc) and not marker_there, exc
        assert time.monotonic() < deadline, "the job never wrote its exit marker"
        time.sleep(0.2)
    assert st.state is JobState.COMPLETED and st.exit_code == 0 and st.job_id == "forgot", st
    assert st.started_at is not None and st.ended_at is not None and 0 < st.ended_at - st.started_at < 20
    with pytest.raises(BackendError, match="not submitted by this backend"):
        SlurmBackend(scontrol=str(forgetful), sacct=None).status(bid)


def test_rendered_script_runs_by_hand_with_sbatch(backend: SlurmBackend, tmp_path: Path) -> None:
    spec = _train_spec(tmp_path, "byhand", iters=2, step_s=0.1)
    spec.run_dir.mkdir()
    script = spec.run_dir / "by-hand.sbatch"
    script.write_text(backend.render(spec))
    out = subprocess.run(
        ["sbatch", str(script)], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    assert out.startswith("Submitted batch job "), out
    bid = out.split()[-1]
    st = _wait(backend, bid, lambda s: s.state.finished)
    assert st.state is JobState.COMPLETED and st.exit_code == 0, st
    assert spec.log_path.read_text().count("] iteration ") == 2


def test_launch_failure_is_infrastructure(slurm_node: str, tmp_path: Path) -> None:
    # The run directory (a shared filesystem on a real cluster) vanishes while the job is queued:
    # slurmd cannot open the job's output, the command never starts.
    b = SlurmBackend(gpu_request="none", extra_sbatch=["--hold"])
    spec = _train_spec(tmp_path, "lostfs", iters=1, step_s=0.1)
    bid = b.submit(spec)
    try:
        assert b.status(bid).state is JobState.PENDING
        shutil.rmtree(spec.run_dir)
        subprocess.run(["scontrol", "release", bid], capture_output=True, text=True, timeout=30, check=True)
        st = _wait(b, bid, lambda s: s.state.finished)
        assert st.state is JobState.INFRASTRUCTURE and "JobLaunchFailure" in (st.reason or ""), st
    finally:
        b.cancel(bid)


def test_node_failure_is_infrastructure(backend: SlurmBackend, tmp_path: Path, slurm_node: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("taking the node down (scontrol update state=down) needs root")
    spec = _train_spec(tmp_path, "nodefail", iters=100, step_s=1.0)
    bid = backend.submit(spec)
    try:
        _wait(backend, bid, lambda s: s.state is JobState.RUNNING)
        while not (spec.run_dir / "pid").exists():
            time.sleep(0.1)
        pid = int((spec.run_dir / "pid").read_text())
        subprocess.run(
            ["scontrol", "update", f"nodename={slurm_node}", "state=down", "reason=attune-test"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        st = _wait(backend, bid, lambda s: s.state.finished)
        assert st.state is JobState.INFRASTRUCTURE and (st.reason or "").startswith("NODE_FAIL"), st
        assert st.started_at is not None and st.ended_at is not None
        _wait_gone(pid)
    finally:
        # ReturnToService=2 usually brings the node straight back; make sure it is idle again.
        deadline = time.monotonic() + 30
        while True:
            state = subprocess.run(
                ["sinfo", "-h", "-n", slurm_node, "-o", "%T"], capture_output=True, text=True, timeout=30
            ).stdout.strip()
            if state in ("idle", "mixed", "allocated"):
                break
            subprocess.run(
                ["scontrol", "update", f"nodename={slurm_node}", "state=resume"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert time.monotonic() < deadline, f"node {slurm_node} not back after the test: {state}"
            time.sleep(0.5)


def test_an_sbatch_that_fails_after_queueing_the_job_is_reconciled(slurm_node: str, tmp_path: Path) -> None:
    """sbatch errs (or times out) after Slurm queued the job: the backend finds it by its job name and working
    directory and tracks it, instead of declaring the submission failed and leaving it untracked (issue 26)."""
    flaky = ["bash", "-c", 'sbatch "$@" >/dev/null; echo "sbatch: error: Socket timed out" >&2; exit 1', "sbatch"]
    b = SlurmBackend(gpu_request="none", time_limit_s=300, sbatch=flaky)
    spec = _train_spec(tmp_path, "flaky", iters=2, step_s=0.1)
    bid = b.submit(spec)
    try:
        st = _wait(b, bid, lambda s: s.state.finished, timeout=120)
        assert st.state is JobState.COMPLETED and st.started_at is not None, st
    finally:
        b.cancel(bid)
    refused = SlurmBackend(gpu_request="none", sbatch=["bash", "-c", "exit 1", "sbatch"])
    with pytest.raises(BackendError, match="exited with 1"):
        refused.submit(_train_spec(tmp_path, "never", iters=1, step_s=0.1))
