"""Parsers for Megatron-LM and Megatron-Bridge training logs.

Megatron-LM's last rank prints one line per logged iteration, fields joined by ``|``:

    [2026-10-02 11:04:17.123456] iteration 12/ 14 | consumed samples: 24576 |
    elapsed time per iteration (ms): 5312.4 | ... | global batch size: 2048 |
    lm loss: 2.134567E+00 | loss scale: 1.0 | ... | number of nan iterations: 0 |

(one line; the timestamp prefix exists only in recent versions). A loss appears only when
it is >= 0, so a NaN loss is a missing field: records are keyed by the iteration number on
the line, never by position. Data-parallel rank 0 of every model-parallel group prints its
memory, in MiB despite the ``MB`` label:

    [Rank 3] (after 2 iterations) memory (MB) | allocated: 51234.1 | max allocated: ... |

Rank 0 prints the resolved arguments between ``---- arguments ----`` and
``---- end of arguments ----``, one ``name ...... value`` per line.

Megatron-Bridge prints the same iteration line, a ``Step Time : 5.31s GPU utilization: ...``
line (no iteration number, so it is only counted) and memory in GB (1e9 bytes) with
``mem-...-gigabytes`` keys.
"""

from __future__ import annotations

import math
import re

from attune.readers.metrics.base import LogParser
from attune.readers.metrics.records import MIB_PER_GB, ParsedLog, StepRecord

_ITERATION_HEAD = re.compile(r"iteration\s+(?P<it>\d+)\s*/\s*(?P<total>\d+)\s*\|")
_TIMESTAMP = re.compile(r"\[(?P<ts>\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?)\]\s*$")
_MEMORY_HEAD = re.compile(r"\[Rank (?P<rank>\d+)\] \(after (?P<after>\d+) iterations?\) memory \((?P<unit>MB|GB)\)")
_MEMORY_FIELD = re.compile(r"\|\s*(?P<key>[A-Za-z][A-Za-z \-]*?)\s*:\s*(?P<value>[-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)")
_ARGUMENT = re.compile(r"^(?:\d+:\s|\[[^\]]*\]:)?\s*(?P<name>[A-Za-z_]\w*) (?:\.+ | )(?P<value>.*?)\s*$")
_STEP_TIME = re.compile(r"Step Time :\s*(?P<s>[0-9.]+)s")
# What Megatron-Bridge may leave after an iteration line's last "|" (its throughput report, printed
# without a newline of its own when ranks interleave): not a cut field.
_BRIDGE_TRAILER = re.compile(r"(?:Step Time :\s*[0-9.]+s\s*)?GPU utilization:\s*[0-9.]+\s*MODEL_TFLOP/s/GPU")

STEP_TIME_KEY = "elapsed time per iteration (ms)"
LM_LOSS = "lm loss"
# Fields of the iteration line that are not losses.
_KNOWN = {
    "consumed samples",
    "skipped samples",
    STEP_TIME_KEY,
    "throughput per GPU (TFLOP/s/GPU)",
    "energy per GPU (J/iter/GPU)",
    "power per GPU (W/GPU)",
    "learning rate",
    "decoupled learning rate",
    "global batch size",
    "loss scale",
    "grad norm",
    "num zeros",
    "params norm",
    "max attention logit",
    "number of skipped iterations",
    "number of nan iterations",
}
# Memory keys: Megatron-LM (MiB) and Megatron-Bridge (GB).
_MEM_KEYS = {
    "allocated": "allocated",
    "max allocated": "max_allocated",
    "reserved": "reserved",
    "max reserved": "max_reserved",
    "mem-allocated-gigabytes": "allocated",
    "mem-max-allocated-gigabytes": "max_allocated",
    "mem-reserved-gigabytes": "reserved",
    "mem-max-reserved-gigabytes": "max_reserved",
}


def _read_iteration(line: str, head: re.Match[str], line_no: int | None) -> StepRecord:
    rec = StepRecord(iteration=int(head["it"]))
    rest = line[head.end() :]
    # Another rank's output can land inside the line; a field is only trusted when its
    # terminating "|" is there, so cut the line where a foreign record starts.
    foreign = _MEMORY_HEAD.search(rest) if "[Rank " in rest else None
    if foreign is None and rest.count("iteration ") > 1:
        foreign = _ITERATION_HEAD.search(rest)
    if foreign is not None:
        rest = rest[: foreign.start()]
        # A record glued after the line's last "|" leaves the iteration line whole (Megatron-Bridge:
        # another rank's memory report, or its own throughput trailer and then the report).
        after_last = rest.rsplit("|", 1)[-1].strip()
        if after_last and not _BRIDGE_TRAILER.fullmatch(after_last):
            rec.add_problem("another record interleaved into the iteration line", line_no)
    pieces = rest.split("|")
    tail = pieces.pop()  # the text after the last "|": blank on a whole line
    # Megatron writes every field as " key: value |": a field (whole or cut) starts with a blank after
    # its "|". Text glued to the final "|" with no blank is another print that lacked its own newline
    # (Megatron-Bridge's "Number of parameters in transformer layers in billions: ..."), not a cut field.
    glued = bool(tail) and not tail[0].isspace() and len(pieces) > 0
    if tail.strip() and not glued and not _BRIDGE_TRAILER.fullmatch(tail.strip()):
        rec.add_problem(
            f"field {tail.split(':', 1)[0].strip()!r} has no terminating '|' (cut or interleaved)", line_no
        )
    fields: dict[str, str] = {}
    for piece in pieces:
        key, sep, value = piece.partition(":")
        if sep:
            fields[key.strip()] = value
        elif piece.strip():
            rec.add_problem(f"unreadable field {piece.strip()[:60]!r}", line_no)
    try:  # the common case: every field reads as a number
        _assign(rec, fields)
    except ValueError:
        for key, value in list(fields.items()):
            try:
                float(value)
            except ValueError:
                rec.add_problem(f"field {key!r} has a non-numeric value {value.strip()[:40]!r}", line_no)
                del fields[key]
        _assign(rec, fields)
    return rec


def _assign(rec: StepRecord, fields: dict[str, str]) -> None:
    """Set the record's fields from the line's text values; raises ValueError on a non-number."""
    get = fields.get
    if (v := get(STEP_TIME_KEY)) is not None:
        rec.step_time_ms = float(v)
    if (v := get(LM_LOSS)) is not None:
        rec.loss = float(v)
    if (v := get("learning rate")) is not None:
        rec.learning_rate = float(v)
    if (v := get("grad norm")) is not None:
        rec.grad_norm = float(v)
    if (v := get("throughput per GPU (TFLOP/s/GPU)")) is not None:
        rec.tflops_per_gpu = float(v)
    if (v := get("global batch size")) is not None:
        rec.global_batch_size = _as_int(v)
    if (v := get("number of skipped iterations")) is not None:
        rec.skipped_iterations = _as_int(v)
    if (v := get("number of nan iterations")) is not None:
        rec.nan_iterations = _as_int(v)
    extra = fields.keys() - _NOT_EXTRA
    if extra:
        losses = {_shared(k): float(fields[k]) for k in extra if "loss" in k}
        rec.extra_losses = losses or None


def _as_int(value: str) -> int | None:
    x = float(value)
    return _shared(int(x)) if math.isfinite(x) else None


def _shared(value):  # noqa: ANN001, ANN202 - str or int
    """One object per distinct loss name or batch size, shared by every record (memory)."""
    got = _SHARED.get(value)
    if got is None:
        if len(_SHARED) >= 4096:
            return value
        _SHARED[value] = got = value
    return got


_NOT_EXTRA = frozenset(_KNOWN | {LM_LOSS})
_SHARED: dict[object, object] = {}


def _timestamp(line: str, head: re.Match[str]) -> str | None:
    ts = _TIMESTAMP.search(line, max(0, head.start() - 40), head.start())
    return ts["ts"] if ts else None


def parse_memory_line(line: str, log: ParsedLog) -> int:
    """Fold every memory record on the line into `log`; returns how many were read.

    Two ranks' records can share one physical line when their writes interleave, so each
    record runs from its ``[Rank N]`` head to the next head.
    """
    heads = list(_MEMORY_HEAD.finditer(line))
    for i, head in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(line)
        # Megatron-LM's plain keys use binary units whatever the label says (MB = MiB);
        # Megatron-Bridge's "-gigabytes" keys are 1e9 bytes.
        plain = 1024.0 if head["unit"] == "GB" else 1.0
        values: dict[str, float] = {}
        for f in _MEMORY_FIELD.finditer(line, head.end(), end):
            key = f["key"].strip()
            name = _MEM_KEYS.get(key)
            if name is not None:
                values[name] = float(f["value"]) * (MIB_PER_GB if key.endswith("-gigabytes") else plain)
        if values:
            log.add_memory(int(head["rank"]), int(head["after"]), **values)
    return len(heads)


def parse_argument_line(line: str) -> tuple[str, str] | None:
    """``  seq_length ........ 4096`` -> ("seq_length", "4096")."""
    m = _ARGUMENT.match(line)
    if m is None:
        return None
    return m["name"], m["value"]


def _int_arg(log: ParsedLog, name: str) -> int | None:
    raw = log.arguments.get(name)
    if raw is None or raw == "None":
        return None
    try:
        return int(raw)
    except ValueError:
        log.warn(f"argument {name} = {raw!r} is not an integer")
        return None


class MegatronLMParser(LogParser):
    """Megatron-LM logs, with or without the timestamp prefix on the iteration line."""

    framework = "megatron-lm"
    # "iteration" selects both the iteration lines and the "(after N iterations) memory" lines.
    markers = (b"iteration",)
    block = (b"- arguments -", b"end of arguments")

    def parse_line(self, line: str, line_no: int, log: ParsedLog) -> None:
        head = _ITERATION_HEAD.search(line)
        if head is not None:
            log.add_step(_read_iteration(line, head, line_no))
            log.train_iters = int(head["total"])
            log.last_timestamp = _timestamp(line, head) or log.last_timestamp
        if ") memory (" in line:
            parse_memory_line(line, log)

    def parse_block_line(self, line: str, log: ParsedLog) -> None:
        pair = parse_argument_line(line)
        if pair is not None:
            log.arguments.setdefault(pair[0], pair[1])

    def finish(self, log: ParsedLog) -> None:
        log.seq_length = _int_arg(log, "seq_length")
        log.global_batch_size = _int_arg(log, "global_batch_size")
        log.world_size = _int_arg(log, "world_size")
        log.pipeline_parallel_size = _int_arg(log, "pipeline_model_parallel_size")


class MegatronBridgeParser(MegatronLMParser):
    """Megatron-Bridge logs: Megatron's iteration line, ``Step Time`` lines, memory in GB."""

    framework = "megatron-bridge"
    markers = (*MegatronLMParser.markers, b"Step Time :")

    def parse_line(self, line: str, line_no: int, log: ParsedLog) -> None:
        super().parse_line(line, line_no, log)
        if "Step Time :" in line and _STEP_TIME.search(line):
            # The line names no iteration, so it cannot be keyed to one; the iteration
            # line printed with it carries the same time at a finer resolution.
            log.step_time_lines += 1

    def finish(self, log: ParsedLog) -> None:
        super().finish(log)
        if log.step_time_lines and not log.steps:
            log.warn(
                f"{log.step_time_lines} 'Step Time' lines but no iteration lines: steps cannot be "
                "keyed by iteration (is the last rank's output in the log?)"
            )
