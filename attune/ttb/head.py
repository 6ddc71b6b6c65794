"""The campaign ledger's head, taken through one function so that its authentication can change in one place.

The head is the hash chain's last row hash and the row count (`attune.core.ledger.verify`). At submit the
campaign's ledger is verified with its key (an HMAC per row, kept outside the campaign directory) and
its anchor; the entry records whether that held and the last row's MAC. Anyone else checks the
entry's copy as a hash chain (the key never leaves the campaign's machine).
An entry's ledger has its machine paths rewritten and its chain rebuilt (`attune.ttb.paths`): its
`last_hash` is the rebuilt chain's, and `source_last_hash` the campaign's own head, which is the one a
MAC would cover.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attune.core.errors import TTBError


class HeadError(TTBError, ValueError):
    pass


def ledger_head(campaign_dir: str | Path, *, copy: bool = False) -> dict[str, Any]:
    """{rows, last_hash, authenticated, mac} of a ledger (raises HeadError).

    A campaign's own ledger (`copy=False`) is verified with its key and anchor where this machine
    holds them (the broker's host): `authenticated` says so, and `mac` is the last row's MAC, which
    the key's holder can check again. An entry's published copy (`copy=True`) is checked as a hash
    chain only: its key stays with the campaign."""
    from attune.core import ledger

    rep = ledger.verify(campaign_dir, chain_only=copy)
    if not rep.ok or rep.last_hash is None:
        raise HeadError(f"the ledger does not verify: {rep.error or 'no rows'}")
    mac = None
    if rep.authenticated:
        rows = ledger.read(campaign_dir).rows
        mac = rows[-1].mac if rows else None
    return {"rows": rep.rows, "last_hash": rep.last_hash, "authenticated": rep.authenticated, "mac": mac}


def check_head(ledger_dir: str | Path, head: dict[str, Any]) -> str | None:
    """None when the ledger copy in `ledger_dir` verifies and ends at `head`, else what differs."""
    try:
        got = ledger_head(ledger_dir, copy=True)
    except HeadError as exc:
        return str(exc)
    if got["rows"] != head.get("rows") or got["last_hash"] != head.get("last_hash"):
        return (f"the stored ledger ends at row {got['rows']} hash {got['last_hash'][:16]}..., the entry claims "
                f"row {head.get('rows')} hash {str(head.get('last_hash'))[:16]}...")
    return None
