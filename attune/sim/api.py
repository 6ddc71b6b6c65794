"""Small entry-point helpers: names to models and accelerators, command lines and --set overrides to flags."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from attune.core.errors import SimError
from attune.core.recipe import ArgValue, parse_argv
from attune.knowledge.layouts import LayoutError, ModelDims, find_model
from attune.sim.hardware import Accelerator, HardwareError, accelerator
from attune.sim.recipe import RecipeError

PROGRAM_SUFFIXES = (".py",)


class SimInputError(SimError, ValueError):
    """Bad input to the simulator (unknown model or accelerator, unreadable override)."""


def resolve_model(name: str) -> ModelDims:
    try:
        return find_model(name)
    except LayoutError as exc:
        raise SimInputError(f"model: {exc}") from None


def resolve_accelerator(name: str) -> Accelerator:
    try:
        return accelerator(name)
    except HardwareError as exc:
        raise SimInputError(str(exc)) from None


def args_from_command(argv: Sequence[str]) -> dict[str, ArgValue]:
    """The training script's flags from a full command line: everything after the last `*.py`
    token (a launcher such as torchrun has flags of its own), else after the leading words."""
    toks = list(argv)
    last = max((i for i, t in enumerate(toks) if t.endswith(PROGRAM_SUFFIXES)), default=None)
    if last is not None:
        toks = toks[last + 1 :]
    _, args = parse_argv(toks)
    return args


def parse_override(text: str) -> tuple[str, ArgValue]:
    """`--flag=value` (or `flag=value`) -> ("--flag", value); `--flag` alone -> True; value `false`
    or `null` removes the flag."""
    name, eq, raw = text.partition("=")
    name = name.strip()
    if not name:
        raise SimInputError(f"--set {text!r}: expected FLAG=VALUE")
    if not name.startswith("--"):
        name = "--" + name
    if not eq:
        return name, True
    low = raw.strip().lower()
    if low in ("true", ""):
        return name, True
    if low in ("false", "null", "none"):
        return name, None
    for cast in (int, float):
        try:
            return name, cast(raw)
        except ValueError:
            pass
    return name, raw


def apply_overrides(args: Mapping[str, ArgValue], overrides: Mapping[str, ArgValue]) -> dict[str, ArgValue]:
    out = dict(args)
    for k, v in overrides.items():
        if v is None or v is False:
            out.pop(k, None)
            # a --no-x override of a bare flag, and the other way round
            other = "--" + k[5:] if k.startswith("--no-") else "--no-" + k[2:]
            out.pop(other, None)
        else:
            out[k] = v
    return out


__all__ = [
    "RecipeError",
    "SimInputError",
    "apply_overrides",
    "args_from_command",
    "parse_override",
    "resolve_accelerator",
    "resolve_model",
]
