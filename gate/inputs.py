"""Reading the gate's inputs from files: recipes, environments, loss curves.

Every reader raises :class:`GateInputError` (a ValueError) with a message that names the
file and what was expected, so the CLI can exit 2 and the MCP server can answer with
a clear error.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from attune.core.errors import GateError
from attune.readers import bounded
from attune.readers.metrics import read_losses, read_resolved_args
from gate import curve_formats, names

MAX_CURVE_BYTES = 512 * 2**20  # a loss curve, or a training log read whole
# The framework a training log given to the gate is read as, unless the caller names one: the gate's
# lists name Megatron's arguments.
DEFAULT_FRAMEWORK = "megatron-lm"


class GateInputError(GateError, ValueError):
    """Bad input to the gate."""


def argv_to_args(tokens: Sequence[str]) -> dict[str, Any]:
    """``["--tp", "2", "--sequence-parallel", "--recompute-modules", "a", "b"]`` -> a recipe's args.

    A flag with no value is ``True``; one value is a string; several values are a list.
    """
    out: dict[str, Any] = {}
    flag: str | None = None
    values: list[str] = []

    def flush() -> None:
        if flag is not None:
            out[flag] = True if not values else values[0] if len(values) == 1 else list(values)

    for tok in tokens:
        if tok.startswith("--"):
            flush()
            if not names.FLAG_RE.match(tok):
                raise GateInputError(f"not a flag: {tok!r}")
            flag, values = tok, []
        elif flag is None:
            raise GateInputError(f"value {tok!r} before any flag")
        else:
            values.append(tok)
    flush()
    return out


def _read_structured(path: Path) -> Any:
    try:
        return bounded.read_structured(path, "input")
    except bounded.InputError as exc:
        raise GateInputError(str(exc)) from None


def _check_args(obj: Any, where: str) -> dict[str, Any]:
    if isinstance(obj, list):
        if not all(isinstance(t, str) for t in obj):
            raise GateInputError(f"{where}: an argv list must hold strings")
        return argv_to_args(obj)
    if not isinstance(obj, dict):
        raise GateInputError(f"{where}: expected a mapping of --flag to value (or an argv list), got {type(obj).__name__}")
    for k, v in obj.items():
        if not isinstance(k, str) or not names.FLAG_RE.match(k):
            raise GateInputError(f"{where}: key {k!r} is not a flag (expected --name)")
        if not (v is None or isinstance(v, (str, int, float, bool)) or
                (isinstance(v, list) and all(isinstance(x, (str, int, float, bool)) for x in v))):
            raise GateInputError(f"{where}: value of {k} must be a string, number, boolean, null or list")
    return dict(obj)


def check_env(obj: Any, where: str) -> dict[str, str]:
    if obj is None:
        return {}
    if not isinstance(obj, dict):
        raise GateInputError(f"{where}: expected a mapping of variable name to string value")
    out = {}
    for k, v in obj.items():
        if not isinstance(k, str) or not k:
            raise GateInputError(f"{where}: environment variable names must be non-empty strings")
        if v is None or isinstance(v, (dict, list)):
            raise GateInputError(f"{where}: value of {k} must be a string")
        out[k] = str(v).lower() if isinstance(v, bool) else str(v)
    return out


def load_recipe(path: str | Path) -> tuple[dict[str, Any], dict[str, str]]:
    """A recipe file: ``{"args": {...} | [argv...], "env": {...}}`` (JSON or YAML), or a bare args mapping."""
    p = Path(path)
    data = _read_structured(p)
    if isinstance(data, dict) and ("args" in data or "env" in data):
        unknown = set(data) - {"args", "env", "name", "description"}
        if unknown:
            raise GateInputError(f"{p}: unknown top-level field(s) {sorted(unknown)}; expected args, env")
        return _check_args(data.get("args") or {}, f"{p}: args"), check_env(data.get("env"), f"{p}: env")
    return _check_args(data, str(p)), {}


def load_resolved(path: str | Path, framework: str = DEFAULT_FRAMEWORK) -> tuple[dict[str, Any], dict[str, str]]:
    """Resolved arguments: a training log with a resolved-arguments block (read by `framework`'s
    reader), or a JSON/YAML ``{"args": {attribute: value}, "env": {...}}``."""
    p = Path(path)
    if p.suffix in (".json", ".yaml", ".yml"):
        data = _read_structured(p)
        if not isinstance(data, dict) or "args" not in data or not isinstance(data["args"], dict):
            raise GateInputError(f"{p}: expected {{'args': {{attribute: value}}, 'env': {{...}}}}")
        for k in data["args"]:
            if not isinstance(k, str) or not names.DEST_RE.match(k):
                raise GateInputError(f"{p}: resolved argument {k!r} is not an attribute name (lower_snake_case)")
        return dict(data["args"]), check_env(data.get("env"), f"{p}: env")
    try:
        return read_resolved_args(p, framework), {}
    except OSError as exc:
        raise GateInputError(f"cannot read {p}: {exc}") from exc
    except ValueError as exc:
        raise GateInputError(f"{p}: {exc}") from exc


def load_env(path: str | Path) -> dict[str, str]:
    """An environment: JSON/YAML mapping, or ``KEY=VALUE`` lines (``#`` comments, optional ``export``)."""
    p = Path(path)
    if p.suffix in (".json", ".yaml", ".yml"):
        return check_env(_read_structured(p), str(p))
    try:
        lines = bounded.read_text(p, "environment file").splitlines()
    except bounded.InputError as exc:
        raise GateInputError(str(exc)) from None
    out: dict[str, str] = {}
    for i, line in enumerate(lines, 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        if s.startswith("export "):
            s = s[7:].strip()
        if "=" not in s:
            raise GateInputError(f"{p}:{i}: expected KEY=VALUE, got {line!r}")
        k, v = s.split("=", 1)
        out[k.strip()] = v
    return out


class RunInput(BaseModel):
    """A run given to `attune gate converge`: its loss curve and, when the input carries them, its arguments."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    curve: dict[int, float | None]
    args: dict[str, Any] | None = Field(None, description="resolved attributes, or a recipe's --flags (see form)")
    env: dict[str, str] = Field(default_factory=dict)
    form: Literal["resolved", "recipe"] | None = Field(None, description="how args are keyed; None: no arguments")
    source: str = Field(description="'log' (a training log's arguments block), 'json' (a curve file's args), or "
                        "'none'")


def _curve_map(data: Any, where: str) -> dict[int, float | None]:
    if not isinstance(data, dict):
        raise GateInputError(f"{where}: expected a JSON object mapping step numbers to losses")
    out: dict[int, float | None] = {}
    for k, v in data.items():
        try:
            step = int(str(k))
        except ValueError:
            raise GateInputError(f"{where}: step {k!r} is not an integer") from None
        out[step] = curve_formats.loss_value(v, f"{where}: step {k}")
    if not out:
        raise GateInputError(f"{where}: the loss curve is empty")
    return out


def _run_args(obj: Any, where: str) -> tuple[dict[str, Any], Literal["resolved", "recipe"]]:
    """A curve file's `args`: every key a --flag (a recipe) or every key an attribute name (resolved)."""
    if not isinstance(obj, dict) or not obj:
        raise GateInputError(f"{where}: expected a non-empty mapping of --flag (recipe) or attribute name (resolved "
                         "arguments) to value")
    keys = [k for k in obj if isinstance(k, str)]
    if len(keys) == len(obj) and all(k.startswith("--") for k in keys):
        return _check_args(obj, where), "recipe"
    bad = [k for k in obj if not isinstance(k, str) or not names.DEST_RE.match(k)]
    if bad:
        raise GateInputError(f"{where}: key {bad[0]!r} is neither a --flag nor an attribute name (lower_snake_case); "
                         "the keys must be all one or all the other")
    for k, v in obj.items():
        if not (v is None or isinstance(v, (str, int, float, bool)) or
                (isinstance(v, list) and all(isinstance(x, (str, int, float, bool)) for x in v))):
            raise GateInputError(f"{where}: value of {k} must be a string, number, boolean, null or list")
    return dict(obj), "resolved"


def load_run(path: str | Path, framework: str = DEFAULT_FRAMEWORK) -> RunInput:
    """A run for the convergence check (`_load_run`); a bad field of a known curve format is a GateInputError."""
    try:
        return _load_run(Path(path), framework)
    except curve_formats.CurveFormatError as exc:
        raise GateInputError(str(exc)) from None


def _load_run(p: Path, framework: str) -> RunInput:
    """A run for the convergence check: a training log (its loss curve, and its resolved-arguments block when it
    has one), a JSON loss curve ``{"1": 10.41, ...}`` (no arguments), a JSON run
    ``{"loss": {"1": 10.41, ...}, "args": {...}, "env": {...}}`` whose `args` are a recipe's ``--flags`` or
    resolved attribute names (all one or all the other), Megatron-LM's golden values (``{"lm loss": {"values":
    ...}, ...}``, the loss alone), a "<step> <loss>" table, one pair per line (torchtitan's loss goldens), or a curve as
    other tools export it (`gate.curve_formats`: a table with a header row, Trainer's ``trainer_state.json``, JSON
    records, JSON lines, ``[step, loss]`` pairs, a list of losses)."""
    text = _read_curve_text(p)
    data = _json_curve(p, text)
    if data is None:
        table = curve_formats.step_loss_table(text, str(p))
        if table is None:
            table = curve_formats.header_table(text, str(p))
        if table is not None:
            return RunInput(curve=table, source="none")
        curve = _log_curve(p, framework)
        try:
            args = read_resolved_args(p, framework)
        except (OSError, ValueError):
            return RunInput(curve=curve, source="none")
        return RunInput(curve=curve, args=args, form="resolved", source="log")
    golden = _golden_metric(data)
    if golden is not None:
        return RunInput(curve=_golden_curve(golden, f"{p}: {GOLDEN_LOSS_KEY!r}"), source="none")
    if isinstance(data, list):
        return RunInput(curve=curve_formats.list_curve(data, str(p)), source="none")
    if isinstance(data, dict) and "log_history" in data:
        return RunInput(curve=curve_formats.trainer_state(data, str(p)), source="none")
    if isinstance(data, dict) and "loss" in data and isinstance(data["loss"], dict):
        unknown = set(data) - {"loss", "args", "env", "name", "description", "source"}
        if unknown:
            raise GateInputError(f"{p}: unknown top-level field(s) {sorted(unknown)}; expected loss, args, env")
        curve = _curve_map(data["loss"], f"{p}: loss")
        if data.get("args") is None:
            return RunInput(curve=curve, env=check_env(data.get("env"), f"{p}: env"), source="none")
        args, form = _run_args(data["args"], f"{p}: args")
        return RunInput(curve=curve, args=args, env=check_env(data.get("env"), f"{p}: env"), form=form,
                        source="json")
    return RunInput(curve=_curve_map(data, str(p)), source="none")


# Megatron-LM's functional-test golden values (`golden_values_<env>.json`): one object per metric, each
# {"start_step", "end_step", "step_interval", "values"}, where `values` maps step to value (newer files) or lists
# them from `start_step` every `step_interval` steps (older files). The loss is "lm loss"; the other metrics
# ("num-zeros", "iteration-time", memory) are not read.
GOLDEN_LOSS_KEY = "lm loss"


def _golden_metric(data: Any) -> dict[str, Any] | None:
    """The golden-values file's loss metric, or None when `data` is not in that form."""
    if not isinstance(data, dict) or not isinstance(data.get(GOLDEN_LOSS_KEY), dict):
        return None
    metric = data[GOLDEN_LOSS_KEY]
    return metric if "values" in metric else None


def _golden_int(metric: dict[str, Any], key: str, default: int, least: int, where: str) -> int:
    v = metric.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or v < least:
        raise GateInputError(f"{where}: {key} must be an integer >= {least}, got {v!r}")
    return v


def _golden_curve(metric: dict[str, Any], where: str) -> dict[int, float | None]:
    """A golden-values metric's curve: `values` as a step -> loss mapping, or a list from `start_step` every
    `step_interval` steps."""
    values = metric["values"]
    if isinstance(values, dict):
        return _curve_map(values, f"{where}: values")
    if not isinstance(values, list):
        raise GateInputError(f"{where}: values must be a mapping of step to loss or a list of losses")
    if not values:
        raise GateInputError(f"{where}: the loss curve is empty")
    start = _golden_int(metric, "start_step", 0, 0, where)
    every = _golden_int(metric, "step_interval", 1, 1, where)
    return {start + i * every: curve_formats.loss_value(v, f"{where}: values[{i}]") for i, v in enumerate(values)}


def _read_curve_text(p: Path) -> str:
    try:
        return bounded.read_bytes(p, "loss curve or log", MAX_CURVE_BYTES).decode("utf-8", "replace")
    except bounded.InputError as exc:
        raise GateInputError(str(exc)) from None


def _json_curve(p: Path, text: str) -> Any:
    """The parsed JSON of a curve file (JSON lines as a list of their objects), or None when it is a training
    log or a table."""
    head = text.lstrip()[:1]
    if not (p.suffix in (".json", ".jsonl", ".ndjson") or head in ("{", "[")):
        return None
    if bounded.json_depth(text) > bounded.MAX_DEPTH:
        raise GateInputError(f"{p}: JSON nested deeper than {bounded.MAX_DEPTH} levels")
    try:
        return json.loads(text)  # accepts NaN and Infinity
    except (json.JSONDecodeError, RecursionError) as exc:
        extra = isinstance(exc, json.JSONDecodeError) and exc.msg == "Extra data"  # a first object, then more
        lines = curve_formats.json_lines(text, str(p)) if head == "{" and extra else None
        if lines is None:
            raise GateInputError(f"{p} is not valid JSON: {exc}") from None
        return lines


def _log_curve(p: Path, framework: str) -> dict[int, float | None]:
    try:
        curve = read_losses(p, framework)
    except OSError as exc:
        raise GateInputError(f"cannot read {p}: {exc}") from exc
    if not curve:
        raise GateInputError(f"{p}: no {framework} step lines found: not a training log, and not a JSON loss curve")
    return curve


def load_curve(path: str | Path, framework: str = DEFAULT_FRAMEWORK) -> dict[int, float | None]:
    """A loss curve: a JSON mapping of step number to loss (``{"1": 10.41, ...}``), a JSON run
    (``{"loss": {...}, "args": {...}}``, see `load_run`), or a training log (read by `framework`'s reader).

    In JSON, ``null`` is a missing loss and ``NaN``/``"nan"``/``"inf"`` are non-finite losses.
    """
    return load_run(path, framework).curve


def curve_to_json(curve: dict[int, float | None]) -> dict[str, float | str | None]:
    """For reports: non-finite values as strings (JSON has no NaN)."""
    return {str(k): (v if v is None or math.isfinite(v) else str(v)) for k, v in sorted(curve.items())}
