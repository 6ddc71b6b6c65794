"""Cyclomatic complexity at most 25 in every function of the product, measured the way issue 14 does.

Ruff's mccabe check (C901 in pyproject) counts branches only; radon also counts boolean operators and
comprehensions, so a function can pass ruff and still read as a maze. This test measures with radon's
``cc_visit`` over the product's packages (not tests/, not examples/) and fails listing every function,
method and nested function above the limit with its score.

A function may stay above the limit only when its ``def`` line says ``# noqa: C901`` followed by a reason
(a deliberately flat hot loop, for example traces/rank's per-event loop).
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterator
from pathlib import Path

from radon.complexity import cc_visit
from radon.visitors import Class, Function

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("attune", "broker", "gate", "hooks", "mcp_servers")
LIMIT = 25


# a C901 waiver followed by a reason (a dash, colon or parenthesis, then at least one word)
_WAIVER = re.compile(r"#\s*noqa:\s*C901\b\s*[-:(—]+\s*\w+")


def _walk(blocks: list) -> Iterator[Function]:
    for block in blocks:
        if isinstance(block, Class):
            yield from _walk(block.methods)
            yield from _walk(block.inner_classes)
        elif isinstance(block, Function):
            yield block
            yield from _walk(block.closures)


def _functions(blocks: list) -> Iterator[Function]:
    """Every function radon found, methods and nested functions included, each once (cc_visit lists a
    class's methods both inside the class and beside it)."""
    seen: set[tuple[int, int]] = set()
    for fn in _walk(blocks):
        if (fn.lineno, fn.col_offset) not in seen:
            seen.add((fn.lineno, fn.col_offset))
            yield fn


def _def_line(lines: list[str], fn: Function) -> str:
    """The source of the `def` statement up to its closing colon (a signature may span several lines)."""
    start = fn.lineno - 1
    for end in range(start, min(len(lines), fn.endline or len(lines))):
        if lines[end].rstrip().split("#", 1)[0].rstrip().endswith(":"):
            return "\n".join(lines[start : end + 1])
    return lines[start]


def offenders(source: str, limit: int = LIMIT) -> list[tuple[str, int, int]]:
    """(name, line, score) of each function in `source` above `limit` without a reasoned waiver."""
    lines = source.splitlines()
    found = []
    for fn in _functions(cc_visit(source)):
        if fn.complexity <= limit or _WAIVER.search(_def_line(lines, fn)):
            continue
        found.append((fn.fullname, fn.lineno, fn.complexity))
    return found


def _product_files() -> Iterator[Path]:
    for package in PACKAGES:
        yield from sorted((ROOT / package).rglob("*.py"))


def test_no_function_above_the_limit() -> None:
    report = []
    for path in _product_files():
        rel = path.relative_to(ROOT).as_posix()
        for name, line, score in offenders(path.read_text(encoding="utf-8")):
            report.append(f"{rel}:{line} {name} {score}")
    assert not report, f"cyclomatic complexity above {LIMIT} (radon):\n" + "\n".join(report)


def _made_up(conditions: int, def_comment: str = "") -> str:
    """A nested function whose radon score is 3 + conditions: 1, the `if` and its `conditions - 1`
    boolean operators, the comprehension and its `if`."""
    test = " and ".join(f"x{i}" for i in range(conditions))
    params = ", ".join(f"x{i}" for i in range(conditions))
    return textwrap.dedent(f"""
        class Box:
            def outer(self):
                def maze({params}):{def_comment}
                    if {test}:
                        return 1
                    return [y for y in range(3) if y]
                return maze
        """)


def test_checker_catches_a_complex_function() -> None:
    # mccabe would count the `if` once; radon counts every boolean operator
    assert offenders(_made_up(30)) == [("maze", 4, 33)]
    assert offenders(_made_up(22)) == []  # 25 is allowed
    assert offenders(_made_up(23)) == [("maze", 4, 26)]


def test_waiver_needs_a_reason() -> None:
    assert offenders(_made_up(30, "  # noqa: C901 - flat on purpose, hot loop")) == []
    assert offenders(_made_up(30, "  # noqa: C901")) == [("maze", 4, 33)]
