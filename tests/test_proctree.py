"""broker/backends/proctree.py with real processes: a job's tree is stopped whole, ranks in sessions of their
own included, and the watchdog that the Ray driver starts beside each node kills the tree its owner leaves."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from broker.backends import proctree
from tests._broker_helpers import wait_for

# bash starts a "launcher" (python) that starts a "rank" in a session of its own, as torchrun does.
LAUNCHER = (
    "import subprocess, sys, time\n"
    "rank = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], start_new_session=True)\n"
    "open(sys.argv[1], 'w').write(str(rank.pid))\n"
    "time.sleep(300)\n"
)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _start(tmp: Path) -> tuple[subprocess.Popen[bytes], int]:
    pid_file = tmp / "rank.pid"
    root = subprocess.Popen(["bash", "-c", f'{sys.executable} -c "$1" {pid_file}; exit 0', "job", LAUNCHER],
                            start_new_session=True)
    wait_for(lambda: pid_file.exists() and pid_file.read_text() != "")
    return root, int(pid_file.read_text())


def test_a_signal_to_the_group_misses_a_rank_and_stop_tree_does_not(tmp_path: Path) -> None:
    root, rank = _start(tmp_path)
    try:
        found = proctree.tree(root.pid)
        assert root.pid in found and rank in found and len(found) == 3  # bash, launcher, rank
        # the premise: the group's signal leaves the rank running
        os.killpg(root.pid, 9)
        root.wait()
        time.sleep(0.3)
        assert _alive(rank) and rank not in proctree.tree(root.pid)  # re-parented: out of the tree's reach
        os.kill(rank, 9)
        (tmp_path / "again").mkdir()
        root, rank = _start(tmp_path / "again")
        assert proctree.stop_tree(root.pid, grace_s=0.5, kill_wait_s=5.0)
        root.wait()
        wait_for(lambda: not _alive(rank), timeout_s=5)
    finally:
        for pid in (rank,):
            if _alive(pid):
                os.kill(pid, 9)


def test_a_reused_pid_is_never_signalled() -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        start = proctree.tree(sleeper.pid)[sleeper.pid]
        assert proctree.alive({sleeper.pid: start + 1}) == {}  # another start time: another process
        proctree.signal_all({sleeper.pid: start + 1}, 9)
        time.sleep(0.2)
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()


def test_the_watchdog_kills_the_tree_its_owner_leaves(tmp_path: Path) -> None:
    owner = subprocess.Popen(["sleep", "300"])
    root, rank = _start(tmp_path)
    source = Path(proctree.__file__).read_text()
    # started as the Ray driver's actor starts it: the module's text, run with `python -I -c`
    dog = subprocess.Popen([sys.executable, "-I", "-c", source, str(owner.pid), str(root.pid)],
                           start_new_session=True)
    try:
        time.sleep(1.2)  # it records the tree
        assert _alive(rank) and dog.poll() is None
        owner.kill()
        owner.wait()
        wait_for(lambda: not _alive(rank), timeout_s=10)
        root.wait(timeout=10)
        dog.wait(timeout=40)
    finally:
        for p in (owner, root, dog):
            if p.poll() is None:
                p.kill()
        if _alive(rank):
            os.kill(rank, 9)
