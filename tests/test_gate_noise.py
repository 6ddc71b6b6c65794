"""The noise-aware convergence check (gate/noise.py) and layer 2's combined verdict (gate/judge.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gate.judge import FLAT_RATIO, judge
from gate.noise import (
    NoiseConfig,
    build_envelope,
    check_noise_aware,
    config_for,
    precision_of,
    upper_bound_factor,
)


def curve(n=20, start=6.0, end=3.0, noise=0.0, seed=0, every=1, first=1):
    rng = np.random.default_rng(seed)
    steps = list(range(first, n + 1, every))
    return {s: start + (end - start) * (s - 1) / (n - 1) + float(rng.normal(0, noise)) for s in steps}


def replicates(base, rel, count=2, seed=1):
    rng = np.random.default_rng(seed)
    return [(f"r{i}", "replicate", {s: v * (1 + float(rng.normal(0, rel))) for s, v in base.items()})
            for i in range(count)]


def test_identical_curves_pass_and_a_deterministic_envelope_is_the_floor():
    base = curve()
    env = build_envelope(base, [("r1", "replicate", dict(base)), ("r2", "replicate", dict(base))])
    assert env.deterministic and len(env.pairs) == 3 and "deterministic" in env.basis
    assert env.unit(7) == (pytest.approx(1e-3), False)
    res = check_noise_aware(base, dict(base), env)
    assert res.passed and res.level.mean_z == 0.0 and res.pointwise.outside == 0
    assert "passes over 20 steps" in res.summary()


def test_an_offset_leaves_the_envelope_in_level_and_says_by_how_much():
    base = curve()
    cand = {s: v * 1.01 for s, v in base.items()}  # +1%: 10 floor units
    res = check_noise_aware(base, cand, build_envelope(base, [("r", "replicate", dict(base))]))
    assert not res.passed and "level" in res.failed_checks and "trend" not in res.failed_checks
    assert res.level.mean_rel_diff == pytest.approx(0.01)
    assert res.level.mean_z == pytest.approx(10.0)
    why = " ".join(res.reasons)
    assert "+1.000%" in why and "limit 4" in why and "0.100% RMS" in why
    # every step is outside the envelope: named with its difference and the envelope
    assert res.pointwise.outside == 20 and "step " in why and "(envelope 0.40%)" in why


def test_a_growing_difference_fails_the_trend():
    base = curve()
    cand = {s: v * (1 + 0.0006 * (s - 10.5)) for s, v in base.items()}  # mean 0, drifts -0.57%..+0.57%
    res = check_noise_aware(base, cand)
    assert "trend" in res.failed_checks and "level" not in res.failed_checks
    assert res.trend.drift_rel == pytest.approx(0.0006 * 19, rel=1e-6)
    assert "from step 1 to 20" in " ".join(res.reasons)


def test_noise_from_replicates_widens_the_envelope():
    base = curve()
    reps = replicates(base, 0.01)
    env = build_envelope(base, reps)
    assert not env.deterministic and len(env.pairs) == 3
    cand = replicates(base, 0.01, count=1, seed=7)[0][2]  # another run of the same objective
    assert check_noise_aware(base, cand, env).passed
    assert not check_noise_aware(base, cand).passed  # against the bare floor it would not


def test_flat_noise_never_rejects_on_correlation_alone():
    rng = np.random.default_rng(3)
    base = {s: 2.5 + float(rng.normal(0, 0.002)) for s in range(1, 21)}  # flat: only noise moves it
    reps = [(f"r{i}", "replicate", {s: 2.5 + float(rng.normal(0, 0.002)) for s in base}) for i in range(3)]
    cand = {s: 2.5 + float(rng.normal(0, 0.002)) for s in base}
    g = judge(base, cand, replicates=reps)
    assert not g.reference.passed and g.reference.failed_checks == ["correlation"]
    assert g.noise_aware.passed and g.passed
    assert [e.check for e in g.excused] == ["correlation"]
    assert f"{FLAT_RATIO:.2f} x the noise" in g.excused[0].why
    assert "reference rule passes after" in g.summary


def test_correlation_still_counts_on_a_curve_that_moves():
    base = curve(noise=0.0)
    cand = dict(base)
    cand[17] = base[17] * 2.4  # one spike: the level and the point-wise envelope see it as well
    g = judge(base, cand)
    assert not g.passed and "correlation" in g.reference.failed_checks
    assert not any(e.check == "correlation" for e in g.excused)


def test_curves_logged_every_n_steps_are_compared_where_both_have_steps():
    base = curve(n=50)
    cand = {s: v for s, v in base.items() if s == 1 or s % 5 == 0}
    g = judge(base, cand)
    assert not g.reference.passed and g.reference.data_problems  # the reference rejects step sets outright
    assert g.passed and g.reference_common is not None and g.reference_common.passed
    note = g.noise_aware.notes[0]
    assert "compared the 11 step(s) both curves have" in note and "baseline logged every 1" in note
    assert "candidate every 5" in note and "baseline-only" in note


def test_a_candidate_that_stops_early_or_has_nan_is_rejected():
    base = curve()
    short = {s: v for s, v in base.items() if s <= 15}
    g = judge(base, short)
    assert not g.passed and any("stops at step 15" in r for r in g.noise_aware.data_problems)
    nan = dict(base)
    nan[9] = math.nan
    g = judge(base, nan)
    assert not g.passed and not g.noise_aware.passed and not g.reference.passed
    assert any("non-finite loss at step(s) 9" in r for r in g.noise_aware.data_problems)
    none = dict(base)
    none[9] = None
    assert any("no loss at step(s) 9" in r for r in check_noise_aware(base, none).data_problems)


def test_too_few_common_steps():
    res = check_noise_aware({1: 5.0, 2: 4.0, 3: 3.5}, {1: 5.0, 2: 4.0, 3: 3.5})
    assert not res.passed and "at least 5" in res.reasons[0]


def test_steps_past_the_replicates_use_the_largest_noise_seen():
    base = curve(n=20)
    short_reps = [(n, k, {s: v for s, v in c.items() if s <= 14}) for n, k, c in replicates(base, 0.004)]
    env = build_envelope(base, short_reps)
    u19, extrapolated = env.unit(19)
    assert extrapolated and u19 == pytest.approx(max(env.sigma_rel.values()))
    res = check_noise_aware(base, dict(base), env)
    assert any("no same-objective pair covers step(s) 15-20" in n for n in res.notes)


def test_precision_sets_the_floor():
    assert precision_of({"bf16": "True"}) == "bf16" and precision_of({"--bf16": True}) == "bf16"
    assert precision_of({"fp16": True}) == "fp16" and precision_of({"bf16": "False"}) == "fp32"
    assert config_for("bf16").floor_rel == 2.5e-3 and config_for("fp32").floor_rel == 1e-3
    assert config_for("bf16", change="layout").floor_rel == 3e-3


def test_upper_bound_factor():
    values = [upper_bound_factor(n) for n in (5, 15, 50, 500)]
    assert values == sorted(values, reverse=True) and values[-1] > 1.0
    assert values[0] == pytest.approx(2.09, abs=0.05) and values[1] == pytest.approx(1.44, abs=0.03)


@settings(max_examples=40, deadline=None)
@given(scale=st.floats(0.1, 100.0), rel_noise=st.floats(0.0, 0.02), seed=st.integers(0, 10_000))
def test_property_scale_free_and_self_consistent(scale, rel_noise, seed):
    base = curve(seed=seed)
    reps = replicates(base, rel_noise, seed=seed)
    res = check_noise_aware(base, dict(base), build_envelope(base, reps))
    assert res.passed  # the baseline against itself always passes
    scaled = {s: v * scale for s, v in base.items()}
    shifted = {s: v * scale * 1.2 for s, v in base.items()}
    env = build_envelope(scaled, [(n, k, {s: v * scale for s, v in c.items()}) for n, k, c in reps])
    a = check_noise_aware(scaled, shifted, env)
    b = check_noise_aware(base, {s: v * 1.2 for s, v in base.items()}, build_envelope(base, reps))
    assert a.passed == b.passed and a.level.mean_z == pytest.approx(b.level.mean_z, rel=1e-6)
    # far outside any envelope the replicates allow: rejected on level, whatever the noise
    k_units = NoiseConfig().k_sigma * max(env.unit(s)[0] for s in scaled) * 3
    far = {s: v * (1 + k_units) for s, v in scaled.items()}
    assert "level" in check_noise_aware(scaled, far, env).failed_checks


@settings(max_examples=30, deadline=None)
@given(level=st.floats(0.5, 12.0), rel_noise=st.floats(1e-4, 0.02), n=st.integers(8, 40), seed=st.integers(0, 10_000))
def test_property_flat_noise_is_never_a_correlation_reject(level, rel_noise, n, seed):
    rng = np.random.default_rng(seed)

    def flat():
        return {s: level * (1 + float(rng.normal(0, rel_noise))) for s in range(1, n + 1)}

    base, cand = flat(), flat()
    g = judge(base, cand, replicates=[(f"r{i}", "replicate", flat()) for i in range(3)])
    assert not any(r.startswith("reference: correlation") for r in g.reasons)
    if "correlation" in g.reference.failed_checks:
        assert any(e.check == "correlation" for e in g.excused)


def test_zero_spread_falls_back_to_the_layout_allowance_or_the_floor_and_says_which() -> None:
    """Bit-identical replicates (a deterministic stack): the envelope is the layout allowance for a layout-only
    change and the replicate floor otherwise, and the verdict's assumptions and basis say which."""
    from gate.noise import FLOOR_BY_PRECISION, LAYOUT_FLOOR_BY_PRECISION, check_noise_aware, config_for

    base = {s: 10.0 - 0.1 * s for s in range(1, 41)}
    reps = [("r1", "replicate", dict(base)), ("r2", "replicate", dict(base))]
    cand = {s: v * 1.006 for s, v in base.items()}
    for change, floor, word in (("layout", LAYOUT_FLOOR_BY_PRECISION["bf16"], "layout allowance"),
                                ("unknown", FLOOR_BY_PRECISION["bf16"], "replicate floor")):
        cfg = config_for("bf16", "given", change=change)
        env = build_envelope(base, reps, cfg)
        assert env.deterministic and env.allowance == word
        assert word in env.basis and "zero spread" in env.basis and f"{floor:.2%}" in env.basis
        res = check_noise_aware(base, cand, env, cfg)
        assert res.assumptions is not None
        assert res.assumptions.noise_source == "deterministic"
        assert res.assumptions.allowance == word and res.assumptions.floor_rel == floor
        assert word in res.assumed()
    # an envelope built for another class: the check's own class decides the floor and the words
    env_u = build_envelope(base, reps, config_for("bf16", "given"))
    res = check_noise_aware(base, cand, env_u, config_for("bf16", "given", change="layout"))
    assert res.envelope.allowance == "layout allowance" and res.envelope.floor_rel == LAYOUT_FLOOR_BY_PRECISION["bf16"]
    assert "layout allowance" in res.envelope.basis


def test_layout_change_correlation_is_judged_on_the_trend():
    """A layout-only change: per-step scatter around the same trend breaks the raw correlation but not the
    trend's (moving average over the envelope's window); strict mode keeps the raw correlation; a NaN or a
    missing step is never excused; a candidate whose trend differs is not excused."""
    from gate.judge import judge
    from gate.noise import config_for

    rng = np.random.default_rng(7)
    steps = range(1, 101)
    trend = {s: 3.3 - 0.5 * (1 - np.exp(-s / 30)) for s in steps}
    base = {s: float(trend[s] + rng.normal(0, 0.03)) for s in steps}
    cand = {s: float(trend[s] + rng.normal(0, 0.03)) for s in steps}
    layout, strict = config_for("bf16", "given", change="layout"), config_for("bf16", "given")
    g = judge(base, cand, replicates=[("r", "replicate", dict(base))], noise_config=layout)
    assert "correlation" in g.reference.failed_checks  # the raw curves correlate below 0.95
    assert any(e.check == "correlation" and "trends" in e.why for e in g.excused), g.excused
    assert g.reference_counts
    s = judge(base, cand, replicates=[("r", "replicate", dict(base))], noise_config=strict)
    assert not s.reference_counts and not s.passed and not any(e.check == "correlation" for e in s.excused)
    for broken in ({**cand, 60: float("nan")}, {k: v for k, v in cand.items() if k != 60}):
        b = judge(base, broken, replicates=[("r", "replicate", dict(base))], noise_config=layout)
        assert not b.passed and not b.reference_counts
    other = {s: float(trend[s] + 0.08 * np.sin(s / 6) + rng.normal(0, 0.03)) for s in steps}  # another shape
    o = judge(base, other, replicates=[("r", "replicate", dict(base))], noise_config=layout)
    assert not o.passed and not any("trends" in e.why for e in o.excused)
