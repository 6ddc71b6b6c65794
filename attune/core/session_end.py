"""Why an agent session ended with its campaign unfinished, and the Stop hook's count of blocks.

Standard library only (the Stop hook imports it). Claude Code ends a session itself after a cap of
consecutive Stop-hook blocks (`CLAUDE_CODE_STOP_HOOK_BLOCK_CAP`, 8 by default: the block after the cap
is overridden). The hook's input says only whether the stop follows a block (`stop_hook_active`), so
the hook counts its blocks in `<campaign>/.stop_blocks.json`; at the block Claude Code will override it
writes `<campaign>/session_end.json` (the reason, the session, the count) and fails the headless run.
`attune tune`, `attune status` and the report read that record.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any

from attune.core.campaign_paths import SESSION_END_FILE, STOP_BLOCKS_FILE

DEFAULT_BLOCK_CAP = 8
CAP_ENV = "CLAUDE_CODE_STOP_HOOK_BLOCK_CAP"


def block_cap(environ: Any = None) -> int:
    """Claude Code's cap of consecutive Stop-hook blocks (0 or less: no cap)."""
    raw = (os.environ if environ is None else environ).get(CAP_ENV)
    try:
        return int(str(raw).strip()) if raw not in (None, "") else DEFAULT_BLOCK_CAP
    except ValueError:
        return DEFAULT_BLOCK_CAP


def _write(path: str, data: dict[str, Any]) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(data, sort_keys=True) + "\n")
    os.replace(tmp, path)


def count_block(campaign: str, session_id: str | None, follows_block: bool) -> int:
    """Count one more block of this session's stop; returns the consecutive count (1: the first)."""
    path = os.path.join(campaign, STOP_BLOCKS_FILE)
    count = 0
    if follows_block:
        try:
            with open(path, encoding="utf-8") as fh:
                prev = json.load(fh)
            if isinstance(prev, dict) and prev.get("session_id") == session_id:
                count = int(prev.get("count") or 0)
        except (OSError, ValueError, TypeError):
            count = 0
    count += 1
    _write(path, {"session_id": session_id, "count": count, "at": time.time()})
    return count


def reset_blocks(campaign: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(campaign, STOP_BLOCKS_FILE))


def record(campaign: str, reason: str, session_id: str | None, blocks: int | None = None) -> dict[str, Any]:
    data = {"reason": reason, "session_id": session_id, "blocks": blocks,
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    _write(os.path.join(campaign, SESSION_END_FILE), data)
    return data


def read(campaign: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(campaign, SESSION_END_FILE), encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def clear(campaign: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(campaign, SESSION_END_FILE))
