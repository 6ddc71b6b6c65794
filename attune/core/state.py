"""Campaign state, rebuilt by folding the ledger.

The ledger is the source of truth; this module turns its rows into the campaign's
current state: the budget (total, charged, in flight, reserve, remaining), the baseline
calibration (mean, relative sigma, band), the leader, every run (recipe diff, outcome,
charge, throughput, verdict), the assumptions, the stop record and the shipped result.

`fold(rows)` rebuilds from scratch; `CampaignState.apply(row)` updates incrementally,
and `Follower` keeps a state current by reading only the rows appended since its last
refresh. The two give the same state (tests/test_state.py checks it as a property). The
control plane reads its state through a Follower (`Follower.snapshot`): a call folds only
the rows appended since the last one, by this process or another, and verifies only those
(chain, MACs, anchor), after cheap checks that the part already read is unchanged (see
`Follower`).

Standard library only: the Stop and SessionStart hooks fold the ledger.

Budget arithmetic (GPU-hours):
    charged          all charges to the campaign budget (search runs, calibration, checks)
    infra_charged    infrastructure failures, paid by the infrastructure reserve
    final_charged    the final re-measurement after shipping (outside the budget)
    in_flight        expected cost of admitted runs that have not finished
    reserve          held back for the shipping step's correctness check runs (the baseline's reference
                     and replicate check runs, the candidates' checks)
    reserve_left     reserve - check charges - check runs in flight
    remaining        total - charged - in_flight
    search_remaining remaining - reserve_left: what a new search launch may use
    check_left       min(reserve_left, remaining): what a new check run may use (checks are paid from the
                     reserve only, and the budget is never exceeded)
    reserve_overrun  how far the other runs (calibration, search) have eaten into the reserve:
                     reserve_left - remaining when positive (their charges beyond total - reserve)
"""

from __future__ import annotations

import copy
import hashlib
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from attune.core import ledger as ledger_mod
from attune.core.measure import Calibration, beats, calibrate, gain, noise_note
from attune.core.vocab import RECIPE_FAILURES, RunKind, RunOutcome, RunStatus, Verdict

_T = TypeVar("_T")
CHECK_KINDS = frozenset({"check"})
# `CampaignState.stop_blockers()`'s own codes; a refused stop adds the search rules' codes
# (attune.control.search_rules.STOP_RULE_CODES). The Stop hook chooses its hints by these codes, never by the prose.
STOP_BLOCKER_CODES = ("not_started", "no_stop", "in_flight", "not_shipped")


@dataclass
class RunState:
    run_id: str
    kind: str  # search | calibration | check | remeasure
    status: str = RunStatus.ADMITTED
    changes: dict[str, Any] = field(default_factory=dict)
    hypothesis: str | None = None
    lever: str | None = None
    expected_gain: float | None = None
    expected_gpu_hours: float = 0.0
    profile: bool = False
    outcome: str | None = None  # ok | oom | hang | crash | infrastructure | cancelled | pruned
    charge_gpu_hours: float = 0.0
    charged_to: str | None = None  # budget | infra
    tokens_per_s_per_gpu: float | None = None
    valid: bool | None = None
    invalid_reasons: list[str] = field(default_factory=list)
    verdict: str | None = None
    admitted_seq: int | None = None
    admitted_ts: str | None = None  # the admission row's time (ISO 8601)
    finished_seq: int | None = None
    recipe_key: str | None = None  # identity of the recipe (identical recipes are refused)
    base_run_id: str | None = None  # the run whose recipe the changes were applied to
    retry_of: str | None = None  # the infrastructure failure this run retries
    code_locations: dict[str, str] = field(default_factory=dict)
    backend_id: str | None = None
    nodes: list[str] = field(default_factory=list)
    started_at: float | None = None  # epoch seconds the cluster admitted the job
    ended_at: float | None = None  # epoch seconds it released its resources
    exit_code: int | None = None
    reason: str | None = None  # why it ended as it did, in words
    recipe_failure: bool = False  # a retried infrastructure failure that failed again on other nodes
    prune_below: float | None = None  # early abort: stop the run if its throughput falls below this
    purpose: str | None = None  # "replicate": a candidate's replicate check run (shipping, borderline check)


@dataclass
class BudgetState:
    total: float | None = None
    charged: float = 0.0
    infra_charged: float = 0.0
    in_flight: float = 0.0
    reserve: float = 0.0
    reserve_used: float = 0.0
    check_in_flight: float = 0.0  # expected cost of check runs admitted and not finished
    infra_reserve: float = 0.0
    final_charged: float = 0.0  # the final re-measurement: outside the search budget, as in the paper

    @property
    def reserve_left(self) -> float:
        return max(0.0, self.reserve - self.reserve_used - self.check_in_flight)

    @property
    def remaining(self) -> float | None:
        if self.total is None:
            return None
        return self.total - self.charged - self.in_flight

    @property
    def search_remaining(self) -> float | None:
        rem = self.remaining
        return None if rem is None else rem - self.reserve_left

    @property
    def check_left(self) -> float | None:
        rem = self.remaining
        return None if rem is None else max(0.0, min(self.reserve_left, rem))

    @property
    def reserve_overrun(self) -> float:
        rem = self.remaining
        return 0.0 if rem is None else max(0.0, self.reserve_left - rem)

    @property
    def spent(self) -> bool:
        rem = self.search_remaining
        return rem is not None and rem <= 0

    def as_dict(self) -> dict[str, Any]:
        def r(x: float | None) -> float | None:
            return None if x is None else round(x, 9)

        return {
            "total_gpu_hours": r(self.total),
            "charged_gpu_hours": r(self.charged),
            "infra_charged_gpu_hours": r(self.infra_charged),
            "in_flight_gpu_hours": r(self.in_flight),
            "reserve_gpu_hours": r(self.reserve),
            "reserve_left_gpu_hours": r(self.reserve_left),
            "infra_reserve_gpu_hours": r(self.infra_reserve),
            "final_charged_gpu_hours": r(self.final_charged),
            "remaining_gpu_hours": r(self.remaining),
            "search_remaining_gpu_hours": r(self.search_remaining),
            "check_left_gpu_hours": r(self.check_left),
            "reserve_overrun_gpu_hours": r(self.reserve_overrun),
            "spent": self.spent,
        }


@dataclass
class CampaignState:
    name: str | None = None
    spec_sha256: str | None = None
    list_sha256: str | None = None
    gpus: int | None = None
    calibration_runs_required: int = 5
    band_floor: float = 0.03
    band_k_sigma: float = 3.0
    replicate_check_runs: int = 0  # the baseline's replicate check runs (noise envelope); 0 in older ledgers
    framework: str | None = None
    started_at: str | None = None
    budget: BudgetState = field(default_factory=BudgetState)
    calibration_values: list[float] = field(default_factory=list)
    calibration_run_ids: list[str] = field(default_factory=list)
    leader_run_id: str | None = None
    leader_tokens_per_s_per_gpu: float | None = None
    runs: dict[str, RunState] = field(default_factory=dict)
    launches_refused: int = 0
    refusals: list[dict[str, Any]] = field(default_factory=list)
    assumptions: list[dict[str, Any]] = field(default_factory=list)
    last_diagnosis: str | None = None
    diagnoses: dict[str, dict[str, Any]] = field(default_factory=dict)  # run id -> its recorded diagnosis
    search_rules: str = "enforced"  # "off": a black-box tuner's campaign (the skill's rules do not bind it)
    stop_refusal: dict[str, Any] | None = None  # the last refused stop: its codes and missing items
    stop: dict[str, Any] | None = None
    checks: list[dict[str, Any]] = field(default_factory=list)
    shipped: dict[str, Any] | None = None
    remeasurements: list[dict[str, Any]] = field(default_factory=list)
    failed: dict[str, Any] | None = None  # the campaign ended failed: no valid evidence (reason, phase)
    budget_set_seq: int | None = None  # the `budget_set` row (recorded once, when calibration completes)
    last_seq: int = -1
    last_hash: str = ledger_mod.GENESIS

    def __post_init__(self) -> None:
        # Runs whose objects this state alone holds, so `apply` may change them in place; the others are
        # shared with a snapshot (`copy`) and copied before their first change. Not a field: equality,
        # `fields()` and `replace` ignore it (a replaced state owns nothing and copies before changing).
        self._owned: set[str] = set()
        self._calibrated: tuple[tuple[Any, ...], Calibration] | None = None  # (its inputs, the calibration)

    # ---- derived -------------------------------------------------------------------
    @property
    def calibration(self) -> Calibration | None:
        if len(self.calibration_values) < max(1, self.calibration_runs_required):
            return None
        ident = (tuple(self.calibration_values), self.band_floor, self.band_k_sigma)
        if self._calibrated is None or self._calibrated[0] != ident:  # statistics' exact sums are slow: once
            self._calibrated = (ident, calibrate(self.calibration_values, self.band_floor, self.band_k_sigma))
        return self._calibrated[1]

    @property
    def baseline_mean(self) -> float | None:
        cal = self.calibration
        return cal.mean if cal else None

    @property
    def in_flight(self) -> list[RunState]:
        return [r for r in self.runs.values() if r.status != RunStatus.FINISHED]

    def leader_gain(self) -> float | None:
        if self.leader_tokens_per_s_per_gpu is None or self.baseline_mean is None:
            return None
        return gain(self.leader_tokens_per_s_per_gpu, self.baseline_mean)

    def calibration_reference(self) -> RunState | None:
        """The calibration run that ran `gate.convergence_steps` steps as the baseline's reference check run
        (`purpose: reference`; the control plane makes the first unprofiled calibration run one) and finished
        well, else None."""
        for r in self.runs.values():
            if (r.kind == RunKind.CALIBRATION and r.purpose == "reference" and r.status == RunStatus.FINISHED
                    and r.outcome == RunOutcome.OK):
                return r
        return None

    def would_promote(self, tokens_per_s_per_gpu: float) -> bool:
        """The promotion rule against the current leader (False before calibration)."""
        cal = self.calibration
        if cal is None or self.leader_tokens_per_s_per_gpu is None:
            return False
        return beats(tokens_per_s_per_gpu, self.leader_tokens_per_s_per_gpu, cal.band)

    def stop_blockers(self) -> list[dict[str, Any]]:
        """What the campaign still lacks before its session may end, each with a stable code:
        not_started, no_stop, in_flight, not_shipped, and while no stop is recorded, the codes and
        missing items of the last refused stop (search rules; see attune.control.search_rules)."""
        if self.name is None:
            return [{"code": "not_started", "items": [],
                     "message": "the campaign has not started (no campaign_started row in the ledger)"}]
        if self.failed is not None:
            return []  # over: it ended failed (the Stop hook says so), nothing more can be done in it
        out: list[dict[str, Any]] = []
        if not self.budget.spent and self.stop is None:
            rem = self.budget.search_remaining
            left = "unknown (not calibrated yet)" if rem is None else f"{rem:.4g} GPU-hours"
            out.append({"code": "no_stop", "items": [], "message": (
                f"the budget is not spent ({left} left for search) and no stop with evidence is recorded")})
            if self.stop_refusal is not None:
                for r in self.stop_refusal.get("refusals") or []:
                    out.append({"code": str(r.get("code")), "items": [str(x) for x in r.get("items") or []],
                                "message": f"the last stop was refused [{r.get('code')}]: {r.get('message')}"})
        if self.in_flight:
            out.append({"code": "in_flight", "items": [r.run_id for r in self.in_flight],
                        "message": f"{len(self.in_flight)} run(s) still in flight: "
                                   + ", ".join(r.run_id for r in self.in_flight)})
        if self.shipped is None:
            out.append({"code": "not_shipped", "items": [], "message": "the shipping step has not run (no shipped row)"})
        return out

    def missing_for_stop(self) -> list[str]:
        """What the campaign still lacks before its session may end, in words (one line per blocker)."""
        return [b["message"] + (": " + "; ".join(b["items"]) if b["items"] and b["code"] != "in_flight" else "")
                for b in self.stop_blockers()]

    # ---- folding -------------------------------------------------------------------
    def apply(self, row: ledger_mod.Row) -> None:
        if row.seq != self.last_seq + 1:
            raise ledger_mod.LedgerError(f"row seq {row.seq} applied out of order after {self.last_seq}")
        handler = getattr(self, f"_on_{row.type}", None)
        if handler is None:
            raise ledger_mod.LedgerError(f"row {row.seq}: unknown type {row.type!r}")
        handler(row.data, row)
        self.last_seq = row.seq
        self.last_hash = row.hash

    def _on_campaign_started(self, d: dict[str, Any], row: ledger_mod.Row) -> None:
        self.name = d["name"]
        self.spec_sha256 = d["spec_sha256"]
        self.list_sha256 = d.get("list_sha256")
        self.gpus = int(d["gpus"])
        self.calibration_runs_required = int(d.get("calibration_runs", 5))
        self.band_floor = float(d.get("band_floor", 0.03))
        self.band_k_sigma = float(d.get("band_k_sigma", 3.0))
        self.replicate_check_runs = int(d.get("replicate_check_runs", 0))
        self.framework = d.get("framework")
        self.started_at = row.ts
        if d.get("budget_gpu_hours") is not None:
            self.budget.total = float(d["budget_gpu_hours"])
        if d.get("reserve_gpu_hours") is not None:
            self.budget.reserve = float(d["reserve_gpu_hours"])
        self.budget.infra_reserve = float(d.get("infra_reserve_gpu_hours", 0.0))
        self.search_rules = "off" if d.get("search_rules") == "off" else "enforced"

    def _on_budget_set(self, d: dict[str, Any], row: ledger_mod.Row) -> None:
        if self.budget_set_seq is None:
            self.budget_set_seq = row.seq
        self.budget.total = float(d["gpu_hours"])
        if d.get("reserve_gpu_hours") is not None:
            self.budget.reserve = float(d["reserve_gpu_hours"])

    def _on_launch_admitted(self, d: dict[str, Any], row: ledger_mod.Row) -> None:
        run = RunState(
            run_id=d["run_id"],
            kind=d["kind"],
            changes=dict(d.get("changes") or {}),
            hypothesis=d.get("hypothesis"),
            lever=d.get("lever"),
            expected_gain=d.get("expected_gain"),
            expected_gpu_hours=float(d["expected_gpu_hours"]),
            profile=bool(d.get("profile", False)),
            admitted_seq=row.seq,
            admitted_ts=row.ts,
            recipe_key=d.get("recipe_key"),
            base_run_id=d.get("base_run_id"),
            retry_of=d.get("retry_of"),
            code_locations=dict(d.get("code_locations") or {}),
            prune_below=d.get("prune_below"),
            purpose=d.get("purpose"),
        )
        if run.run_id in self.runs:
            raise ledger_mod.LedgerError(f"row {row.seq}: run {run.run_id!r} admitted twice")
        self.runs[run.run_id] = run
        self._owned.add(run.run_id)
        self.budget.in_flight += run.expected_gpu_hours
        if run.kind in CHECK_KINDS:
            self.budget.check_in_flight += run.expected_gpu_hours

    def _on_launch_refused(self, d: dict[str, Any], row: ledger_mod.Row) -> None:
        self.launches_refused += 1
        self.refusals.append(
            {"seq": row.seq, "reason": d["reason"], "code": d.get("code"), "changes": d.get("changes"),
             "kind": d.get("kind"), "of": d.get("of"), "purpose": d.get("purpose")}
        )

    def _on_run_submitted(self, d: dict[str, Any], row: ledger_mod.Row) -> None:
        run = self._run(d["run_id"], row)
        run.backend_id = str(d["backend_id"])

    def _on_run_started(self, d: dict[str, Any], row: ledger_mod.Row) -> None:
        run = self._run(d["run_id"], row)
        if run.status == RunStatus.ADMITTED:
            run.status = RunStatus.RUNNING
        if d.get("started_at") is not None:
            run.started_at = float(d["started_at"])
        if d.get("nodes"):
            run.nodes = list(d["nodes"])

    def _on_run_finished(self, d: dict[str, Any], row: ledger_mod.Row) -> None:
        run = self._run(d["run_id"], row)
        if run.status == RunStatus.FINISHED:
            raise ledger_mod.LedgerError(f"row {row.seq}: run {run.run_id!r} finished twice")
        run.status = RunStatus.FINISHED
        run.outcome = d["outcome"]
        run.finished_seq = row.seq
        charge = float(d["charge_gpu_hours"])
        run.charge_gpu_hours = charge
        run.charged_to = d.get("charged_to", "budget")
        run.exit_code = d.get("exit_code")
        run.reason = d.get("reason")
        run.recipe_failure = bool(d.get("recipe_failure", False))
        if d.get("started_at") is not None:
            run.started_at = float(d["started_at"])
        if d.get("ended_at") is not None:
            run.ended_at = float(d["ended_at"])
        if d.get("nodes"):
            run.nodes = list(d["nodes"])
        self.budget.in_flight = max(0.0, self.budget.in_flight - run.expected_gpu_hours)
        if run.kind in CHECK_KINDS:
            self.budget.check_in_flight = max(0.0, self.budget.check_in_flight - run.expected_gpu_hours)
        if run.charged_to == "infra":
            self.budget.infra_charged += charge
        elif run.charged_to == "final":
            self.budget.final_charged += charge
        else:
            self.budget.charged += charge
            if run.kind in CHECK_KINDS:
                self.budget.reserve_used += charge

    def _on_measurement(self, d: dict[str, Any], row: ledger_mod.Row) -> None:
        run = self._run(d["run_id"], row)
        run.tokens_per_s_per_gpu = d["tokens_per_s_per_gpu"]
        run.valid = bool(d["valid"])
        run.invalid_reasons = list(d.get("invalid_reasons") or [])
        run.verdict = d.get("verdict", run.verdict)

    def _on_calibration_run(self, d: dict[str, Any], row: ledger_mod.Row) -> None:
        self.calibration_values.append(float(d["tokens_per_s_per_gpu"]))
        self.calibration_run_ids.append(d["run_id"])
        if self.leader_run_id in (None, "baseline") and self.calibration is not None:
            self.leader_run_id = "baseline"
            self.leader_tokens_per_s_per_gpu = self.calibration.mean

    def _on_leader_changed(self, d: dict[str, Any], row: ledger_mod.Row) -> None:
        self.leader_run_id = d["run_id"]
        self.leader_tokens_per_s_per_gpu = float(d["tokens_per_s_per_gpu"])
        if d["run_id"] in self.runs:
            self._run(d["run_id"], row).verdict = Verdict.LEADER

    def _on_assumption_recorded(self, d: dict[str, Any], row: ledger_mod.Row) -> None:
        self.assumptions.append({"seq": row.seq, "ts": row.ts, **d})

    def _on_diagnosis_recorded(self, d: dict[str, Any], row: ledger_mod.Row) -> None:
        self.last_diagnosis = d["text"]
        if d.get("run_id"):
            self.diagnoses[str(d["run_id"])] = {"seq": row.seq, "text": d["text"], "bottleneck": d.get("bottleneck")}

    def _on_stop_refused(self, d: dict[str, Any], row: ledger_mod.Row) -> None:
        self.stop_refusal = {"seq": row.seq, "ts": row.ts, "refusals": list(d.get("refusals") or []),
                             "codes": list(d.get("codes") or [])}

    def _on_stop_recorded(self, d: dict[str, Any], row: ledger_mod.Row) -> None:
        self.stop = {"seq": row.seq, "ts": row.ts, **d}
        self.last_diagnosis = d["diagnosis"]

    def _on_check_run(self, d: dict[str, Any], row: ledger_mod.Row) -> None:
        self.checks.append({"seq": row.seq, **d})

    def _on_shipped(self, d: dict[str, Any], row: ledger_mod.Row) -> None:
        self.shipped = {"seq": row.seq, "ts": row.ts, **d}

    def _on_remeasurement(self, d: dict[str, Any], row: ledger_mod.Row) -> None:
        self.remeasurements.append({"seq": row.seq, **d})

    def _on_campaign_failed(self, d: dict[str, Any], row: ledger_mod.Row) -> None:
        if self.failed is None:
            self.failed = {"seq": row.seq, "ts": row.ts, **d}

    def _run(self, run_id: str, row: ledger_mod.Row) -> RunState:
        """The run a row changes, copied first: a snapshot taken before (`copy`) keeps its own."""
        run = self.runs.get(run_id)
        if run is None:
            raise ledger_mod.LedgerError(f"row {row.seq}: run {run_id!r} was never admitted")
        if run_id not in self._owned:
            run = self.runs[run_id] = _shallow(run)
            self._owned.add(run_id)
        return run

    def copy(self) -> CampaignState:
        """A snapshot that later `apply` calls leave alone (containers copied; runs are copied on
        write by `apply`, so they are shared here). Field by field, without `dataclasses.replace`:
        a snapshot is taken on every control-plane decision."""
        new = _shallow(self)
        new.budget = _shallow(self.budget)
        new.calibration_values = list(self.calibration_values)
        new.calibration_run_ids = list(self.calibration_run_ids)
        new.runs = dict(self.runs)
        new.refusals = list(self.refusals)
        new.assumptions = list(self.assumptions)
        new.diagnoses = dict(self.diagnoses)
        new.checks = list(self.checks)
        new.remeasurements = list(self.remeasurements)
        new._owned = set()
        self._owned = set()  # every run is shared with the snapshot from now on
        return new

    # ---- output --------------------------------------------------------------------
    def as_dict(self) -> dict[str, Any]:
        cal = self.calibration
        return {
            "name": self.name,
            "spec_sha256": self.spec_sha256,
            "list_sha256": self.list_sha256,
            "gpus": self.gpus,
            "started_at": self.started_at,
            "rows": self.last_seq + 1,
            "last_hash": self.last_hash,
            "budget": self.budget.as_dict(),
            "calibration": {
                "required_runs": self.calibration_runs_required,
                "runs": len(self.calibration_values),
                "values": list(self.calibration_values),
                "mean": cal.mean if cal else None,
                "rel_sigma": cal.rel_sigma if cal else None,
                "band": cal.band if cal else None,
            },
            "leader": {
                "run_id": self.leader_run_id,
                "tokens_per_s_per_gpu": self.leader_tokens_per_s_per_gpu,
                "gain": self.leader_gain(),
                "gain_evidence": gain_evidence(self, self.leader_run_id),
            },
            "noise": noise_note(cal.band if cal else None),
            "runs": [run_dict(r) for r in self.runs.values()],
            "in_flight": [r.run_id for r in self.in_flight],
            "launches": sum(1 for r in self.runs.values() if r.kind == "search"),
            "failed_launches": sum(
                1 for r in self.runs.values() if r.kind == RunKind.SEARCH and r.outcome in RECIPE_FAILURES
            ),
            "launches_refused": self.launches_refused,
            "assumptions": list(self.assumptions),
            "last_diagnosis": self.last_diagnosis,
            "diagnoses": dict(self.diagnoses),
            "search_rules": self.search_rules,
            "stop_refusal": self.stop_refusal,
            "stop_blockers": self.stop_blockers(),
            "stop": self.stop,
            "checks": list(self.checks),
            "shipped": self.shipped,
            "remeasurements": list(self.remeasurements),
            "failed": self.failed,
            "missing_for_stop": self.missing_for_stop(),
        }


def _shallow(obj: _T) -> _T:
    """A shallow copy of a dataclass instance (as `dataclasses.replace` with no changes, without its
    per-field introspection)."""
    new = object.__new__(type(obj))
    new.__dict__.update(obj.__dict__)  # type: ignore[attr-defined]
    return new


RUN_FIELDS = tuple(f.name for f in fields(RunState))


_SCALARS = frozenset({str, int, float, bool, type(None)})


def _plain(v: Any) -> Any:
    """A deep copy of a JSON-like value, as `dataclasses.asdict` copies a field (dicts, lists, tuples;
    anything else through `copy.deepcopy`)."""
    t = type(v)
    if t in _SCALARS:
        return v
    if t is dict:
        return {k: x if type(x) in _SCALARS else _plain(x) for k, x in v.items()}
    if t is list:
        return [x if type(x) in _SCALARS else _plain(x) for x in v]
    if t is tuple:
        return tuple(x if type(x) in _SCALARS else _plain(x) for x in v)
    return copy.deepcopy(v)


def run_dict(run: RunState) -> dict[str, Any]:
    """`dataclasses.asdict(run)` for a RunState (whose values are JSON-like), several times faster."""
    d = run.__dict__
    return {name: v if type(v := d[name]) in _SCALARS else _plain(v) for name in RUN_FIELDS}


def gain_evidence(state: CampaignState, run_id: str | None) -> str | None:
    """How well a search run's gain is established: `unconfirmed` while it rests on the one measurement
    that cleared the band, `confirmed` once the final re-measurement of the recipe beats the baseline
    (re-measured too, where it was) by more than the band, `not_confirmed` when it does not. None: no
    gain to judge (the baseline, no calibration)."""
    cal = state.calibration
    if cal is None or run_id is None or run_id == "baseline" or run_id not in state.runs:
        return None

    def repeats(of: str) -> list[float]:
        rows = [r for r in state.remeasurements if r.get("recipe_of") == of and r.get("tokens_per_s_per_gpu")]
        return [float(r["tokens_per_s_per_gpu"]) for r in rows if r.get("valid", True)]

    mine = repeats(run_id)
    if not mine:
        return "unconfirmed"
    base = repeats("baseline") or [cal.mean]
    mean = sum(mine) / len(mine)
    return "confirmed" if beats(mean, sum(base) / len(base), cal.band) else "not_confirmed"


def fold(rows: Iterable[ledger_mod.Row]) -> CampaignState:
    state = CampaignState()
    for row in rows:
        state.apply(row)
    return state


def load(campaign_dir: Path | str, *, chain_only: bool = False) -> tuple[CampaignState, ledger_mod.ReadResult]:
    """Rebuild a campaign's state from its ledger (raises LedgerError on a broken chain).
    `chain_only`: a published copy checked without its key (`ledger.read`)."""
    result = ledger_mod.read(campaign_dir, chain_only=chain_only)
    return fold(result.rows), result


_CURRENT: dict[str, Follower] = {}  # real path of a campaign directory -> its Follower (`current`)
_CURRENT_LOCK = threading.Lock()
_CURRENT_MAX = 4  # each keeps a copy of its ledger (PREFIX_COPY_MAX): a few campaigns per process


def current(campaign_dir: Path | str) -> CampaignState:
    """The state `load` folds (raising the LedgerError it raises), through one Follower per campaign
    directory kept for the process: a call verifies and folds only the rows appended since the last
    one, after checking that the part read before is unchanged (see `Follower`). The state returned
    is the caller's own (`Follower.snapshot`)."""
    real = os.path.realpath(campaign_dir)
    with _CURRENT_LOCK:
        follower = _CURRENT.get(real)
        if follower is None:
            if len(_CURRENT) >= _CURRENT_MAX:
                _CURRENT.pop(next(iter(_CURRENT)))
            follower = _CURRENT[real] = Follower(real)
    try:
        return follower.snapshot()
    except BaseException:
        with _CURRENT_LOCK:
            if _CURRENT.get(real) is follower:
                del _CURRENT[real]
        raise


PREFIX_COPY_MAX = 64 * 2**20  # a Follower keeps a copy of a ledger up to this size (else its SHA-256)
RACY_NS = 2_000_000_000  # a file changed this recently may change again with the same mtime (coarse clocks)


class Follower:
    """Keeps a CampaignState current by reading only rows appended since the last refresh.

    Each refresh verifies the new rows as a full read does (hash chain from the last row read, MACs,
    the anchor, the row data), after checking that what was read before is still there: the same
    file (device and inode), no shorter, its last row read byte for byte the same, and (with
    `verify_prefix`, the default) every byte read before unchanged (compared with a copy kept in
    memory, or for a ledger over `PREFIX_COPY_MAX` bytes with their SHA-256): an edit anywhere in the
    ledger is noticed at the next refresh. Any of those checks failing makes it re-read the
    whole ledger from the start, which raises the classified LedgerError a full read raises (or, for
    a harmless change a full read accepts, folds the state again). A refresh that finds the files
    unchanged since the last one (the ledger, its anchor and its key: same size, inode, mtime and
    ctime) reads nothing at all, provided the ledger had last changed more than `RACY_NS` before
    that (file times tick coarsely: a change within the same tick would keep the same times). Within
    that window a refresh that finds the ledger no longer than what was read, every byte read before the
    same, and the anchor and key files byte for byte the ones the last verification read, reads and
    folds nothing either: a full read of the same bytes would give the same state (a campaign's control
    plane polls many times a second while its ledger keeps changing).

    Thread-safe: one lock around each refresh."""

    def __init__(self, campaign_dir: Path | str, *, verify_prefix: bool = True) -> None:
        self.dir = Path(campaign_dir)
        self.path = self.dir / ledger_mod.LEDGER_NAME
        self.verify_prefix = verify_prefix
        self.state = CampaignState()
        self.offset = 0
        self.torn_tail: str | None = None
        self.full_reads = 0  # how often it had to read the ledger from the start (after the first)
        self._lock = threading.Lock()
        self._stat: tuple[Any, ...] | None = None  # the files' stat at the last refresh (`_files`)
        key_file, anchor_file = ledger_mod.auth_paths(self.dir)
        self._auth_files = (anchor_file, key_file)
        self._auth_bytes: tuple[bytes | None, ...] | None = None  # their content the last verification read
        self._ident: tuple[int, int] | None = None
        self._last_line: tuple[int, bytes] | None = None  # (offset, bytes) of the last complete row read
        self._digest = hashlib.sha256()  # of bytes [0, offset), once they are no longer kept
        self._prefix: bytearray | None = bytearray()  # bytes [0, offset) while at most PREFIX_COPY_MAX

    def _reset(self) -> None:
        if self.offset or self.state.last_seq >= 0:
            self.full_reads += 1
        self.state = CampaignState()
        self.offset = 0
        self.torn_tail = None
        self._ident = None
        self._last_line = None
        self._digest = hashlib.sha256()
        self._prefix = bytearray()
        self._auth_bytes = None

    def _prefix_intact(self, st: os.stat_result) -> bool:
        """Whether the bytes read so far are still what they were (cheap checks first)."""
        if self.offset == 0:
            return True
        if self._ident != (st.st_dev, st.st_ino) or st.st_size < self.offset:
            return False
        try:
            with open(self.path, "rb") as fh:
                if self._last_line is not None:
                    at, line = self._last_line
                    fh.seek(at)
                    if fh.read(len(line)) != line:
                        return False
                if self.verify_prefix:
                    fh.seek(0)
                    if not self._same_prefix(fh):
                        return False
        except OSError:
            return False
        return True

    def _same_prefix(self, fh: Any) -> bool:
        """Whether the open file's first `offset` bytes are the ones read before."""
        if self._prefix is not None:
            return fh.read(self.offset) == self._prefix
        h = hashlib.sha256()
        left = self.offset
        while left > 0:
            chunk = fh.read(min(left, 1 << 20))
            if not chunk:
                return False
            h.update(chunk)
            left -= len(chunk)
        return h.digest() == self._digest.digest()

    def refresh(self) -> CampaignState:
        """The live state, current with the ledger (raises LedgerError as a full read does)."""
        with self._lock:
            return self._refresh()

    def _refresh(self) -> CampaignState:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:  # no ledger: a campaign not started (a full read says the same)
            if self.offset or self.state.last_seq >= 0:
                self._reset()
            self._stat = None
            return self.state
        if self._stat is not None:
            key = self._files(st)
            if key == self._stat:
                return self.state
        if self._unchanged(st):
            return self.state
        key = self._files(st)
        for _ in range(3):
            if not self._prefix_intact(st):
                self._reset()
            auth = self._auth_content()
            if self._read_new(st):
                settled = max(st.st_mtime_ns, st.st_ctime_ns) < time.time_ns() - RACY_NS
                self._stat = key if settled and self.offset == st.st_size and self.torn_tail is None else None
                self._auth_bytes = auth if auth is not None and auth == self._auth_content() else None
                return self.state
            self._reset()  # the file changed between two reads of it: read it all again
            st = os.stat(self.path)
            key = self._files(st)
        raise ledger_mod.LedgerError(f"{self.path} keeps changing under its reader", "corrupt")

    def _auth_content(self) -> tuple[bytes | None, ...] | None:
        """The anchor's and the key's bytes (None for one absent; None for all when one is unreadable)."""
        out: list[bytes | None] = []
        for p in self._auth_files:
            try:
                fd = os.open(p, os.O_RDONLY)
            except FileNotFoundError:
                out.append(None)
                continue
            except OSError:
                return None
            try:
                out.append(os.read(fd, 8192))
            except OSError:
                return None
            finally:
                os.close(fd)
        return tuple(out)

    def _unchanged(self, st: os.stat_result) -> bool:
        """Whether a full read now would read exactly the bytes of the last one (the ledger's, the
        anchor's and the key's), compared by content: then there is nothing to read or fold."""
        if not (self.verify_prefix and self._auth_bytes is not None and self.offset > 0 and self.torn_tail is None
                and st.st_size == self.offset and self._ident == (st.st_dev, st.st_ino)):
            return False
        if self._auth_content() != self._auth_bytes:
            return False
        if self._prefix is None:  # a ledger over PREFIX_COPY_MAX: its digest
            return self._prefix_intact(st)
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return False
        try:
            fs = os.fstat(fd)
            # One byte more than was read: a row appended since the stat makes it differ (and is read).
            return (fs.st_dev, fs.st_ino) == self._ident and os.pread(fd, self.offset + 1, 0) == self._prefix
        except OSError:
            return False
        finally:
            os.close(fd)

    def _files(self, st: os.stat_result) -> tuple[Any, ...]:
        """What a refresh compares to know nothing changed: the ledger's, the anchor's and the key's
        stat (a changed anchor or key is read and checked, as a full read would)."""
        out: list[Any] = [(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)]
        for p in self._auth_files:
            try:
                a = os.stat(p)
                out.append((a.st_ino, a.st_size, a.st_mtime_ns, a.st_ctime_ns))
            except OSError:
                out.append(None)
        return tuple(out)

    def _read_new(self, st: os.stat_result) -> bool:
        """Verify and fold the rows after `offset`; False if the bytes changed between two reads."""
        try:
            result = ledger_mod.read(self.dir, self.offset, self.state.last_seq + 1, self.state.last_hash)
        except ledger_mod.LedgerError:
            if self.offset == 0:
                raise
            self._reset()  # the classified error of a full read, whatever the incremental one saw
            result = ledger_mod.read(self.dir)
        if result.rows:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                new = fh.read(result.end_offset - self.offset)
            if len(new) != result.end_offset - self.offset:
                return False
            if self._prefix is None:
                self._digest.update(new)
            else:
                self._prefix += new
                if len(self._prefix) > PREFIX_COPY_MAX:  # from now on its digest
                    self._digest, self._prefix = hashlib.sha256(self._prefix), None
            cut = new.rfind(b"\n", 0, len(new) - 1) + 1
            self._last_line = (self.offset + cut, new[cut:])
            for row in result.rows:
                self.state.apply(row)
        self.offset = result.end_offset
        self.torn_tail = result.torn_tail
        self._ident = (st.st_dev, st.st_ino)
        return True

    def snapshot(self) -> CampaignState:
        """A copy of the current state that later refreshes leave alone, for callers that compare a
        state before and after an action (its containers are its own; its RunState objects are shared
        and copied on write by `apply`: read them, do not change them)."""
        with self._lock:
            return self._refresh().copy()
