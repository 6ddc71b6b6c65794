"""`attune init DIR`: start a campaign (validate, freeze and hash its spec, first ledger row)."""

from __future__ import annotations

import argparse
import sys

from attune.control.campaign import CampaignError, start
from attune.control.spec import SpecError
from attune.core.errors import EXIT_OK, EXIT_USAGE
from attune.core.ledger import LedgerError
from attune.core.output import add_json_flag, emit_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("init", help="start a campaign in DIR (which holds campaign.yaml)")
    p.add_argument("dir", help="campaign directory")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        spec, state = start(args.dir)
    except SpecError as exc:
        if args.json:
            emit_json({"started": False, **exc.as_dict()})
        else:
            print(str(exc), file=sys.stderr)
        return EXIT_USAGE
    except (CampaignError, LedgerError) as exc:
        print(f"attune init: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    payload = {"started": True, "name": spec.name, "spec_sha256": state.spec_sha256, "rows": state.last_seq + 1}
    if args.json:
        emit_json(payload)
    else:
        print(f"campaign {spec.name!r} started in {args.dir} (spec sha256 {state.spec_sha256[:12]})")
    return EXIT_OK
