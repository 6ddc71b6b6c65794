"""`attune schema`: print the campaign spec's JSON Schema, or rewrite the committed copy."""

from __future__ import annotations

import argparse

from attune.control.spec import SCHEMA_PATH, schema_text
from attune.core.errors import EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("schema", help="print the JSON Schema of campaign.yaml")
    p.add_argument("--write", action="store_true", help=f"rewrite {SCHEMA_PATH.name} in the package")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    text = schema_text()
    if args.write:
        SCHEMA_PATH.parent.mkdir(parents=True, exist_ok=True)
        SCHEMA_PATH.write_text(text)
        print(f"wrote {SCHEMA_PATH}")
    else:
        print(text, end="")
    return EXIT_OK
