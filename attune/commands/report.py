"""`attune report DIR`: write report.md and report.html for a campaign."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attune.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from attune.ledger import LEDGER_NAME, LedgerError
from attune.output import add_json_flag, emit_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="write the campaign report (Markdown and self-contained HTML)")
    p.add_argument("dir", help="campaign directory")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from attune import report

    d = Path(args.dir)
    if not (d / LEDGER_NAME).is_file():
        print(f"attune report: error: no {LEDGER_NAME} in {d}", file=sys.stderr)
        return EXIT_USAGE
    try:
        md, page, r = report.write(d)
    except LedgerError as exc:
        print(f"attune report: ledger does not verify: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        emit_json({"markdown": str(md), "html": str(page), **r.as_dict()})
    else:
        for k, v in report.headline_lines(r):
            print(f"{k:>24}: {v}")
        print(f"report: {page}")
    return EXIT_OK
