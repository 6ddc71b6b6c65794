"""Minimal readers for what the gate needs from a Megatron-style training log.

- :func:`read_losses`: iteration number -> ``lm loss`` (streaming, line by line).
  Losses are keyed by the iteration number printed on the same line, never by
  position. An iteration line without an ``lm loss`` field (Megatron drops the field
  when the loss is NaN) gives ``None`` for that iteration: the loss is missing.
  ``nan``/``inf`` printed as text are read as floats.
- :func:`read_resolved_args`: the ``arguments`` block Megatron prints at start-up
  (``  name ....... value``), as attribute name -> raw string value.

These are deliberately small so that the control plane's full metrics reader can
replace them; both take any iterable of lines.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from attune.bounded import check_regular

_ITER_RE = re.compile(r"\biteration\s+(\d+)\s*/\s*\d+")
_LOSS_RE = re.compile(r"\blm loss:\s*([-+]?(?:nan|inf|infinity|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?))",
                      re.IGNORECASE)
_ARGS_START_RE = re.compile(r"^(.*?)-{3,} arguments -{3,}\s*$")
_ARGS_END_RE = re.compile(r"-{3,} end of arguments -{3,}")
_ARG_LINE_RE = re.compile(r"^  ([A-Za-z_]\w*) \.* ?(.*?)\s*$")


def _lines(source: str | Path | Iterable[str]) -> Iterator[str]:
    if isinstance(source, (str, Path)):
        check_regular(source, "training log")  # a FIFO or /dev/zero would never end
        with open(source, encoding="utf-8", errors="replace") as fh:
            yield from fh
    else:
        yield from source


def read_losses(source: str | Path | Iterable[str]) -> dict[int, float | None]:
    """Iteration -> lm loss (``None`` when the iteration was logged without a loss)."""
    out: dict[int, float | None] = {}
    for line in _lines(source):
        m = _ITER_RE.search(line)
        if not m:
            continue
        it = int(m.group(1))
        lm = _LOSS_RE.search(line, m.end())
        if lm is None:
            out[it] = None
            continue
        out[it] = float(lm.group(1))  # float() reads nan, inf, -inf, infinity in any case
    return out


def read_resolved_args(source: str | Path | Iterable[str]) -> dict[str, str]:
    """The first ``arguments`` block of a log: attribute name -> printed value.

    A per-line prefix in front of the block's title (a timestamp, ``[rank0]:``,
    ``0:`` from ``srun --label``) is stripped from every line of the block.
    Raises ValueError if the log has no complete block.
    """
    out: dict[str, str] = {}
    prefix: str | None = None
    for line in _lines(source):
        line = line.rstrip("\n")
        if prefix is None:
            m = _ARGS_START_RE.match(line)
            if m and "end of" not in line:
                prefix = m.group(1)
            continue
        if _ARGS_END_RE.search(line):
            return out
        body = line[len(prefix):] if prefix and line.startswith(prefix) else line
        am = _ARG_LINE_RE.match(body)
        if am:
            out[am.group(1)] = am.group(2)
    if prefix is None:
        raise ValueError("no resolved-arguments block ('---- arguments ----') in the log")
    raise ValueError("the resolved-arguments block is not terminated ('---- end of arguments ----')")
