"""`attune gate converge` without --change: layer 1 classes the change from the two runs' arguments.

Real inputs: a real Megatron-LM console log with its resolved-arguments block (tests/data/real_logs/SOURCES.md),
and the Megatron-LM functional-test cases' arguments and golden curves (tests/data/real_curves/PROVENANCE.md)
given as JSON runs ``{"loss": ..., "args": ..., "env": ...}``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gate import lists
from gate.config_check import check_recipe
from gate.inputs import GateInputError, load_run

DATA = Path(__file__).parent / "data"
LOG = DATA / "real_logs" / "megatron_lm_mi300_tp4_pp2_args.log"
CURVES = json.loads((DATA / "real_curves" / "curves.json").read_text())


def _converge(*argv: str) -> tuple[int, dict[str, Any], str]:
    out = subprocess.run([sys.executable, "-m", "attune", "gate", "converge", *argv, "--json"],
                         capture_output=True, text=True, timeout=120)
    return out.returncode, (json.loads(out.stdout) if out.stdout.strip() else {}), out.stderr


def _run_file(tmp: Path, name: str, case: str, env: str, with_args: bool = True) -> str:
    c = CURVES["cases"][case]
    doc: dict[str, Any] = {"loss": c["curves"][env]["lm_loss"]}
    if with_args:
        doc |= {"args": c["args"], "env": c["env_vars"]}
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_a_real_log_carries_its_arguments_and_curve() -> None:
    run = load_run(LOG)
    assert run.source == "log" and run.form == "resolved" and run.args is not None
    assert run.args["pipeline_model_parallel_size"] in ("2", 2) and run.args["bf16"] in ("True", True)
    assert len(run.curve) == 17 and run.curve[1] == pytest.approx(10.9923)


def test_a_real_log_against_itself_layer1_sees_no_change(tmp_path: Path) -> None:
    rc, doc, err = _converge(str(LOG), str(LOG))
    assert rc == 0, err
    assert doc["change_source"] == "layer1" and doc["change_class"] == "unknown"
    assert doc["layer1"]["changes"] == [] and doc["precision_source"] == "log" and doc["precision"] == "bf16"
    assert doc["assumptions"]["change"] == "unknown"


def test_a_real_log_against_a_json_curve_has_no_class_and_says_what_layout_would_do(tmp_path: Path) -> None:
    run = load_run(LOG)
    cand = tmp_path / "cand.json"
    cand.write_text(json.dumps({str(k): v for k, v in run.curve.items()}))
    rc, doc, err = _converge(str(LOG), str(cand))
    assert rc == 0, err
    assert doc["change_class"] == "unknown" and doc["change_source"] == "unknown"
    assert "--change layout" in doc["change_note"] and "candidate carries no arguments" in doc["change_note"]


@pytest.mark.parametrize("index", range(4))
def test_layout_pairs_of_real_cases_are_classed_layout_by_layer1(tmp_path: Path, index: int) -> None:
    pair = CURVES["layout_pairs"][index]
    b = _run_file(tmp_path, "b", pair["baseline"], pair["env"])
    c = _run_file(tmp_path, "c", pair["candidate"], pair["env"])
    rc, doc, err = _converge(b, c)
    assert doc["change_class"] == "layout" and doc["change_source"] == "layer1", err
    assert doc["assumptions"]["change"] == "layout" and doc["precision_source"] == "json"
    assert doc["layer1"]["passed"] and {x["class"] for x in doc["layer1"]["changes"]} <= {"structural", "same_math"}
    # the same pair with --change unknown is judged strictly, and says it was given
    rc2, doc2, _ = _converge(b, c, "--change", "unknown")
    assert doc2["change_source"] == "given" and doc2["assumptions"]["change"] == "unknown"


@pytest.mark.parametrize("index", range(4))
def test_objective_pairs_of_real_cases_are_classed_objective_and_judged_strictly(tmp_path: Path, index: int) -> None:
    pair = CURVES["objective_pairs"][index]
    rc, doc, err = _converge(_run_file(tmp_path, "b", pair["baseline"], pair["env"]),
                             _run_file(tmp_path, "c", pair["candidate"], pair["env"]))
    assert doc["change_class"] == "objective" and doc["change_source"] == "layer1", err
    assert doc["assumptions"]["change"] == "unknown"  # layer 2 the backstop: every step at replicate level
    assert not doc["layer1"]["passed"] and doc["layer1"]["refuses"]
    # objective changes are layer 1's job first: refused outright, with layer 1's reason first
    assert rc == 1 and doc["passed"] is False and doc["reasons"][0].startswith("layer 1: ")
    assert doc["summary"].startswith("refused by layer 1: ") and "layer2_passed" in doc


def test_an_objective_change_layer2_would_pass_is_refused_by_layer1(tmp_path: Path) -> None:
    """qk-layernorm against its baseline moves the curve by 0.04%: the curve check alone passes it; with the runs'
    arguments, layer 1 refuses the change outright and the verdict says why."""
    pair = CURVES["objective_pairs"][22]
    assert "qk_layernorm" in pair["candidate"]
    b = _run_file(tmp_path, "b", pair["baseline"], pair["env"])
    c = _run_file(tmp_path, "c", pair["candidate"], pair["env"])
    rc, doc, err = _converge(b, c)
    assert doc["layer2_passed"] is True, err  # the curves alone: inside the envelope
    assert rc == 1 and doc["passed"] is False
    assert any("qk_layernorm" in r and "[numeric]" in r for r in doc["reasons"] if r.startswith("layer 1: "))
    # --change layout does not override layer 1: the arguments still show an objective change
    rc3, doc3, _ = _converge(b, c, "--change", "layout")
    assert doc3["change_source"] == "given" and doc3["assumptions"]["change"] == "layout"
    assert rc3 == 1 and not doc3["passed"] and doc3["layer1"]["refuses"] and doc3["reasons"][0].startswith("layer 1: ")
    # the same curves without their arguments: no class, the curve check decides (and passes)
    rc2, doc2, _ = _converge(_run_file(tmp_path, "b2", pair["baseline"], pair["env"], with_args=False),
                             _run_file(tmp_path, "c2", pair["candidate"], pair["env"], with_args=False))
    assert rc2 == 0 and doc2["passed"] and doc2["change_source"] == "unknown" and doc2["layer1"] is None


def test_an_unlisted_change_is_refused_outright_an_untested_swap_is_left_to_the_curves(tmp_path: Path) -> None:
    unlisted = CURVES["layout_pairs"][36]  # differs in the unlisted N_REPEATS variable (and layout arguments)
    rc, doc, err = _converge(_run_file(tmp_path, "b", unlisted["baseline"], unlisted["env"]),
                             _run_file(tmp_path, "c", unlisted["candidate"], unlisted["env"]))
    assert doc["change_class"] == "unknown" and doc["layer1"]["refuses"], err
    assert rc == 1 and any(r.startswith("layer 1: N_REPEATS [unlisted]") for r in doc["reasons"])
    untested = CURVES["layout_pairs"][17]  # an untested same-math swap (NVTE_ALLOW_NONDETERMINISTIC_ALGO)
    rc, doc, err = _converge(_run_file(tmp_path, "b3", untested["baseline"], untested["env"]),
                             _run_file(tmp_path, "c3", untested["candidate"], untested["env"]))
    assert not doc["layer1"]["passed"] and doc["layer1"]["refuses"] is False, err
    assert not any(r.startswith("layer 1: ") for r in doc["reasons"]) and doc["passed"] == doc["layer2_passed"]


def test_layer1_classes_every_development_pair() -> None:
    """Counts over the development corpus: objective pairs all 'objective'; layout pairs 'layout' unless layer 1
    cannot vouch for them (an untested same-math environment swap, an unlisted variable: 'unknown')."""
    loaded = lists.load_list("megatron")
    seen: dict[tuple[str, str], int] = {}
    for kind in ("layout_pairs", "objective_pairs"):
        for p in CURVES[kind]:
            b, c = CURVES["cases"][p["baseline"]], CURVES["cases"][p["candidate"]]
            k = check_recipe(loaded, b["args"], c["args"], b["env_vars"], c["env_vars"]).objective_class()
            seen[(kind, k)] = seen.get((kind, k), 0) + 1
    assert seen == {("layout_pairs", "layout"): 34, ("layout_pairs", "unknown"): 6, ("objective_pairs", "objective"): 32}


def test_json_run_args_are_checked(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"loss": {"1": 2.0}, "args": {"--tp": 1, "pp": 2}}))
    with pytest.raises(GateInputError, match="neither a --flag nor an attribute"):
        load_run(bad)
    bad.write_text(json.dumps({"loss": {"1": 2.0}, "args": {"tp": {"x": 1}}}))
    with pytest.raises(GateInputError, match="value of tp"):
        load_run(bad)
    bad.write_text(json.dumps({"loss": {"1": 2.0}, "extra": 1}))
    rc, _, err = _converge(str(bad), str(bad))
    assert rc == 2 and "unknown top-level field" in err


def test_two_bare_curves_longer_than_the_check_window_are_judged_on_it_too(tmp_path: Path) -> None:
    """Two JSON curves of 100 steps, +1.5% on the first 8: the whole curve alone would pass (8% of its steps);
    the reference's 20-step check window, judged on its own, rejects it. NaN and a missing step still reject."""
    base = {s: 8.0 * 0.99 ** s + 2.0 for s in range(1, 101)}
    cand = {s: v * (1.015 if s <= 8 else 1.0) for s, v in base.items()}
    b, c = tmp_path / "b.json", tmp_path / "c.json"
    b.write_text(json.dumps({str(k): v for k, v in base.items()}))
    c.write_text(json.dumps({str(k): v for k, v in cand.items()}))
    rc, doc, err = _converge(str(b), str(c))
    assert rc == 1 and not doc["passed"] and doc["check_window"]["passed"] is False, err
    assert doc["noise_aware"]["passed"] and doc["reference_passed"]  # the whole curve's own verdicts pass
    assert any(r.startswith("check window (steps 1-20") for r in doc["reasons"])
    c.write_text(json.dumps({str(k): v for k, v in base.items()}))
    rc, doc, err = _converge(str(b), str(c))
    assert rc == 0 and doc["passed"] and doc["check_window"]["passed"] is True, err
    for broken in ({**{str(k): v for k, v in base.items()}, "50": "nan"},
                   {str(k): v for k, v in base.items() if k != 70}):
        c.write_text(json.dumps(broken))
        rc, doc, err = _converge(str(b), str(c))
        assert rc == 1 and not doc["passed"], err
