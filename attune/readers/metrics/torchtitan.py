"""Parser for torchtitan training logs.

torchtitan's metrics rank logs one line per logged step through Python logging (the
``[titan] <time> - root - INFO -`` prefix, ANSI colours unless disabled, and ``[rankN]:`` in
front when torchrun tees the ranks' output):

    step: 12  loss:  7.1234  grad_norm:  1.2345  memory: 10.23GiB(12.34%)  tps: 12,345  tflops: 98.76  mfu: 9.99%

``memory`` is the rank's peak reserved memory in GiB since the previous log line, ``tps`` is
tokens per second per device over the interval since the previous log line (rounded to an
integer), ``tflops`` and ``mfu`` derive from it. torchtitan does not print the step time.

What the reader computes from it (with ``metrics.log_freq = 1``, so each line is one step):

* throughput over the window: ``tps_i * G`` is step i's global tokens per second, so with
  T tokens per step, step i took ``T / (tps_i * G)`` seconds and the window's
  ``sum(T) / (G * sum(step times))`` is the harmonic mean of ``tps_i``: it needs neither T
  nor G;
* per-step times: ``T / (tps_i * G)``, only when the tokens per step T (global batch size x
  sequence length) are known, from the start line or from the caller. They inherit the
  rounding of ``tps``.

The start line: versions since early 2025 print ``Trainer is initialized with local batch size
1, global batch size 24, gradient accumulation steps 1, sequence length 4096, total steps 1000
(warmup 2)`` (older ones ``Training starts at step 1, with local batch size ..., ... total steps
N``; newer ones print ``Training starts at step 1`` alone after the first). The total steps
tell the analysis where the run should end, so a run stopped early (``^C``, exit 1, or a log
that just ends) is never valid.

Every rank may print the same step line (``LOG_RANK=0,1,...`` without ``--tee`` rank
prefixes): a repeat of the current step with no rank prefix and no new start line in between is
another rank's copy, used for its memory only, never a restart. A step logged again after a new
start line is a restart.
"""

from __future__ import annotations

import math
import re

from attune.readers.metrics.base import LogParser
from attune.readers.metrics.records import MIB_PER_GIB, ParsedLog, StepRecord

_RANK = re.compile(r"^\[(?:rank|default)(?P<rank>\d+)\]:")
_STEP = re.compile(r"(?<!validate )step:\s*(?P<step>\d+)\s+loss:\s*(?P<loss>[-+]?(?:nan|inf|[\d.]+(?:[eE][-+]?\d+)?))")
_GRAD_NORM = re.compile(r"grad_norm:\s*(?P<v>[-+]?(?:nan|inf|[\d.]+(?:[eE][-+]?\d+)?))")
_MEMORY = re.compile(r"memory:\s*(?P<gib>[\d.]+)GiB\((?P<pct>[\d.]+)%\)")
_TPS = re.compile(r"tps:\s*(?P<v>[\d,]+(?:\.\d+)?)")
_TFLOPS = re.compile(r"tflops:\s*(?P<v>[\d,]+(?:\.\d+)?)")
_START = re.compile(r"(?P<key>local batch size|global batch size|sequence length|total steps|warmup)\s+(?P<v>\d+)")
_START_NAMES = {
    "local batch size": "local_batch_size",
    "global batch size": "global_batch_size",
    "sequence length": "seq_len",
    "total steps": "steps",
    "warmup": "warmup_steps",
}


def _float(text: str) -> float:
    return float(text.replace(",", ""))


class TorchtitanParser(LogParser):
    framework = "torchtitan"
    markers = (b"tps: ", b"Training starts at step", b"Trainer is initialized with")

    def __init__(self) -> None:
        self.metrics_rank: int | None = None
        self.other_rank_lines = 0
        self.copies = 0  # unprefixed repeats of the current step (every rank printing)
        self.init_lines = 0  # "Trainer is initialized with ..." lines (one per start, current versions)
        self.start_lines = 0  # "Training starts at step ..." lines (one per start, every version)
        self.started_at: dict[int, int] = {}  # iteration -> the start count when it was first logged
        self.last_iteration: int | None = None

    def parse_line(self, line: str, line_no: int, log: ParsedLog) -> None:
        m = _RANK.match(line)
        rank = int(m["rank"]) if m else None
        initialized = "Trainer is initialized with" in line
        if initialized or "Training starts at step" in line:
            if initialized:
                self.init_lines += 1
            else:
                self.start_lines += 1
            for f in _START.finditer(line):
                log.arguments[_START_NAMES[f["key"]]] = f["v"]  # a restarted run's own values win
            return
        step = _STEP.search(line)
        if step is None:
            return
        iteration = int(step["step"])
        mem = _MEMORY.search(line)
        memory_mib = float(mem["gib"]) * MIB_PER_GIB if mem else None
        if memory_mib is not None:
            log.add_memory(rank, iteration, max_reserved=memory_mib)
        # Several ranks may log (LOG_RANK=0,1,...): steps come from the first rank seen,
        # the others only add their memory.
        if self.metrics_rank is None:
            self.metrics_rank = rank
        elif rank != self.metrics_rank:
            self.other_rank_lines += 1
            return
        start = self.init_lines or self.start_lines  # which start of the job this line belongs to
        if rank is None and self.started_at.get(iteration) == start and iteration == self.last_iteration:
            self.copies += 1  # the same step from another rank (no prefix tells them apart)
            return
        self.started_at[iteration] = start
        self.last_iteration = iteration
        rec = StepRecord(iteration=iteration, loss=float(step["loss"]), memory_mib=memory_mib)
        if not math.isfinite(rec.loss or 0.0):
            rec.add_problem(f"loss is {rec.loss}", line_no)
        if g := _GRAD_NORM.search(line):
            rec.grad_norm = float(g["v"])
        if t := _TPS.search(line):
            rec.tokens_per_s_per_device = _float(t["v"])
        else:
            rec.add_problem("no tps field", line_no)
        if t := _TFLOPS.search(line, step.end()):
            rec.tflops_per_gpu = _float(t["v"])
        log.add_step(rec)

    def finish(self, log: ParsedLog) -> None:
        args = log.arguments
        log.seq_length = int(args["seq_len"]) if "seq_len" in args else None
        log.global_batch_size = int(args["global_batch_size"]) if "global_batch_size" in args else None
        log.train_iters = int(args["steps"]) if "steps" in args else None
        for rec in log.steps.values():
            rec.global_batch_size = log.global_batch_size
        if self.other_rank_lines:
            log.warn(
                f"{self.other_rank_lines} step lines from ranks other than rank {self.metrics_rank} "
                "were used for memory only"
            )
        if self.copies:
            log.warn(f"{self.copies} step lines repeat the current step without a rank prefix (every rank "
                     "printing); the first of each was read, the others were used for memory only")
