"""The metrics MCP server: what a campaign's runs measured, for the agent, over stdio.

Tools:
- ``run_metrics``: one run's windowed throughput, its validity, failure class, per-stage
  memory, loss summary, and (paged) per-step records and named arguments.
- ``compare_runs``: two runs side by side: throughput gain, step time, memory, loss curves.
- ``campaign_measurements``: the campaign so far from its ledger: the leader, the band, and
  every run's outcome, throughput and verdict (paged).

Configuration: ``ATTUNE_CAMPAIGN_DIR`` is the campaign directory (default: the working
directory). Its ``campaign.yaml`` gives the framework (log format), GPU count, window and
workload; a run's log is ``runs/<run-id>/log.txt``. Run ids are directory names: anything
with a path separator or ``..`` is refused.

Logs go to stderr only; stdout is the transport. Run: ``python -m mcp_servers.metrics_server``.
"""

from __future__ import annotations

import fnmatch
import logging
import math
import os
import re
import time
from collections import OrderedDict
from pathlib import Path
from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, Field

from attune.control.spec import CampaignSpec, SpecError, load_spec
from attune.core import ledger as ledger_mod
from attune.core import measure
from attune.core import state as state_mod
from attune.core.campaign_paths import CAMPAIGN_FILE, RUN_LOG, RUNS_DIR
from attune.core.containment import inside
from attune.core.vocab import RunKind, RunOutcome, Verdict
from attune.readers.metrics import DEFAULT_MAX_SPREAD, MetricsInputError, RunMetrics, read_metrics

log = logging.getLogger("attune.metrics_server")

CAMPAIGN_ENV = "ATTUNE_CAMPAIGN_DIR"
RUN_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
_RUN_ID = re.compile(RUN_ID_PATTERN)
CACHE_SIZE = 32
MAX_ARGUMENTS = 200
MAX_EVIDENCE = 3

RunId = Annotated[
    str,
    Field(description="the run's directory name under runs/ (no path separators, no '..')", max_length=128),
]


# ------------------------------------------------------------------ output models


class Page(BaseModel):
    offset: int
    limit: int
    total: int
    next_offset: int | None = Field(description="offset of the next page; null on the last page")


class StepOut(BaseModel):
    iteration: int = Field(description="as logged, 1-based; step = iteration - 1")
    step: int
    in_window: bool
    step_time_ms: float | None
    loss: float | None = Field(description="null when the log has none (NaN or negative loss)")
    global_batch_size: int | None = None
    extra_losses: dict[str, float | None] | None = None
    skipped_iterations: int | None = None
    nan_iterations: int | None = None
    grad_norm: float | None = None
    tokens_per_s_per_device: float | None = None
    problems: list[str] | None = None


class StageMemory(BaseModel):
    stage: int
    ranks: list[int]
    max_allocated_mib: float | None
    max_reserved_mib: float | None


class RankMemory(BaseModel):
    rank: int | None
    stage: int | None
    max_allocated_mib: float | None
    max_reserved_mib: float | None


class MemoryOut(BaseModel):
    unit: str = "MiB"
    peak_max_allocated_mib: float | None
    peak_max_reserved_mib: float | None
    per_stage: list[StageMemory] | None = Field(description="null when the log does not give the pipeline layout")
    per_rank: list[RankMemory] = Field(description="the first 16 ranks that reported memory")
    ranks_reported: int


class LossPoint(BaseModel):
    iteration: int
    value: float


class LossOut(BaseModel):
    first: LossPoint | None
    last: LossPoint | None
    window_mean: float | None
    missing_or_nan_iterations: list[int]


class Evidence(BaseModel):
    failure_class: str
    line: int
    text: str


class RunMetricsResult(BaseModel):
    run_id: str
    framework: str
    gpus: int
    window_iterations: tuple[int, int] = Field(description="first and last measured iteration (inclusive)")
    seq_length: int | None
    tokens_per_s_per_gpu: float | None = Field(description="sum(tokens) / (GPUs x sum(step times)) over the window")
    valid: bool
    invalid_reasons: list[str]
    window_spread: float | None = Field(description="coefficient of variation of the window's step times")
    max_spread: float
    window_step_time_ms: dict[str, float] | None = Field(description="mean, min, max over the window")
    failure_class: str = Field(description="ok, oom, hang, crash or infrastructure")
    failure_reason: str
    failure_evidence: list[Evidence]
    last_iteration: int | None
    train_iters: int | None
    ledger_status: str | None = Field(description="the run's status in the ledger (admitted, running, finished)")
    ledger_outcome: str | None = Field(description="the outcome the ledger recorded, once finished")
    loss: LossOut
    memory: MemoryOut
    steps: list[StepOut]
    steps_page: Page
    arguments: dict[str, str] = Field(description="the requested resolved arguments, by name")
    argument_count: int = Field(description="arguments in the log's arguments block")
    warnings: list[str]


class RunBrief(BaseModel):
    run_id: str
    tokens_per_s_per_gpu: float | None
    valid: bool
    invalid_reasons: list[str] = Field(description="the first three")
    failure_class: str
    window_step_time_ms_mean: float | None
    window_spread: float | None
    peak_max_allocated_mib: float | None
    peak_max_reserved_mib: float | None
    stage_max_allocated_mib: list[float | None] | None = Field(description="per pipeline stage, in stage order")
    last_loss: LossPoint | None


class LossDiff(BaseModel):
    iteration: int
    a: float
    b: float
    abs_diff: float


class LossComparison(BaseModel):
    iterations_compared: int
    max_abs_diff: float | None
    max_rel_diff: float | None
    worst_iteration: int | None
    only_in_a: list[int]
    only_in_b: list[int]
    largest: list[LossDiff] = Field(description="the five iterations where the losses differ most")


class CompareResult(BaseModel):
    a: RunBrief
    b: RunBrief
    gain_b_over_a: float | None = Field(description="b's throughput / a's - 1; null unless both were measured")
    band: float | None = Field(description="the campaign's noise band, once calibrated")
    beyond_band: bool | None = Field(description="|gain| exceeds the band")
    step_time_ms_delta: float | None = Field(description="b's window mean step time - a's")
    peak_max_allocated_mib_delta: float | None
    loss: LossComparison
    notes: list[str]


class BandOut(BaseModel):
    runs: int
    required_runs: int
    values: list[float]
    mean: float | None
    rel_sigma: float | None
    band: float | None = Field(description="max(floor, k x relative sigma); null until calibrated")


class LeaderOut(BaseModel):
    run_id: str | None
    tokens_per_s_per_gpu: float | None
    gain_over_baseline: float | None


class RunVerdict(BaseModel):
    run_id: str
    kind: str
    status: str
    outcome: str | None
    tokens_per_s_per_gpu: float | None
    valid: bool | None
    invalid_reasons: list[str] = Field(description="the first two")
    gain_over_baseline: float | None
    gain_over_leader: float | None
    verdict: str
    verdict_source: str = Field(description="ledger: recorded by the control plane; derived: computed here")
    lever: str | None
    changes: dict[str, Any]
    charge_gpu_hours: float


class CampaignMeasurements(BaseModel):
    campaign: str | None
    gpus: int | None
    rows: int
    band: BandOut
    leader: LeaderOut
    budget_remaining_gpu_hours: float | None
    search_remaining_gpu_hours: float | None
    verdict_counts: dict[str, int]
    runs: list[RunVerdict]
    page: Page


# ------------------------------------------------------------------ campaign access


def campaign_dir() -> Path:
    return Path(os.environ.get(CAMPAIGN_ENV) or os.getcwd()).resolve()


def _spec(directory: Path) -> CampaignSpec:
    path = directory / CAMPAIGN_FILE
    if not path.is_file():
        raise ToolError(f"no campaign.yaml in {directory} (set {CAMPAIGN_ENV} to the campaign directory)")
    try:
        return load_spec(path)
    except SpecError as exc:
        raise ToolError(str(exc)) from None


def _state(directory: Path) -> state_mod.CampaignState | None:
    if not (directory / ledger_mod.LEDGER_NAME).is_file():
        return None
    try:
        state, _ = state_mod.load(directory)
    except ledger_mod.LedgerError as exc:
        raise ToolError(f"the ledger cannot be read: {exc}") from None
    return state


def run_log_path(directory: Path, run_id: str) -> Path:
    """runs/<run_id>/log.txt inside the campaign; refuses ids that could leave runs/."""
    if not _RUN_ID.match(run_id) or ".." in run_id:
        raise ToolError(
            f"run_id: expected a run directory name (letters, digits, '.', '_', '-'; no path separators "
            f"or '..'), got {run_id!r}"
        )
    runs = (directory / RUNS_DIR).resolve()
    path = (runs / run_id / RUN_LOG).resolve()
    if not inside(path, runs):
        raise ToolError(f"run_id: {run_id!r} leads outside the campaign's runs directory")
    if not path.is_file():
        raise ToolError(f"run {run_id!r}: no log at runs/{run_id}/log.txt")
    return path


_CACHE: OrderedDict[tuple[Any, ...], RunMetrics] = OrderedDict()


def _metrics(
    directory: Path,
    run_id: str,
    *,
    max_spread: float | None,
    exit_status: int | None,
    state: state_mod.CampaignState | None,
) -> RunMetrics:
    spec = _spec(directory)
    path = run_log_path(directory, run_id)
    st = path.stat()
    run = state.runs.get(run_id) if state else None
    # A run the ledger still has in flight: how long its log has been quiet tells a hang.
    quiet = time.time() - st.st_mtime if run is not None and run.status != "finished" else None
    spread = spec.workload.max_step_time_spread if max_spread is None else max_spread
    key = (str(path), st.st_size, st.st_mtime_ns, spread, exit_status, quiet is not None and quiet // 60)
    cached = _CACHE.get(key)
    if cached is not None:
        _CACHE.move_to_end(key)
        return cached
    try:
        # the campaign's scoring options (the control plane's, hang timeout included); the spread may be overridden
        metrics = read_metrics(path, **{**spec.metrics_options(), "max_spread": spread}, exit_status=exit_status,
                               seconds_since_progress=quiet)
    except MetricsInputError as exc:
        raise ToolError(f"run {run_id!r}: {exc}") from None
    except OSError as exc:
        raise ToolError(f"run {run_id!r}: cannot read its log: {exc.strerror or exc}") from None
    _CACHE[key] = metrics
    while len(_CACHE) > CACHE_SIZE:
        _CACHE.popitem(last=False)
    log.info("read %s: %d bytes, %d steps", path, metrics.bytes_read, len(metrics.steps))
    return metrics


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def _memory(m: RunMetrics) -> MemoryOut:
    d = m.memory_dict()
    return MemoryOut(
        peak_max_allocated_mib=d["peak_max_allocated_mib"],
        peak_max_reserved_mib=d["peak_max_reserved_mib"],
        per_stage=[StageMemory(**s) for s in d["per_stage"]] if d["per_stage"] else None,
        per_rank=[
            RankMemory(rank=r["rank"], stage=r["stage"], max_allocated_mib=r["max_allocated_mib"],
                       max_reserved_mib=r["max_reserved_mib"])
            for r in d["per_rank"][:16]
        ],
        ranks_reported=len(d["per_rank"]),
    )


def _loss(m: RunMetrics) -> LossOut:
    d = m.loss_dict()
    return LossOut(
        first=LossPoint(**d["first"]) if d["first"] else None,
        last=LossPoint(**d["last"]) if d["last"] else None,
        window_mean=d["window_mean"],
        missing_or_nan_iterations=d["missing_or_nan_iterations"][:50],
    )


def _select_arguments(arguments: dict[str, str], names: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pattern in names:
        key = pattern.lstrip("-").replace("-", "_")  # "--seq-length" and "seq_length" both work
        matches = fnmatch.filter(arguments, key) if "*" in key else ([key] if key in arguments else [])
        for name in matches:
            out[name] = arguments[name]
            if len(out) >= MAX_ARGUMENTS:
                return out
    return out


def _page(total: int, offset: int, limit: int) -> Page:
    end = min(total, offset + limit)
    return Page(offset=offset, limit=limit, total=total, next_offset=end if end < total else None)


# ------------------------------------------------------------------ the server

server = MCPServer(
    name="attune-metrics",
    instructions=(
        "Measured results of this campaign's training runs. Call run_metrics after a run finishes (or to "
        "check one in flight), compare_runs to see what a change did against another run, and "
        "campaign_measurements for the leader, the noise band and every run's verdict so far."
    ),
)


@server.tool()
def run_metrics(
    run_id: RunId,
    steps_offset: Annotated[int, Field(ge=0, description="first per-step record to return")] = 0,
    steps_limit: Annotated[int, Field(ge=0, le=500, description="per-step records to return")] = 20,
    arguments: Annotated[
        list[str],
        Field(description="resolved arguments to return, by name ('seq_length' or '--seq-length'); "
              "'moe_*' style patterns allowed", max_length=50),
    ] = [],  # noqa: B006 - pydantic copies defaults
    max_spread: Annotated[
        float | None, Field(ge=0, description=f"largest valid window spread (default {DEFAULT_MAX_SPREAD})")
    ] = None,
    exit_status: Annotated[int | None, Field(description="the job's exit status, if you know it")] = None,
) -> RunMetricsResult:
    """A run's measured metrics from its log: throughput over the measured window (tokens/s/GPU),
    whether that measurement is valid and why not, the failure class (ok, oom, hang, crash,
    infrastructure) with the log lines that show it, peak memory per pipeline stage, and the loss.

    Call it when a run has finished, before deciding on the next candidate, or to look at a run
    still in flight (a quiet log counts as a hang). Per-step records are paged (steps_offset,
    steps_limit); name the resolved arguments you want to see in `arguments`.
    """
    directory = campaign_dir()
    state = _state(directory)
    m = _metrics(directory, run_id, max_spread=max_spread, exit_status=exit_status, state=state)
    run = state.runs.get(run_id) if state else None
    its = m.window_iterations
    page_steps = m.steps[steps_offset : steps_offset + steps_limit]
    return RunMetricsResult(
        run_id=run_id,
        framework=m.framework,
        gpus=m.gpus,
        window_iterations=(its[0], its[-1]),
        seq_length=m.seq_length,
        tokens_per_s_per_gpu=m.tokens_per_s_per_gpu,
        valid=m.valid,
        invalid_reasons=m.invalid_reasons[:20],
        window_spread=m.window_spread,
        max_spread=m.max_spread,
        window_step_time_ms=m.window_step_time_ms,
        failure_class=m.failure_class,
        failure_reason=m.verdict.reason,
        failure_evidence=[
            Evidence(failure_class=s.failure_class, line=s.line, text=s.text)
            for s in m.verdict.evidence[:MAX_EVIDENCE]
        ],
        last_iteration=m.last_iteration,
        train_iters=m.train_iters,
        ledger_status=run.status if run else None,
        ledger_outcome=run.outcome if run else None,
        loss=_loss(m),
        memory=_memory(m),
        steps=[StepOut(**{k: v for k, v in m.step_dict(r).items() if k in StepOut.model_fields}) for r in page_steps],
        steps_page=_page(len(m.steps), steps_offset, steps_limit),
        arguments=_select_arguments(m.arguments, arguments),
        argument_count=len(m.arguments),
        warnings=m.warnings[:10],
    )


def _brief(run_id: str, m: RunMetrics) -> RunBrief:
    mem = m.memory_dict()
    last = m.loss_dict()["last"]
    return RunBrief(
        run_id=run_id,
        tokens_per_s_per_gpu=m.tokens_per_s_per_gpu,
        valid=m.valid,
        invalid_reasons=m.invalid_reasons[:3],
        failure_class=m.failure_class,
        window_step_time_ms_mean=m.window_step_time_ms["mean"] if m.window_step_time_ms else None,
        window_spread=m.window_spread,
        peak_max_allocated_mib=mem["peak_max_allocated_mib"],
        peak_max_reserved_mib=mem["peak_max_reserved_mib"],
        stage_max_allocated_mib=[s["max_allocated_mib"] for s in mem["per_stage"]] if mem["per_stage"] else None,
        last_loss=LossPoint(**last) if last else None,
    )


def compare_losses(a: RunMetrics, b: RunMetrics) -> LossComparison:
    la = {i: v for i, v in a.losses() if v is not None}
    lb = {i: v for i, v in b.losses() if v is not None}
    common = sorted(la.keys() & lb.keys())
    diffs = [LossDiff(iteration=i, a=la[i], b=lb[i], abs_diff=abs(la[i] - lb[i])) for i in common]
    worst = max(diffs, key=lambda d: d.abs_diff, default=None)
    rel = [d.abs_diff / abs(d.a) for d in diffs if d.a != 0]
    return LossComparison(
        iterations_compared=len(common),
        max_abs_diff=worst.abs_diff if worst else None,
        max_rel_diff=max(rel) if rel else None,
        worst_iteration=worst.iteration if worst else None,
        only_in_a=sorted(la.keys() - lb.keys())[:20],
        only_in_b=sorted(lb.keys() - la.keys())[:20],
        largest=sorted(diffs, key=lambda d: -d.abs_diff)[:5],
    )


@server.tool()
def compare_runs(
    run_a: RunId,
    run_b: RunId,
    max_spread: Annotated[
        float | None, Field(ge=0, description=f"largest valid window spread (default {DEFAULT_MAX_SPREAD})")
    ] = None,
) -> CompareResult:
    """Two runs side by side: b's throughput gain over a, whether it is beyond the campaign's noise
    band, the change in window step time and peak memory (per pipeline stage), and how far their
    loss curves differ, iteration by iteration.

    Call it to see what a change did, usually with run_a the leader (or a calibration run) and
    run_b the candidate. A gain inside the band is noise, not a win.
    """
    directory = campaign_dir()
    state = _state(directory)
    a = _metrics(directory, run_a, max_spread=max_spread, exit_status=None, state=state)
    b = _metrics(directory, run_b, max_spread=max_spread, exit_status=None, state=state)
    ta, tb = a.tokens_per_s_per_gpu, b.tokens_per_s_per_gpu
    g = measure.gain(tb, ta) if ta and tb else None
    cal = state.calibration if state else None
    band = cal.band if cal else None
    notes = []
    for rid, m in ((run_a, a), (run_b, b)):
        if not m.valid:
            notes.append(f"{rid} is not a valid measurement: {m.invalid_reasons[0] if m.invalid_reasons else ''}")
    if band is None:
        notes.append("the campaign is not calibrated yet: no band to judge the gain against")
    sa = a.window_step_time_ms["mean"] if a.window_step_time_ms else None
    sb = b.window_step_time_ms["mean"] if b.window_step_time_ms else None
    pa, pb = a.memory_dict()["peak_max_allocated_mib"], b.memory_dict()["peak_max_allocated_mib"]
    return CompareResult(
        a=_brief(run_a, a),
        b=_brief(run_b, b),
        gain_b_over_a=g,
        band=band,
        beyond_band=(abs(g) > band) if g is not None and band is not None else None,
        step_time_ms_delta=sb - sa if sa is not None and sb is not None else None,
        peak_max_allocated_mib_delta=pb - pa if pa is not None and pb is not None else None,
        loss=compare_losses(a, b),
        notes=notes,
    )


def _verdict(run: state_mod.RunState, st: state_mod.CampaignState) -> tuple[str, str]:
    if run.verdict:
        return run.verdict, "ledger"
    cal = st.calibration
    leader = st.leader_tokens_per_s_per_gpu
    if run.status != "finished":
        v = Verdict.IN_FLIGHT
    elif run.outcome not in (None, RunOutcome.OK):
        v = Verdict.FAILED  # the outcome field says how
    elif run.tokens_per_s_per_gpu is None:
        v = Verdict.UNMEASURED
    elif run.valid is False:
        v = Verdict.INVALID
    elif run.run_id == st.leader_run_id:
        v = Verdict.LEADER
    elif run.kind == RunKind.CALIBRATION:
        v = Verdict.CALIBRATION
    elif cal is None or leader is None:
        v = Verdict.UNCALIBRATED
    elif measure.beats(run.tokens_per_s_per_gpu, leader, cal.band):
        v = Verdict.LEADER  # beats the leader beyond the band: the ledger's word for it too
    elif measure.gain(run.tokens_per_s_per_gpu, leader) >= -cal.band:
        v = Verdict.WITHIN_BAND
    else:
        v = Verdict.SLOWER
    return v, "derived"


@server.tool()
def campaign_measurements(
    offset: Annotated[int, Field(ge=0, description="first run to return, in admission order")] = 0,
    limit: Annotated[int, Field(ge=1, le=200, description="runs to return")] = 30,
    kind: Annotated[
        str | None, Field(description="only runs of this kind: search, calibration, check or remeasure")
    ] = None,
) -> CampaignMeasurements:
    """The campaign's measurements so far, from its ledger: the current leader and its gain over the
    baseline, the noise band from the calibration runs, and each run's outcome, throughput, gain
    and verdict (leader, within_band, slower, invalid, failed, in_flight, ...).

    Call it at the start of a session and before choosing the next lever, to see where the search
    stands; it is cheap (it reads the ledger, not the logs). Runs are paged in admission order.
    """
    directory = campaign_dir()
    st = _state(directory)
    if st is None:
        raise ToolError(f"no ledger at {directory / ledger_mod.LEDGER_NAME}: the campaign has not started")
    cal = st.calibration
    base = st.baseline_mean
    leader = st.leader_tokens_per_s_per_gpu
    runs = sorted(st.runs.values(), key=lambda r: r.admitted_seq if r.admitted_seq is not None else -1)
    if kind is not None:
        runs = [r for r in runs if r.kind == kind]
    verdicts = []
    counts: dict[str, int] = {}
    for r in runs:
        v, source = _verdict(r, st)
        counts[v] = counts.get(v, 0) + 1
        t = _finite(r.tokens_per_s_per_gpu)
        verdicts.append(
            RunVerdict(
                run_id=r.run_id,
                kind=r.kind,
                status=r.status,
                outcome=r.outcome,
                tokens_per_s_per_gpu=t,
                valid=r.valid,
                invalid_reasons=r.invalid_reasons[:2],
                gain_over_baseline=measure.gain(t, base) if t and base else None,
                gain_over_leader=measure.gain(t, leader) if t and leader else None,
                verdict=v,
                verdict_source=source,
                lever=r.lever,
                changes=r.changes,
                charge_gpu_hours=r.charge_gpu_hours,
            )
        )
    return CampaignMeasurements(
        campaign=st.name,
        gpus=st.gpus,
        rows=st.last_seq + 1,
        band=BandOut(
            runs=len(st.calibration_values),
            required_runs=st.calibration_runs_required,
            values=list(st.calibration_values),
            mean=cal.mean if cal else None,
            rel_sigma=cal.rel_sigma if cal else None,
            band=cal.band if cal else None,
        ),
        leader=LeaderOut(
            run_id=st.leader_run_id,
            tokens_per_s_per_gpu=leader,
            gain_over_baseline=st.leader_gain(),
        ),
        budget_remaining_gpu_hours=st.budget.remaining,
        search_remaining_gpu_hours=st.budget.search_remaining,
        verdict_counts=counts,
        runs=verdicts[offset : offset + limit],
        page=_page(len(verdicts), offset, limit),
    )


def main() -> None:
    server.run()  # stdio


if __name__ == "__main__":
    main()
