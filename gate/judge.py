"""Layer 2's verdict: the reference rule and the noise-aware check, combined.

Two verdicts are computed and both are reported:

- ``reference``: Megatron-Bridge's rule as `gate.convergence` implements it, on the curves as given
  (unchanged: same name, same verdict, same strictness on NaN and step sets);
- ``noise_aware``: `gate.noise`, against the envelope learned from runs of the baseline's objective.

The gate's verdict passes only when the noise-aware check passes **and** the reference rule passes,
with two documented exceptions where the reference rule is known to judge the data rather than the
objective (docs/gate.md, "Combining the two verdicts"):

1. *Step sets that differ only by logging*: the reference rejects any missing or extra step. When
   the difference is one of coverage (a curve logged every N steps, or curves that overlap partly)
   and no loss is NaN, infinite or absent, the reference rule is applied to the steps both curves
   have, and that result counts. A candidate that stops before the baseline's last step is still a
   reject (the noise-aware check says so).
2. *Correlation of flat noise*: a correlation below 0.95 is excused when even a replicate of the
   baseline could not reach 0.95 on this window, i.e. when the baseline moves over the window (its
   standard deviation ``S``) by less than ``3.04`` noise sigmas. (A curve plus independent noise of
   standard deviation ``D`` correlates with itself at ``S / sqrt(S^2 + D^2)``, which is below 0.95
   exactly when ``S < 3.04 D``.) The noise sigma is the envelope's, ``u(s) * |baseline(s)|``, RMS
   over the window, never the candidate's own difference.
3. *Correlation of the trend, for a layout-only change*: when layer 1 classes the change as layout-only
   (``NoiseConfig.change == 'layout'``), layer 2 judges drift and divergence, not each step, so the
   correlation is taken on the trend too: both curves smoothed by a centred moving average over the
   envelope's own pooling window (``NoiseConfig.window`` logged steps on each side, the window the
   noise model already pools over; not fitted to any pair). A raw correlation below 0.95 is excused
   when the trend's reaches 0.95. Strict mode (change unknown or objective) keeps the raw correlation.

Every other reference failure (point-wise band, final loss, outliers) counts as it is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from pydantic import BaseModel, Field

from gate.convergence import ConvergenceConfig, ConvergenceResult, check_convergence
from gate.noise import (
    FLOOR_BY_PRECISION,
    Assumptions,
    Curve,
    DifferenceTest,
    NoiseAwareResult,
    NoiseConfig,
    NoiseEnvelope,
    build_envelope,
    check_noise_aware,
    difference_test,
    floor_for,
    grid_gaps,
)

FLAT_RATIO = 1.0 / math.sqrt(1.0 / 0.95 ** 2 - 1.0)  # 3.04: S below this many noise sigmas cannot give r >= 0.95


class Excuse(BaseModel):
    check: str
    why: str


class GateConvergence(BaseModel):
    passed: bool
    summary: str
    reasons: list[str]
    reference: ConvergenceResult = Field(description="the reference rule on the curves as given")
    reference_common: ConvergenceResult | None = Field(
        None, description="the reference rule on the common steps, when the step sets differ only by logging")
    reference_counts: bool = Field(description="whether the reference rule (after the exceptions) passes")
    excused: list[Excuse]
    noise_aware: NoiseAwareResult
    assumptions: Assumptions | None = Field(None, description="precision, noise source, change class and window")
    difference: DifferenceTest | None = Field(None, description=(
        "the difference test, when the change class was unknown and the caller asked to infer the mode from it"))
    check_window: GateConvergence | None = Field(None, description=(
        "strict judgments of curves longer than the reference's check window: the same judgment of its first "
        "CHECK_WINDOW_STEPS iterations alone (the whole verdict passes only if both pass)"))


def _finite(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _on_common_steps(baseline: Curve, candidate: Curve, ref: ConvergenceResult,
                     reference_config: ConvergenceConfig | None) -> tuple[ConvergenceResult, Excuse] | None:
    """The reference rule on the common steps, with its excuse, when the step sets differ only by logging."""
    bad_values = any(v is None or not _finite(v) for c in (baseline, candidate) for v in c.values())
    if ref.passed or not ref.data_problems or bad_values:
        return None
    base = {int(k): v for k, v in baseline.items()}
    cand = {int(k): v for k, v in candidate.items()}
    common = set(base) & set(cand)
    if not (common and max(cand) >= max(base)) or grid_gaps(list(cand), list(base)) or grid_gaps(list(base), list(cand)):
        return None  # a step lost inside a curve's own logging is not a logging difference
    common_ref = check_convergence({s: base[s] for s in common}, {s: cand[s] for s in common}, reference_config)
    return common_ref, Excuse(check="step sets", why=(
        f"the curves' step sets differ only by logging ({len(base)} baseline and {len(cand)} candidate "
        f"steps); the reference rule is applied to the {len(common)} common steps"))


def _flat_window(baseline: Curve, used: ConvergenceResult, env: NoiseEnvelope) -> Excuse | None:
    """The excuse for a failed correlation on a window where the baseline moves less than its noise."""
    if "correlation" not in used.failed_checks or used.checks is None or not used.steps:
        return None
    b = np.array([float(baseline[s]) for s in used.steps])  # type: ignore[arg-type]
    sig = np.array([env.unit(s)[0] for s in used.steps]) * np.abs(b)
    noise = float(np.sqrt(np.mean(sig ** 2)))
    spread = float(np.std(b))
    if spread >= FLAT_RATIO * noise:
        return None
    return Excuse(check="correlation", why=(
        f"correlation {used.checks.correlation.value:.3f} on a flat window: the baseline moves by "
        f"{spread:.4g} (std over steps {used.steps[0]}-{used.steps[-1]}), less than {FLAT_RATIO:.2f} x the "
        f"noise {noise:.4g}, so even a replicate could not reach {used.checks.correlation.threshold}"))


def _moving_average(x: np.ndarray, half: int) -> np.ndarray:
    """Centred moving average over `half` logged steps on each side (truncated at the ends)."""
    return np.array([x[max(0, i - half): i + half + 1].mean() for i in range(len(x))])


def _trend_correlation(baseline: Curve, candidate: Curve, used: ConvergenceResult, failing: list[str],
                       cfg: NoiseConfig) -> Excuse | None:
    """Layout-only changes: the excuse for a failed correlation when the curves' trends (moving averages over
    the envelope's pooling window) correlate at the reference's threshold. Never for a data problem."""
    if (cfg.change != "layout" or "correlation" not in failing or used.checks is None or used.data_problems
            or len(used.steps) < 3):
        return None
    try:
        b = np.array([float(baseline[s]) for s in used.steps])  # type: ignore[arg-type]
        c = np.array([float(candidate[s]) for s in used.steps])  # type: ignore[arg-type]
    except (KeyError, TypeError):
        return None
    if not (np.all(np.isfinite(b)) and np.all(np.isfinite(c))):
        return None
    bs, cs = _moving_average(b, cfg.window), _moving_average(c, cfg.window)
    if np.std(bs) == 0 or np.std(cs) == 0:
        return None
    r = float(np.corrcoef(bs, cs)[0, 1])
    threshold = used.checks.correlation.threshold
    if not (math.isfinite(r) and r >= threshold):
        return None
    return Excuse(check="correlation", why=(
        f"correlation {used.checks.correlation.value:.3f} of the raw curves, {r:.3f} of their trends "
        f"(moving average over {cfg.window} logged steps on each side, the envelope's window) over steps "
        f"{used.steps[0]}-{used.steps[-1]}: a layout-only change is judged for drift and divergence, and its "
        f"trend follows the baseline's (threshold {threshold})"))


def _summary(passed: bool, na: NoiseAwareResult, ref: ConvergenceResult, excused: list[Excuse],
             reasons: list[str]) -> str:
    assumed = f" [assumed: {na.assumed()}]"
    if not passed:
        return "layer 2 rejects: " + "; ".join(reasons) + assumed
    return ("layer 2 passes: " + na.summary().removeprefix("noise-aware check passes ")
            + "; reference rule " + ("passes" if ref.passed else "passes after: "
                                     + "; ".join(x.why for x in excused)) + assumed)


def infer_change(baseline: Curve, candidate: Curve, cfg: NoiseConfig) -> tuple[NoiseConfig, DifferenceTest | None]:
    """For a change of unknown class: the layout judgment if and only if the difference curve looks like zero-mean,
    non-drifting noise under the difference test (`gate.noise.difference_test`), strict otherwise; the
    configuration to judge with (its `change_basis` says why) and the test. A given class is kept as it is."""
    if cfg.change != "unknown":
        return cfg, None
    test = difference_test(baseline, candidate, cfg.skip_fraction)
    if not test.noise_like:
        return cfg.model_copy(update={"change_basis": test.why}), test
    floor = max(cfg.floor_rel, floor_for(cfg.precision, "layout")) if cfg.precision in FLOOR_BY_PRECISION \
        else cfg.floor_rel
    return cfg.model_copy(update={"change": "layout", "floor_rel": floor, "change_basis": test.why}), test


# The reference rule is defined on a check run of 20 steps (shared/reference/convergence-check.md). A strict
# judgment (change class unknown or objective: every step at replicate level) of longer curves judges the whole
# curve AND its first CHECK_WINDOW_STEPS iterations alone, with the same inputs (`judge(..., check_window=True)`):
# over a long window the level test averages an early offset away and the point-wise test's 10% allowance absorbs
# it, so a candidate whose first 20 steps would fail the gate's own 20-step check could pass on 100. A layout
# judgment (layer 1 vouches for the change, or the difference test finds noise) is not re-judged on the early
# window: it deliberately does not judge early transients (docs/gate.md, "Layout-aware").
CHECK_WINDOW_STEPS = 20


def _head(curve: Curve, last: int) -> Curve:
    return {k: v for k, v in curve.items() if int(k) <= last}


def _check_window(baseline: Curve, candidate: Curve, replicates: Sequence[tuple[str, str, Curve]],
                  reference_config: ConvergenceConfig | None, ncfg: NoiseConfig,
                  candidate_runs: Sequence[tuple[str, Curve]], infer: bool) -> GateConvergence | None:
    """The strict judgment of the first CHECK_WINDOW_STEPS iterations of both curves, when they go beyond them
    and the window holds enough common steps to judge (None otherwise)."""
    keys = {int(k) for k in baseline} & {int(k) for k in candidate}
    # iteration 0 and 1 both start training (Megatron-LM counts from 1, other loggers and golden files from 0)
    last = max(min(keys), 1) + CHECK_WINDOW_STEPS - 1 if keys else 0
    if not keys or max(keys) <= last:
        return None  # the curves are no longer than the check window: the whole judgment is the window's
    base, cand = _head(baseline, last), _head(candidate, last)
    common = {int(k) for k in base} & {int(k) for k in cand}
    if len(common) < ncfg.min_steps:
        return None  # too few logged steps in the window (a curve logged every 5 steps): the whole curve decides
    reps = [(n, k, _head(r, last)) for n, k, r in replicates]
    cruns = [(n, _head(r, last)) for n, r in candidate_runs]
    return judge(base, cand, replicates=reps, reference_config=reference_config, noise_config=ncfg,
                 candidate_runs=cruns, infer=infer)


def judge(baseline: Curve, candidate: Curve, *, replicates: Sequence[tuple[str, str, Curve]] = (),
          envelope: NoiseEnvelope | None = None, reference_config: ConvergenceConfig | None = None,
          noise_config: NoiseConfig | None = None,
          candidate_runs: Sequence[tuple[str, Curve]] = (), infer: bool = False,
          check_window: bool = False) -> GateConvergence:
    """Both verdicts and the gate's combination. `replicates`: (name, kind, curve) runs of the baseline's objective;
    `candidate_runs`: (name, curve) runs of the candidate's recipe whose spread joins the noise model. `infer`: when
    the change class is unknown, judge it as a layout change if and only if the difference looks like noise
    (`infer_change`); the verdict's assumptions say which and why. Data problems reject in either mode.
    `check_window`: when the judgment is strict and the curves go beyond the reference's 20-step check window,
    the first CHECK_WINDOW_STEPS iterations must pass on their own too (`check_window` in the verdict)."""
    ncfg0 = noise_config or NoiseConfig()
    ncfg = ncfg0
    test: DifferenceTest | None = None
    if infer:
        ncfg, test = infer_change(baseline, candidate, ncfg)
    env = envelope or build_envelope(baseline, replicates, ncfg, candidate_runs)
    ref = check_convergence(baseline, candidate, reference_config)
    na = check_noise_aware(baseline, candidate, env, ncfg)
    excused: list[Excuse] = []
    used = ref
    common_ref: ConvergenceResult | None = None
    on_common = _on_common_steps(baseline, candidate, ref, reference_config)
    if on_common is not None:
        common_ref, excuse = on_common
        used = common_ref
        excused.append(excuse)
    failing = list(used.failed_checks)
    flat = _flat_window(baseline, used, env)
    if flat is not None:
        failing.remove("correlation")
        excused.append(flat)
    trend = _trend_correlation(baseline, candidate, used, failing, ncfg)
    if trend is not None:
        failing.remove("correlation")
        excused.append(trend)
    ref_ok = not failing and not used.data_problems
    reasons: list[str] = []
    if not na.passed:
        reasons += [f"noise-aware: {r}" for r in na.reasons]
    if not ref_ok:
        reasons += [f"reference: {r}" for r in used.reasons
                    if not (r.startswith("correlation") and "correlation" not in failing)]
    passed = na.passed and ref_ok
    head = None
    if check_window and envelope is None and ncfg.change != "layout":
        head = _check_window(baseline, candidate, replicates, reference_config, ncfg0, candidate_runs, infer)
    if head is not None and not head.passed:
        w = head.noise_aware.steps or head.reference.steps
        where = f"steps {w[0]}-{w[-1]}" if w else f"the first {CHECK_WINDOW_STEPS} steps"
        reasons += [f"check window ({where}, the reference's first {CHECK_WINDOW_STEPS} steps, judged on their "
                    f"own): {r}" for r in head.reasons]
        passed = False
    return GateConvergence(passed=passed, summary=_summary(passed, na, ref, excused, reasons), reasons=reasons,
                           reference=ref, reference_common=common_ref, reference_counts=ref_ok, excused=excused,
                           noise_aware=na, assumptions=na.assumptions, difference=test, check_window=head)


# A rejected verdict is *borderline* when the noise-aware check alone rejects it (layer 1 and the reference rule
# pass, no data problem) and every failed statistic lies within BORDERLINE_MARGIN times its limit (k = 4 noise
# units: up to 6). Why 1.5: the noise is estimated from a handful of runs, and its 95% upper bound is 1.4-2.1
# times the estimate for 15-5 differences (`upper_bound_factor`); a difference within 1.5x the limit is within
# what the estimate itself is unsure of. Shipping then asks for one replicate check run of the candidate.
BORDERLINE_MARGIN = 1.5


def borderline(g: GateConvergence, margin: float = BORDERLINE_MARGIN) -> dict[str, object]:
    """Whether a rejected verdict is within `margin` of its thresholds (see BORDERLINE_MARGIN), and why."""
    na = g.noise_aware
    out: dict[str, object] = {"borderline": False, "margin": margin, "ratio": None}
    if g.passed or na.data_problems or not g.reference_counts or not na.failed_checks:
        out["why"] = ("passed" if g.passed else "not the noise-aware check's alone (data problem or the reference "
                      "rule rejects): a replicate cannot change it")
        return out
    k = na.envelope.k_sigma
    ratios: dict[str, float | None] = {}
    if "level" in na.failed_checks and na.level:
        ratios["level"] = abs(na.level.mean_z) / k
    if "trend" in na.failed_checks and na.trend:
        ratios["trend"] = abs(na.trend.drift_z) / k
    if "gap" in na.failed_checks and na.gap:
        ratios["gap"] = abs(na.gap.mean_z) / k
    if "pointwise" in na.failed_checks and na.pointwise:
        pw = na.pointwise  # the step that would have to come inside for the check to pass
        ratios["pointwise"] = abs(pw.worst[pw.allowed].z) / k if pw.allowed < len(pw.worst) else None
    known = [v for v in ratios.values() if v is not None]
    ratio = max(known) if known and len(known) == len(ratios) else None
    out["ratio"] = ratio
    out["borderline"] = ratio is not None and ratio <= margin
    shown = ", ".join(f"{n} {v:.2f}x" if v is not None else f"{n} ?" for n, v in ratios.items())
    out["why"] = (f"the noise-aware check alone rejects, {shown} its limit "
                  + (f"(within {margin:g}x: borderline)" if out["borderline"] else f"(beyond {margin:g}x)"))
    return out


def curves_from(entries: Mapping[str, Curve]) -> list[tuple[str, str, Curve]]:
    """(name, kind, curve) triples from {"replicate:name": curve, "calibration:name": curve, ...}."""
    out: list[tuple[str, str, Curve]] = []
    for key, curve in entries.items():
        kind, _, name = key.partition(":")
        out.append((name or kind, kind if name else "replicate", curve))
    return out
