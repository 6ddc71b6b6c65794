from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from attune.knowledge.catalog import (
    LESSONS_PATH,
    LEVERS_PATH,
    CatalogError,
    load_catalog,
    load_lessons,
    schema_texts,
)
from attune.knowledge.lessons import check_text, known_model_names
from tests.conftest import run_cli
from tests.skill_helpers import run_script

# Levers the brief names, by catalog id.
REQUIRED = {
    "tensor-parallel", "pipeline-parallel", "virtual-pipeline", "context-parallel", "expert-parallel",
    "expert-tensor-parallel", "data-parallel", "pipeline-stage-split", "sequence-parallel",
    "distributed-optimizer", "overlap-grad-reduce", "overlap-param-gather", "ddp-bucket-size",
    "recompute-granularity", "recompute-method", "recompute-modules", "moe-dispatcher", "moe-flex-backend",
    "moe-comm-sms", "moe-grouped-gemm", "moe-permute-fusion", "ep-comm-overlap", "tp-comm-overlap",
    "delay-wgrad", "moe-shared-expert-overlap", "cuda-graphs", "manual-gc", "expandable-segments",
    "cuda-device-max-connections", "nccl-tuning", "optimizer-cpu-offload", "micro-batch-size",
    "cross-entropy-fusion", "tinygpt-threads-per-rank", "tinygpt-optimizer-impl", "tinygpt-torch-compile",
    "tinygpt-ddp-bucket-size", "tinygpt-data-parallel", "tinygpt-recompute",
}


def test_committed_schemas_match_the_models() -> None:
    for path, text in schema_texts().items():
        assert path.read_text() == text, f"{path.name} is stale: run `attune catalog schema --write`"


def test_catalog_validates_and_has_the_levers() -> None:
    cat = load_catalog()
    ids = {lv.id for lv in cat.levers}
    assert len(cat.levers) >= 30
    assert ids >= REQUIRED, sorted(REQUIRED - ids)
    for lv in cat.levers:
        assert lv.objective_class in ("structural", "same-math", "numeric")
        assert lv.helps_when and lv.hurts_when and lv.verify and lv.flags and lv.sources
        assert lv.direction.throughput in ("up", "down", "none", "either")
    # the YAML also validates against the committed JSON Schema (what other tools use)
    schema = json.loads((LEVERS_PATH.parent / "levers.schema.json").read_text())
    jsonschema.validate(yaml.safe_load(LEVERS_PATH.read_text()), schema)
    classes = {lv.id: lv.objective_class for lv in cat.levers}
    assert classes["moe-dispatcher"] == "same-math" and classes["grad-reduce-in-bf16"] == "numeric"
    assert classes["tensor-parallel"] == "structural"


def test_catalog_prose_names_no_model() -> None:
    """The catalog states general rules: apart from tinygpt, the embedded example stack, it names no model."""
    names = [n for n in known_model_names() if n not in ("tinygpt", "tinygpt-4l")]
    for lv in load_catalog().levers:
        data = lv.model_dump(exclude={"id", "frameworks", "sources", "code_hints", "flags", "couplings"})
        texts = [data["title"], data["mechanism"], *data["helps_when"], *data["hurts_when"],
                 data["rough_size"]["note"], *data["constraints"], *data["verify"]]
        for t in texts:
            hits = [p for p in check_text("text", t, names) if "model" in p.reason]
            assert not hits, (lv.id, t, hits)


def _write_catalog(tmp_path: Path, mutate) -> Path:
    data = yaml.safe_load(LEVERS_PATH.read_text())
    mutate(data)
    p = tmp_path / "levers.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


@pytest.mark.parametrize(
    ("mutate", "where", "what"),
    [
        (lambda d: d["levers"][0].update(objective_class="faster"), "levers[0].objective_class", "structural"),
        (lambda d: d["levers"][1]["couplings"].append({"lever": "no-such", "note": "x y z"}), "(top level)",
         "unknown lever 'no-such'"),
        (lambda d: d["levers"].append(dict(d["levers"][0])), "(top level)", "duplicate lever id"),
        (lambda d: d["levers"][2]["flags"].append({"name": "tp", "kind": "arg"}), "levers[2].flags[2]",
         "--flag-name"),
        (lambda d: d["levers"][3].pop("verify"), "levers[3].verify", "Field required"),
    ],
)
def test_bad_catalog_is_rejected_naming_the_field(tmp_path: Path, mutate, where: str, what: str) -> None:
    p = _write_catalog(tmp_path, mutate)
    with pytest.raises(CatalogError) as exc:
        load_catalog(p)
    assert any(f.startswith(where) and what in m for f, m in exc.value.problems), exc.value.problems
    assert not any(m.startswith("Value error") for _, m in exc.value.problems)


def test_cli_validate_reports_a_bad_catalog(tmp_path: Path) -> None:
    p = _write_catalog(tmp_path, lambda d: d["levers"][0].update(objective_class="faster"))
    res = run_cli("catalog", "validate", "--levers", str(p), "--json")
    assert res.returncode == 1
    out = json.loads(res.stdout)
    assert out["ok"] is False and out["problems"][0]["field"] == "levers[0].objective_class"


def test_lessons_file_validates() -> None:
    lessons = load_lessons(LESSONS_PATH, load_catalog())
    schema = json.loads((LESSONS_PATH.parent / "lessons.schema.json").read_text())
    jsonschema.validate(yaml.safe_load(LESSONS_PATH.read_text()), schema)
    assert isinstance(lessons, list)


def test_lessons_file_with_a_figure_fails_validation(tmp_path: Path) -> None:
    p = tmp_path / "lessons.yaml"
    p.write_text(yaml.safe_dump([{"id": "L0001", "lever": "tensor-parallel", "rule": "TP 1 was 20% faster here",
                                  "added": "2026-01-01"}]))
    with pytest.raises(CatalogError, match="percentage"):
        load_lessons(p, load_catalog())
    res = run_cli("catalog", "validate", "--lessons", str(p), "--json")
    assert res.returncode == 1 and json.loads(res.stdout)["lessons"] == 0


def test_cli_validate_ok_and_missing_file() -> None:
    res = run_cli("catalog", "validate", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    out = json.loads(res.stdout)
    assert out == {"ok": True, "levers": len(load_catalog().levers), "lessons": len(load_lessons()),
                   "schemas_in_sync": True, "problems": []}
    missing = run_cli("catalog", "validate", "--levers", "/nonexistent/levers.yaml")
    assert missing.returncode == 2 and "no such file" in missing.stderr


def test_levers_script_lists_and_shows() -> None:
    res = run_script("levers.py", "--framework", "tinygpt", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["count"] == len(out["levers"]) >= 7
    assert all(r["id"].startswith("tinygpt-") or "tinygpt" in r["id"] or r["id"] in
               ("micro-batch-size", "expandable-segments", "grad-reduce-in-bf16") for r in out["levers"])
    one = run_script("levers.py", "expert-parallel", "--json")
    lv = json.loads(one.stdout)
    assert lv["id"] == "expert-parallel" and "lessons" in lv and lv["objective_class"] == "structural"
    numeric = json.loads(run_script("levers.py", "--class", "numeric", "--json").stdout)
    assert {r["id"] for r in numeric["levers"]} == {"grad-reduce-in-bf16", "moe-force-load-balancing",
                                                    "low-precision-fp8"}
    bad = run_script("levers.py", "no-such-lever")
    assert bad.returncode == 2 and "unknown lever" in bad.stderr
