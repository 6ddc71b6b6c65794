"""`attune report DIR`: write report.md and report.html for a campaign."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attune.app.commands._ledger_input import check_ledger_file
from attune.core.errors import EXIT_FAILED, EXIT_OK
from attune.core.ledger import LEDGER_NAME, LedgerError
from attune.core.output import add_json_flag, emit_json
from attune.core.state import load


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="write the campaign report (Markdown and self-contained HTML)")
    p.add_argument("dir", help="campaign directory")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from attune.app import report

    d = Path(args.dir)
    check_ledger_file(d)  # InputError: exit 2
    try:
        state, _ = load(d)
        if state.name is None:
            raise LedgerError(f"{d / LEDGER_NAME} has no campaign_started row first: not a campaign's ledger")
        md, page, r = report.write(d)
    except LedgerError as exc:
        print(f"attune report: ledger does not verify ({exc.kind}): {exc}", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        emit_json({"markdown": str(md), "html": str(page), **r.as_dict()})
    else:
        for k, v in report.headline_lines(r):
            print(f"{k:>24}: {v}")
        print(f"report: {page}")
    return EXIT_OK
