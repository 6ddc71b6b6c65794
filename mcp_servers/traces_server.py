"""The traces MCP server: a profiled run's step breakdown for the agent, over stdio.

Tools:
- ``list_profiled_runs``: which runs of the campaign have traces.
- ``analyze_run``: the compact answer for one run: per stage, how the step splits into compute,
  exposed communication, memory copies, host time and idle; the slowest stage and what it waits
  on; the HTA-comparable figures per rank; the heaviest kernels.
- ``rank_details``: one rank's full breakdown, waits and per-step figures (paged).
- ``heaviest``: the heaviest kernels or operators, all ranks or one (paged).

A run's traces are the Kineto JSON files (``*.json``, ``*.json.gz``) anywhere under
``<campaign>/runs/<run-id>/``. The campaign directory is ``ATTUNE_CAMPAIGN_DIR`` (default: the
working directory). Analyses are cached in memory per run and layout until a trace file changes.

Logs go to stderr only; stdout is the transport. Run: ``python -m mcp_servers.traces_server``.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from pathlib import Path
from typing import Annotated, Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, Field

from attune.core.campaign_paths import RUNS_DIR
from attune.core.containment import inside
from attune.readers.traces import TraceInputError, TraceReport, analyze_paths, find_trace_files
from attune.readers.traces.models import Breakdown, NameTotal, Wait

log = logging.getLogger("attune.traces_server")

_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_CACHE: dict[tuple[str, str | None], tuple[tuple[tuple[str, int, int], ...], TraceReport]] = {}


def _campaign_dir() -> Path:
    return Path(os.environ.get("ATTUNE_CAMPAIGN_DIR") or os.getcwd()).resolve()


def _run_dir(run_id: str) -> Path:
    if not run_id or "/" in run_id or "\\" in run_id or ".." in run_id or not _RUN_ID.match(run_id):
        raise ToolError(f"run_id {run_id!r} is not a run id (letters, digits, '.', '_', '-'; no path separators or '..')")
    runs = _campaign_dir() / RUNS_DIR
    d = (runs / run_id).resolve()
    if not inside(d, runs.resolve()):
        raise ToolError(f"run {run_id!r} lies outside the campaign's runs directory")
    if not d.is_dir():
        raise ToolError(f"no run {run_id!r} in {runs}")
    return d


def _report(run_id: str, layout: str | None) -> TraceReport:
    d = _run_dir(run_id)
    try:
        files = find_trace_files([d])
    except TraceInputError as exc:
        raise ToolError(f"run {run_id!r} has no traces: profile it first ({exc})") from exc
    sig = tuple(sorted((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files))
    key = (run_id, layout)
    hit = _CACHE.get(key)
    if hit is not None and hit[0] == sig:
        return hit[1]
    log.info("analysing %d trace file(s) of run %s", len(files), run_id)
    try:
        report = analyze_paths(files, layout=layout, top_n=50)
    except TraceInputError as exc:
        raise ToolError(str(exc)) from exc
    _CACHE[key] = (sig, report)
    return report


# -- models -------------------------------------------------------------------------------


class RunRow(BaseModel):
    run_id: str
    trace_files: int
    trace_mb: float


class WaitRow(BaseModel):
    what: str = Field(description="pipeline_p2p, all_to_all, tp_collective, cp_collective, dp_reduce, "
                      "other_comm, memcpy, other_device, host_data_loading, host_launch, host_python, sync_wait")
    ms: float = Field(description="mean per step")
    pct: float = Field(description="percent of the step")


class StageRow(BaseModel):
    stage: int
    ranks: list[int | None]
    step_ms: float
    busy_ms: float = Field(description="step less exposed pipeline send/receive: the stage's own work")
    compute_pct: float
    comm_exposed_pct: float
    comm_hidden_pct: float
    memcpy_exposed_pct: float
    host_pct: float = Field(description="device idle while the host loads data, launches or runs Python")
    idle_other_pct: float = Field(description="device idle while the host waits on it (sync)")
    waits_most_on: str | None


class RankRow(BaseModel):
    rank: int | None
    stage: int | None
    kind: str
    steps: int
    step_ms: float
    compute_us: float | None = Field(description="HTA-comparable")
    non_compute_us: float | None = Field(description="HTA-comparable")
    idle_us: float | None = Field(description="HTA-comparable")
    comm_comp_overlap_pct: float | None = Field(description="HTA-comparable")


class KernelRow(BaseModel):
    name: str
    kind: str | None = None
    total_ms: float
    per_step_ms: float | None
    count: int
    ranks: int | None = None


class RunTraceSummary(BaseModel):
    run_id: str
    files: int
    summary: str
    stage_source: str
    layout: dict[str, object] | None
    slowest_stage: int | None
    slowest_rank: int | None
    bottleneck: str | None = Field(description="what the slowest stage waits on most")
    slowest_waits: list[WaitRow]
    stages: list[StageRow]
    ranks: list[RankRow] = Field(description="the first 32 ranks; rank_details has every rank")
    ranks_total: int
    top_kernels: list[KernelRow]
    analysis_seconds: float


class RankDetails(BaseModel):
    run_id: str
    rank: int | None
    file: str
    stage: int | None
    kind: str
    device: str | None
    backend: str | None
    compute_us: float | None
    non_compute_us: float | None
    idle_us: float | None
    span_us: float | None
    comm_comp_overlap_pct: float | None
    busy_us: float
    breakdown: Breakdown = Field(description="mean over the profiled steps")
    waits_on: list[Wait]
    steps: list[Breakdown] = Field(description="per-step figures, one page")
    steps_total: int
    next_offset: int | None
    notes: list[str]


class HeaviestPage(BaseModel):
    run_id: str
    what: str
    rank: int | None
    items: list[KernelRow]
    total: int
    next_offset: int | None


# -- tools --------------------------------------------------------------------------------

server = MCPServer(
    "attune-traces",
    instructions=(
        "Profiled runs' trace analysis. When a run's metrics do not show what limits it, profile it, "
        "then call analyze_run for the per-stage step breakdown and what the slowest stage waits on; "
        "rank_details and heaviest give the details."
    ),
)


def _pct(part: float, whole: float) -> float:
    return round(100.0 * part / whole, 2) if whole > 0 else 0.0


def _kernel_row(t: NameTotal) -> KernelRow:
    return KernelRow(
        name=t.name,
        kind=t.kind,
        total_ms=t.total_us / 1000.0,
        per_step_ms=None if t.per_step_us is None else t.per_step_us / 1000.0,
        count=t.count,
        ranks=t.ranks,
    )


@server.tool()
def list_profiled_runs() -> list[RunRow]:
    """The campaign's runs that have trace files (profiled runs), with how many and how large.
    Call it to find a run id to analyse."""
    runs = _campaign_dir() / RUNS_DIR
    rows: list[RunRow] = []
    if not runs.is_dir():
        return rows
    for d in sorted(p for p in runs.iterdir() if p.is_dir()):
        try:
            files = find_trace_files([d])
        except TraceInputError:
            continue
        rows.append(
            RunRow(run_id=d.name, trace_files=len(files), trace_mb=round(sum(f.stat().st_size for f in files) / 1e6, 3))
        )
    return rows


@server.tool()
def analyze_run(
    run_id: Annotated[str, Field(description="the run's id (its folder under runs/)")],
    layout: Annotated[
        str | None,
        Field(description="the run's parallel layout, e.g. 'tp=2,pp=4' (dp from the world size); "
              "omit to take stages from the traces' pipeline process groups"),
    ] = None,
) -> RunTraceSummary:
    """Analyse a profiled run's traces: per pipeline stage, how the step splits into compute,
    exposed and hidden communication, memory copies, host-side time and idle; which stage is
    slowest and what it waits on (pipeline send/receive, all-to-all, data-parallel reduction,
    host). Call it when the next decision needs to know what limits a run; it is the compact
    answer, and rank_details / heaviest give the rest."""
    r = _report(run_id, layout)
    stages = []
    for st in r.stages:
        b = st.breakdown
        stages.append(
            StageRow(
                stage=st.stage,
                ranks=st.ranks,
                step_ms=b.step_us / 1000.0,
                busy_ms=st.busy_us / 1000.0,
                compute_pct=_pct(b.compute_us, b.step_us),
                comm_exposed_pct=_pct(b.comm_exposed_us, b.step_us),
                comm_hidden_pct=_pct(b.comm_hidden_us, b.step_us),
                memcpy_exposed_pct=_pct(b.memcpy_exposed_us, b.step_us),
                host_pct=_pct(b.host_us, b.step_us),
                idle_other_pct=_pct(b.idle_us - b.host_us, b.step_us),
                waits_most_on=st.waits_on[0].what if st.waits_on else None,
            )
        )
    s = r.slowest_stage
    return RunTraceSummary(
        run_id=run_id,
        files=r.files,
        summary=r.summary,
        stage_source=r.stage_source,
        layout=r.layout,
        slowest_stage=s.stage if s else None,
        slowest_rank=s.slowest_rank if s else None,
        bottleneck=s.bottleneck if s else None,
        slowest_waits=[WaitRow(what=w.what, ms=w.us / 1000.0, pct=round(100 * w.share, 2)) for w in (s.waits_on if s else [])][:6],
        stages=stages,
        ranks=[
            RankRow(
                rank=x.rank,
                stage=x.stage,
                kind=x.kind,
                steps=x.steps,
                step_ms=x.step_us / 1000.0,
                compute_us=x.compute_us,
                non_compute_us=x.non_compute_us,
                idle_us=x.idle_us,
                comm_comp_overlap_pct=x.comm_comp_overlap_pct,
            )
            for x in r.ranks[:32]
        ],
        ranks_total=len(r.ranks),
        top_kernels=[_kernel_row(t) for t in r.top_kernels[:5]],
        analysis_seconds=r.analysis_seconds,
    )


def _pick_rank(r: TraceReport, rank: int | None):
    if rank is None:
        if len(r.ranks) == 1:
            return r.ranks[0]
        raise ToolError(f"name a rank: this run has traces of ranks {[x.rank for x in r.ranks]}")
    for x in r.ranks:
        if x.rank == rank:
            return x
    raise ToolError(f"no trace of rank {rank}; traced ranks: {[x.rank for x in r.ranks]}")


@server.tool()
def rank_details(
    run_id: Annotated[str, Field(description="the run's id")],
    rank: Annotated[int | None, Field(description="the rank (may be omitted when one rank was traced)")] = None,
    layout: Annotated[str | None, Field(description="as for analyze_run")] = None,
    offset: Annotated[int, Field(ge=0, description="first step to list")] = 0,
    limit: Annotated[int, Field(ge=1, le=100, description="steps per page")] = 10,
) -> RankDetails:
    """One traced rank in full: its mean step breakdown, what it waits on, the HTA-comparable
    figures, and the per-step breakdown (paged). Call it after analyze_run to look into a stage."""
    r = _report(run_id, layout)
    x = _pick_rank(r, rank)
    page = x.per_step[offset : offset + limit]
    nxt = offset + limit
    return RankDetails(
        run_id=run_id,
        rank=x.rank,
        file=x.file,
        stage=x.stage,
        kind=x.kind,
        device=x.device,
        backend=x.backend,
        compute_us=x.compute_us,
        non_compute_us=x.non_compute_us,
        idle_us=x.idle_us,
        span_us=x.span_us,
        comm_comp_overlap_pct=x.comm_comp_overlap_pct,
        busy_us=x.busy_us,
        breakdown=x.breakdown,
        waits_on=x.waits_on,
        steps=page,
        steps_total=len(x.per_step),
        next_offset=nxt if nxt < len(x.per_step) else None,
        notes=x.notes,
    )


@server.tool()
def heaviest(
    run_id: Annotated[str, Field(description="the run's id")],
    what: Annotated[Literal["kernels", "operators"], Field(description="device kernels or CPU operators")] = "kernels",
    rank: Annotated[int | None, Field(description="one rank, or all ranks together when omitted")] = None,
    layout: Annotated[str | None, Field(description="as for analyze_run")] = None,
    offset: Annotated[int, Field(ge=0)] = 0,
    limit: Annotated[int, Field(ge=1, le=50)] = 10,
) -> HeaviestPage:
    """The heaviest kernels (by total device time) or CPU operators (inclusive time) of a
    profiled run, over all ranks or one. Call it when a stage's compute or host time is the
    bottleneck and you need to know which kernels or operators make it up."""
    r = _report(run_id, layout)
    if rank is None:
        items = r.top_kernels if what == "kernels" else r.top_operators
    else:
        x = _pick_rank(r, rank)
        items = x.top_kernels if what == "kernels" else x.top_operators
    page = items[offset : offset + limit]
    nxt = offset + limit
    return HeaviestPage(
        run_id=run_id,
        what=what,
        rank=rank,
        items=[_kernel_row(t) for t in page],
        total=len(items),
        next_offset=nxt if nxt < len(items) else None,
    )


def main() -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
    server.run("stdio")


if __name__ == "__main__":
    main()
