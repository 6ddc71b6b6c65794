"""Layer 2: the convergence rule, its edge cases, and its agreement with the reference rule on finite curves."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attune.readers.metrics import read_losses
from gate.convergence import ConvergenceConfig, _tolerance, check_convergence, compute_checks, loss_deviation
from tests.gate_fixtures import megatron_log


def curve(n=20, start=10.5, end=6.0, first=1):
    """A smooth decreasing loss curve over iterations first..first+n-1."""
    return {first + i: start + (end - start) * (1 - math.exp(-3 * i / (n - 1))) / (1 - math.exp(-3)) for i in range(n)}


BASE = curve()


def test_identical_curves_pass_with_every_value_reported():
    r = check_convergence(BASE, dict(BASE))
    assert r.passed and r.reasons == [] and r.failed_checks == []
    c = r.checks
    assert c.correlation.value == pytest.approx(1.0)
    assert c.pointwise.failing_steps == 0 and c.pointwise.max_rel_diff == 0.0
    assert c.final_loss.rel_diff == 0.0 and c.final_loss.step == 20
    assert c.outliers.count == 0
    assert r.n_steps == 20 and r.skipped == 4 and r.steps == list(range(5, 21))


# ------------------------------------------------------------------ the skip


@pytest.mark.parametrize(("n", "skip"), [(20, 4), (14, 2), (9, 1), (5, 1), (24, 4), (25, 5)])
def test_skip_is_floor_of_20_percent(n, skip):
    b = curve(n)
    r = check_convergence(b, dict(b))
    assert r.skipped == skip and len(r.steps) == n - skip


def test_divergence_inside_the_skipped_steps_is_ignored_but_not_after():
    early = {k: (v * 1.5 if k <= 4 else v) for k, v in BASE.items()}
    assert check_convergence(BASE, early).passed
    late = {k: (v * 1.5 if 3 <= k <= 6 else v) for k, v in BASE.items()}
    r = check_convergence(BASE, late)
    assert not r.passed and "pointwise" in r.failed_checks
    assert [f.step for f in r.checks.pointwise.failures] == [5, 6]
    assert r.checks.pointwise.ratio == pytest.approx(2 / 16)


def test_one_failing_step_in_sixteen_is_within_the_ten_percent():
    one = {k: (v * 1.12 if k == 15 else v) for k, v in BASE.items()}
    r = check_convergence(BASE, one)
    assert r.checks.pointwise.failing_steps == 1 and r.checks.pointwise.passed
    assert r.checks.outliers.count == 1 and r.checks.outliers.passed
    assert r.passed, r.reasons


# ------------------------------------------------------------------ tolerance bands at 0.5 and 2.0


@pytest.mark.parametrize(("g", "tol"), [(2.0001, 0.10), (2.0, 0.05), (1.0, 0.05), (0.5001, 0.05), (0.5, 0.02),
                                        (0.1, 0.02), (0.0, 0.02), (50.0, 0.10)])
def test_tolerance_band_by_baseline_value(g, tol):
    assert _tolerance(g, ConvergenceConfig()) == tol


def _pointwise_failures(base_vals, cand_vals):
    steps = list(range(1, len(base_vals) + 1))
    return [f.step for f in compute_checks(steps, np.array(cand_vals, float), np.array(base_vals, float),
                                           ConvergenceConfig()).pointwise.failures]


def test_band_edges_decide_which_steps_fail():
    # the same 6% difference fails at a baseline of exactly 2.0 (5% band) and passes just above it (10% band)
    assert _pointwise_failures([2.0, 2.0001, 3.0], [2.12, 2.0001 * 1.06, 3.0]) == [1]
    # a 3% difference fails at exactly 0.5 (2% band) and passes just above it (5% band)
    assert _pointwise_failures([0.5, 0.5001, 0.3], [0.515, 0.5001 * 1.03, 0.3]) == [1]
    # strictly above: a difference equal to the tolerance passes (0.25 / 2.5 == 0.1 exactly)
    assert _pointwise_failures([2.5, 1.0], [2.75, 1.0]) == []
    # a zero baseline compares the absolute candidate value
    assert _pointwise_failures([0.0, 0.0], [0.01, 0.03]) == [2]


def test_final_loss_band_is_five_percent():
    c = dict(BASE)
    c[20] = BASE[20] * 1.049
    r = check_convergence(BASE, c)
    assert r.checks.final_loss.passed and r.checks.final_loss.rel_diff == pytest.approx(0.049)
    c[20] = BASE[20] * 1.051
    r = check_convergence(BASE, c)
    assert not r.passed and r.failed_checks == ["final_loss"]


def test_constant_offset_is_caught_by_the_tolerances_not_the_outliers():
    shifted = {k: v * 1.12 for k, v in BASE.items()}
    r = check_convergence(BASE, shifted)
    assert r.checks.correlation.passed and r.checks.outliers.count == 0 and r.checks.outliers.residual_std >= 0
    assert set(r.failed_checks) == {"pointwise", "final_loss"}


def test_low_correlation_fails():
    rng = np.random.default_rng(0)
    flat_b = {i: 5.0 + 0.01 * rng.standard_normal() for i in range(1, 21)}
    flat_c = {i: 5.0 + 0.01 * rng.standard_normal() for i in range(1, 21)}
    r = check_convergence(flat_b, flat_c)
    assert r.checks.correlation.value < 0.95 and "correlation" in r.failed_checks
    assert r.checks.pointwise.passed and r.checks.final_loss.passed


def test_undefined_correlation_does_not_fail_as_in_the_reference():
    const = {i: 3.0 for i in range(1, 21)}
    r = check_convergence(const, dict(const))
    assert r.checks.correlation.value is None and r.checks.correlation.passed and r.passed


# ------------------------------------------------------------------ the outlier rule


def test_outlier_rule_counts_three_sigma_residuals_with_population_std():
    # 250 steps -> 200 compared; 22 of them (11%) carry residuals of +-a, the rest none:
    # std = a * sqrt(0.11) so |r - mean| = a > 3 std: 22 outliers, 11% > 10%.
    base = curve(250)
    cand = dict(base)
    compared = sorted(base)[50:]
    a = 1e-4
    for j, step in enumerate(compared[10:32]):
        cand[step] = base[step] + (a if j % 2 == 0 else -a)
    r = check_convergence(base, cand)
    assert r.skipped == 50
    o = r.checks.outliers
    assert o.count == 22 and o.ratio == pytest.approx(0.11) and not o.passed
    assert o.residual_std == pytest.approx(a * math.sqrt(0.11), rel=1e-6)
    assert r.failed_checks == ["outliers"]
    # 20 of 200 (10%) is not above the limit
    cand2 = dict(base)
    for j, step in enumerate(compared[10:30]):
        cand2[step] = base[step] + (a if j % 2 == 0 else -a)
    assert check_convergence(base, cand2).checks.outliers.passed


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1.0, 1.0), min_size=16, max_size=16))
def test_outliers_alone_cannot_reject_a_20_step_run(residuals):
    """With 16 compared steps, at most one residual lies beyond 3 std (Chebyshev), i.e. 6% < 10%."""
    b = np.array([BASE[s] for s in range(5, 21)])
    c = b + np.array(residuals) * 1e-3
    checks = compute_checks(list(range(5, 21)), c, b, ConvergenceConfig())
    assert checks.outliers.count <= 1 and checks.outliers.passed


# ------------------------------------------------------------------ NaN, infinities, missing steps


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_candidate_loss_is_a_reject_with_the_step(bad):
    c = dict(BASE)
    c[12] = bad
    r = check_convergence(BASE, c)
    assert not r.passed
    assert any("non-finite loss at step(s) 12" in p for p in r.data_problems)
    # the checks still report their values, over the finite steps
    assert r.checks is not None and 12 not in r.steps


def test_all_nan_candidate_is_rejected_without_checks():
    r = check_convergence(BASE, {k: float("nan") for k in BASE})
    assert not r.passed and r.checks is None and r.n_steps == 0


def test_missing_loss_and_missing_and_extra_steps_are_rejects():
    c = dict(BASE)
    c[7] = None
    del c[8], c[9]
    c[21] = 5.9
    r = check_convergence(BASE, c)
    assert not r.passed
    text = " | ".join(r.data_problems)
    assert "missing step(s) 8-9" in text and "step(s) 21 that the baseline does not" in text
    assert "no loss at step(s) 7" in text


def test_baseline_problems_are_named_as_the_baselines():
    b = dict(BASE)
    b[3] = float("nan")
    r = check_convergence(b, dict(BASE))
    assert not r.passed and any(p.startswith("baseline has non-finite") for p in r.data_problems)


def test_too_few_steps_is_a_reject():
    b = {1: 10.0, 2: 9.0, 3: 8.5, 4: 8.0}
    r = check_convergence(b, dict(b))
    assert not r.passed and "at least 5" in r.reasons[0]


def test_losses_pair_by_iteration_number_not_position(tmp_path):
    """A NaN loss drops the field from the line; later steps must not shift onto it."""
    cand = dict(BASE)
    cand[10] = None
    log = tmp_path / "cand.log"
    log.write_text(megatron_log({"seed": 1}, cand))
    parsed = read_losses(log, "megatron-lm")
    assert parsed[10] is None and parsed[11] == pytest.approx(BASE[11], rel=1e-6)
    r = check_convergence(BASE, parsed)
    assert not r.passed and any("no loss at step(s) 10" in p for p in r.data_problems)
    # every other step matches, so positional pairing would have shifted 11..20 onto 10..19:
    assert r.checks.pointwise.failing_steps == 0


def test_loss_deviation_summary():
    c = {k: v * 1.01 for k, v in BASE.items()}
    d = loss_deviation(BASE, c)
    assert d["steps"] == 20 and d["max_rel"] == pytest.approx(0.01) and d["final_rel"] == pytest.approx(0.01)


# ------------------------------------------------------------------ agreement with the reference rule


def reference_verdict(cur, gold):
    """The rule of shared/reference/convergence-check.md, written independently, position-based (finite curves)."""
    n = len(cur)
    k = int(n * 0.2)
    cur, gold = np.asarray(cur[k:], float), np.asarray(gold[k:], float)
    passed = True
    with np.errstate(invalid="ignore", divide="ignore"):
        corr = np.corrcoef(cur, gold)[0, 1]
    if corr < 0.95:  # NaN compares false: undefined correlation does not fail
        passed = False
    fails = 0
    for c, g in zip(cur, gold, strict=True):
        tol = 0.10 if g > 2.0 else 0.05 if g > 0.5 else 0.02
        d = abs(c - g) / abs(g) if g != 0 else abs(c)
        fails += d > tol
    if fails / len(cur) > 0.1:
        passed = False
    g_last = gold[-1]
    fd = abs(cur[-1] - g_last) / g_last if g_last != 0 else abs(cur[-1])
    if fd > 0.05:
        passed = False
    r = cur - gold
    if np.sum(np.abs(r - r.mean()) > 3 * r.std()) / len(cur) > 0.1:
        passed = False
    return passed


@settings(max_examples=300, deadline=None)
@given(
    start=st.floats(0.05, 12.0), drop=st.floats(0.0, 0.9), scale=st.floats(0.0, 0.2),
    noise=st.lists(st.floats(-1.0, 1.0), min_size=20, max_size=20), n=st.integers(5, 30),
)
def test_verdicts_equal_the_reference_rule_on_finite_curves(start, drop, scale, noise, n):
    base = {i + 1: start * (1 - drop * i / max(1, n - 1)) for i in range(n)}
    cand = {i + 1: base[i + 1] * (1 + scale * noise[i % 20]) for i in range(n)}
    ours = check_convergence(base, cand).passed
    assert ours == reference_verdict([cand[s] for s in sorted(cand)], [base[s] for s in sorted(base)])
