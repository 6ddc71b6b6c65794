"""Pathname expansion as bash does it, for the PreToolUse policy.

`expand(pattern, cwd)` returns the paths bash would put in place of an unquoted pattern (bash 5.x
defaults: extglob, dotglob, nocaseglob, nullglob, failglob and globstar off, globasciiranges and
globskipdots on), sorted; the pattern itself (quote-removed) when nothing matches, as bash leaves it.
`pattern` is `shell.Word.pattern`: quoted characters are escaped with a backslash.

The matcher errs towards matching more, never less: every path it returns is checked by the policy,
so a name bash would produce and this module would not is the only way to read past the check.
Bracket classes (`[[:alpha:]]` and the rest) use Python's Unicode character predicates; ranges
compare code points (globasciiranges). Constructs whose meaning depends on the locale (`[=a=]`,
`[.a.]`) and a wildcard component starting with `.` (bash versions differ on matching `.` and `..`)
raise `Unsupported`. Standard library only; imported only when a command holds a pattern.

Kept for its semantics, not its speed: the `glob` and `fnmatch` modules do not expand as bash does
(`[^a]` is a literal `^` there, `[[:alpha:]]` is unknown, nothing bounds the entries a pattern reads),
and tests/test_globbing.py holds this module to bash on 33 patterns. (`import glob` also costs about
21 ms, twice a bare interpreter's start, on each call whose command holds a pattern: `python3 -X
importtime -I -S -c "import glob"`.)
"""

from __future__ import annotations

from attune.core.errors import HookError
from hooks import lightos as os  # os without `import os` (see hooks/lightos.py)

__all__ = ["Unsupported", "expand", "has_magic", "match"]

LIMIT = 5000  # directory entries looked at per expansion


class Unsupported(HookError):
    """The pattern uses a construct this module does not reproduce exactly."""


_CLASSES = {
    "alpha": str.isalpha, "digit": str.isdigit, "alnum": str.isalnum, "upper": str.isupper,
    "lower": str.islower, "space": str.isspace, "blank": lambda c: c in " \t",
    "punct": lambda c: c.isprintable() and not c.isalnum() and not c.isspace(),
    "print": lambda c: c.isprintable(), "graph": lambda c: c.isprintable() and not c.isspace(),
    "cntrl": lambda c: not c.isprintable(), "xdigit": lambda c: c in "0123456789abcdefABCDEF",
    "word": lambda c: c.isalnum() or c == "_",
}


def has_magic(pattern: str) -> bool:
    """True when the pattern holds an unescaped *, ? or [."""
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if c in "*?[":
            return True
        i += 1
    return False


def _unescape(pattern: str) -> str:
    out, i = [], 0
    while i < len(pattern):
        if pattern[i] == "\\" and i + 1 < len(pattern):
            out.append(pattern[i + 1])
            i += 2
            continue
        out.append(pattern[i])
        i += 1
    return "".join(out)


def _bracket(p: str, i: int) -> tuple[object, int] | None:
    """Parse a bracket expression starting after '['; (matcher, index after ']') or None if unclosed."""
    n = len(p)
    negate = False
    if i < n and p[i] in "!^":
        negate = True
        i += 1
    items: list[object] = []
    first = True
    while i < n:
        c = p[i]
        if c == "]" and not first:
            def m(ch: str, items: list[object] = items, negate: bool = negate) -> bool:
                hit = any(it(ch) if callable(it) else (it[0] <= ch <= it[1]) for it in items)  # type: ignore[index]
                return hit != negate
            return m, i + 1
        first = False
        if c == "[" and i + 1 < n and p[i + 1] in ":=.":
            kind = p[i + 1]
            end = p.find(kind + "]", i + 2)
            if end < 0:
                items.append(("[", "["))
                i += 1
                continue
            name = p[i + 2 : end]
            if kind != ":":
                raise Unsupported(f"the bracket expression [{kind}{name}{kind}] depends on the locale")
            if name not in _CLASSES:
                raise Unsupported(f"unknown character class [:{name}:]")
            items.append(_CLASSES[name])
            i = end + 2
            continue
        if c == "\\" and i + 1 < n:
            c = p[i + 1]
            i += 1
        lo = c
        i += 1
        if i + 1 < n and p[i] == "-" and p[i + 1] != "]":
            hi = p[i + 1]
            if hi == "\\" and i + 2 < n:
                hi = p[i + 2]
                i += 1
            i += 2
            items.append((lo, hi))
        else:
            items.append((lo, lo))
    return None


def _compile(p: str) -> list[object]:
    """A pattern component as a list of tokens: literal str, '*' / '?' markers, or bracket matchers."""
    toks: list[object] = []
    i, n = 0, len(p)
    while i < n:
        c = p[i]
        if c == "\\" and i + 1 < n:
            toks.append(p[i + 1])
            i += 2
        elif c == "*":
            if not toks or toks[-1] is not _STAR:
                toks.append(_STAR)
            i += 1
        elif c == "?":
            toks.append(_ANY)
            i += 1
        elif c == "[":
            got = _bracket(p, i + 1)
            if got is None:
                toks.append("[")
                i += 1
            else:
                toks.append(got[0])
                i = got[1]
        else:
            toks.append(c)
            i += 1
    return toks


_STAR = object()
_ANY = object()


def _match(toks: list[object], s: str) -> bool:
    # iterative wildcard matching with backtracking on the last star
    ti = si = 0
    star_t = star_s = -1
    while si < len(s):
        if ti < len(toks):
            t = toks[ti]
            if t is _STAR:
                star_t, star_s = ti, si
                ti += 1
                continue
            if t is _ANY or (callable(t) and t(s[si])) or (isinstance(t, str) and t == s[si]):
                ti += 1
                si += 1
                continue
        if star_t >= 0:
            star_s += 1
            si = star_s
            ti = star_t + 1
            continue
        return False
    while ti < len(toks) and toks[ti] is _STAR:
        ti += 1
    return ti == len(toks)


def match(component: str, name: str) -> bool:
    """Does one pattern component (escapes kept) match one file name?"""
    return _match(_compile(component), name)


def _join(base: str, name: str) -> str:
    return base + name if (base == "" or base.endswith("/")) else base + "/" + name


def _literal_step(part: str, bases: list[str], cwd: str, last: bool) -> list[str]:
    """The bases extended by a component without magic: kept where the path exists (a directory unless last)."""
    lit = _unescape(part)
    nxt: list[str] = []
    for b in bases:
        cand = _join(b, lit)
        if os.path.lexists(os.path.join(cwd, cand)) if last else os.path.isdir(os.path.join(cwd, cand)):
            nxt.append(cand)
    return nxt


def _magic_step(part: str, bases: list[str], cwd: str, last: bool, pattern: str, seen: int) -> tuple[list[str], int]:
    """The bases extended by each matching entry of theirs, and the running count of entries looked at."""
    if _unescape(part[:1]) == "." or part.startswith("\\."):
        raise Unsupported(f"the pattern component {part!r} starts with '.'")
    toks = _compile(part)
    nxt: list[str] = []
    for b in bases:
        d = os.path.join(cwd, b) if b else cwd
        try:
            names = sorted(e.name for e in os.scandir(d))
        except OSError:
            continue
        seen += len(names)
        if seen > LIMIT:
            raise Unsupported(f"the pattern {pattern!r} looks at more than {LIMIT} directory entries")
        for name in names:
            if name.startswith(".") or not _match(toks, name):
                continue
            cand = _join(b, name)
            if last or os.path.isdir(os.path.join(cwd, cand)):
                nxt.append(cand)
    return nxt, seen


def expand(pattern: str, cwd: str) -> list[str]:
    """The words bash makes of an unquoted pattern (see the module docstring)."""
    absolute = pattern.startswith("/")
    parts = pattern.split("/")
    # A '/' inside a bracket ends the bracket for bash; splitting first gives the same result.
    bases: list[str] = ["/" if absolute else ""]
    seen = 0
    for k, part in enumerate(parts):
        last = k == len(parts) - 1
        if part == "":
            if last and k > 0:  # a trailing '/': every match is a directory, written with its slash
                bases = [b if b.endswith("/") else b + "/" for b in bases]
            continue
        if not has_magic(part):
            bases = _literal_step(part, bases, cwd, last)
        else:
            bases, seen = _magic_step(part, bases, cwd, last, pattern, seen)
        if not bases:
            break
    out = sorted(b for b in bases if b not in ("", "/"))
    return out or [_unescape(pattern)]
