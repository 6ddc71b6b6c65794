"""`attune sim estimate`: the JSON shape, --set changes, and bad input (exit 2, a clear message)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from attune.app.cli import main

ROOT = Path(__file__).resolve().parents[1]
GLM = str(ROOT / "examples" / "campaigns" / "glm45-128xb200")
KEYS = {"campaign", "model", "accelerator", "gpus", "changes", "outcome", "reason", "tokens_per_s_per_gpu",
        "step_time_ms", "mfu", "layout", "microbatches", "terms_ms", "memory", "defects", "unmodelled_flags",
        "critical_stage", "simulated", "note"}


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["sim", "estimate", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_json_shape_and_terms(capsys):
    rc, out, _ = run(capsys, GLM, "--json")
    assert rc == 0
    d = json.loads(out)
    assert set(d) == KEYS
    assert d["outcome"] == "ok" and d["simulated"] is True
    assert d["tokens_per_s_per_gpu"] == pytest.approx(723.6, rel=0.15)
    assert sum(d["terms_ms"].values()) == pytest.approx(d["step_time_ms"], rel=1e-6)
    assert len(d["memory"]["stages"]) == 8 and d["memory"]["fits"] is True
    assert d["layout"]["ep"] == 16 and d["microbatches"] == 256


def test_set_changes_the_recipe(capsys):
    rc, out, _ = run(capsys, GLM, "--set", "tensor-model-parallel-size=1", "--set=--sequence-parallel=false",
                     "--json")
    d = json.loads(out)
    assert rc == 0 and d["outcome"] == "oom" and d["tokens_per_s_per_gpu"] is None
    assert d["changes"] == {"--tensor-model-parallel-size": 1, "--sequence-parallel": None}
    assert d["memory"]["peak_gib"] > d["memory"]["capacity_gib"]
    rc, out, _ = run(capsys, GLM, "--set=--tensor-model-parallel-size=3", "--json")
    d = json.loads(out)
    assert d["outcome"] == "crash" and "divisible" in d["reason"]


def test_text_output(capsys):
    rc, out, _ = run(capsys, GLM)
    assert rc == 0 and "tokens/s/GPU" in out and "ep_a2a" in out and "simulated" in out


@pytest.mark.parametrize("argv, words", [
    (["/nonexistent/campaign.yaml"], "no such file"),
    ([GLM, "--set", "=3"], "FLAG=VALUE"),
    ([GLM, "--env", "NOEQUALS"], "NAME=VALUE"),
    ([str(ROOT / "examples" / "campaigns" / "tinygpt-local")], "accelerator"),
])
def test_bad_input_exits_2(capsys, argv, words):
    rc, _, err = run(capsys, *argv)
    assert rc == 2 and words in err


def test_installed_entry_point_runs():
    p = subprocess.run([sys.executable, "-m", "attune", "sim", "estimate", GLM, "--json"], capture_output=True,
                       text=True, cwd=ROOT, timeout=60)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["outcome"] == "ok"
