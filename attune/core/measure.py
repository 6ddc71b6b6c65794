"""The measurement rules, as small pure functions.

Standard library only: the hooks fold the ledger into campaign state, and that fold
computes the band, so this module must import quickly and without numpy.

Conventions (the paper's): steps are numbered from 0; step k is logged by Megatron as
iteration k + 1. A 14-step run's measured window is steps 4..13 inclusive, i.e.
iterations 5..14. Throughput is aggregate over the window:

    s(x) = sum(tokens_i) / (GPUs * sum(step_time_i)),  i in window

Summing before dividing keeps short steps from weighing more than long ones.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

DEFAULT_BAND_FLOOR = 0.03
DEFAULT_BAND_K_SIGMA = 3.0
SECONDS_PER_HOUR = 3600.0
EARLY_ABORT_FRACTION = 0.9  # a black-box tuner's run is pruned below 0.9 x the leader ...
EARLY_ABORT_STEPS = 4  # ... once this many measured steps have run
# A clearly lost run is cut sooner: below this fraction of the leader after this many measured steps. A
# quarter below the leader is many times any band a calibration sets (3% floor, k sigma), and the measured
# steps already exclude the warm-up, so two of them cannot bring such a run back within the band.
EARLY_ABORT_CLEAR_FRACTION = 0.75
EARLY_ABORT_CLEAR_STEPS = 2


def window_iterations(start_step: int, end_step: int) -> range:
    """Iteration numbers (1-based, as logged) of the window of steps start..end inclusive (0-based)."""
    if start_step < 0 or end_step < start_step:
        raise ValueError(f"window must satisfy 0 <= start <= end, got {start_step}:{end_step}")
    return range(start_step + 1, end_step + 2)


def windowed_throughput(tokens: Sequence[float], step_times_s: Sequence[float], gpus: int) -> float:
    """Aggregate tokens/s/GPU over a window: sum(tokens) / (GPUs * sum(step times))."""
    if len(tokens) != len(step_times_s):
        raise ValueError("tokens and step times must have the same length")
    if not tokens:
        raise ValueError("the window is empty")
    if gpus <= 0:
        raise ValueError(f"gpus must be positive, got {gpus}")
    total_time = math.fsum(step_times_s)
    if total_time <= 0 or any(t <= 0 or not math.isfinite(t) for t in step_times_s):
        raise ValueError("step times must be positive and finite")
    return math.fsum(tokens) / (gpus * total_time)


def window_step_times(step_times_ms: Mapping[int, float | None], window: tuple[int, int]) -> list[float]:
    """The step times (seconds) logged so far inside the window, in order: `step_times_ms` maps the
    logged iteration (1-based) to its step time in ms; steps without a positive time are skipped."""
    its = window_iterations(*window)
    times = (step_times_ms[i] for i in sorted(step_times_ms) if i in its)
    return [t / 1000.0 for t in times if t is not None and t > 0]


def partial_throughput(step_times_ms: Mapping[int, float | None], window: tuple[int, int], tokens_per_step: float,
                       gpus: int) -> tuple[float, int] | None:
    """(tokens/s/GPU over the window's steps logged so far, how many), or None before the first one."""
    times = window_step_times(step_times_ms, window)
    if not times:
        return None
    return windowed_throughput([float(tokens_per_step)] * len(times), times, gpus), len(times)


@dataclass(frozen=True)
class EarlyAbort:
    """The early-abort pruner (Optuna's pruner shape): given a run's intermediate values so far (its
    throughput over the measured steps logged, and how many) and the floor set from the leader when
    it launched, say whether to stop it now.

    `floor(leader)` is what a black-box tuner's launch records (`prune_below`); `prune(partial, floor)`
    is what the broker's watchdog asks while the run is going."""

    fraction: float = EARLY_ABORT_FRACTION
    min_steps: int = EARLY_ABORT_STEPS
    clear_fraction: float = EARLY_ABORT_CLEAR_FRACTION  # of the leader: below it the run is clearly lost ...
    clear_steps: int = EARLY_ABORT_CLEAR_STEPS  # ... and is cut after this many measured steps

    def floor(self, leader_tokens_per_s_per_gpu: float) -> float:
        return leader_tokens_per_s_per_gpu * self.fraction

    def prune(self, partial: tuple[float, int] | None, floor: float | None) -> bool:
        if floor is None or partial is None:
            return False
        value, steps = partial
        if steps >= self.min_steps and value < floor:
            return True
        # the floor is `fraction` x the leader: the clear-loss line is `clear_fraction` x the same leader
        clear = floor / self.fraction * min(self.clear_fraction, self.fraction) if self.fraction > 0 else 0.0
        return self.clear_steps <= steps < self.min_steps and value < clear

    def reason(self, partial: tuple[float, int], floor: float) -> str:
        return (f"early abort: {partial[0]:.6g} tokens/s/GPU over {partial[1]} measured steps, below the threshold "
                f"{floor:.6g}")


PRUNER = EarlyAbort()


@dataclass(frozen=True)
class Calibration:
    """Statistics of the baseline's calibration runs."""

    n: int
    mean: float
    rel_sigma: float  # sample standard deviation / mean
    band: float  # max(floor, k * rel_sigma)

    def as_dict(self) -> dict[str, float | int]:
        return {"n": self.n, "mean": self.mean, "rel_sigma": self.rel_sigma, "band": self.band}


def relative_sigma(values: Sequence[float]) -> float:
    """Sample (n-1) standard deviation relative to the mean; 0 for a single value."""
    if not values:
        raise ValueError("no values")
    mean = statistics.fmean(values)
    if mean <= 0:
        raise ValueError("throughputs must be positive")
    if len(values) < 2:
        return 0.0
    return statistics.stdev(values) / mean


def band(rel_sigma: float, floor: float = DEFAULT_BAND_FLOOR, k_sigma: float = DEFAULT_BAND_K_SIGMA) -> float:
    """The noise band: max(floor, k * sigma), as a fraction of throughput."""
    return max(floor, k_sigma * rel_sigma)


def calibrate(
    values: Sequence[float], floor: float = DEFAULT_BAND_FLOOR, k_sigma: float = DEFAULT_BAND_K_SIGMA
) -> Calibration:
    """Mean, relative sigma and band of the baseline's calibration throughputs."""
    vals = [float(v) for v in values]
    if any(not math.isfinite(v) or v <= 0 for v in vals):
        raise ValueError("calibration throughputs must be positive and finite")
    rs = relative_sigma(vals)
    return Calibration(n=len(vals), mean=statistics.fmean(vals), rel_sigma=rs, band=band(rs, floor, k_sigma))


# Above this calibration band the machine is too noisy for small gains: `attune status`, `tune`, `demo`
# and the report say so up front (`noise_note`). 10%: the band is 3 sigma of the baseline's run-to-run
# spread, so a band of 10% means a sigma above 3%, several times a quiet cluster's (about 1%).
NOISE_THRESHOLD = 0.10


def noise_note(band_fraction: float | None, threshold: float = NOISE_THRESHOLD) -> dict[str, Any]:
    """The stable `noise` field of status, tune, demo and the report: whether the calibration band is
    wider than `threshold`, and what that means for the gains, in words."""
    noisy = band_fraction is not None and band_fraction > threshold
    return {
        "band": band_fraction, "threshold": threshold, "noisy": noisy,
        "message": (f"on this machine gains below {band_fraction:.1%} cannot be told from noise (calibration "
                    f"band {band_fraction:.1%}, above the {threshold:.0%} threshold)") if noisy else None,
    }


def gain(candidate: float, reference: float) -> float:
    """Relative gain of a throughput over a reference: candidate / reference - 1."""
    if reference <= 0:
        raise ValueError("reference throughput must be positive")
    return candidate / reference - 1.0


def beats(candidate: float, leader: float, band_fraction: float) -> bool:
    """Promotion rule: a candidate leads only if it beats the leader by more than the band."""
    if leader <= 0:
        raise ValueError("leader throughput must be positive")
    return candidate > leader * (1.0 + band_fraction)


def cost_per_million_tokens(tokens_per_s_per_gpu: float, price_per_gpu_hour: float) -> float:
    """Dollars (or the price's unit) per million trained tokens."""
    if tokens_per_s_per_gpu <= 0:
        raise ValueError("throughput must be positive")
    tokens_per_gpu_hour = tokens_per_s_per_gpu * SECONDS_PER_HOUR
    return price_per_gpu_hour / tokens_per_gpu_hour * 1e6


def mfu(flops_per_token: float, tokens_per_s_per_gpu: float, peak_flops_per_s: float) -> float:
    """Model FLOPs utilisation: F x throughput / peak."""
    if peak_flops_per_s <= 0:
        raise ValueError("peak must be positive")
    return flops_per_token * tokens_per_s_per_gpu / peak_flops_per_s


def payback_days(campaign_gpu_hours: float, gpus: int, gain_fraction: float) -> float | None:
    """Days of training on the tuned recipe after which it has saved the campaign's cost.

    campaign GPU-hours / (GPUs * 24 * (1 - 1 / (1 + gain))). None when the gain is not positive:
    such a campaign never pays back.
    """
    if gpus <= 0:
        raise ValueError("gpus must be positive")
    if gain_fraction <= 0:
        return None
    saved_fraction = 1.0 - 1.0 / (1.0 + gain_fraction)
    return campaign_gpu_hours / (gpus * 24.0 * saved_fraction)


def gpu_hours(gpus: int, seconds: float) -> float:
    """The charge of a job: GPUs x (release - admission), in GPU-hours."""
    return gpus * max(0.0, seconds) / SECONDS_PER_HOUR


def coefficient_of_variation(values: Iterable[float]) -> float:
    """Population std / mean of step times (the window's spread)."""
    vals = list(values)
    if not vals:
        return 0.0
    mean = statistics.fmean(vals)
    if mean == 0:
        return 0.0
    return statistics.pstdev(vals) / mean
