"""Megatron-LM log lines, in the exact shapes described in shared/reference/megatron.md.

- the arguments block (rank 0, at start-up): every resolved argument, sorted case-insensitively,
  ``  name ........ value`` with dots padding the name to 48 columns;
- the per-iteration line (last rank, every ``--log-interval`` iterations);
- the memory line (``[Rank r] (after k iterations) memory (MB) | allocated: ... | max allocated:
  ... | reserved: ... | max reserved: ...``), values in MiB.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from datetime import datetime

ARGS_HEADER = "------------------------ arguments ------------------------"
ARGS_FOOTER = "-------------------- end of arguments ---------------------"


def arguments_block(args: Mapping[str, object]) -> str:
    lines = [ARGS_HEADER]
    body = []
    for name, value in args.items():
        dots = "." * max(1, 48 - len(name))
        body.append(f"  {name} {dots} {value}")
    lines += sorted(body, key=lambda x: x.lower())
    lines.append(ARGS_FOOTER)
    return "\n".join(lines)


def iteration_line(
    *,
    iteration: int,
    train_iters: int,
    consumed_samples: int,
    elapsed_ms: float,
    learning_rate: float,
    global_batch_size: int,
    losses: Mapping[str, float],
    loss_scale: float,
    grad_norm: float | None,
    skipped_iterations: int,
    nan_iterations: int,
    tflops_per_gpu: float | None = None,
    now: datetime | None = None,
) -> str:
    """One training-log line. A loss is printed only when it is > 0 (NaN and 0 disappear)."""
    ts = (now or datetime.now()).strftime("%Y-%m-%d %H:%M:%S.%f")
    s = f" [{ts}] iteration {iteration:8d}/{train_iters:8d} |"
    s += f" consumed samples: {consumed_samples:12d} |"
    s += f" elapsed time per iteration (ms): {elapsed_ms:.1f} |"
    if tflops_per_gpu is not None:
        s += f" throughput per GPU (TFLOP/s/GPU): {tflops_per_gpu:.1f} |"
    s += f" learning rate: {learning_rate:.6E} |"
    s += f" global batch size: {global_batch_size:5d} |"
    for key, value in losses.items():
        if value > 0.0:  # False for NaN as well
            s += f" {key}: {value:.6E} |"
    s += f" loss scale: {loss_scale:.1f} |"
    if grad_norm is not None and math.isfinite(grad_norm):
        s += f" grad norm: {grad_norm:.3f} |"
    s += f" number of skipped iterations: {skipped_iterations:3d} |"
    s += f" number of nan iterations: {nan_iterations:3d} |"
    return s


def memory_line(rank: int, iteration: int, allocated: float, max_allocated: float, reserved: float,
                max_reserved: float) -> str:
    return (
        f"[Rank {rank}] (after {iteration} iterations) memory (MB)"
        f" | allocated: {allocated:.2f} | max allocated: {max_allocated:.2f}"
        f" | reserved: {reserved:.2f} | max reserved: {max_reserved:.2f}"
    )


def emit(line: str) -> None:
    """Write whole lines in one call so lines from concurrent ranks do not interleave."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
