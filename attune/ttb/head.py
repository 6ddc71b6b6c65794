"""The campaign ledger's head, taken through one function so that its authentication can change in one place.

Today the head is the hash chain's last row hash and the row count (`attune.ledger.verify`). When
the ledger gains a key (an HMAC over the chain, kept outside the campaign directory), `ledger_head`
adds the MAC and sets `authenticated`; `check_head` then also checks the MAC where the key is known.
An entry's ledger has its machine paths rewritten and its chain rebuilt (`attune.ttb.paths`): its
`last_hash` is the rebuilt chain's, and `source_last_hash` the campaign's own head, which is the one a
MAC would cover.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


class HeadError(ValueError):
    pass


def ledger_head(campaign_dir: str | Path) -> dict[str, Any]:
    """{rows, last_hash, authenticated, mac} of a campaign directory's ledger (raises HeadError)."""
    from attune import ledger

    rep = ledger.verify(campaign_dir)
    if not rep.ok or rep.last_hash is None:
        raise HeadError(f"the ledger does not verify: {rep.error or 'no rows'}")
    return {"rows": rep.rows, "last_hash": rep.last_hash, "authenticated": False, "mac": None}


def check_head(ledger_dir: str | Path, head: dict[str, Any]) -> str | None:
    """None when the ledger in `ledger_dir` verifies and ends at `head`, else what differs."""
    try:
        got = ledger_head(ledger_dir)
    except HeadError as exc:
        return str(exc)
    if got["rows"] != head.get("rows") or got["last_hash"] != head.get("last_hash"):
        return (f"the stored ledger ends at row {got['rows']} hash {got['last_hash'][:16]}..., the entry claims "
                f"row {head.get('rows')} hash {str(head.get('last_hash'))[:16]}...")
    return None
