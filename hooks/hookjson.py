"""JSON for the hooks without importing `json`: CPython's C scanner and string encoder (`_json`).

`import json` pulls in `re` (and with it `enum`, `functools`, `collections`): more than half of a
PreToolUse hook's own start-up. The hooks parse one small object and write one line, so they use the
same C code `json` uses, reached directly. Where `_json` is missing (another Python), `json` is used.
`loads` accepts what `json.loads` accepts; `dumps` writes what `json.dumps` writes for dicts, lists,
strings, numbers, booleans and None (other values: `default`, else TypeError).

Kept by measurement (issue 22: a hand-written stdlib replacement stays only where the benchmark shows it
matters): PreToolUse on the `json` module instead costs 10.7 ms more CPU per tool call, 26.7 ms against
15.9 ms (2.86x against 1.71x a bare `python3 -I -S -c pass`), measured with the Bash-allow case of
`benchmarks/bench_plugin.py --hooks-only`, 60 interleaved runs each.
"""

from __future__ import annotations

from attune.core.errors import HookError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

try:
    import _json
except ImportError:  # pragma: no cover - not CPython
    _json = None  # type: ignore[assignment]

__all__ = ["JSONDecodeError", "dumps", "loads"]


class JSONDecodeError(HookError, ValueError):
    """The text is not one JSON document."""


_CONSTANTS = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


class _Context:
    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = _CONSTANTS.__getitem__

    def __init__(self) -> None:
        self.memo: dict[str, str] = {}


_scan = None


def loads(text: str) -> Any:
    global _scan
    if _json is None:  # pragma: no cover
        import json

        return json.loads(text)
    if _scan is None:
        _scan = _json.make_scanner(_Context())
    ws = " \t\n\r"
    i, n = 0, len(text)
    while i < n and text[i] in ws:
        i += 1
    try:
        obj, end = _scan(text, i)
    except StopIteration:
        raise JSONDecodeError(f"no JSON value at character {i}") from None
    except ValueError as exc:
        raise JSONDecodeError(str(exc)) from None
    while end < n and text[end] in ws:
        end += 1
    if end != n:
        raise JSONDecodeError(f"extra data at character {end}")
    return obj


def dumps(obj: Any, ensure_ascii: bool = True, default: Callable[[Any], Any] | None = None) -> str:
    if _json is None:  # pragma: no cover
        import json

        return json.dumps(obj, ensure_ascii=ensure_ascii, default=default)
    out: list[str] = []
    enc = _json.encode_basestring_ascii if ensure_ascii else _json.encode_basestring
    _dump(obj, out, enc, default, 0)
    return "".join(out)


def _dump(obj: Any, out: list[str], enc: Callable[[str], str], default: Callable[[Any], Any] | None,
          depth: int) -> None:
    if depth > 200:
        raise ValueError("nesting too deep to encode")
    if isinstance(obj, str):
        out.append(enc(obj))
    elif obj is None:
        out.append("null")
    elif obj is True:
        out.append("true")
    elif obj is False:
        out.append("false")
    elif isinstance(obj, int):
        out.append(int.__repr__(obj))
    elif isinstance(obj, float):
        if obj != obj:
            out.append("NaN")
        elif obj in (float("inf"), float("-inf")):
            out.append("Infinity" if obj > 0 else "-Infinity")
        else:
            out.append(float.__repr__(obj))
    elif isinstance(obj, dict):
        out.append("{")
        first = True
        for k, v in obj.items():
            if not first:
                out.append(", ")
            first = False
            if not isinstance(k, str):
                k = dumps(k) if isinstance(k, (int, float, bool)) or k is None else str(k)
                k = k.strip('"')
            out.append(enc(k))
            out.append(": ")
            _dump(v, out, enc, default, depth + 1)
        out.append("}")
    elif isinstance(obj, (list, tuple)):
        out.append("[")
        for j, v in enumerate(obj):
            if j:
                out.append(", ")
            _dump(v, out, enc, default, depth + 1)
        out.append("]")
    elif default is not None:
        _dump(default(obj), out, enc, None, depth + 1)
    else:
        raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")

