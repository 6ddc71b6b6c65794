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

from attune import __version__
from attune.app import commands
from attune.core.errors import EXIT_OK, EXIT_USAGE, UsageError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except UsageError as exc:
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
