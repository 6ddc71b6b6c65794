"""The campaign ledger: append-only, hash-chained, authenticated, fsynced JSON lines.

`ledger.jsonl` in the campaign directory is the campaign's source of truth. Each line is
one event:

    {"seq": 0, "ts": "2026-11-29T10:00:00.000000+00:00", "type": "campaign_started",
     "data": {...}, "prev": "000...0", "hash": "<sha256>", "mac": "<hmac-sha256>"}

`hash` is the SHA-256 of the row's canonical JSON without the `hash` and `mac` keys (sorted
keys, compact separators, UTF-8), and `prev` is the previous row's hash (64 zeros for the
first row), so any edit in the middle breaks the chain at the edited row.

The chain alone can be recomputed by anyone who can write the file. So every row also carries
`mac`, an HMAC-SHA256 of its hash under a per-campaign key, and the writer keeps an *anchor*
(the row count and the head hash, itself MACed) next to the key. Both live outside the campaign
directory, under `${XDG_STATE_HOME:-~/.local/state}/attune/ledger-keys/` (directory 0700, files
0600; `~` is the account's home from the password database, whatever `$HOME` says), named by the
campaign id: the SHA-256 of the campaign directory's real path (first 32 hex
digits). The agent's sandbox denies reads there; the broker, the control plane, the MCP servers
and the hooks (which run outside the agent's Bash sandbox) hold the key.

Readers classify what they find (`LedgerError.kind`):

    dropped_tail   fewer rows than the anchor records, the file ends cleanly
    truncated      fewer rows than the anchor records and a partial last line (a cut mid-file),
                   or an empty file where the anchor records rows
    rewritten      a row inside the anchored range whose MAC is wrong, or whose hash is not the
                   anchored head (the chain was recomputed without the key)
    forged         a row beyond the anchored range without a valid MAC, or a row whose data no
                   writer produces (a negative charge, a non-finite number)
    altered        a row whose hash does not match its content
    out_of_order   swapped, duplicated or missing sequence numbers, or a broken prev link
    corrupt        a complete line that is not a row
    key_missing    no key for a non-empty ledger (or a copied/moved campaign directory)
    anchor_missing the key exists but the anchor does not

A reader that cannot read the key (permission denied, or `ATTUNE_LEDGER_AUTH=chain` in its
environment, as in the agent's sandbox) checks the chain, the row data and the anchor if it can
read it, and reports the ledger as unauthenticated; it never claims authentication it did not do.

Writers (the MCP servers, the hooks, the CLI, several processes at once) serialise
through an exclusive `flock` on the ledger file; an append returns only after the row
and the file are fsynced, and then moves the anchor. A crash mid-append can leave a torn last
line (no trailing newline), or a row the anchor does not count yet. Readers report the first and
ignore it, never merge it, and accept the second (its MAC proves a key holder wrote it); the next
writer moves the fragment to `ledger.torn` (for the record) and truncates it away before appending.

A ledger file that does not exist is a campaign not started: the first append there starts a
new key and anchor (a campaign directory deleted and made again is a new campaign). An existing
but empty file whose anchor records rows is a truncation.

This module uses only the standard library: hooks import it on every tool call.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import math
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from attune.core.campaign_paths import LEDGER_FILE, LEDGER_TORN_FILE
from attune.core.errors import CoreError

LEDGER_NAME = LEDGER_FILE
TORN_NAME = LEDGER_TORN_FILE
GENESIS = "0" * 64
KEY_BYTES = 32
MAX_ROW_BYTES = 4 * 2**20  # no writer makes a longer row
AUTH_ENV = "ATTUNE_LEDGER_AUTH"  # "chain": check the chain only (a reader without the key)

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
    "stop_refused": ("refusals",),
    "check_run": ("run_id", "candidate_run_id", "passed"),
    "shipped": ("run_id", "recipe"),
    "remeasurement": ("run_id", "recipe_of", "tokens_per_s_per_gpu"),
    "campaign_failed": ("reason",),
}
# Data fields that, where present and not null, are finite numbers >= 0 (a charge is never negative).
NON_NEGATIVE = ("charge_gpu_hours", "expected_gpu_hours", "gpu_hours", "tokens_per_s_per_gpu")


class LedgerError(CoreError):
    """The ledger cannot be trusted: a broken chain, a corrupt row, or a bad append.

    `kind` classifies it (see the module docstring); `bad_request` is an append the ledger refuses."""

    def __init__(self, message: str, kind: str = "corrupt") -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Row:
    seq: int
    ts: str
    type: str
    data: dict[str, Any]
    prev: str
    hash: str
    mac: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out = {
            "seq": self.seq,
            "ts": self.ts,
            "type": self.type,
            "data": self.data,
            "prev": self.prev,
            "hash": self.hash,
        }
        if self.mac is not None:
            out["mac"] = self.mac
        return out


@dataclass
class ReadResult:
    """Rows read from a ledger, and what was found beyond them."""

    rows: list[Row] = field(default_factory=list)
    torn_tail: str | None = None  # an unterminated last line, reported and ignored
    end_offset: int = 0  # byte offset just after the last complete line
    authenticated: bool = False  # every row's MAC and the anchor were checked with the key
    anchor_rows: int | None = None  # the row count the anchor records (None: no anchor read)
    note: str | None = None  # why the read was not authenticated


def canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def row_hash(seq: int, ts: str, type_: str, data: Mapping[str, Any], prev: str) -> str:
    body = {"seq": seq, "ts": ts, "type": type_, "data": data, "prev": prev}
    return hashlib.sha256(canonical(body)).hexdigest()


def row_mac(key: bytes, hash_: str) -> str:
    return hmac.digest(key, b"row:" + hash_.encode(), "sha256").hex()


def _anchor_mac(key: bytes, rows: int, head: str) -> str:
    return hmac.digest(key, f"anchor:{rows}:{head}".encode(), "sha256").hex()


def check_data(type_: str, data: Mapping[str, Any]) -> str | None:
    """What is wrong with a row's data that no writer of this ledger produces (None: nothing)."""
    for name in NON_NEGATIVE:
        if name not in data or data[name] is None:
            continue
        v = data[name]
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
            return f"{type_} {name} is {v!r}: expected a finite number >= 0"
    return None


def validate_event(type_: str, data: Mapping[str, Any]) -> None:
    if type_ not in ROW_TYPES:
        raise LedgerError(f"unknown row type {type_!r}; expected one of {sorted(ROW_TYPES)}", "bad_request")
    if not isinstance(data, Mapping):
        raise LedgerError(f"row data for {type_} must be an object", "bad_request")
    missing = [k for k in ROW_TYPES[type_] if k not in data]
    if missing:
        raise LedgerError(f"{type_} row is missing data field(s): {', '.join(missing)}", "bad_request")
    try:
        size = len(canonical(dict(data)))
    except (TypeError, ValueError) as exc:
        raise LedgerError(
            f"{type_} row data is not plain JSON (finite numbers, strings, lists, objects): {exc}", "bad_request"
        ) from exc
    problem = check_data(type_, data)
    if problem:
        raise LedgerError(problem, "bad_request")
    if size > MAX_ROW_BYTES // 2:
        raise LedgerError(f"{type_} row data is larger than {MAX_ROW_BYTES // 2} bytes", "bad_request")


# ------------------------------------------------------------------------------------ keys and anchor


def _user_home() -> str:
    """The user's home from the password database: a process started with another $HOME (Claude Code
    in a test harness, a sandbox) still finds the same keys."""
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_dir
    except (ImportError, KeyError):
        return os.path.expanduser("~")


_KEYS_DIR: dict[tuple[str | None, int], Path] = {}  # (XDG_STATE_HOME, uid) -> keys_dir(): no passwd look-up per read


def keys_dir() -> Path:
    """`${XDG_STATE_HOME:-~/.local/state}/attune/ledger-keys` (`~`: the user's home directory)."""
    xdg = os.environ.get("XDG_STATE_HOME") or None
    ident = (xdg, os.getuid())
    hit = _KEYS_DIR.get(ident)
    if hit is None:
        base = xdg or os.path.join(_user_home(), ".local", "state")
        hit = _KEYS_DIR[ident] = Path(base) / "attune" / "ledger-keys"
    return hit


def campaign_id(campaign_dir: Path | str) -> str:
    """The id a campaign's key and anchor are filed under: from the directory's real path."""
    return hashlib.sha256(os.path.realpath(campaign_dir).encode()).hexdigest()[:32]


def key_path(campaign_dir: Path | str) -> Path:
    return keys_dir() / campaign_id(campaign_dir)


def anchor_path(campaign_dir: Path | str) -> Path:
    return keys_dir() / (campaign_id(campaign_dir) + ".anchor")


def auth_paths(campaign_dir: Path | str) -> tuple[Path, Path]:
    """(key path, anchor path) of a campaign, its real path resolved once."""
    d, cid = keys_dir(), campaign_id(campaign_dir)
    return d / cid, d / (cid + ".anchor")


_KEY_CACHE: dict[str, tuple[tuple[int, int, int], bytes]] = {}


def _load_key(path: Path) -> bytes:
    """The key at `path` (cached while the file is unchanged). Raises OSError."""
    st = os.stat(path)
    ident = (st.st_ino, st.st_mtime_ns, st.st_size)
    hit = _KEY_CACHE.get(str(path))
    if hit is not None and hit[0] == ident:
        return hit[1]
    with open(path, "rb") as fh:
        text = fh.read(256).strip()
    try:
        key = bytes.fromhex(text.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise LedgerError(f"the ledger key {path} is not a hex key", "key_missing") from None
    if len(key) < 16:
        raise LedgerError(f"the ledger key {path} is too short", "key_missing")
    _KEY_CACHE[str(path)] = (ident, key)
    return key


def _write_private(path: Path, data: bytes) -> None:
    """Write `data` to `path` atomically, mode 600 (through a temporary file and a rename)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _new_key(campaign_dir: Path) -> bytes:
    """A fresh key and an empty anchor for a campaign (a new ledger)."""
    d = keys_dir()
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(d, 0o700)
    import secrets  # here: hooks import this module on every tool call

    key = secrets.token_bytes(KEY_BYTES)
    kp = key_path(campaign_dir)
    _write_private(kp, key.hex().encode() + b"\n")
    _write_anchor(campaign_dir, key, 0, GENESIS)
    _fsync_dir(d)
    return key


def origin_path(first_hash: str) -> Path:
    """Where the id of the directory a ledger was started in is filed, by the ledger's first row."""
    return keys_dir() / f"origin-{first_hash[:32]}"


def _first_hash(campaign_dir: Path) -> str | None:
    try:
        with open(campaign_dir / LEDGER_NAME, "rb") as fh:
            obj = json.loads(fh.readline(MAX_ROW_BYTES + 1))
        return str(obj["hash"]) if int(obj["seq"]) == 0 else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _moved_or_copied(campaign_dir: Path) -> tuple[bytes, Anchor | None, str] | None:
    """A campaign directory moved or copied by its owner: its key found through the ledger's first row (the
    ledger it started). Moved (the same directory: device and inode as the anchor records, its old path
    gone): the key and anchor are filed under the new path, and every check applies. Copied: the rows'
    MACs are checked with the original's key; the anchor is the original's, so it is not checked here. Only
    for a directory that never had a key of its own filed (no anchor under its path)."""
    if os.path.lexists(anchor_path(campaign_dir)):
        return None  # this directory had a key of its own: a deleted key is a tampering, never a copy
    first = _first_hash(campaign_dir)
    if first is None:
        return None
    try:
        origin = origin_path(first).read_text().strip()
        if not re.fullmatch(r"[0-9a-f]{32}", origin):
            return None
        key = _load_key(keys_dir() / origin)
    except (OSError, LedgerError):
        return None
    try:
        with open(keys_dir() / f"{origin}.anchor", "rb") as fh:
            obj = json.loads(fh.read(4096))
        rows, head = int(obj["rows"]), str(obj["head"])
        if not hmac.compare_digest(str(obj["mac"]), _anchor_mac(key, rows, head)):
            return None
        ident = tuple(int(x) for x in obj.get("dir") or ())
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if ident == tuple(_dir_identity(campaign_dir)):
        with contextlib.suppress(OSError):
            _write_private(key_path(campaign_dir), key.hex().encode() + b"\n")
            _write_anchor(campaign_dir, key, rows, head)
            origin_path(first).write_text(campaign_id(campaign_dir) + "\n")
        return key, Anchor(rows, head, ident), "moved: the ledger key followed the campaign directory"
    return key, None, "a copy of a campaign: the rows' MACs are checked with its key, not the original's anchor"


def _dir_identity(campaign_dir: Path) -> list[int]:
    st = os.stat(campaign_dir)
    return [st.st_dev, st.st_ino]


def _write_anchor(campaign_dir: Path, key: bytes, rows: int, head: str, path: Path | None = None) -> None:
    body = {"rows": rows, "head": head, "mac": _anchor_mac(key, rows, head), "dir": _dir_identity(campaign_dir)}
    _write_private(path or anchor_path(campaign_dir), json.dumps(body, sort_keys=True).encode() + b"\n")


@dataclass(frozen=True)
class Anchor:
    rows: int
    head: str
    dir: tuple[int, ...] = ()  # the campaign directory's (device, inode) when the anchor was written


def _read_anchor(campaign_dir: Path, key: bytes | None, path: Path | None = None) -> Anchor | None:
    """The anchor (None: absent; `path`: its path, when known). Raises LedgerError if it is unreadable or
    its MAC is wrong."""
    p = path or anchor_path(campaign_dir)
    try:
        with open(p, "rb") as fh:
            raw = fh.read(4096)
    except FileNotFoundError:
        return None
    try:
        obj = json.loads(raw)
        rows, head, mac = int(obj["rows"]), str(obj["head"]), str(obj["mac"])
        ident = tuple(int(x) for x in obj.get("dir") or ())
    except (ValueError, KeyError, TypeError, AttributeError):
        raise LedgerError(f"the ledger anchor {p} is corrupt", "anchor_missing") from None
    if key is not None and not hmac.compare_digest(mac, _anchor_mac(key, rows, head)):
        raise LedgerError(f"the ledger anchor {p} does not carry the key's MAC", "anchor_missing")
    return Anchor(rows, head, ident)


def _retire(campaign_dir: Path) -> None:
    """Keep a replaced ledger's key and anchor (renamed) rather than overwrite them."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    for p in (key_path(campaign_dir), anchor_path(campaign_dir)):
        with contextlib.suppress(FileNotFoundError):
            os.replace(p, p.with_name(f"{p.name}.retired-{stamp}"))


@dataclass
class _Auth:
    key: bytes | None
    anchor: Anchor | None
    note: str | None  # why there is no key (chain-only reading)


def _reader_auth(campaign_dir: Path, ledger_has_rows: bool, chain_only: bool = False) -> _Auth:
    """The key and anchor a reader checks against, read before the ledger itself (so that a
    concurrent append can only make the file longer than the anchor, never shorter)."""
    key: bytes | None = None
    note: str | None = None
    if chain_only:
        return _Auth(None, None, "a copy checked without its key: the chain is checked, not the rows' MACs")
    if os.environ.get(AUTH_ENV, "").strip().lower() == "chain":
        note = f"{AUTH_ENV}=chain: the chain is checked, not the rows' MACs"
        ap = anchor_path(campaign_dir)
    else:
        kp, ap = auth_paths(campaign_dir)
        try:
            key = _load_key(kp)
        except FileNotFoundError:
            found = _moved_or_copied(Path(campaign_dir)) if ledger_has_rows else None
            if found is not None:
                return _Auth(found[0], found[1], found[2])
            if ledger_has_rows:
                raise LedgerError(
                    f"key missing: no ledger key at {kp} for this campaign directory (its key was deleted, or the "
                    "directory was copied or moved: ledger keys are filed by the directory's real path)",
                    "key_missing",
                ) from None
            return _Auth(None, None, None)
        except PermissionError:
            note = f"the ledger key {kp} is not readable here: the chain is checked, not the rows' MACs"
        except OSError as exc:
            note = f"the ledger key {kp} cannot be read ({exc.strerror}): the chain is checked, not the MACs"
    try:
        anchor = _read_anchor(campaign_dir, key, ap)
    except PermissionError:
        anchor = None
    except OSError:
        anchor = None
    if key is not None and anchor is None and ledger_has_rows:
        raise LedgerError(f"anchor missing: the key exists but there is no anchor at {ap}", "anchor_missing")
    return _Auth(key, anchor, note)


# ------------------------------------------------------------------------------------ reading


def _parse_line(line: bytes, lineno: int, expected_seq: int, expected_prev: str, auth: _Auth) -> Row:
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise LedgerError(f"line {lineno}: not valid JSON ({exc})", "corrupt") from None
    if not isinstance(obj, dict):
        raise LedgerError(f"line {lineno}: a row must be a JSON object", "corrupt")
    try:
        row = Row(
            seq=obj["seq"], ts=obj["ts"], type=obj["type"], data=obj["data"], prev=obj["prev"], hash=obj["hash"],
            mac=obj.get("mac"),
        )
    except KeyError as exc:
        raise LedgerError(f"line {lineno}: row lacks field {exc.args[0]!r}", "corrupt") from None
    if not (isinstance(row.seq, int) and isinstance(row.ts, str) and isinstance(row.type, str)
            and isinstance(row.data, dict) and isinstance(row.prev, str) and isinstance(row.hash, str)):
        raise LedgerError(f"line {lineno}: a row field has the wrong type", "corrupt")
    if row.seq != expected_seq:
        what = ("a duplicated or swapped row" if isinstance(row.seq, int) and row.seq < expected_seq
                else "rows are missing before it, or it was swapped")
        raise LedgerError(f"line {lineno}: sequence number {row.seq!r}, expected {expected_seq}: {what}",
                          "out_of_order")
    if row.prev != expected_prev:
        raise LedgerError(f"line {lineno} (seq {row.seq}): chain broken, prev does not match the previous row's hash",
                          "out_of_order")
    try:
        want = row_hash(row.seq, row.ts, row.type, row.data, row.prev)
    except (TypeError, ValueError):
        raise LedgerError(f"line {lineno} (seq {row.seq}): the row is not plain JSON", "corrupt") from None
    if want != row.hash:
        raise LedgerError(f"line {lineno} (seq {row.seq}): hash mismatch, the row was altered", "altered")
    anchored = auth.anchor.rows if auth.anchor is not None else 0
    if auth.key is not None and (not isinstance(row.mac, str)
                                 or not hmac.compare_digest(row.mac, row_mac(auth.key, row.hash))):
        if row.seq < anchored:
            raise LedgerError(
                f"line {lineno} (seq {row.seq}): rewritten: the hash chain is consistent but the row's MAC is "
                "wrong (the chain was recomputed without the key)", "rewritten")
        raise LedgerError(
            f"line {lineno} (seq {row.seq}): forged: a row beyond the {anchored} anchored rows without a valid MAC",
            "forged")
    if row.type not in ROW_TYPES:
        raise LedgerError(f"line {lineno} (seq {row.seq}): forged: unknown row type {row.type!r}", "forged")
    problem = check_data(row.type, row.data)
    if problem:
        raise LedgerError(f"line {lineno} (seq {row.seq}): forged: {problem}", "forged")
    return row


class _Replaced(CoreError):
    """The ledger file is no longer the one whose verified prefix was reused."""


def iter_rows(
    path: Path, start_offset: int = 0, start_seq: int = 0, start_prev: str = GENESIS, auth: _Auth | None = None,
    *, expect_ident: tuple[int, int] | None = None, raw: list[bytes] | None = None,
) -> Iterator[tuple[Row, int] | str]:
    """Yield (verified row, its size in bytes) from `start_offset`; a final unterminated fragment as a str.
    `expect_ident`: the file's (device, inode) the caller read before (else `_Replaced`); `raw`: gets
    each verified row's bytes."""
    auth = auth or _Auth(None, None, "no key given")
    with open(path, "rb") as fh:
        if not os.path.isfile(path):
            raise LedgerError(f"{path} is not a regular file", "corrupt")
        if expect_ident is not None:
            st = os.fstat(fh.fileno())
            if (st.st_dev, st.st_ino) != expect_ident:
                raise _Replaced
        fh.seek(start_offset)
        seq, prev = start_seq, start_prev
        lineno = start_seq  # line numbers are 1-based; row seq k sits on line k + 1
        while line := fh.readline(MAX_ROW_BYTES + 1):
            lineno += 1
            if not line.endswith(b"\n"):
                if len(line) > MAX_ROW_BYTES:
                    raise LedgerError(f"line {lineno}: longer than {MAX_ROW_BYTES} bytes: not a row", "corrupt")
                yield line.decode("utf-8", errors="replace")
                return
            row = _parse_line(line, lineno, seq, prev, auth)
            if raw is not None:
                raw.append(line)
            yield row, len(line)
            seq, prev = seq + 1, row.hash


def _check_anchor(auth: _Auth, total: int, torn: bool, hash_at: dict[int, str]) -> None:
    """The rows read against the anchor. `hash_at` maps the seqs read (and the one before) to hashes."""
    a = auth.anchor
    if a is None or a.rows == 0:
        return
    if total < a.rows:
        lost = a.rows - total
        if total == 0 and not torn:
            raise LedgerError(f"truncated: the ledger is empty but its anchor records {a.rows} rows", "truncated")
        if torn:
            raise LedgerError(
                f"truncated mid-file: {total} complete rows and a partial line, but the anchor records {a.rows} "
                f"rows ({lost} lost); not a torn last line", "truncated")
        raise LedgerError(f"dropped tail: {total} rows, but the anchor records {a.rows} ({lost} dropped)",
                          "dropped_tail")
    got = hash_at.get(a.rows - 1)
    if got is not None and got != a.head:
        raise LedgerError(
            f"rewritten: row {a.rows - 1} is not the anchored head (the chain was recomputed)", "rewritten")


def _has_rows(path: Path) -> bool:
    try:
        return os.stat(path).st_size > 0
    except OSError:
        return False


@dataclass
class _Verified:
    ident: tuple[int, int]  # the ledger file's (device, inode)
    key: bytes  # the key its rows' MACs were checked with
    prefix: bytes  # its complete rows, as verified


_VERIFIED: dict[str, _Verified] = {}  # ledger path -> the rows a full read last verified (`read`)
_VERIFIED_MAX = 4


def _reuse_verified(path: Path, key: bytes) -> tuple[tuple[int, int], list[Row], bytes] | None:
    """The rows a full read verified before, when the file still starts with exactly those bytes and
    the key is the same: (file identity, the rows parsed again from those bytes, the bytes)."""
    hit = _VERIFIED.get(str(path))
    if hit is None or hit.key != key:
        return None
    try:
        with open(path, "rb") as fh:
            st = os.fstat(fh.fileno())
            if (st.st_dev, st.st_ino) != hit.ident or fh.read(len(hit.prefix)) != hit.prefix:
                return None
    except OSError:
        return None
    rows = []
    for line in hit.prefix.splitlines():
        obj = json.loads(line)
        rows.append(Row(seq=obj["seq"], ts=obj["ts"], type=obj["type"], data=obj["data"], prev=obj["prev"],
                        hash=obj["hash"], mac=obj.get("mac")))
    return hit.ident, rows, hit.prefix


def read(campaign_dir: Path | str, start_offset: int = 0, start_seq: int = 0, start_prev: str = GENESIS, *,
         chain_only: bool = False) -> ReadResult:
    """Read and verify a ledger (or its part from `start_offset`). Raises LedgerError, classified.

    `chain_only`: a published copy of a ledger (a TTB entry's), whose key stays with its campaign:
    the hash chain and the rows are checked, not the MACs or an anchor."""
    d = Path(campaign_dir)
    path = d / LEDGER_NAME
    result = ReadResult(end_offset=start_offset)
    if not os.path.lexists(path):
        return result
    if not path.is_file():
        raise LedgerError(f"{path} is not a regular file", "corrupt")
    if start_offset > 0 and os.stat(path).st_size < start_offset:
        raise LedgerError(f"truncated: {path} is shorter than the {start_offset} bytes already read", "truncated")
    auth = _reader_auth(d, _has_rows(path) or start_seq > 0, chain_only)
    result.authenticated = auth.key is not None
    result.anchor_rows = auth.anchor.rows if auth.anchor is not None else None
    result.note = auth.note
    offset = start_offset
    hash_at: dict[int, str] = {start_seq - 1: start_prev} if start_seq > 0 else {}
    want = auth.anchor.rows - 1 if auth.anchor is not None else -2
    # A full, keyed read reuses the rows it verified last time when the file still starts with the same
    # bytes (compared, not assumed) and the key is the same: those bytes would verify the same way.
    # The anchor is checked against all the rows, as always.
    reuse = _reuse_verified(path, auth.key) if start_offset == 0 and start_seq == 0 and auth.key else None
    ident, seq, prev, raw = None, start_seq, start_prev, None
    if reuse is not None:
        ident, result.rows, reused = reuse
        offset = len(reused)
        seq, prev = len(result.rows), result.rows[-1].hash if result.rows else GENESIS
        if 0 <= want < seq:
            hash_at[want] = result.rows[want].hash
    if start_offset == 0 and start_seq == 0 and auth.key:
        raw = []
    try:
        for item in iter_rows(path, offset, seq, prev, auth, expect_ident=ident, raw=raw):
            if isinstance(item, str):
                result.torn_tail = item
                break
            row, nbytes = item
            result.rows.append(row)
            if row.seq == want:
                hash_at[row.seq] = row.hash
            offset += nbytes
    except _Replaced:
        _VERIFIED.pop(str(path), None)
        return read(campaign_dir, start_offset, start_seq, start_prev, chain_only=chain_only)
    result.end_offset = offset
    _check_anchor(auth, start_seq + len(result.rows), result.torn_tail is not None, hash_at)
    if raw is not None and auth.key:
        _remember_verified(path, auth.key, ident, reuse, raw)
    return result


def _remember_verified(path: Path, key: bytes, ident: tuple[int, int] | None,
                       reuse: tuple[tuple[int, int], list[Row], bytes] | None, raw: list[bytes]) -> None:
    """Keep the bytes of the rows a full read has just verified (and the anchor accepted)."""
    if ident is None:
        try:
            st = os.stat(path)
        except OSError:
            return
        ident = (st.st_dev, st.st_ino)
    prefix = (reuse[2] if reuse is not None else b"") + b"".join(raw)
    if len(prefix) > 64 * 2**20:
        _VERIFIED.pop(str(path), None)
        return
    if str(path) not in _VERIFIED and len(_VERIFIED) >= _VERIFIED_MAX:
        _VERIFIED.pop(next(iter(_VERIFIED)))
    _VERIFIED[str(path)] = _Verified(ident, key, prefix)


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
    if os.path.lexists(path) and not path.is_file():
        raise LedgerError(f"{path} is not a regular file", "corrupt")
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


def _hash_of_row(path: Path, seq: int) -> str | None:
    """The hash of row `seq` (a slow scan; only when the anchor lags behind the file after a crash)."""
    with open(path, "rb") as fh:
        for n, raw in enumerate(fh):
            if n == seq:
                try:
                    return str(json.loads(raw)["hash"])
                except (ValueError, KeyError, TypeError):
                    return None
    return None


class Ledger:
    """A campaign's ledger. Appends are atomic across processes and durable on return."""

    def __init__(self, campaign_dir: Path | str) -> None:
        self.dir = Path(campaign_dir)
        self.path = self.dir / LEDGER_NAME
        self._txn_depth = 0
        self._pending: tuple[bytes, int, str] | None = None  # (key, rows, head) to fsync and anchor at commit

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Ledger]:
        """The rows of one decision, committed together: each `append` inside writes its row (readers see
        it at once: its MAC makes it valid beyond the anchor), and the exit fsyncs the file once and moves
        the anchor once. A SIGKILL inside loses nothing written (the kernel holds it); the exit, even by an
        exception, commits what was written."""
        self._txn_depth += 1
        try:
            yield self
        finally:
            self._txn_depth -= 1
            if self._txn_depth == 0 and self._pending is not None:
                self._commit()

    def _commit(self) -> None:
        assert self._pending is not None
        key, rows, head = self._pending
        self._pending = None
        ap = anchor_path(self.dir)
        with _locked(self.path) as fh:
            os.fsync(fh.fileno())
            anchor = _read_anchor(self.dir, key, ap)
            if anchor is None or anchor.rows < rows:  # another writer may have anchored further already
                _write_anchor(self.dir, key, rows, head, ap)

    def exists(self) -> bool:
        return self.path.exists()

    def append(self, type_: str, data: Mapping[str, Any], *, now: datetime | None = None) -> Row:
        """Validate, chain, MAC, write and fsync one row, then move the anchor; returns the row once durable."""
        payload = dict(data)
        validate_event(type_, payload)
        if not self.dir.is_dir():
            raise LedgerError(f"campaign directory {self.dir} does not exist", "bad_request")
        fresh = not os.path.lexists(self.path)
        if fresh:
            self._check_fresh_start(type_)
        with _locked(self.path) as fh:
            size = _repair_torn_tail(fh, self.path)
            last = _last_line(fh, size)
            kp, ap = auth_paths(self.dir)
            key = self._writer_key(fresh and last is None, last is not None, kp)
            anchor = _read_anchor(self.dir, key, ap)
            if anchor is None:
                if last is not None:
                    raise LedgerError(f"anchor missing: no anchor at {ap}; refusing to append",
                                      "anchor_missing")
                anchor = Anchor(0, GENESIS)
            if last is None:
                if anchor.rows > 0:
                    raise LedgerError(f"truncated: the ledger is empty but its anchor records {anchor.rows} rows; "
                                      "refusing to append", "truncated")
                seq, prev = 0, GENESIS
            else:
                try:
                    obj = json.loads(last)
                    seq, prev = int(obj["seq"]) + 1, str(obj["hash"])
                    mac = obj.get("mac")
                except (ValueError, KeyError, TypeError, RecursionError) as exc:
                    raise LedgerError(f"the ledger's last row is corrupt; refusing to append ({exc})") from None
                if not isinstance(mac, str) or not hmac.compare_digest(mac, row_mac(key, prev)):
                    raise LedgerError("forged: the ledger's last row has no valid MAC; refusing to append", "forged")
                if anchor.rows > seq:
                    raise LedgerError(f"dropped tail: {seq} rows but the anchor records {anchor.rows}; refusing to "
                                      "append", "dropped_tail")
                head = prev if anchor.rows == seq else _hash_of_row(self.path, anchor.rows - 1)
                if head != anchor.head:
                    raise LedgerError(f"rewritten: row {anchor.rows - 1} is not the anchored head; refusing to append",
                                      "rewritten")
            ts = (now or datetime.now(UTC)).isoformat(timespec="microseconds")
            h = row_hash(seq, ts, type_, payload, prev)
            row = Row(seq=seq, ts=ts, type=type_, data=payload, prev=prev, hash=h, mac=row_mac(key, h))
            fh.seek(0, os.SEEK_END)
            fh.write(canonical_line(row))
            fh.flush()
            if self._txn_depth:  # inside a transaction: one fsync and one anchor at its commit
                self._pending = (key, seq + 1, h)
                return row
            os.fsync(fh.fileno())
            _write_anchor(self.dir, key, seq + 1, h, ap)
            if seq == 0:  # where the ledger started, found again by its first row if the directory moves
                with contextlib.suppress(OSError):
                    _write_private(origin_path(h), campaign_id(self.dir).encode() + b"\n")
            return row

    def _check_fresh_start(self, type_: str) -> None:
        """A ledger file that does not exist may start anew, unless its anchor says it was deleted.

        Deleted (refused): the anchor records rows and the directory is the one it was written in.
        Started anew: a `campaign_started` row (a campaign starting here: `attune init`), or a directory
        made again (another campaign). The old key and anchor are kept, renamed `.retired-<time>`."""
        try:
            old = _read_anchor(self.dir, None)
        except LedgerError:
            old = None
        if old is None or old.rows == 0:
            return
        if type_ != "campaign_started" and tuple(old.dir) == tuple(_dir_identity(self.dir)):
            raise LedgerError(f"truncated: {self.path} is gone but its anchor records {old.rows} rows; refusing to "
                              "start a new ledger here with anything but campaign_started", "truncated")
        _retire(self.dir)

    def _writer_key(self, new_ledger: bool, has_rows: bool, kp: Path | None = None) -> bytes:
        """The key to append with (`kp`: its path, when known). A ledger file that did not exist starts
        a new key and anchor."""
        kp = kp or key_path(self.dir)
        if new_ledger:
            return _new_key(self.dir)
        try:
            return _load_key(kp)
        except FileNotFoundError:
            found = _moved_or_copied(self.dir) if has_rows else None
            if found is not None and found[1] is not None:
                return found[0]  # moved: its key was filed under the new path
            if has_rows:
                raise LedgerError(f"key missing: no ledger key at {kp}; refusing to append", "key_missing") from None
            return _new_key(self.dir)  # an empty file (made by hand or a crash before the first row)
        except OSError as exc:
            raise LedgerError(f"the ledger key {kp} cannot be read ({exc.strerror}); refusing to append",
                              "key_missing") from None

    def read(self) -> ReadResult:
        return read(self.dir)

    def rows(self) -> list[Row]:
        return self.read().rows


def adopt(campaign_dir: Path | str, from_dir: Path | str) -> None:
    """File the key and anchor of `from_dir` under `campaign_dir` too (a campaign directory copied
    or moved by its owner). Trusted tooling only: it needs write access to the keys directory."""
    key = _load_key(key_path(from_dir))
    anchor = _read_anchor(Path(from_dir), key)
    if anchor is None:
        raise LedgerError(f"anchor missing: no anchor for {from_dir}", "anchor_missing")
    keys_dir().mkdir(parents=True, exist_ok=True, mode=0o700)
    _write_private(key_path(campaign_dir), key.hex().encode() + b"\n")
    _write_anchor(Path(campaign_dir), key, anchor.rows, anchor.head)


@dataclass
class VerifyReport:
    ok: bool
    rows: int
    torn_tail: bool
    torn_tail_bytes: int
    error: str | None
    last_hash: str | None
    problem: str | None = None  # the LedgerError kind when not ok
    authenticated: bool = False
    anchor_rows: int | None = None
    note: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "rows": self.rows,
            "torn_tail": self.torn_tail,
            "torn_tail_bytes": self.torn_tail_bytes,
            "error": self.error,
            "problem": self.problem,
            "last_hash": self.last_hash,
            "authenticated": self.authenticated,
            "anchor_rows": self.anchor_rows,
            "note": self.note,
        }


def verify(campaign_dir: Path | str, *, chain_only: bool = False) -> VerifyReport:
    """Check the whole chain, the MACs and the anchor. A torn tail is reported but does not fail.
    `chain_only`: see `read`."""
    d = Path(campaign_dir)
    path = d / LEDGER_NAME
    if not os.path.lexists(path):
        msg = f"no ledger at {path}"
        with contextlib.suppress(LedgerError, OSError):
            a = _read_anchor(d, None)
            if a is not None and a.rows > 0:
                msg = f"truncated: the ledger file {path} is gone but its anchor records {a.rows} rows"
                return VerifyReport(False, 0, False, 0, msg, None, "truncated")
        return VerifyReport(False, 0, False, 0, msg, None, "missing")
    try:
        res = read(d, chain_only=chain_only)
    except LedgerError as exc:
        good, last = _count_good(d, chain_only)
        return VerifyReport(False, good, False, 0, str(exc), last, exc.kind)
    except OSError as exc:
        return VerifyReport(False, 0, False, 0, f"cannot read {path}: {exc.strerror}", None, "unreadable")
    last_hash = res.rows[-1].hash if res.rows else None
    torn = res.torn_tail is not None
    return VerifyReport(True, len(res.rows), torn, len(res.torn_tail.encode()) if torn else 0, None, last_hash,
                        None, res.authenticated, res.anchor_rows, res.note)


def _count_good(d: Path, chain_only: bool = False) -> tuple[int, str | None]:
    """How many rows verify (chain and MACs) before the first bad one, and the last good hash."""
    count, last = 0, None
    try:
        auth = _reader_auth(d, True, chain_only)
    except LedgerError:
        auth = _Auth(None, None, None)
    with contextlib.suppress(LedgerError, OSError):
        for item in iter_rows(d / LEDGER_NAME, auth=auth):
            if isinstance(item, str):
                break
            count += 1
            last = item[0].hash
    return count, last
