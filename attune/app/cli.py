"""The `attune` command line.

Each subcommand lives in its own module under `attune.app.commands` and exposes
`register(subparsers)`; the parser is assembled by discovering those modules, so a
new command never needs an edit here.

Exit codes, for every command: 0 success, 1 the checked thing failed (a gate
rejected, a bar not met, a ledger that does not verify), 2 bad input or usage.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence
from typing import NoReturn

from attune import __version__
from attune.app import commands
from attune.core.errors import EXIT_OK, EXIT_USAGE, UsageError


def _usage_json(command: str | None, message: str) -> None:
    """A usage error under --json: one JSON document on stdout (the stable shape), as well as the line on stderr."""
    from attune.core.output import emit_json

    emit_json({"ok": False, "error": "usage", "command": command, "reason": message, "exit_code": EXIT_USAGE})


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error on a command line that asks for --json also comes as JSON (exit 2)."""

    def error(self, message: str) -> NoReturn:
        if _JSON_ASKED:
            _usage_json(self.prog.split(" ", 1)[1] if " " in self.prog else None, message)
            self.print_usage(sys.stderr)
            print(f"{self.prog}: error: {message}", file=sys.stderr)
            raise SystemExit(EXIT_USAGE)
        super().error(message)


_JSON_ASKED = False


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="attune",
        description="Tune an LLM training recipe for throughput without changing what it learns.",
    )
    parser.add_argument("--version", action="version", version=f"attune {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    global _JSON_ASKED
    raw = list(sys.argv[1:] if argv is None else argv)
    _JSON_ASKED = "--json" in raw
    parser = build_parser()
    args = parser.parse_args(raw)
    try:
        return int(args.func(args))
    except UsageError as exc:
        if getattr(args, "json", False):
            _usage_json(args.command, str(exc))
        print(f"attune {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except RecursionError:  # a reader missed attune.readers.bounded's depth limit: still one line, not a traceback
        print(f"attune {args.command}: error: an input is nested too deeply", file=sys.stderr)
        return EXIT_USAGE
    except MemoryError:
        print(f"attune {args.command}: error: an input is too large to hold in memory", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (`| head`): not an error of ours
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
