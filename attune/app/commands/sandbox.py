"""`attune sandbox DIR`: the Claude Code settings that put a campaign session in the OS sandbox.

`attune tune --tuner claude` passes them itself; for an interactive session run
`claude --settings "$(attune sandbox .)"` in the campaign directory. `--check` says whether the
sandbox can run on this machine (exit 0 yes, 1 no, with the reason).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from attune.core.campaign_paths import CAMPAIGN_FILE
from attune.core.errors import EXIT_FAILED, EXIT_OK, UsageError
from attune.core.output import add_json_flag, emit_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sandbox", help="print the Claude Code sandbox settings of a campaign session")
    p.add_argument("dir", help="campaign directory (holds campaign.yaml)")
    p.add_argument("--check", action="store_true", help="say whether the sandbox can run here (exit 1 if not)")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from attune.app import sandbox

    d = Path(args.dir)
    if not (d / CAMPAIGN_FILE).is_file():
        raise UsageError(f"dir: {d} holds no campaign.yaml")
    settings = sandbox.settings(d)
    if not args.check:
        if args.json:
            emit_json(settings)
        else:
            print(sandbox.settings_json(d))
        return EXIT_OK
    why = sandbox.unavailable()
    if args.json:
        emit_json({"available": why is None, "reason": why, "settings": settings})
    else:
        print("sandbox: available" if why is None else f"sandbox: unavailable: {why}")
    return EXIT_OK if why is None else EXIT_FAILED
