"""Starting a campaign: freeze and hash its spec, and write the first ledger row."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path

from attune import ledger as ledger_mod
from attune.spec import CampaignSpec, load_spec, spec_sha256
from attune.state import CampaignState, load

LOCK_NAME = ".control.lock"


@contextlib.contextmanager
def campaign_lock(campaign_dir: Path | str) -> Iterator[None]:
    """An exclusive, cross-process lock on the campaign's control plane (admission, finishing, stop)."""
    with open(Path(campaign_dir) / LOCK_NAME, "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        yield


class CampaignError(Exception):
    """The campaign directory cannot be used as it is."""


def start(campaign_dir: Path | str, list_sha256: str | None = None) -> tuple[CampaignSpec, CampaignState]:
    """Validate the spec and, on a new ledger, record `campaign_started` with the spec's hash.

    On an existing ledger, the spec must still hash to the pinned value: a campaign's spec is
    frozen once it starts. Raises SpecError (bad spec) or CampaignError (changed spec).
    """
    d = Path(campaign_dir)
    spec = load_spec(d / "campaign.yaml")
    digest = spec_sha256(d / "campaign.yaml")
    state, _ = load(d)
    if state.name is not None:
        if state.spec_sha256 != digest:
            raise CampaignError(
                f"{d / 'campaign.yaml'} changed after the campaign started "
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
            "replicate_check_runs": spec.gate.replicate_check_runs,
        },
    )
    state, _ = load(d)
    return spec, state


class RecordError(Exception):
    """A record the campaign refuses (missing evidence, a wrong leader)."""


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
    state, _ = load(campaign_dir)
    if state.name is None:
        raise RecordError("the campaign has not started")
    if state.stop is not None:
        raise RecordError(f"a stop is already recorded (ledger row {state.stop['seq']})")
    actual = state.leader_run_id
    if leader is not None and leader != actual:
        raise RecordError(f"the campaign's leader is {actual!r}, not {leader!r}")
    tested = sorted({r.lever for r in state.runs.values() if r.kind == "search" and r.lever})
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
