"""Bounded reads and searches of text files: what the broker lets the agent see of logs and sources.

Every answer is small (a page of lines, a capped number of matches) and says how to get the next
page. Paths are resolved against a root and refused if they leave it, symbolic links included.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
from collections import deque
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import re2

from attune.core.containment import inside
from attune.core.errors import BrokerError

MAX_LINES = 500  # lines per page
MAX_BYTES = 64 * 1024  # bytes per page
MAX_LINE_CHARS = 2000  # longer lines are cut (and say so)
MAX_MATCHES = 200
MAX_PATTERN_CHARS = 256
MAX_SEARCH_FILE_BYTES = 4 * 2**20  # larger files are skipped by searches
MAX_FILES_SCANNED = 20_000
MAX_LIST_ENTRIES = 500
SKIP_DIRS = frozenset({".git", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache", "node_modules"})


class FileAccessError(BrokerError):
    """A request outside what may be read. `code`: not_found | out_of_scope | bad_request | too_large."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Root:
    """A directory the agent may read, and the name it goes by."""

    name: str
    path: Path


def resolve_inside(root: Path, rel: str) -> Path:
    """`rel` resolved under `root`; refuses absolute paths, `..` and links that lead outside."""
    if "\x00" in rel:
        raise FileAccessError("bad_request", "path contains a NUL byte")
    pure = PurePosixPath(rel.lstrip("/"))
    if any(part == ".." for part in pure.parts):
        raise FileAccessError("out_of_scope", f"path {rel!r} leaves its root ('..' is not allowed)")
    base = root.resolve()
    target = (base / pure).resolve()
    if not inside(target, base):
        raise FileAccessError("out_of_scope", f"path {rel!r} leads outside its root (through a link)")
    return target


def _is_binary(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            return b"\x00" in fh.read(8192)
    except OSError:
        return True


def _cut(line: str) -> str:
    return line if len(line) <= MAX_LINE_CHARS else line[:MAX_LINE_CHARS] + " [line cut]"


def read_lines(path: Path, offset_line: int = 1, max_lines: int = 200, *, shown_as: str) -> dict[str, Any]:
    """A page of a text file: lines offset_line.. (1-based), within MAX_LINES and MAX_BYTES."""
    if offset_line < 1:
        raise FileAccessError("bad_request", f"offset_line must be >= 1, got {offset_line}")
    max_lines = max(1, min(int(max_lines), MAX_LINES))
    if not path.exists():
        raise FileAccessError("not_found", f"no file {shown_as}")
    if path.is_dir():
        raise FileAccessError("bad_request", f"{shown_as} is a directory (list it instead)")
    if _is_binary(path):
        raise FileAccessError("bad_request", f"{shown_as} is a binary file")
    lines: list[str] = []
    used = 0
    next_line: int | None = None
    n = 0
    with open(path, encoding="utf-8", errors="replace") as fh:
        for n, raw in enumerate(fh, start=1):
            if n < offset_line:
                continue
            text = _cut(raw.rstrip("\n"))
            if len(lines) >= max_lines or used + len(text) + 1 > MAX_BYTES:
                next_line = n
                break
            lines.append(text)
            used += len(text) + 1
    return {
        "path": shown_as,
        "size_bytes": path.stat().st_size,
        "offset_line": offset_line,
        "lines": lines,
        "next_line": next_line,  # None: the page reaches the end of the file
        "eof": next_line is None,
    }


def tail_lines(path: Path, n: int = 50, *, shown_as: str) -> dict[str, Any]:
    """The last n lines of a text file (within MAX_LINES and MAX_BYTES), without reading it all."""
    n = max(1, min(int(n), MAX_LINES))
    if not path.exists():
        raise FileAccessError("not_found", f"no file {shown_as}")
    size = path.stat().st_size
    with open(path, "rb") as fh:
        start = max(0, size - MAX_BYTES)
        fh.seek(start)
        data = fh.read(size - start)
    text = data.decode("utf-8", errors="replace")
    parts = text.split("\n")
    if text.endswith("\n"):
        parts = parts[:-1]
    if start > 0 and parts:
        parts = parts[1:]  # the first line is probably partial
    kept = deque((_cut(p) for p in parts), maxlen=n)
    return {"path": shown_as, "size_bytes": size, "lines": list(kept), "truncated": start > 0 or len(parts) > n}


def compile_pattern(pattern: str, *, regex: bool = True, ignore_case: bool = False) -> Any:
    """A compiled search pattern. Regular expressions run on RE2, whose matching time is linear in
    the text (no backtracking: a pattern like `(\\.+)+X` cannot stall the broker); RE2 has no
    backreferences and no lookaround, and such patterns are refused."""
    if not pattern:
        raise FileAccessError("bad_request", "pattern must not be empty")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise FileAccessError("bad_request", f"pattern is longer than {MAX_PATTERN_CHARS} characters")
    try:
        pattern.encode("utf-8")
    except UnicodeEncodeError:
        raise FileAccessError("bad_request", "pattern is not text (a lone surrogate)") from None
    opts = re2.Options()
    opts.log_errors = False
    opts.case_sensitive = not ignore_case
    opts.literal = not regex
    opts.max_mem = 8 << 20
    try:
        return re2.compile(pattern, opts)
    except re2.error as exc:
        why = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise FileAccessError("bad_request", (
            f"pattern is not a valid regular expression for the linear-time engine (RE2: no backreferences, "
            f"no lookaround): {why}")) from None


def search_file(path: Path, rx: Any, max_results: int, *, shown_as: str,
                start_line: int = 1) -> tuple[list[dict[str, Any]], int | None]:
    """Matches in one file: ([{path, line, text}], the line to resume from when capped)."""
    out: list[dict[str, Any]] = []
    with open(path, encoding="utf-8", errors="replace") as fh:
        for n, raw in enumerate(fh, start=1):
            if n < start_line:
                continue
            line = raw.rstrip("\n")
            if rx.search(line[: MAX_LINE_CHARS * 4]):
                if len(out) >= max_results:
                    return out, n
                out.append({"path": shown_as, "line": n, "text": _cut(line)})
    return out, None


class FileTree:
    """Named roots read through bounded, confined operations (the training image's window, a run dir)."""

    def __init__(self, roots: list[Root]) -> None:
        if not roots:
            raise ValueError("a file tree needs at least one root")
        self.roots = {r.name: r for r in roots}
        self.single = roots[0] if len(roots) == 1 else None

    def describe(self) -> list[dict[str, str]]:
        return [{"name": r.name, "path": str(r.path)} for r in self.roots.values()]

    def locate(self, path: str) -> tuple[Root, Path, str]:
        """A virtual path (`root/rel`, or just `rel` with one root) -> (root, real path, shown path)."""
        p = (path or "").strip().lstrip("/")
        if self.single is not None:
            root, rel = self.single, p
            if p == root.name or p.startswith(root.name + "/"):
                rel = p[len(root.name):].lstrip("/")
            shown = f"{root.name}/{rel}".rstrip("/")
        else:
            head, _, rel = p.partition("/")
            if head not in self.roots:
                raise FileAccessError(
                    "not_found", f"path must start with one of the roots {sorted(self.roots)}, got {path!r}"
                )
            root = self.roots[head]
            shown = f"{head}/{rel}".rstrip("/")
        return root, resolve_inside(root.path, rel), shown

    def list(self, path: str = "", offset: int = 0, limit: int = 200) -> dict[str, Any]:
        limit = max(1, min(limit, MAX_LIST_ENTRIES))
        if self.single is None and (path or "").strip("/") == "":
            entries = [{"name": n, "type": "dir"} for n in sorted(self.roots)]
            return {"path": "", "entries": entries, "total": len(entries), "next_offset": None}
        _, real, shown = self.locate(path)
        if not real.exists():
            raise FileAccessError("not_found", f"no directory {shown}")
        if not real.is_dir():
            raise FileAccessError("bad_request", f"{shown} is a file (read it instead)")
        names = sorted(e for e in os.listdir(real) if e not in SKIP_DIRS)
        page = names[offset: offset + limit]
        entries = []
        for name in page:
            full = real / name
            kind = "dir" if full.is_dir() else "file"
            entry: dict[str, Any] = {"name": name, "type": kind}
            if kind == "file":
                with contextlib.suppress(OSError):
                    entry["size_bytes"] = full.stat().st_size
            entries.append(entry)
        nxt = offset + limit if offset + limit < len(names) else None
        return {"path": shown, "entries": entries, "total": len(names), "next_offset": nxt}

    def read(self, path: str, offset_line: int = 1, max_lines: int = 200) -> dict[str, Any]:
        _, real, shown = self.locate(path)
        return read_lines(real, offset_line, max_lines, shown_as=shown)

    def search(self, pattern: str, path: str = "", glob: str | None = None, max_results: int = 50,
               regex: bool = True, ignore_case: bool = False) -> dict[str, Any]:
        rx = compile_pattern(pattern, regex=regex, ignore_case=ignore_case)
        max_results = max(1, min(int(max_results), MAX_MATCHES))
        targets: list[tuple[Root, Path, str]]
        if self.single is None and (path or "").strip("/") == "":
            targets = [(r, r.path.resolve(), r.name) for r in self.roots.values()]
        else:
            targets = [self.locate(path)]
        matches: list[dict[str, Any]] = []
        scanned = 0
        truncated = False
        for root, real, shown in targets:
            if not real.exists():
                raise FileAccessError("not_found", f"no file or directory {shown}")
            for file_path, file_shown in self._walk(root, real, shown):
                if glob and not fnmatch.fnmatch(file_path.name, glob) and not fnmatch.fnmatch(file_shown, glob):
                    continue
                scanned += 1
                if scanned > MAX_FILES_SCANNED:
                    truncated = True
                    break
                try:
                    if file_path.stat().st_size > MAX_SEARCH_FILE_BYTES or _is_binary(file_path):
                        continue
                    found, resume = search_file(file_path, rx, max_results - len(matches), shown_as=file_shown)
                except OSError:
                    continue
                matches.extend(found)
                if resume is not None or len(matches) >= max_results:
                    truncated = True
                    break
            if truncated:
                break
        return {"pattern": pattern, "path": path, "matches": matches, "files_scanned": min(scanned, MAX_FILES_SCANNED),
                "truncated": truncated}

    def _walk(self, root: Root, real: Path, shown: str):  # type: ignore[no-untyped-def]
        if real.is_file():
            yield real, shown
            return
        base = root.path.resolve()
        for dirpath, dirnames, filenames in os.walk(real):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
            for name in sorted(filenames):
                full = Path(dirpath) / name
                if full.is_symlink():
                    try:
                        resolved = full.resolve()
                    except OSError:
                        continue
                    if resolved == base or not inside(resolved, base):
                        continue
                rel = full.relative_to(base).as_posix()
                yield full, f"{root.name}/{rel}"
