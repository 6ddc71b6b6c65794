"""The metrics reader on a real tinygpt run (torchrun, 2 ranks, 14 steps), checked against what the
trainer itself recorded in its --metrics-out JSON."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.conftest import EXAMPLE_CAMPAIGN, run_cli

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "examples" / "tinygpt" / "train.py"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A campaign directory with one real run: runs/r1/log.txt (stdout and stderr) and the trainer's JSON."""
    d = tmp_path_factory.mktemp("campaign")
    shutil.copy(EXAMPLE_CAMPAIGN, d / "campaign.yaml")
    run = d / "runs" / "r1"
    run.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TINYGPT_") and k not in ("RANK", "WORLD_SIZE")}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(TRAIN),
           "--train-iters", "14", "--log-interval", "1", "--seq-length", "128", "--global-batch-size", "16",
           "--metrics-out", str(run / "trainer.json")]
    with open(run / "log.txt", "wb") as log:
        p = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env, timeout=300)
    assert p.returncode == 0, (run / "log.txt").read_text()[-3000:]
    return d, json.loads((run / "trainer.json").read_text())


def test_reader_matches_what_the_trainer_recorded(real_run: tuple[Path, dict]) -> None:
    d, trained = real_run
    res = run_cli("metrics", str(d / "runs" / "r1" / "log.txt"), "--gpus", "2", "--json")
    out = json.loads(res.stdout)
    assert res.returncode in (0, 1), res.stderr
    records = {r["iteration"]: r for r in trained["iterations"]}
    assert sorted(records) == list(range(1, 15))

    # per-step records, keyed by iteration: step times (printed to 0.1 ms) and losses (7 digits)
    steps = {s["iteration"]: s for s in out["steps"]}
    assert sorted(steps) == list(range(1, 15))
    for it, rec in records.items():
        assert steps[it]["step_time_ms"] == pytest.approx(rec["step_time_ms"], abs=0.05 + 1e-9)
        assert steps[it]["loss"] == pytest.approx(rec["lm_loss"], rel=1e-6)
        assert steps[it]["tokens"] == rec["tokens"] == 16 * 128

    # throughput over steps 4-13 = iterations 5-14: sum(tokens) / (GPUs x sum(step times))
    window = [records[i] for i in range(5, 15)]
    tokens = sum(r["tokens"] for r in window)
    printed = sum(round(r["step_time_ms"], 1) for r in window) / 1000.0
    exact = sum(r["step_time_ms"] for r in window) / 1000.0
    assert out["tokens_per_s_per_gpu"] == pytest.approx(tokens / (2 * printed), rel=1e-9)
    assert out["tokens_per_s_per_gpu"] == pytest.approx(tokens / (2 * exact), rel=5e-3)
    assert out["failure_class"] == "ok" and out["last_iteration"] == out["train_iters"] == 14
    # on a shared CPU the window may be noisy; nothing else may make it invalid
    assert out["valid"] or all("spread" in r for r in out["invalid_reasons"]), out["invalid_reasons"]

    # memory per rank: the peak over the rank's reports, and its latest report
    mem = {r["rank"]: r for r in out["memory"]["per_rank"]}
    assert sorted(mem) == [0, 1]
    for rank in trained["ranks"]:
        reports = rank["memory"]
        got = mem[rank["rank"]]
        assert got["max_allocated_mib"] == pytest.approx(max(m["max_allocated_mib"] for m in reports), abs=0.006)
        assert got["allocated_mib"] == pytest.approx(reports[-1]["allocated_mib"], abs=0.006)
        assert got["after_iterations"] == reports[-1]["iteration"]
        assert got["stage"] == 0
    assert out["memory"]["per_stage"][0]["ranks"] == [0, 1]

    # the resolved arguments block, every argument the trainer resolved
    assert out["arguments_complete"]
    assert out["arguments"] == {k: str(v) for k, v in trained["args"].items()}
    assert out["seq_length"] == 128 and out["seq_length_source"] == "log"


def test_metrics_server_reads_the_real_run(real_run: tuple[Path, dict]) -> None:
    d, trained = real_run
    params = StdioServerParameters(command=sys.executable, args=["-m", "mcp_servers.metrics_server"],
                                   env={"ATTUNE_CAMPAIGN_DIR": str(d), "PYTHONPATH": str(ROOT)}, cwd=str(ROOT))

    async def go():
        async with Client(params, read_timeout_seconds=60) as client:
            return await client.call_tool("run_metrics", {"run_id": "r1", "arguments": ["--global-batch-size"]})

    r = asyncio.run(go()).structured_content
    window = [x for x in trained["iterations"] if 5 <= x["iteration"] <= 14]
    expected = sum(x["tokens"] for x in window) / (2 * sum(round(x["step_time_ms"], 1) for x in window) / 1000)
    assert r["tokens_per_s_per_gpu"] == pytest.approx(expected, rel=1e-9)
    assert r["failure_class"] == "ok" and r["arguments"] == {"global_batch_size": "16"}
    assert [s["loss"] for s in r["steps"]] == pytest.approx([x["lm_loss"] for x in trained["iterations"]], rel=1e-6)
