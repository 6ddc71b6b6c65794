from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from attune.control.spec import SCHEMA_PATH, SpecError, json_schema, load_spec, schema_text
from tests.conftest import EXAMPLE_CAMPAIGN, run_cli


def _base() -> dict[str, Any]:
    return yaml.safe_load(EXAMPLE_CAMPAIGN.read_text())


def _write(tmp_path: Path, data: Any) -> Path:
    p = tmp_path / "campaign.yaml"
    p.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return p


def test_example_campaign_is_valid() -> None:
    spec = load_spec(EXAMPLE_CAMPAIGN)
    assert spec.workload.window == (4, 13)
    assert spec.workload.tokens == spec.workload.global_batch * spec.workload.seq_length
    assert spec.calibration.runs >= 5 and spec.budget.check_reserve_runs == 3
    res = run_cli("validate", str(EXAMPLE_CAMPAIGN), "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["valid"] is True and out["problems"] == [] and len(out["sha256"]) == 64


def test_committed_schema_matches_the_model() -> None:
    assert json.loads(SCHEMA_PATH.read_text()) == json_schema(), "run `attune schema --write`"
    assert SCHEMA_PATH.read_text() == schema_text()


def test_schema_accepts_the_example_and_rejects_what_the_model_rejects(tmp_path: Path) -> None:
    validator = jsonschema.Draft202012Validator(json_schema())
    assert not list(validator.iter_errors(_base()))
    bad = _base()
    bad["cluster"]["backend"] = "k8s"
    assert list(validator.iter_errors(bad))


def _mutate(path: str, value: Any) -> dict[str, Any]:
    data = _base()
    keys = path.split(".")
    node = data
    for k in keys[:-1]:
        node = node[k]
    if value is _DELETE:
        del node[keys[-1]]
    else:
        node[keys[-1]] = value
    return data


_DELETE = object()

BAD_CASES = [
    ("missing model", "model", _DELETE, "model", "required field is missing"),
    ("missing cluster gpus", "cluster.gpus", _DELETE, "cluster.gpus", "required field is missing"),
    ("wrong type gpus", "cluster.gpus", "two", "cluster.gpus", "valid integer"),
    ("wrong type seq", "workload.seq_length", [128], "workload.seq_length", "valid integer"),
    ("window past steps", "workload.window", [4, 14], "workload", "outside the run's steps 0..13"),
    ("window reversed", "workload.window", [9, 3], "workload", "0 <= first <= last"),
    ("negative budget", "budget.gpu_hours", -1.0, "budget.gpu_hours", "greater than 0"),
    ("unknown backend", "cluster.backend", "kubernetes-ish", "cluster.backend", "'local', 'slurm', 'sim' or 'ray'"),
    ("unknown framework", "framework", "deepspeed", "framework", "'megatron-lm'"),
    ("too few calibration runs", "calibration.runs", 3, "calibration.runs", "greater than or equal to 5"),
    ("flag without dashes", "baseline.args", {"lr": 1}, "baseline.args", "--flag-name"),
    ("unknown field", "budget.gpuhours", 3, "budget.gpuhours", "unknown field"),
    ("bad tokens per step", "workload.tokens_per_step", 7, "workload", "global_batch x seq_length"),
    ("bad list hash", "gate.list_sha256", "abc", "gate.list_sha256", "pattern"),
]


@pytest.mark.parametrize(("name", "path", "value", "field", "message"), BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_bad_campaign_files(tmp_path: Path, name: str, path: str, value: Any, field: str, message: str) -> None:
    p = _write(tmp_path, _mutate(path, value))
    with pytest.raises(SpecError) as info:
        load_spec(p)
    assert any(f == field and message in m for f, m in info.value.problems), info.value.problems
    res = run_cli("validate", str(p))
    assert res.returncode == 2
    assert field in res.stderr and message in res.stderr
    res_json = run_cli("validate", str(p), "--json")
    assert res_json.returncode == 2
    problems = json.loads(res_json.stdout)["problems"]
    assert any(pr["field"] == field and message in pr["message"] for pr in problems)


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    data = _mutate("cluster.backend", "nope")
    data["budget"]["gpu_hours"] = -3
    del data["model"]
    with pytest.raises(SpecError) as info:
        load_spec(_write(tmp_path, data))
    fields = {f for f, _ in info.value.problems}
    assert {"cluster.backend", "budget.gpu_hours", "model"} <= fields


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: a\nname: b\n", "duplicate key 'name'"),
        ("name: [unclosed\n", "invalid YAML"),
        ("- just\n- a list\n", "expected a mapping"),
    ],
)
def test_unparseable_files(tmp_path: Path, text: str, message: str) -> None:
    p = _write(tmp_path, text)
    res = run_cli("validate", str(p))
    assert res.returncode == 2 and message in res.stderr


def test_missing_file(tmp_path: Path) -> None:
    res = run_cli("validate", str(tmp_path / "nope.yaml"))
    assert res.returncode == 2 and "no such file" in res.stderr


def test_reserve_must_fit_budget(tmp_path: Path) -> None:
    data = _base()
    data["budget"].update({"gpu_hours": 10, "reserve_gpu_hours": 12})
    res = run_cli("validate", str(_write(tmp_path, data)))
    assert res.returncode == 2 and "reserve_gpu_hours (12.0) must be below gpu_hours (10.0)" in res.stderr
