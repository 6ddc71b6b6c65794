"""`attune ledger verify DIR` and `attune ledger show DIR`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attune.core import textsafe
from attune.core.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from attune.core.ledger import LEDGER_NAME, LedgerError, read, verify
from attune.core.output import add_json_flag, emit_json
from attune.readers.bounded import check_regular


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ledger", help="inspect a campaign's append-only ledger")
    lsub = p.add_subparsers(dest="ledger_command", metavar="ACTION")
    lsub.required = True
    v = lsub.add_parser("verify", help=(
        "check the hash chain, every row's MAC and the anchor kept outside the campaign directory; "
        "a torn last line is reported, not fatal"))
    v.add_argument("dir", help="campaign directory")
    add_json_flag(v)
    v.set_defaults(func=run_verify)
    s = lsub.add_parser("show", help="print the ledger's rows")
    s.add_argument("dir", help="campaign directory")
    s.add_argument("--tail", type=int, default=None, metavar="N", help="only the last N rows")
    s.add_argument("--type", default=None, help="only rows of this type")
    add_json_flag(s)
    s.set_defaults(func=run_show)


def _check_dir(d: Path, cmd: str) -> bool:
    """The ledger file is there and regular (InputError otherwise: exit 2); an empty one is verified
    (an empty file whose anchor records rows is a truncation)."""
    path = d / LEDGER_NAME
    if not path.exists() and not path.is_symlink():
        report = verify(d)  # says whether an anchored ledger was deleted
        print(f"attune ledger {cmd}: error: no {LEDGER_NAME} in {d}"
              + (f" ({report.error})" if report.problem == "truncated" else ""), file=sys.stderr)
        return False
    check_regular(path, "ledger")
    return True


def run_verify(args: argparse.Namespace) -> int:
    d = Path(args.dir)
    if not _check_dir(d, "verify"):
        return EXIT_USAGE
    report = verify(d)
    if args.json:
        emit_json(report.as_dict())
    elif report.ok:
        msg = f"{d / LEDGER_NAME}: {report.rows} rows, chain intact"
        msg += (f", every row's MAC and the anchor ({report.anchor_rows} rows) check" if report.authenticated
                else f"; NOT authenticated: {report.note or 'no key'}")
        if report.torn_tail:
            msg += f"; torn last line ({report.torn_tail_bytes} bytes) ignored"
        print(msg)
    else:
        print(f"{d / LEDGER_NAME}: does not verify ({report.problem}) after {report.rows} good rows: {report.error}",
              file=sys.stderr)
    return EXIT_OK if report.ok else EXIT_FAILED


def run_show(args: argparse.Namespace) -> int:
    d = Path(args.dir)
    if not _check_dir(d, "show"):
        return EXIT_USAGE
    if args.tail is not None and args.tail < 0:
        print("attune ledger show: error: --tail must be >= 0", file=sys.stderr)
        return EXIT_USAGE
    try:
        result = read(d)
    except LedgerError as exc:
        print(f"attune ledger show: ledger does not verify: {exc}", file=sys.stderr)
        return EXIT_FAILED
    rows = [r for r in result.rows if args.type is None or r.type == args.type]
    if args.tail is not None:
        rows = rows[-args.tail :] if args.tail else []
    if args.json:
        emit_json({"rows": [r.as_dict() for r in rows], "torn_tail": result.torn_tail is not None})
    else:
        for r in rows:
            print(textsafe.terminal(f"{r.seq:>6} {r.ts} {r.type:<20} {r.data}"))  # agent text: no escapes
    return EXIT_OK
