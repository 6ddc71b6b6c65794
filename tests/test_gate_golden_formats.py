"""`attune gate converge` reads public loss goldens as they are published: Megatron-LM's golden-values JSON
(the "lm loss" metric; `values` as a step mapping, or as a list in older files) and torchtitan's "<step> <loss>"
tables. Real files under tests/data/real_golden (PROVENANCE.md there)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gate.inputs import GateInputError, load_run

DATA = Path(__file__).resolve().parent / "data" / "real_golden"
A100 = DATA / "megatron_gpt3_345m_tp1_pp2_golden_values_dev.json"
H100 = DATA / "megatron_gpt3_345m_tp1_pp2_golden_values_dev_dgx_h100.json"
TITAN = DATA / "torchtitan_llama3_cuda_losses.txt"
TITAN_COLUMNS = DATA / "torchtitan_deepseek_v3_cp_pp_a10g_losses.txt"


def converge(base: Path, cand: Path) -> tuple[int, dict]:
    proc = subprocess.run([sys.executable, "-m", "attune", "gate", "converge", str(base), str(cand), "--json"],
                          capture_output=True, text=True, timeout=120)
    return proc.returncode, json.loads(proc.stdout)


def test_megatron_golden_values_are_read_as_published_and_judged() -> None:
    run = load_run(A100)
    assert sorted(run.curve) == [1, 5, 10, 15, 20, 25, 30, 35, 40, 45, 50]  # the loss alone, not num-zeros
    assert run.curve[1] == pytest.approx(10.83373) and run.curve[50] == pytest.approx(9.88949)
    assert run.args is None and run.source == "none"
    # the same recipe on A100 and on H100: a verdict, not a usage error, on the logged grid (1, 5, 10, ...)
    code, out = converge(A100, H100)
    assert code == 0 and out["passed"], out
    assert out["assumptions"]["judged_steps"] == 11 and out["assumptions"]["precision"] == "bf16"


def test_older_golden_values_list_their_losses_from_start_step_every_interval(tmp_path: Path) -> None:
    doc = json.loads(A100.read_text())
    values = list(doc["lm loss"]["values"].values())[1:]  # steps 5..50
    older = {"lm loss": {"start_step": 5, "end_step": 50, "step_interval": 5, "values": values}}
    path = tmp_path / "golden_values_older.json"
    path.write_text(json.dumps(older))
    curve = load_run(path).curve
    assert sorted(curve) == list(range(5, 51, 5)) and curve[50] == pytest.approx(9.88949)


def test_a_torchtitan_loss_table_is_read_and_a_dropped_step_is_rejected(tmp_path: Path) -> None:
    run = load_run(TITAN)
    assert sorted(run.curve) == list(range(1, 101)) and run.curve[1] == pytest.approx(8.048324584960938)
    code, out = converge(TITAN, TITAN)
    assert code == 0 and out["passed"], out
    lines = TITAN.read_text().splitlines()
    gap = tmp_path / "gap.txt"
    gap.write_text("\n".join(lines[:59] + lines[60:]) + "\n")  # step 60 is missing
    code, out = converge(TITAN, gap)
    assert code == 1 and not out["passed"], out
    nan = tmp_path / "nan.txt"
    nan.write_text("\n".join(lines[:59] + ["60 nan"] + lines[60:]) + "\n")
    code, out = converge(TITAN, nan)
    assert code == 1 and not out["passed"], out


def test_a_newer_torchtitan_table_with_a_header_and_more_columns_reads_the_loss_column(tmp_path: Path) -> None:
    curve = load_run(TITAN_COLUMNS).curve  # "# step loss grad_norm": the second column, not the gradient norm
    assert sorted(curve) == list(range(1, 11)) and curve[1] == pytest.approx(8.235750198364258)
    swapped = tmp_path / "swapped.txt"
    swapped.write_text("# step grad_norm loss\n" + "".join(
        f"{a} {c} {b}\n" for a, b, c in (line.split() for line in TITAN_COLUMNS.read_text().splitlines()
                                         if not line.startswith("#"))))
    assert load_run(swapped).curve == curve
    code, out = converge(TITAN_COLUMNS, swapped)
    assert code == 0 and out["passed"], out


@pytest.mark.parametrize("doc, field", [
    ({"lm loss": {"start_step": 1, "step_interval": 0, "values": [10.8, 10.7]}}, "step_interval"),
    ({"lm loss": {"start_step": -1, "step_interval": 5, "values": [10.8, 10.7]}}, "start_step"),
    ({"lm loss": {"values": "10.8"}}, "values"),
    ({"lm loss": {"values": {"one": 10.8}}}, "step 'one'"),
])
def test_a_malformed_golden_names_the_field_and_exits_2(tmp_path: Path, doc: dict, field: str) -> None:
    bad = tmp_path / "golden.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(GateInputError, match=field):
        load_run(bad)
    proc = subprocess.run([sys.executable, "-m", "attune", "gate", "converge", str(A100), str(bad), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and field.split()[0].strip("'") in json.loads(proc.stdout)["reason"]


def test_a_step_loss_table_with_a_repeated_step_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "losses.txt"
    bad.write_text("1 10.5\n2 10.4\n2 10.3\n")
    with pytest.raises(GateInputError, match="step 2 appears twice"):
        load_run(bad)


def test_a_step_number_too_long_to_be_a_step_exits_2_not_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "losses.txt"
    bad.write_text("1 10.5\n" + "9" * 5000 + " 10.4\n")
    with pytest.raises(GateInputError, match="more than 12 digits"):
        load_run(bad)
    proc = subprocess.run([sys.executable, "-m", "attune", "gate", "converge", str(bad), str(bad), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "digits" in json.loads(proc.stdout)["reason"], proc.stderr[-500:]
