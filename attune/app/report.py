"""The campaign report: Markdown and a self-contained HTML page, both from the ledger.

The headline: baseline and shipped tokens/s/GPU (the final re-measurement where there is one,
else the calibration mean and the shipped run's own measurement), the gain, the band, the
GPU-hours the campaign used, launches and failed launches, cost per million tokens, MFU where the
model's FLOPs per token and the accelerator's peak are known, and payback days.

The plot is the best-so-far gain over the baseline against charged GPU-hours (a step curve, with
the band drawn as a dashed line), drawn as inline SVG so the page needs nothing from outside.
"""

from __future__ import annotations

import html
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attune.core import ledger as ledger_mod
from attune.core import textsafe
from attune.core.campaign_paths import CAMPAIGN_FILE, REPORT_HTML, REPORT_MD
from attune.core.hardware import peak_flops
from attune.core.measure import cost_per_million_tokens, gain, mfu, noise_note, payback_days
from attune.core.state import CampaignState, fold, gain_evidence
from attune.core.vocab import CUT_OUTCOMES, FAILED_OUTCOMES, RECIPE_FAILURES, RunKind, RunOutcome


@dataclass
class Headline:
    name: str | None
    gpus: int | None
    baseline_tps: float | None
    shipped_tps: float | None
    shipped_run_id: str | None
    gain: float | None
    band: float | None
    rel_sigma: float | None
    gpu_hours_used: float
    launches: int
    failed_launches: int
    failed_gpu_hours: float
    launches_refused: int
    baseline_cost_per_mtok: float | None = None
    shipped_cost_per_mtok: float | None = None
    baseline_mfu: float | None = None
    shipped_mfu: float | None = None
    payback_days: float | None = None
    remeasured: bool = False
    stop_reason: str | None = None
    final_gpu_hours: float = 0.0  # the final re-measurement, outside the budget
    outcome: str = "running"  # shipped | failed | running
    failure: str | None = None  # why the campaign ended failed (no valid evidence)
    infra_failed: int = 0  # runs of any kind that failed on infrastructure (counted in failed_launches too)
    unfinished: str | None = None  # why a campaign that is not running ended its last attempt unfinished
    noise: dict[str, Any] = field(default_factory=dict)  # attune.core.measure.noise_note: is the band too wide?
    gain_evidence: str | None = None  # unconfirmed | confirmed | not_confirmed (attune.core.state.gain_evidence)


@dataclass
class Report:
    headline: Headline
    curve: list[tuple[float, float]]  # (cumulative charged GPU-hours, best-so-far gain)
    leader_points: list[tuple[float, float, str]]
    runs: list[dict[str, Any]]
    shipped: dict[str, Any] | None
    checks: list[dict[str, Any]]
    assumptions: list[dict[str, Any]]
    stop: dict[str, Any] | None
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        h = self.headline.__dict__.copy()
        return {
            "headline": h,
            "curve": [{"gpu_hours": x, "best_gain": y} for x, y in self.curve],
            "runs": self.runs,
            "shipped": self.shipped,
            "checks": self.checks,
            "assumptions": self.assumptions,
            "stop": self.stop,
            "noise": h["noise"],
            "accounting": self.extra.get("accounting"),
        }


def _spec_facts(campaign_dir: Path) -> dict[str, Any]:
    """Price, accelerator, precision and FLOPs per token from the spec, where it loads."""
    try:
        from attune.control.spec import load_spec

        spec = load_spec(campaign_dir / CAMPAIGN_FILE)
    except Exception:  # a report is still useful without the spec
        return {}
    return {
        "price": spec.cluster.price_per_gpu_hour,
        "accelerator": spec.cluster.accelerator,
        "precision": spec.workload.precision,
        "flops_per_token": spec.workload.flops_per_token,
    }


def _remeasured(state: CampaignState, recipe_of: str) -> list[float]:
    """A recipe's final repeats: the valid ones, else (a busy machine) every one that measured something."""
    rows = [r for r in state.remeasurements if r.get("recipe_of") == recipe_of]
    valid = [float(r["tokens_per_s_per_gpu"]) for r in rows if r.get("valid", True)]
    return valid or [float(r["tokens_per_s_per_gpu"]) for r in rows]


def _best_so_far(
    rows: list[Any], base_mean: float | None
) -> tuple[list[tuple[float, float]], list[tuple[float, float, str]]]:
    """The best-so-far curve in ledger order, and the points where the leader changed."""
    cum = 0.0
    best = 0.0
    curve: list[tuple[float, float]] = [(0.0, 0.0)]
    leader_points: list[tuple[float, float, str]] = []
    for row in rows:
        if row.type == "run_finished" and row.data.get("charged_to", "budget") != "infra":
            cum += float(row.data["charge_gpu_hours"])
            curve.append((cum, best))
        elif row.type == "leader_changed" and base_mean:
            best = max(best, gain(float(row.data["tokens_per_s_per_gpu"]), base_mean))
            curve.append((cum, best))
            leader_points.append((cum, best, str(row.data["run_id"])))
    return curve, leader_points


def _shipped_throughput(
    state: CampaignState, base_mean: float | None
) -> tuple[float | None, float | None, bool]:
    """(baseline, shipped throughput, remeasured): the final repeats' means when both were re-measured,
    else the calibration's mean and the shipped recipe's own figure."""
    shipped = state.shipped
    if not shipped:
        return base_mean, None, False
    shipped_id = shipped.get("run_id")
    base_re = _remeasured(state, "baseline")
    ship_re = _remeasured(state, shipped_id or "baseline")
    if base_re and ship_re:
        return statistics.fmean(base_re), statistics.fmean(ship_re), True
    shipped_tps: float | None = None
    if shipped_id == "baseline":
        shipped_tps = base_mean
    elif shipped_id in state.runs:
        shipped_tps = state.runs[shipped_id].tokens_per_s_per_gpu
    if shipped.get("tokens_per_s_per_gpu") is not None:
        shipped_tps = float(shipped["tokens_per_s_per_gpu"])
    return base_mean, shipped_tps, False


def _add_costs(h: Headline, facts: dict[str, Any], used: float, gpus: int | None) -> None:
    """Cost per million tokens, MFU and payback, where the spec gives what they need."""
    price = facts.get("price")
    if price is not None:
        if h.baseline_tps:
            h.baseline_cost_per_mtok = cost_per_million_tokens(h.baseline_tps, price)
        if h.shipped_tps:
            h.shipped_cost_per_mtok = cost_per_million_tokens(h.shipped_tps, price)
    peak = peak_flops(facts.get("accelerator", ""), facts.get("precision", "")) if facts else None
    fpt = facts.get("flops_per_token")
    if peak and fpt:
        h.baseline_mfu = mfu(fpt, h.baseline_tps, peak) if h.baseline_tps else None
        h.shipped_mfu = mfu(fpt, h.shipped_tps, peak) if h.shipped_tps else None
    if h.gain is not None and gpus:
        h.payback_days = payback_days(used, gpus, h.gain)


def _run_row(state: CampaignState, r: Any, base_mean: float | None) -> dict[str, Any]:
    """One run's row in the report's table."""
    diagnosis = state.diagnoses.get(r.run_id) or {}
    return {
        "run_id": r.run_id,
        "kind": r.kind,
        "lever": r.lever,
        "hypothesis": r.hypothesis,
        "changes": r.changes,
        "outcome": r.outcome,
        "tokens_per_s_per_gpu": r.tokens_per_s_per_gpu,
        "gain": gain(r.tokens_per_s_per_gpu, base_mean) if (r.tokens_per_s_per_gpu and base_mean) else None,
        "charge_gpu_hours": r.charge_gpu_hours,
        "verdict": r.verdict,
        "valid": r.valid,
        "diagnosis": diagnosis.get("text"),
        "bottleneck": diagnosis.get("bottleneck"),
    }


def _unfinished(d: Path, state: CampaignState) -> str | None:
    """Why a campaign that nothing is advancing stopped short: its last stop refused, or its agent session
    ended unfinished. None: it may still be running."""
    from attune.core import session_end

    if state.in_flight:
        return None
    if state.stop is None and state.stop_refusal is not None:
        refusals = state.stop_refusal.get("refusals") or []
        codes = ", ".join(str(r.get("code")) for r in refusals) or "?"
        return (f"stopped short: the last stop was refused by the search rules ({codes}) and nothing is in "
                "flight; `attune status` lists what is missing")
    ended = session_end.read(str(d))
    if ended is not None:
        return f"stopped short: {ended.get('reason')}"
    return None


def build(campaign_dir: Path | str) -> Report:
    d = Path(campaign_dir)
    rows = ledger_mod.read(d).rows
    state = fold(rows)
    facts = _spec_facts(d)
    cal = state.calibration
    base_mean = cal.mean if cal else None

    curve, leader_points = _best_so_far(rows, base_mean)
    shipped = state.shipped
    baseline_tps, shipped_tps, remeasured = _shipped_throughput(state, base_mean)
    g = gain(shipped_tps, baseline_tps) if shipped_tps and baseline_tps else None

    searches = [r for r in state.runs.values() if r.kind == RunKind.SEARCH]
    # Every run the table shows as failed, whatever its kind: on the recipe or on infrastructure.
    failed = [r for r in state.runs.values() if r.outcome in FAILED_OUTCOMES]
    used = state.budget.charged
    h = Headline(
        name=state.name,
        outcome="failed" if state.failed else ("shipped" if state.shipped else "running"),
        failure=str(state.failed.get("reason")) if state.failed else None,
        gpus=state.gpus,
        baseline_tps=baseline_tps,
        shipped_tps=shipped_tps,
        shipped_run_id=shipped.get("run_id") if shipped else None,
        gain=g,
        band=cal.band if cal else None,
        rel_sigma=cal.rel_sigma if cal else None,
        gpu_hours_used=used,
        launches=len(searches),
        failed_launches=len(failed),
        failed_gpu_hours=sum(r.charge_gpu_hours for r in failed),
        launches_refused=state.launches_refused,
        remeasured=remeasured,
        stop_reason=(state.stop or {}).get("diagnosis"),
        final_gpu_hours=state.budget.final_charged,
        infra_failed=sum(1 for r in failed if r.outcome not in RECIPE_FAILURES),
        unfinished=None if (state.failed or state.shipped) else _unfinished(d, state),
    )
    _add_costs(h, facts, used, state.gpus)
    h.noise = noise_note(h.band)
    h.gain_evidence = gain_evidence(state, h.shipped_run_id or state.leader_run_id)
    runs = [_run_row(state, r, base_mean) for r in state.runs.values()]
    return Report(h, curve, leader_points, runs, shipped, list(state.checks), list(state.assumptions), state.stop,
                  extra={"accounting": accounting(state, rows)})


def accounting(state: CampaignState, rows: list[Any]) -> dict[str, Any]:
    """GPU-hours users can compare with the paper's Table 3: with and without calibration, where the
    shipped recipe was first measured (GPU-h and launch), and what failed and cut runs cost."""
    charged = state.budget.charged
    cal = sum(r.charge_gpu_hours for r in state.runs.values()
              if r.kind == RunKind.CALIBRATION and r.charged_to == "budget")
    failed = [r for r in state.runs.values() if r.outcome in FAILED_OUTCOMES]
    cut = [r for r in state.runs.values() if r.outcome in CUT_OUTCOMES]
    out: dict[str, Any] = {
        "gpu_hours_with_calibration": round(charged, 9),
        "gpu_hours_without_calibration": round(charged - cal, 9),
        "calibration_gpu_hours": round(cal, 9),
        "infra_charged_gpu_hours": round(state.budget.infra_charged, 9),
        "final_remeasurement_gpu_hours": round(state.budget.final_charged, 9),
        "failed_runs": len(failed), "failed_gpu_hours": round(sum(r.charge_gpu_hours for r in failed), 9),
        "cut_runs": len(cut), "cut_gpu_hours": round(sum(r.charge_gpu_hours for r in cut), 9),
        "overrun_runs": sum(1 for r in cut if r.outcome == RunOutcome.OVERRUN),
        "shipped_first_measured": _first_measured(state, rows),
    }
    return out


def _first_measured(state: CampaignState, rows: list[Any]) -> dict[str, Any] | None:
    """The launch (1-based, search launches in admission order) and the cumulative GPU-h (budget charges,
    with and without calibration) at which the shipped recipe was first measured."""
    shipped_id = (state.shipped or {}).get("run_id")
    if shipped_id is None or shipped_id not in state.runs:
        return None
    key = state.runs[shipped_id].recipe_key
    searches = sorted((r for r in state.runs.values() if r.kind == RunKind.SEARCH),
                      key=lambda r: r.admitted_seq or 0)
    first = next((r for r in searches if r.recipe_key == key and r.outcome == RunOutcome.OK
                  and r.tokens_per_s_per_gpu is not None), state.runs[shipped_id])
    cum = cum_cal = 0.0
    for row in rows:
        if row.type != "run_finished" or row.data.get("charged_to", "budget") != "budget":
            continue
        cum += float(row.data["charge_gpu_hours"])
        run = state.runs.get(row.data["run_id"])
        if run is not None and run.kind == RunKind.CALIBRATION:
            cum_cal += float(row.data["charge_gpu_hours"])
        if row.data["run_id"] == first.run_id:
            break
    return {"run_id": first.run_id, "launch": searches.index(first) + 1 if first in searches else None,
            "gpu_hours": round(cum, 9), "gpu_hours_without_calibration": round(cum - cum_cal, 9)}


# ---- rendering ---------------------------------------------------------------------------
def _f(x: float | None, spec: str = ",.1f") -> str:
    return "n/a" if x is None else format(x, spec)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.1%}"


def _changes(ch: dict[str, Any] | None) -> str:
    if not ch:
        return ""
    parts = []
    for section in ("args", "env"):
        for k, v in (ch.get(section) or {}).items():
            parts.append(f"{k}={'unset' if v is None else v}")
    if not parts:
        parts = [f"{k}={v}" for k, v in ch.items()]
    return ", ".join(parts)


def _diagnosis(run: dict[str, Any]) -> str:
    text = " ".join(str(run.get("diagnosis") or "").split())
    if run.get("bottleneck"):
        text = f"{run['bottleneck']}: {text}"
    return text.replace("|", "/")


def _hypotheses(runs: list[dict[str, Any]]) -> list[str]:
    """Each run's hypothesis for the table: a lever's description (the part before the first "; ") is shown on
    the lever's first row only; later rows show what they tried ("..." stands for the description)."""
    seen: dict[str, str] = {}
    out = []
    for run in runs:
        text = str(run.get("hypothesis") or "")
        base, sep, rest = text.partition("; ")
        lever = str(run.get("lever") or "")
        if sep and lever and seen.get(lever) == base:
            out.append(f"...; {rest}")
            continue
        if sep and lever:
            seen[lever] = base
        out.append(text)
    return out


def headline_lines(r: Report) -> list[tuple[str, str]]:
    h = r.headline
    outcome = {"failed": f"FAILED: {h.failure}", "shipped": "shipped"}.get(
        h.outcome, f"not finished: {h.unfinished}" if h.unfinished else "not finished yet")

    noisy = [("noise", str(h.noise["message"]))] if h.noise.get("noisy") else []
    return noisy + [
        ("outcome", outcome),
        ("baseline", f"{_f(h.baseline_tps)} tokens/s/GPU"),
        ("shipped", f"{_f(h.shipped_tps)} tokens/s/GPU ({h.shipped_run_id or 'nothing shipped yet'})"),
        ("gain", _pct(h.gain) + (" (final re-measurement)" if h.remeasured else "")
         + (" (unconfirmed: one measurement cleared the band)" if h.gain_evidence == "unconfirmed" else "")
         + (" (not confirmed by the re-measurement)" if h.gain_evidence == "not_confirmed" else "")),
        ("band", "n/a" if h.band is None else f"{h.band:.2%} (calibration sigma {h.rel_sigma:.2%})"),
        ("GPU-hours used", f"{h.gpu_hours_used:.4g}"
         + (f" (+{h.final_gpu_hours:.3g} for the final re-measurement)" if h.final_gpu_hours else "")),
        ("launches", f"{h.launches} search ({h.failed_launches} run(s) failed, {h.infra_failed} of them on "
                     f"infrastructure, {h.failed_gpu_hours:.3g} GPU-h; {h.launches_refused} refused before launch)"),
        ("cost per million tokens", f"{_f(h.baseline_cost_per_mtok, '.4g')} -> {_f(h.shipped_cost_per_mtok, '.4g')}"),
        ("MFU", "n/a (FLOPs per token or accelerator peak unknown)" if h.shipped_mfu is None
         else f"{h.baseline_mfu:.1%} -> {h.shipped_mfu:.1%}"),
        ("payback", "never (no gain)" if h.payback_days is None else f"{h.payback_days:.2f} days"),
    ]


def accounting_lines(r: Report) -> list[tuple[str, str]]:
    a = r.extra.get("accounting") or {}
    if not a:
        return []
    first = a.get("shipped_first_measured")
    return [
        ("charged, with calibration", f"{a['gpu_hours_with_calibration']:.4g} GPU-h"),
        ("charged, without calibration", f"{a['gpu_hours_without_calibration']:.4g} GPU-h"),
        ("shipped recipe first measured", "n/a" if not first else (
            f"{first['run_id']}, launch {first['launch']}, at {first['gpu_hours']:.4g} GPU-h "
            f"({first['gpu_hours_without_calibration']:.4g} without calibration)")),
        ("failed runs", f"{a['failed_runs']} ({a['failed_gpu_hours']:.4g} GPU-h)"),
        ("cut runs (early abort, charge bound)", f"{a['cut_runs']} ({a['cut_gpu_hours']:.4g} GPU-h)"),
    ]


def to_markdown(r: Report) -> str:
    out = [f"# attune campaign report: {r.headline.name}", ""]
    out += [f"- **{k}**: {v}" for k, v in headline_lines(r)]
    out += ["", "## Best-so-far gain against charged GPU-hours", "", "| GPU-hours | best gain |", "|---|---|"]
    out += [f"| {x:.4g} | {y:+.2%} |" for x, y in r.curve]
    out += ["", "## GPU-hours", ""] + [f"- {k}: {v}" for k, v in accounting_lines(r)]
    out += ["", "## Runs", "",
            "| run | kind | lever | change | hypothesis | outcome | tok/s/GPU | gain | GPU-h | verdict | diagnosis |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for run, hyp in zip(r.runs, _hypotheses(r.runs), strict=True):
        out.append(
            f"| {run['run_id']} | {run['kind']} | {run['lever'] or ''} | {_changes(run['changes'])} | "
            f"{hyp.replace('|', '/')} | {run['outcome'] or ''} | {_f(run['tokens_per_s_per_gpu'])} | "
            f"{_pct(run['gain'])} | {run['charge_gpu_hours']:.3g} | {run['verdict'] or ''} | {_diagnosis(run)} |"
        )
    out += ["", "## Shipped recipe", ""]
    if r.shipped:
        out.append(f"Shipped: **{r.shipped.get('run_id')}**; changes from the baseline: "
                   f"`{_changes(r.shipped.get('changes')) or 'none'}`")
    else:
        out.append("Nothing shipped yet.")
    if r.checks:
        out += ["", "### Correctness evidence", ""]
        for c in r.checks:
            out.append(f"- {c.get('candidate_run_id')}: {'passed' if c.get('passed') else 'rejected'} "
                       f"{json.dumps({k: v for k, v in c.items() if k not in ('seq',)}, default=str)}")
    if r.stop:
        out += ["", "## Stop", "", f"- diagnosis: {r.stop.get('diagnosis')}",
                f"- levers tested: {', '.join(map(str, r.stop.get('levers_tested') or []))}"]
    if r.assumptions:
        out += ["", "## Assumptions taken", ""] + [f"- {a.get('question')} -> {a.get('default')}" for a in r.assumptions]
    return "\n".join(out) + "\n"


def svg_plot(r: Report, width: int = 720, height: int = 320) -> str:
    ml, mr, mt, mb = 64, 20, 20, 44
    pw, ph = width - ml - mr, height - mt - mb
    xs = [x for x, _ in r.curve] or [0.0]
    ys = [y for _, y in r.curve] or [0.0]
    band = r.headline.band or 0.0
    xmax = max(max(xs), 1e-9)
    ymax = max(max(ys), band, 0.01) * 1.15
    ymin = min(0.0, min(ys))

    def sx(x: float) -> float:
        return ml + pw * x / xmax

    def sy(y: float) -> float:
        return mt + ph * (1 - (y - ymin) / (ymax - ymin))

    pts: list[str] = []
    prev_y = None
    for x, y in r.curve:
        if prev_y is not None:
            pts.append(f"{sx(x):.1f},{sy(prev_y):.1f}")
        pts.append(f"{sx(x):.1f},{sy(y):.1f}")
        prev_y = y
    ticks = []
    raw_step = (ymax - ymin) / 4
    mag = 10 ** math.floor(math.log10(raw_step))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw_step)
    yv = math.floor(ymin / step) * step
    while yv <= ymax + 1e-12:
        ticks.append(f'<line x1="{ml}" x2="{ml + pw}" y1="{sy(yv):.1f}" y2="{sy(yv):.1f}" stroke="#eee"/>'
                     f'<text x="{ml - 6}" y="{sy(yv) + 4:.1f}" text-anchor="end" font-size="11">{yv:+.0%}</text>')
        yv += step
    for i in range(5):
        xv = xmax * i / 4
        anchor = "end" if i == 4 else "middle"  # the last label ends at the axis' end, inside the picture
        ticks.append(f'<text x="{sx(xv):.1f}" y="{mt + ph + 16}" text-anchor="{anchor}" font-size="11">'
                     f'{_axis_number(xv)}</text>')
    marks = "".join(
        f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="4" fill="#1f77b4"><title>{html.escape(rid)}: {y:+.1%}</title></circle>'
        for x, y, rid in r.leader_points
    )
    band_line = (f'<line x1="{ml}" x2="{ml + pw}" y1="{sy(band):.1f}" y2="{sy(band):.1f}" stroke="#d62728" '
                 f'stroke-dasharray="6 4"/><text x="{ml + pw}" y="{sy(band) - 4:.1f}" text-anchor="end" '
                 f'font-size="11" fill="#d62728">band {band:.1%}</text>') if band else ""
    return (
        f'<svg id="gain-plot" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="best-so-far gain against GPU-hours">'
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="white"/>{"".join(ticks)}{band_line}'
        f'<line x1="{ml}" y1="{mt + ph}" x2="{ml + pw}" y2="{mt + ph}" stroke="#333"/>'
        f'<line x1="{ml}" y1="{mt}" x2="{ml}" y2="{mt + ph}" stroke="#333"/>'
        f'<polyline id="gain-curve" fill="none" stroke="#1f77b4" stroke-width="2.5" points="{" ".join(pts)}"/>{marks}'
        f'<text x="{ml + pw / 2}" y="{height - 8}" text-anchor="middle" font-size="12">charged GPU-hours</text>'
        f'<text x="14" y="{mt + ph / 2}" text-anchor="middle" font-size="12" transform="rotate(-90 14 {mt + ph / 2})">'
        f"best-so-far gain</text></svg>"
    )


def _axis_number(v: float) -> str:
    """A GPU-hour axis label: three significant digits, never in exponent form (1,410, not 1.41e+03)."""
    if v == 0:
        return "0"
    if abs(v) >= 100:
        return f"{round(v, 3 - len(str(int(abs(v))))):,.0f}"
    return f"{v:.3g}"


def to_html(r: Report) -> str:
    """The report page, through Jinja2 with autoescaping (templates/report.html.j2): every ledger and
    entry field is escaped; only the SVG plot (built from numbers, its one label escaped) is marked safe."""
    import jinja2
    from markupsafe import Markup

    env = jinja2.Environment(loader=jinja2.PackageLoader("attune.app", "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined)
    runs = [[str(c) for c in (
        run["run_id"], run["kind"], run["lever"] or "", _changes(run["changes"]), hyp,
        run["outcome"] or "", _f(run["tokens_per_s_per_gpu"]), _pct(run["gain"]),
        f"{run['charge_gpu_hours']:.3g}", run["verdict"] or "", _diagnosis(run))]
        for run, hyp in zip(r.runs, _hypotheses(r.runs), strict=True)]
    shipped = ({"run_id": str(r.shipped.get("run_id")), "changes": _changes(r.shipped.get("changes")) or "none"}
               if r.shipped else None)
    checks = [{"run_id": str(c.get("candidate_run_id")), "passed": bool(c.get("passed")),
               "detail": json.dumps({k: v for k, v in c.items() if k != "seq"}, default=str)} for c in r.checks]
    stop = ({"diagnosis": str(r.stop.get("diagnosis")),
             "levers": ", ".join(map(str, r.stop.get("levers_tested") or []))} if r.stop else None)
    return env.get_template("report.html.j2").render(
        name=str(r.headline.name), headline=list(headline_lines(r)),
        accounting=list(accounting_lines(r)), plot=Markup(svg_plot(r)),  # noqa: S704
        runs=runs, shipped=shipped, checks=checks, stop=stop)


def write(campaign_dir: Path | str) -> tuple[Path, Path, Report]:
    d = Path(campaign_dir)
    r = build(d)
    md, page = d / REPORT_MD, d / REPORT_HTML
    # report.md: agent-written text (hypotheses, diagnoses) without terminal control or remote images
    for path, text in ((md, textsafe.markdown(to_markdown(r))), (page, to_html(r))):
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    return md, page, r
