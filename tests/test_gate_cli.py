"""`attune gate ...`: exit codes 0/1/2 and the --json shapes, through the real CLI entry point."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from attune.app.cli import main
from gate.lists import LISTS_DIR, list_sha256
from tests.gate_fixtures import GLM, megatron_log


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def glm_recipe(tmp_path: Path) -> Path:
    p = tmp_path / "glm.json"
    p.write_text(json.dumps({"args": GLM, "env": {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}}))
    return p


def test_check_pass_and_refuse_exit_codes_and_json(capsys, glm_recipe):
    code, out, _ = run(capsys, "gate", "check", "--model", "glm-4.5", "--baseline", str(glm_recipe),
                       "--set", "tensor-model-parallel-size=1", "--set=--pipeline-model-parallel-size=16",
                       "--unset", "sequence-parallel", "--env", "NCCL_ALGO=Ring", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["passed"] is True and doc["mode"] == "recipe" and doc["model"] == "glm-4.5"
    assert doc["list_sha256"] == list_sha256(LISTS_DIR / "glm-4.5.yaml")
    assert {c["name"] for c in doc["changes"]} == {"tensor_model_parallel_size", "pipeline_model_parallel_size",
                                                    "sequence_parallel", "NCCL_ALGO"}
    assert set(doc) >= {"passed", "model", "list_sha256", "mode", "changes", "refusals", "defects", "summary"}

    code, out, _ = run(capsys, "gate", "check", "--model", "glm-4.5", "--baseline", str(glm_recipe),
                       "--set", "micro-batch-size=2", "--set", "moe-router-fusion", "--json")
    assert code == 1
    doc = json.loads(out)
    refused = {r["name"]: r for r in doc["refusals"]}
    assert refused["micro_batch_size"]["klass"] == "frozen"
    assert refused["moe_router_fusion"]["klass"] == "same_math"
    assert refused["fused-routing"]["kind"] == "defect"


def test_check_candidate_file_and_text_output(capsys, glm_recipe, tmp_path):
    cand = tmp_path / "cand.yaml"
    cand.write_text("args:\n" + "".join(f"  '{k}': {json.dumps(v)}\n" for k, v in {**GLM, "--lr": 3e-5}.items()))
    code, out, _ = run(capsys, "gate", "check", "--model", "glm-4.5", "--baseline", str(glm_recipe),
                       "--candidate", str(cand))
    assert code == 1
    assert "REFUSED --lr [numeric]" in out and "CUDA_DEVICE_MAX_CONNECTIONS" in out


def test_check_bad_inputs_exit_2(capsys, glm_recipe, tmp_path):
    code, _, err = run(capsys, "gate", "check", "--model", "nope", "--baseline", str(glm_recipe), "--set", "lr=1")
    assert code == 2 and "no correctness list for model 'nope'" in err
    code, _, err = run(capsys, "gate", "check", "--model", "glm-4.5", "--list-sha256", "0" * 64,
                       "--baseline", str(glm_recipe), "--set", "lr=1")
    assert code == 2 and "pins" in err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"args": {"tensor_model_parallel_size": 2}}))
    code, _, err = run(capsys, "gate", "check", "--model", "glm-4.5", "--baseline", str(bad), "--set", "lr=1")
    assert code == 2 and "not a flag" in err
    code, _, err = run(capsys, "gate", "check", "--model", "glm-4.5", "--baseline", str(glm_recipe))
    assert code == 2 and "--candidate or at least one" in err
    code, _, err = run(capsys, "gate", "check", "--model", "glm-4.5", "--baseline", str(tmp_path / "missing.json"),
                       "--set", "lr=1")
    assert code == 2 and "cannot read" in err


def test_pinned_hash_accepts_the_right_list(capsys, glm_recipe):
    sha = list_sha256(LISTS_DIR / "glm-4.5.yaml")
    code, out, _ = run(capsys, "gate", "check", "--model", "glm-4.5", "--list-sha256", sha, "--baseline",
                       str(glm_recipe), "--set", "overlap-grad-reduce", "--json")
    assert code == 0 and json.loads(out)["list_sha256"] == sha


def test_check_resolved_from_logs(capsys, tmp_path):
    base = {"tensor_model_parallel_size": 2, "bf16": True, "accumulate_allreduce_grads_in_fp32": True,
            "micro_batch_size": 1, "world_size": 128, "seq_length": 4096}
    b, c = tmp_path / "b.log", tmp_path / "c.log"
    b.write_text(megatron_log(base, {1: 10.0}))
    c.write_text(megatron_log({**base, "tensor_model_parallel_size": 4}, {1: 10.0}))
    env = tmp_path / "env.txt"
    env.write_text("# job env\nexport NCCL_ALGO=Tree\nTINYGPT_FAULT=labels-offset\n")
    code, out, _ = run(capsys, "gate", "check", "--model", "glm-4.5", "--resolved", "--baseline", str(b),
                       "--candidate", str(c), "--json")
    assert code == 0 and json.loads(out)["mode"] == "resolved"
    code, out, _ = run(capsys, "gate", "check", "--model", "glm-4.5", "--resolved", "--baseline", str(b),
                       "--candidate", str(c), "--candidate-env", str(env), "--json")
    assert code == 1
    assert {r["name"] for r in json.loads(out)["refusals"]} == {"TINYGPT_FAULT"}
    nolog = tmp_path / "empty.log"
    nolog.write_text("nothing here\n")
    code, _, err = run(capsys, "gate", "check", "--model", "glm-4.5", "--resolved", "--baseline", str(nolog),
                       "--candidate", str(c))
    assert code == 2 and "no resolved-arguments block" in err


def _curve(n=20):
    return {str(i): 10.0 - 0.2 * i for i in range(1, n + 1)}


def test_converge_json_files_and_logs(capsys, tmp_path):
    b = tmp_path / "b.json"
    b.write_text(json.dumps(_curve()))
    code, out, _ = run(capsys, "gate", "converge", str(b), str(b), "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["passed"] is True
    assert set(doc["checks"]) == {"correlation", "pointwise", "final_loss", "outliers"}
    assert doc["checks"]["correlation"]["value"] == pytest.approx(1.0)
    assert doc["deviation"]["max_rel"] == 0.0 and doc["skipped"] == 4

    # a NaN printed as JSON NaN, a null, and a training log with a dropped loss
    nan = tmp_path / "nan.json"
    cur = _curve()
    nan.write_text(json.dumps({**cur, "7": float("nan"), "9": None}))
    code, out, _ = run(capsys, "gate", "converge", str(b), str(nan), "--json")
    assert code == 1
    probs = " ".join(json.loads(out)["data_problems"])
    assert "non-finite loss at step(s) 7" in probs and "no loss at step(s) 9" in probs

    log = tmp_path / "run.log"
    log.write_text(megatron_log({"seed": 1}, {int(k): (None if k == "12" else v) for k, v in cur.items()}))
    code, out, _ = run(capsys, "gate", "converge", str(b), str(log))
    assert code == 1 and "no loss at step(s) 12" in out


def test_converge_returns_both_verdicts(capsys, tmp_path):
    b = tmp_path / "b.json"
    b.write_text(json.dumps(_curve()))
    off = tmp_path / "off.json"  # +2%: inside the reference's 10% band, far outside a 0.1% floor
    off.write_text(json.dumps({k: v * 1.02 for k, v in _curve().items()}))
    code, out, _ = run(capsys, "gate", "converge", str(b), str(off), "--json")
    doc = json.loads(out)
    assert code == 1 and doc["passed"] is False and doc["reference_passed"] is True
    na = doc["noise_aware"]
    # JSON curves: bf16 assumed (floor 0.25% for a change of unknown class), and the verdict says so
    assert na["passed"] is False and "level" in na["failed_checks"] and na["level"]["mean_z"] == pytest.approx(2.0 / 0.25)
    assert "floor alone" in na["envelope"]["basis"] and doc["precision"] == "bf16"
    assert doc["precision_source"] == "default" and doc["assumptions"]["noise_source"] == "floor"
    assert any(r.startswith("noise-aware: level") for r in doc["reasons"])
    # a replicate that differs by as much widens the envelope: then it passes
    rep = tmp_path / "rep.json"
    rep.write_text(json.dumps({k: v * (1.02 if int(k) % 2 else 0.98) for k, v in _curve().items()}))
    code, out, _ = run(capsys, "gate", "converge", str(b), str(off), "--replicate", str(rep), "--json")
    doc = json.loads(out)
    assert code == 0 and doc["passed"] and doc["noise_aware"]["envelope"]["pairs"][0]["b"] == "rep.json"
    code, out, _ = run(capsys, "gate", "converge", str(b), str(off))
    assert code == 1 and "reference rule: convergence passes" in out and "noise-aware check rejects" in out
    assert "  level         +2.0000% = +8.00 noise units (limit 4)  FAIL" in out
    code, _, err = run(capsys, "gate", "converge", str(b), str(off), "--k-sigma", "0")
    assert code == 2 and "--k-sigma" in err


def test_converge_bad_inputs_exit_2(capsys, tmp_path):
    b = tmp_path / "b.json"
    b.write_text(json.dumps(_curve()))
    for content, words in [("[true, [1]]", "JSON list must hold"), ('{"one": 1.0}', "not an integer"),
                           ('{"1": true}', "must be a number"), ('{"1": "abc"}', "must be a number"),
                           ("{}", "empty"), ("{not json", "not valid JSON")]:
        p = tmp_path / "c.json"
        p.write_text(content)
        code, _, err = run(capsys, "gate", "converge", str(b), str(p))
        assert code == 2 and words in err, (content, err)
    txt = tmp_path / "notes.txt"
    txt.write_text("hello\n")
    code, _, err = run(capsys, "gate", "converge", str(b), str(txt))
    assert code == 2 and "not a training log" in err


def test_explain_and_lists(capsys):
    code, out, _ = run(capsys, "gate", "explain", "no-gradient-accumulation-fusion", "--model", "minimax-m2", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["class"] == "same_math" and doc["component_test"] == "failed" and doc["flag"] == "--no-gradient-accumulation-fusion"
    code, out, _ = run(capsys, "gate", "lists", "--json")
    rows = {r["model"]: r for r in json.loads(out)["lists"]}
    assert rows["glm-4.5"]["sha256"] == list_sha256(LISTS_DIR / "glm-4.5.yaml")
    assert "pp32" in rows["glm-4.5"]["defects"]


def test_console_entry_point_runs_as_a_process(tmp_path):
    b = tmp_path / "b.json"
    b.write_text(json.dumps(_curve()))
    c = tmp_path / "c.json"
    c.write_text(json.dumps({k: v * 1.2 for k, v in _curve().items()}))
    proc = subprocess.run([sys.executable, "-m", "attune", "gate", "converge", str(b), str(c), "--json"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert json.loads(proc.stdout)["failed_checks"] == ["pointwise", "final_loss"]
