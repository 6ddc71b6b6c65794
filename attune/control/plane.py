"""The control plane's launch path: admission, charging, scoring and promotion, every step a ledger row.

One `Control` per campaign directory. A run's lifecycle (`attune.control.lifecycle.Lifecycle`) drives it:

    admit(request)          every run kind through one rule pipeline (`ADMISSION_RULES`, each rule with the
                            kinds it applies to): the agent's search and calibration runs (`LaunchRequest`)
                            and the shipping step's check and re-measurement runs (`FinalRunRequest`) ->
                            `launch_admitted`, or `launch_refused` with the reason; writes runs/<id>/job.json;
                            answers a `LaunchAnswer`, the one shape the broker submits and serves
    record_submitted(...)   `run_submitted` (the backend's id for the job)
    record_started(...)     `run_started` (the cluster admitted the job: charging starts here)
    finish(run_id, facts)   (under the campaign lock) the metrics reader scores the log, the run is
                            classified and charged GPUs x (release - admission) -> `run_finished`,
                            `measurement`, then `calibration_run` (+ `budget_set` once calibration
                            is complete) or `leader_changed` when the promotion rule says so; a
                            check or re-measurement run's own row (`check_run`, `remeasurement`) is
                            the shipping step's, recorded next by `attune.control.shipper.advance`

Admission is atomic across threads and processes: it holds an exclusive flock on
`<campaign>/.control.lock` around "fold the ledger -> check -> append", so concurrent launch
requests can never together overrun the budget or the concurrency limit.

Two seams stand for other parts of the control plane: `check_candidate` (layer 1 of the gate) and
`score_run` (the metrics reader).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SkipValidation

import attune
from attune.control.campaign import campaign_lock
from attune.control.rungen import Changes, GeneratedRecipe, RunGenerator, RunGenError, parse_changes
from attune.control.spec import CampaignSpec, load_spec, spec_sha256
from attune.core import gatelists
from attune.core import ledger as ledger_mod
from attune.core.campaign_paths import CAMPAIGN_FILE, RUN_JOB, RUN_LOG, RUNS_DIR
from attune.core.errors import ControlError
from attune.core.job import JobSpec
from attune.core.measure import gpu_hours
from attune.core.state import BudgetState, CampaignState, Follower, RunState
from attune.core.vocab import (
    FINAL_KINDS,
    PROFILE_LOST_OUTCOMES,
    STOPPED_OUTCOMES,
    RunKind,
    RunOutcome,
    RunStatus,
    Verdict,
)

SOURCE_ROOT = Path(attune.__file__).resolve().parents[1]




CHECK_SLACK_GPU_HOURS = 1e-8  # the ledger rounds GPU-hours to 9 decimals: a reserve sized for N checks pays N


class WorkloadEnvError(RunGenError):
    """A launch refused because the workload's environment cannot run it (code `environment`).

    `terminal`: nothing the agent can do makes it work (a build that failed, or the spec's own
    interpreter unusable); a calibration launch refused so ends the campaign failed."""

    def __init__(self, message: str, terminal: bool) -> None:
        super().__init__("environment", message)
        self.terminal = terminal

def check_budget_refusal(b: BudgetState, expected: float) -> str | None:
    """Why a correctness check run expected to cost `expected` GPU-h cannot be admitted, or None.

    The one rule: check runs (the baseline's reference and replicate check runs, the candidates'
    checks) are paid from the check reserve alone, never from what the search left unspent, and the
    budget is never exceeded: a check fits `min(reserve left, budget remaining)` (`check_left`).
    Search launches are admitted only against `remaining - reserve left`, so they cannot eat the
    reserve; if calibration and search runs were charged more than expected and overran into it
    anyway, the refusal says by how much."""
    left = b.check_left
    if left is not None and expected <= left + CHECK_SLACK_GPU_HOURS:
        return None
    if b.total is None:
        return "the campaign's budget is not set yet"
    msg = (f"a check run is expected to cost {expected:.6g} GPU-h and the check reserve has {left:.6g} GPU-h left "
           f"(reserve {b.reserve:.6g} - check runs charged {b.reserve_used:.6g} - check runs in flight "
           f"{b.check_in_flight:.6g})")
    if b.reserve_overrun > 1e-12:
        others = b.charged - b.reserve_used + b.in_flight - b.check_in_flight
        msg += (f"; calibration and search runs overran their share of the budget (total {b.total:.6g} - reserve "
                f"{b.reserve:.6g} = {b.total - b.reserve:.6g} GPU-h) by {b.reserve_overrun:.6g} GPU-h "
                f"({others:.6g} GPU-h charged or in flight), into the reserve")
    return msg

# ----------------------------------------------------------------------------------- requests


class LaunchRequest(BaseModel):
    """What the agent (or the launcher) asks for."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["search", "calibration"] = Field("search", description="search candidate or baseline calibration")
    changes: dict[str, Any] = Field(
        default_factory=dict, description='{"args": {"--flag": value|null}, "env": {"NAME": "value"|null}}'
    )
    base: str = Field("leader", description="apply the changes to: leader, baseline, or a run id")
    hypothesis: str | None = Field(None, max_length=4000)
    lever: str | None = Field(None, max_length=200)
    expected_gain: float | None = Field(None, description="expected relative gain, e.g. 0.05 for 5%")
    code_locations: dict[str, str] = Field(
        default_factory=dict, description="flag -> where the running image implements it (path:line)"
    )
    profile: bool = False
    prune_below: float | None = Field(None, gt=0, description=(
        "early abort (black-box tuners): stop the run once EARLY_ABORT_STEPS measured steps run below this "
        "many tokens/s/GPU"))


class FinalRunRequest(BaseModel):
    """A run the control plane's shipping step asks for (the agent cannot): a correctness `check` run or a
    final `remeasure` run of `of`, "baseline" or the id of a finished search run."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["check", "remeasure"]
    of: str = Field(min_length=1, max_length=200)
    replicate: bool = Field(False, description=(
        "a candidate's one replicate check run, asked for when its check was borderline (`rule_one_replicate`)"))

    @property
    def profile(self) -> bool:
        return False


def _refused_fields(request: LaunchRequest | FinalRunRequest, decision: LaunchAnswer) -> dict[str, Any]:
    """The `launch_refused` row's fields that come from the request."""
    if isinstance(request, FinalRunRequest):
        return {"changes": None, "lever": None, "hypothesis": None, "profile": False, "of": request.of,
                **({"purpose": "replicate"} if request.replicate else {})}
    return {"items": list(decision.items), "changes": request.changes, "lever": request.lever,
            "hypothesis": request.hypothesis, "profile": request.profile}


RunRequest = LaunchRequest | FinalRunRequest


class LaunchAnswer(BaseModel):
    """The one answer to a launch, from admission to the wire (broker/wire.py serves it as it is): the
    control plane's decision, then what the broker's submission of an admitted run did."""

    model_config = ConfigDict(extra="allow")  # a newer control plane's field passes through the MCP server

    admitted: bool
    code: str | None = None  # refusal code (stable word), None when admitted
    reason: str | None = None  # what to change, in words
    run_id: str | None = None
    kind: str | None = None
    expected_gpu_hours: float | None = None
    changes: dict[str, Any] | None = None
    retry_of: str | None = None
    exclude_nodes: list[str] = Field(default_factory=list)
    recipe_key: str | None = None
    gate: dict[str, Any] | None = None
    budget: dict[str, Any] | None = Field(None, description="the campaign's budget (broker.wire.Budget)")
    items: list[str] = Field(default_factory=list)  # what a refusal lacks (the search rules' missing items)
    # "reference": a calibration run that also runs `gate.convergence_steps`, the baseline's reference check run
    purpose: str | None = None
    # the submission of an admitted run (set by the broker; absent from a refusal)
    submitted: bool | None = None
    backend_id: str | None = None
    submit_error: str | None = None
    finished: dict[str, Any] | None = None  # the run's end, when its submission failed
    job: SkipValidation[JobSpec | None] = Field(None, exclude=True, repr=False)  # what the broker submits

    def model_post_init(self, _context: Any) -> None:
        self.model_fields_set.update(_DECISION_FIELDS)  # the decision's fields are always on the wire


_DECISION_FIELDS = ("admitted", "code", "reason", "run_id", "kind", "expected_gpu_hours", "changes", "retry_of",
                    "exclude_nodes", "recipe_key", "gate", "budget", "items")


@dataclass
class JobFacts:
    """What the backend (and the broker's watchdog) know about a job that ended."""

    state: str  # broker.backends.base.JobState value
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    nodes: list[str] = field(default_factory=list)
    killed_for: str | None = None  # "hang" or "cancelled" when the broker stopped it
    reason: str | None = None
    seconds_since_progress: float | None = None


@dataclass
class Score:
    """The metrics reader's verdict on one log."""

    tokens_per_s_per_gpu: float | None
    valid: bool
    invalid_reasons: list[str]
    failure_class: str  # ok | oom | hang | crash | infrastructure
    failure_reason: str
    last_iteration: int | None = None


@dataclass
class GateVerdict:
    passed: bool
    summary: str
    refusals: list[dict[str, Any]]
    list_sha256: str | None


# ----------------------------------------------------------------------------------- seams

_LISTS: dict[tuple[str, str], Any] = {}  # (path, sha256) -> the parsed list: a list is parsed once per content


def gate_list_source(spec: CampaignSpec, campaign_dir: Path | str) -> str | Path:
    """What `gate.lists` names: a built-in list name (`llama31-405b`, a file in gate/lists/) when it is a
    bare name, else a list file (relative to the campaign directory); unset: the model's built-in list.
    The broker and `attune validate` both resolve it here."""
    kind, where = gatelists.source(spec.gate.lists, spec.model, str(campaign_dir))  # the rule the hooks share
    return where if kind == "builtin" else Path(where)


def load_gate_list(spec: CampaignSpec, campaign_dir: Path, list_sha256: str | None) -> Any:
    """The campaign's correctness list, parsed once per content; raises gate.lists.ListError or OSError."""
    from gate.lists import list_path, load_list

    source = gate_list_source(spec, campaign_dir)
    pinned = list_sha256 or spec.gate.list_sha256
    path = list_path(source)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    loaded = _LISTS.get((str(path), digest))
    if loaded is None or (pinned is not None and pinned != digest):
        loaded = load_list(path, expected_sha256=pinned)  # validates (and refuses a changed list)
        _LISTS[(str(path), loaded.sha256)] = loaded
    return campaign_list(spec, loaded)


def campaign_list(spec: CampaignSpec, loaded: Any) -> Any:
    """The list as it applies to this campaign: world size and batch geometry are the campaign's
    (`gate.lists.for_campaign`), so a list written for another GPU count does not refuse every candidate."""
    from gate.lists import for_campaign

    w = spec.workload
    return for_campaign(loaded, {"world_size": spec.cluster.gpus, "seq_length": w.seq_length,
                                 "global_batch_size": w.global_batch})


def check_candidate(
    spec: CampaignSpec,
    campaign_dir: Path,
    list_sha256: str | None,
    baseline_args: Mapping[str, Any],
    candidate_args: Mapping[str, Any],
    baseline_env: Mapping[str, str],
    candidate_env: Mapping[str, str],
) -> GateVerdict:
    """Layer 1 of the correctness gate on a candidate recipe, before anything is submitted."""
    from gate.config_check import check_recipe
    from gate.lists import ListError

    try:
        loaded = load_gate_list(spec, campaign_dir, list_sha256)
    except (ListError, OSError) as exc:
        return GateVerdict(False, f"the correctness list cannot be used: {exc}", [], None)
    result = check_recipe(loaded, baseline_args, candidate_args, baseline_env, candidate_env)
    return GateVerdict(
        result.passed, result.summary(), [r.model_dump() for r in result.refusals], result.list_sha256
    )


def score_run(
    spec: CampaignSpec, log_path: Path, *, exit_code: int | None, seconds_since_progress: float | None,
    own_text: tuple[str, ...] = (),
) -> Score:
    """The metrics reader on one run's log: windowed throughput, validity and failure class.
    `own_text`: what the job controls (its argument and environment values, `job_own_text`)."""
    from attune.readers.metrics import MetricsInputError, read_metrics

    if not log_path.exists():
        return Score(None, False, ["the job wrote no log"], "infrastructure", "no log file: the job never started")
    try:
        m = read_metrics(log_path, **spec.metrics_options(), exit_status=exit_code,
                         seconds_since_progress=seconds_since_progress, own_text=own_text)
    except (MetricsInputError, OSError) as exc:
        failure = "crash" if exit_code not in (None, 0) else "ok"
        return Score(None, False, [f"the log cannot be scored: {exc}"], failure, str(exc))
    tps = m.tokens_per_s_per_gpu
    if tps is not None and not math.isfinite(tps):
        tps = None
    reason = m.verdict.reason
    if m.verdict.evidence:
        reason += ": " + m.verdict.evidence[0].text.strip()[:300]
    return Score(tps, bool(m.valid and tps is not None), list(m.invalid_reasons), m.failure_class,
                 reason, m.last_iteration)


def job_own_text(job_doc: Mapping[str, Any]) -> tuple[str, ...]:
    """The strings a job controls: its command line and its environment's values. A failure signature
    inside one of them, echoed into the log, is no evidence of how the run ended."""
    argv = [str(a) for a in job_doc.get("argv") or ()]
    env = [str(v) for v in (job_doc.get("env") or {}).values()]
    args = [str(v) for v in (job_doc.get("args") or {}).values() if v is not None]
    return tuple(dict.fromkeys(argv + env + args))


# The monitor's charge bound (`charge_bound`): a run is stopped, outcome `overrun`, once what it has used
# reaches the lower of two arms. The expected-cost arm: `budget.overrun_factor` (default OVERRUN_FACTOR) x its
# expected cost, but never less than its expected cost plus `budget.overrun_grace_s` of the campaign's GPUs (a
# job's start-up jitter, such as a scheduler's dispatch delay or a loaded node, does not scale with the
# recipe: on runs of seconds, twice the expected cost is within that jitter). The budget arm: its expected
# cost plus an equal share (among the runs in flight) of what the budget has left for its kind. With every
# run bounded so, the runs in flight together never take the campaign past its budget; the documented slack
# is what runs between two monitor steps (one logged step on the sim backend, one poll interval elsewhere),
# per run in flight.
OVERRUN_FACTOR = 2.0


def charge_bound(state: CampaignState, run: RunState, factor: float = OVERRUN_FACTOR,
                 grace_gpu_hours: float = 0.0) -> tuple[float, str] | None:
    """The most `run` may be charged before the monitor stops it, and why; None: no bound (no expected
    cost was known at admission). `factor`: the campaign's `budget.overrun_factor`; `grace_gpu_hours`: its
    `budget.overrun_grace_s` in GPU-hours of the campaign's GPUs, the least the expected-cost arm allows
    above the expected cost."""
    expected = run.expected_gpu_hours
    if not expected or expected <= 0:
        return None
    if factor * expected >= expected + grace_gpu_hours:
        bounds = [(factor * expected, f"{factor:g} x its expected cost of {expected:.6g} GPU-h")]
    else:
        bounds = [(expected + grace_gpu_hours, (f"its expected cost of {expected:.6g} GPU-h plus the start-up "
                                                f"grace of {grace_gpu_hours:.6g} GPU-h"))]
    b = state.budget
    left = {RunKind.SEARCH: b.search_remaining, RunKind.CALIBRATION: b.remaining,
            RunKind.CHECK: b.check_left}.get(run.kind)  # type: ignore[call-overload]
    if left is not None:
        share = max(0.0, left) / max(1, len(state.in_flight))
        bounds.append((expected + share, (f"its expected cost of {expected:.6g} GPU-h plus its share of the "
                                          f"{max(0.0, left):.6g} GPU-h the budget has left for it")))
    return min(bounds)


def infra_charge_to(state: CampaignState, charge: float) -> str:
    """Where an infrastructure failure's charge goes: the infrastructure reserve while it covers the
    whole charge, else the campaign budget (a spent reserve is no door out of the budget)."""
    b = state.budget
    return "infra" if b.infra_charged + charge <= b.infra_reserve + CHECK_SLACK_GPU_HOURS else "budget"


# ----------------------------------------------------------------------------------- control


def _slug(text: str | None) -> str:
    s = re.sub(r"[^a-z0-9]+", "-", (text or "").lower()).strip("-")
    return s[:24].strip("-")


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 9)


class Control:
    """The control plane of one campaign directory."""

    def __init__(self, campaign_dir: Path | str) -> None:
        self.dir = Path(campaign_dir).resolve()
        self.spec: CampaignSpec = load_spec(self.dir / CAMPAIGN_FILE)
        self.spec_sha256 = spec_sha256(self.dir / CAMPAIGN_FILE)
        self.ledger = ledger_mod.Ledger(self.dir)
        self._follower = Follower(self.dir)
        self.gen = RunGenerator(self.spec)
        problems = self.gen.check_baseline()
        if problems:
            raise ControlError("the campaign's baseline contradicts its workload: " + "; ".join(problems))
        state = self.state()
        if state.name is None:
            raise ControlError(f"campaign {self.dir} has not started (run `attune init {self.dir}` first)")
        if state.spec_sha256 != self.spec_sha256:
            raise ControlError(
                f"{self.dir / CAMPAIGN_FILE} changed after the campaign started (pinned sha256 "
                f"{state.spec_sha256}, now {self.spec_sha256}); a campaign's spec is frozen"
            )
        wd = self.spec.control.workdir
        self.workdir = (self.dir / wd).resolve() if wd else SOURCE_ROOT
        self.runs_dir = self.dir / RUNS_DIR

    @property
    def name(self) -> str:
        return self.spec.name

    def state(self) -> CampaignState:
        """The campaign's state, current with its ledger: only the rows appended since the last call
        (by this process or another) are read, verified and folded (`state.Follower`). A snapshot:
        later calls do not change it."""
        return self._follower.snapshot()

    def run_dir(self, run_id: str) -> Path:
        return self.runs_dir / run_id

    # --- costs ------------------------------------------------------------------------------
    def run_cost(self, state: CampaignState) -> float | None:
        """The expected cost of one unprofiled run: the mean charge of finished good runs (of the workload's length:
        not the calibration run that ran as long as a check run)."""
        done = [r for r in state.runs.values() if r.status == "finished" and r.outcome == "ok" and not r.profile
                and r.purpose != "reference"]
        charges = [r.charge_gpu_hours for r in done if r.kind == "calibration"]
        if not charges:
            charges = [r.charge_gpu_hours for r in done if r.kind == "search"]
        if charges:
            return statistics.fmean(charges)
        return self.spec.control.expected_run_gpu_hours

    def expected_cost(self, state: CampaignState, kind: str, profile: bool) -> float | None:
        base = self.run_cost(state)
        if base is None:
            return None
        if kind == "search":
            # Candidates slower than the baseline run longer: once search runs have finished, a search
            # launch is expected to cost at least their mean, so the search does not eat the check reserve.
            done = [r.charge_gpu_hours for r in state.runs.values() if r.kind == "search" and r.status == "finished"
                    and r.outcome == "ok" and not r.profile]
            if done:
                base = max(base, statistics.fmean(done))
        w = self.spec.workload
        if profile:
            base *= (w.steps_per_run + self.spec.control.profile_extra_steps) / w.steps_per_run
        if kind == "check":
            base *= self.spec.gate.convergence_steps / w.steps_per_run
        return base

    # --- admission --------------------------------------------------------------------------
    def admit(self, request: RunRequest | Mapping[str, Any]) -> LaunchAnswer:
        """Decide a launch request, the agent's (`LaunchRequest`: search or calibration) or the shipping
        step's (`FinalRunRequest`: check or re-measurement), with the one rule pipeline (`ADMISSION_RULES`).
        Never raises for a refusal: the answer says why."""
        if not isinstance(request, LaunchRequest | FinalRunRequest):
            request = LaunchRequest.model_validate(request)
        with campaign_lock(self.dir), self.ledger.transaction():  # one decision, one commit
            state = self.state()
            fatal = False
            try:
                if spec_sha256(self.dir / CAMPAIGN_FILE) != self.spec_sha256:
                    raise RunGenError("spec_changed", (
                        "campaign.yaml changed after the campaign started; its spec is frozen (restore it)"))
                decision = self._decide(state, request)
            except RunGenError as exc:
                decision = LaunchAnswer(admitted=False, code=exc.code, reason=exc.message, kind=request.kind)
                fatal = isinstance(exc, WorkloadEnvError) and exc.terminal and request.kind == RunKind.CALIBRATION
            if not decision.admitted:
                self.ledger.append("launch_refused", {"reason": decision.reason, "code": decision.code,
                                                      "kind": request.kind, **_refused_fields(request, decision)})
                if fatal and state.calibration is None and state.failed is None:
                    # Nothing can ever be measured: the campaign ends failed (never success on nothing), so a
                    # headless session's Stop hook lets it end, as a failure, and `attune tune` exits 1.
                    self.ledger.append("campaign_failed", {
                        "reason": f"the baseline cannot be calibrated: {decision.reason}",
                        "phase": "calibration", "shipped": None})
                decision.budget = state.budget.as_dict()
                return decision
            assert decision.job is not None and decision.run_id is not None
            fields = self._admitted_fields(request)
            self._write_job(decision, self._job_request(request), profile=request.profile)
            self.ledger.append("launch_admitted", {
                "run_id": decision.run_id, "kind": request.kind, "expected_gpu_hours": decision.expected_gpu_hours,
                "changes": decision.changes, **fields, "recipe_key": decision.recipe_key,
                "retry_of": decision.retry_of, "gate": decision.gate, "argv": list(decision.job.argv),
                **({"purpose": decision.purpose, "steps": self.spec.gate.convergence_steps}
                   if decision.purpose == "reference" else {}),
            })
            decision.budget = self.state().budget.as_dict()
            return decision

    def _admitted_fields(self, request: RunRequest) -> dict[str, Any]:
        """The `launch_admitted` row's fields that come from the request."""
        if isinstance(request, FinalRunRequest):
            what = "correctness check" if request.kind == RunKind.CHECK else "final re-measurement"
            if request.replicate:
                what = "replicate correctness check (the check was borderline)"
            return {"hypothesis": f"{what} of {request.of}", "lever": None, "expected_gain": None, "profile": False,
                    "code_locations": {}, "base_run_id": request.of, "prune_below": None,
                    "steps": self._final_steps(request.kind), **({"purpose": "replicate"} if request.replicate else {})}
        return {"hypothesis": request.hypothesis, "lever": request.lever, "expected_gain": request.expected_gain,
                "profile": request.profile, "code_locations": dict(request.code_locations),
                "base_run_id": request.base if request.kind == RunKind.SEARCH else "baseline",
                "prune_below": request.prune_below}

    def _job_request(self, request: RunRequest) -> dict[str, Any]:
        """The request as runs/<id>/job.json records it."""
        if isinstance(request, FinalRunRequest):
            return {"kind": request.kind, "of": request.of, "steps": self._final_steps(request.kind),
                    **({"replicate": True} if request.replicate else {})}
        return request.model_dump()

    def _with_workload_python(self, job: JobSpec) -> JobSpec:
        """The job with its command's `python` made the workload's interpreter (spec `environment`).

        Refuses (RunGenError `environment`, with the fix) when no interpreter at hand can import the
        workload's modules: checked before admission, so nothing is admitted or charged for a job
        that could not start."""
        if self.spec.environment is None or self.spec.cluster.backend != "local":
            return job
        from attune.control import workenv

        st = workenv.status(self.spec, self.dir)
        if st.state != "ready" or st.python is None:
            raise WorkloadEnvError(f"the workload's Python environment is not ready: {st.reason}"
                                   + (f". Fix: {st.fix}" if st.fix else ""), terminal=st.terminal)
        argv = list(job.argv)
        if argv and os.path.basename(argv[0]) in ("python", "python3"):
            argv[0] = st.python
        from dataclasses import replace

        return replace(job, argv=tuple(argv))

    def _final_steps(self, kind: str) -> int:
        return self.spec.gate.convergence_steps if kind == "check" else self.spec.workload.steps_per_run

    def _base_changes(self, state: CampaignState, base: str) -> Changes:
        if base == "baseline":
            return Changes()
        if base == "leader":
            if state.leader_run_id in (None, "baseline"):
                return Changes()
            base = state.leader_run_id
        run = state.runs.get(base)
        if run is None or run.kind not in ("search",):
            raise RunGenError("bad_request", f"base: no search run {base!r} in this campaign (use leader, baseline "
                              "or the id of one of its search runs)")
        return Changes(dict(run.changes.get("args") or {}), dict(run.changes.get("env") or {}))

    def _decide(self, state: CampaignState, req: RunRequest) -> LaunchAnswer:
        """Run the admission rules that apply to the request's kind, in order (`ADMISSION_RULES`): the
        first refusal is the answer."""
        ctx = AdmitContext(self, state, req)
        for rule, kinds in ADMISSION_RULES:
            if req.kind not in kinds:
                continue
            refusal = rule(ctx)
            if refusal is not None:
                return refusal.answer(req.kind)
        job = self._with_workload_python(ctx.job) if ctx.job is not None else None
        assert job is not None and ctx.candidate is not None and ctx.run_id is not None
        return LaunchAnswer(admitted=True, run_id=ctx.run_id, kind=req.kind,
                            expected_gpu_hours=_round(ctx.expected or 0.0), changes=ctx.candidate.changes.as_dict(),
                            retry_of=ctx.retry_of, exclude_nodes=ctx.exclude, gate=ctx.gate,
                            recipe_key=ctx.candidate.recipe_key, job=replace(job, exclude_nodes=tuple(ctx.exclude)),
                            purpose="reference" if ctx.reference else None)

    def _identical(self, state: CampaignState, cand: GeneratedRecipe) -> tuple[str, str] | None:
        """None: a new recipe. ("retry", run_id): one retry of an infrastructure failure. ("refuse", why)."""
        prior = [r for r in state.runs.values() if r.kind == "search" and r.recipe_key == cand.recipe_key]
        if not prior:
            return None
        open_ = [r for r in prior if r.status != "finished"]
        if open_:
            return "refuse", f"an identical recipe is already in flight (run {open_[0].run_id})"
        infra = [r for r in prior if r.outcome == RunOutcome.INFRASTRUCTURE]
        if len(prior) == 1 and len(infra) == 1:
            return "retry", prior[0].run_id
        last = prior[-1]
        if len(infra) >= 2:
            return "refuse", (
                f"this recipe failed on infrastructure twice (runs {', '.join(r.run_id for r in infra)}): that "
                "counts as a recipe failure; diagnose it and change the recipe")
        tps = f", {last.tokens_per_s_per_gpu:.6g} tokens/s/GPU" if last.tokens_per_s_per_gpu else ""
        return "refuse", (
            f"identical to run {last.run_id} (outcome {last.outcome}{tps}): a recipe is measured once, and a "
            "failed recipe must be diagnosed and changed")

    def _next_run_id(self, state: CampaignState, req: RunRequest) -> str:
        n = len(state.runs) + 1
        if isinstance(req, FinalRunRequest):
            label = re.sub(r"[^a-z0-9]+", "-", f"{req.kind}-{req.of}".lower()).strip("-")[:40].strip("-") or "run"
        else:
            label = "calibration" if req.kind == "calibration" else _slug(req.lever) or "run"
        run_id = f"r{n:03d}-{label}"
        while run_id in state.runs or self.run_dir(run_id).exists():
            n += 1
            run_id = f"r{n:03d}-{label}"
        return run_id

    def _write_job(self, decision: LaunchAnswer, request: dict[str, Any], profile: bool) -> None:
        job = decision.job
        assert job is not None
        job.run_dir.mkdir(parents=True, exist_ok=False)
        doc = {
            "run_id": decision.run_id,
            "campaign": self.name,
            "kind": request["kind"],
            "profile": profile,
            "changes": decision.changes,
            "retry_of": decision.retry_of,
            "exclude_nodes": decision.exclude_nodes,
            "argv": list(job.argv),
            "env": job.env,
            "args": job.args,
            "gpus": job.gpus,
            "gpus_per_node": job.gpus_per_node,
            "image": job.image,
            "workdir": str(job.workdir),
            "time_limit_s": self.spec.control.time_limit_s,
            "request": request,
        }
        tmp = job.run_dir / (RUN_JOB + ".tmp")
        tmp.write_text(json.dumps(doc, indent=2, default=str) + "\n")
        os.replace(tmp, job.run_dir / RUN_JOB)

    def job_doc(self, run_id: str) -> dict[str, Any]:
        return json.loads((self.run_dir(run_id) / RUN_JOB).read_text())

    # --- lifecycle rows ---------------------------------------------------------------------
    def record_submitted(self, run_id: str, backend: str, backend_id: str) -> None:
        self.ledger.append("run_submitted", {"run_id": run_id, "backend": backend, "backend_id": backend_id})

    def record_started(self, run_id: str, started_at: float, nodes: list[str]) -> None:
        with campaign_lock(self.dir):
            run = self.state().runs.get(run_id)
            if run is None or run.status != "admitted":
                return
            self.ledger.append("run_started", {"run_id": run_id, "started_at": started_at, "nodes": list(nodes)})

    # --- finishing --------------------------------------------------------------------------
    def classify(self, facts: JobFacts, score: Score) -> tuple[str, str]:
        """The run's outcome and why: the broker's own actions first, then the backend, then the log."""
        if facts.killed_for == RunOutcome.HANG:
            return RunOutcome.HANG, facts.reason or "no log progress: killed by the broker's watchdog"
        if facts.killed_for == RunOutcome.CANCELLED:
            return RunOutcome.CANCELLED, facts.reason or "cancelled through the broker"
        if facts.killed_for == RunOutcome.PRUNED:
            return RunOutcome.PRUNED, facts.reason or "stopped early: slower than the early-abort threshold"
        if facts.killed_for == RunOutcome.OVERRUN:
            return RunOutcome.OVERRUN, facts.reason or "stopped by the monitor at its charge bound"
        if facts.state == "infrastructure":
            return RunOutcome.INFRASTRUCTURE, facts.reason or "the backend reports an infrastructure failure"
        if facts.state == "timeout":
            return RunOutcome.HANG, facts.reason or "the backend's time limit"
        if facts.state == "cancelled":
            return RunOutcome.CANCELLED, facts.reason or "cancelled outside the broker"
        return score.failure_class, score.failure_reason

    def finish(self, run_id: str, facts: JobFacts) -> dict[str, Any]:
        """Score, classify, charge and (maybe) promote a run that ended. Idempotent."""
        with campaign_lock(self.dir), self.ledger.transaction():  # one decision, one commit
            state = self.state()
            run = state.runs.get(run_id)
            if run is None:
                raise ControlError(f"run {run_id!r} was never admitted in campaign {self.name}")
            if run.status == "finished":
                return {"run_id": run_id, "outcome": run.outcome, "already_finished": True}
            started = facts.started_at if facts.started_at is not None else run.started_at
            if facts.killed_for in STOPPED_OUTCOMES and started is None:
                score = Score(None, False, ["cancelled before it started"], "ok", "cancelled before it started")
            else:
                score = score_run(self.spec, self.run_dir(run_id) / RUN_LOG, exit_code=facts.exit_code,
                                  seconds_since_progress=facts.seconds_since_progress,
                                  own_text=self._own_text(run_id))
            outcome, reason = self.classify(facts, score)
            ended = facts.ended_at if facts.ended_at is not None else time.time()
            charge = gpu_hours(self.spec.cluster.gpus, ended - started) if started is not None else 0.0
            recipe_failure = False
            charged_to = "final" if run.kind == RunKind.REMEASURE else "budget"
            if outcome == RunOutcome.INFRASTRUCTURE:
                if run.retry_of is None:
                    charged_to = infra_charge_to(state, charge)
                else:
                    first = state.runs.get(run.retry_of)
                    first_nodes = set(first.nodes) if first else set()
                    recipe_failure = not first_nodes or not set(facts.nodes) or first_nodes != set(facts.nodes)
            self.ledger.append("run_finished", {
                "run_id": run_id, "outcome": outcome, "charge_gpu_hours": _round(charge), "charged_to": charged_to,
                "started_at": started, "ended_at": ended if started is not None else None,
                "exit_code": facts.exit_code, "nodes": list(facts.nodes), "reason": reason,
                "recipe_failure": recipe_failure, "backend_state": facts.state,
            })
            state = self.state()
            verdict = self._verdict(state, state.runs[run_id], outcome, score)
            self.ledger.append("measurement", {
                "run_id": run_id, "tokens_per_s_per_gpu": score.tokens_per_s_per_gpu, "valid": score.valid,
                "invalid_reasons": score.invalid_reasons, "verdict": verdict,
                "failure_class": score.failure_class, "last_iteration": score.last_iteration,
            })
            out: dict[str, Any] = {"run_id": run_id, "outcome": outcome, "reason": reason, "verdict": verdict,
                                   "charge_gpu_hours": _round(charge), "charged_to": charged_to,
                                   "tokens_per_s_per_gpu": score.tokens_per_s_per_gpu, "valid": score.valid}
            ok = outcome == RunOutcome.OK and score.valid and score.tokens_per_s_per_gpu is not None
            if run.kind == RunKind.CALIBRATION and ok:
                self.ledger.append("calibration_run", {"run_id": run_id,
                                                       "tokens_per_s_per_gpu": score.tokens_per_s_per_gpu})
                self._maybe_set_budget()
            elif run.kind == RunKind.SEARCH and verdict == Verdict.LEADER:
                state = self.state()
                prev_id, prev = state.leader_run_id, state.leader_tokens_per_s_per_gpu
                cal = state.calibration
                self.ledger.append("leader_changed", {
                    "run_id": run_id, "tokens_per_s_per_gpu": score.tokens_per_s_per_gpu,
                    "previous_run_id": prev_id, "previous_tokens_per_s_per_gpu": prev,
                    "band": cal.band if cal else None,
                    "gain_over_baseline": (score.tokens_per_s_per_gpu / cal.mean - 1.0) if cal else None,
                })
                out["promoted"] = True
            return out

    def _own_text(self, run_id: str) -> tuple[str, ...]:
        try:
            return job_own_text(self.job_doc(run_id))
        except (OSError, ValueError):
            return ()

    def _verdict(self, state: CampaignState, run: RunState, outcome: str, score: Score) -> str:
        if outcome in STOPPED_OUTCOMES or outcome == RunOutcome.OVERRUN:
            return outcome
        if outcome != RunOutcome.OK:
            return Verdict.FAILED
        if not score.valid or score.tokens_per_s_per_gpu is None:
            return Verdict.INVALID
        if run.kind != RunKind.SEARCH:
            return run.kind
        cal = state.calibration
        lead = state.leader_tokens_per_s_per_gpu
        if cal is None or lead is None:
            return Verdict.UNCALIBRATED
        if state.would_promote(score.tokens_per_s_per_gpu):
            return Verdict.LEADER
        if score.tokens_per_s_per_gpu >= lead * (1.0 - cal.band):
            return Verdict.WITHIN_BAND
        return Verdict.SLOWER

    def _maybe_set_budget(self) -> None:
        """Once calibration is complete: the budget (default a multiple of one run) and the check reserve."""
        state = self.state()
        if state.calibration is None or state.budget_set_seq is not None:
            return
        cal = [state.runs[r] for r in state.calibration_run_ids if r in state.runs]
        # one run of the workload's length: the calibration run that ran as long as a check run is left out
        charges = [r.charge_gpu_hours for r in cal if r.purpose != "reference"] or [r.charge_gpu_hours for r in cal]
        run_cost = statistics.fmean(charges) if charges else 0.0
        b = self.spec.budget
        total = b.gpu_hours if b.gpu_hours is not None else b.default_multiple * run_cost
        reserve = b.reserve_gpu_hours
        replicas = state.replicate_check_runs  # what the campaign started with (shipping.replicate_check_runs)
        # the calibration run that ran as the baseline's reference check run: no check run of the baseline to pay
        own_ref = 0 if state.calibration_reference() is not None else 1
        if reserve is None:  # the checks, plus the baseline's reference check run and its replicates (the noise)
            reserve = ((b.check_reserve_runs + own_ref + replicas) * run_cost * self.spec.gate.convergence_steps
                       / self.spec.workload.steps_per_run)
        reason = (
            f"calibration complete: one baseline run costs {run_cost:.6g} GPU-h; "
            + ("budget from the spec" if b.gpu_hours is not None else f"budget = {b.default_multiple:g} x that")
            + ("; reserve from the spec" if b.reserve_gpu_hours is not None
               else f"; reserve = {b.check_reserve_runs} check runs, "
                    + ("the baseline's reference run and " if own_ref else "")
                    + f"{replicas} replicate(s) of the baseline, {self.spec.gate.convergence_steps} steps each"
                    + ("" if own_ref else " (the baseline's reference curve is a calibration run's)"))
        )
        self.ledger.append("budget_set", {"gpu_hours": _round(total), "reserve_gpu_hours": _round(reserve),
                                          "run_cost_gpu_hours": _round(run_cost), "reason": reason})


# ----------------------------------------------------------------------------------- admission rules


@dataclass
class Refusal:
    """Why a launch request is refused: a stable code, the reason in words, and what it lacks."""

    code: str
    reason: str
    items: list[str] = field(default_factory=list)
    changes: dict[str, Any] | None = None  # the candidate's changes, where the refusal is about them
    gate: dict[str, Any] | None = None
    expected_gpu_hours: float | None = None
    with_kind: bool = True  # False: the request was not read (the campaign has not started)

    def answer(self, kind: str) -> LaunchAnswer:
        return LaunchAnswer(admitted=False, code=self.code, reason=self.reason,
                            kind=kind if self.with_kind else None, expected_gpu_hours=self.expected_gpu_hours,
                            changes=self.changes, gate=self.gate, items=list(self.items))


@dataclass
class AdmitContext:
    """What the admission rules read (the control plane, the state, the request) and what they work
    out for the rules after them (the edits, the candidate, the gate's verdict, the cost, the job)."""

    control: Control
    state: CampaignState
    request: RunRequest
    edits: Changes = field(default_factory=Changes)
    candidate: GeneratedRecipe | None = None
    gate: dict[str, Any] | None = None
    retry_of: str | None = None
    exclude: list[str] = field(default_factory=list)
    expected: float | None = None
    reference: bool = False  # a calibration run that is also the baseline's reference check run
    run_id: str | None = None
    job: JobSpec | None = None

    @property
    def spec(self) -> CampaignSpec:
        return self.control.spec

    @property
    def agent(self) -> LaunchRequest:
        """The agent's request (the rules that read it apply to search and calibration runs only)."""
        assert isinstance(self.request, LaunchRequest), "a rule for the agent's runs only"
        return self.request

    @property
    def final(self) -> FinalRunRequest:
        assert isinstance(self.request, FinalRunRequest), "a rule for the shipping step's runs only"
        return self.request

    @property
    def steps(self) -> int | None:
        """The run's length when it is not the workload's (a check run, and the calibration run that is the
        baseline's reference check run: the gate's convergence steps)."""
        return self.spec.gate.convergence_steps if self.request.kind == RunKind.CHECK or self.reference else None

    @property
    def cand(self) -> GeneratedRecipe:
        assert self.candidate is not None, "a rule before this one makes the candidate"
        return self.candidate


AdmissionRule = Callable[[AdmitContext], Refusal | None]


def rule_started(ctx: AdmitContext) -> Refusal | None:
    if ctx.state.name is None:
        return Refusal("not_started", "the campaign has not started", with_kind=False)
    if ctx.state.failed is not None:
        return Refusal("failed", f"the campaign has ended failed: {ctx.state.failed.get('reason')}")
    return None


def rule_paths_confined(ctx: AdmitContext) -> Refusal | None:
    """Before anything else: a path in the changes outside the run's directory is refused outright."""
    c = ctx.control
    ctx.edits = parse_changes(ctx.agent.changes)
    c.gen.confine(ctx.edits, c.run_dir(c._next_run_id(ctx.state, ctx.request)), c.workdir)
    return None


def rule_concurrency(ctx: AdmitContext) -> Refusal | None:
    flying, limit = ctx.state.in_flight, ctx.spec.budget.concurrency
    if len(flying) >= limit:
        return Refusal("concurrency", (
            f"{len(flying)} run(s) in flight ({', '.join(r.run_id for r in flying)}) and the campaign allows "
            f"{limit} at once: wait for one to finish"))
    return None


def rule_calibration(ctx: AdmitContext) -> Refusal | None:
    """A calibration run is the baseline itself, while calibration still needs runs."""
    req, state = ctx.agent, ctx.state
    if not ctx.edits.empty or req.base not in ("leader", "baseline"):
        return Refusal("bad_request", "a calibration run is the baseline itself: no changes")
    if req.profile and any(r.kind == "calibration" and r.profile and r.outcome not in PROFILE_LOST_OUTCOMES
                           for r in state.runs.values()):
        # One profiled calibration run (diagnosis first): its trace window follows the measured steps, so
        # its measurement counts; one profile of the baseline is enough. One lost to an infrastructure
        # fault (or cancelled) left none: another calibration run may be profiled in its place.
        return Refusal("bad_request", "a calibration run is the baseline itself: only one of them is profiled")
    required = state.calibration_runs_required
    cal_open = sum(1 for r in state.in_flight if r.kind == "calibration")
    if len(state.calibration_values) + cal_open >= required:
        return Refusal("calibration_full", (
            f"calibration needs {required} good baseline runs; {len(state.calibration_values)} done and "
            f"{cal_open} in flight"))
    ctx.candidate = ctx.control.gen.candidate(Changes(), Changes(), req.profile)
    ctx.reference = _calibration_reference_due(ctx)
    return None


def rule_reference_length(ctx: AdmitContext) -> Refusal | None:
    """The calibration run that is also the baseline's reference check run runs as long as a check run. After
    layer 1 (`rule_gate`), like a check run's length: the run length is the campaign's pin, not a recipe change."""
    if ctx.reference:
        ctx.candidate = ctx.control.gen.with_steps(ctx.cand, ctx.control.spec.gate.convergence_steps)
    return None


def _calibration_reference_due(ctx: AdmitContext) -> bool:
    """Whether this calibration run is also the baseline's reference check run: it runs the baseline's recipe,
    data and seed like a check run, so the first unprofiled one runs `gate.convergence_steps` steps instead of
    `workload.steps_per_run` (its measured window is the same) and the shipping step needs no check run of the
    baseline of its own (`shipping.reference_run`). One at a time: another is made only if it failed."""
    spec, gen = ctx.control.spec, ctx.control.gen
    if ctx.agent.profile or gen.steps_flag() is None or spec.gate.convergence_steps < spec.workload.steps_per_run:
        return False
    return not any(r.kind == RunKind.CALIBRATION and r.purpose == "reference"
                   and (r.status != RunStatus.FINISHED or r.outcome == RunOutcome.OK) for r in ctx.state.runs.values())


def rule_search_request(ctx: AdmitContext) -> Refusal | None:
    """A search launch states its hypothesis, lever and expected gain."""
    req = ctx.agent
    missing = [n for n, v in (("hypothesis", req.hypothesis), ("lever", req.lever)) if not (v or "").strip()]
    if req.expected_gain is None or not math.isfinite(req.expected_gain):
        missing.append("expected_gain")
    if missing:
        return Refusal("bad_request", (
            f"a search launch states {', '.join(missing)}: the bottleneck it should shrink and the "
            "mechanism (hypothesis), the lever it changes, and the expected gain"))
    return None


def rule_search_open(ctx: AdmitContext) -> Refusal | None:
    """Search launches run between calibration and the stop."""
    state = ctx.state
    if state.stop is not None:
        return Refusal("stopped", "the campaign has recorded a stop; no further search launches")
    if state.calibration is None:
        return Refusal("not_calibrated", (
            f"the baseline is not calibrated yet ({len(state.calibration_values)}/"
            f"{state.calibration_runs_required} calibration runs): launch calibration runs first"))
    return None


def rule_search_candidate(ctx: AdmitContext) -> Refusal | None:
    """The candidate: the changes applied to the base recipe; it must differ from the baseline."""
    req, c = ctx.agent, ctx.control
    ctx.candidate = c.gen.candidate(c._base_changes(ctx.state, req.base), ctx.edits, req.profile)
    if ctx.candidate.changes.empty and not req.profile:
        return Refusal("no_change", (
            "the candidate is the baseline recipe itself (its changes cancel out): the baseline is "
            "measured by calibration; change a lever"))
    return None


def rule_final_candidate(ctx: AdmitContext) -> Refusal | None:
    """A check or re-measurement run is a measured recipe as it was (the baseline, or a finished search
    run's), unprofiled; a check run is `gate.convergence_steps` long."""
    req, c = ctx.final, ctx.control
    if req.of == "baseline":
        base = Changes()
    else:
        run = ctx.state.runs.get(req.of)
        if run is None or run.kind != RunKind.SEARCH or run.status != "finished":
            raise RunGenError("bad_request", f"{req.kind}: no finished search run {req.of!r}")
        base = Changes(dict(run.changes.get("args") or {}), dict(run.changes.get("env") or {}))
    ctx.candidate = c.gen.candidate(base, Changes(), False)
    if ctx.steps is not None:
        ctx.candidate = c.gen.with_steps(ctx.candidate, ctx.steps)
    return None


def rule_one_replicate(ctx: AdmitContext) -> Refusal | None:
    """A candidate's replicate check run: only of a candidate whose check verdict is recorded and borderline
    (`borderline.borderline` in its `check_run` row), and only one per candidate, ever."""
    req, state = ctx.final, ctx.state
    if not req.replicate:
        return None
    if req.kind != RunKind.CHECK or req.of == "baseline":
        return Refusal("bad_request", "a replicate check run is of a candidate (the baseline's replicates are "
                       "gate.replicate_check_runs)")
    earlier = [r.run_id for r in state.runs.values()
               if r.kind == RunKind.CHECK and r.base_run_id == req.of and r.purpose == "replicate"]
    if earlier or any(x.get("of") == req.of and x.get("purpose") == "replicate" for x in state.refusals):
        return Refusal("replicate_done", f"{req.of} already had its one replicate check run "
                       f"({', '.join(earlier) or 'refused'})")
    rows = [c for c in state.checks if c.get("candidate_run_id") == req.of]
    if not rows or rows[-1].get("passed") or not (rows[-1].get("borderline") or {}).get("borderline"):
        return Refusal("bad_request", f"no borderline check verdict of {req.of}: a replicate is asked for only "
                       "where a check is borderline")
    return None


def rule_one_lever(ctx: AdmitContext) -> Refusal | None:
    """The skill's search rules (attune.control.search_rules); a profiled re-run of a recipe is no new candidate."""
    if ctx.agent.profile and ctx.edits.empty:
        return None
    from attune.control import search_rules

    cand = ctx.cand
    r2 = search_rules.check_one_lever(ctx.spec, ctx.state, cand.args, cand.env)
    if r2 is None:
        return None
    return Refusal(r2.code, r2.line(), items=list(r2.items), changes=cand.changes.as_dict())


def rule_gate(ctx: AdmitContext) -> Refusal | None:
    """Layer 1 of the gate on the candidate recipe (flags and environment, before fixes)."""
    spec, cand = ctx.spec, ctx.cand
    verdict = check_candidate(spec, ctx.control.dir, ctx.state.list_sha256, spec.baseline.args, cand.args,
                              spec.baseline.env, cand.env)
    ctx.gate = {"passed": verdict.passed, "summary": verdict.summary, "list_sha256": verdict.list_sha256}
    if verdict.passed:
        return None
    return Refusal("gate", verdict.summary, changes=cand.changes.as_dict(),
                   gate={**ctx.gate, "refusals": verdict.refusals})


def rule_code_locations(ctx: AdmitContext) -> Refusal | None:
    """A search launch records where the running image implements each flag it adds."""
    req, spec = ctx.agent, ctx.spec
    new_flags = [f for f, v in ctx.edits.args.items()
                 if v is not None and v is not False and f not in spec.baseline.args]
    no_loc = [f for f in new_flags if not (req.code_locations.get(f) or "").strip()]
    if no_loc:
        return Refusal("code_locations", (
            f"record where the running image implements each new flag (code_locations, e.g. "
            f"{{\"{no_loc[0]}\": \"path/to/file.py:123\"}}): missing for {', '.join(no_loc)}"))
    return None


def rule_identical(ctx: AdmitContext) -> Refusal | None:
    """A recipe is measured once; one retry of an infrastructure failure, on other nodes."""
    ident = ctx.control._identical(ctx.state, ctx.cand)
    if ident is None:
        return None
    if ident[0] == "retry":
        ctx.retry_of = ident[1]
        ctx.exclude = list(ctx.state.runs[ident[1]].nodes)
        return None
    return Refusal("identical", ident[1])


def rule_expected_cost(ctx: AdmitContext) -> Refusal | None:
    """The run's expected cost (the rules after it check it against the budget)."""
    ctx.expected = ctx.control.expected_cost(ctx.state, ctx.request.kind, ctx.request.profile)
    if ctx.expected is not None and ctx.reference:  # it runs as long as a check run
        w = ctx.control.spec.workload
        ctx.expected *= ctx.control.spec.gate.convergence_steps / w.steps_per_run
    return None


def rule_budget(ctx: AdmitContext) -> Refusal | None:
    """The expected cost fits what is left for search (search launches need the budget and an estimate)."""
    b, expected = ctx.state.budget, ctx.expected
    if ctx.request.kind == RunKind.SEARCH:
        if b.total is None:
            return Refusal("budget_unset", "the campaign's budget is not set yet")
        if expected is None:
            return Refusal("no_estimate", (
                "no run has finished yet, so a launch's cost is unknown: calibrate first or set "
                "control.expected_run_gpu_hours"))
    if b.total is not None and expected is not None and expected > (b.search_remaining or 0.0) + 1e-12:
        return Refusal("budget", (
            f"expected cost {expected:.6g} GPU-h does not fit: {b.search_remaining:.6g} GPU-h left for search "
            f"(total {b.total:.6g} - charged {b.charged:.6g} - in flight {b.in_flight:.6g} - reserve "
            f"{b.reserve_left:.6g})"), expected_gpu_hours=expected)
    return None


def rule_check_reserve(ctx: AdmitContext) -> Refusal | None:
    """A check run is paid from the check reserve alone (`check_budget_refusal`)."""
    expected = ctx.expected or 0.0
    refusal = check_budget_refusal(ctx.state.budget, expected)
    if refusal is not None:
        return Refusal("budget", refusal, expected_gpu_hours=expected)
    return None


def rule_shape(ctx: AdmitContext) -> Refusal | None:
    """The resolved job (paths confined, inherited values too) matches the campaign's pinned shape."""
    c, cand = ctx.control, ctx.cand
    ctx.run_id = c._next_run_id(ctx.state, ctx.request)
    run_dir = c.run_dir(ctx.run_id)
    c.gen.confine(cand.changes, run_dir, c.workdir)  # inherited values too (a leader's)
    ctx.job = c.gen.resolve(cand, run_dir, c.workdir)
    problems = c.gen.check_shape(ctx.job, ctx.request.profile, steps=ctx.steps)
    if problems:
        return Refusal("shape", "the job does not match the campaign's pinned shape: " + "; ".join(problems))
    return None


AGENT_KINDS: frozenset[RunKind] = frozenset({RunKind.SEARCH, RunKind.CALIBRATION})  # what the agent may ask for
ALL_KINDS: frozenset[RunKind] = AGENT_KINDS | FINAL_KINDS
_SEARCH = frozenset({RunKind.SEARCH})

# The admission of every run, in order, each rule with the run kinds it applies to: the first rule that
# refuses decides. The agent asks for search and calibration runs (`LaunchRequest`); the shipping step for
# check and re-measurement runs (`FinalRunRequest`): no gate at admission for those (a check run is judged
# on its resolved arguments afterwards), no identical-recipe rule, a check paid from the check reserve
# alone, a re-measurement charged outside the budget. Rules may also raise RunGenError (a path outside the
# run's directory, a bad base): a refusal with its code.
ADMISSION_RULES: tuple[tuple[AdmissionRule, frozenset[RunKind]], ...] = (
    (rule_started, ALL_KINDS),
    (rule_paths_confined, AGENT_KINDS),
    (rule_concurrency, ALL_KINDS),
    (rule_calibration, frozenset({RunKind.CALIBRATION})),
    (rule_search_request, _SEARCH),
    (rule_search_open, _SEARCH),
    (rule_search_candidate, _SEARCH),
    (rule_final_candidate, FINAL_KINDS),
    (rule_one_replicate, frozenset({RunKind.CHECK})),
    (rule_one_lever, _SEARCH),
    (rule_gate, AGENT_KINDS),
    (rule_reference_length, frozenset({RunKind.CALIBRATION})),
    (rule_code_locations, _SEARCH),
    (rule_identical, _SEARCH),
    (rule_expected_cost, ALL_KINDS),
    (rule_budget, AGENT_KINDS),
    (rule_check_reserve, frozenset({RunKind.CHECK})),
    (rule_shape, ALL_KINDS),
)
