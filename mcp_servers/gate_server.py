"""The gate MCP server: the correctness gate for the agent, over stdio.

Tools:
- ``check_change``: before launching a candidate, a dry run of layer 1 on the
  baseline recipe plus the proposed changes.
- ``check_resolved_run``: layer 1 again on the fully resolved arguments of a check run.
- ``explain_argument``: an argument's class on the model (structural, same-math swap,
  numeric, frozen or unlisted), and why.
- ``check_convergence``: layer 2, a run's loss curve against the baseline's: the reference rule's
  verdict, the noise-aware check's (against replicates of the baseline, when given) and the gate's
  combination of the two.
- ``list_correctness_lists``: the built-in lists and their hashes.

Configuration (environment, set by the plugin's .mcp.json or the launcher):
- ``ATTUNE_GATE_MODEL``: the campaign's model list (a built-in name or a path). When
  set, a call may not name another model.
- ``ATTUNE_GATE_LIST_SHA256``: the hash the campaign pins; a list that differs is refused.
- ``ATTUNE_CAMPAIGN_DIR``: files named in calls (logs, loss curves) must lie under it
  (default: the working directory).

Logs go to stderr only; stdout is the transport.

Run: ``python -m mcp_servers.gate_server``.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, Field

from attune.core.containment import inside
from attune.core.recipe import ArgValue
from gate import config_check, convergence, inputs, judge, lists, noise

log = logging.getLogger("attune.gate_server")

# A gate tool also takes a list-valued flag as a JSON list (the recipe's own form is the joined words).
ToolArgValue = ArgValue | list[str | int | float | bool]


class Recipe(BaseModel):
    """A recipe in command-line form."""

    args: dict[str, ToolArgValue] = Field(default_factory=dict,
                                      description="Megatron flags with leading '--'; a bare flag is true; "
                                      "false/null means not given.")
    env: dict[str, str] = Field(default_factory=dict, description="Environment variables.")


class ChangeRow(BaseModel):
    name: str
    flag: str | None = None
    kind: str
    klass: str = Field(description="structural, same_math, numeric, frozen or unlisted")
    baseline: Any = None
    candidate: Any = None
    allowed: bool
    reason: str


class RefusalRow(BaseModel):
    name: str
    klass: str
    reason: str


class LayerOneReport(BaseModel):
    passed: bool
    model: str
    list_sha256: str
    mode: str
    summary: str
    changes: list[ChangeRow]
    refusals: list[RefusalRow]
    defects: list[str] = Field(description="Ids of known stack defects the candidate's configuration matches.")


class ArgumentInfo(BaseModel):
    model: str
    name: str
    kind: str
    klass: str = Field(description="structural, same_math, numeric, frozen or unlisted")
    why: str
    flag: str | None = None
    default: Any = None
    value: Any = Field(default=None, description="The pinned value, for a frozen argument.")
    values: list[Any] | None = Field(default=None, description="Allowed values, for a same-math swap.")
    component_test: str | None = None
    defects: list[str] = Field(default_factory=list, description="Known defects whose condition reads it.")
    verdict_on_change: str


class PointFailureRow(BaseModel):
    step: int
    candidate: float
    baseline: float
    rel_diff: float
    tolerance: float


class ConvergenceReport(BaseModel):
    passed: bool = Field(description="Layer 2's verdict: the noise-aware check and the reference rule combined.")
    summary: str
    reasons: list[str] = Field(description="Why layer 2 rejects, each naming the check ('reference: ...', 'noise-aware: ...').")
    assumed: str = Field(description="What the verdict assumes, in one line: precision, noise source, change class, window.")
    precision: str = Field(description="'fp32', 'bf16' or 'fp16': the precision the floor was set for.")
    precision_source: str = Field(description="'given', 'log' (the baseline's arguments) or 'default' (assumed).")
    noise_source: str = Field(description="'replicates', 'calibration', 'deterministic', 'floor', ...")
    reference_passed: bool = Field(description="The reference rule (Megatron-Bridge's) alone, on the curves as given.")
    reference_summary: str
    noise_aware_passed: bool = Field(description="The noise-aware check alone.")
    noise_aware_summary: str
    noise_aware_failed_checks: list[str] = Field(description="'level', 'trend', 'pointwise'.")
    noise_level_z: float | None = Field(description="Mean difference from the baseline, in noise units (limit k_sigma).")
    noise_trend_z: float | None = Field(description="Drift of the difference over the window, in noise units.")
    noise_outside_steps: int | None = Field(description="Steps outside the envelope.")
    envelope_basis: str = Field(description="What the noise envelope rests on (replicates, determinism, floor).")
    excused: list[str] = Field(description="Reference failures the combination excuses, and why (flat window, logging).")
    notes: list[str] = Field(description="What was compared and what was not (logging intervals, partial overlap).")
    failed_checks: list[str] = Field(description="The reference rule's failed checks.")
    data_problems: list[str]
    n_steps: int
    skipped: int
    correlation: float | None = Field(description="Pearson r after the skip (null when undefined).")
    correlation_passed: bool | None
    pointwise_failing_steps: int | None
    pointwise_ratio: float | None
    pointwise_max_rel_diff: float | None
    pointwise_passed: bool | None
    final_loss_rel_diff: float | None
    final_loss_passed: bool | None
    outlier_count: int | None
    outlier_ratio: float | None
    outliers_passed: bool | None
    max_rel_deviation: float | None = Field(description="Largest relative loss difference over all common steps.")
    failures: list[PointFailureRow] = Field(description="Point-wise failures, one page.")
    failures_total: int
    next_offset: int | None = Field(description="Offset of the next page of failures; null when none.")


class ListRow(BaseModel):
    model: str
    sha256: str
    args: int
    defects: list[str]


server = MCPServer(
    name="attune-gate",
    instructions=(
        "The correctness gate. Call check_change before proposing any launch; a refused change must not be "
        "launched. Call explain_argument when unsure whether a flag may change. check_convergence compares "
        "a run's 20-step loss with the baseline's; check_resolved_run re-checks a check run's resolved arguments."
    ),
)


def _campaign_root() -> Path:
    return Path(os.environ.get("ATTUNE_CAMPAIGN_DIR") or os.getcwd()).resolve()


def _path(p: str) -> Path:
    root = _campaign_root()
    full = (root / p).resolve() if not Path(p).is_absolute() else Path(p).resolve()
    if not inside(full, root):
        raise ToolError(f"{p}: outside the campaign directory {root}; the gate reads only campaign files")
    return full


def _loaded(model: str | None) -> lists.LoadedList:
    pinned_model = os.environ.get("ATTUNE_GATE_MODEL") or None
    pinned_sha = os.environ.get("ATTUNE_GATE_LIST_SHA256") or None
    if pinned_model and model and model != pinned_model:
        raise ToolError(f"this campaign's gate is pinned to {pinned_model!r}; it cannot check {model!r}")
    name = model or pinned_model
    if not name:
        raise ToolError(f"name the model; built-in lists: {', '.join(lists.builtin_models())}")
    try:
        return lists.load_list(name, expected_sha256=pinned_sha)
    except lists.ListError as exc:
        raise ToolError(str(exc)) from exc


def _report(result: config_check.ConfigCheckResult) -> LayerOneReport:
    return LayerOneReport(
        passed=result.passed, model=result.model, list_sha256=result.list_sha256, mode=result.mode,
        summary=result.summary(),
        changes=[ChangeRow(name=c.name, flag=c.flag, kind=c.kind, klass=c.klass, baseline=c.baseline,
                           candidate=c.candidate, allowed=c.allowed, reason=c.reason) for c in result.changes],
        refusals=[RefusalRow(name=r.name, klass=r.klass, reason=r.reason) for r in result.refusals],
        defects=[d.id for d in result.defects],
    )


@server.tool()
def check_change(
    baseline: Annotated[Recipe, Field(description="The leader's (or baseline's) recipe.")],
    args: Annotated[dict[str, ToolArgValue], Field(description="Flag changes: {'--tensor-model-parallel-size': 2, "
                                               "'--sequence-parallel': true}; null or false removes a flag.")] = {},  # noqa: B006
    env: Annotated[dict[str, str | None], Field(description="Environment changes; null unsets.")] = {},  # noqa: B006
    model: Annotated[str | None, Field(description="Model list; defaults to the campaign's.")] = None,
) -> LayerOneReport:
    """Dry-run layer 1 of the correctness gate on a proposed candidate, before launching it.

    Call this for every candidate before asking the broker to launch it. Each changed flag and
    environment variable is classified against the model's correctness list; numeric, frozen and
    unlisted changes, untested or out-of-range same-math swaps, and known stack defects are refused,
    each with the argument, its class and the reason. A refused candidate will not be launched.
    """
    loaded = _loaded(model)
    cand_args = config_check.apply_changes(baseline.args, args)
    cand_env = dict(baseline.env)
    for k, v in env.items():
        if v is None:
            cand_env.pop(k, None)
        else:
            cand_env[k] = v
    try:
        result = config_check.check_recipe(loaded, baseline.args, cand_args, baseline.env, cand_env)
    except ValueError as exc:
        raise ToolError(str(exc)) from exc
    log.info("check_change %s: %s", loaded.model, "pass" if result.passed else "refused")
    return _report(result)


@server.tool()
def check_resolved_run(
    baseline_log: Annotated[str, Field(description="Baseline run's log (or resolved-args JSON), in the campaign dir.")],
    candidate_log: Annotated[str, Field(description="Check run's log (or resolved-args JSON), in the campaign dir.")],
    baseline_env: Annotated[dict[str, str] | None, Field(description="Baseline run's resolved environment.")] = None,
    candidate_env: Annotated[dict[str, str] | None, Field(description="Check run's resolved environment.")] = None,
    model: Annotated[str | None, Field(description="Model list; defaults to the campaign's.")] = None,
) -> LayerOneReport:
    """Layer 1 on the fully resolved arguments and environment of a check run, against the baseline's.

    Call this on a final candidate's check run, before its convergence check: it catches a flag
    that silently changed another argument (e.g. a BF16 gradient reduction turning off FP32 accumulation).
    """
    loaded = _loaded(model)
    try:
        b_args, b_env = inputs.load_resolved(_path(baseline_log))
        c_args, c_env = inputs.load_resolved(_path(candidate_log))
    except inputs.GateInputError as exc:
        raise ToolError(str(exc)) from exc
    result = config_check.check_resolved(loaded, b_args, c_args, {**b_env, **(baseline_env or {})},
                                         {**c_env, **(candidate_env or {})})
    return _report(result)


@server.tool()
def explain_argument(
    name: Annotated[str, Field(description="A flag (--sequence-parallel), attribute (sequence_parallel) or "
                               "environment variable (NCCL_ALGO).")],
    model: Annotated[str | None, Field(description="Model list; defaults to the campaign's.")] = None,
) -> ArgumentInfo:
    """Explain an argument's class on the model and whether a change to it may run.

    Call this when planning a lever, to learn whether the gate will accept changing it (and to which values).
    """
    loaded = _loaded(model)
    info = config_check.explain_arg(loaded, name)
    return ArgumentInfo(model=loaded.model, name=info["name"], kind=info["kind"], klass=info["class"],
                        why=info["why"], flag=info.get("flag"), default=info.get("default"),
                        value=info.get("value"), values=info.get("values"),
                        component_test=info.get("component_test"), defects=info.get("defects", []),
                        verdict_on_change=info["verdict_on_change"])


def _inline_curve(losses: dict[str, float | str | None], label: str) -> dict[int, float | None]:
    out: dict[int, float | None] = {}
    for k, v in losses.items():
        try:
            step = int(k)
        except ValueError:
            raise ToolError(f"{label}: step {k!r} is not an integer") from None
        if v is None:
            out[step] = None
        else:
            try:
                out[step] = float(v)
            except ValueError:
                raise ToolError(f"{label}: loss at step {k} must be a number, null or 'nan'/'inf'") from None
    if not out:
        raise ToolError(f"{label}: empty loss curve")
    return out


def _curve(path: str | None, losses: dict[str, float | str | None] | None, label: str) -> dict[int, float | None]:
    if (path is None) == (losses is None):
        raise ToolError(f"give exactly one of {label} (a file) or {label}_losses (inline)")
    if losses is not None:
        return _inline_curve(losses, f"{label}_losses")
    try:
        return inputs.load_curve(_path(path))  # type: ignore[arg-type]
    except inputs.GateInputError as exc:
        raise ToolError(str(exc)) from exc


def _log_precision(path: str | None) -> tuple[str, str]:
    """(precision, 'log') from a baseline log's arguments block; (the default, 'default') when it cannot be
    read (inline or JSON curves, a log without the block): the same resolution as `attune gate converge`."""
    if path is None:
        return noise.precision_from(None)
    from attune.readers.metrics import read_resolved_args

    try:
        return noise.precision_from(read_resolved_args(_path(path), inputs.DEFAULT_FRAMEWORK))
    except (OSError, ValueError):
        return noise.precision_from(None)


def _finite_or_none(x: float | None) -> float | None:
    return x if x is None or math.isfinite(x) else None


@server.tool()
def check_convergence(
    baseline: Annotated[str | None, Field(description="Baseline log or JSON {step: loss} file, in the campaign dir.")] = None,
    candidate: Annotated[str | None, Field(description="Candidate run's log or JSON {step: loss} file.")] = None,
    baseline_losses: Annotated[dict[str, float | str | None] | None, Field(description="Inline baseline curve.")] = None,
    candidate_losses: Annotated[dict[str, float | str | None] | None, Field(description="Inline candidate curve.")] = None,
    failures_offset: Annotated[int, Field(ge=0, description="Page offset into the point-wise failures.")] = 0,
    failures_limit: Annotated[int, Field(ge=1, le=100, description="Page size of point-wise failures.")] = 10,
    replicates: Annotated[list[str] | None, Field(max_length=16, description=(
        "Logs or JSON curves of other runs of the baseline's recipe (replicate check runs, calibration runs), "
        "in the campaign dir: they set the noise envelope."))] = None,
    precision: Annotated[str | None, Field(description=(
        "'fp32', 'bf16' or 'fp16': sets the noise floor (default: from the baseline log's arguments; when they "
        "cannot be read, bf16 is assumed and the result says so)."))] = None,
    change: Annotated[Literal["unknown", "layout"], Field(description=(
        "What layer 1 says changed: 'layout' (check_change found only structural / same-math changes: judged for "
        "drift and divergence) or 'unknown' (default: every step held to the noise envelope)."))] = "unknown",
) -> ConvergenceReport:
    """Layer 2: compare a run's loss curve with the baseline's (same data and seed).

    Call this on a final candidate's check run. It returns two verdicts and the gate's combination:
    the reference rule (correlation, point-wise tolerance, final loss, outliers) and the noise-aware
    check (the candidate's difference from the baseline against how much runs of the baseline's own
    recipe differ: level, trend, steps outside the envelope). NaN/inf losses and missing steps reject.
    """
    base = _curve(baseline, baseline_losses, "baseline")
    cand = _curve(candidate, candidate_losses, "candidate")
    reps = [(Path(p).name, "replicate", _curve(p, None, "replicates")) for p in (replicates or [])]
    if precision is not None and precision not in noise.FLOOR_BY_PRECISION:
        raise ToolError(f"precision: expected one of {sorted(noise.FLOOR_BY_PRECISION)}, got {precision!r}")
    precision, source = (precision, "given") if precision is not None else _log_precision(baseline)
    # as `attune gate converge`: a strict judgment of a curve longer than 20 steps also judges its first 20 alone
    g = judge.judge(base, cand, replicates=reps, noise_config=noise.config_for(precision, source, change=change),
                    check_window=True)
    r, na = g.reference, g.noise_aware
    dev = convergence.loss_deviation(base, cand)
    c = r.checks
    failures = c.pointwise.failures if c else []
    page = failures[failures_offset:failures_offset + failures_limit]
    nxt = failures_offset + failures_limit
    return ConvergenceReport(
        passed=g.passed, summary=g.summary, reasons=g.reasons, assumed=na.assumed(), precision=precision,
        precision_source=source, noise_source=g.assumptions.noise_source if g.assumptions else "floor",
        reference_passed=r.passed, reference_summary=r.summary(),
        noise_aware_passed=na.passed, noise_aware_summary=na.summary(), noise_aware_failed_checks=na.failed_checks,
        noise_level_z=na.level.mean_z if na.level else None, noise_trend_z=na.trend.drift_z if na.trend else None,
        noise_outside_steps=na.pointwise.outside if na.pointwise else None, envelope_basis=na.envelope.basis,
        excused=[f"{e.check}: {e.why}" for e in g.excused], notes=na.notes, failed_checks=r.failed_checks,
        data_problems=r.data_problems, n_steps=r.n_steps, skipped=r.skipped,
        correlation=c.correlation.value if c else None, correlation_passed=c.correlation.passed if c else None,
        pointwise_failing_steps=c.pointwise.failing_steps if c else None,
        pointwise_ratio=c.pointwise.ratio if c else None,
        pointwise_max_rel_diff=c.pointwise.max_rel_diff if c else None,
        pointwise_passed=c.pointwise.passed if c else None,
        final_loss_rel_diff=c.final_loss.rel_diff if c else None, final_loss_passed=c.final_loss.passed if c else None,
        outlier_count=c.outliers.count if c else None, outlier_ratio=c.outliers.ratio if c else None,
        outliers_passed=c.outliers.passed if c else None, max_rel_deviation=_finite_or_none(dev["max_rel"]),
        failures=[PointFailureRow(**f.model_dump()) for f in page], failures_total=len(failures),
        next_offset=nxt if nxt < len(failures) else None,
    )


@server.tool()
def list_correctness_lists() -> list[ListRow]:
    """The built-in correctness lists with their SHA-256 (what a campaign pins). Rarely needed by the agent."""
    rows = []
    for m in lists.builtin_models():
        loaded = lists.load_list(m)
        rows.append(ListRow(model=m, sha256=loaded.sha256, args=len(loaded.clist.args),
                            defects=[d.id for d in loaded.clist.defects]))
    return rows


def main() -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
    server.run("stdio")


if __name__ == "__main__":
    main()
