"""Streaming reader for PyTorch profiler (Kineto) trace files, plain or gzipped.

A rank's trace can be gigabytes, so the file is never loaded whole. The reader walks the top
level of the JSON object itself: every key other than ``traceEvents`` is small and decoded as a
value (these are the trace's metadata: ``distributedInfo``, ``deviceProperties``, ...; they may
come before or after the events). The ``traceEvents`` array is cut into batches of complete
elements at ``}, {`` boundaries and each batch is decoded at once by msgspec into typed
``Event`` structs that keep only the fields the analyzer reads.

A cut is only a guess (``}, {`` can occur inside a string or a nested object), but a wrong cut
cannot decode: a prefix of the array that ends inside an element leaves a string unterminated or
a bracket unbalanced. So a batch that fails to decode is retried at an earlier cut and, failing
that, decoded one element at a time with the standard library. Memory stays bounded by the batch
size whatever the file size.
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import msgspec

from attune.core.errors import ReaderError
from attune.readers.bounded import check_regular

__all__ = ["Args", "Event", "TraceFormatError", "TraceReader", "looks_like_trace", "open_binary"]

CHUNK_BYTES = 2 << 20  # read size; a batch holds about this much event text (larger costs memory, not speed)
_MAX_VALUE_BYTES = 256 << 20  # a metadata value larger than this is refused
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_WS = b" \t\r\n"
_TAIL_WINDOW = 1 << 16
_GZIP_MAGIC = b"\x1f\x8b"


class TraceFormatError(ReaderError, ValueError):
    """The file is not a Kineto trace (or is truncated or malformed)."""


class Args(msgspec.Struct, omit_defaults=True):
    """The few ``args`` fields the analyzer reads; every other field is skipped at decode time."""

    stream: int | str | None = None
    correlation: int | None = None
    device: int | str | None = None
    collective: str | None = msgspec.field(default=None, name="Collective name")
    pg_name: str | None = msgspec.field(default=None, name="Process Group Name")
    pg_desc: str | None = msgspec.field(default=None, name="Process Group Description")
    pg_ranks: str | list[int] | None = msgspec.field(default=None, name="Process Group Ranks")
    group_size: int | None = msgspec.field(default=None, name="Group size")


class Event(msgspec.Struct, omit_defaults=True):
    """One trace event with only the fields the analyzer reads."""

    ph: str = ""
    cat: str | None = None
    name: str | None = None
    ts: float | None = None
    dur: float | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    args: Args | None = None


_BATCH_DECODER = msgspec.json.Decoder(list[Event])
_ANY_DECODER = msgspec.json.Decoder()
_RAW_DECODER = json.JSONDecoder()


def open_binary(path: str | Path) -> IO[bytes]:
    """Open a trace for binary reading, decompressing gzip (detected by its magic bytes)."""
    p = Path(path)
    check_regular(p, "trace")  # a FIFO or /dev/zero would never end
    with open(p, "rb") as fh:
        magic = fh.read(2)
    if magic == _GZIP_MAGIC:
        return gzip.open(p, "rb")  # type: ignore[return-value]
    return open(p, "rb")


def looks_like_trace(path: str | Path, probe_bytes: int = 1 << 20) -> bool:
    """Cheap test used when scanning folders: does the file start like a Kineto trace?"""
    try:
        with open_binary(path) as fh:
            head = fh.read(probe_bytes)
    except (OSError, EOFError, gzip.BadGzipFile):
        return False
    stripped = head.lstrip()
    if not stripped.startswith(b"{"):
        return False
    return b'"traceEvents"' in head or b'"schemaVersion"' in head or b'"deviceProperties"' in head


def _convert_loose(items: list[Any]) -> tuple[list[Event], int]:
    """Convert decoded dicts one by one, tolerating odd types; return (events, skipped)."""
    out: list[Event] = []
    skipped = 0
    for item in items:
        try:
            out.append(msgspec.convert(item, Event, strict=False))
        except (msgspec.ValidationError, TypeError):
            try:  # keep the event even when only its args are odd
                if isinstance(item, dict):
                    slim = {k: v for k, v in item.items() if k != "args"}
                    out.append(msgspec.convert(slim, Event, strict=False))
                else:
                    skipped += 1
            except (msgspec.ValidationError, TypeError):
                skipped += 1
    return out, skipped


class TraceReader:
    """Iterate a trace's events in batches; ``metadata`` is complete once iteration ends.

    >>> reader = TraceReader(path)
    >>> for batch in reader.batches(): ...
    >>> reader.metadata["distributedInfo"]
    """

    def __init__(self, path: str | Path, chunk_bytes: int = CHUNK_BYTES) -> None:
        self.path = Path(path)
        self.chunk_bytes = chunk_bytes
        self.metadata: dict[str, Any] = {}
        self.events_read = 0
        self.events_skipped = 0
        self.bytes_read = 0
        self._fh: IO[bytes] | None = None
        self._buf = b""
        self._pos = 0
        self._eof = False

    # -- buffer management -------------------------------------------------------------
    def _fill(self) -> bool:
        """Append the next chunk to the buffer (dropping what was consumed); False at EOF."""
        if self._eof:
            return False
        assert self._fh is not None
        try:
            data = self._fh.read(self.chunk_bytes)
        except (EOFError, gzip.BadGzipFile, OSError) as exc:
            raise TraceFormatError(f"{self.path}: cannot read ({exc})") from exc
        if not data:
            self._eof = True
            return False
        self.bytes_read += len(data)
        self._buf = self._buf[self._pos :] + data
        self._pos = 0
        return True

    def _skip_ws(self) -> None:
        while True:
            buf, pos, n = self._buf, self._pos, len(self._buf)
            while pos < n and buf[pos] in _WS:
                pos += 1
            self._pos = pos
            if pos < n or not self._fill():
                return

    def _peek(self) -> int:
        self._skip_ws()
        if self._pos >= len(self._buf):
            raise TraceFormatError(f"{self.path}: unexpected end of file")
        return self._buf[self._pos]

    def _expect(self, char: bytes) -> None:
        if self._peek() != char[0]:
            got = self._buf[self._pos : self._pos + 20]
            raise TraceFormatError(f"{self.path}: expected {char!r} at byte {self.bytes_read}, got {got!r}")
        self._pos += 1

    def _decode_value(self) -> Any:
        """Decode one complete JSON value at the cursor with the standard library."""
        self._skip_ws()
        window = 1 << 16
        while True:
            avail = len(self._buf) - self._pos
            whole = window >= avail
            text = self._buf[self._pos : self._pos + window].decode("utf-8", errors="surrogateescape")
            error: json.JSONDecodeError | None = None
            try:
                value, end = _RAW_DECODER.raw_decode(text)
            except json.JSONDecodeError as exc:
                error = exc
            # a value that reaches the end of what is buffered may have been cut short
            if error is None and (end < len(text) or (whole and self._eof)):
                self._pos += len(text[:end].encode("utf-8", errors="surrogateescape"))
                return value
            if not whole:
                window *= 4
                continue
            if avail > _MAX_VALUE_BYTES:
                raise TraceFormatError(f"{self.path}: a JSON value is larger than {_MAX_VALUE_BYTES} bytes")
            if not self._fill() and error is not None:
                raise TraceFormatError(f"{self.path}: malformed or truncated JSON ({error.msg})") from error

    # -- the events array --------------------------------------------------------------
    def _decode_batch(self, body: bytes) -> list[Event] | None:
        """Decode ``body`` (complete elements separated by commas); None if it does not parse."""
        framed = b"[" + body + b"]"
        try:
            return _BATCH_DECODER.decode(framed)
        except msgspec.ValidationError:
            pass
        except msgspec.DecodeError:
            return None
        try:
            items = _ANY_DECODER.decode(framed)
        except msgspec.DecodeError:
            return None
        events, skipped = _convert_loose(items if isinstance(items, list) else [])
        self.events_skipped += skipped
        return events

    def _one_element(self) -> Event | None:
        """Decode a single element at the cursor (the slow, always-correct path)."""
        value = self._decode_value()
        events, skipped = _convert_loose([value])
        self.events_skipped += skipped
        return events[0] if events else None

    def _events(self) -> Iterator[list[Event]]:
        """Yield batches until the closing bracket of ``traceEvents`` has been consumed."""
        self._expect(b"[")
        while True:
            # skip separators
            while True:
                c = self._peek()
                if c == ord(","):
                    self._pos += 1
                    continue
                break
            if c == ord("]"):
                self._pos += 1
                return
            if c != ord("{"):
                # not an object: decode and drop it
                self._decode_value()
                self.events_skipped += 1
                continue
            if len(self._buf) - self._pos < self.chunk_bytes and not self._eof:
                self._fill()
            batch = self._cut_batch()
            if batch is None:
                event = self._one_element()
                if event is not None:
                    self.events_read += 1
                    yield [event]
                continue
            if batch:
                self.events_read += len(batch)
                yield batch

    def _cut_batch(self) -> list[Event] | None:
        """Decode as many whole elements as the buffer holds; None when no cut works."""
        buf, start = self._buf, self._pos
        end = len(buf)
        tries = 0
        while tries < 4:
            window_start = max(start, end - _TAIL_WINDOW)
            last = None
            for m in _BOUNDARY.finditer(buf, window_start, end):
                last = m
            if last is None:
                if window_start == start:
                    return None
                end = window_start + 64  # widen the search leftwards
                continue
            cut = last.start() + 1  # just after the element's closing brace
            events = self._decode_batch(buf[start:cut])
            if events is not None:
                self._pos = last.end() - 1  # at the next element's opening brace
                return events
            tries += 1
            end = last.start()
        return None

    # -- the top level -------------------------------------------------------------------
    def batches(self) -> Iterator[list[Event]]:
        """Yield lists of events; fills ``metadata`` with every other top-level key."""
        with open_binary(self.path) as fh:
            self._fh = fh
            try:
                yield from self._walk()
            finally:
                self._fh = None
                self._buf = b""

    def head_metadata(self) -> dict[str, Any]:
        """The metadata keys that come before ``traceEvents`` (Kineto writes them all there)."""
        head: dict[str, Any] = {}
        with open_binary(self.path) as fh:
            self._fh = fh
            try:
                self._fill()
                self._expect(b"{")
                while self._peek() != ord("}"):
                    key = self._decode_value()
                    self._expect(b":")
                    if key == "traceEvents":
                        break
                    head[str(key)] = self._decode_value()
                    if self._peek() == ord(","):
                        self._pos += 1
            finally:
                self._fh = None
                self._buf = b""
                self._pos = 0
                self._eof = False
                self.bytes_read = 0
        return head

    def _walk(self) -> Iterator[list[Event]]:
        self._fill()
        if self._buf.startswith(b"\xef\xbb\xbf"):
            self._pos = 3
        try:
            self._expect(b"{")
        except TraceFormatError:
            raise TraceFormatError(f"{self.path}: not a JSON object (a Kineto trace starts with '{{')") from None
        seen_events = False
        if self._peek() == ord("}"):
            self._pos += 1
        else:
            while True:
                key = self._decode_value()
                if not isinstance(key, str):
                    raise TraceFormatError(f"{self.path}: malformed JSON object key")
                self._expect(b":")
                if key == "traceEvents" and self._peek() == ord("["):
                    seen_events = True
                    yield from self._events()
                else:
                    self.metadata[key] = self._decode_value()
                c = self._peek()
                self._pos += 1
                if c == ord("}"):
                    break
                if c != ord(","):
                    raise TraceFormatError(f"{self.path}: malformed JSON after key {key!r}")
        if not seen_events:
            raise TraceFormatError(f"{self.path}: no traceEvents array (not a PyTorch profiler trace)")
