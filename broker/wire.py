"""The broker's wire format, defined once: every route's request and answer as a pydantic model.

The broker (broker/service.py) validates each request's body and query with these models and
builds each answer with them; a launch's answer is the control plane's own `LaunchAnswer`, served as
it is from admission to the wire. The broker MCP server (mcp_servers/broker_server.py) builds its
requests with them and returns them (or a view of them: `LaunchResult`, `CampaignStatus`) as its
tools' results. docs/broker.md's HTTP table describes the same shapes.

Answers allow fields beyond those declared (a newer control plane may add one; it passes through
instead of being dropped), and tests/test_broker_wire.py checks that a real campaign's answers carry
none: the declarations are complete. Bodies forbid unknown fields; queries ignore them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from attune.control.plane import LaunchAnswer, LaunchRequest
from attune.control.search_rules import STOP_RULE_CODES
from attune.core.state import STOP_BLOCKER_CODES
from attune.core.vocab import refusal_codes_text

__all__ = [
    "Budget", "Calibration", "CampaignStatus", "CampaignSummary", "CancelAnswer", "CancelRequest", "CandidateChanges",
    "DiagnosisRequest", "DirEntry", "DirPage", "ErrorAnswer", "Health", "ImageListQuery", "ImageReadQuery",
    "ImageSearchQuery", "LaunchAnswer", "LaunchRequest", "LaunchResult", "Leader", "LinesPage", "ListRunsQuery",
    "LogQuery", "LogSearchQuery", "Match", "PageQuery", "Recorded", "AssumptionRequest", "RunInfo", "RunList",
    "RunRow", "SearchAnswer", "Shipping", "StopBlocker", "StopRefused", "StopRequest", "Value",
]

Value = str | int | float | bool | None

# Bounds shared by the broker's queries and the MCP tools' parameters.
Offset = Annotated[int, Field(ge=0, le=10**9)]
LineNumber = Annotated[int, Field(ge=1, le=10**9)]
MaxLines = Annotated[int, Field(ge=1, le=500)]
MaxResults = Annotated[int, Field(ge=1, le=200)]
RunsLimit = Annotated[int, Field(ge=1, le=200)]
EntriesLimit = Annotated[int, Field(ge=1, le=500)]
RunStatusFilter = Literal["admitted", "running", "finished", "in_flight"]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Query(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _Answer(BaseModel):
    model_config = ConfigDict(extra="allow")


# ----------------------------------------------------------------------------------- request bodies


class CandidateChanges(_Body):
    """A candidate's edits to its base recipe (LaunchRequest.changes, typed)."""

    args: dict[str, Value] = Field(default_factory=dict, description=(
        "Megatron flags with leading '--' -> value; true for a bare flag; null or false removes the flag"))
    env: dict[str, str | None] = Field(default_factory=dict, description=(
        "environment variables (only those on the campaign's allowlist) -> value; null unsets"))


class CancelRequest(_Body):
    """POST /v1/runs/{run_id}/cancel: cancelled (the agent) or pruned (a tuner's early abort)."""

    reason: str | None = Field(None, max_length=200, description="cancelled (default) or pruned")


class AssumptionRequest(_Body):
    """POST /v1/assumptions."""

    question: str
    default: str
    context: str | None = None


class StopRequest(_Body):
    """POST /v1/stop."""

    levers_tested: list[str]
    diagnosis: str
    leader: str | None = None


class DiagnosisRequest(_Body):
    """POST /v1/diagnoses."""

    run_id: str
    diagnosis: str
    bottleneck: str | None = None


# ----------------------------------------------------------------------------------- queries


class ListRunsQuery(_Query):
    """GET /v1/runs."""

    offset: Offset = 0
    limit: RunsLimit = 50
    status: RunStatusFilter | None = None


class LogQuery(_Query):
    """GET /v1/runs/{run_id}/log: the last `tail` lines, or a page from `offset_line`."""

    tail: MaxLines | None = None
    offset_line: LineNumber | None = None
    max_lines: MaxLines = 200


class LogSearchQuery(_Query):
    """GET /v1/runs/{run_id}/log/search."""

    pattern: str = ""
    max_results: MaxResults = 50
    regex: bool = True
    ignore_case: bool = False


class PageQuery(_Query):
    """GET /v1/runs/{run_id}/files/{path}: a page of a file."""

    offset_line: LineNumber = 1
    max_lines: MaxLines = 200


class ImageListQuery(_Query):
    """GET /v1/image/list."""

    path: str = ""
    offset: Offset = 0
    limit: EntriesLimit = 200


class ImageReadQuery(PageQuery):
    """GET /v1/image/read."""

    path: str = Field(min_length=1)


class ImageSearchQuery(_Query):
    """GET /v1/image/search."""

    pattern: str = ""
    path: str = ""
    glob: str | None = None
    max_results: MaxResults = 50
    regex: bool = True
    ignore_case: bool = False


# ----------------------------------------------------------------------------------- answers


class ErrorAnswer(_Answer):
    """Every refusal: a stable code and what to change."""

    error: str
    reason: str


class Health(_Answer):
    """GET /v1/health."""

    ok: bool
    service: str
    pid: int


class Budget(_Answer):
    """The campaign's GPU-hours (attune status's budget)."""

    total_gpu_hours: float | None
    charged_gpu_hours: float
    in_flight_gpu_hours: float
    reserve_left_gpu_hours: float
    search_remaining_gpu_hours: float | None
    infra_charged_gpu_hours: float = 0.0
    reserve_gpu_hours: float | None = None
    infra_reserve_gpu_hours: float | None = None
    final_charged_gpu_hours: float | None = None
    remaining_gpu_hours: float | None = None
    check_left_gpu_hours: float | None = None
    reserve_overrun_gpu_hours: float | None = None
    spent: bool = False


class Calibration(_Answer):
    required_runs: int
    runs: int
    values: list[float] = Field(default_factory=list)
    mean: float | None
    rel_sigma: float | None
    band: float | None


class Leader(_Answer):
    run_id: str | None
    tokens_per_s_per_gpu: float | None
    gain: float | None = Field(description="over the calibrated baseline mean")
    gain_evidence: str | None = Field(None, description="unconfirmed (one measurement cleared the band), confirmed "
                                      "or not_confirmed (by the final re-measurement)")


class StopBlocker(_Answer):
    code: str
    message: str
    items: list[str] = Field(default_factory=list)
    targets: list[dict[str, str]] = Field(default_factory=list, description=(
        "what the rule names, to act on: {run_id} of rule 5's out-of-memory runs, {name, value} of rule 6's "
        "winning values"))


class Shipping(_Answer):
    """The control plane's shipping step, which runs after the stop (not the agent's)."""

    phase: str = Field(description="searching | waiting | checking | remeasuring | done | failed")
    done: bool = Field(description="shipped and re-measured with valid measurements: nothing more runs")
    failed: bool = Field(False, description="the campaign ended failed (no valid evidence): nothing more runs")
    failure: str | None = Field(None, description="why it failed")
    next: str | None = Field(None, description="the control plane's next step")
    of: str | None = Field(None, description="the recipe that step is about: baseline or a run id")
    shipped: str | None = Field(None, description="the shipped run id, or baseline")
    candidates: list[str] = Field(default_factory=list, description="runs to check, fastest first")
    checks: list[dict[str, Any]] = Field(default_factory=list, description="gate verdicts so far")
    remeasured: dict[str, list[float]] = Field(default_factory=dict, description="recipe -> re-measured throughputs")
    reason: str = ""


class RunInfo(_Answer):
    """GET /v1/runs/{run_id}: one run (the runs[] of attune status), live progress while in flight."""

    run_id: str
    kind: str
    status: str = Field(description="admitted (queued), running or finished")
    changes: dict[str, Any] = Field(default_factory=dict)
    hypothesis: str | None = None
    lever: str | None = None
    expected_gain: float | None = None
    expected_gpu_hours: float = 0.0
    profile: bool = False
    outcome: str | None = Field(None, description="ok, oom, hang, crash, infrastructure, cancelled, pruned or overrun")
    charge_gpu_hours: float = 0.0
    charged_to: str | None = None
    tokens_per_s_per_gpu: float | None = None
    valid: bool | None = None
    invalid_reasons: list[str] = Field(default_factory=list)
    verdict: str | None = Field(None, description="leader, within_band, slower, invalid, failed, calibration, ...")
    recipe_key: str | None = None
    base_run_id: str | None = None
    purpose: str | None = Field(None, description="a check run's purpose: replicate (a borderline check's one replicate)")
    retry_of: str | None = None
    backend_id: str | None = None
    nodes: list[str] = Field(default_factory=list)
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    reason: str | None = None
    recipe_failure: bool = False
    prune_below: float | None = None
    backend_state: str | None = None
    log_bytes: int | None = None
    seconds_since_log_progress: float | None = None
    hang_timeout_s: float | None = None


class RunRow(_Answer):
    """One row of GET /v1/runs."""

    run_id: str
    kind: str
    status: str
    lever: str | None = None
    outcome: str | None = None
    tokens_per_s_per_gpu: float | None = None
    valid: bool | None = None
    verdict: str | None = None
    charge_gpu_hours: float = 0.0
    expected_gpu_hours: float = 0.0
    profile: bool = False
    changes: dict[str, Any] = Field(default_factory=dict)


class RunList(_Answer):
    """GET /v1/runs: a page of runs, oldest first."""

    runs: list[RunRow]
    total: int
    offset: int = 0
    next_offset: int | None = Field(description="pass as offset for the next page; null at the end")


class CancelAnswer(_Answer):
    run_id: str
    cancelled: bool
    outcome: str | None = None
    charge_gpu_hours: float | None = None
    reason: str | None = None


class LinesPage(_Answer):
    """A page of a text file: the log's tail, or lines from offset_line (follow next_line)."""

    path: str
    lines: list[str]
    size_bytes: int | None = None
    offset_line: int | None = None
    next_line: int | None = Field(None, description="pass as offset_line for the next page; null at the end")
    eof: bool | None = None
    truncated: bool | None = None
    note: str | None = None


class Match(_Answer):
    path: str
    line: int
    text: str


class SearchAnswer(_Answer):
    pattern: str
    matches: list[Match]
    truncated: bool = Field(description="true when more matches exist than were returned")
    path: str | None = None
    files_scanned: int | None = None
    resume_line: int | None = None
    note: str | None = None


class DirEntry(_Answer):
    name: str
    type: Literal["dir", "file"]
    size_bytes: int | None = None


class DirPage(_Answer):
    path: str
    entries: list[DirEntry]
    total: int
    next_offset: int | None = None


class Recorded(_Answer):
    recorded: bool
    seq: int = Field(description="the ledger row's sequence number")
    leader: str | None = None


class StopRefused(_Answer):
    """POST /v1/stop, 409: the search rules refused the stop (codes and missing items)."""

    error: Literal["stop_refused"] = "stop_refused"
    reason: str
    refusals: list[StopBlocker]


class LedgerVerification(_Answer):
    """GET /v1/ledger/verify: the broker checks the ledger with its key (which the agent never sees)."""

    ok: bool
    rows: int
    authenticated: bool = Field(description="every row's MAC checked with the campaign's key, not only the chain")
    torn_tail: bool = False
    problem: str | None = None
    error: str | None = None
    last_hash: str | None = None
    note: str | None = None


class CampaignSummary(_Answer):
    """GET /v1/campaign."""

    name: str
    model: str
    framework: str
    backend: str
    gpus: int | None
    budget: Budget
    calibration: Calibration
    leader: Leader
    concurrency: int
    in_flight: list[RunInfo]
    launches: int
    failed_launches: int
    launches_refused: int
    runs: int
    stop: dict[str, Any] | None
    shipped: dict[str, Any] | None
    last_diagnosis: str | None
    missing_for_stop: list[str]
    stop_blockers: list[StopBlocker]
    search_rules: str
    rows: int
    shipping: Shipping | None
    remeasurements: list[dict[str, Any]]
    checks: list[dict[str, Any]]
    failed: dict[str, Any] | None
    hang_timeout_s: float
    env_allowlist: list[str]
    image_roots: list[dict[str, str]]


# ----------------------------------------------------------------------------------- the MCP tools' views


REFUSAL_CODES = refusal_codes_text()  # every code, from attune.core.vocab.RefusalCode


class LaunchResult(BaseModel):
    """The broker's answer to a launch: admitted (with its run id) or refused (with what to change)."""

    admitted: bool
    run_id: str | None = None
    code: str | None = Field(None, description="refusal code: " + REFUSAL_CODES)
    reason: str | None = Field(None, description="why it was refused, in words: what to change")
    expected_gpu_hours: float | None = None
    changes: dict[str, Any] | None = Field(None, description="the recipe's full difference from the baseline")
    retry_of: str | None = Field(None, description="the infrastructure failure this launch retries")
    gate_summary: str | None = None
    gate_refusals: list[dict[str, Any]] = Field(default_factory=list)
    submitted: bool | None = None
    budget: Budget | None = None

    @classmethod
    def of(cls, a: LaunchAnswer) -> LaunchResult:
        gate = a.gate or {}
        return cls(admitted=a.admitted, run_id=a.run_id, code=a.code, reason=a.reason or a.submit_error,
                   expected_gpu_hours=a.expected_gpu_hours, changes=a.changes, retry_of=a.retry_of,
                   gate_summary=gate.get("summary"), gate_refusals=gate.get("refusals") or [],
                   submitted=a.submitted, budget=a.budget)


class CampaignStatus(BaseModel):
    """The campaign at a glance (campaign_status): CampaignSummary, with runs in flight by id."""

    name: str
    failed: str | None = Field(None, description="why the campaign ended failed (no valid evidence); null otherwise")
    model: str
    backend: str
    gpus: int | None
    budget: Budget
    calibration: Calibration
    leader: Leader
    concurrency: int
    in_flight: list[str]
    launches: int
    failed_launches: int
    launches_refused: int
    stop_recorded: bool
    missing_for_stop: list[str]
    stop_blockers: list[StopBlocker] = Field(default_factory=list, description=(
        "what blocks the end of the campaign, each with a stable code (" + ", ".join(STOP_BLOCKER_CODES[1:])
        + ", and the search rules' refusals of the last stop: " + ", ".join(STOP_RULE_CODES)
        + ") and its missing items"))
    search_rules: str = "enforced"
    env_allowlist: list[str]
    image_roots: list[str]
    shipping: Shipping | None = None

    @classmethod
    def of(cls, s: CampaignSummary) -> CampaignStatus:
        return cls(name=s.name, model=s.model, backend=s.backend, gpus=s.gpus, budget=s.budget,
                   calibration=s.calibration, leader=s.leader, concurrency=s.concurrency,
                   in_flight=[r.run_id for r in s.in_flight], launches=s.launches, failed_launches=s.failed_launches,
                   launches_refused=s.launches_refused, stop_recorded=s.stop is not None,
                   missing_for_stop=s.missing_for_stop, stop_blockers=s.stop_blockers,
                   search_rules=s.search_rules or "enforced", env_allowlist=s.env_allowlist,
                   image_roots=[r["name"] for r in s.image_roots], shipping=s.shipping,
                   failed=(s.failed or {}).get("reason"))
