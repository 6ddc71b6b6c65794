"""Failure classes of a training job, from its log, its exit status and its progress.

Classes: ``ok``, ``oom`` (out of memory), ``hang`` (no progress), ``crash``,
``infrastructure``.

Only evidence the job does not control decides (`trusted_signals`): a signature counts where it sits
after the last iteration record (a line followed by more training did not end the run), and not when it
lies inside text the job chose (its own argument values and environment, echoed into the arguments
block or printed by the job). A run that finished its steps and exited 0 is ``ok`` whatever its log
says. The backend's own status (node failure, preemption, Slurm's NODE_FAIL state) is read by the
control plane before the log (`attune.control.plane.Control.classify`).

When several signatures appear, the cause wins over its symptoms:

1. node-level infrastructure (ECC errors, Slurm ``NODE_FAIL``, node failure): a dead node
   takes every other signature with it;
2. out of memory (the GPU's, or the host's when Slurm reports an oom-kill): one rank running out of memory makes its peers' collectives fail or time
   out, so OOM outranks the NCCL errors and hangs it causes;
3. NCCL ``unhandled system error`` (network or host fault, infrastructure);
4. hang: the NCCL watchdog's collective timeout, Slurm's time limit, or no log progress for
   longer than ``hang_after_s``;
5. crash: a non-zero exit status, or (with no exit status) a Python traceback, a segfault, or
   a log that stops before its last iteration;
6. ok.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from attune.readers.metrics.records import Signal

DEFAULT_HANG_AFTER_S = 900.0
MAX_SIGNALS_PER_PATTERN = 3

# (precedence tier, failure class, byte pattern). Lower tier wins.
SIGNATURES: tuple[tuple[int, str, bytes], ...] = (
    (1, "infrastructure", b"NODE_FAIL"),  # Slurm job state
    (1, "infrastructure", b"NODE FAILURE"),  # "... CANCELLED AT ... DUE TO NODE FAILURE"
    (1, "infrastructure", b"ode failure"),  # "node failure", "Node failure"
    (1, "infrastructure", b"ECC error"),
    (2, "oom", b"ut of memory"),  # "CUDA out of memory", "CUDA error: out of memory", "Out of memory"
    (2, "oom", b"oom-kill"),  # Slurm: "slurmstepd: error: Detected 1 oom-kill event(s) ..." (host memory)
    (2, "oom", b"oom_kill"),
    (3, "infrastructure", b"unhandled system error"),
    (4, "hang", b"Watchdog caught collective operation timeout"),
    (4, "hang", b"DUE TO TIME LIMIT"),
    (5, "crash", b"Traceback (most recent call last)"),
    (5, "crash", b"Segmentation fault"),
    (5, "crash", b"ChildFailedError"),
    (5, "crash", b"KeyboardInterrupt"),  # ^C in the training process
    (5, "crash", b"death signal"),  # torchrun: "Received 2 death signal, shutting down workers"
)
# What the scanner searches for: short gates that each cover one or more signatures, so a
# multi-gigabyte log is scanned fewer times; `signals_in_line` then checks the exact patterns.
# Slurm prints its oom-kill and time-limit notices on "slurmstepd: error:" lines, which "rror" selects.
MARKERS: tuple[bytes, ...] = (
    b"rror",  # "ECC error", "unhandled system error", "ChildFailedError", "OutOfMemoryError"
    b"ut of memory",
    b"FAIL",  # "NODE_FAIL", "NODE FAILURE"
    b"ode failure",
    b"Watchdog caught",
    b"TIME LIMIT",
    b"Traceback (most",
    b"Segmentation fault",
    b"KeyboardInterrupt",
    b"death signal",
)
_TIER = {p.decode(): (tier, cls) for tier, cls, p in SIGNATURES}


def signals_in_line(text: str) -> list[tuple[str, str]]:
    """The (failure class, pattern) pairs a line carries."""
    return [(cls, pattern) for pattern, (_, cls) in _TIER.items() if pattern in text]


MIN_OWN_TEXT = 3  # shorter values (a flag's 1, a bool) cannot carry a signature


def _outside_own_text(sig: Signal, own: Sequence[str]) -> bool:
    """Whether the signature is still in its line once every job-controlled string is taken out."""
    text = sig.text
    for value in own:
        text = text.replace(value, "\x00")
    return sig.pattern in text


def trusted_signals(
    signals: Sequence[Signal], *, own_text: Sequence[str] = (), after_line: int | None = None
) -> list[Signal]:
    """The signatures that evidence the job does not control supports.

    `own_text`: strings the job controls (its argument values, its environment's values); a signature
    inside one of them, as echoed into the log, does not count. `after_line`: the line of the last
    iteration record; a signature before it was followed by training and did not end the run."""
    own = [t for t in own_text if len(t) >= MIN_OWN_TEXT]
    out = []
    for sig in signals:
        if after_line is not None and sig.line < after_line:
            continue
        if own and not _outside_own_text(sig, own):
            continue
        out.append(sig)
    return out


def finished_cleanly(exit_status: int | None, last_iteration: int | None, train_iters: int | None) -> bool:
    """The run trained every planned step and exited 0: never a failure, whatever its log prints."""
    return exit_status == 0 and last_iteration is not None and train_iters is not None and last_iteration >= train_iters


@dataclass(frozen=True)
class FailureVerdict:
    failure_class: str
    reason: str
    evidence: tuple[Signal, ...] = ()


def classify(
    signals: Sequence[Signal],
    *,
    exit_status: int | None = None,
    seconds_since_progress: float | None = None,
    hang_after_s: float = DEFAULT_HANG_AFTER_S,
    last_iteration: int | None = None,
    train_iters: int | None = None,
) -> FailureVerdict:
    """Classify a run. ``signals`` are the failure signatures found in its log (`trusted_signals`)."""
    if finished_cleanly(exit_status, last_iteration, train_iters):
        return FailureVerdict("ok", f"trained all {train_iters} iterations and exited 0")
    best: dict[int, list[Signal]] = {}
    for sig in signals:
        tier = _TIER[sig.pattern][0]
        best.setdefault(tier, []).append(sig)

    def pick(tier: int) -> FailureVerdict | None:
        if tier not in best:
            return None
        evidence = tuple(best[tier][:MAX_SIGNALS_PER_PATTERN])
        first = evidence[0]
        return FailureVerdict(first.failure_class, f"log line {first.line}: {first.pattern!r}", evidence)

    for tier in (1, 2, 3):
        verdict = pick(tier)
        if verdict:
            return verdict
    hang = pick(4)
    if hang and exit_status != 0:
        return hang
    if (
        seconds_since_progress is not None
        and seconds_since_progress >= hang_after_s
        and exit_status != 0
    ):
        return FailureVerdict(
            "hang",
            f"no log progress for {seconds_since_progress:.0f} s (limit {hang_after_s:.0f} s)",
        )
    crash = pick(5)
    if exit_status is not None and exit_status != 0:
        return FailureVerdict(
            "crash",
            f"exit status {exit_status}" + (f"; {crash.reason}" if crash else ""),
            crash.evidence if crash else (),
        )
    if exit_status == 0:
        return FailureVerdict("ok", "exit status 0")
    # No exit status: judge from the log alone.
    if crash:
        return crash
    if last_iteration is None:
        return FailureVerdict("crash", "the log has no iteration record and no exit status was given")
    if train_iters is not None and last_iteration < train_iters:
        return FailureVerdict(
            "crash",
            f"the log stops at iteration {last_iteration} of {train_iters} and no exit status was given",
        )
    return FailureVerdict("ok", f"the log reaches its last iteration ({last_iteration})")
