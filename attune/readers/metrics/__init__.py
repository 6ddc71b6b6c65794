"""The metrics reader: training logs in, a run's measured metrics out.

    parsed = get_parser("megatron-lm").read("runs/r1/log.txt")   # stream the log once
    metrics = analyze(parsed, gpus=8, window=(4, 13))               # score it
    metrics.tokens_per_s_per_gpu, metrics.valid, metrics.failure_class

or in one call, `read_metrics(path, framework=..., gpus=...)`. One parser per framework,
registered under the campaign's framework names; add one by subclassing `LogParser`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from attune.core.vocab import FAILURE_CLASSES
from attune.readers.metrics.analysis import (
    DEFAULT_MAX_SPREAD,
    DEFAULT_WINDOW,
    MetricsInputError,
    RunMetrics,
    analyze,
    parse_window,
)
from attune.readers.metrics.base import LogParser
from attune.readers.metrics.failure import DEFAULT_HANG_AFTER_S
from attune.readers.metrics.megatron import MegatronBridgeParser, MegatronLMParser
from attune.readers.metrics.records import ParsedLog, StepRecord
from attune.readers.metrics.torchtitan import TorchtitanParser

PARSERS: dict[str, type[LogParser]] = {
    cls.framework: cls for cls in (MegatronLMParser, MegatronBridgeParser, TorchtitanParser)
}
FRAMEWORKS = tuple(PARSERS)


def get_parser(framework: str) -> LogParser:
    """A fresh parser for the campaign's framework name."""
    try:
        return PARSERS[framework]()
    except KeyError:
        raise MetricsInputError(
            f"framework: expected one of {', '.join(FRAMEWORKS)}, got {framework!r}"
        ) from None


def read_metrics(
    path: str | os.PathLike[str],
    *,
    framework: str = "megatron-lm",
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
    """Stream one log and score it. Raises MetricsInputError (bad input) or OSError (unreadable log).
    `own_text`: the job's own argument and environment values (signatures inside them do not count)."""
    parsed = get_parser(framework).read(path)
    return analyze(
        parsed,
        gpus=gpus,
        window=window,
        seq_length=seq_length,
        global_batch_size=global_batch_size,
        max_spread=max_spread,
        exit_status=exit_status,
        seconds_since_progress=seconds_since_progress,
        hang_after_s=hang_after_s,
        own_text=own_text,
    )


def read_losses(path: str | os.PathLike[str], framework: str) -> dict[int, float | None]:
    """Iteration -> training loss, read by the framework's own reader (what the gate compares).

    Keyed by the iteration number the log prints, never by position; None for an iteration logged
    without a loss (Megatron drops the field when the loss is NaN); a restarted iteration's last
    value wins. Raises OSError (unreadable log) or MetricsInputError (unknown framework)."""
    parsed = get_parser(framework).read(path)
    return {it: rec.loss for it, rec in parsed.steps.items()}


def read_resolved_args(path: str | os.PathLike[str], framework: str) -> dict[str, str]:
    """The resolved arguments the framework prints at start-up (Megatron's ``---- arguments ----``
    block): attribute name -> printed value, from the first block.

    Raises ValueError when the log has no complete block, and for a framework whose logs print none
    (torchtitan); OSError for an unreadable log."""
    parser = get_parser(framework)
    if parser.block is None:
        raise ValueError(f"{framework} logs print no resolved-arguments block")
    parsed = parser.read(path)
    if not parsed.arguments_complete:
        if not parsed.arguments:
            raise ValueError("no resolved-arguments block ('---- arguments ----') in the log")
        raise ValueError("the resolved-arguments block is not terminated ('---- end of arguments ----')")
    return dict(parsed.arguments)


__all__ = [
    "DEFAULT_HANG_AFTER_S",
    "DEFAULT_MAX_SPREAD",
    "DEFAULT_WINDOW",
    "FAILURE_CLASSES",
    "FRAMEWORKS",
    "PARSERS",
    "LogParser",
    "MetricsInputError",
    "ParsedLog",
    "RunMetrics",
    "StepRecord",
    "analyze",
    "get_parser",
    "parse_window",
    "read_losses",
    "read_metrics",
    "read_resolved_args",
]
