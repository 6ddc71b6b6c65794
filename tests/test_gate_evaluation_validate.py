"""The tinygpt validation harness, on a small selection of real (short) tinygpt runs."""

from __future__ import annotations

import json

import pytest

from gate.evaluation import validate

pytest.importorskip("torch")
if not validate.TRAIN.exists():  # pragma: no cover
    pytest.skip("examples/tinygpt is not in this checkout", allow_module_level=True)


def test_quick_validation_scores_each_kind_of_run(tmp_path):
    report = validate.run_validation(quick=True, steps=8, workdir=tmp_path, run_refused=False, replicates=1)
    rows = {r.run: r for r in report.rows}
    assert set(rows) == {"replicate-1", "data-parallel-2", "lr-x2", "labels-offset"}
    # one replicate check run of the baseline: on CPU it reproduces the baseline exactly
    assert report.envelopes["dense"]["deterministic"] is True and report.replicates == 1

    rep = rows["replicate-1"]
    assert rep.layer1 == "pass" and rep.layer2 == "pass" and rep.outcome == "correct"
    assert rep.reference == "pass" and rep.noise_aware == "pass" and rep.mean_z == 0.0
    assert rep.max_rel_dev == 0.0  # same data, same seed, CPU: the same losses

    dp = rows["data-parallel-2"]
    assert dp.outcome == "correct" and dp.layer1_resolved_passed is True  # world size changed: structural
    assert dp.run_info is not None and dp.run_info.returncode == 0

    lr = rows["lr-x2"]
    assert lr.outcome == "refused" and lr.layer1.startswith("refused: lr [numeric]")
    assert lr.layer2 == "no run" and lr.run_info is None

    fault = rows["labels-offset"]
    assert fault.layer1 == "pass"  # a code fault is invisible to the configuration check
    assert fault.max_rel_dev is not None and fault.max_rel_dev > 0  # the injected fault did change the loss
    assert fault.outcome == ("missed" if fault.layer2_passed else "caught")
    # the gate's verdict counts both checks: it rejects whenever the noise-aware check does
    assert fault.noise_aware_passed is not None and fault.mean_z is not None
    assert not (fault.layer2_passed and not fault.noise_aware_passed)

    s = report.summary
    assert s["legitimate"] == {"runs": 2, "passed": 2, "false_rejects": [], "reference_false_rejects": []}
    assert s["arguments"]["refused_by_layer1"] == 1 and s["gate_ok"] is True
    table = validate.format_table(report)
    assert "| replicate-1" in table and "legitimate: 2/2 pass" in table
    json.dumps(report.model_dump(mode="json"))


def test_cli_rejects_unknown_cases(capsys):
    from attune.app.cli import main

    assert main(["gate", "validate", "--only", "nope"]) == 2
    assert "unknown case" in capsys.readouterr().err
