"""A strict reader for the YAML subset attune's own files use (campaign.yaml, policy.yaml).

Standard library only, and no `re`: the hooks read campaign.yaml on every tool call. What it reads it
reads as PyYAML's `safe_load` does (tests/test_yamlsubset.py compares the two on every example
campaign and on many spellings); what it cannot read exactly it refuses with `YamlSubsetError`
naming the line, never guessing:

- block mappings and sequences (spaces, no tabs), `- key: value` items, one optional leading `---`;
- flow mappings and sequences (`{a: 1, b: [x, y]}`), also spread over several lines;
- plain, single- and double-quoted scalars; `#` comments;
- plain scalars resolved as YAML 1.1 (null, bools incl. yes/no/on/off, decimal ints, floats with a
  dot, `.inf`/`.nan`); a plain scalar that merely looks like a number or a date (`1e3`, `0x1f`,
  `1_000`, `012`, `1:30`, `2024-01-01`) is refused: quote it.

Refused: anchors, aliases, tags, block scalars (`|`, `>`), directives, several documents, complex
keys (`?`), duplicate keys, and anything else outside the subset. Multi-line quoted and plain scalars are
read (folded as YAML folds them: what `yaml.safe_dump` writes for a long string) when their lines are
indented under their key; a plain one whose lines hold ': ' or ' #' is refused.
"""

from __future__ import annotations

from attune.core.errors import CoreError

TYPE_CHECKING = False  # no typing import at run time (hooks)
if TYPE_CHECKING:
    from typing import Any

MAX_BYTES = 2**20
MAX_DEPTH = 64

_NULLS = ("", "~", "null", "Null", "NULL")
_TRUE = ("true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON")
_FALSE = ("false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF")
_REFUSED_START = "&*!|>%@`?"
_DIGITS = "0123456789"
_NUMERIC_CHARS = _DIGITS + "_:.eE+-tTzZ "  # what YAML 1.1 numbers and timestamps are made of
_ESCAPES = {"0": "\0", "a": "\a", "b": "\b", "t": "\t", "\t": "\t", "n": "\n", "v": "\v", "f": "\f",
            "r": "\r", "e": "\x1b", " ": " ", '"': '"', "/": "/", "\\": "\\", "N": "\x85", "_": "\xa0",
            "L": "\u2028", "P": "\u2029"}
_HEX_LEN = {"x": 2, "u": 4, "U": 8}


class YamlSubsetError(CoreError, ValueError):
    """The text is outside the subset (or not YAML at all): the message names the line and why."""


class _Incomplete(CoreError):
    """A flow collection ran out of text: it continues on the next line (or never closes)."""


def _digits(s: str) -> bool:
    return bool(s) and all(c in _DIGITS for c in s)


def _number(s: str, where: str) -> int | float | None:
    """A plain scalar as a number, None when it does not look like one; refuses the ambiguous forms."""
    body = s[1:] if s[:1] in "+-" else s
    if not body or not (body[0] in _DIGITS or (body[0] == "." and body[1:2] in tuple(_DIGITS))):
        if body in (".inf", ".Inf", ".INF"):
            return float("-inf") if s[0] == "-" else float("inf")
        if s in (".nan", ".NaN", ".NAN"):
            return float("nan")
        return None
    if _digits(body) and (body == "0" or body[0] != "0"):
        return int(s)
    mant, e, exp = body.replace("E", "e").partition("e")
    whole, dot, frac = mant.partition(".")
    if dot and _digits(whole) and (frac == "" or _digits(frac)) and (
            not e or (exp[:1] in ("+", "-") and _digits(exp[1:]))):
        return float(s)
    if body[:2] not in ("0x", "0X", "0b", "0o") and any(c not in _NUMERIC_CHARS for c in body):
        return None  # no YAML 1.1 int, float or timestamp holds such a letter: a string (a digest, `3a`)
    raise YamlSubsetError(f"{where}: {s!r} looks like a number or a date but is not one this reader resolves "
                          "exactly; quote it (or write a decimal number)")


def _plain(s: str, where: str, flow: bool) -> Any:
    if s[:1] in _REFUSED_START or s.startswith(("- ", "-\t")) or s == "-" or s[:1] in "[]{},":
        raise YamlSubsetError(f"{where}: {s!r}: anchors, aliases, tags, block scalars, directives and "
                              "complex keys are not read here; quote the value")
    if ": " in s or s.endswith(":") or " #" in s or "\t" in s or s in ("=", "<<"):
        raise YamlSubsetError(f"{where}: {s!r} is ambiguous as a plain value; quote it")
    if flow and (":" in s or any(c in s for c in "[]{},")):
        raise YamlSubsetError(f"{where}: {s!r} inside [...] or {{...}}: quote it")
    if s in _NULLS:
        return None
    if s in _TRUE:
        return True
    if s in _FALSE:
        return False
    n = _number(s, where)
    return s if n is None else n


def _quoted(s: str, i: int, where: str) -> tuple[str, int]:
    """The quoted scalar starting at s[i]; (its value, the index after its closing quote)."""
    q = s[i]
    out: list[str] = []
    j = i + 1
    n = len(s)
    while j < n:
        c = s[j]
        if c == "\n":  # a line break inside the scalar (loads joined its lines): YAML's folding
            while out and out[-1] in " \t":
                out.pop()
            j, breaks = _fold(s, j)
            out.append("\n" * breaks if breaks else " ")
            continue
        if c == "\\" and q == '"' and s[j + 1 : j + 2] == "\n":  # an escaped line break: no space
            j, breaks = _fold(s, j + 1)
            out.append("\n" * breaks)
            continue
        if c == q:
            if q == "'" and s[j + 1 : j + 2] == "'":
                out.append("'")
                j += 2
                continue
            return "".join(out), j + 1
        if c == "\\" and q == '"':
            k = s[j + 1 : j + 2]
            if k in _ESCAPES:
                out.append(_ESCAPES[k])
                j += 2
                continue
            size = _HEX_LEN.get(k)
            code = s[j + 2 : j + 2 + size] if size else ""
            if not size or len(code) != size or any(ch not in "0123456789abcdefABCDEF" for ch in code):
                raise YamlSubsetError(f"{where}: bad escape in a double-quoted string")
            out.append(chr(int(code, 16)))
            j += 2 + size
            continue
        out.append(c)
        j += 1
    raise YamlSubsetError(f"{where}: the quoted string does not close on its line")


def _fold(s: str, j: int) -> tuple[int, int]:
    """From the line break at s[j]: (the index of the next line's first non-blank character, the
    number of empty lines between)."""
    breaks = 0
    while True:
        j += 1
        while j < len(s) and s[j] in " \t":
            j += 1
        if s[j : j + 1] != "\n":
            return j, breaks
        breaks += 1


def _value_start(body: str, indent: int, where: str) -> tuple[int, int] | None:
    """For a line `[- ...]key: value` or `- value`: (the column of the node that holds the value, the
    index in `body` where the value starts); None for any other line."""
    i, col = 0, indent
    while body[i : i + 2] == "- ":
        col = indent + i
        i += 2
        while body[i : i + 1] == " ":
            i += 1
    rest = body[i:]
    if rest[:1] in ("'", '"'):
        try:
            _, j = _quoted(rest, 0, where)
        except YamlSubsetError:
            return (col, i) if i else None
        if rest[j:].rstrip() == ":":
            return None  # `'key':`: its value is the block below
        if rest[j : j + 2] != ": ":
            return (col, i) if i else None
    else:
        j = rest.find(": ")
        if j < 0 and rest.rstrip().endswith(":") and rest[:1] not in "[{":
            return None  # `key:`: its value is the block below
        if j < 0 or rest[:1] in "[{":
            return (col, i) if i else None
    v = i + j + 2
    while body[v : v + 1] == " ":
        v += 1
    return indent + i, v


def _multiline(raws: list[str], k: int, indent: int, where: str) -> tuple[str, int] | None:
    """A quoted or plain scalar that continues on the raw lines after line k (each more indented than
    the node that holds it), joined onto one line: (the line's content, the next raw line); None when
    line k holds no such scalar."""
    body = raws[k][indent:]
    start = _value_start(body, indent, where)
    if start is None or not body[start[1]:].strip():
        return None
    col, v = start
    first = body[v:]
    if first[:1] in ("'", '"'):
        try:
            _quoted(first, 0, where)
            return None  # it closes on its line
        except YamlSubsetError:
            pass
        text, j = first, k + 1
        while j < len(raws):
            raw = raws[j]
            if raw.strip() and len(raw) - len(raw.lstrip(" ")) <= col:
                break
            text += "\n" + raw
            j += 1
            try:
                value, end = _quoted(text, 0, where)
            except YamlSubsetError:
                continue
            tail = text[end:].strip()
            if tail and not tail.startswith("#"):
                raise YamlSubsetError(f"{where}: unexpected text after a quoted string")
            return body[:v] + _quote(value), j
        raise YamlSubsetError(f"{where}: the quoted string does not close (or its lines are not indented "
                              "under its key)")
    if first[:1] in "[{#" + _REFUSED_START or " #" in first or "\t" in first:
        return None
    parts, j, empties = [first.rstrip()], k + 1, 0
    while j < len(raws):
        raw = raws[j]
        line = raw.strip()
        if not line:
            empties += 1
            j += 1
            continue
        if len(raw) - len(raw.lstrip(" ")) <= col or line.startswith("#"):
            break
        if ": " in line or line.endswith(":") or " #" in line or "\t" in line:
            raise YamlSubsetError(f"line {j + 1}: a multi-line plain value with ': ' or ' #' in it: quote it")
        parts.append("\n" * empties if empties else " ")
        parts.append(line)
        empties = 0
        j += 1
    if len(parts) == 1:
        return None
    return body[:v] + _quote("".join(parts)), j - empties


def _deeper_next(raws: list[str], k: int, indent: int) -> bool:
    """Is the next non-blank raw line (from index k) more indented than `indent`? Only then can a plain
    value continue (the hooks parse campaign.yaml on every tool call: most lines skip `_multiline`)."""
    while k < len(raws) and not raws[k].strip():
        k += 1
    return k < len(raws) and len(raws[k]) - len(raws[k].lstrip(" ")) > indent


def _strip_comment(line: str, where: str) -> str:
    """The line without its comment; quotes are honoured where a scalar may start."""
    i, n = 0, len(line)
    while i < n:
        c = line[i]
        if c in "'\"" and (i == 0 or line[i - 1] in " \t[{,"):
            _, i = _quoted(line, i, where)
            continue
        if c == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i].rstrip()
        i += 1
    return line.rstrip()


class _Flow:
    """One flow collection (or scalar) in a string: `[a, {b: c}]`."""

    def __init__(self, text: str, where: str, depth: int) -> None:
        self.s, self.i, self.where, self.depth = text, 0, where, depth

    def _ws(self) -> None:
        while self.i < len(self.s) and self.s[self.i] in " \t":
            self.i += 1

    def value(self, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise YamlSubsetError(f"{self.where}: nested deeper than {MAX_DEPTH} levels")
        self._ws()
        c = self.s[self.i : self.i + 1]
        if not c:
            raise _Incomplete
        if c == "[":
            return self._seq(depth)
        if c == "{":
            return self._map(depth)
        if c in ("'", '"'):
            val, self.i = _quoted(self.s, self.i, self.where)
            return val
        j = self.i
        while j < len(self.s) and self.s[j] not in ",]}":
            if self.s[j] == ":" and self.s[j + 1 : j + 2] in ("", " ", ",", "]", "}"):
                break
            j += 1
        text = self.s[self.i : j].strip()
        self.i = j
        if not text:
            raise YamlSubsetError(f"{self.where}: an empty entry inside [...] or {{...}}")
        return _plain(text, self.where, flow=True)

    def _seq(self, depth: int) -> list[Any]:
        self.i += 1
        out: list[Any] = []
        while True:
            self._ws()
            if self.i >= len(self.s):
                raise _Incomplete
            if self.s[self.i : self.i + 1] == "]":
                self.i += 1
                return out
            out.append(self.value(depth + 1))
            self._ws()
            self._sep("]")

    def _sep(self, close: str) -> None:
        c = self.s[self.i : self.i + 1]
        if not c:
            raise _Incomplete
        if c == ",":
            self.i += 1
        elif c != close:
            raise YamlSubsetError(f"{self.where}: expected ',' or '{close}' inside a flow collection")

    def _map(self, depth: int) -> dict[Any, Any]:
        self.i += 1
        out: dict[Any, Any] = {}
        while True:
            self._ws()
            if self.i >= len(self.s):
                raise _Incomplete
            if self.s[self.i : self.i + 1] == "}":
                self.i += 1
                return out
            if self.s[self.i : self.i + 1] in ("[", "{"):
                raise YamlSubsetError(f"{self.where}: a collection as a key is not read here")
            key = self.value(depth + 1)
            self._ws()
            if self.i >= len(self.s):
                raise _Incomplete
            if self.s[self.i : self.i + 1] != ":":
                raise YamlSubsetError(f"{self.where}: expected 'key: value' inside {{...}}")
            self.i += 1
            _put(out, key, self.value(depth + 1), self.where)
            self._ws()
            self._sep("}")


def _put(out: dict[Any, Any], key: Any, value: Any, where: str) -> None:
    if isinstance(key, (list, dict)):
        raise YamlSubsetError(f"{where}: a collection as a key is not read here")
    if key in out:
        raise YamlSubsetError(f"{where}: key {key!r} given twice")
    out[key] = value


def _split_key(content: str, where: str) -> tuple[Any, str] | None:
    """`key: rest` -> (key, rest); None when the content is not a mapping entry."""
    if content[:1] in ("'", '"'):
        key, j = _quoted(content, 0, where)
        rest = content[j:]
        if rest[:1] == ":" and rest[1:2] in ("", " "):
            return key, rest[1:].strip()
        return None
    if content[:1] in "[{":
        return None
    j = content.find(": ")
    if content.endswith(":") and (j < 0 or j == len(content) - 1):
        j = len(content) - 1
    if j < 0:
        return None
    return _plain(content[:j].rstrip(), where, flow=False), content[j + 1 :].strip()


class _Block:
    def __init__(self, lines: list[tuple[int, int, str]]) -> None:
        self.lines = lines  # (line number, indent, content without comment)

    def where(self, k: int) -> str:
        return f"line {self.lines[k][0]}" if k < len(self.lines) else "end of file"

    def node(self, k: int, indent: int, depth: int) -> tuple[Any, int]:
        if depth > MAX_DEPTH:
            raise YamlSubsetError(f"{self.where(k)}: nested deeper than {MAX_DEPTH} levels")
        content = self.lines[k][2]
        if content == "-" or content.startswith("- "):
            return self.seq(k, indent, depth)
        if _split_key(content, self.where(k)) is None:
            val, k2 = self.inline(k, content, indent - 1, depth)
            return val, k2
        return self.mapping(k, indent, depth)

    def inline(self, k: int, text: str, parent: int, depth: int) -> tuple[Any, int]:
        """A value written on line k (a scalar or a flow collection, which may continue on later lines)."""
        where = self.where(k)
        if text[:1] in "[{":
            k2 = k + 1
            while True:
                flow = _Flow(text, where, depth)
                try:
                    val = flow.value(depth)
                    flow._ws()
                    if flow.i != len(text):
                        raise YamlSubsetError(f"{where}: unexpected text after a flow collection")
                    return val, k2
                except _Incomplete:
                    pass
                if k2 >= len(self.lines) or (self.lines[k2][1] <= parent and self.lines[k2][2][:1] not in "]}"):
                    raise YamlSubsetError(f"{where}: a [...] or {{...}} that does not close")
                text += " " + self.lines[k2][2]
                k2 += 1
        if text[:1] in ("'", '"'):
            val, j = _quoted(text, 0, where)
            if text[j:].strip():
                raise YamlSubsetError(f"{where}: unexpected text after a quoted string")
            return val, k + 1
        return _plain(text, where, flow=False), k + 1

    def child(self, k: int, indent: int, depth: int, seq_ok: bool) -> tuple[Any, int]:
        """The block value after `key:` or `-` (on the lines below, more indented), or null."""
        if k < len(self.lines):
            ind, content = self.lines[k][1], self.lines[k][2]
            if ind > indent:
                return self.node(k, ind, depth + 1)
            if seq_ok and ind == indent and (content == "-" or content.startswith("- ")):
                return self.seq(k, ind, depth + 1)
        return None, k

    def mapping(self, k: int, indent: int, depth: int) -> tuple[dict[Any, Any], int]:
        out: dict[Any, Any] = {}
        while k < len(self.lines) and self.lines[k][1] == indent:
            content = self.lines[k][2]
            where = self.where(k)
            split = _split_key(content, where)
            if split is None:
                raise YamlSubsetError(f"{where}: expected 'key: value'")
            key, rest = split
            if rest:
                val, k = self.inline(k, rest, indent, depth + 1)
            else:
                val, k = self.child(k + 1, indent, depth, seq_ok=True)
            _put(out, key, val, where)
        self.expect_dedent(k, indent)
        return out, k

    def seq(self, k: int, indent: int, depth: int) -> tuple[list[Any], int]:
        out: list[Any] = []
        while k < len(self.lines) and self.lines[k][1] == indent:
            num, _, content = self.lines[k]
            if not (content == "-" or content.startswith("- ")):
                break
            rest = content[1:].lstrip(" ")
            if not rest:
                val, k = self.child(k + 1, indent, depth, seq_ok=False)
            else:
                col = indent + len(content) - len(rest)
                self.lines[k] = (num, col, rest)
                if rest == "-" or rest.startswith("- ") or _split_key(rest, self.where(k)) is not None:
                    val, k = self.node(k, col, depth + 1)
                else:
                    val, k = self.inline(k, rest, indent, depth + 1)
            out.append(val)
        self.expect_dedent(k, indent)
        return out, k

    def expect_dedent(self, k: int, indent: int) -> None:
        if k < len(self.lines) and self.lines[k][1] > indent:
            raise YamlSubsetError(f"{self.where(k)}: unexpected indentation (a multi-line plain value, or a "
                                  "misplaced line): not read here")


_BLOCK_INDICATORS = ("|", "|-", ">", ">-")


def _block_scalar(raws: list[str], k: int, indent: int, style: str, where: str) -> tuple[str, int]:
    """A literal (`|`) or folded (`>`) scalar on the raw lines after line k; (its value, the next line)."""
    body: list[str] = []
    base = -1
    j = k + 1
    while j < len(raws):
        raw = raws[j]
        stripped = raw.lstrip(" ")
        if stripped and (len(raw) - len(stripped) <= indent):
            break
        if stripped:
            ind = len(raw) - len(stripped)
            base = ind if base < 0 else base
            if ind < base or "\t" in raw[:ind + 1]:
                raise YamlSubsetError(f"line {j + 1}: a block scalar's lines must keep its indentation")
            if style[0] == ">" and ind > base:
                raise YamlSubsetError(f"line {j + 1}: a more indented line in a folded scalar: not read here")
            body.append(raw[base:])
        else:
            body.append("")
        j += 1
    while body and not body[-1]:
        body.pop()
    if style[0] == "|":
        text = "\n".join(body)
    else:
        text = ""
        for n, line in enumerate(body):
            if not line:
                text += "\n"
            elif n and body[n - 1]:
                text += " " + line
            else:
                text += line
    if body and not style.endswith("-"):
        text += "\n"
    return text, j


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t") + '"'


def loads(text: str) -> Any:
    """The document in `text` (None when it is empty); raises YamlSubsetError outside the subset."""
    if len(text) > MAX_BYTES:
        raise YamlSubsetError(f"longer than {MAX_BYTES} characters")
    if text.startswith("\ufeff"):
        text = text[1:]
    lines: list[tuple[int, int, str]] = []
    raws = text.splitlines()
    k = 0
    while k < len(raws):
        raw = raws[k]
        num = k + 1
        k += 1
        where = f"line {num}"
        body = raw.lstrip(" ")
        if body.startswith("\t") and body.strip():
            raise YamlSubsetError(f"{where}: indent with spaces, not tabs")
        indent = len(raw) - len(body)
        joined = _multiline(raws, num - 1, indent, where) if body.strip() and _deeper_next(raws, k, indent) else None
        if joined is not None:
            body, k = joined
        try:
            content = _strip_comment(body, where)
        except YamlSubsetError:  # a quoted value that does not close on its line: it may continue below
            joined = None if joined is not None else _multiline(raws, num - 1, indent, where)
            if joined is None:
                raise
            body, k = joined
            content = _strip_comment(body, where)
        if not content:
            continue
        head, _, indicator = content.rpartition(" ")
        if indicator in _BLOCK_INDICATORS and (head.endswith(":") or head == "-" or head.endswith(" -")):
            value, k = _block_scalar(raws, num - 1, indent, indicator, where)
            content = f"{head} {_quote(value)}"
        if content in ("---", "...") or content.startswith(("--- ", "%")):
            if content == "---" and not lines and raw == content:
                continue
            raise YamlSubsetError(f"{where}: directives and several documents are not read here")
        lines.append((num, indent, content))
    if not lines:
        return None
    block = _Block(lines)
    val, k = block.node(0, lines[0][1], 0)
    if k < len(lines):
        raise YamlSubsetError(f"{block.where(k)}: unexpected text at a lower indentation than the document")
    return val


def load_file(path: str, limit: int = MAX_BYTES) -> Any:
    """Read and parse a file; raises OSError or YamlSubsetError."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read(limit + 1)
    return loads(text)
