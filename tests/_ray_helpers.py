"""A real one-machine Ray cluster for the Ray backend's tests (not a test module).

`ray_cluster` (a session fixture) starts a cluster of the tests' own with scripts/start-ray.sh: its own temp
dir and ports (free ones, picked when this module is imported, so RAY_ADDRESS is known to the tests), never
Ray's defaults, and stops it (its processes, by pid, and the jobs they ran) when the session ends, however
it ends. ATTUNE_TEST_RAY_ADDRESS names a running cluster to use instead (nothing is then started or
stopped). Where Ray is not installed the tests skip and say why, unless ATTUNE_REQUIRE_RAY=1 (CI sets it):
then they fail, so that CI can never pass by skipping them.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
START_SCRIPT = ROOT / "scripts" / "start-ray.sh"
PORT_VARS = ("RAY_GCS_PORT", "RAY_DASHBOARD_PORT", "RAY_NODE_MANAGER_PORT", "RAY_OBJECT_MANAGER_PORT",
             "RAY_CLIENT_SERVER_PORT", "RAY_DASHBOARD_AGENT_GRPC_PORT", "RAY_DASHBOARD_AGENT_LISTEN_PORT",
             "RAY_METRICS_EXPORT_PORT", "RAY_RUNTIME_ENV_AGENT_PORT")


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _worker_range(width: int = 64) -> tuple[int, int]:
    """A run of free ports for Ray's workers, away from the ephemeral range the others come from."""
    import random

    rng = random.Random(os.getpid())
    for _ in range(50):
        lo = rng.randrange(20000, 30000 - width)
        try:
            held = []
            for p in range(lo, lo + width):
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", p))
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
        return lo, lo + width - 1
    raise RuntimeError("no free run of ports for Ray's workers")


EXTERNAL = os.environ.get("ATTUNE_TEST_RAY_ADDRESS")
_PORTS = dict(zip(PORT_VARS, _free_ports(len(PORT_VARS)), strict=True)) if not EXTERNAL else {}
RAY_ADDRESS = EXTERNAL or f"http://127.0.0.1:{_PORTS['RAY_DASHBOARD_PORT']}"

# A tiny real tinygpt (torchrun, 1 CPU rank): a few seconds of PyTorch per run on a busy core.
TINY_ARGS = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "2", "--seq-length", "64",
             "--micro-batch-size", "1", "--global-batch-size", "4", "--lr", "0.001", "--log-interval", "1",
             "--seed", "1234"]


def tinygpt_argv(run_dir: Path, iters: int, *extra: str, torchrun: bool = False) -> tuple[str, ...]:
    """A tinygpt run: one process (the fastest start on a busy machine), or torchrun with its rank."""
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1"] if torchrun else []
    # absolute: a job runs in its run directory, as the run generator's job_command makes the baseline's words
    train = str(Path(__file__).resolve().parents[1] / "examples" / "tinygpt" / "train.py")
    return (sys.executable, *launcher, train, *TINY_ARGS, "--train-iters", str(iters),
            "--run-dir", str(run_dir), *extra)


def _answers() -> bool:
    try:
        with urllib.request.urlopen(RAY_ADDRESS + "/api/version", timeout=3) as r:
            return r.status == 200
    except OSError:
        return False


def _mentions(pid: int, temp_dir: str, gcs_port: int) -> bool:
    """Whether the process is this cluster's: its command line or environment names the temp dir, or its
    RAY_ADDRESS is the cluster's GCS (a job's processes)."""
    for part in ("cmdline", "environ"):
        try:
            data = Path(f"/proc/{pid}/{part}").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if temp_dir in data:
            return True
        if part == "environ" and any(v.startswith("RAY_ADDRESS=") and v.endswith(f":{gcs_port}")
                                     for v in data.split("\0")):
            return True
    return False


def stop_own_cluster(temp_dir: str, gcs_port: int) -> list[int]:
    """End this cluster's processes (Ray's daemons name its temp dir; its jobs carry its GCS address), by pid:
    SIGTERM, then SIGKILL for any left after a few seconds. Returns the pids it signalled."""
    me = os.getpid()
    pids = [int(e.name) for e in Path("/proc").iterdir()
            if e.name.isdigit() and int(e.name) != me and _mentions(int(e.name), temp_dir, gcs_port)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 5.0
        while sig == signal.SIGTERM and time.monotonic() < deadline and any(Path(f"/proc/{p}").exists()
                                                                            for p in pids):
            time.sleep(0.2)
    return pids


def _absent(why: str) -> None:
    if os.environ.get("ATTUNE_REQUIRE_RAY") == "1":
        pytest.fail(f"ATTUNE_REQUIRE_RAY=1 but {why}")
    pytest.skip(why)


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[str]:
    """The Jobs API address of a one-machine Ray cluster of the tests' own, stopped when the session ends."""
    try:
        import ray.job_submission  # noqa: F401
    except ImportError:
        _absent("Ray is not installed (pip install 'attune[ray]'; scripts/setup.sh installs it)")
    if not (ROOT / "examples" / "tinygpt" / "train.py").exists():
        _absent("examples/tinygpt is not in this checkout")
    if EXTERNAL:
        if not _answers():
            pytest.fail(f"no Ray cluster answers at ATTUNE_TEST_RAY_ADDRESS={EXTERNAL}")
        yield EXTERNAL
        return
    # A short temp dir: Ray's unix sockets live under it (at most 107 characters a path).
    temp_dir = tempfile.mkdtemp(prefix="attune-ray-", dir="/tmp")
    lo, hi = _worker_range()
    env = {**os.environ, "ATTUNE_VENV": str(Path(sys.executable).parent.parent), "RAY_TEMP_DIR": temp_dir,
           **{k: str(v) for k, v in _PORTS.items()}, "RAY_MIN_WORKER_PORT": str(lo), "RAY_MAX_WORKER_PORT": str(hi),
           "RAY_NUM_CPUS": os.environ.get("ATTUNE_TEST_RAY_CPUS", "2"), "RAY_START_TIMEOUT": "180"}

    def stop() -> None:
        stop_own_cluster(temp_dir, _PORTS["RAY_GCS_PORT"])
        shutil.rmtree(temp_dir, ignore_errors=True)

    atexit.register(stop)  # a session that dies without its teardown still stops the cluster
    try:
        proc = subprocess.run(["bash", str(START_SCRIPT)], capture_output=True, text=True, timeout=420, env=env)
        if proc.returncode != 0 or not _answers():
            pytest.fail(f"scripts/start-ray.sh could not start a Ray cluster:\n{proc.stderr[-3000:]}")
        yield RAY_ADDRESS
    finally:
        stop()
        atexit.unregister(stop)


def processes_mentioning(text: str) -> list[int]:
    """Pids of live (non-zombie) processes whose command line contains `text`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if text in cmd and stat[stat.rfind(")") + 2:].split()[0] != "Z":
            found.append(int(entry.name))
    return found
