"""The analyzer's output, as pydantic models (the CLI's --json and the MCP server share them)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA = "attune.trace-analysis/1"


class Breakdown(BaseModel):
    """A step's time split (microseconds). See docs/traces.md for the definitions.

    compute + comm_exposed + memcpy_exposed + other_exposed + idle = step;
    idle = data_loading + sync_wait + launch + python; host = data_loading + launch + python.
    """

    step: int | None = Field(None, description="profiler step number; null for a mean or an unstepped trace")
    start_us: float = Field(description="window start, from the trace's first event")
    step_us: float
    compute_us: float
    comm_us: float = Field(description="all communication time, hidden or not")
    comm_exposed_us: float = Field(description="communication with no computation running")
    comm_hidden_us: float
    memcpy_us: float
    memcpy_exposed_us: float
    other_exposed_us: float = Field(description="other device activity (sync markers) alone")
    idle_us: float = Field(description="the device does nothing")
    host_us: float = Field(description="device idle while the host loads data, launches or runs Python")
    data_loading_us: float
    sync_wait_us: float = Field(description="device idle while the host is blocked in a sync call")
    launch_us: float
    python_us: float = Field(description="device idle while the host runs Python/CPU operators")
    comm_exposed_by_kind: dict[str, float]


class Wait(BaseModel):
    what: str = Field(description="pipeline_p2p, all_to_all, tp_collective, cp_collective, dp_reduce, "
                      "other_comm, memcpy, other_device, host_data_loading, host_launch, host_python, sync_wait")
    us: float = Field(description="mean per step")
    share: float = Field(description="fraction of the step")


class NameTotal(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    name: str
    count: int
    total_us: float
    per_step_us: float | None = None
    kind: str | None = Field(None, description="device class: compute, comm, memory, other")
    ranks: int | None = Field(None, description="how many traces it appears in (cross-rank lists)")


class RankReport(BaseModel):
    rank: int | None
    file: str
    stage: int | None
    kind: Literal["gpu", "cpu"]
    device: str | None = None
    backend: str | None = None
    world_size: int | None = None
    steps: int = Field(description="profiler steps found")
    step_us: float = Field(description="mean step time")
    # HTA-comparable figures (whole trace, HTA's definitions)
    compute_us: float | None = Field(description="HTA temporal breakdown: computation time")
    non_compute_us: float | None = Field(description="HTA: span - compute - idle")
    idle_us: float | None = Field(description="HTA: span minus the union of all device events")
    span_us: float | None = Field(description="HTA: first device event start to last end")
    comm_comp_overlap_pct: float | None = Field(description="HTA: overlap time / communication time, %")
    hta_last_step_dropped: bool = Field(description="whether HTA's rule dropped the last profiler step")
    # attune's own breakdown
    busy_us: float = Field(description="mean step less exposed pipeline send/receive")
    breakdown: Breakdown = Field(description="mean over the profiled steps")
    waits_on: list[Wait]
    per_step: list[Breakdown]
    top_kernels: list[NameTotal]
    top_operators: list[NameTotal]
    events: int
    events_skipped: int
    bytes: int
    notes: list[str] = []


class StageReport(BaseModel):
    stage: int
    ranks: list[int | None]
    step_us: float
    busy_us: float
    breakdown: Breakdown = Field(description="mean over the stage's traced ranks")
    waits_on: list[Wait]


class Slowest(BaseModel):
    stage: int
    busy_us: float
    step_us: float
    slowest_rank: int | None
    bottleneck: str | None = Field(description="what the slowest stage waits on most")
    waits_on: list[Wait]


class TraceReport(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    schema_: str = Field(SCHEMA, alias="schema")
    summary: str
    files: int
    layout: dict[str, object] | None
    stage_source: str = Field(description="layout, process_groups or assumed_single_stage")
    slowest_stage: Slowest | None
    stages: list[StageReport]
    ranks: list[RankReport]
    top_kernels: list[NameTotal]
    top_operators: list[NameTotal]
    analysis_seconds: float
