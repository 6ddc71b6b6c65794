"""From a parsed log to a run's metrics: windowed throughput, validity, memory, losses, failure.

The measurement rules are `attune.core.measure`'s: steps are numbered from 0 and step k is
iteration k + 1; the window (default steps 4..13) is scored by
``sum(tokens) / (GPUs * sum(step times))``; the window's spread is the coefficient of
variation of its step times.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from attune.core import measure
from attune.core.errors import ReaderError
from attune.readers.metrics.failure import DEFAULT_HANG_AFTER_S, FailureVerdict, classify, trusted_signals
from attune.readers.metrics.records import MemoryReport, ParsedLog, StepRecord

DEFAULT_WINDOW = (4, 13)
DEFAULT_MAX_SPREAD = 0.10


class MetricsInputError(ReaderError, ValueError):
    """The caller's input cannot be scored (bad window, GPU count, missing sequence length)."""


def parse_window(text: str) -> tuple[int, int]:
    """``"4:13"`` -> (4, 13): steps counted from 0, both ends included."""
    start, sep, end = text.partition(":")
    try:
        if not sep:
            raise ValueError
        window = (int(start), int(end))
        measure.window_iterations(*window)
    except ValueError:
        raise MetricsInputError(
            f"window: expected START:END with 0 <= START <= END (steps from 0, inclusive), got {text!r}"
        ) from None
    return window


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def _ranges(values: list[int]) -> str:
    """[5, 6, 7, 10] -> '5-7, 10'."""
    runs: list[list[int]] = []
    for v in sorted(values):
        if runs and v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


@dataclass
class RunMetrics:
    """What `attune metrics` reports about one run. `to_dict` is the stable JSON shape."""

    log: str
    framework: str
    gpus: int
    window: tuple[int, int]
    seq_length: int | None
    seq_length_source: str | None
    tokens_per_s_per_gpu: float | None
    valid: bool
    invalid_reasons: list[str]
    window_spread: float | None
    max_spread: float
    window_step_time_ms: dict[str, float] | None
    step_time_source: str | None
    verdict: FailureVerdict
    last_iteration: int | None
    train_iters: int | None
    steps: list[StepRecord]
    seq_for_tokens: int | None
    memory_per_rank: list[MemoryReport]
    ranks_per_stage: int | None
    arguments: dict[str, str]
    arguments_complete: bool
    warnings: list[str] = field(default_factory=list)
    bytes_read: int = 0
    lines: int = 0
    derived_step_times: dict[int, float] = field(default_factory=dict)

    @property
    def failure_class(self) -> str:
        return self.verdict.failure_class

    @property
    def window_iterations(self) -> range:
        return measure.window_iterations(*self.window)

    def step(self, iteration: int) -> StepRecord | None:
        for rec in self.steps:
            if rec.iteration == iteration:
                return rec
        return None

    def step_time_ms(self, rec: StepRecord) -> float | None:
        if rec.step_time_ms is not None:
            return rec.step_time_ms
        return self.derived_step_times.get(rec.iteration)

    def losses(self) -> list[tuple[int, float | None]]:
        """The loss curve: (iteration, loss) for every logged iteration; None where it is NaN or missing."""
        return [(r.iteration, _finite(r.loss)) for r in self.steps]

    # -- JSON ---------------------------------------------------------------------------
    def step_dict(self, rec: StepRecord) -> dict[str, Any]:
        its = self.window_iterations
        gbs = rec.global_batch_size
        out: dict[str, Any] = {
            "iteration": rec.iteration,
            "step": rec.iteration - 1,
            "in_window": rec.iteration in its,
            "step_time_ms": _finite(self.step_time_ms(rec)),
            "loss": _finite(rec.loss),
            "global_batch_size": gbs,
            "tokens": gbs * self.seq_for_tokens if gbs is not None and self.seq_for_tokens else None,
        }
        optional = {
            "extra_losses": {k: _finite(v) for k, v in rec.extra_losses.items()} if rec.extra_losses else None,
            "skipped_iterations": rec.skipped_iterations,
            "nan_iterations": rec.nan_iterations,
            "learning_rate": rec.learning_rate,
            "grad_norm": _finite(rec.grad_norm),
            "tflops_per_gpu": rec.tflops_per_gpu,
            "tokens_per_s_per_device": rec.tokens_per_s_per_device,
            "memory_mib": rec.memory_mib,
            "problems": rec.problems,
        }
        out.update({k: v for k, v in optional.items() if v is not None})
        return out

    def memory_dict(self) -> dict[str, Any]:
        per_rank = []
        stages: dict[int, dict[str, Any]] = {}
        for m in self.memory_per_rank:
            stage = m.rank // self.ranks_per_stage if self.ranks_per_stage and m.rank is not None else None
            per_rank.append(
                {
                    "rank": m.rank,
                    "stage": stage,
                    "after_iterations": m.after_iterations,
                    "allocated_mib": m.allocated_mib,
                    "max_allocated_mib": m.max_allocated_mib,
                    "reserved_mib": m.reserved_mib,
                    "max_reserved_mib": m.max_reserved_mib,
                }
            )
            if stage is not None:
                s = stages.setdefault(
                    stage, {"stage": stage, "ranks": [], "max_allocated_mib": None, "max_reserved_mib": None}
                )
                s["ranks"].append(m.rank)
                for key in ("max_allocated_mib", "max_reserved_mib"):
                    value = getattr(m, key)
                    if value is not None and (s[key] is None or value > s[key]):
                        s[key] = value
        peaks = {
            key: max((getattr(m, key) for m in self.memory_per_rank if getattr(m, key) is not None), default=None)
            for key in ("max_allocated_mib", "max_reserved_mib")
        }
        return {
            "unit": "MiB",
            "per_rank": per_rank,
            "per_stage": [stages[k] for k in sorted(stages)] if stages else None,
            "peak_max_allocated_mib": peaks["max_allocated_mib"],
            "peak_max_reserved_mib": peaks["max_reserved_mib"],
        }

    def loss_dict(self) -> dict[str, Any]:
        curve = self.losses()
        finite = [(i, v) for i, v in curve if v is not None]
        window = [v for i, v in finite if i in self.window_iterations]
        return {
            "first": {"iteration": finite[0][0], "value": finite[0][1]} if finite else None,
            "last": {"iteration": finite[-1][0], "value": finite[-1][1]} if finite else None,
            "window_mean": statistics.fmean(window) if window else None,
            "missing_or_nan_iterations": [i for i, v in curve if v is None],
        }

    def to_dict(self, *, steps: bool = True, arguments: bool = True) -> dict[str, Any]:
        start, end = self.window
        its = self.window_iterations
        out: dict[str, Any] = {
            "log": self.log,
            "framework": self.framework,
            "gpus": self.gpus,
            "window": {"start_step": start, "end_step": end, "first_iteration": its[0], "last_iteration": its[-1]},
            "seq_length": self.seq_length,
            "seq_length_source": self.seq_length_source,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "valid": self.valid,
            "invalid_reasons": list(self.invalid_reasons),
            "window_spread": self.window_spread,
            "max_spread": self.max_spread,
            "window_step_time_ms": self.window_step_time_ms,
            "step_time_source": self.step_time_source,
            "failure_class": self.verdict.failure_class,
            "failure_reason": self.verdict.reason,
            "failure_evidence": [
                {"class": s.failure_class, "pattern": s.pattern, "line": s.line, "text": s.text}
                for s in self.verdict.evidence
            ],
            "last_iteration": self.last_iteration,
            "train_iters": self.train_iters,
            "loss": self.loss_dict(),
            "memory": self.memory_dict(),
            "arguments_complete": self.arguments_complete,
            "argument_count": len(self.arguments),
            "warnings": list(self.warnings),
            "bytes_read": self.bytes_read,
            "lines": self.lines,
        }
        if steps:
            out["steps"] = [self.step_dict(r) for r in self.steps]
        if arguments:
            out["arguments"] = dict(self.arguments)
        return out


def _log_interval(log: ParsedLog) -> int:
    """Iterations between log lines: the log's own `log_interval`, else the commonest gap, else 1."""
    raw = log.arguments.get("log_interval")
    if raw is not None and raw.isdigit() and int(raw) > 0:
        return int(raw)
    its = sorted(log.steps)
    gaps = Counter(b - a for a, b in zip(its, its[1:], strict=False) if b > a)
    return gaps.most_common(1)[0][0] if gaps else 1


def _check_options(
    gpus: int, max_spread: float, window: tuple[int, int], seq_length: int | None, global_batch_size: int | None
) -> range:
    """The caller's options checked; returns the window's iterations."""
    if not isinstance(gpus, int) or gpus <= 0:
        raise MetricsInputError(f"gpus: expected a positive integer, got {gpus!r}")
    if not (isinstance(max_spread, int | float) and max_spread >= 0):
        raise MetricsInputError(f"max_spread: expected a non-negative number, got {max_spread!r}")
    try:
        its = measure.window_iterations(*window)
    except (TypeError, ValueError):
        raise MetricsInputError(f"window: expected (start, end) with 0 <= start <= end, got {window!r}") from None
    for name, value in (("seq_length", seq_length), ("global_batch_size", global_batch_size)):
        if value is not None and (not isinstance(value, int) or value <= 0):
            raise MetricsInputError(f"{name}: expected a positive integer, got {value!r}")
    return its


def _sequence_length(log: ParsedLog, seq_length: int | None) -> tuple[int | None, str | None]:
    """The log's own arguments win; a caller's value must agree with them. Returns (value, source)."""
    if log.seq_length is not None:
        if seq_length is not None and seq_length != log.seq_length:
            raise MetricsInputError(
                f"seq_length: {seq_length} was given but the log's arguments say {log.seq_length}"
            )
        return log.seq_length, "log"
    if seq_length is not None:
        return seq_length, "option"
    return None, None


def _derived_step_times(
    steps: list[StepRecord], global_batch_size: int | None, seq: int | None, gpus: int
) -> dict[int, float]:
    """Step times (ms) derived from tokens/s where a log has no step time; fills a missing global
    batch size in with the caller's."""
    derived: dict[int, float] = {}
    for rec in steps:
        if rec.global_batch_size is None and global_batch_size is not None:
            rec.global_batch_size = global_batch_size
        gbs = rec.global_batch_size
        if rec.step_time_ms is None and rec.tokens_per_s_per_device and gbs and seq:
            # torchtitan: step time = tokens per step / (tps x GPUs)
            derived[rec.iteration] = gbs * seq / (rec.tokens_per_s_per_device * gpus) * 1000.0
    return derived


def _window_samples(
    window_recs: list[StepRecord], derived: dict[int, float], seq: int | None, gpus: int, reasons: list[str]
) -> tuple[list[float], list[float], set[str]]:
    """(tokens per step, step seconds, the kinds of step time) over the window; appends what is wrong."""
    tokens: list[float] = []
    times_s: list[float] = []
    kinds: set[str] = set()
    for rec in window_recs:
        gbs = rec.global_batch_size
        if rec.step_time_ms is not None:
            if seq is None:
                raise MetricsInputError(
                    "seq_length: the log has no arguments block with seq_length; pass the sequence "
                    "length (--seq-length) to count tokens per step"
                )
            if gbs is None:
                reasons.append(f"iteration {rec.iteration} has no global batch size")
            elif not (math.isfinite(rec.step_time_ms) and rec.step_time_ms > 0):
                reasons.append(f"iteration {rec.iteration} has step time {rec.step_time_ms} ms")
            else:
                kinds.add("logged")
                tokens.append(gbs * seq)
                times_s.append(rec.step_time_ms / 1000.0)
        elif rec.iteration in derived:
            kinds.add("derived_from_tps")
            tokens.append(gbs * seq)  # type: ignore[operator]
            times_s.append(derived[rec.iteration] / 1000.0)
        elif rec.tokens_per_s_per_device:
            # Tokens per step unknown: nominal tokens of 1 per step; the windowed throughput,
            # the harmonic mean of tps, does not depend on them.
            kinds.add("tps_only")
            tokens.append(1.0)
            times_s.append(1.0 / (rec.tokens_per_s_per_device * gpus))
        elif not rec.problems:  # a damaged record is reported once, with its problems
            reasons.append(f"iteration {rec.iteration} has no step time")
    return tokens, times_s, kinds


def _step_health(window_recs: list[StepRecord], reasons: list[str]) -> None:
    """Per-step health inside the window: damaged, skipped, NaN or loss-less iterations."""
    for rec in window_recs:
        if rec.problems:
            reasons.append(f"iteration {rec.iteration}: " + "; ".join(rec.problems))
        if rec.skipped_iterations:
            reasons.append(f"iteration {rec.iteration} was skipped ({rec.skipped_iterations} skipped)")
        if rec.nan_iterations:
            reasons.append(f"iteration {rec.iteration} had NaN ({rec.nan_iterations} nan iterations)")
        if rec.problems:
            continue  # reported above, with what could not be read
        if rec.loss is None:
            reasons.append(f"iteration {rec.iteration} has no loss (NaN or negative loss)")
        elif not math.isfinite(rec.loss):
            reasons.append(f"iteration {rec.iteration} loss is {rec.loss}")


def _window_figures(
    tokens: list[float], times_s: list[float], kinds: set[str], gpus: int, max_spread: float, reasons: list[str]
) -> tuple[str | None, float | None, float | None, dict[str, float] | None]:
    """(step-time source, windowed throughput, step-time spread, step-time stats) of the window's samples."""
    if len(kinds) > 1:
        reasons.append(f"window mixes step-time sources {sorted(kinds)}; no throughput")
        tokens, times_s = [], []
    kind = next(iter(kinds)) if len(kinds) == 1 else None
    throughput = measure.windowed_throughput(tokens, times_s, gpus) if tokens else None

    spread = measure.coefficient_of_variation(times_s) if times_s else None
    step_stats = None
    if times_s and kind != "tps_only":
        ms = [t * 1000.0 for t in times_s]
        step_stats = {"mean": statistics.fmean(ms), "min": min(ms), "max": max(ms)}
    if spread is not None and spread > max_spread:
        reasons.append(f"window step-time spread {spread:.3f} exceeds {max_spread:.3f}")
    return kind, throughput, spread, step_stats


def _end_reasons(log: ParsedLog, verdict: FailureVerdict, last: StepRecord | None, reasons: list[str]) -> None:
    """A failed or incomplete run, first among the reasons."""
    train_iters = log.train_iters
    if verdict.failure_class != "ok":
        reasons.insert(0, f"the run failed: {verdict.failure_class} ({verdict.reason})")
    if last is not None and train_iters is not None and train_iters - last.iteration >= _log_interval(log):
        # Never valid, whatever the exit status says (an interrupted run can exit 0 or 1). A log
        # written every N iterations may end up to N - 1 iterations before the last one.
        reasons.insert(1 if verdict.failure_class != "ok" else 0,
                       f"the run is incomplete: its log stops at iteration {last.iteration} of {train_iters}")


def analyze(
    log: ParsedLog,
    *,
    gpus: int,
    window: tuple[int, int] = DEFAULT_WINDOW,
    seq_length: int | None = None,
    global_batch_size: int | None = None,
    max_spread: float = DEFAULT_MAX_SPREAD,
    exit_status: int | None = None,
    seconds_since_progress: float | None = None,
    hang_after_s: float = DEFAULT_HANG_AFTER_S,
    own_text: Sequence[str] = (),
) -> RunMetrics:
    """Score a parsed log. Raises MetricsInputError on input that cannot be scored.

    `own_text`: the job's own argument and environment values; failure signatures inside them do not
    count (`failure.trusted_signals`)."""
    its = _check_options(gpus, max_spread, window, seq_length, global_batch_size)
    seq, seq_source = _sequence_length(log, seq_length)

    if log.world_size is not None and log.world_size != gpus:
        raise MetricsInputError(f"gpus: {gpus} was given but the log's arguments say world_size {log.world_size}")

    steps = [log.steps[i] for i in sorted(log.steps)]
    reasons: list[str] = []
    window_recs = [log.steps[i] for i in its if i in log.steps]
    missing = [i for i in its if i not in log.steps]
    if missing:
        reasons.append(f"window iterations missing from the log: {_ranges(missing)}")

    # Tokens per step and step times over the window.
    derived = _derived_step_times(steps, global_batch_size, seq, gpus)
    tokens, times_s, kinds = _window_samples(window_recs, derived, seq, gpus, reasons)
    time_source, throughput, spread, step_stats = _window_figures(tokens, times_s, kinds, gpus, max_spread, reasons)

    # Per-step health inside the window.
    dup = sorted(set(log.duplicate_iterations) & set(its))
    if dup:
        reasons.append(f"iterations logged more than once (a restart?): {_ranges(dup)}")
    _step_health(window_recs, reasons)

    last = steps[-1] if steps else None
    train_iters = log.train_iters
    verdict = classify(
        trusted_signals(log.signals, own_text=own_text, after_line=log.last_step_line),
        exit_status=exit_status,
        seconds_since_progress=seconds_since_progress,
        hang_after_s=hang_after_s,
        last_iteration=last.iteration if last else None,
        train_iters=train_iters,
    )
    _end_reasons(log, verdict, last, reasons)

    world = log.world_size or gpus
    pp = log.pipeline_parallel_size
    ranks_per_stage = world // pp if pp and world % pp == 0 else None
    memory = sorted(log.memory.values(), key=lambda m: (m.rank is None, m.rank or 0))

    return RunMetrics(
        log=log.path,
        framework=log.framework,
        gpus=gpus,
        window=(window[0], window[1]),
        seq_length=seq,
        seq_length_source=seq_source,
        tokens_per_s_per_gpu=throughput,
        valid=not reasons,
        invalid_reasons=reasons,
        window_spread=spread,
        max_spread=float(max_spread),
        window_step_time_ms=step_stats,
        step_time_source=time_source,
        verdict=verdict,
        last_iteration=last.iteration if last else None,
        train_iters=train_iters,
        steps=steps,
        seq_for_tokens=seq,
        memory_per_rank=memory,
        ranks_per_stage=ranks_per_stage,
        arguments=log.arguments,
        arguments_complete=log.arguments_complete,
        warnings=list(log.warnings),
        bytes_read=log.bytes_read,
        lines=log.lines,
        derived_step_times=derived,
    )
