from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attune.core import measure


def test_windowed_throughput_sums_before_dividing() -> None:
    # Two steps of 1s and 3s at 1000 tokens each on 2 GPUs: 2000 / (2 * 4) = 250, not the mean of rates.
    assert measure.windowed_throughput([1000, 1000], [1.0, 3.0], 2) == pytest.approx(250.0)
    mean_of_rates = (1000 / 1.0 + 1000 / 3.0) / 2 / 2
    assert mean_of_rates != pytest.approx(250.0)


@pytest.mark.parametrize(
    ("tokens", "times", "gpus"),
    [([], [], 1), ([1], [1.0, 2.0], 1), ([1], [0.0], 1), ([1], [1.0], 0), ([1], [math.nan], 1)],
)
def test_windowed_throughput_rejects_bad_input(tokens: list[float], times: list[float], gpus: int) -> None:
    with pytest.raises(ValueError):
        measure.windowed_throughput(tokens, times, gpus)


def test_window_iterations_maps_steps_to_logged_iterations() -> None:
    assert list(measure.window_iterations(4, 13)) == list(range(5, 15))
    with pytest.raises(ValueError):
        measure.window_iterations(5, 4)


def test_band_floor_and_sigma() -> None:
    # Paper Table D1: sigma 1.29% gives band 3.87%; sigma 0.49% gives the 3% floor.
    assert measure.band(0.0129) == pytest.approx(0.0387)
    assert measure.band(0.0049) == pytest.approx(0.03)
    cal = measure.calibrate([100.0, 101.0, 99.0, 100.5, 99.5])
    assert cal.n == 5 and cal.mean == pytest.approx(100.0)
    assert cal.rel_sigma == pytest.approx(0.0079057, rel=1e-4)  # sample std / mean
    assert cal.band == pytest.approx(0.03)


def test_promotion_rule_is_strict() -> None:
    assert not measure.beats(103.0, 100.0, 0.03)  # exactly the band does not promote
    assert measure.beats(103.01, 100.0, 0.03)
    assert not measure.beats(90.0, 100.0, 0.03)


def test_cost_mfu_payback() -> None:
    # 1000 tok/s/GPU = 3.6M tokens per GPU-hour; at $3.6/GPU-h that is $1 per million tokens.
    assert measure.cost_per_million_tokens(1000.0, 3.6) == pytest.approx(1.0)
    assert measure.mfu(6e9, 1000.0, 1e13) == pytest.approx(0.6)
    # 100 GPU-h campaign, 10 GPUs, gain 25%: saves 20% of time -> 100 / (10*24*0.2) = 2.0833 days.
    assert measure.payback_days(100.0, 10, 0.25) == pytest.approx(100 / (10 * 24 * 0.2))
    assert measure.payback_days(100.0, 10, 0.0) is None
    assert measure.payback_days(100.0, 10, -0.1) is None


def test_paper_payback_glm() -> None:
    # GLM-4.5: 128 GPUs; a campaign of ~669 GPU-h at +33.9% gain pays back in about 0.9 days.
    days = measure.payback_days(669.0, 128, 0.339)
    assert days is not None and 0.8 < days < 1.0


@given(
    st.lists(st.floats(min_value=1, max_value=1e6), min_size=1, max_size=50),
    st.floats(min_value=1e-3, max_value=10),
    st.integers(min_value=1, max_value=1024),
)
def test_throughput_scales_inversely_with_time(tokens: list[float], scale: float, gpus: int) -> None:
    times = [1.0] * len(tokens)
    base = measure.windowed_throughput(tokens, times, gpus)
    slower = measure.windowed_throughput(tokens, [t * scale for t in times], gpus)
    assert slower == pytest.approx(base / scale, rel=1e-9)


def test_the_window_of_a_partial_run_is_measure_s_window() -> None:
    # Window steps 4..13 are iterations 5..14: iterations 1..4 are warm-up and never counted.
    times = {i: 100.0 for i in range(1, 5)} | {5: 200.0, 6: 200.0, 7: None, 8: 0.0}
    assert measure.window_step_times(times, (4, 13)) == [0.2, 0.2]
    value, steps = measure.partial_throughput(times, (4, 13), tokens_per_step=1000, gpus=2)
    assert steps == 2 and value == pytest.approx(2000 / (2 * 0.4))
    assert measure.partial_throughput({1: 100.0, 2: 100.0}, (4, 13), 1000, 2) is None


def test_the_early_abort_pruner_waits_for_its_steps_then_prunes_below_the_floor() -> None:
    p = measure.PRUNER
    assert p.min_steps == measure.EARLY_ABORT_STEPS == 4 and p.fraction == measure.EARLY_ABORT_FRACTION
    floor = p.floor(1000.0)
    assert floor == pytest.approx(900.0)
    assert not p.prune((800.0, 3), floor)  # too few measured steps to judge a run this close
    assert not p.prune((500.0, 1), floor)  # one measured step judges nothing
    # a clearly lost run (below 0.75 x the leader) is cut after two measured steps
    assert p.clear_steps == measure.EARLY_ABORT_CLEAR_STEPS == 2 < p.min_steps
    assert p.prune((500.0, 2), floor) and p.prune((749.0, 3), floor) and not p.prune((751.0, 3), floor)
    assert p.prune((500.0, 4), floor) and "500 tokens/s/GPU over 4 measured steps" in p.reason((500.0, 4), floor)
    assert not p.prune((950.0, 10), floor)
    assert not p.prune(None, floor) and not p.prune((1.0, 10), None)
    strict = measure.EarlyAbort(fraction=0.99, min_steps=2)
    assert strict.prune((950.0, 2), strict.floor(1000.0))


def test_the_tuner_driver_and_the_run_lifecycle_take_the_pruner_from_measure() -> None:
    from attune.control import lifecycle
    from attune.tuners import driver

    assert driver.EARLY_ABORT_STEPS is measure.EARLY_ABORT_STEPS and driver.PRUNER is measure.PRUNER
    assert lifecycle.PRUNER is measure.PRUNER and lifecycle.partial_throughput is measure.partial_throughput
