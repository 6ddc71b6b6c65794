"""The part of `os` and `os.path` the PreToolUse hook uses, on the `posix` module alone.

Importing `os` builds `os.environ` and pulls in `_collections_abc`: about a tenth of a bare
`python3 -I -S -c pass`, paid on every tool call. The hook needs a handful of calls, so it uses
these (same names, same meaning as `os` and `os.path`; POSIX only). When `os` is already imported
(the hook's code used in-process, as the tests do), `environ` is the real `os.environ`.

`path.realpath` follows the same rules as `os.path.realpath` (non-strict): components are resolved
from the left, `..` after a symbolic link goes up from the link's target, a missing component is
kept as written, and a symlink loop stops resolution (the rest is joined unresolved).
tests/test_globbing.py compares it with `os.path.realpath` on symlink chains, loops and `..`.

Kept by measurement (issue 22: a hand-written stdlib replacement stays only where the benchmark shows it
matters): PreToolUse on `import os` instead costs 2.0 ms more CPU per tool call, 17.9 ms against 15.9 ms
(1.92x against 1.71x a bare `python3 -I -S -c pass`), measured on this machine with the Bash-allow case of
`benchmarks/bench_plugin.py --hooks-only`, 60 interleaved runs each.
"""

from __future__ import annotations

import posix
import sys

__all__ = ["O_APPEND", "O_CREAT", "O_WRONLY", "X_OK", "access", "close", "environ", "getcwd", "open", "path",
           "realpath_below", "scandir", "sep", "write"]

sep = "/"
O_APPEND, O_CREAT, O_WRONLY = posix.O_APPEND, posix.O_CREAT, posix.O_WRONLY
X_OK = posix.X_OK
access, close, getcwd, open, scandir, write = posix.access, posix.close, posix.getcwd, posix.open, posix.scandir, \
    posix.write

if "os" in sys.modules:
    environ = sys.modules["os"].environ
else:
    environ = {k.decode("utf-8", "surrogateescape"): v.decode("utf-8", "surrogateescape")
               for k, v in posix.environ.items()}

_IFMT, _IFLNK, _IFREG, _IFDIR = 0o170000, 0o120000, 0o100000, 0o040000


class path:  # noqa: N801 - stands in for the os.path module
    sep = "/"

    @staticmethod
    def isabs(p: str) -> bool:
        return p.startswith("/")

    @staticmethod
    def join(a: str, *parts: str) -> str:
        out = a
        for p in parts:
            if p.startswith("/"):
                out = p
            elif not out or out.endswith("/"):
                out += p
            else:
                out += "/" + p
        return out

    @staticmethod
    def basename(p: str) -> str:
        return p[p.rfind("/") + 1 :]

    @staticmethod
    def dirname(p: str) -> str:
        head = p[: p.rfind("/") + 1]
        if head and head != "/" * len(head):
            head = head.rstrip("/")
        return head

    @staticmethod
    def _mode(p: str, follow: bool = True) -> int:
        try:
            return (posix.stat(p) if follow else posix.lstat(p)).st_mode
        except (OSError, ValueError):
            return 0

    @staticmethod
    def isfile(p: str) -> bool:
        return path._mode(p) & _IFMT == _IFREG

    @staticmethod
    def isdir(p: str) -> bool:
        return path._mode(p) & _IFMT == _IFDIR

    @staticmethod
    def lexists(p: str) -> bool:
        try:
            posix.lstat(p)
        except (OSError, ValueError):
            return False
        return True

    @staticmethod
    def getsize(p: str) -> int:
        return posix.stat(p).st_size

    @staticmethod
    def expanduser(p: str) -> str:
        if not p.startswith("~") or (len(p) > 1 and p[1] != "/"):
            return p  # ~user is left alone (no pwd lookup in the hook)
        home = environ.get("HOME")
        if not home:
            return p
        return (home.rstrip("/") or "/") + p[1:]

    @staticmethod
    def realpath(p: str) -> str:
        if not p.startswith("/"):
            p = getcwd() + "/" + p
        resolved, _ = _resolve("", p.split("/"), {}, 0)
        return resolved or "/"


def realpath_below(base: str, rel: str) -> str:
    """`path.realpath(path.join(base, rel))` for a `base` that is itself a realpath: only `rel`'s components
    are resolved (walking from the root would find `base`'s own components unchanged). The policy builds
    a dozen protected paths inside one campaign directory; resolving each from the root was most of its
    start-up."""
    if rel.startswith("/"):
        return path.realpath(rel)
    resolved, _ = _resolve("" if base == "/" else base, rel.split("/"), {}, 0)
    return resolved or "/"


def _resolve(base: str, parts: list[str], seen: dict[str, str | None], depth: int) -> tuple[str, bool]:
    """Walk `parts` from the resolved absolute `base` ('' is the root); (result, False) on a loop."""
    if depth > 64:
        return base + "/" + "/".join(parts), False
    for i, name in enumerate(parts):
        if name in ("", "."):
            continue
        if name == "..":
            base = base[: base.rfind("/")] if base else ""
            continue
        cand = base + "/" + name
        try:
            st = posix.lstat(cand)
        except (OSError, ValueError):
            base = cand
            continue
        if st.st_mode & _IFMT != _IFLNK:
            base = cand
            continue
        if cand in seen:
            known = seen[cand]
            if known is None:  # a loop: keep the rest as written
                return path.join(cand, *[x for x in parts[i + 1 :] if x]), False
            base = known
            continue
        seen[cand] = None
        target = posix.readlink(cand)
        base, ok = _resolve("" if target.startswith("/") else base, target.split("/"), seen, depth + 1)
        if not ok:
            return path.join(base, *[x for x in parts[i + 1 :] if x]), False
        seen[cand] = base
    return base, True
