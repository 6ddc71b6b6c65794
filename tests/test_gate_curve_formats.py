"""`attune gate converge` reads loss curves as other tools export them (`gate/curve_formats.py`): Hugging Face
Trainer's trainer_state.json, PyTorch Lightning's metrics.csv, JSON lines of Trainer records (real files under
tests/data/real_formats, PROVENANCE.md there), TensorBoard and Weights & Biases CSV exports, JSON records,
[step, loss] pairs and lists of losses. Bad fields exit 2 naming the field and row."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gate.inputs import GateInputError, load_run

DATA = Path(__file__).resolve().parent / "data" / "real_formats"
TRAINER_STATE = DATA / "hf_trainer_state_qwen3_8b_cpt.json"
LIGHTNING = DATA / "lightning_metrics_gpt2_turngpt.csv"
RECORDS = DATA / "trainer_records_llama32_1b_lora.jsonl"


def converge(base: Path, cand: Path) -> tuple[int, dict, str]:
    proc = subprocess.run([sys.executable, "-m", "attune", "gate", "converge", str(base), str(cand), "--json"],
                          capture_output=True, text=True, timeout=120)
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else {}, proc.stderr


def test_a_trainer_state_reads_the_step_losses_not_the_run_average() -> None:
    curve = load_run(TRAINER_STATE).curve
    assert sorted(curve) == list(range(5, 2176, 5))  # 435 logged steps; the summary record at 2178 is not one
    assert curve[5] == pytest.approx(2.3475) and curve[2175] == pytest.approx(1.9787)
    assert 2178 not in curve  # its train_loss (1.995, the run's average) is not a step's loss


def test_a_trainer_state_with_a_dropped_record_or_a_nan_loss_is_rejected(tmp_path: Path) -> None:
    code, out, _ = converge(TRAINER_STATE, TRAINER_STATE)
    assert code == 0 and out["passed"], out
    doc = json.loads(TRAINER_STATE.read_text())
    gap = dict(doc, log_history=[r for r in doc["log_history"] if r.get("step") != 60])
    (tmp_path / "gap.json").write_text(json.dumps(gap))
    code, out, _ = converge(TRAINER_STATE, tmp_path / "gap.json")
    assert code == 1 and not out["passed"] and any("60" in r for r in out["reasons"]), out
    nan = dict(doc, log_history=[dict(r, loss=float("nan")) if r.get("step") == 60 else r
                                 for r in doc["log_history"]])
    (tmp_path / "nan.json").write_text(json.dumps(nan))
    code, out, _ = converge(TRAINER_STATE, tmp_path / "nan.json")
    assert code == 1 and not out["passed"], out


def test_json_lines_skip_evaluation_and_summary_records_and_match_the_same_curve_as_pairs(tmp_path: Path) -> None:
    curve = load_run(RECORDS).curve
    assert sorted(curve) == list(range(10, 771, 10))  # 77 training records; eval_loss and train_loss not read
    assert curve[10] == pytest.approx(2.0655645370483398)
    pairs = tmp_path / "pairs.json"
    pairs.write_text(json.dumps([[s, curve[s]] for s in sorted(curve)]))
    assert load_run(pairs).curve == curve
    code, out, _ = converge(RECORDS, pairs)
    assert code == 0 and out["passed"], out


def test_a_lightning_metrics_csv_and_its_tensorboard_export_read_the_same(tmp_path: Path) -> None:
    curve = load_run(LIGHTNING).curve
    assert sorted(curve) == list(range(49, 2500, 50)) and curve[49] == pytest.approx(2.369102716445923)
    rows = list(csv.DictReader(LIGHTNING.open()))
    board = tmp_path / "board.csv"  # TensorBoard's scalar export of the same loss
    board.write_text("Wall time,Step,Value\n" + "".join(f"{1.7e9 + i},{r['step']},{r['loss']}\n"
                                                        for i, r in enumerate(rows)))
    assert load_run(board).curve == curve
    code, out, _ = converge(LIGHTNING, board)
    assert code == 0 and out["passed"], out


def test_lightning_rows_of_other_metrics_are_skipped(tmp_path: Path) -> None:
    # Lightning writes one row per logging call: a validation row has the loss cell empty
    rows = list(csv.DictReader(LIGHTNING.open()))
    mixed = tmp_path / "metrics.csv"
    lines = ["epoch,step,train_loss_step,val_loss"]
    for r in rows:
        lines.append(f"{r['epoch']},{r['step']},{r['loss']},")
        if int(r["step"]) % 500 == 499:
            lines.append(f"{r['epoch']},{r['step']},,2.5")
    mixed.write_text("\n".join(lines) + "\n")
    assert load_run(mixed).curve == load_run(LIGHTNING).curve


def test_a_wandb_export_reads_the_run_column_not_its_min_and_max(tmp_path: Path) -> None:
    p = tmp_path / "wandb.csv"
    p.write_text('"Step","run-7 - train/loss","run-7 - train/loss__MIN","run-7 - train/loss__MAX"\n'
                 '1,10.5,10.4,10.6\n2,10.2,10.1,10.3\n')
    assert load_run(p).curve == {1: 10.5, 2: 10.2}
    two = tmp_path / "two.csv"
    two.write_text('Step,run-7 - train/loss,run-8 - train/loss\n1,10.5,10.4\n')
    with pytest.raises(GateInputError, match="give one run per file"):
        load_run(two)


def test_lists_and_tables_with_a_header(tmp_path: Path) -> None:
    cases = {
        "list.json": ("[10.5, 10.0, null]", {1: 10.5, 2: 10.0, 3: None}),  # steps numbered from 1
        "records.json": ('[{"iteration": 0, "lm_loss": 10.5}, {"iteration": 1, "lm_loss": "nan"}]',
                         {0: 10.5, 1: float("nan")}),
        "table.tsv": ("step\tloss\n1\t10.5\n2\t10.1\n", {1: 10.5, 2: 10.1}),
        "table.txt": ("iteration lm_loss grad_norm\n1 10.5 2.0\n2 10.1 1.0\n", {1: 10.5, 2: 10.1}),
        "factory.jsonl": ('{"current_steps": 5, "loss": 2.3}\n{"current_steps": 10, "loss": 2.1}\n',
                          {5: 2.3, 10: 2.1}),
    }
    for name, (text, want) in cases.items():
        p = tmp_path / name
        p.write_text(text)
        got = load_run(p).curve
        assert got.keys() == want.keys(), name
        for s, v in want.items():
            assert (v is None and got[s] is None) or (v != v and got[s] != got[s]) or got[s] == v, name


@pytest.mark.parametrize("name, text, words", [
    ("bad_step.csv", "step,loss\n1,10.5\nabc,10.1\n", "row 3, column 'step': step 'abc' is not an integer"),
    ("bad_loss.csv", "step,loss\n1,10.5\n2,ten\n", "row 3, column 'loss': a loss must be a number"),
    ("ragged.csv", "step,loss\n1,10.5,7\n", "3 cells, the header names 2"),
    ("twice.csv", "step,loss\n1,10.5\n1,10.1\n", "step 1 appears twice"),
    ("long.csv", "step,loss\n" + "9" * 5000 + ",10.5\n", "more than 12 digits"),
    ("no_loss.csv", "step,accuracy\n1,0.5\n", "no loss field among ['step', 'accuracy']"),
    ("no_step.json", '[{"loss": 10.5}, {"step": 2, "loss": 10.1}]', "record 0: has 'loss' but no 'step'"),
    ("mixed.json", '[10.5, {"step": 2, "loss": 10.1}]', "all of one kind"),
    ("bad_history.json", '{"log_history": {"loss": 1}}', "log_history must be a list"),
    ("eval_only.jsonl", '{"step": 1, "eval_loss": 2.0}\n{"step": 2, "eval_loss": 1.9}\n', "no loss field"),
    ("negative.json", '[[-1, 10.5], [2, 10.1]]', "is not a training step"),
])
def test_bad_fields_exit_2_naming_them(tmp_path: Path, name: str, text: str, words: str) -> None:
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(GateInputError) as exc:
        load_run(p)
    assert words in str(exc.value) and name in str(exc.value), str(exc.value)
    code, out, err = converge(LIGHTNING, p)
    assert code == 2 and words in err and out["error"] == "usage" and words in out["reason"], err


def test_training_logs_are_not_taken_for_tables() -> None:
    """Real training logs whose lines mix words and numbers stay logs: read with their arguments block, never as a
    header table or a step-loss table (which would drop the arguments, and layer 1 with them)."""
    from gate.curve_formats import header_table, step_loss_table

    logs = sorted((Path(__file__).resolve().parent / "data" / "real_logs").glob("*.log"))
    assert len(logs) >= 5
    for log in logs:
        text = log.read_text(errors="replace")
        assert header_table(text, str(log)) is None and step_loss_table(text, str(log)) is None, log.name
    run = load_run(Path(__file__).resolve().parent / "data" / "real_logs" / "megatron_lm_mi300_tp4_pp2_args.log")
    assert run.source == "log" and run.args and len(run.curve) == 17
