"""Loss curves as other tools write them: step-loss tables, tables with a header row, lists of records, JSON lines.

`attune gate converge` is given curves exported from wherever a run was logged: a CSV from TensorBoard
(``Wall time,Step,Value``), Weights & Biases (``Step,<run> - train/loss``) or PyTorch Lightning's
``metrics.csv`` (``epoch,step,train_loss,...``, one metric per row), Hugging Face Trainer's
``trainer_state.json`` (``log_history``: one record per logging step, evaluation records in between), a JSON
list of ``{"step": ..., "loss": ...}`` records or its JSON-lines form, a list of ``[step, loss]`` pairs, a
bare list of losses, or torchtitan's ``<step> <loss> [more columns]`` goldens. Each reader here turns one of those into ``{step: loss}``.

Which field is the step and which the loss is read from allowlisted names (`STEP_NAMES`, `LOSS_NAMES`, in order
of preference, compared case-insensitively; a W&B column ``<run> - <metric>`` is named by its metric): one loss
field is chosen for the whole file, and a row or record without it is another metric's and is skipped. Every
problem raises `CurveFormatError` naming the file's field or row and what was expected; nothing is guessed from
a value's size.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from attune.core.errors import GateError

STEP_NAMES = ("step", "iteration", "iter", "global_step", "trainer/global_step", "train/global_step", "_step",
              "current_steps")
# The training loss at a step, most specific first. "value" is the lone metric of a TensorBoard scalar export.
# A run's average ("train_loss" in Trainer's last record) loses to "loss" wherever both appear.
LOSS_NAMES = ("loss", "lm loss", "lm_loss", "train/loss", "train_loss", "train/lm_loss", "train/lm loss",
              "training_loss", "train_loss_step", "train/loss_step", "value")
MAX_COLUMNS = 1024
# torchtitan's loss goldens (tests/assets/losses/*.txt): "<step> <loss>" per line, newer files with more columns
# after the loss (grad_norm) and a "# step loss grad_norm" header naming them.
_TABLE_SPLIT = re.compile(r"[ \t,]+")
_TABLE_MAX_COLUMNS = 16
MAX_STEP_DIGITS = 12  # a step number longer than this is no training step (and int() refuses 4,300 digits)
_WANDB_AGGREGATES = ("__min", "__max")


class CurveFormatError(GateError, ValueError):
    """A curve file in a known form, with a bad field."""


def field_name(raw: str) -> str:
    """A column or key as compared with the allowlists: stripped, lower case, a W&B ``<run> - `` prefix dropped."""
    name = raw.strip().lower()
    return name.rsplit(" - ", 1)[1].strip() if " - " in name else name


def _pick(fields: Sequence[str], allowed: Sequence[str], what: str, where: str = "") -> int | None:
    """The index of the field that `allowed` prefers; None when no field is allowed; an error when the
    preferred name appears in more than one field (two runs' columns in one export)."""
    names = [field_name(f) for f in fields]
    for want in allowed:
        hits = [i for i, n in enumerate(names) if n == want]
        if len(hits) > 1:
            raise CurveFormatError(f"{where}: {len(hits)} {what} fields named {want!r} ({', '.join(repr(fields[i]) for i in hits)}): "
                                   "give one run per file")
        if hits:
            return hits[0]
    return None


def _columns(fields: Sequence[str], where: str) -> tuple[int, int]:
    step = _pick(fields, STEP_NAMES, "step", where)
    loss = _pick([f if not field_name(f).endswith(_WANDB_AGGREGATES) else "" for f in fields], LOSS_NAMES, "loss",
                 where)
    if step is None or loss is None:
        missing = "step" if step is None else "loss"
        raise CurveFormatError(f"{where}: no {missing} field among {list(fields)[:12]}; expected one of "
                               f"{STEP_NAMES if step is None else LOSS_NAMES}")
    return step, loss


def step_number(value: Any, where: str) -> int:
    """A step: an integer, or a number or string that is one (``"10"``, ``10.0``)."""
    if isinstance(value, bool):
        raise CurveFormatError(f"{where}: step {value!r} is not an integer")
    if isinstance(value, int):
        step = value
    elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
        step = int(value)
    elif isinstance(value, str) and value.strip():
        text = value.strip()
        digits = text.split(".", 1)
        if len(digits[0]) > MAX_STEP_DIGITS:
            raise CurveFormatError(f"{where}: step {text[:20]}... has more than {MAX_STEP_DIGITS} digits")
        if not (digits[0].isascii() and digits[0].isdigit() and (len(digits) == 1 or set(digits[1]) <= {"0"})):
            raise CurveFormatError(f"{where}: step {text[:40]!r} is not an integer")
        step = int(digits[0])
    else:
        raise CurveFormatError(f"{where}: step {value!r} is not an integer")
    if step < 0 or len(str(step)) > MAX_STEP_DIGITS:
        raise CurveFormatError(f"{where}: step {step} is not a training step (0 to {MAX_STEP_DIGITS} digits)")
    return step


def loss_value(value: Any, where: str) -> float | None:
    """A loss: a number, ``null`` (missing), or ``"nan"``/``"inf"`` (non-finite, which the gate rejects)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise CurveFormatError(f"{where}: a loss must be a number, null or 'nan'/'inf', got {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    raise CurveFormatError(f"{where}: a loss must be a number, null or 'nan'/'inf', got {str(value)[:40]!r}")


def _put(out: dict[int, float | None], step: int, loss: float | None, where: str) -> None:
    if step in out:
        raise CurveFormatError(f"{where}: step {step} appears twice")
    out[step] = loss


def records_curve(records: Sequence[Any], where: str) -> dict[int, float | None]:
    """A list of records (``{"step": 10, "loss": 2.3, ...}``): one loss key for all, chosen by `LOSS_NAMES` among
    the keys any record has; a record without it (an evaluation record) is skipped."""
    if not all(isinstance(r, dict) for r in records):
        raise CurveFormatError(f"{where}: expected every record to be an object")
    keys: dict[str, None] = {}
    for r in records:
        keys.update(dict.fromkeys(k for k in r if isinstance(k, str)))
        if len(keys) > MAX_COLUMNS:
            raise CurveFormatError(f"{where}: more than {MAX_COLUMNS} distinct keys")
    fields = list(keys)
    step_i, loss_i = _columns(fields, where)
    step_key, loss_key = fields[step_i], fields[loss_i]
    out: dict[int, float | None] = {}
    for i, r in enumerate(records):
        if loss_key not in r:
            continue
        at = f"{where}: record {i}"
        if step_key not in r:
            raise CurveFormatError(f"{at}: has {loss_key!r} but no {step_key!r}")
        _put(out, step_number(r[step_key], at), loss_value(r[loss_key], f"{at}: {loss_key}"), where)
    if not out:
        raise CurveFormatError(f"{where}: no record has a {loss_key!r}")
    return out


def list_curve(data: Sequence[Any], where: str) -> dict[int, float | None]:
    """A JSON list: records, ``[step, loss]`` pairs, or bare losses (steps numbered 1, 2, ...)."""
    if not data:
        raise CurveFormatError(f"{where}: the loss curve is empty")
    if all(isinstance(x, dict) for x in data):
        return records_curve(data, where)
    if all(isinstance(x, list) and len(x) == 2 for x in data):
        out: dict[int, float | None] = {}
        for i, (s, v) in enumerate(data):
            _put(out, step_number(s, f"{where}: [{i}]"), loss_value(v, f"{where}: [{i}]"), where)
        return out
    if all(x is None or isinstance(x, (int, float, str)) and not isinstance(x, bool) for x in data):
        return {i + 1: loss_value(x, f"{where}: [{i}]") for i, x in enumerate(data)}
    raise CurveFormatError(f"{where}: a JSON list must hold records ({{step, loss}}), [step, loss] pairs or losses, "
                           "all of one kind")


def json_lines(text: str, where: str) -> list[dict[str, Any]] | None:
    """One JSON object per line (blank lines allowed), or None when a line is no JSON object."""
    out = []
    for i, line in enumerate(io.StringIO(text), 1):
        body = line.strip()
        if not body:
            continue
        if not body.startswith("{"):
            return None
        try:
            obj = json.loads(body)
        except (json.JSONDecodeError, RecursionError):
            raise CurveFormatError(f"{where}:{i}: not a JSON object") from None
        if not isinstance(obj, dict):
            return None
        out.append(obj)
    return out or None


def _table_number(token: str) -> float | None:
    try:
        return float(token)
    except ValueError:
        return None


def step_loss_table(text: str, where: str) -> dict[int, float | None] | None:
    """A "<step> <loss> [more columns]" table (blank lines and # comments allowed; a "# step loss ..." header says
    which column is the loss, else the second), or None when any line is something else (a training log)."""
    out: dict[int, float | None] = {}
    col = 1
    for line in io.StringIO(text):  # line by line: a training log is told apart at its first line
        body = line.strip()
        if not body:
            continue
        if body.startswith("#"):
            names = _TABLE_SPLIT.split(body.lstrip("#").strip().lower())
            if not out and len(names) >= 2 and names[0] == "step" and "loss" in names:
                col = names.index("loss")
            continue
        tokens = _TABLE_SPLIT.split(body)
        if not (col < len(tokens) <= _TABLE_MAX_COLUMNS and tokens[0].isascii() and tokens[0].isdigit()):
            return None
        values = [_table_number(t) for t in tokens[1:]]
        if any(v is None for v in values):
            return None
        if len(tokens[0]) > MAX_STEP_DIGITS:
            raise CurveFormatError(f"{where}: step {tokens[0][:20]}... has more than {MAX_STEP_DIGITS} digits")
        step = int(tokens[0])
        if step in out:
            raise CurveFormatError(f"{where}: step {step} appears twice in the step-loss table")
        out[step] = values[col - 1]
    return out if len(out) >= 2 else None


def _header(line: str) -> list[str] | None:
    """The fields of a header row (comma, tab or space separated, none of them a number), or None."""
    if "," in line:
        fields = next(csv.reader([line]))
    elif "\t" in line:
        fields = line.split("\t")
    else:
        fields = line.split()
    fields = [f.strip() for f in fields]
    if not fields or len(fields) > MAX_COLUMNS or any(not f for f in fields):
        return None
    if any(_table_number(f) is not None for f in fields):
        return None
    return fields


def _rows(lines: Iterable[str], delimiter: str | None) -> Iterable[list[str]]:
    if delimiter == ",":
        yield from csv.reader(lines)
        return
    for line in lines:
        yield line.rstrip("\r\n").split(delimiter) if delimiter else line.split()


def header_table(text: str, where: str) -> dict[int, float | None] | None:
    """A table whose first row names its columns, one of them a step and one a loss (`STEP_NAMES`,
    `LOSS_NAMES`); None when the first row is no such header (then the text is something else). A row whose
    loss cell is empty holds another metric (Lightning writes one per row) and is skipped."""
    lines = io.StringIO(text)
    first = ""
    for line in lines:
        if line.strip():
            first = line.strip().lstrip("\ufeff")
            break
    fields = _header(first)
    if fields is None:
        return None
    if _pick(fields, STEP_NAMES, "step") is None:
        return None  # a first line of words, but no table of steps
    step_i, loss_i = _columns(fields, where)  # steps without a loss column: an error naming the columns
    delimiter = "," if "," in first else "\t" if "\t" in first else None
    out: dict[int, float | None] = {}
    try:
        for n, row in enumerate(_rows(lines, delimiter), 2):
            if not any(c.strip() for c in row):
                continue
            at = f"{where}: row {n}"
            if len(row) != len(fields):
                raise CurveFormatError(f"{at}: {len(row)} cells, the header names {len(fields)}")
            cell = row[loss_i].strip()
            if not cell:
                continue
            _put(out, step_number(row[step_i], f"{at}, column {fields[step_i]!r}"),
                 loss_value(cell, f"{at}, column {fields[loss_i]!r}"), where)
    except csv.Error as exc:
        raise CurveFormatError(f"{where}: not a readable CSV table: {exc}") from None
    if not out:
        raise CurveFormatError(f"{where}: the column {fields[loss_i]!r} holds no loss")
    return out


def trainer_state(data: Mapping[str, Any], where: str) -> dict[int, float | None]:
    """Hugging Face Trainer's ``trainer_state.json``: its `log_history` records."""
    history = data["log_history"]
    if not isinstance(history, list):
        raise CurveFormatError(f"{where}: log_history must be a list of records")
    return records_curve(history, f"{where}: log_history")
