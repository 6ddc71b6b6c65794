"""`attune metrics`, run as a user would: a subprocess of the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests._metrics_logs import OOM_TAIL, megatron_lm_log, step_times, write
from tests.conftest import run_cli


def test_json_shape_and_exit_codes(tmp_path: Path) -> None:
    good = write(tmp_path / "good.txt", megatron_lm_log())
    res = run_cli("metrics", good, "--gpus", "4", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    times = step_times()
    assert out["tokens_per_s_per_gpu"] == pytest.approx(16 * 1024 * 10 / (4 * sum(times[4:]) / 1000))
    assert out["valid"] is True and out["invalid_reasons"] == [] and out["failure_class"] == "ok"
    assert out["window"] == {"start_step": 4, "end_step": 13, "first_iteration": 5, "last_iteration": 14}
    assert [s["iteration"] for s in out["steps"]] == list(range(1, 15))
    assert {"iteration", "step_time_ms", "loss"} <= set(out["steps"][0])
    assert out["arguments"]["seq_length"] == "1024"
    assert out["memory"]["per_stage"][1]["max_allocated_mib"] == 5202.75
    # a failed run: the JSON still comes, the exit status says the measurement failed
    oom_lines = megatron_lm_log()[:25] + OOM_TAIL
    res = run_cli("metrics", write(tmp_path / "oom.txt", oom_lines), "--gpus", "4", "--json", "--exit-status", "1")
    assert res.returncode == 1
    out = json.loads(res.stdout)
    assert out["failure_class"] == "oom" and out["valid"] is False and out["tokens_per_s_per_gpu"] is None
    # the text report
    res = run_cli("metrics", good, "--gpus", "4", "--window", "4:13")
    assert res.returncode == 0 and "tokens/s/GPU over steps 4-13 (iterations 5-14)" in res.stdout


def test_bad_input_exits_2_with_the_field_named(tmp_path: Path) -> None:
    good = write(tmp_path / "good.txt", megatron_lm_log())
    no_args = write(tmp_path / "noargs.txt", megatron_lm_log(args=None))
    cases = [
        (["metrics", good, "--gpus", "4", "--window", "5"], "window: expected START:END"),
        (["metrics", good, "--gpus", "0"], "--gpus: expected a positive integer"),
        (["metrics", str(tmp_path / "missing.txt"), "--gpus", "4"], "LOG: no such file"),
        (["metrics", str(tmp_path), "--gpus", "4"], "LOG: is a directory"),
        (["metrics", no_args, "--gpus", "4"], "pass the sequence length (--seq-length)"),
        (["metrics", good, "--gpus", "4", "--seq-length", "4096"], "seq_length: 4096 was given but the log"),
    ]
    for argv, message in cases:
        res = run_cli(*argv, "--json")
        assert res.returncode == 2, (argv, res.stdout, res.stderr)
        # the reason on stderr; under --json either nothing on stdout or one JSON document saying it failed
        assert message in res.stderr
        assert res.stdout == "" or (json.loads(res.stdout)["ok"] is False and json.loads(res.stdout)["exit_code"] == 2)
    res = run_cli("metrics", no_args, "--gpus", "4", "--seq-length", "1024", "--json", "--no-steps", "--no-arguments")
    assert res.returncode == 0
    out = json.loads(res.stdout)
    assert "steps" not in out and "arguments" not in out and out["seq_length_source"] == "option"
