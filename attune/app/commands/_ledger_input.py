"""Shared checks of a campaign directory's ledger for the commands that read it (not a command)."""

from __future__ import annotations

from pathlib import Path

from attune.core.ledger import LEDGER_NAME, verify
from attune.readers.bounded import InputError, check_regular


def check_ledger_file(d: Path, start_hint: bool = True) -> Path:
    """The ledger's path, if `d` is a directory holding a regular, non-empty ledger file.

    Raises InputError (exit 2): no directory, no ledger, a ledger that is not a regular file (a
    directory, a FIFO, a device), or an empty one (a campaign that has not started)."""
    if not d.is_dir():
        raise InputError(f"{d} is not a directory")
    path = d / LEDGER_NAME
    hint = f" (start the campaign first: attune init {d})" if start_hint else ""
    if not path.exists() and not path.is_symlink():
        raise InputError(f"no {LEDGER_NAME} in {d}{hint}")
    st = check_regular(path, "ledger")
    if st.st_size == 0 and verify(d).problem != "truncated":  # an anchored ledger emptied is a tampering: exit 1
        raise InputError(f"{path} is empty: the campaign has not started{hint}")
    return path
