"""Megatron-LM's log lines, written the way its `training_log` and `report_memory` print them.

Only the format is Megatron's (field order, separators, widths, number formats, in their 2026
heads as `../shared/reference/megatron.md` describes them); every value comes from the simulator.
The metrics reader (`attune.readers.metrics`) and the gate's log readers parse these lines unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

ARGS_HEAD = "------------------------ arguments ------------------------"
ARGS_TAIL = "-------------------- end of arguments ---------------------"


def timestamp(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def _fmt_arg(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return repr(list(value))
    return str(value)


def arguments_block(resolved: Mapping[str, Any]) -> list[str]:
    lines = [ARGS_HEAD]
    for name in sorted(resolved):
        dots = "." * max(3, 48 - len(name))
        lines.append(f"  {name} {dots} {_fmt_arg(resolved[name])}")
    lines.append(ARGS_TAIL)
    return lines


def iteration_line(
    *,
    epoch_s: float,
    iteration: int,
    train_iters: int,
    gbs: int,
    step_ms: float,
    tflops: float | None,
    lr: float,
    lm_loss: float | None,
    extra_losses: Mapping[str, float] | None = None,
    grad_norm: float = 0.8,
) -> str:
    s = f" [{timestamp(epoch_s)}] iteration {iteration:8d}/{train_iters:8d} |"
    s += f" consumed samples: {iteration * gbs:12d} |"
    s += f" elapsed time per iteration (ms): {step_ms:.1f} |"
    if tflops is not None:
        s += f" throughput per GPU (TFLOP/s/GPU): {tflops:.1f} |"
    s += f" learning rate: {lr:.6E} |"
    s += f" global batch size: {gbs:5d} |"
    if lm_loss is not None:
        s += f" lm loss: {lm_loss:.6E} |"
    for key, value in (extra_losses or {}).items():
        s += f" {key}: {value:.6E} |"
    s += " loss scale: 1.0 |"
    s += f" grad norm: {grad_norm:.3f} |"
    s += " number of skipped iterations:   0 |"
    s += " number of nan iterations:   0 |"
    return s


def memory_line(rank: int, after: int, allocated_mb: float, max_allocated_mb: float, reserved_mb: float,
                max_reserved_mb: float) -> str:
    return (
        f"[Rank {rank}] (after {after} iterations) memory (MB) | allocated: {allocated_mb:.2f} | "
        f"max allocated: {max_allocated_mb:.2f} | reserved: {reserved_mb:.2f} | max reserved: {max_reserved_mb:.2f}"
    )


def parallel_sizes_line(world: int, dp: int, cp: int, tp: int, pp: int) -> str:
    return (
        f"using world size: {world}, data-parallel size: {dp}, context-parallel size: {cp}, "
        f"hierarchical context-parallel sizes: None, tensor-model-parallel size: {tp}, "
        f"pipeline-model-parallel size: {pp}"
    )


def traceback_lines(rank: int, error: str, where: str = "megatron/training/training.py") -> list[str]:
    p = f"[rank{rank}]: "
    return [
        p + "Traceback (most recent call last):",
        p + '  File "pretrain_gpt.py", line 278, in <module>',
        p + "    pretrain(",
        p + f'  File "{where}", line 412, in pretrain',
        p + "    ...",
        p + error,
    ]
