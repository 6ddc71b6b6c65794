"""Analyse a run's traces: every rank, then stages, the slowest stage and what it waits on."""

from __future__ import annotations

import multiprocessing
import os
import re
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from attune.core.errors import ReaderError
from attune.readers.traces.classify import CommKind
from attune.readers.traces.layout import RankLayout, RankLayoutError
from attune.readers.traces.models import (
    Breakdown,
    NameTotal,
    RankReport,
    Slowest,
    StageReport,
    TraceReport,
    Wait,
)
from attune.readers.traces.rank import HtaFigures, RankResult, StepBreakdown, read_rank
from attune.readers.traces.reader import TraceFormatError, TraceReader, looks_like_trace

__all__ = ["TraceInputError", "analyze_paths", "find_trace_files"]

_TRACE_SUFFIXES = (".json", ".json.gz")
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
_SMALL_INPUT_BYTES = 64 << 20  # below this, parallel workers cost more than they save


class TraceInputError(ReaderError, ValueError):
    """Bad input: a missing path, no traces, a file that is not a trace, a layout that does not fit."""


def find_trace_files(paths: Iterable[str | Path]) -> list[Path]:
    """Files named on the command line, and Kineto traces found under directories (any depth)."""
    files: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_file():
            files.append(p)
        elif p.is_dir():
            found = sorted(
                f
                for f in p.rglob("*")
                if f.is_file() and f.name.endswith(_TRACE_SUFFIXES) and looks_like_trace(f)
            )
            files.extend(found)
        else:
            raise TraceInputError(f"{p}: no such file or directory")
    unique: list[Path] = []
    seen: set[Path] = set()
    for f in files:
        key = f.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(f)
    if not unique:
        raise TraceInputError("no PyTorch profiler traces (*.json, *.json.gz) found in " + ", ".join(map(str, paths)))
    return unique


def _read(args: tuple[str, RankLayout | None, int]) -> RankResult:
    path, layout, top_n = args
    return read_rank(path, layout=layout, top_n=top_n)


def _read_all(files: Sequence[Path], layout: RankLayout | None, top_n: int, jobs: int | None) -> list[RankResult]:
    total = sum(f.stat().st_size for f in files)
    if jobs is None:
        jobs = 1 if total < _SMALL_INPUT_BYTES else min(len(files), os.cpu_count() or 1)
    work = [(str(f), layout, top_n) for f in files]
    try:
        if jobs <= 1 or len(files) == 1:
            return [_read(w) for w in work]
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
            return list(pool.map(_read, work))
    except TraceFormatError as exc:
        raise TraceInputError(str(exc)) from exc


def _head_world(path: Path) -> int | None:
    try:
        head = TraceReader(path).head_metadata()
    except TraceFormatError as exc:
        raise TraceInputError(str(exc)) from exc
    dist = head.get("distributedInfo")
    world = dist.get("world_size") if isinstance(dist, dict) else None
    return world if isinstance(world, int) else None


def _rank_of(result: RankResult) -> int | None:
    if result.rank is not None:
        return result.rank
    m = _RANK_IN_NAME.search(Path(result.file).name)
    return int(m.group(1)) if m else None


def _stage_from_groups(rank: int | None, pg_config: list[dict[str, Any]]) -> int | None:
    if rank is None:
        return None
    for g in pg_config:
        desc = str(g.get("pg_desc", "")).upper()
        ranks = g.get("ranks")
        if "PIPELINE" in desc and isinstance(ranks, list) and rank in ranks and len(ranks) > 1:
            return ranks.index(rank)
    return None


_WAIT_FIELDS = (
    ("memcpy", "memcpy_exposed_us"),
    ("other_device", "other_exposed_us"),
    ("host_data_loading", "data_loading_us"),
    ("host_launch", "launch_us"),
    ("host_python", "python_us"),
    ("sync_wait", "sync_wait_us"),
)


def _waits(b: Breakdown) -> list[Wait]:
    items = [(k, v) for k, v in b.comm_exposed_by_kind.items()]
    items += [(label, getattr(b, f)) for label, f in _WAIT_FIELDS]
    step = b.step_us if b.step_us > 0 else 1.0
    waits = [Wait(what=k, us=v, share=v / step) for k, v in items if v > 0]
    waits.sort(key=lambda w: w.us, reverse=True)
    return waits


def _busy(b: Breakdown) -> float:
    return b.step_us - b.comm_exposed_by_kind.get(CommKind.PIPELINE_P2P.label, 0.0)


def _model(s: StepBreakdown) -> Breakdown:
    return Breakdown(**s.as_dict())


def _mean_breakdown(items: list[Breakdown]) -> Breakdown:
    n = len(items)
    data = {f: sum(getattr(b, f) for b in items) / n for f in Breakdown.model_fields if f not in ("step", "comm_exposed_by_kind")}
    kinds = {k: sum(b.comm_exposed_by_kind.get(k, 0.0) for b in items) / n for k in items[0].comm_exposed_by_kind}
    return Breakdown(step=None, comm_exposed_by_kind=kinds, **data)


def _merge_tops(reports: list[RankReport], attr: str, n: int) -> list[NameTotal]:
    acc: dict[str, NameTotal] = {}
    for r in reports:
        for t in getattr(r, attr):
            cur = acc.get(t.name)
            if cur is None:
                acc[t.name] = NameTotal(name=t.name, count=t.count, total_us=t.total_us, kind=t.kind, ranks=1)
            else:
                cur.count += t.count
                cur.total_us += t.total_us
                cur.ranks = (cur.ranks or 0) + 1
    return sorted(acc.values(), key=lambda t: t.total_us, reverse=True)[:n]


def _pct(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.0f}%" if whole > 0 else "n/a"


def _summary(stages: list[StageReport], slowest: Slowest | None, n_ranks: int) -> str:
    if slowest is None:
        return f"{n_ranks} trace(s), no steps found"
    st = next(s for s in stages if s.stage == slowest.stage)
    b = st.breakdown
    parts = [
        f"{n_ranks} rank trace(s), {len(stages)} stage(s); mean step {b.step_us / 1000:.2f} ms",
        f"slowest stage {slowest.stage} (busy {slowest.busy_us / 1000:.2f} ms)",
        f"compute {_pct(b.compute_us, b.step_us)}, exposed comm {_pct(b.comm_exposed_us, b.step_us)}"
        f" (hidden {_pct(b.comm_hidden_us, b.step_us)}), memcpy {_pct(b.memcpy_exposed_us, b.step_us)},"
        f" host {_pct(b.host_us, b.step_us)}, idle {_pct(b.idle_us - b.host_us, b.step_us)}",
    ]
    if slowest.waits_on:
        w = slowest.waits_on[0]
        parts.append(f"it waits most on {w.what} ({w.share * 100:.0f}% of the step)")
    return "; ".join(parts)


def _hta(result: RankResult, drop_last: bool) -> HtaFigures | None:
    return result.hta_filtered if drop_last else result.hta_unfiltered


def _parse_layout(layout: str | RankLayout | None) -> RankLayout | None:
    try:
        return RankLayout.parse(layout) if isinstance(layout, str) else layout
    except RankLayoutError as exc:
        raise TraceInputError(str(exc)) from exc


def _resolve_layout(lay: RankLayout | None, files: list[Path]) -> RankLayout | None:
    """The caller's layout, completed with the traces' world size (None: no layout given)."""
    if lay is None:
        return None
    worlds = {w for w in (_head_world(f) for f in files) if w is not None}
    if len(worlds) > 1:
        raise TraceInputError(f"the traces disagree on the world size: {sorted(worlds)}")
    try:
        return lay.resolved(next(iter(worlds)) if worlds else None)
    except RankLayoutError as exc:
        raise TraceInputError(str(exc)) from exc


def _check_worlds(results: list[RankResult], resolved: RankLayout | None) -> None:
    worlds = {r.world_size for r in results if r.world_size is not None}
    if len(worlds) > 1:
        raise TraceInputError(f"the traces disagree on the world size: {sorted(worlds)}")
    if resolved is not None and worlds and resolved.world != next(iter(worlds)):
        raise TraceInputError(f"layout: {resolved.world} ranks, but the traces' world size is {next(iter(worlds))}")


def _stage_of(r: RankResult, rank: int | None, resolved: RankLayout | None, sources: set[str]) -> int:
    """The rank's pipeline stage: from the layout, else its process groups, else 0; notes the source."""
    if resolved is not None:
        if rank is None or rank >= resolved.world:
            raise TraceInputError(f"{r.file}: rank {rank} does not fit the layout (world {resolved.world})")
        stage = resolved.stage(rank)
        sources.add("layout")
        return stage
    stage = _stage_from_groups(rank, r.pg_config)
    if stage is None:
        sources.add("assumed_single_stage")
        return 0
    sources.add("process_groups")
    return stage


def _rank_report(r: RankResult, rank: int | None, stage: int, drop_last: bool) -> RankReport:
    mean = _model(r.mean)
    hta = _hta(r, drop_last)
    n_steps = len([s for s in r.steps if s.step is not None])
    per_step_div = max(len(r.steps), 1)
    return RankReport(
        rank=rank,
        file=r.file,
        stage=stage,
        kind=r.kind,  # type: ignore[arg-type]
        device=r.device_name,
        backend=r.backend,
        world_size=r.world_size,
        steps=n_steps,
        step_us=mean.step_us,
        compute_us=hta.compute_us if hta else None,
        non_compute_us=hta.non_compute_us if hta else None,
        idle_us=hta.idle_us if hta else None,
        span_us=hta.span_us if hta else None,
        comm_comp_overlap_pct=hta.comm_comp_overlap_pct if hta else None,
        hta_last_step_dropped=drop_last,
        busy_us=_busy(mean),
        breakdown=mean,
        waits_on=_waits(mean),
        per_step=[_model(s) for s in r.steps],
        top_kernels=[NameTotal(**t, per_step_us=t["total_us"] / per_step_div) for t in _kinds(r.top_kernels)],
        top_operators=[NameTotal(**t, per_step_us=t["total_us"] / per_step_div) for t in r.top_operators],
        events=r.events,
        events_skipped=r.events_skipped,
        bytes=r.bytes_read,
        notes=r.notes,
    )


def _stage_reports(reports: list[RankReport]) -> list[StageReport]:
    stages: list[StageReport] = []
    for s in sorted({r.stage for r in reports if r.stage is not None}):
        members = [r for r in reports if r.stage == s]
        b = _mean_breakdown([m.breakdown for m in members])
        stages.append(
            StageReport(
                stage=s,
                ranks=[m.rank for m in members],
                step_us=b.step_us,
                busy_us=_busy(b),
                breakdown=b,
                waits_on=_waits(b),
            )
        )
    return stages


def _slowest(stages: list[StageReport], reports: list[RankReport]) -> Slowest | None:
    if not stages:
        return None
    top = max(stages, key=lambda st: (st.busy_us, -st.stage))
    members = [r for r in reports if r.stage == top.stage]
    worst = max(members, key=lambda r: r.busy_us)
    return Slowest(
        stage=top.stage,
        busy_us=top.busy_us,
        step_us=top.step_us,
        slowest_rank=worst.rank,
        bottleneck=top.waits_on[0].what if top.waits_on else None,
        waits_on=top.waits_on,
    )


def analyze_paths(
    paths: Iterable[str | Path],
    layout: str | RankLayout | None = None,
    jobs: int | None = None,
    top_n: int = 10,
) -> TraceReport:
    """Analyse the traces found at ``paths`` (files or directories)."""
    t0 = time.perf_counter()
    lay = _parse_layout(layout)
    files = find_trace_files(paths)
    resolved = _resolve_layout(lay, files)
    results = _read_all(files, resolved, top_n, jobs)
    _check_worlds(results, resolved)

    step_names: set[str] = set()
    for r in results:
        step_names |= r.step_names
    drop_last = len(step_names) >= 2

    reports: list[RankReport] = []
    sources: set[str] = set()
    for r in results:
        rank = _rank_of(r)
        reports.append(_rank_report(r, rank, _stage_of(r, rank, resolved, sources), drop_last))
    reports.sort(key=lambda x: (x.rank is None, x.rank if x.rank is not None else 0, x.file))

    stages = _stage_reports(reports)
    slowest = _slowest(stages, reports)
    source = "layout" if "layout" in sources else ("process_groups" if "process_groups" in sources else "assumed_single_stage")
    return TraceReport(
        summary=_summary(stages, slowest, len(reports)),
        files=len(files),
        layout=resolved.as_dict() if resolved else None,
        stage_source=source,
        slowest_stage=slowest,
        stages=stages,
        ranks=reports,
        top_kernels=_merge_tops(reports, "top_kernels", top_n),
        top_operators=_merge_tops(reports, "top_operators", top_n),
        analysis_seconds=time.perf_counter() - t0,
    )


def _kinds(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        row = dict(row)
        row["kind"] = row.pop("class", None)
        out.append(row)
    return out
