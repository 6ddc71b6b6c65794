"""`attune status DIR`: the campaign's state, rebuilt from its ledger."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from attune.app.commands._ledger_input import check_ledger_file
from attune.core import textsafe
from attune.core.errors import EXIT_FAILED, EXIT_OK
from attune.core.ledger import LEDGER_NAME, LedgerError
from attune.core.output import add_json_flag, emit_json
from attune.core.state import load


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("status", help="budget, calibration, leader, runs and stop state of a campaign")
    p.add_argument("dir", help="campaign directory (holds campaign.yaml and ledger.jsonl)")
    add_json_flag(p)
    p.set_defaults(func=run)


def _fmt(x: float | None, spec: str = ".4g") -> str:
    return "-" if x is None else format(x, spec)


def render(s: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    # Piped (not a terminal), lines are not cut to a guessed 80 columns.
    con = Console(highlight=False) if sys.stdout.isatty() else Console(width=10_000, soft_wrap=True, highlight=False)
    _print = con.print

    def clean_print(*objs: Any, **kw: Any) -> None:  # agent-written text reaches a terminal: no escapes
        _print(*(textsafe.terminal(o) if isinstance(o, str) else o for o in objs), **kw)

    con.print = clean_print  # type: ignore[method-assign]
    b, c, lead = s["budget"], s["calibration"], s["leader"]
    con.print(f"[bold]campaign[/] {s['name']}  gpus={s['gpus']}  rows={s['rows']}")
    if (s.get("noise") or {}).get("noisy"):
        con.print(f"[bold yellow]noise:[/] {s['noise']['message']}")
    con.print(
        f"budget: total {_fmt(b['total_gpu_hours'])} GPU-h, charged {_fmt(b['charged_gpu_hours'])}, "
        f"in flight {_fmt(b['in_flight_gpu_hours'])}, reserve left {_fmt(b['reserve_left_gpu_hours'])}, "
        f"search remaining {_fmt(b['search_remaining_gpu_hours'])}"
        + (f"; calibration and search overran into the check reserve by {_fmt(b['reserve_overrun_gpu_hours'])} GPU-h"
           if b.get("reserve_overrun_gpu_hours") else "")
    )
    con.print(
        f"calibration: {c['runs']}/{c['required_runs']} runs, mean {_fmt(c['mean'])} tok/s/GPU, "
        f"sigma {_fmt(c['rel_sigma'], '.2%') if c['rel_sigma'] is not None else '-'}, "
        f"band {_fmt(c['band'], '.2%') if c['band'] is not None else '-'}"
    )
    gain = lead["gain"]
    con.print(
        f"leader: {lead['run_id'] or '-'} at {_fmt(lead['tokens_per_s_per_gpu'])} tok/s/GPU"
        + (f" ({gain:+.2%} over baseline)" if gain is not None else "")
    )
    if s["runs"]:
        t = Table("run", "kind", "lever", "status", "outcome", "tok/s/GPU", "GPU-h", "verdict")
        # A run id is what a user types next (attune report, run_status): never truncated or wrapped. When the
        # table cannot fit, the other columns wrap instead; piped, rows are as wide as they need to be.
        t.columns[0].no_wrap = True
        t.columns[0].overflow = "ignore"
        t.columns[0].min_width = max(len(r["run_id"]) for r in s["runs"])
        for r in s["runs"]:
            t.add_row(
                r["run_id"], r["kind"], r["lever"] or "", r["status"], r["outcome"] or "",
                _fmt(r["tokens_per_s_per_gpu"]), _fmt(r["charge_gpu_hours"]), r["verdict"] or "",
            )
        con.print(t)
    if s["stop"]:
        con.print(f"stop recorded: {s['stop'].get('diagnosis')}")
    if s["shipped"]:
        con.print(f"shipped: {s['shipped'].get('run_id')}")
    if s.get("failed"):
        con.print(f"[bold red]FAILED:[/] {s['failed'].get('reason')}")
    if s.get("session_end") and not s["shipped"] and not s.get("failed"):
        from rich.markup import escape

        con.print(f"[bold red]the last agent session ended unfinished:[/] {escape(str(s['session_end'].get('reason')))}",
                  highlight=False)
    for m in s["missing_for_stop"]:
        con.print(f"[yellow]open:[/] {m}")


def run(args: argparse.Namespace) -> int:
    d = Path(args.dir)
    check_ledger_file(d)  # InputError: exit 2
    try:
        state, result = load(d)
        if state.name is None:
            raise LedgerError(f"{d / LEDGER_NAME} holds {state.last_seq + 1} row(s) but no campaign_started row "
                              "first: not a campaign's ledger", "corrupt")
    except LedgerError as exc:
        if args.json:
            emit_json({"ok": False, "error": str(exc), "problem": exc.kind})
        else:
            print(f"attune status: ledger does not verify ({exc.kind}): {exc}", file=sys.stderr)
        return EXIT_FAILED
    from attune.core import session_end

    payload = {"ok": True, "torn_tail": result.torn_tail is not None, "authenticated": result.authenticated,
               **state.as_dict(), "session_end": session_end.read(str(d))}
    if args.json:
        emit_json(payload)
    else:
        render(payload)
        if result.torn_tail is not None:
            print(f"warning: torn last line ignored ({len(result.torn_tail)} bytes)", file=sys.stderr)
        if not result.authenticated:
            print(f"warning: the ledger's rows were not authenticated: {result.note}", file=sys.stderr)
    return EXIT_OK
