"""Drive the real `attune` CLI with bad inputs, fast (not a test module).

`run_case(argv)` runs `attune.app.cli.main(argv)` in a forked child of a process that has already
imported every command, so a case costs milliseconds instead of a fresh interpreter; the child's
stdout and stderr go to files, an exception that escapes `main` is printed as the traceback a user
would see, and a child still running after the timeout is killed and reported as a hang.

`bad_inputs(dir)` writes the corpus of bad files: non-regular files, oversized and deep inputs,
alias bombs, bad encodings, non-finite numbers and random bytes.
"""

from __future__ import annotations

import gzip
import os
import random
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from attune.app import cli

PARSER_READY = cli.build_parser()  # imports every command module before the first fork


@dataclass
class Outcome:
    argv: list[str]
    rc: int | None  # None: killed after the timeout (a hang)
    stdout: str
    stderr: str

    @property
    def hung(self) -> bool:
        return self.rc is None

    @property
    def traceback(self) -> bool:
        return "Traceback (most recent call last)" in self.stderr

    def describe(self) -> str:
        tail = self.stderr.strip().splitlines()[-3:]
        return f"attune {' '.join(self.argv)} -> rc={self.rc} stderr={tail}"


def run_case(argv: Sequence[str], timeout_s: float = 20.0, env: dict[str, str] | None = None) -> Outcome:
    with tempfile.TemporaryDirectory() as tmp:
        out, err = Path(tmp) / "out", Path(tmp) / "err"
        pid = os.fork()
        if pid == 0:  # the child: run the command and exit with its status
            code = 70
            try:
                os.setpgid(0, 0)
                if env:
                    os.environ.update(env)
                fd_in = os.open(os.devnull, os.O_RDONLY)
                fd_out = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                fd_err = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                os.dup2(fd_in, 0)
                os.dup2(fd_out, 1)
                os.dup2(fd_err, 2)
                sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 - pytest may have replaced them
                sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
                sys.stdin = open(0, closefd=False)  # noqa: SIM115
                try:
                    code = int(cli.main(list(argv)) or 0)
                except SystemExit as exc:
                    code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
                except BaseException:
                    traceback.print_exc()
                    code = 70
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
        deadline = time.monotonic() + timeout_s
        rc: int | None = None
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                rc = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() > deadline:
                os.killpg(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                break
            time.sleep(0.005)
        return Outcome(list(argv), rc, out.read_text(errors="replace"), err.read_text(errors="replace"))


def _alias_bomb() -> bytes:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 10):
        prev = f"*a{i - 1}"
        lines.append(f"a{i}: &a{i} [{', '.join([prev] * 9)}]")
    return ("\n".join(lines) + "\n").encode()


def _block_nest(n: int) -> bytes:
    return "".join(f"{'  ' * i}k:\n" for i in range(n)).encode() + b"  " * n + b"1\n"


def _random_bytes(seed: int, n: int) -> bytes:
    rnd = random.Random(seed)
    return bytes(rnd.getrandbits(8) for _ in range(n))


# name -> bytes to write, or a callable that makes the path itself
Maker = Callable[[Path], None]
BAD_CONTENT: dict[str, bytes] = {
    "empty": b"",
    "nul bytes": b"\x00" * 64,
    "not utf-8": b"name: \xff\xfe caf\xe9\n",
    "utf-16": "name: x\n".encode("utf-16"),
    "deep json 100000": b"[" * 100_000 + b"]" * 100_000,
    "deep json 300": b'{"a":' * 300 + b"1" + b"}" * 300,
    "deep yaml flow": b"[" * 100_000,
    "deep yaml block": _block_nest(3000),
    "alias bomb": _alias_bomb(),
    "recursive alias": b"a: &a [*a]\n",
    "json 1e999": b'{"args": {"--lr": 1e999}, "1": 1e999}',
    "json NaN": b'{"args": {"--lr": NaN}, "1": NaN}',
    "lone surrogate": b'{"args": {"--x\\ud800": "\\udc00"}, "1": "\\ud800"}',
    "python tag": b"!!python/object/apply:os.system ['echo pwned']\n",
    "long line": b"x" * (8 * 2**20),
    "list": b"[]\n",
    "string": b'"x"\n',
    "number": b"123\n",
    "null": b"null\n",
    "duplicate keys": b"a: 1\na: 2\n",
    "tab indent": b"a:\n\t- 1\n",
    "ELF header": b"\x7fELF\x02\x01\x01" + b"\x00" * 57,
    "gzip garbage": gzip.compress(b"\x00" * 2**20),
    "truncated gzip": gzip.compress(b'{"traceEvents": [' + b'{"ph": "X"},' * 1000)[:200],
    "random 1": _random_bytes(1, 4096),
    "random 2": _random_bytes(2, 300),
    "ledger garbage": b'{"seq": 0}\nnot json\n',
    "CRLF": b"a: 1\r\nb: [1,\r\n",
}


def _fifo(p: Path) -> None:
    os.mkfifo(p)


def _directory(p: Path) -> None:
    p.mkdir()


def _dev_zero(p: Path) -> None:
    p.symlink_to("/dev/zero")


def _dev_null(p: Path) -> None:
    p.symlink_to("/dev/null")


def _broken_link(p: Path) -> None:
    p.symlink_to(p.parent / "no-such-target")


def _link_loop(p: Path) -> None:
    p.symlink_to(p)


def _sparse_huge(p: Path) -> None:
    with open(p, "wb") as fh:
        fh.truncate(3 * 2**30)


SPECIAL: dict[str, Maker] = {
    "FIFO": _fifo,
    "directory": _directory,
    "/dev/zero": _dev_zero,
    "/dev/null": _dev_null,
    "broken symlink": _broken_link,
    "symlink loop": _link_loop,
    "sparse 3 GiB": _sparse_huge,
}


def make_bad(path: Path, name: str) -> None:
    """Create the bad input `name` at `path` (which must not exist)."""
    if name in SPECIAL:
        SPECIAL[name](path)
    else:
        path.write_bytes(BAD_CONTENT[name])


ALL_BAD = sorted(BAD_CONTENT) + sorted(SPECIAL)
