"""Layer 2 of the correctness gate: the convergence check.

The rule (``shared/reference/convergence-check.md``), applied to the candidate's and
the baseline's loss per step, keyed by iteration number:

1. drop the first ``floor(n * 0.20)`` steps of both curves;
2. correlation: Pearson correlation of the rest, fails below 0.95;
3. point-wise: relative difference ``|c - g| / |g|`` (``|c|`` when ``g == 0``) against a
   tolerance set by the baseline's value: 10% when g > 2.0, 5% when 0.5 < g <= 2.0,
   2% when g <= 0.5; a step fails strictly above its tolerance; the check fails when
   more than 10% of the steps fail;
4. final loss: ``|c_last - g_last| / |g_last|`` above 5% fails;
5. outliers: residuals ``r = c - g``; a step is an outlier when
   ``|r - mean(r)| > 3 * std(r)`` (population std); fails above 10% of the steps.

The verdict passes only if all four checks pass. On finite curves with the same
steps this gives the same verdict as Megatron-Bridge's ``validate_convergence`` with
the thresholds of its performance pipeline (including: an undefined correlation,
from a constant curve, does not fail the correlation check there, and does not here).
Where that function is lax, this one rejects: a NaN or infinite loss, a missing
step, or curves over different steps, each with the reason. Every check's value is
reported, also when the verdict is already decided by bad data (then the checks
run on the steps both curves have as finite numbers, for information).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from pydantic import BaseModel, Field


class ConvergenceConfig(BaseModel):
    """Thresholds: Megatron-Bridge's performance pipeline values by default."""

    skip_fraction: float = 0.20
    correlation_min: float = 0.95
    tol_high: float = 0.10  # baseline loss > 2.0
    tol_medium: float = 0.05  # 0.5 < baseline loss <= 2.0
    tol_low: float = 0.02  # baseline loss <= 0.5
    high_above: float = 2.0
    medium_above: float = 0.5
    max_pointwise_fail_ratio: float = 0.10
    final_loss_tolerance: float = 0.05
    outlier_sigma: float = 3.0
    max_outlier_ratio: float = 0.10
    min_steps: int = Field(default=5, description="Fewer common steps than this cannot be judged: reject.")


class PointFailure(BaseModel):
    step: int
    candidate: float
    baseline: float
    rel_diff: float
    tolerance: float


class CorrelationCheck(BaseModel):
    value: float | None = Field(description="Pearson r; null when undefined (a constant curve).")
    threshold: float
    passed: bool


class PointwiseCheck(BaseModel):
    failing_steps: int
    compared_steps: int
    ratio: float
    max_ratio: float
    max_rel_diff: float
    passed: bool
    failures: list[PointFailure]


class FinalLossCheck(BaseModel):
    step: int
    candidate: float
    baseline: float
    rel_diff: float
    tolerance: float
    passed: bool


class OutlierCheck(BaseModel):
    count: int
    ratio: float
    max_ratio: float
    sigma: float
    residual_mean: float
    residual_std: float
    passed: bool


class Checks(BaseModel):
    correlation: CorrelationCheck
    pointwise: PointwiseCheck
    final_loss: FinalLossCheck
    outliers: OutlierCheck


class ConvergenceResult(BaseModel):
    passed: bool
    reasons: list[str] = Field(description="Why the candidate is rejected; empty when it passes.")
    failed_checks: list[str]
    data_problems: list[str] = Field(description="NaN/inf losses, missing or extra steps (each a reject).")
    steps: list[int] = Field(description="The steps compared (after the skip).")
    n_steps: int = Field(description="Steps both curves have as finite losses, before the skip.")
    skipped: int
    checks: Checks | None = Field(description="Every check's value; null only when too few steps to compute.")

    def summary(self) -> str:
        if self.passed:
            c = self.checks
            assert c is not None
            corr = "undefined" if c.correlation.value is None else f"{c.correlation.value:.4f}"
            return (f"convergence passes: correlation {corr}, {c.pointwise.failing_steps} point-wise failure(s), "
                    f"final loss diff {c.final_loss.rel_diff:.2%}, {c.outliers.count} outlier(s)")
        return "convergence rejects: " + "; ".join(self.reasons)


def _tolerance(g: float, cfg: ConvergenceConfig) -> float:
    if g > cfg.high_above:
        return cfg.tol_high
    if g > cfg.medium_above:
        return cfg.tol_medium
    return cfg.tol_low


def _rel(c: float, g: float) -> float:
    return abs(c - g) / abs(g) if g != 0 else abs(c)


def _pearson(a: np.ndarray, b: np.ndarray) -> float | None:
    """Pearson r as numpy's corrcoef computes it; None when undefined (fewer than 2 points, a constant curve)."""
    if len(a) < 2:
        return None
    with np.errstate(invalid="ignore", divide="ignore"):
        r = float(np.corrcoef(a, b)[0, 1])
    return r if math.isfinite(r) else None


def _is_finite(v: Any) -> bool:
    return v is not None and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def compute_checks(steps: list[int], cand: np.ndarray, base: np.ndarray, cfg: ConvergenceConfig) -> Checks:
    """The four checks on already-aligned, already-skipped finite curves."""
    n = len(steps)
    r = _pearson(cand, base)
    corr = CorrelationCheck(value=r, threshold=cfg.correlation_min, passed=(r is None or r >= cfg.correlation_min))
    failures = []
    max_rel = 0.0
    for s, c, g in zip(steps, cand.tolist(), base.tolist(), strict=True):
        d = _rel(c, g)
        max_rel = max(max_rel, d)
        tol = _tolerance(g, cfg)
        if d > tol:
            failures.append(PointFailure(step=s, candidate=c, baseline=g, rel_diff=d, tolerance=tol))
    ratio = len(failures) / n
    pw = PointwiseCheck(failing_steps=len(failures), compared_steps=n, ratio=ratio,
                        max_ratio=cfg.max_pointwise_fail_ratio, max_rel_diff=max_rel,
                        passed=ratio <= cfg.max_pointwise_fail_ratio, failures=failures)
    fc, fg = float(cand[-1]), float(base[-1])
    fd = _rel(fc, fg)
    final = FinalLossCheck(step=steps[-1], candidate=fc, baseline=fg, rel_diff=fd,
                           tolerance=cfg.final_loss_tolerance, passed=fd <= cfg.final_loss_tolerance)
    resid = cand - base
    mean = float(resid.mean())
    std = float(resid.std())  # population standard deviation
    count = int(np.sum(np.abs(resid - mean) > cfg.outlier_sigma * std))
    out = OutlierCheck(count=count, ratio=count / n, max_ratio=cfg.max_outlier_ratio, sigma=cfg.outlier_sigma,
                       residual_mean=mean, residual_std=std, passed=count / n <= cfg.max_outlier_ratio)
    return Checks(correlation=corr, pointwise=pw, final_loss=final, outliers=out)


def _step_problems(base: dict[int, float | None], cand: dict[int, float | None]) -> list[str]:
    """Steps only one curve has, and missing or non-finite losses."""
    problems: list[str] = []
    missing = sorted(set(base) - set(cand))
    extra = sorted(set(cand) - set(base))
    if missing:
        problems.append(f"candidate is missing step(s) {_ranges(missing)} that the baseline has")
    if extra:
        problems.append(f"candidate has step(s) {_ranges(extra)} that the baseline does not")
    for label, curve in (("candidate", cand), ("baseline", base)):
        absent = sorted(s for s, v in curve.items() if v is None)
        nonfinite = sorted(s for s, v in curve.items() if v is not None and not _is_finite(v))
        if absent:
            problems.append(f"{label} has no loss at step(s) {_ranges(absent)} (a NaN loss is not printed)")
        if nonfinite:
            shown = ", ".join(f"{s}: {curve[s]}" for s in nonfinite[:5])
            problems.append(f"{label} has non-finite loss at step(s) {_ranges(nonfinite)} ({shown})")
    return problems


# The four checks in order: (name, its result in Checks, the reason it failed).
_CHECK_FAILURES: tuple[tuple[str, Callable[[Checks], Any], Callable[[Checks, ConvergenceConfig], str]], ...] = (
    ("correlation", lambda c: c.correlation,
     lambda c, cfg: f"correlation {c.correlation.value:.4f} < {cfg.correlation_min}"),
    ("pointwise", lambda c: c.pointwise,
     lambda c, cfg: (f"{c.pointwise.failing_steps}/{c.pointwise.compared_steps} steps outside their "
                     f"tolerance ({c.pointwise.ratio:.0%} > {cfg.max_pointwise_fail_ratio:.0%})")),
    ("final_loss", lambda c: c.final_loss,
     lambda c, cfg: f"final loss differs by {c.final_loss.rel_diff:.2%} > {cfg.final_loss_tolerance:.0%}"),
    ("outliers", lambda c: c.outliers,
     lambda c, cfg: f"{c.outliers.count} outlier step(s) ({c.outliers.ratio:.0%} > {cfg.max_outlier_ratio:.0%})"),
)


def check_convergence(baseline: Mapping[int, float | None], candidate: Mapping[int, float | None],
                      config: ConvergenceConfig | None = None) -> ConvergenceResult:
    """Compare a candidate's loss curve with the baseline's (both keyed by step / iteration)."""
    cfg = config or ConvergenceConfig()
    base = {int(k): v for k, v in baseline.items()}
    cand = {int(k): v for k, v in candidate.items()}
    problems = _step_problems(base, cand)

    common = sorted(s for s in set(base) & set(cand) if _is_finite(base[s]) and _is_finite(cand[s]))
    n = len(common)
    skip = max(0, int(math.floor(n * cfg.skip_fraction)))
    kept = common[skip:]
    checks: Checks | None = None
    if n < cfg.min_steps or len(kept) < 1:
        problems.append(f"only {n} step(s) with a finite loss in both curves; at least {cfg.min_steps} are needed")
    if len(kept) >= 1:
        c_arr = np.array([float(cand[s]) for s in kept], dtype=np.float64)  # type: ignore[arg-type]
        g_arr = np.array([float(base[s]) for s in kept], dtype=np.float64)  # type: ignore[arg-type]
        checks = compute_checks(kept, c_arr, g_arr, cfg)

    failed: list[str] = []
    reasons: list[str] = list(problems)
    if checks is not None:
        for name, result, why in _CHECK_FAILURES:
            if not result(checks).passed:
                failed.append(name)
                reasons.append(why(checks, cfg))
    return ConvergenceResult(passed=not reasons, reasons=reasons, failed_checks=failed, data_problems=problems,
                             steps=kept, n_steps=n, skipped=skip, checks=checks)


def _ranges(steps: list[int]) -> str:
    """[1,2,3,7] -> '1-3, 7'."""
    parts: list[str] = []
    start = prev = None
    for s in steps:
        if start is None:
            start = prev = s
        elif s == prev + 1:  # type: ignore[operator]
            prev = s
        else:
            parts.append(f"{start}-{prev}" if start != prev else f"{start}")
            start = prev = s
    if start is not None:
        parts.append(f"{start}-{prev}" if start != prev else f"{start}")
    return ", ".join(parts)


def loss_deviation(baseline: Mapping[int, float | None], candidate: Mapping[int, float | None]) -> dict[str, Any]:
    """How far a candidate's loss moved from the baseline's, over the steps both have as finite numbers."""
    common = sorted(s for s in set(baseline) & set(candidate)
                    if _is_finite(baseline[s]) and _is_finite(candidate[s]))
    if not common:
        return {"steps": 0, "max_rel": None, "mean_rel": None, "final_rel": None}
    rels = [_rel(float(candidate[s]), float(baseline[s])) for s in common]  # type: ignore[arg-type]
    return {"steps": len(common), "max_rel": max(rels), "mean_rel": sum(rels) / len(rels), "final_rel": rels[-1]}
