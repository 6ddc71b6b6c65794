"""The parser interface and the streaming scanner every parser runs under.

A log can be gigabytes, almost all of it noise (NCCL chatter, warnings from every rank).
The scanner reads the file in large binary blocks and finds the lines worth reading with
`bytes.find` on a few marker strings, so the Python-level work grows with the number of
interesting lines, not with the size of the log. Memory stays at a few blocks plus the
records kept (one per logged iteration).

A parser declares its marker strings, an optional multi-line block (Megatron's arguments
block) and how to read one marked line; the scanner adds the failure signatures of
`attune.readers.metrics.failure` to every parser.
"""

from __future__ import annotations

import os
import re
from abc import ABC, abstractmethod
from typing import ClassVar

from attune.readers.bounded import InputError, check_regular
from attune.readers.metrics import failure
from attune.readers.metrics.records import ParsedLog, Signal

BLOCK_SIZE = 8 * 2**20
MAX_LINE_BYTES = 16 * 2**20  # a "line" longer than this is cut where the block ends
MAX_BLOCK_LINES = 100_000  # lines kept from one multi-line block (an unterminated block stops here)
MAX_SIGNALS = 200

_ANSI = re.compile(r"\x1b\[[0-9;]*m")

_PARSER = 1
_FAILURE = 2
_BLOCK = 4


class LogParser(ABC):
    """Reads one framework's training log. Subclasses set the class attributes and `parse_line`."""

    #: the campaign's framework name, e.g. "megatron-lm"
    framework: ClassVar[str]
    #: substrings that select the lines `parse_line` should see (the pre-filter)
    markers: ClassVar[tuple[bytes, ...]]
    #: start and end markers of a multi-line block whose lines go to `parse_block_line`
    block: ClassVar[tuple[bytes, bytes] | None] = None

    @abstractmethod
    def parse_line(self, line: str, line_no: int, log: ParsedLog) -> None:
        """Record what one marked line says (the line has no newline and no ANSI colour codes)."""

    def parse_block_line(self, line: str, log: ParsedLog) -> None:  # noqa: B027 - optional hook
        """Record one line from inside the multi-line block."""

    def finish(self, log: ParsedLog) -> None:  # noqa: B027 - optional hook
        """Derive the normalised facts (sequence length, batch, layout) once the log is read."""

    def read(self, path: str | os.PathLike[str], *, block_size: int = BLOCK_SIZE) -> ParsedLog:
        """Stream a log file and return what it says."""
        return scan(path, self, block_size=block_size)


def _decode(raw: bytes) -> str:
    text = raw.decode("utf-8", "replace").rstrip("\r")
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    return text


class _Scanner:
    def __init__(self, parser: LogParser, log: ParsedLog) -> None:
        self.parser = parser
        self.log = log
        self.needles: list[tuple[bytes, int]] = [(m, _PARSER) for m in parser.markers]
        self.needles += [(m, _FAILURE) for m in failure.MARKERS]
        if parser.block is not None:
            self.needles.append((parser.block[0], _BLOCK))
        self.block_end = parser.block[1] if parser.block is not None else b""
        self.in_block = False
        self.block_lines = 0
        self.base_line = 0  # lines before the current buffer
        self.end = 0

    def feed(self, data: bytes, end: int) -> None:
        """Handle the complete lines in data[:end] (end is just past a newline, or a forced cut)."""
        self.end = end
        if self.in_block:
            self._continue_block(data, 0, end)
        found: dict[int, list[int]] = {}
        find = data.find
        rfind = data.rfind
        for needle, flag in self.needles:
            pos = find(needle, 0, end)
            while pos != -1:
                start = rfind(b"\n", 0, pos) + 1
                stop = find(b"\n", pos, end)
                if stop == -1:
                    stop = end
                entry = found.get(start)
                if entry is None:
                    found[start] = [stop, flag]
                else:
                    entry[1] |= flag
                pos = find(needle, stop, end)
        counted_to = 0
        line_no = self.base_line
        count = data.count
        for start in sorted(found):
            stop, flags = found[start]
            line_no += count(b"\n", counted_to, start)
            counted_to = start
            self._handle(data, start, stop, flags, line_no + 1)
        self.base_line = line_no + count(b"\n", counted_to, end)
        if end and data[end - 1 : end] != b"\n":
            self.base_line += 1  # a forced cut inside an over-long line

    def _handle(self, data: bytes, start: int, stop: int, flags: int, line_no: int) -> None:
        text = _decode(data[start:stop])
        if flags & _FAILURE:
            self._signals(text, line_no)
        if flags & _PARSER:
            before = (len(self.log.steps), len(self.log.duplicate_iterations))
            self.parser.parse_line(text, line_no, self.log)
            if (len(self.log.steps), len(self.log.duplicate_iterations)) != before:
                self.log.last_step_line = line_no
        if flags & _BLOCK and not self.in_block:
            self.in_block = True
            self.block_lines = 0
            self._continue_block(data, stop + 1, self.end)

    def _continue_block(self, data: bytes, start: int, limit: int) -> None:
        """Hand the block's lines in data[start:limit] to the parser, up to its end marker."""
        end_at = data.find(self.block_end, start, limit) if start < limit else -1
        region_end = data.rfind(b"\n", start, end_at) + 1 if end_at != -1 else limit
        region_end = max(region_end, start)
        for raw in data[start:region_end].split(b"\n"):
            if not raw:
                continue
            if self.block_lines >= MAX_BLOCK_LINES:
                self.log.warn(f"a multi-line block exceeds {MAX_BLOCK_LINES} lines; the rest is ignored")
                self.in_block = False
                return
            self.block_lines += 1
            self.parser.parse_block_line(_decode(raw), self.log)
        if end_at != -1:
            self.in_block = False
            self.log.arguments_complete = True

    def _signals(self, text: str, line_no: int) -> None:
        for cls, pattern in failure.signals_in_line(text):
            n = self.log.signal_counts.get(pattern, 0)
            self.log.signal_counts[pattern] = n + 1
            sig = Signal(cls, pattern, line_no, text[:300])
            if n < failure.MAX_SIGNALS_PER_PATTERN and len(self.log.signals) < MAX_SIGNALS:
                self.log.signals.append(sig)
            elif n >= failure.MAX_SIGNALS_PER_PATTERN:
                # Keep the latest occurrence in the pattern's last slot: where a signature sits matters
                # (one printed early and followed by training is not what ended the run).
                last = max((i for i, s in enumerate(self.log.signals) if s.pattern == pattern), default=None)
                if last is not None:
                    self.log.signals[last] = sig


MAX_LOG_BYTES = 2**30  # a training log larger than this is refused, not streamed for minutes


def scan(path: str | os.PathLike[str], parser: LogParser, *, block_size: int = BLOCK_SIZE) -> ParsedLog:
    """Stream `path` through `parser`. Raises OSError if the file cannot be read."""
    log = ParsedLog(framework=parser.framework, path=os.fspath(path))
    scanner = _Scanner(parser, log)
    carry = b""
    st = check_regular(path, "training log")  # a FIFO or /dev/zero would never end
    if st.st_size > MAX_LOG_BYTES:
        raise InputError(f"training log {path}: {st.st_size} bytes, over the limit of {MAX_LOG_BYTES}")
    with open(path, "rb") as fh:
        while True:
            block = fh.read(block_size)
            if not block:
                break
            log.bytes_read += len(block)
            data = carry + block if carry else block
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                if len(data) < MAX_LINE_BYTES:
                    carry = data
                    continue
                log.warn(f"a line longer than {MAX_LINE_BYTES} bytes was cut")
                cut = len(data)
            scanner.feed(data, cut)
            carry = data[cut:]
    if carry:
        # An unterminated last line: the writer was cut off mid-line. Its fields may be cut
        # too, so it is not read as a record; failure signatures in it still count.
        text = _decode(carry[:4096])
        log.truncated_tail = text[:300]
        log.warn("the log ends in an unterminated line (truncated); that line is not read as a record")
        scanner._signals(text, scanner.base_line + 1)
        scanner.base_line += 1
    if scanner.in_block:
        log.warn("the arguments block has no end marker (truncated log?)")
    log.lines = scanner.base_line
    parser.finish(log)
    return log
