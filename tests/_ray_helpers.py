"""A real one-machine Ray cluster for the Ray backend's tests (not a test module).

`ray_cluster` (a session fixture) finds the cluster's Jobs API answering at RAY_ADDRESS, or starts it with
scripts/start-ray.sh (idempotent). Where Ray is not installed the tests skip and say why, unless
ATTUNE_REQUIRE_RAY=1 (CI sets it): then they fail, so that CI can never pass by skipping them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RAY_ADDRESS = os.environ.get("ATTUNE_TEST_RAY_ADDRESS", "http://127.0.0.1:8265")
START_SCRIPT = ROOT / "scripts" / "start-ray.sh"

# A tiny real tinygpt (torchrun, 1 CPU rank): a few seconds of PyTorch per run on a busy core.
TINY_ARGS = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "2", "--seq-length", "64",
             "--micro-batch-size", "1", "--global-batch-size", "4", "--lr", "0.001", "--log-interval", "1",
             "--seed", "1234"]


def tinygpt_argv(run_dir: Path, iters: int, *extra: str, torchrun: bool = False) -> tuple[str, ...]:
    """A tinygpt run: one process (the fastest start on a busy machine), or torchrun with its rank."""
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1"] if torchrun else []
    return (sys.executable, *launcher, "examples/tinygpt/train.py", *TINY_ARGS, "--train-iters", str(iters),
            "--run-dir", str(run_dir), *extra)


def _answers() -> bool:
    try:
        with urllib.request.urlopen(RAY_ADDRESS + "/api/version", timeout=3) as r:
            return r.status == 200
    except OSError:
        return False


def _absent(why: str) -> None:
    if os.environ.get("ATTUNE_REQUIRE_RAY") == "1":
        pytest.fail(f"ATTUNE_REQUIRE_RAY=1 but {why}")
    pytest.skip(why)


@pytest.fixture(scope="session")
def ray_cluster() -> str:
    """The Jobs API address of a running one-machine Ray cluster (started when needed)."""
    try:
        import ray.job_submission  # noqa: F401
    except ImportError:
        _absent("Ray is not installed (pip install 'attune[ray]'; scripts/setup.sh installs it)")
    if not (ROOT / "examples" / "tinygpt" / "train.py").exists():
        _absent("examples/tinygpt is not in this checkout")
    if not _answers():
        if RAY_ADDRESS != "http://127.0.0.1:8265":
            pytest.fail(f"no Ray cluster answers at ATTUNE_TEST_RAY_ADDRESS={RAY_ADDRESS}")
        env = {**os.environ, "ATTUNE_VENV": str(Path(sys.executable).parent.parent)}
        proc = subprocess.run(["bash", str(START_SCRIPT)], capture_output=True, text=True, timeout=300, env=env)
        if proc.returncode != 0 or not _answers():
            pytest.fail(f"scripts/start-ray.sh could not start a Ray cluster:\n{proc.stderr[-3000:]}")
    return RAY_ADDRESS


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
