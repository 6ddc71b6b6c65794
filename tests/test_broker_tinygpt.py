"""Real tinygpt runs (PyTorch, torchrun, 2 ranks) launched through the broker on the local backend.

Two calibration runs of the example campaign go through the real broker service over HTTP; each is
scored by the metrics reader from its own Megatron-format log and charged GPUs x (release -
admission). (Search candidates, hangs and out-of-memory failures are exercised with the stand-in
trainer in test_launch.py; a whole tinygpt mini-campaign is `benchmarks/bench_broker.py --tinygpt`.)
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from attune.control.campaign import start
from attune.control.spec import load_spec
from attune.core import ledger
from attune.readers.metrics import read_metrics
from broker.client import BrokerClient
from tests._broker_helpers import ROOT, wait_for
from tests.conftest import EXAMPLE_CAMPAIGN

pytestmark = pytest.mark.slow


def test_tinygpt_runs_through_the_broker_are_scored_and_charged(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    if not (ROOT / "examples" / "tinygpt" / "train.py").exists():
        pytest.skip("examples/tinygpt is not in this checkout")
    d = tmp_path / "tinygpt-local"
    d.mkdir()
    text = EXAMPLE_CAMPAIGN.read_text().replace("concurrency: 1", "concurrency: 2").replace("slots: 2", "slots: 4")
    (d / "campaign.yaml").write_text(text)
    start(d)
    proc = subprocess.Popen([sys.executable, "-m", "attune", "broker", "serve", "--campaign", str(d)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        endpoint = d / ".broker" / "endpoint.json"
        wait_for(lambda: endpoint.exists(), timeout_s=30)
        url, token = json.loads(endpoint.read_text())["url"], (d / ".broker" / "token").read_text().strip()
        with BrokerClient(url, token) as c:
            launched = [c.launch(kind="calibration") for _ in range(2)]
            assert [s for s, _ in launched] == [201, 201], launched
            runs = [c.wait(p["run_id"], timeout_s=240, interval_s=1.0) for _, p in launched]
            status, camp = c.call("GET", "/v1/campaign")
            status, found = c.call("GET", "/v1/image/search", params={"pattern": r'"--micro-batch-size"',
                                                                       "glob": "*.py"})
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)

    rows = ledger.read(d).rows
    for run in runs:
        rid = run["run_id"]
        run_dir = d / "runs" / rid
        assert run["outcome"] == "ok", run
        # scored: the metrics reader on the run's own log gives the recorded throughput and validity (on a
        # busy machine a run's step times can spread beyond the reader's limit: then it is invalid, and
        # does not count toward calibration)
        m = read_metrics(run_dir / "log.txt", gpus=2, window=(4, 13),
                         max_spread=load_spec(d).workload.max_step_time_spread)
        assert run["tokens_per_s_per_gpu"] == pytest.approx(m.tokens_per_s_per_gpu) and run["tokens_per_s_per_gpu"] > 0
        assert run["valid"] == m.valid and run["invalid_reasons"] == m.invalid_reasons
        assert run["verdict"] == ("calibration" if m.valid else "invalid")
        assert "[Rank 1]" in (run_dir / "log.txt").read_text()  # both torchrun ranks ran
        # the job the run generator built reached the trainer: its resolved arguments say so
        assert m.arguments["seq_length"] == "128" and m.arguments["global_batch_size"] == "16"
        assert m.arguments["run_dir"] == str(run_dir)  # the stack fix
        # charged GPUs x (release - admission), from the backend's own times
        fin = next(r.data for r in rows if r.type == "run_finished" and r.data["run_id"] == rid)
        assert fin["charge_gpu_hours"] == pytest.approx(2 * (fin["ended_at"] - fin["started_at"]) / 3600, abs=2e-9)
        assert 3 < fin["ended_at"] - fin["started_at"] < 240
        types = [r.type for r in rows if r.data.get("run_id") == rid]
        assert types == ["launch_admitted", "run_submitted", "run_started", "run_finished", "measurement"] + (
            ["calibration_run"] if m.valid else [])
    assert camp["calibration"]["runs"] == sum(r["valid"] for r in runs)
    assert camp["budget"]["charged_gpu_hours"] == pytest.approx(
        sum(r["charge_gpu_hours"] for r in runs), abs=1e-8)
    assert [m["path"] for m in found["matches"]] == ["tinygpt/config.py"]
