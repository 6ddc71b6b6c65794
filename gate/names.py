"""The one place that maps between the two spellings of a Megatron argument.

A recipe names arguments the way they are typed on the command line
(``--tensor-model-parallel-size 2``, a bare ``--sequence-parallel``), while the
resolved-arguments block a run prints names the attribute it ends up in
(``tensor_model_parallel_size``). Most flags map by swapping dashes for
underscores; a ``--no-X`` flag stores ``False`` into ``X``; a few flags store into
an attribute with another name. The correctness lists are keyed by attribute name
and may declare the flag spelling where it is not the default one.

Values are normalised here as well, so that ``"2"``, ``2`` and ``2.0`` compare equal
and a resolved ``['core_attn']`` reads as a list.
"""

from __future__ import annotations

import ast
import math
import re
from typing import Any

FLAG_RE = re.compile(r"^--[A-Za-z0-9][A-Za-z0-9_-]*$")
DEST_RE = re.compile(r"^[a-z_][a-z0-9_]*$")


def default_flag(dest: str) -> str:
    """The command-line spelling Megatron uses for an attribute by default."""
    return "--" + dest.replace("_", "-")


def flag_to_dest(flag: str) -> str:
    """Default attribute name of a flag (no negation handling): ``--a-b`` -> ``a_b``."""
    if not FLAG_RE.match(flag):
        raise ValueError(f"not a flag: {flag!r} (expected --name)")
    return flag[2:].replace("-", "_")


def dest_to_display(dest: str) -> str:
    return default_flag(dest)


_INT_RE = re.compile(r"^[+-]?\d+$")
_FLOAT_RE = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def normalize(value: Any) -> Any:
    """A canonical, hashable form of a value, for equality between recipes and logs.

    bool stays bool; integral floats become int; numeric strings become numbers;
    ``true``/``false``/``none`` strings become ``True``/``False``/``None``; list-like
    strings from a resolved block (``['a', 'b']``) are parsed with
    ``ast.literal_eval`` (literals only, nothing is executed); lists become tuples.
    """
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if math.isfinite(value) and value == int(value) and abs(value) < 2**53:
            return int(value)
        return value
    if isinstance(value, (list, tuple)):
        return tuple(normalize(v) for v in value)
    if isinstance(value, str):
        s = value.strip()
        low = s.lower()
        if low == "true":
            return True
        if low == "false":
            return False
        if low == "none":
            return None
        if _INT_RE.match(s):
            return int(s)
        if _FLOAT_RE.match(s):
            return normalize(float(s))
        if s[:1] in "[(" and s[-1:] in "])":
            try:
                parsed = ast.literal_eval(s)
            except (ValueError, SyntaxError):
                return s
            if isinstance(parsed, (list, tuple)):
                return normalize(parsed)
        return s
    return value


def same(a: Any, b: Any) -> bool:
    """Equality after normalisation."""
    return normalize(a) == normalize(b)


def to_jsonable(value: Any) -> Any:
    """Normalised value in a form json can print (tuples -> lists)."""
    v = normalize(value)
    if isinstance(v, tuple):
        return [to_jsonable(x) for x in v]
    return v
