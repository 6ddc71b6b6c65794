"""Starting a campaign: freeze and hash its spec, and write the first ledger row."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from attune.control.spec import CampaignSpec, load_spec, spec_sha256
from attune.core import ledger as ledger_mod
from attune.core.campaign_paths import CAMPAIGN_FILE, CONTROL_LOCK
from attune.core.errors import ControlError
from attune.core.state import CampaignState, current, load
from attune.core.vocab import RunKind

LOCK_NAME = CONTROL_LOCK


@contextlib.contextmanager
def campaign_lock(campaign_dir: Path | str) -> Iterator[None]:
    """An exclusive, cross-process lock on the campaign's control plane (admission, finishing, stop)."""
    with open(Path(campaign_dir) / LOCK_NAME, "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        yield


class CampaignError(ControlError):
    """The campaign directory cannot be used as it is."""


def start(campaign_dir: Path | str, list_sha256: str | None = None,
          search_rules: str = "enforced") -> tuple[CampaignSpec, CampaignState]:
    """Validate the spec and, on a new ledger, record `campaign_started` with the spec's hash.

    `search_rules`: "enforced" (the agent and the heuristic tuner: the control plane enforces the
    skill's search rules 2, 4, 5 and 6) or "off" (a black-box tuner, which samples the space).

    On an existing ledger, the spec must still hash to the pinned value: a campaign's spec is
    frozen once it starts. Raises SpecError (bad spec) or CampaignError (changed spec).
    """
    d = Path(campaign_dir)
    spec = load_spec(d / CAMPAIGN_FILE)
    digest = spec_sha256(d / CAMPAIGN_FILE)
    state, _ = load(d)
    if state.name is not None:
        if state.spec_sha256 != digest:
            raise CampaignError(
                f"{d / CAMPAIGN_FILE} changed after the campaign started "
                f"(pinned sha256 {state.spec_sha256}, now {digest}); a campaign's spec is frozen"
            )
        return spec, state
    if ledger_mod.Ledger(d).exists() and state.last_seq >= 0:
        raise CampaignError(f"{d / ledger_mod.LEDGER_NAME} has rows but no campaign_started row first")
    budget = spec.budget
    ledger_mod.Ledger(d).append(
        "campaign_started",
        {
            "name": spec.name,
            "spec_sha256": digest,
            "list_sha256": list_sha256 or spec.gate.list_sha256,
            "model": spec.model,
            "framework": spec.framework,
            "backend": spec.cluster.backend,
            "gpus": spec.cluster.gpus,
            "budget_gpu_hours": budget.gpu_hours,
            "reserve_gpu_hours": budget.reserve_gpu_hours,
            "infra_reserve_gpu_hours": budget.infra_reserve_gpu_hours,
            "concurrency": budget.concurrency,
            "calibration_runs": spec.calibration.runs,
            "band_floor": spec.band.floor,
            "band_k_sigma": spec.band.k_sigma,
            "window": list(spec.workload.window),
            "steps_per_run": spec.workload.steps_per_run,
            "tokens_per_step": spec.workload.tokens,
            "replicate_check_runs": _replicate_check_runs(spec),
            "search_rules": "off" if search_rules == "off" else "enforced",
        },
    )
    state, _ = load(d)
    return spec, state


def _replicate_check_runs(spec: CampaignSpec) -> int:
    """The shipping policy's count (imported here alone: the control plane does not load the policy)."""
    from attune.control.shipping import replicate_check_runs

    return replicate_check_runs(spec)


class RecordError(ControlError):
    """A record the campaign refuses (missing evidence, a wrong leader). `code`: a stable word for
    callers that act on the refusal (the broker answers it as the error), never the prose."""

    def __init__(self, message: str, code: str = "refused") -> None:
        super().__init__(message)
        self.code = code


class StopRefusedError(RecordError):
    """A stop the search rules refuse: each refusal has a code and the missing items."""

    def __init__(self, refusals: list[Any]) -> None:
        self.refusals = refusals
        super().__init__("the stop is refused: " + " | ".join(r.line() for r in refusals))


MAX_TEXT = 8000


def _text(name: str, value: object, *, required: bool = True) -> str | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        if required:
            raise RecordError(f"{name} is required and must not be empty")
        return None
    if not isinstance(value, str):
        raise RecordError(f"{name} must be a string")
    if len(value) > MAX_TEXT:
        raise RecordError(f"{name} is longer than {MAX_TEXT} characters")
    return value.strip()


def record_assumption(
    campaign_dir: Path | str, question: str, default: str, context: str | None = None
) -> ledger_mod.Row:
    """Record that the agent took a default instead of asking a person."""
    data = {"question": _text("question", question), "default": _text("default", default)}
    ctx = _text("context", context, required=False)
    if ctx:
        data["context"] = ctx
    return ledger_mod.Ledger(campaign_dir).append("assumption_recorded", data)


def record_diagnosis(campaign_dir: Path | str, run_id: str, text: str,
                     bottleneck: str | None = None) -> ledger_mod.Row:
    """Record the diagnosis of one finished run: what bounds its step, and why (kept in the ledger and the report)."""
    body = _text("diagnosis", text)
    neck = _text("bottleneck", bottleneck, required=False)
    if not isinstance(run_id, str) or not run_id.strip():
        raise RecordError("run_id is required")
    with campaign_lock(campaign_dir):
        state = current(campaign_dir)
        if state.name is None:
            raise RecordError("the campaign has not started")
        run = state.runs.get(run_id)
        if run is None:
            raise RecordError(f"no run {run_id!r} in this campaign")
        if run.status != "finished":
            raise RecordError(f"run {run_id} has not finished yet: diagnose it once it has")
        data: dict[str, Any] = {"text": body, "run_id": run_id}
        if neck:
            data["bottleneck"] = neck
        return ledger_mod.Ledger(campaign_dir).append("diagnosis_recorded", data)


def record_stop(
    campaign_dir: Path | str, levers_tested: list[str], diagnosis: str, leader: str | None = None
) -> ledger_mod.Row:
    """Record the agent's stop with its evidence: the leader (from the ledger), the levers tested, the diagnosis.

    A stated `leader` must be the campaign's leader. The leader recorded is always the ledger's.
    """
    if not isinstance(levers_tested, list) or not levers_tested:
        raise RecordError("levers_tested must name at least one lever the campaign tested")
    levers = [_text(f"levers_tested[{i}]", lv) for i, lv in enumerate(levers_tested)]
    text = _text("diagnosis", diagnosis)
    with campaign_lock(campaign_dir):
        return _append_stop(campaign_dir, levers, text, leader)


def _append_stop(campaign_dir: Path | str, levers: list[str | None], text: str | None,
                 leader: str | None) -> ledger_mod.Row:
    state = current(campaign_dir)
    if state.name is None:
        raise RecordError("the campaign has not started")
    if state.stop is not None:
        raise RecordError(f"a stop is already recorded (ledger row {state.stop['seq']})", "stop_already_recorded")
    actual = state.leader_run_id
    if leader is not None and leader != actual:
        raise RecordError(f"the campaign's leader is {actual!r}, not {leader!r}")
    from attune.control import search_rules

    spec = load_spec(Path(campaign_dir) / CAMPAIGN_FILE)
    refusals = search_rules.stop_refusals(spec, state, [lv for lv in levers if lv])
    if refusals:
        ledger_mod.Ledger(campaign_dir).append("stop_refused", {
            "refusals": [r.as_dict() for r in refusals], "codes": [r.code for r in refusals],
            "levers_tested": levers, "diagnosis": text,
        })
        raise StopRefusedError(refusals)
    tested = sorted({r.lever for r in state.runs.values() if r.kind == RunKind.SEARCH and r.lever})
    return ledger_mod.Ledger(campaign_dir).append(
        "stop_recorded",
        {
            "leader": actual,
            "leader_tokens_per_s_per_gpu": state.leader_tokens_per_s_per_gpu,
            "leader_gain": state.leader_gain(),
            "levers_tested": levers,
            "levers_launched": tested,
            "diagnosis": text,
        },
    )
