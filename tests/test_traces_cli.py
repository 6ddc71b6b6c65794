"""`attune trace analyze` as a user runs it: real subprocesses, JSON shape, text, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.trace_synth import write_run
from tests.traces_helpers import known_gpu_events, write_trace

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "attune", "trace", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def test_json_shape(tmp_path):
    write_run(tmp_path / "run" / "traces", pp=2, dp=1, steps=2, layers=2, microbatches=1, gz=True)
    p = cli("analyze", str(tmp_path / "run"), "--layout", "pp=2", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["schema"] == "attune.trace-analysis/1"
    assert set(doc) >= {"summary", "files", "layout", "stage_source", "slowest_stage", "stages", "ranks",
                        "top_kernels", "top_operators", "analysis_seconds"}
    assert doc["files"] == 2 and doc["stage_source"] == "layout"
    r = doc["ranks"][1]
    for key in ("compute_us", "non_compute_us", "idle_us", "comm_comp_overlap_pct", "span_us"):
        assert isinstance(r[key], float)
    assert r["stage"] == 1 and r["kind"] == "gpu" and r["steps"] == 2
    b = r["breakdown"]
    assert set(b["comm_exposed_by_kind"]) == {"pipeline_p2p", "all_to_all", "tp_collective", "cp_collective",
                                              "dp_reduce", "other_comm"}
    assert len(r["per_step"]) == 2 and r["per_step"][0]["step"] == 10
    assert doc["slowest_stage"]["stage"] in (0, 1) and doc["slowest_stage"]["waits_on"]


def test_text_output(tmp_path):
    write_trace(tmp_path / "r0.json", known_gpu_events())
    p = cli("analyze", str(tmp_path / "r0.json"))
    assert p.returncode == 0, p.stderr
    assert "slowest stage 0" in p.stdout and "gemm_kernel" in p.stdout and "HTA: compute ms" in p.stdout


def test_bad_input_exits_2(tmp_path):
    p = cli("analyze", str(tmp_path / "nope"), "--json")
    # under --json a usage error is also one JSON document on stdout (exit 2), the reason on stderr
    assert p.returncode == 2 and "no such file" in p.stderr
    out = json.loads(p.stdout)
    assert out["ok"] is False and out["exit_code"] == 2 and "no such file" in out["reason"]
    (tmp_path / "x.json").write_text("[]")
    p = cli("analyze", str(tmp_path / "x.json"))
    assert p.returncode == 2 and "not a JSON object" in p.stderr
    write_trace(tmp_path / "r0.json", known_gpu_events())
    p = cli("analyze", str(tmp_path / "r0.json"), "--layout", "pp=two")
    assert p.returncode == 2 and "pp must be a positive integer" in p.stderr
    p = cli("analyze", str(tmp_path / "r0.json"), "--jobs", "0")
    assert p.returncode == 2 and "--jobs" in p.stderr
