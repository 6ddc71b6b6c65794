"""Correctness lists describe objective classes, not one cluster: world size and batch geometry follow the
campaign (`gate.lists.for_campaign`, `attune.control.plane.load_gate_list`), and `attune validate` warns
when a list would refuse the campaign's own search space."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from attune.control.plane import load_gate_list
from attune.control.spec import load_spec
from gate.config_check import check_resolved
from gate.lists import load_list

ROOT = Path(__file__).resolve().parents[1]
GLM = ROOT / "examples" / "campaigns" / "glm45-128xb200"


def _campaign(tmp_path: Path, edit: dict) -> Path:
    d = tmp_path / "c"
    shutil.copytree(GLM, d)
    spec = yaml.safe_load((d / "campaign.yaml").read_text())
    for section, values in edit.items():
        if isinstance(values, dict) and isinstance(spec.get(section), dict):
            spec[section].update(values)
        else:
            spec[section] = values
    (d / "campaign.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return d


def test_list_world_size_follows_the_campaign(tmp_path: Path) -> None:
    d = _campaign(tmp_path, {"cluster": {"gpus": 64}})
    spec = load_spec(d / "campaign.yaml")
    resolved = {"world_size": 64, "seq_length": spec.workload.seq_length, "micro_batch_size": 1,
                "tensor_model_parallel_size": 2}
    moved = {**resolved, "tensor_model_parallel_size": 1}
    raw = load_list("glm-4.5")
    # The file as written pins the paper's 128 GPUs: on 64 every candidate is refused ...
    refused = check_resolved(raw, resolved, moved)
    assert not refused.passed and any(r.name == "world_size" for r in refused.refusals)
    # ... the list as the campaign applies it pins the campaign's 64 and passes the same structural move.
    bound = load_gate_list(spec, d, None)
    assert bound.sha256 == raw.sha256  # the pinned file is unchanged
    assert bound.clist.args["world_size"].value == 64
    ok = check_resolved(bound, resolved, moved)
    assert ok.passed, ok.summary()
    # A run at a GPU count other than the campaign's is still refused.
    assert not check_resolved(bound, resolved, {**moved, "world_size": 128}).passed


def test_validate_warns_when_the_list_refuses_the_search_space(tmp_path: Path) -> None:
    d = _campaign(tmp_path, {"search_space": {"--tensor-model-parallel-size": [1, 2],
                                              "--micro-batch-size": [1, 2]}})
    out = subprocess.run([sys.executable, "-m", "attune", "validate", str(d), "--json"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    warnings = json.loads(out.stdout)["warnings"]
    assert len(warnings) == 1 and warnings[0].startswith("search_space.--micro-batch-size"), warnings
    # The example's own space draws no warning, at its own GPU count or another.
    d2 = _campaign(tmp_path / "b", {"cluster": {"gpus": 64}})
    out2 = subprocess.run([sys.executable, "-m", "attune", "validate", str(d2), "--json"],
                          capture_output=True, text=True, cwd=ROOT)
    assert out2.returncode == 0 and json.loads(out2.stdout)["warnings"] == [], out2.stdout + out2.stderr
