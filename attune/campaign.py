"""Starting a campaign: freeze and hash its spec, and write the first ledger row."""

from __future__ import annotations

from pathlib import Path

from attune import ledger as ledger_mod
from attune.spec import CampaignSpec, load_spec, spec_sha256
from attune.state import CampaignState, load


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
        },
    )
    state, _ = load(d)
    return spec, state
