"""Shared helpers for commands that report: one JSON document on --json, text otherwise."""

from __future__ import annotations

import json
import sys
from typing import Any


def emit_json(payload: Any) -> None:
    json.dump(payload, sys.stdout, indent=2, sort_keys=False, default=str)
    sys.stdout.write("\n")


def add_json_flag(parser: Any) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON document (stable shape)")
