"""Both convergence verdicts on real public loss curves (tests/data/real_curves; docs/gate.md's table)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gate import realcurves

DATA = Path(__file__).parent / "data" / "real_curves"


@pytest.fixture(scope="module")
def rows():
    return realcurves.evaluate()


def test_provenance_names_every_file():
    doc = realcurves.load()
    prov = (DATA / "PROVENANCE.md").read_text()
    assert doc["source"]["repo"] == "NVIDIA/Megatron-LM" and doc["source"]["commit"] in prov
    for case in doc["cases"].values():
        assert case["config"] in prov
        assert all(c["path"] in prov for c in case["curves"].values())


def test_counts_match_the_documented_table(rows):
    got = {(c["kind"], c["cut"]): (c["pairs"], c["reference_passes"], c["noise_aware_passes"], c["gate_passes"])
           for c in realcurves.counts(rows)}
    assert got == {
        ("environment", "20 steps"): (28, 5, 25, 25),
        ("environment", "all steps"): (28, 5, 23, 23),
        ("layout", "20 steps"): (40, 35, 38, 38),
        ("layout", "all steps"): (40, 39, 39, 39),
        ("objective", "20 steps"): (32, 13, 19, 19),
        ("objective", "all steps"): (32, 24, 16, 16),
    }
    assert realcurves.format_counts(rows).count("\n") == 7


def test_layouts_the_reference_rejects_on_correlation_pass_the_gate(rows):
    bert = [r for r in rows if r.kind == "layout" and r.cut == "20 steps" and r.baseline.startswith("bert/")]
    assert len(bert) == 4
    assert all(r.reference_why == "correlation" and r.noise_aware and r.gate for r in bert)


def test_other_models_the_reference_passes_are_rejected(rows):
    # GPT against a hybrid (Mamba) model: within the reference's 10% band early in training
    hybrid = [r for r in rows if r.kind == "objective" and r.cut == "20 steps" and r.candidate.startswith("hybrid/")
              and r.reference]
    assert len(hybrid) == 4 and not any(r.gate for r in hybrid)
    swiglu = next(r for r in rows if r.kind == "objective" and r.cut == "all steps"
                  and r.baseline == "gpt/gpt3_mcore_te_tp1_pp4_sequence_parallel"
                  and r.candidate == "gpt/gpt3_mcore_te_tp1_pp4_swiglu")
    assert swiglu.reference and not swiglu.gate and swiglu.max_rel_diff == pytest.approx(0.0189, abs=5e-4)


def test_json_output(capsys):
    assert realcurves.main(["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"counts", "rows"} <= set(out) and len(out["rows"]) == 200
