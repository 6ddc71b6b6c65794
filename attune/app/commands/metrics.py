"""`attune metrics LOG --gpus N`: score one training log (throughput, validity, failure class)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from attune.core.errors import EXIT_FAILED, EXIT_OK, UsageError
from attune.core.output import add_json_flag, emit_json
from attune.readers.bounded import InputError


def register(subparsers: Any) -> None:
    from attune.readers.metrics import DEFAULT_HANG_AFTER_S, DEFAULT_MAX_SPREAD, FRAMEWORKS

    p = subparsers.add_parser(
        "metrics",
        help="score a training log: windowed throughput, validity, memory, losses, failure class",
        description=(
            "Stream a training log and report the run's throughput over the measured window, "
            "whether the measurement is valid, per-rank and per-stage memory, the loss curve and "
            "the failure class. Exit 0: a valid measurement; 1: invalid or failed run; 2: bad input."
        ),
    )
    p.add_argument("log", metavar="LOG", help="the job's log (stdout and stderr)")
    p.add_argument("--gpus", type=int, required=True, help="GPUs the job ran on")
    p.add_argument("--framework", choices=FRAMEWORKS, default="megatron-lm", help="log format (default megatron-lm)")
    p.add_argument(
        "--seq-length",
        type=int,
        help="sequence length, when the log has no arguments block (must agree with it otherwise)",
    )
    p.add_argument(
        "--global-batch-size",
        type=int,
        help="global batch size, for logs whose step lines do not carry it (torchtitan)",
    )
    p.add_argument(
        "--window",
        default="4:13",
        help="measured steps START:END, counted from 0, inclusive (default 4:13 = iterations 5-14)",
    )
    p.add_argument(
        "--max-spread",
        type=float,
        default=DEFAULT_MAX_SPREAD,
        help=f"largest valid coefficient of variation of the window's step times (default {DEFAULT_MAX_SPREAD})",
    )
    p.add_argument("--exit-status", type=int, help="the job's exit status, if known")
    p.add_argument(
        "--seconds-since-progress",
        type=float,
        help="seconds since the log last grew, for a job still running (hang detection)",
    )
    p.add_argument(
        "--hang-after",
        type=float,
        default=DEFAULT_HANG_AFTER_S,
        help=f"seconds without progress that count as a hang (default {DEFAULT_HANG_AFTER_S:.0f})",
    )
    p.add_argument("--no-steps", action="store_true", help="leave the per-step records out of --json")
    p.add_argument("--no-arguments", action="store_true", help="leave the arguments block out of --json")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from attune.readers.metrics import MetricsInputError, parse_window, read_metrics

    try:
        window = parse_window(args.window)
        if args.gpus <= 0:
            raise MetricsInputError(f"--gpus: expected a positive integer, got {args.gpus}")
        if args.hang_after <= 0:
            raise MetricsInputError(f"--hang-after: expected a positive number of seconds, got {args.hang_after}")
        if os.path.isdir(args.log):
            raise IsADirectoryError(args.log)
        metrics = read_metrics(
            args.log,
            framework=args.framework,
            gpus=args.gpus,
            window=window,
            seq_length=args.seq_length,
            global_batch_size=args.global_batch_size,
            max_spread=args.max_spread,
            exit_status=args.exit_status,
            seconds_since_progress=args.seconds_since_progress,
            hang_after_s=args.hang_after,
        )
    except FileNotFoundError:
        raise UsageError(f"LOG: no such file: {args.log}") from None
    except (MetricsInputError, InputError) as exc:
        raise UsageError(str(exc)) from None
    except IsADirectoryError:
        raise UsageError(f"LOG: is a directory, expected a log file: {args.log}") from None
    except OSError as exc:
        raise UsageError(f"LOG: cannot read {args.log}: {exc.strerror or exc}") from None

    if args.json:
        emit_json(metrics.to_dict(steps=not args.no_steps, arguments=not args.no_arguments))
    else:
        _print_text(metrics)
    return EXIT_OK if metrics.valid else EXIT_FAILED


def _print_text(m: Any) -> None:
    out = sys.stdout
    start, end = m.window
    its = m.window_iterations
    tput = f"{m.tokens_per_s_per_gpu:,.1f} tokens/s/GPU" if m.tokens_per_s_per_gpu is not None else "n/a"
    out.write(f"{m.log} ({m.framework}, {m.gpus} GPUs)\n")
    out.write(f"  throughput   {tput} over steps {start}-{end} (iterations {its[0]}-{its[-1]})\n")
    spread = f"{m.window_spread:.3f}" if m.window_spread is not None else "n/a"
    out.write(f"  valid        {'yes' if m.valid else 'no'} (spread {spread}, max {m.max_spread:.3f})\n")
    for reason in m.invalid_reasons:
        out.write(f"    - {reason}\n")
    out.write(f"  failure      {m.failure_class}: {m.verdict.reason}\n")
    mem = m.memory_dict()
    if mem["peak_max_allocated_mib"] is not None or mem["peak_max_reserved_mib"] is not None:
        out.write(
            f"  memory peak  allocated {mem['peak_max_allocated_mib']} MiB, reserved {mem['peak_max_reserved_mib']} MiB\n"
        )
    loss = m.loss_dict()
    if loss["last"]:
        out.write(f"  loss         {loss['first']['value']:.4f} -> {loss['last']['value']:.4f}\n")
    for w in m.warnings:
        out.write(f"  warning      {w}\n")
