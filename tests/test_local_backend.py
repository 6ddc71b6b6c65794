"""The local backend with real processes: slots, process groups, cancel, time limits, restarts."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from broker.backends import get_backend
from broker.backends.base import Backend, BackendError, JobSpec, JobState
from broker.backends.local import LocalBackend
from tests._broker_helpers import wait_for


def job(tmp: Path, name: str, script: str, gpus: int = 1, **kw: object) -> JobSpec:
    return JobSpec(job_id=name, campaign="c", argv=(sys.executable, "-c", script), env={"JOB_NAME": name},
                   workdir=tmp, run_dir=tmp / name, gpus=gpus, gpus_per_node=gpus, **kw)  # type: ignore[arg-type]


def finished(b: LocalBackend, bid: str) -> bool:
    return b.status(bid).state.finished


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purposes
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_registry_builds_a_local_backend_that_fits_the_protocol() -> None:
    b = get_backend("local", {"slots": 3})
    assert isinstance(b, Backend) and b.name == "local" and b.slots == 3  # type: ignore[attr-defined]
    with pytest.raises(BackendError, match="slots must be a positive integer"):
        get_backend("local", {"slots": 0})


def test_a_job_runs_logs_and_reports_its_exit(tmp_path: Path) -> None:
    b = LocalBackend(slots=2)
    ok = b.submit(job(tmp_path, "ok", "import os; print('hello from', os.environ['JOB_NAME'])"))
    bad = b.submit(job(tmp_path, "bad", "import sys; print('dying'); sys.exit(3)"))
    wait_for(lambda: finished(b, ok) and finished(b, bad))
    s_ok, s_bad = b.status(ok), b.status(bad)
    assert s_ok.state == JobState.COMPLETED and s_ok.exit_code == 0
    assert s_bad.state == JobState.FAILED and s_bad.exit_code == 3
    assert (tmp_path / "ok" / "log.txt").read_text() == "hello from ok\n"
    assert s_ok.started_at is not None and s_ok.ended_at is not None and s_ok.ended_at >= s_ok.started_at
    assert s_ok.nodes == [b.node]


def test_jobs_wait_for_slots_and_are_not_started_meanwhile(tmp_path: Path) -> None:
    b = LocalBackend(slots=2)
    first = b.submit(job(tmp_path, "first", "import time; time.sleep(0.6)", gpus=2))
    second = b.submit(job(tmp_path, "second", "print('second')", gpus=2))
    s = b.status(second)
    assert b.status(first).state == JobState.RUNNING
    assert s.state == JobState.PENDING and s.started_at is None  # queued: not admitted, not charged
    wait_for(lambda: finished(b, second), timeout_s=20)
    assert b.status(second).started_at >= b.status(first).ended_at - 0.05  # type: ignore[operator]
    with pytest.raises(BackendError, match="needs 3 slots"):
        b.submit(job(tmp_path, "big", "pass", gpus=3))


def test_cancel_kills_the_whole_process_group(tmp_path: Path) -> None:
    b = LocalBackend(slots=2, kill_grace_s=1.0)
    script = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
        "open('child.pid', 'w').write(str(child.pid))\n"
        "print('started', flush=True)\n"
        "time.sleep(300)\n"
    )
    bid = b.submit(job(tmp_path, "tree", script))
    pid_file = tmp_path / "tree" / "child.pid"  # the job works in its run directory
    wait_for(lambda: pid_file.exists() and pid_file.read_text() != "")
    child = int(pid_file.read_text())
    assert alive(child)
    b.cancel(bid)
    s = b.status(bid)
    assert s.state == JobState.CANCELLED and s.ended_at is not None
    wait_for(lambda: not alive(child), timeout_s=5)
    b.cancel(bid)  # idempotent


# A launcher such as torchrun starts each rank in a session of its own (start_new_session): a signal to the
# job's process group misses it, and once the launcher is killed the rank is re-parented out of reach.
SESSION_CHILD = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], start_new_session=True)\n"
    "open('child.pid', 'w').write(str(child.pid))\n"
    "print('started', flush=True)\n"
    "time.sleep(300)\n"
)


def test_cancel_kills_a_rank_that_left_the_process_group(tmp_path: Path) -> None:
    b = LocalBackend(slots=2, kill_grace_s=0.5)
    bid = b.submit(job(tmp_path, "ranks", SESSION_CHILD))
    pid_file = tmp_path / "ranks" / "child.pid"
    wait_for(lambda: pid_file.exists() and pid_file.read_text() != "")
    child = int(pid_file.read_text())
    assert alive(child) and os.getsid(child) == child  # a session (and group) of its own
    b.cancel(bid)
    assert b.status(bid).state == JobState.CANCELLED
    wait_for(lambda: not alive(child), timeout_s=5)


def test_the_time_limit_kills_a_rank_that_left_the_process_group(tmp_path: Path) -> None:
    b = LocalBackend(slots=1)
    bid = b.submit(job(tmp_path, "slowranks", SESSION_CHILD, time_limit_s=1.5))
    pid_file = tmp_path / "slowranks" / "child.pid"
    wait_for(lambda: pid_file.exists() and pid_file.read_text() != "")
    child = int(pid_file.read_text())
    wait_for(lambda: finished(b, bid), timeout_s=20)
    assert b.status(bid).state == JobState.TIMEOUT
    wait_for(lambda: not alive(child), timeout_s=5)


def test_time_limit(tmp_path: Path) -> None:
    b = LocalBackend(slots=1)
    bid = b.submit(job(tmp_path, "slow", "import time; time.sleep(300)", time_limit_s=0.3))
    wait_for(lambda: finished(b, bid), timeout_s=10)
    assert b.status(bid).state == JobState.TIMEOUT


def test_a_restarted_backend_adopts_its_jobs(tmp_path: Path) -> None:
    first = LocalBackend(slots=2)
    (tmp_path / "long").mkdir()
    (tmp_path / "long" / "job.json").write_text('{"run_id": "long", "campaign": "c", "gpus": 1}')
    long_id = first.submit(job(tmp_path, "long", "import time; print('x', flush=True); time.sleep(300)"))
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "job.json").write_text('{"run_id": "done", "campaign": "c", "gpus": 1}')
    done_id = first.submit(job(tmp_path, "done", "import sys; sys.exit(5)"))
    wait_for(lambda: finished(first, done_id))
    wait_for(lambda: (tmp_path / "long" / "log.txt").exists() and (tmp_path / "long" / "log.txt").stat().st_size > 0)

    second = LocalBackend(slots=2)  # the broker restarted: a fresh backend, the jobs still on disk
    s_long, s_done = second.status(long_id), second.status(done_id)
    assert s_long.state == JobState.RUNNING and s_long.started_at == first.status(long_id).started_at
    assert s_done.state == JobState.FAILED and s_done.exit_code == 5
    second.cancel(long_id)
    assert second.status(long_id).state == JobState.CANCELLED
    wait_for(lambda: finished(first, long_id))  # the original sees its child gone too
    with pytest.raises(BackendError, match="unknown local job"):
        second.status(str(tmp_path / "nothing"))


def test_a_forged_pid_in_the_run_directory_is_never_signalled(tmp_path: Path) -> None:
    """backend.json lies in the run directory, which the job may write: a job that rewrites its pid to another
    process (here one of the test's own, leading its own group, like a job would) does not get that process
    killed by a restarted broker's cancel. Its recorded pid runs another script, so the job counts as gone."""
    first = LocalBackend(slots=1)
    (tmp_path / "liar").mkdir()
    (tmp_path / "liar" / "job.json").write_text('{"run_id": "liar", "campaign": "c", "gpus": 1}')
    bid = first.submit(job(tmp_path, "liar", "import time; print('x', flush=True); time.sleep(300)"))
    wait_for(lambda: (tmp_path / "liar" / "log.txt").exists() and (tmp_path / "liar" / "log.txt").stat().st_size > 0)
    victim = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        meta = tmp_path / "liar" / "backend.json"
        forged = meta.read_text().replace(f'"pid": {first._jobs[bid].pid}', f'"pid": {victim.pid}')
        assert str(victim.pid) in forged
        meta.write_text(forged)
        second = LocalBackend(slots=1, kill_grace_s=0.2)  # the broker restarted
        assert second.status(bid).state != JobState.RUNNING
        second.cancel(bid)
        time.sleep(0.5)
        assert victim.poll() is None  # still running
    finally:
        victim.kill()
        victim.wait()
        first.cancel(bid)


def test_render_is_a_script_a_person_can_run(tmp_path: Path) -> None:
    b = LocalBackend(slots=1)
    spec = job(tmp_path, "by-hand", "import os; print(os.environ['JOB_NAME'], os.getcwd())")
    spec.run_dir.mkdir()
    (spec.run_dir / "job.sh").write_text(b.render(spec))
    t0 = time.time()
    subprocess.run(["/bin/sh", str(spec.run_dir / "job.sh")], check=True, env={"PATH": os.environ["PATH"]})
    assert (spec.run_dir / "log.txt").read_text() == f"by-hand {tmp_path / 'by-hand'}\n"  # run in its run directory
    rc, ended = (spec.run_dir / "exit_status").read_text().split()
    assert rc == "0" and float(ended) >= t0 - 1


def test_a_submit_error_after_the_job_started_is_reconciled_by_its_pid(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """An error after the process started (its record half-written, say) leaves a tracked job, found by the pid
    file; one before it started takes the job back, and the submission failed (issue 26)."""
    b = LocalBackend(slots=1)
    real = LocalBackend._start

    def start_then_fail(self: LocalBackend, j: object) -> None:
        real(self, j)  # type: ignore[arg-type]
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(LocalBackend, "_start", start_then_fail)
    bid = b.submit(job(tmp_path, "started", "print('ran')"))
    monkeypatch.setattr(LocalBackend, "_start", real)
    wait_for(lambda: finished(b, bid))
    assert b.status(bid).state == JobState.COMPLETED and (tmp_path / "started" / "log.txt").read_text() == "ran\n"

    def fail_first(self: LocalBackend, j: object) -> None:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(LocalBackend, "_start", fail_first)
    with pytest.raises(BackendError, match="could not be started: .*Too many open files"):
        b.submit(job(tmp_path, "never", "print('no')"))
    assert str((tmp_path / "never").resolve()) not in b._jobs and not b._queue
