"""One rank's trace: stream its events into compact arrays, then break its steps down.

``RankCollector`` consumes event batches from the reader and keeps only what the analysis needs,
in ``array`` buffers (8 bytes a number): device events, host calls that explain device idle time,
CPU operators and CPU-side communication (for CPU-only traces), profiler steps, and per-name
totals for the heaviest kernels and operators. ``analyze_rank`` turns that into a ``RankResult``.

Definitions (see docs/traces.md):

- A step is the wall-clock window of one ``ProfilerStep#N`` annotation on the host (clipped at
  the next step's start). Each instant of it is given to the first of: computation,
  communication not hidden under computation (by kind), memory copies not hidden under either,
  other device work, and otherwise device idle. Device idle time is split by what the host was
  doing: loading data, blocked in a synchronisation call, in a launch or other runtime call, or
  else running Python and CPU-side operators between kernels. So, per step,
  ``compute + comm_exposed + memcpy_exposed + other_exposed + idle = step`` and
  ``idle = data_loading + sync_wait + launch + python``.
- On a CPU-only trace (no device events: gloo), the CPU is the device: computation is the time
  in CPU operators on any thread, less the time the same thread spends in communication;
  communication is gloo/c10d operations on any thread.
- The HTA-comparable figures follow Holistic Trace Analysis' temporal breakdown and
  communication/computation overlap over the whole trace (see ``HtaFigures``).
"""

from __future__ import annotations

import math
import re
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attune.readers.traces import intervals as iv
from attune.readers.traces.classify import (
    CommKind,
    DeviceClass,
    HostClass,
    comm_kind,
    cpu_comm_collective,
    device_class,
    group_dim_from_desc,
    host_class,
)
from attune.readers.traces.reader import Args, Event, TraceReader

__all__ = ["HtaFigures", "RankCollector", "RankResult", "StepBreakdown", "analyze_rank", "read_rank"]

_STEP_RE = re.compile(r"ProfilerStep\s*#\s*(\d+)")
_NOT_DEVICE_CATS = frozenset({"gpu_user_annotation", "Trace"})
_SYNC_EVENT_NAMES = frozenset({"Event Sync", "Context Sync"})
N_KINDS = len(CommKind)


def _stream_int(value: Any) -> int:
    """A stream id as HTA reads it: an int, or -1 when it does not parse."""
    if value is None:
        return -1
    try:
        return int(value)
    except (TypeError, ValueError):
        return -1


@dataclass
class _NameStat:
    count: int = 0
    total: float = 0.0
    cls: int = 0


class RankCollector:
    """Accumulates one trace's events (see module doc)."""

    def __init__(self) -> None:
        # device events
        self.d_ts = array("d")
        self.d_end = array("d")
        self.d_cls = array("b")  # own class (cuda_sync events are OTHER)
        self.d_hta_cls = array("b")  # HTA's class, by name only
        self.d_corr = array("q")
        self.d_comm = array("i")  # index into comm_keys, -1 if not communication
        # host calls with a correlation id (launches), for HTA's filter
        self.l_corr = array("q")
        self.l_ts = array("d")
        self.l_tid = array("i")
        # host activity that explains device idle time
        self.h_ts = array("d")
        self.h_end = array("d")
        self.h_cls = array("b")
        # CPU operators (compute on CPU-only traces) and CPU-side communication
        self.c_ts = array("d")
        self.c_end = array("d")
        self.c_tid = array("i")
        self.x_ts = array("d")
        self.x_end = array("d")
        self.x_tid = array("i")
        self.x_comm = array("i")
        # steps and HTA's step bookkeeping
        self.steps: dict[int, tuple[float, float]] = {}
        self.step_names: set[str] = set()
        self.hta_last_step_start = -math.inf
        # aggregates
        self.kernel_stats: dict[str, _NameStat] = {}
        self.op_stats: dict[str, _NameStat] = {}
        self.comm_keys: dict[tuple[Any, ...], int] = {}
        self.tids: dict[Any, int] = {}
        self._infos: dict[tuple[str, str], tuple[Any, ...]] = {}
        self.min_ts = math.inf
        self.max_end = -math.inf
        self.events = 0

    def _comm_key(self, key: tuple[Any, ...]) -> int:
        idx = self.comm_keys.get(key)
        if idx is None:
            idx = self.comm_keys[key] = len(self.comm_keys)
        return idx

    def _tid(self, tid: Any) -> int:
        idx = self.tids.get(tid)
        if idx is None:
            idx = self.tids[tid] = len(self.tids)
        return idx

    def _info(self, cat: str, name: str) -> tuple[Any, ...]:
        """Everything about an event that depends only on its category and name (cached)."""
        hta_cls = device_class(name)
        own_cls = DeviceClass.OTHER if cat == "cuda_sync" else hta_cls
        step_num = None
        coll = None
        if cat in ("user_annotation", "cpu_op"):
            m = _STEP_RE.match(name) if name.startswith("ProfilerStep") else None
            if m is not None:
                step_num = int(m.group(1))
            else:
                coll = cpu_comm_collective(name)
        info = (
            cat not in _NOT_DEVICE_CATS,  # 0: may be a device event
            int(hta_cls),  # 1
            int(own_cls),  # 2
            "ProfilerStep" in name,  # 3
            name in _SYNC_EVENT_NAMES,  # 4
            host_class(cat, name),  # 5
            step_num,  # 6
            coll,  # 7
            cat == "cpu_op",  # 8
        )
        self._infos[(cat, name)] = info
        return info

    def _comm_args(self, name: str, coll: str | None, a: Args | None) -> int:
        if a is None:
            return self._comm_key((name, coll, None, None, None))
        if not coll:  # none from the name: take the event's own "Collective name"
            coll = a.collective or coll
        ranks = str(a.pg_ranks) if a.pg_ranks is not None else None
        return self._comm_key((name, coll, a.pg_name, a.pg_desc, ranks))

    def add(self, batch: Iterable[Event]) -> None:  # noqa: C901 - one pass, kept flat for speed
        infos = self._infos
        kernel_stats = self.kernel_stats
        op_stats = self.op_stats
        min_ts, max_end, count = self.min_ts, self.max_end, 0
        d_ts, d_end, d_cls, d_hta, d_corr, d_comm = (
            self.d_ts, self.d_end, self.d_cls, self.d_hta_cls, self.d_corr, self.d_comm,
        )
        c_ts, c_end, c_tid = self.c_ts, self.c_end, self.c_tid
        tids = self.tids
        for e in batch:
            if e.ph != "X":
                continue
            ts = e.ts
            dur = e.dur
            cat = e.cat
            if ts is None or dur is None or cat is None or cat == "Trace":
                continue
            count += 1
            end = ts + dur
            if ts < min_ts:
                min_ts = ts
            if end > max_end:
                max_end = end
            name = e.name
            if type(name) is not str:
                name = "" if name is None else str(name)
            info = infos.get((cat, name))
            if info is None:
                info = self._info(cat, name)
            a = e.args
            if a is None:
                stream = corr = -1
            else:
                stream = a.stream
                if stream is None:
                    stream = -1
                elif type(stream) is not int:
                    stream = _stream_int(stream)
                corr = a.correlation
                if corr is None:
                    corr = -1
            if info[3]:
                self.step_names.add(name)
            if stream >= 0 and info[0]:
                d_ts.append(ts)
                d_end.append(end)
                d_cls.append(info[2])
                d_hta.append(info[1])
                d_corr.append(corr)
                d_comm.append(self._comm_args(name, None, a) if info[2] == DeviceClass.COMM else -1)
                st = kernel_stats.get(name)
                if st is None:
                    st = kernel_stats[name] = _NameStat(cls=info[2])
                st.count += 1
                st.total += dur
                if corr >= 0:
                    continue  # a device event; HTA's CPU side excludes it
            # host side (as HTA sees it: everything that is not a correlated device event)
            if info[4]:
                continue
            if info[3] and ts > self.hta_last_step_start:
                self.hta_last_step_start = ts
            if stream >= 0:
                continue  # an uncorrelated device event, counted above
            if corr >= 0:
                self.l_corr.append(corr)
                self.l_ts.append(ts)
                self.l_tid.append(self._tid(e.tid))
            if info[5] is not None:
                self.h_ts.append(ts)
                self.h_end.append(end)
                self.h_cls.append(info[5])
            if info[6] is not None:
                prev = self.steps.get(info[6])
                if prev is None or dur > prev[1] - prev[0]:
                    self.steps[info[6]] = (ts, end)
            elif info[7] is not None:
                self.x_ts.append(ts)
                self.x_end.append(end)
                self.x_tid.append(self._tid(e.tid))
                self.x_comm.append(self._comm_args(name, info[7], a))
            elif info[8]:
                c_ts.append(ts)
                c_end.append(end)
                t = tids.get(e.tid)
                c_tid.append(t if t is not None else self._tid(e.tid))
                st = op_stats.get(name)
                if st is None:
                    st = op_stats[name] = _NameStat()
                st.count += 1
                st.total += dur
        self.min_ts, self.max_end = min_ts, max_end
        self.events += count


# ----------------------------------------------------------------------------------------
# results


@dataclass
class StepBreakdown:
    """One step's (or the mean step's) time, split as the module doc says. Microseconds."""

    step: int | None
    start_us: float
    step_us: float
    compute_us: float
    comm_us: float
    comm_exposed_us: float
    comm_hidden_us: float
    memcpy_us: float
    memcpy_exposed_us: float
    other_exposed_us: float
    idle_us: float
    host_us: float
    data_loading_us: float
    sync_wait_us: float
    launch_us: float
    python_us: float
    comm_exposed_by_kind: dict[str, float]

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["comm_exposed_by_kind"] = dict(self.comm_exposed_by_kind)
        return d


@dataclass
class HtaFigures:
    """Holistic Trace Analysis' temporal breakdown and comm/comp overlap, in its definitions.

    Device events considered: when the traces (all ranks together) name at least two profiler
    steps, only those launched before the last step started (HTA drops the last step); else all.
    span = first start to last end; idle = span - union of all; compute = union of computation
    events; non_compute = span - compute - idle; overlap = time computation and communication
    both run / communication time (percent).
    """

    span_us: float
    idle_us: float
    compute_us: float
    non_compute_us: float
    comm_comp_overlap_pct: float | None


@dataclass
class RankResult:
    file: str
    rank: int | None
    world_size: int | None
    backend: str | None
    pg_config: list[dict[str, Any]]
    device_name: str | None
    kind: str  # "gpu" or "cpu"
    steps: list[StepBreakdown]
    mean: StepBreakdown
    hta_filtered: HtaFigures | None
    hta_unfiltered: HtaFigures | None
    step_names: set[str]
    top_kernels: list[dict[str, Any]]
    top_operators: list[dict[str, Any]]
    events: int
    events_skipped: int
    bytes_read: int
    notes: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------------------
# analysis


def _np(a: array, dtype: Any = np.float64) -> np.ndarray:
    return np.frombuffer(a, dtype=dtype).copy() if len(a) else np.empty(0, dtype=dtype)


def _group_dims_from_layout(ranks: list[int], layout: Any) -> str | None:
    if layout is None or len(ranks) < 2:
        return None
    return layout.group_dim(ranks)


def _parse_ranks(text: str | None) -> list[int] | None:
    if not text:
        return None
    nums = re.findall(r"-?\d+", text)
    return [int(n) for n in nums] if nums else None


class _KindResolver:
    """Communication kinds from (name, collective, process group name, description, ranks) keys,
    using the trace's process groups and the run's layout."""

    def __init__(self, pg_config: list[dict[str, Any]], layout: Any) -> None:
        self.groups = {str(g.get("pg_name")): g for g in pg_config if isinstance(g, dict)}
        self.layout = layout
        self.cache: dict[tuple[Any, ...], int] = {}

    def __call__(self, key: tuple[Any, ...]) -> int:
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        name, collective, pg_name, pg_desc, pg_ranks = key
        group = self.groups.get(str(pg_name)) if pg_name is not None else None
        desc = pg_desc or (group.get("pg_desc") if group else None)
        dim = group_dim_from_desc(desc)
        if dim is None:
            ranks = _parse_ranks(pg_ranks)
            if ranks is None and group is not None and isinstance(group.get("ranks"), list):
                ranks = [int(r) for r in group["ranks"]]
            if ranks is not None:
                dim = _group_dims_from_layout(ranks, self.layout)
        kind = self.cache[key] = int(comm_kind(collective, name, dim))
        return kind


def _kernel_kinds(c: RankCollector, resolve: _KindResolver) -> np.ndarray:
    """A CommKind per device event (-1 for non-communication).

    A communication kernel that does not name its collective (older traces: every NCCL
    point-to-point and all-to-all kernel is ``SendRecv``) takes it from the CPU-side
    communication operations (``nccl:all_to_all``, ``c10d::allreduce_``, ``record_param_comms``)
    enclosing the call that launched it, on the launching thread.
    """
    keys = list(c.comm_keys)
    key_kinds = np.array([resolve(k) for k in keys] or [int(CommKind.OTHER)], dtype=np.int64)
    d_comm = _np(c.d_comm, np.int32)
    kinds = np.where(d_comm >= 0, key_kinds[np.clip(d_comm, 0, None)], -1)
    unnamed = [i for i, k in enumerate(keys) if not k[1]]
    if not unnamed or not len(c.x_ts) or not len(c.l_corr):
        return kinds
    todo = np.flatnonzero(np.isin(d_comm, unnamed))
    l_corr = _np(c.l_corr, np.int64)
    order = np.argsort(l_corr, kind="stable")
    l_corr, l_ts, l_tid = l_corr[order], _np(c.l_ts)[order], _np(c.l_tid, np.int32)[order]
    d_corr = _np(c.d_corr, np.int64)[todo]
    pos = np.clip(np.searchsorted(l_corr, d_corr), 0, l_corr.size - 1)
    found = l_corr[pos] == d_corr
    x_ts, x_end, x_tid, x_comm = _np(c.x_ts), _np(c.x_end), _np(c.x_tid, np.int32), _np(c.x_comm, np.int32)
    per_tid: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    for t in np.unique(x_tid):
        sel = np.flatnonzero(x_tid == t)
        sel = sel[np.argsort(x_ts[sel], kind="stable")]
        per_tid[int(t)] = (x_ts[sel], x_end[sel], x_comm[sel])
    for i, ev in enumerate(todo):
        if not found[i]:
            continue
        lt, tid = l_ts[pos[i]], int(l_tid[pos[i]])
        chain = per_tid.get(tid)
        if chain is None:
            continue
        ts, end, comm = chain
        j = int(np.searchsorted(ts, lt, side="right")) - 1
        collective = pg = None
        steps = 0
        while j >= 0 and steps < 16:  # walk outwards through the enclosing operations
            if end[j] >= lt:
                k = keys[comm[j]]
                if collective is None and k[1]:
                    collective = k[1]
                if pg is None and (k[2] is not None or k[3] is not None or k[4] is not None):
                    pg = k[2:]
            j -= 1
            steps += 1
        if collective is None and pg is None:
            continue
        base_key = keys[d_comm[ev]]
        kinds[ev] = resolve((base_key[0], collective, *(pg or base_key[2:])))
    return kinds


def _hta_merge(ts: np.ndarray, end: np.ndarray) -> iv.Intervals:
    """HTA's interval merge, kept faithful: a group starts where a start passes every earlier
    end; a group spans its least start to its greatest end. Unlike ``intervals.merge`` an event
    whose rounded end precedes its start is not clamped, as in HTA."""
    if ts.size == 0:
        return iv.EMPTY
    order = np.argsort(ts, kind="stable")
    s, e = ts[order], end[order]
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > np.maximum.accumulate(e)[:-1]
    first = np.flatnonzero(new)
    return s[first], np.maximum.reduceat(e, first)


def _hta_overlap(comp: iv.Intervals, comm: iv.Intervals) -> float | None:
    """HTA's overlap sweep: +1/-1 at communication starts/ends, +2/-2 for computation; time
    spent at a running total of 3, over the communication time."""
    comm_len = float(np.sum(comm[1] - comm[0]))
    if comm[0].size == 0 or comm_len == 0:
        return None
    times = np.concatenate([comm[0], comm[1], comp[0], comp[1]])
    status = np.concatenate(
        [np.ones(comm[0].size), -np.ones(comm[1].size), np.full(comp[0].size, 2.0), np.full(comp[1].size, -2.0)]
    )
    order = np.argsort(times, kind="stable")
    times, running = times[order], np.cumsum(status[order])
    both = running[:-1] == 3
    return 100.0 * float(np.sum((times[1:] - times[:-1])[both])) / comm_len


def _hta_figures(
    ts: np.ndarray, end: np.ndarray, cls: np.ndarray, keep: np.ndarray | None
) -> HtaFigures | None:
    """HTA's temporal breakdown on device events (times rounded as HTA rounds them)."""
    if keep is not None:
        ts, end, cls = ts[keep], end[keep], cls[keep]
    if ts.size == 0:
        return None
    everything = _hta_merge(ts, end)
    span = float(everything[1][-1] - everything[0][0])
    busy = float(np.sum(everything[1] - everything[0]))
    comp_sel = cls == DeviceClass.COMPUTE
    comm_sel = cls == DeviceClass.COMM
    comp = _hta_merge(ts[comp_sel], end[comp_sel])
    comm = _hta_merge(ts[comm_sel], end[comm_sel])
    compute = float(np.sum(comp[1] - comp[0]))
    idle = span - busy
    return HtaFigures(
        span_us=span,
        idle_us=idle,
        compute_us=compute,
        non_compute_us=span - compute - idle,
        comm_comp_overlap_pct=_hta_overlap(comp, comm),
    )


def _top(stats: dict[str, _NameStat], n: int, with_class: bool) -> list[dict[str, Any]]:
    items = sorted(stats.items(), key=lambda kv: kv[1].total, reverse=True)[:n]
    out = []
    for name, st in items:
        row: dict[str, Any] = {"name": name, "count": st.count, "total_us": st.total}
        if with_class:
            row["class"] = DeviceClass(st.cls).name.lower()
        out.append(row)
    return out


def _cpu_compute(c: RankCollector, base: float) -> iv.Intervals:
    """CPU operators' time on each thread, less that thread's communication, over all threads."""
    ts, end, tid = _np(c.c_ts) - base, _np(c.c_end) - base, _np(c.c_tid, np.int32)
    x_ts, x_end, x_tid = _np(c.x_ts) - base, _np(c.x_end) - base, _np(c.x_tid, np.int32)
    pieces_s: list[np.ndarray] = []
    pieces_e: list[np.ndarray] = []
    for t in np.unique(tid):
        sel = tid == t
        own = iv.merge(ts[sel], end[sel])
        xs = x_tid == t
        if xs.any():
            own = iv.subtract(own, iv.merge(x_ts[xs], x_end[xs]))
        pieces_s.append(own[0])
        pieces_e.append(own[1])
    if not pieces_s:
        return iv.EMPTY
    return iv.merge(np.concatenate(pieces_s), np.concatenate(pieces_e))


def _windows(c: RankCollector, base: float) -> tuple[list[int | None], np.ndarray, np.ndarray]:
    """The profiler steps' windows in time order, each clipped at the next one's start."""
    nums = sorted(c.steps, key=lambda k: c.steps[k][0])
    starts = np.array([c.steps[k][0] for k in nums]) - base
    ends = np.array([c.steps[k][1] for k in nums]) - base
    ends[:-1] = np.minimum(ends[:-1], starts[1:])
    return list(nums), starts, ends


_LAYERS = (
    ["compute"]
    + [k.label for k in CommKind]
    + ["memcpy", "other", "data_loading", "sync_wait", "launch", "comm_all"]
)
_IDX = {name: i for i, name in enumerate(_LAYERS)}


def analyze_rank(
    c: RankCollector,
    reader: TraceReader,
    layout: Any = None,
    top_n: int = 10,
) -> RankResult:
    meta = reader.metadata
    dist = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}
    pg_config = dist.get("pg_config") if isinstance(dist.get("pg_config"), list) else []
    devices = meta.get("deviceProperties") if isinstance(meta.get("deviceProperties"), list) else []
    device_name = devices[0].get("name") if devices and isinstance(devices[0], dict) else None
    rank = dist.get("rank") if isinstance(dist.get("rank"), int) else None
    world = dist.get("world_size") if isinstance(dist.get("world_size"), int) else None
    backend = dist.get("backend") if isinstance(dist.get("backend"), str) else None
    notes: list[str] = []

    base = math.floor(c.min_ts) if math.isfinite(c.min_ts) else 0.0  # integral: rounding commutes
    resolve = _KindResolver(pg_config, layout)

    d_ts = _np(c.d_ts) - base
    d_end = _np(c.d_end) - base
    d_cls = _np(c.d_cls, np.int8)
    d_hta = _np(c.d_hta_cls, np.int8)
    d_corr = _np(c.d_corr, np.int64)
    x_ts = _np(c.x_ts) - base
    x_end = _np(c.x_end) - base
    x_comm = _np(c.x_comm, np.int32)

    gpu = d_ts.size > 0
    layers: dict[str, iv.Intervals] = {}
    if gpu:
        comp_sel = d_cls == DeviceClass.COMPUTE
        layers["compute"] = iv.merge(d_ts[comp_sel], d_end[comp_sel])
        comm_sel = d_cls == DeviceClass.COMM
        comm_kind_of = _kernel_kinds(c, resolve)
        for k in CommKind:
            sel = comm_kind_of == int(k)
            layers[k.label] = iv.merge(d_ts[sel], d_end[sel])
        layers["comm_all"] = iv.merge(d_ts[comm_sel], d_end[comm_sel])
        mem_sel = d_cls == DeviceClass.MEMORY
        layers["memcpy"] = iv.merge(d_ts[mem_sel], d_end[mem_sel])
        oth_sel = d_cls == DeviceClass.OTHER
        layers["other"] = iv.merge(d_ts[oth_sel], d_end[oth_sel])
    else:
        layers["compute"] = _cpu_compute(c, base)
        keys = list(c.comm_keys)
        x_kind = np.array([resolve(keys[i]) for i in x_comm], dtype=np.int64)
        for k in CommKind:
            sel = x_kind == int(k)
            layers[k.label] = iv.merge(x_ts[sel], x_end[sel])
        layers["comm_all"] = iv.merge(x_ts, x_end)
        layers["memcpy"] = iv.EMPTY
        layers["other"] = iv.EMPTY
        if c.c_ts or c.x_ts:
            notes.append("CPU-only trace: the CPU is the device; communication is gloo/c10d operations")
    h_ts = _np(c.h_ts) - base
    h_end = _np(c.h_end) - base
    h_cls = _np(c.h_cls, np.int8)
    for hc, label in (
        (HostClass.DATA_LOADING, "data_loading"),
        (HostClass.SYNC_WAIT, "sync_wait"),
        (HostClass.LAUNCH, "launch"),
    ):
        sel = h_cls == hc
        layers[label] = iv.merge(h_ts[sel], h_end[sel])

    # step windows
    if c.steps:
        nums, ws, we = _windows(c, base)
    else:
        notes.append("no ProfilerStep annotations: the whole trace is treated as one step")
        lo = 0.0
        hi = (c.max_end - base) if math.isfinite(c.max_end) else 0.0
        nums, ws, we = [None], np.array([lo]), np.array([hi])
    excl, incl = iv.attribute([layers[name] for name in _LAYERS], ws, we)

    steps: list[StepBreakdown] = []
    for i, num in enumerate(nums):
        steps.append(_breakdown(num, float(ws[i]), float(we[i] - ws[i]), excl[i], incl[i]))
    mean = _mean(steps)

    # HTA-comparable figures
    hta_f = hta_u = None
    if gpu:
        # HTA rounds sub-microsecond times: starts up, ends down
        r_ts, r_end = np.ceil(d_ts), np.floor(d_end)
        hta_u = _hta_figures(r_ts, r_end, d_hta, None)
        if math.isfinite(c.hta_last_step_start):
            cut = math.ceil(c.hta_last_step_start) - base
            l_corr = _np(c.l_corr, np.int64)
            l_ts = np.ceil(_np(c.l_ts) - base)
            launched = np.unique(l_corr[l_ts < cut])
            keep = np.where(d_corr >= 0, np.isin(d_corr, launched), r_ts < cut)
            hta_f = _hta_figures(r_ts, r_end, d_hta, keep)
    else:
        comp, comm = layers["compute"], layers["comm_all"]
        ts = np.concatenate([comp[0], comm[0]])
        end = np.concatenate([comp[1], comm[1]])
        cls = np.concatenate(
            [np.full(comp[0].size, DeviceClass.COMPUTE), np.full(comm[0].size, DeviceClass.COMM)]
        ).astype(np.int8)
        hta_u = _hta_figures(ts, end, cls, None)
        if math.isfinite(c.hta_last_step_start):
            hta_f = _hta_figures(ts, end, cls, ts + base < c.hta_last_step_start)

    return RankResult(
        file=str(reader.path),
        rank=rank,
        world_size=world,
        backend=backend,
        pg_config=pg_config,
        device_name=device_name,
        kind="gpu" if gpu else "cpu",
        steps=steps,
        mean=mean,
        hta_filtered=hta_f,
        hta_unfiltered=hta_u,
        step_names=set(c.step_names),
        top_kernels=_top(c.kernel_stats, top_n, True),
        top_operators=_top(c.op_stats, top_n, False),
        events=c.events,
        events_skipped=reader.events_skipped,
        bytes_read=reader.bytes_read,
        notes=notes,
    )


def _breakdown(num: int | None, start: float, step: float, ex: np.ndarray, inc: np.ndarray) -> StepBreakdown:
    by_kind = {k.label: float(ex[_IDX[k.label]]) for k in CommKind}
    comm_exposed = sum(by_kind.values())
    comm_total = float(inc[_IDX["comm_all"]])
    data = float(ex[_IDX["data_loading"]])
    sync = float(ex[_IDX["sync_wait"]])
    launch = float(ex[_IDX["launch"]])
    python = float(ex[-1])
    return StepBreakdown(
        step=num,
        start_us=start,
        step_us=step,
        compute_us=float(ex[_IDX["compute"]]),
        comm_us=comm_total,
        comm_exposed_us=comm_exposed,
        comm_hidden_us=max(comm_total - comm_exposed, 0.0),
        memcpy_us=float(inc[_IDX["memcpy"]]),
        memcpy_exposed_us=float(ex[_IDX["memcpy"]]),
        other_exposed_us=float(ex[_IDX["other"]]),
        idle_us=data + sync + launch + python,
        host_us=data + launch + python,
        data_loading_us=data,
        sync_wait_us=sync,
        launch_us=launch,
        python_us=python,
        comm_exposed_by_kind=by_kind,
    )


def _mean(steps: list[StepBreakdown]) -> StepBreakdown:
    n = len(steps)
    fields = [f for f in StepBreakdown.__dataclass_fields__ if f not in ("step", "comm_exposed_by_kind")]
    vals = {f: sum(getattr(s, f) for s in steps) / n for f in fields}
    kinds = {k.label: sum(s.comm_exposed_by_kind[k.label] for s in steps) / n for k in CommKind}
    return StepBreakdown(step=None, comm_exposed_by_kind=kinds, **vals)


def read_rank(path: str | Path, layout: Any = None, top_n: int = 10) -> RankResult:
    """Stream one trace file and analyse it."""
    reader = TraceReader(path)
    collector = RankCollector()
    for batch in reader.batches():
        collector.add(batch)
    return analyze_rank(collector, reader, layout=layout, top_n=top_n)
