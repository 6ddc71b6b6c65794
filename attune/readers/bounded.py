"""Bounded reading of untrusted input files and bodies: the one place every reader goes through.

Every command that reads a file (a campaign spec, a correctness list, a lever catalog, a log, a
trace, a ledger) and the broker's request bodies use these helpers, so the same limits hold
everywhere:

- only regular files are read: a directory, a FIFO, a socket or a device (`/dev/zero`) is refused
  before it is read (a FIFO is opened non-blocking, so nothing waits for a writer);
- a file larger than its limit is refused without being read whole;
- text must be UTF-8; the error names the byte offset of the first bad byte;
- JSON and YAML nesting is bounded (`MAX_DEPTH`), JSON numbers must be finite (`1e999`, `NaN` are
  refused), strings must not hold lone surrogates, and YAML aliases are bounded both in number
  and in what they expand to (an alias bomb is refused, not expanded).

A problem is an `InputError` (a `UsageError`: the CLI prints its one line and exits 2).
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

from attune.core.errors import ReaderError, UsageError

MAX_CONFIG_BYTES = 4 * 2**20  # specs, lists, catalogs, small JSON inputs
MAX_DEPTH = 64  # nesting of JSON arrays/objects and YAML collections
MAX_ALIASES = 200  # YAML alias uses in one document
MAX_EXPANDED_NODES = 200_000  # YAML nodes once every alias is expanded

_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_JSON_BRACKET = re.compile(rb"[\[\]{}]")


class InputError(ReaderError, UsageError, OSError):
    """An input that is refused: one line saying which input and why.

    A `UsageError` (the CLI exits 2) and an `OSError` (code that treats an unreadable file as
    such, like the control plane scoring a job's log, treats a refused one the same way)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class MissingInput(InputError, FileNotFoundError):
    """The input does not exist (also a FileNotFoundError, for code that handles that)."""


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def check_regular(path: Path | str, what: str = "input") -> os.stat_result:
    """The file's stat if it is a regular file (links followed); InputError otherwise."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise MissingInput(f"{what} {path}: cannot read (no such file)") from None
    except OSError as exc:
        raise InputError(f"{what} {path}: cannot read ({exc.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{what} {path}: {_kind(st.st_mode)}, not a regular file")
    return st


def read_bytes(path: Path | str, what: str = "input", max_bytes: int = MAX_CONFIG_BYTES) -> bytes:
    """A regular file's bytes, at most `max_bytes` (refused, not cut, when larger)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except FileNotFoundError:
        raise MissingInput(f"{what} {path}: cannot read (no such file)") from None
    except IsADirectoryError:
        raise InputError(f"{what} {path}: a directory, not a regular file") from None
    except OSError as exc:
        raise InputError(f"{what} {path}: cannot read ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{what} {path}: {_kind(st.st_mode)}, not a regular file")
        if st.st_size > max_bytes:
            raise InputError(f"{what} {path}: {st.st_size} bytes, over the limit of {max_bytes}")
        chunks: list[bytes] = []
        total = 0
        while total <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > max_bytes:
            raise InputError(f"{what} {path}: over the limit of {max_bytes} bytes")
        return b"".join(chunks)
    except InputError:
        raise
    except OSError as exc:
        raise InputError(f"{what} {path}: cannot read ({exc.strerror})") from None
    finally:
        os.close(fd)


def decode_utf8(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{what}: not UTF-8 text (bad byte 0x{raw[exc.start]:02x} at offset {exc.start})") from None


def read_text(path: Path | str, what: str = "input", max_bytes: int = MAX_CONFIG_BYTES) -> str:
    """A regular file's UTF-8 text, within `max_bytes`."""
    return decode_utf8(read_bytes(path, what, max_bytes), f"{what} {path}")


# ------------------------------------------------------------------------------------ JSON


def json_depth(raw: bytes | str) -> int:
    """The deepest nesting of arrays and objects in a JSON text (strings skipped), without parsing it."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    depth = deepest = 0
    for m in _JSON_BRACKET.finditer(_JSON_STRING.sub(b'""', data)):
        if m.group() in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _finite_float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"number {text[:40]} is out of range")
    return v


def check_strings(obj: Any, what: str, depth: int = 0) -> None:
    """Refuse lone surrogates in any string or key (they cannot be written as UTF-8)."""
    if depth > MAX_DEPTH + 1:
        raise InputError(f"{what}: nested deeper than {MAX_DEPTH} levels")
    if isinstance(obj, str):
        try:
            obj.encode("utf-8")
        except UnicodeEncodeError:
            raise InputError(f"{what}: a string holds a lone surrogate (\\ud800-\\udfff), not text") from None
    elif isinstance(obj, dict):
        for k, v in obj.items():
            check_strings(k, what, depth + 1)
            check_strings(v, what, depth + 1)
    elif isinstance(obj, list):
        for v in obj:
            check_strings(v, what, depth + 1)


def loads_json(raw: bytes | str, what: str = "input", max_depth: int = MAX_DEPTH) -> Any:
    """Parse JSON with bounded nesting, finite numbers and real text only."""
    if json_depth(raw) > max_depth:
        raise InputError(f"{what}: JSON nested deeper than {max_depth} levels")
    try:
        obj = json.loads(raw, parse_constant=_no_constant, parse_float=_finite_float)
    except RecursionError:
        raise InputError(f"{what}: JSON nested too deeply") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{what}: not UTF-8 text (bad byte at offset {exc.start})") from None
    except ValueError as exc:
        raise InputError(f"{what}: not valid JSON ({str(exc)[:200]})") from None
    check_strings(obj, what)
    return obj


def read_json(path: Path | str, what: str = "input", max_bytes: int = MAX_CONFIG_BYTES) -> Any:
    return loads_json(read_text(path, what, max_bytes), f"{what} {path}")


# ------------------------------------------------------------------------------------ YAML


class BoundedSafeLoader(yaml.SafeLoader):
    """A safe YAML loader with bounded nesting, alias uses and alias expansion."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:  # type: ignore[override]
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise yaml.YAMLError(f"more than {MAX_ALIASES} alias uses in one document")
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.YAMLError(f"nested deeper than {MAX_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self) -> Any:  # type: ignore[override]
        node = super().compose_document()
        if node is not None and self._aliases:
            _expanded_size(node)
        return node


def _expanded_size(root: yaml.Node) -> int:
    """How many nodes a document holds once every alias is expanded (refused past the limit)."""
    memo: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    on_path: set[int] = set()
    while stack:
        node, done = stack.pop()
        key = id(node)
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        if done:
            on_path.discard(key)
            memo[key] = 1 + sum(memo[id(c)] for c in children)
            if memo[key] > MAX_EXPANDED_NODES:
                raise yaml.YAMLError(f"aliases expand to more than {MAX_EXPANDED_NODES} nodes (an alias bomb?)")
            continue
        if key in memo:
            continue
        if key in on_path:
            raise yaml.YAMLError("a recursive alias")
        on_path.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in memo)
    return memo[id(root)]


def yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    problem = getattr(exc, "problem", None) or str(exc)
    return f"{where}{problem}"


_CLoader = getattr(yaml, "CSafeLoader", None)


def _plain_for_c(text: str) -> bool:
    """True when libyaml may load `text`: no aliases and shallow (checked on its events, in C)."""
    depth = 0
    try:
        for ev in yaml.parse(text, Loader=_CLoader):
            if isinstance(ev, yaml.AliasEvent):
                return False
            if isinstance(ev, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    return False
            elif isinstance(ev, yaml.CollectionEndEvent):
                depth -= 1
    except yaml.YAMLError:
        return False  # the bounded loader says what is wrong
    return True


def loads_yaml(text: str, what: str = "input", loader: type[BoundedSafeLoader] = BoundedSafeLoader) -> Any:
    """Parse YAML with the bounded loader (libyaml for a document it can load safely); one line on any problem."""
    if loader is BoundedSafeLoader and _CLoader is not None and _plain_for_c(text):
        loader = _CLoader  # type: ignore[assignment]
    try:
        obj = yaml.load(text, Loader=loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise InputError(f"{what}: not valid YAML ({yaml_problem(exc)})") from None
    except RecursionError:
        raise InputError(f"{what}: YAML nested too deeply") from None
    check_strings(obj, what)
    return obj


def read_yaml(path: Path | str, what: str = "input", max_bytes: int = MAX_CONFIG_BYTES,
              loader: type[BoundedSafeLoader] = BoundedSafeLoader) -> Any:
    return loads_yaml(read_text(path, what, max_bytes), f"{what} {path}", loader)


def read_structured(path: Path | str, what: str = "input", max_bytes: int = MAX_CONFIG_BYTES) -> Any:
    """JSON for a .json file, YAML (which reads JSON too) for anything else."""
    text = read_text(path, what, max_bytes)
    if str(path).endswith(".json"):
        return loads_json(text, f"{what} {path}")
    return loads_yaml(text, f"{what} {path}")
