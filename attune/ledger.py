"""The campaign ledger: append-only, hash-chained, fsynced JSON lines.

`ledger.jsonl` in the campaign directory is the campaign's source of truth. Each line is
one event:

    {"seq": 0, "ts": "2026-11-29T10:00:00.000000+00:00", "type": "campaign_started",
     "data": {...}, "prev": "000...0", "hash": "<sha256>"}

`hash` is the SHA-256 of the row's canonical JSON without the `hash` key (sorted keys,
compact separators, UTF-8), and `prev` is the previous row's hash (64 zeros for the
first row), so any edit in the middle breaks the chain at the edited row.

Writers (the MCP servers, the hooks, the CLI, several processes at once) serialise
through an exclusive `flock` on the ledger file; an append returns only after the row
and the file are fsynced. A crash mid-append can leave a torn last line (no trailing
newline). Readers report it and ignore it, never merge it; the next writer moves the
fragment to `ledger.torn` (for the record) and truncates it away before appending.

This module uses only the standard library: hooks import it on every tool call.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

LEDGER_NAME = "ledger.jsonl"
TORN_NAME = "ledger.torn"
GENESIS = "0" * 64

# Every event the control plane records, with the data keys each one must carry.
ROW_TYPES: dict[str, tuple[str, ...]] = {
    "campaign_started": ("name", "spec_sha256", "gpus"),
    "budget_set": ("gpu_hours", "reason"),
    "launch_admitted": ("run_id", "kind", "expected_gpu_hours"),
    "launch_refused": ("reason",),
    "run_submitted": ("run_id", "backend_id"),
    "run_started": ("run_id",),
    "run_finished": ("run_id", "outcome", "charge_gpu_hours"),
    "measurement": ("run_id", "tokens_per_s_per_gpu", "valid"),
    "calibration_run": ("run_id", "tokens_per_s_per_gpu"),
    "leader_changed": ("run_id", "tokens_per_s_per_gpu"),
    "assumption_recorded": ("question", "default"),
    "diagnosis_recorded": ("text",),
    "stop_recorded": ("leader", "levers_tested", "diagnosis"),
    "check_run": ("run_id", "candidate_run_id", "passed"),
    "shipped": ("run_id", "recipe"),
    "remeasurement": ("run_id", "recipe_of", "tokens_per_s_per_gpu"),
    "campaign_failed": ("reason",),
}


class LedgerError(Exception):
    """The ledger cannot be trusted: a broken chain, a corrupt row, or a bad append."""


@dataclass(frozen=True)
class Row:
    seq: int
    ts: str
    type: str
    data: dict[str, Any]
    prev: str
    hash: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "ts": self.ts,
            "type": self.type,
            "data": self.data,
            "prev": self.prev,
            "hash": self.hash,
        }


@dataclass
class ReadResult:
    """Rows read from a ledger, and what was found beyond them."""

    rows: list[Row] = field(default_factory=list)
    torn_tail: str | None = None  # an unterminated last line, reported and ignored
    end_offset: int = 0  # byte offset just after the last complete line


def canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def row_hash(seq: int, ts: str, type_: str, data: Mapping[str, Any], prev: str) -> str:
    body = {"seq": seq, "ts": ts, "type": type_, "data": data, "prev": prev}
    return hashlib.sha256(canonical(body)).hexdigest()


def validate_event(type_: str, data: Mapping[str, Any]) -> None:
    if type_ not in ROW_TYPES:
        raise LedgerError(f"unknown row type {type_!r}; expected one of {sorted(ROW_TYPES)}")
    if not isinstance(data, Mapping):
        raise LedgerError(f"row data for {type_} must be an object")
    missing = [k for k in ROW_TYPES[type_] if k not in data]
    if missing:
        raise LedgerError(f"{type_} row is missing data field(s): {', '.join(missing)}")
    try:
        canonical(dict(data))
    except (TypeError, ValueError) as exc:
        raise LedgerError(f"{type_} row data is not plain JSON (finite numbers, strings, lists, objects): {exc}") from exc


def _parse_line(line: bytes, lineno: int, expected_seq: int, expected_prev: str) -> Row:
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise LedgerError(f"line {lineno}: not valid JSON ({exc})") from exc
    if not isinstance(obj, dict):
        raise LedgerError(f"line {lineno}: a row must be a JSON object")
    try:
        row = Row(
            seq=obj["seq"], ts=obj["ts"], type=obj["type"], data=obj["data"], prev=obj["prev"], hash=obj["hash"]
        )
    except KeyError as exc:
        raise LedgerError(f"line {lineno}: row lacks field {exc.args[0]!r}") from exc
    if row.seq != expected_seq:
        raise LedgerError(f"line {lineno}: sequence number {row.seq!r}, expected {expected_seq}")
    if row.prev != expected_prev:
        raise LedgerError(f"line {lineno} (seq {row.seq}): chain broken, prev does not match the previous row's hash")
    if row_hash(row.seq, row.ts, row.type, row.data, row.prev) != row.hash:
        raise LedgerError(f"line {lineno} (seq {row.seq}): hash mismatch, the row was altered")
    return row


def iter_rows(
    path: Path, start_offset: int = 0, start_seq: int = 0, start_prev: str = GENESIS
) -> Iterator[tuple[Row, int] | str]:
    """Yield (verified row, its size in bytes) from `start_offset`; a final unterminated fragment as a str."""
    with open(path, "rb") as fh:
        fh.seek(start_offset)
        seq, prev = start_seq, start_prev
        lineno = start_seq  # line numbers are 1-based; row seq k sits on line k + 1
        for raw in fh:
            lineno += 1
            if not raw.endswith(b"\n"):
                yield raw.decode("utf-8", errors="replace")
                return
            row = _parse_line(raw, lineno, seq, prev)
            yield row, len(raw)
            seq, prev = seq + 1, row.hash


def read(campaign_dir: Path | str, start_offset: int = 0, start_seq: int = 0, start_prev: str = GENESIS) -> ReadResult:
    """Read and verify a ledger (or its part from `start_offset`). Raises LedgerError on a broken chain."""
    path = Path(campaign_dir) / LEDGER_NAME
    result = ReadResult(end_offset=start_offset)
    if not path.exists():
        return result
    offset = start_offset
    for item in iter_rows(path, start_offset, start_seq, start_prev):
        if isinstance(item, str):
            result.torn_tail = item
            break
        row, nbytes = item
        result.rows.append(row)
        offset += nbytes
    result.end_offset = offset
    return result


def canonical_line(row: Row) -> bytes:
    return canonical(row.as_dict()) + b"\n"


def _last_line(fh: Any, size: int) -> bytes | None:
    """The last newline-terminated line of an open file of `size` bytes, read backwards."""
    if size == 0:
        return None
    block = 64 * 1024
    end = size
    buf = b""
    while end > 0:
        start = max(0, end - block)
        fh.seek(start)
        buf = fh.read(end - start) + buf
        end = start
        # The file ends with "\n" here; look for the newline before the last line.
        idx = buf.rfind(b"\n", 0, len(buf) - 1)
        if idx >= 0:
            return buf[idx + 1 :]
    return buf


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[Any]:
    created = not path.exists()
    with open(path, "a+b") as fh:  # closing releases the lock
        if created:
            _fsync_dir(path.parent)
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        yield fh


def _repair_torn_tail(fh: Any, path: Path) -> int:
    """Under the lock: move an unterminated last line aside and truncate it. Returns the file size."""
    fh.seek(0, os.SEEK_END)
    size = fh.tell()
    if size == 0:
        return 0
    fh.seek(size - 1)
    if fh.read(1) == b"\n":
        return size
    # Find the start of the fragment.
    block = 64 * 1024
    end = size
    cut = 0
    while end > 0:
        start = max(0, end - block)
        fh.seek(start)
        chunk = fh.read(end - start)
        idx = chunk.rfind(b"\n")
        if idx >= 0:
            cut = start + idx + 1
            break
        end = start
    fh.seek(cut)
    fragment = fh.read(size - cut)
    torn = path.parent / TORN_NAME
    with open(torn, "ab") as tf:
        tf.write(json.dumps({"offset": cut, "fragment": fragment.decode("utf-8", "replace")}).encode() + b"\n")
        tf.flush()
        os.fsync(tf.fileno())
    fh.truncate(cut)
    fh.flush()
    os.fsync(fh.fileno())
    return cut


class Ledger:
    """A campaign's ledger. Appends are atomic across processes and durable on return."""

    def __init__(self, campaign_dir: Path | str) -> None:
        self.dir = Path(campaign_dir)
        self.path = self.dir / LEDGER_NAME

    def exists(self) -> bool:
        return self.path.exists()

    def append(self, type_: str, data: Mapping[str, Any], *, now: datetime | None = None) -> Row:
        """Validate, chain, write and fsync one row; returns it once it is durable."""
        payload = dict(data)
        validate_event(type_, payload)
        if not self.dir.is_dir():
            raise LedgerError(f"campaign directory {self.dir} does not exist")
        with _locked(self.path) as fh:
            size = _repair_torn_tail(fh, self.path)
            last = _last_line(fh, size)
            if last is None:
                seq, prev = 0, GENESIS
            else:
                try:
                    obj = json.loads(last)
                    seq, prev = int(obj["seq"]) + 1, str(obj["hash"])
                except (ValueError, KeyError, TypeError) as exc:
                    raise LedgerError(f"the ledger's last row is corrupt; refusing to append ({exc})") from exc
            ts = (now or datetime.now(UTC)).isoformat(timespec="microseconds")
            row = Row(seq=seq, ts=ts, type=type_, data=payload, prev=prev, hash=row_hash(seq, ts, type_, payload, prev))
            fh.seek(0, os.SEEK_END)
            fh.write(canonical_line(row))
            fh.flush()
            os.fsync(fh.fileno())
            return row

    def read(self) -> ReadResult:
        return read(self.dir)

    def rows(self) -> list[Row]:
        return self.read().rows


@dataclass
class VerifyReport:
    ok: bool
    rows: int
    torn_tail: bool
    torn_tail_bytes: int
    error: str | None
    last_hash: str | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "rows": self.rows,
            "torn_tail": self.torn_tail,
            "torn_tail_bytes": self.torn_tail_bytes,
            "error": self.error,
            "last_hash": self.last_hash,
        }


def verify(campaign_dir: Path | str) -> VerifyReport:
    """Check the whole chain. A torn tail is reported but does not fail verification."""
    path = Path(campaign_dir) / LEDGER_NAME
    if not path.exists():
        return VerifyReport(False, 0, False, 0, f"no ledger at {path}", None)
    count = 0
    last: str | None = None
    try:
        for item in iter_rows(path):
            if isinstance(item, str):
                return VerifyReport(True, count, True, len(item.encode()), None, last)
            count += 1
            last = item[0].hash
    except LedgerError as exc:
        return VerifyReport(False, count, False, 0, str(exc), last)
    return VerifyReport(True, count, False, 0, None, last)
