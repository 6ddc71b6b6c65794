"""An in-process control plane over the simulated cluster, for comparing tuners (a test bed).

`SimControlPlane` implements the driver's `ControlPlane` (`attune.tuners.driver`) the way the paper's
evaluation ran every tuner (Section 3.1, Appendices D and E): a candidate is a set of knob values
(Table E1's frozen space for GLM-4.5 and MiniMax-M2), turned into flag changes with the launcher's
co-changes; a draw that breaks a constraint read from the framework, or that the gate's layer 1
refuses (numeric, frozen, unlisted or a known defect), is scored zero without launching; a launch is
admitted only while its expected cost (one baseline run) fits in the budget left after the reserve
for three correctness checks; the run goes to the sim backend, the metrics reader scores its log,
every launch is charged GPUs x (release - admission) of simulated time, infrastructure failures are
charged to the infrastructure reserve and retried once, the early-abort pruner stops a run below
0.9 x the leader after four measured steps, and a candidate leads only if it beats the leader by
more than the band (`attune.measure.beats`).

`run_campaign` adds what surrounds the search: five calibration runs of the baseline (mean and
band), the shipping rule (up to three candidates that beat the baseline by more than the band,
fastest first: a 20-step check run, the gate's resolved re-check and its convergence check against
the baseline's cached 20-step curve; the first that passes ships, else the baseline) and the final
re-measurement (the shipped recipe and the baseline twice more). The tuner comparison benchmark
(`benchmarks/bench_sim_tuners.py`) runs it for every tuner, model and seed.

Concurrency is one run at a time so that a campaign is deterministic given its seed (the driver's
thread pool would otherwise tell the tuner its results in a thread-timing order); budgets, charges
and launches do not depend on it.
"""

from __future__ import annotations

import itertools
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attune import measure
from attune.layouts import pipeline_split
from attune.memory_estimate import estimate as memory_estimate
from attune.metrics import read_metrics
from attune.sim.api import apply_overrides, resolve_accelerator, resolve_model
from attune.sim.memory import memory_options
from attune.sim.recipe import ArgValue, RecipeError, build_recipe, render_argv
from attune.spec import CampaignSpec, load_spec
from attune.tuners import HeuristicTuner, RandomTuner, TPETuner
from attune.tuners.base import Candidate, Outcome, Tuner
from attune.tuners.driver import EARLY_ABORT_STEPS, drive
from broker.backends.base import JobSpec, JobState
from broker.backends.sim import SimBackend
from gate import check_convergence, check_recipe, check_resolved, load_list
from gate.logparse import read_losses, read_resolved_args

REPO = Path(__file__).resolve().parents[1]
CAMPAIGNS = {
    "glm-4.5": REPO / "examples" / "campaigns" / "glm45-128xb200",
    "minimax-m2": REPO / "examples" / "campaigns" / "minimax-m2-64xb200",
}
# The memory pre-filter's margins (Appendix E): the largest that admit every bring-up layout that fit.
PREFILTER_MARGIN = {"glm-4.5": 0.058, "minimax-m2": 0.117}
RECOMPUTE = {
    None: {},
    "selective": {"--recompute-granularity": "selective"},  # Megatron's default modules: core_attn
    "selective:layernorm": {"--recompute-granularity": "selective", "--recompute-modules": "layernorm"},
    "selective:moe_act": {"--recompute-granularity": "selective", "--recompute-modules": "moe_act"},
    "selective:moe": {"--recompute-granularity": "selective", "--recompute-modules": "moe"},
    "full": {"--recompute-granularity": "full", "--recompute-method": "uniform", "--recompute-num-layers": 1},
    "full:2": {"--recompute-granularity": "full", "--recompute-method": "uniform", "--recompute-num-layers": 2},
}
_RECOMPUTE_FLAGS = ("--recompute-granularity", "--recompute-method", "--recompute-num-layers", "--recompute-modules",
                    "--recompute-activations")
SPLITS = ("balanced", "light_first", "light_last", "light_both")
# Table E1, per model: knob -> values. Flags keep their names; `split`, `dispatcher` and `offload` are
# composite knobs the launcher turns into flags.
SPACES: dict[str, dict[str, list[ArgValue]]] = {
    "glm-4.5": {
        "--tensor-model-parallel-size": [1, 2, 4, 8],
        "--pipeline-model-parallel-size": [1, 2, 4, 8, 16],
        "--expert-model-parallel-size": [1, 2, 4, 8, 16, 32],
        "--expert-tensor-parallel-size": [1, 2, 4, 8],
        "--num-virtual-stages-per-pipeline-rank": [1, 2, 4, 23],
        "split": list(SPLITS),
        "--context-parallel-size": [1, 2, 4],
        "--micro-batch-size": [1],
        "--recompute-granularity": list(RECOMPUTE),
        "dispatcher": ["alltoall", "deepep"],
    },
    "minimax-m2": {
        "--tensor-model-parallel-size": [1, 2, 4, 8],
        "--pipeline-model-parallel-size": [1, 2, 4, 8, 16],
        "--expert-model-parallel-size": [1, 2, 4, 8, 16, 32, 64],
        "--expert-tensor-parallel-size": [1, 2, 4, 8],
        "--num-virtual-stages-per-pipeline-rank": [1, 2, 31],
        "split": list(SPLITS),
        "--context-parallel-size": [1, 2, 4, 8],
        "--micro-batch-size": [1, 2, 4, 32],
        "--recompute-granularity": list(RECOMPUTE),
        "dispatcher": ["alltoall", "deepep"],
        "offload": ["on", "off"],
    },
}
# The heuristic tuner's lever order: the catalog's expected-gain order for these levers.
PRIORITY = ["dispatcher", "--expert-model-parallel-size", "offload", "--tensor-model-parallel-size",
            "--pipeline-model-parallel-size", "--recompute-granularity", "--micro-batch-size",
            "--num-virtual-stages-per-pipeline-rank", "--context-parallel-size", "split",
            "--expert-tensor-parallel-size"]


class Infeasible(ValueError):
    """A draw that violates a constraint read from the framework: scored zero, never launched."""


def _split_flags(layers: int, pp: int, vp: int, kind: str) -> dict[str, ArgValue]:
    """Flags for a pipeline split of `kind`; raises Infeasible where none exists."""
    none = {"--decoder-first-pipeline-num-layers": None, "--decoder-last-pipeline-num-layers": None,
            "--account-for-embedding-in-pipeline-split": None, "--account-for-loss-in-pipeline-split": None}
    if kind == "balanced":
        split = pipeline_split(layers, pp, vp)
        if split is None:
            raise Infeasible(f"{layers} layers cannot be split over PP {pp} x VP {vp}")
        if split.kind == "accounted":
            return {**none, "--account-for-embedding-in-pipeline-split": True, "--account-for-loss-in-pipeline-split": True}
        if split.kind == "uneven":
            return {**none, "--decoder-first-pipeline-num-layers": split.first,
                    "--decoder-last-pipeline-num-layers": split.last}
        return none
    if pp < 2 or (kind == "light_both" and pp < 3):
        raise Infeasible(f"a {kind} split needs more pipeline stages than {pp}")
    ends = 2 if kind == "light_both" else 1
    inner = pp - ends
    for m in range(-(-layers // pp), layers + 1):
        rest = layers - inner * m
        if rest <= 0:
            break
        if rest % ends:
            continue
        f = rest // ends
        if 1 <= f < m and f % vp == 0 and m % vp == 0:
            first = f if kind in ("light_first", "light_both") else None
            last = f if kind in ("light_last", "light_both") else None
            return {**none, "--decoder-first-pipeline-num-layers": first, "--decoder-last-pipeline-num-layers": last}
    raise Infeasible(f"no {kind} split of {layers} layers over PP {pp} x VP {vp}")


@dataclass
class KnobSpace:
    """A model's frozen search space and the launcher that turns knob values into flag changes."""

    model: str
    space: dict[str, list[ArgValue]]
    baseline_args: dict[str, ArgValue]
    layers: int
    gpus: int
    gpus_per_node: int

    def baseline(self) -> dict[str, ArgValue]:
        a = self.baseline_args
        rec: str | None = None
        gran = a.get("--recompute-granularity")
        if gran == "selective":
            mods = str(a.get("--recompute-modules") or "core_attn")
            rec = "selective" if mods == "core_attn" else f"selective:{mods}"
        elif gran == "full":
            rec = "full" if int(a.get("--recompute-num-layers") or 1) == 1 else "full:2"
        out: dict[str, ArgValue] = {
            "--tensor-model-parallel-size": int(a.get("--tensor-model-parallel-size") or 1),
            "--pipeline-model-parallel-size": int(a.get("--pipeline-model-parallel-size") or 1),
            "--expert-model-parallel-size": int(a.get("--expert-model-parallel-size") or 1),
            "--expert-tensor-parallel-size": int(a.get("--expert-tensor-parallel-size") or 1),
            "--num-virtual-stages-per-pipeline-rank": int(a.get("--num-virtual-stages-per-pipeline-rank") or 1),
            "split": "balanced",
            "--context-parallel-size": int(a.get("--context-parallel-size") or 1),
            "--micro-batch-size": int(a.get("--micro-batch-size") or 1),
            "--recompute-granularity": rec,
            "dispatcher": "deepep" if a.get("--moe-token-dispatcher-type") == "flex" else "alltoall",
            "offload": "on" if a.get("--optimizer-cpu-offload") else "off",
        }
        return {k: v for k, v in out.items() if k in self.space}

    def to_args(self, full: Mapping[str, ArgValue]) -> dict[str, ArgValue]:
        """The candidate's full arguments for knob values `full` (missing knobs: the baseline's)."""
        base = self.baseline()
        knobs = {**base, **{k: v for k, v in full.items() if k in self.space}}
        edits: dict[str, ArgValue] = {}
        tp = int(knobs["--tensor-model-parallel-size"])
        pp = int(knobs["--pipeline-model-parallel-size"])
        vp = int(knobs["--num-virtual-stages-per-pipeline-rank"])
        ep = int(knobs["--expert-model-parallel-size"])
        etp = int(knobs["--expert-tensor-parallel-size"])
        cp = int(knobs["--context-parallel-size"])
        if ep == 1 and etp > 2:
            raise Infeasible("expert parallelism 1 is searched only with expert-tensor parallelism <= 2")
        edits["--tensor-model-parallel-size"] = tp
        edits["--pipeline-model-parallel-size"] = pp
        edits["--expert-model-parallel-size"] = ep
        edits["--expert-tensor-parallel-size"] = etp
        edits["--context-parallel-size"] = cp
        edits["--micro-batch-size"] = int(knobs["--micro-batch-size"])
        edits["--num-virtual-stages-per-pipeline-rank"] = vp if vp > 1 else None
        edits["--num-layers-per-virtual-pipeline-stage"] = None
        if pp * vp > self.layers:
            raise Infeasible(f"PP {pp} x VP {vp} exceeds the {self.layers} layers")
        edits.update(_split_flags(self.layers, pp, vp, str(knobs["split"])))
        for f in _RECOMPUTE_FLAGS:
            edits[f] = None
        edits.update(RECOMPUTE[knobs["--recompute-granularity"]])  # type: ignore[index]
        # co-changes the launcher applies (Appendix E)
        if tp == 1:
            edits["--sequence-parallel"] = None
            edits["--tp-comm-overlap"] = None
        else:
            edits["--sequence-parallel"] = True
        if knobs["dispatcher"] == "deepep":
            edits["--moe-token-dispatcher-type"] = "flex"
            edits["--moe-flex-dispatcher-backend"] = "deepep"
            edits["--moe-shared-expert-overlap"] = None
            # offered within a node only on GLM-4.5: it cannot initialise across nodes there
            if self.model == "glm-4.5" and ep * etp > self.gpus_per_node:
                raise Infeasible("DeepEP is offered only within a node on GLM-4.5")
        else:
            edits["--moe-token-dispatcher-type"] = "alltoall"
            edits["--moe-flex-dispatcher-backend"] = None
        if "offload" in knobs:
            on = knobs["offload"] == "on"
            edits["--optimizer-cpu-offload"] = True if on else None
            edits["--overlap-cpu-optimizer-d2h-h2d"] = True if on else None
        args = apply_overrides(self.baseline_args, {k: v for k, v in edits.items() if v is not None})
        for k, v in edits.items():
            if v is None:
                args.pop(k, None)
        if self.model == "glm-4.5":
            dense = tp * cp * (self.gpus // (tp * pp * cp)) if self.gpus % (tp * pp * cp) == 0 else 0
            if dense and dense % (ep * etp) == 0 and dense // (ep * etp) > 1:
                # the data-parallel overlaps hang with expert data parallelism > 1 on this stack
                args.pop("--overlap-grad-reduce", None)
                args.pop("--overlap-param-gather", None)
        return args


def knob_space(spec: CampaignSpec) -> KnobSpace:
    model = resolve_model(spec.model)
    if model.name not in SPACES:
        raise ValueError(f"no Table E1 search space for {model.name}; known: {sorted(SPACES)}")
    return KnobSpace(model.name, SPACES[model.name], dict(spec.baseline.args), model.layers, spec.cluster.gpus,
                     spec.cluster.gpus_per_node)


@dataclass
class LaunchRecord:
    run_id: str
    kind: str  # calibration | search | check | remeasure | reference
    changes: dict[str, ArgValue]
    outcome: str
    tokens_per_s_per_gpu: float | None
    charge_gpu_hours: float
    charged_to: str  # campaign | infra_reserve | evaluation
    promoted: bool = False
    reason: str | None = None


@dataclass
class SimControlPlane:
    """The driver's ControlPlane over the sim backend (see the module doc)."""

    spec: CampaignSpec
    space: KnobSpace
    backend: SimBackend
    run_root: Path
    gate_list: Any
    budget_gpu_hours: float
    concurrency: int = 1
    band: float = 0.03
    calibration_mean: float = 0.0
    expected_cost: float = 0.0  # one baseline launch
    reserve_gpu_hours: float = 0.0
    leader: float = 0.0
    leader_changes: dict[str, ArgValue] = field(default_factory=dict)
    spent: float = 0.0  # charged to the campaign (search launches and checks)
    records: list[LaunchRecord] = field(default_factory=list)
    tried: set[str] = field(default_factory=set)
    stop: dict[str, Any] | None = None
    _ids: Any = field(default_factory=lambda: itertools.count(1))

    # ---------------------------------------------------------------- the ControlPlane protocol
    def can_launch(self) -> bool:
        return self.spent + self.expected_cost <= self.budget_gpu_hours - self.reserve_gpu_hours

    def baseline_tps(self) -> float:
        return self.calibration_mean

    def leader_tps(self) -> float:
        return self.leader

    def record_stop(self, evidence: dict[str, Any]) -> None:
        self.stop = dict(evidence)

    def evaluate(self, candidate: Candidate, prune_below: float | None) -> Outcome:
        try:
            args = self.space.to_args(candidate.changes)
            build_recipe(resolve_model(self.spec.model), resolve_accelerator(self.spec.cluster.accelerator),
                         self.spec.cluster.gpus, args, self.spec.baseline.env, self.spec.cluster.gpus_per_node)
        except (Infeasible, RecipeError) as exc:
            return Outcome(run_id=None, outcome="refused", reason=f"infeasible: {exc}")
        key = repr(sorted(args.items(), key=lambda kv: kv[0]))
        if key in self.tried or args == dict(self.spec.baseline.args):
            return Outcome(run_id=None, outcome="refused", reason="identical recipe: already run")
        l1 = check_recipe(self.gate_list, self.spec.baseline.args, args, self.spec.baseline.env, self.spec.baseline.env)
        if not l1.passed:
            return Outcome(run_id=None, outcome="refused", reason=f"gate layer 1: {l1.summary()}")
        if not self.can_launch():
            return Outcome(run_id=None, outcome="refused", reason="budget: the next launch does not fit", code="budget")
        self.tried.add(key)
        rec = self.launch(args, "search", changes=dict(candidate.changes), prune_below=prune_below)
        promoted = False
        if rec.outcome == "ok" and rec.tokens_per_s_per_gpu and measure.beats(rec.tokens_per_s_per_gpu, self.leader,
                                                                               self.band):
            self.leader = rec.tokens_per_s_per_gpu
            self.leader_changes = dict(candidate.changes)
            promoted = True
        rec.promoted = promoted
        return Outcome(run_id=rec.run_id, outcome=rec.outcome, tokens_per_s_per_gpu=rec.tokens_per_s_per_gpu,
                       valid=rec.outcome == "ok", promoted=promoted, reason=rec.reason,
                       extra={"charge_gpu_hours": rec.charge_gpu_hours, "args": args})

    # ---------------------------------------------------------------- launching
    def launch(self, args: dict[str, ArgValue], kind: str, changes: dict[str, ArgValue] | None = None,
               prune_below: float | None = None, steps: int | None = None, charged: bool = True) -> LaunchRecord:
        """Run one job to its end (or its pruning), score and charge it; one infrastructure retry."""
        rec = self._launch_once(args, kind, changes, prune_below, steps, charged)
        if rec.outcome == "infrastructure":
            rec.charged_to = "infra_reserve"
            self.records.append(rec)
            rec = self._launch_once(args, kind, changes, prune_below, steps, charged)
            if rec.outcome == "infrastructure":  # twice: a recipe failure, charged to the tuner
                rec.outcome = "crash"
                rec.reason = "failed on infrastructure twice"
                prev = self.records[-1]
                prev.charged_to = "campaign" if charged else "evaluation"
                if charged:
                    self.spent += prev.charge_gpu_hours
        self.records.append(rec)
        if rec.charged_to == "campaign":
            self.spent += rec.charge_gpu_hours
        return rec

    def _launch_once(self, args: dict[str, ArgValue], kind: str, changes: dict[str, ArgValue] | None,
                     prune_below: float | None, steps: int | None, charged: bool) -> LaunchRecord:
        rid = f"{kind[:3]}{next(self._ids):04d}"
        if steps is not None:
            args = {**args, "--train-iters": steps}
        run_dir = self.run_root / rid
        spec = self.spec
        job = JobSpec(job_id=rid, campaign=spec.name, argv=tuple(["pretrain_gpt.py", *render_argv(args)]),
                      env=dict(spec.baseline.env), workdir=self.run_root, run_dir=run_dir, gpus=spec.cluster.gpus,
                      gpus_per_node=spec.cluster.gpus_per_node)
        bid = self.backend.submit(job)
        pruned = False
        if prune_below is not None:
            pruned = self._watch_for_pruning(bid, job, prune_below)
        st = self.backend.wait(bid)
        started, ended = st.started_at or 0.0, st.ended_at or 0.0
        charge = measure.gpu_hours(job.gpus, ended - started)
        plan = self.backend.plan(bid)
        since = None
        if st.state == JobState.TIMEOUT and plan is not None:
            since = (ended - started) - plan.last_progress_s
        m = read_metrics(job.log_path, gpus=job.gpus, window=spec.workload.window, seq_length=spec.workload.seq_length,
                         global_batch_size=spec.workload.global_batch, exit_status=st.exit_code,
                         seconds_since_progress=since)
        if pruned:
            outcome, tps = "pruned", None
        elif st.state == JobState.INFRASTRUCTURE:
            outcome, tps = "infrastructure", None
        else:
            outcome = m.failure_class if m.failure_class != "ok" else ("ok" if m.valid else "crash")
            tps = m.tokens_per_s_per_gpu if outcome == "ok" else None
        return LaunchRecord(rid, kind, dict(changes or {}), outcome, tps, charge,
                            "campaign" if charged else "evaluation", reason=st.reason or m.verdict.reason)

    def _watch_for_pruning(self, bid: str, job: JobSpec, prune_below: float) -> bool:
        """The early-abort pruner: after four steady measured steps, stop a run below the mark."""
        first = self.spec.workload.window[0]  # steps 4.. are iterations 5..
        need_it = first + EARLY_ABORT_STEPS  # iteration of the fourth measured step
        while True:
            st = self.backend.status(bid)
            if st.state.finished:
                return False
            text = job.log_path.read_text(encoding="utf-8", errors="replace")
            if f"iteration {need_it:8d}/" not in text:
                continue
            m = read_metrics(job.log_path, gpus=job.gpus, window=(first, first + EARLY_ABORT_STEPS - 1),
                             seq_length=self.spec.workload.seq_length,
                             global_batch_size=self.spec.workload.global_batch)
            tps = m.tokens_per_s_per_gpu
            if tps is not None and tps < prune_below:
                self.backend.cancel(bid)
                return True
            return False


@dataclass
class CampaignResult:
    model: str
    tuner: str
    seed: int
    budget_gpu_hours: float
    calibration_mean: float
    band: float
    gain: float  # re-measured shipped recipe over the re-measured baseline
    shipped_changes: dict[str, ArgValue]
    search_best_gain: float  # best search-time throughput over the calibration mean
    gpu_hours_used: float  # search launches and correctness checks
    launches: int
    failed_launches: int
    failed_gpu_hours: float
    pruned: int
    refused: int
    checks: int
    stop_reason: str
    wall_seconds: float
    records: list[LaunchRecord] = field(default_factory=list)

    @property
    def failed_share(self) -> float:
        return self.failed_launches / self.launches if self.launches else 0.0

    def as_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k != "records"}
        d["failed_share"] = self.failed_share
        return d


def make_tuner(name: str, space: KnobSpace, seed: int, prefilter: Callable[[dict[str, ArgValue]], str | None] | None
               ) -> Tuner:
    base = space.baseline()
    if name == "heuristic":
        return HeuristicTuner(space.space, base, seed, priority=PRIORITY)
    if name == "tpe":
        return TPETuner(space.space, base, seed)
    if name == "tpe-prefilter":
        return TPETuner(space.space, base, seed, prefilter=prefilter)
    if name == "random":
        return RandomTuner(space.space, base, seed)
    raise ValueError(f"unknown tuner {name!r}; expected heuristic, tpe, tpe-prefilter or random")


def memory_prefilter(spec: CampaignSpec, space: KnobSpace, margin: float) -> Callable[[dict[str, ArgValue]], str | None]:
    """The analytical pre-filter: reject a draw whose estimate x (1 + margin) exceeds the GPU's memory."""
    model = resolve_model(spec.model)
    acc = resolve_accelerator(spec.cluster.accelerator)
    base = space.baseline()

    def check(full: dict[str, ArgValue]) -> str | None:
        if all(full.get(k) == v for k, v in base.items()):
            return None  # the baseline is exempt
        try:
            args = space.to_args(full)
            r = build_recipe(model, acc, spec.cluster.gpus, args, spec.baseline.env, spec.cluster.gpus_per_node)
        except (Infeasible, RecipeError) as exc:
            return f"infeasible: {exc}"
        est = memory_estimate(model, r.layout, memory_options(r, margin))
        if not est.fits:
            return f"estimated {est.peak.with_margin_bytes / 2**30:.1f} GiB with a {margin:.1%} margin exceeds the GPU"
        return None

    return check


def run_campaign(
    model: str,
    tuner: str,
    seed: int,
    *,
    run_root: Path | None = None,
    infra_fault_rate: float = 0.0,
    budget_gpu_hours: float | None = None,
    calibration_runs: int = 5,
) -> CampaignResult:
    """One simulated campaign of `tuner` on `model` at the paper's budget (Table D1)."""
    t0 = time.perf_counter()
    spec = load_spec(CAMPAIGNS[resolve_model(model).name])
    space = knob_space(spec)
    settings = {**spec.cluster.settings, "seed": seed * 1000 + 17, "infra_fault_rate": infra_fault_rate}
    backend = SimBackend(**settings)
    root = Path(run_root) if run_root else Path(tempfile.mkdtemp(prefix=f"sim-{space.model}-{tuner}-{seed}-"))
    root.mkdir(parents=True, exist_ok=True)
    gl = load_list(spec.gate.lists or space.model)
    budget = budget_gpu_hours or spec.budget.gpu_hours or 0.0
    plane = SimControlPlane(spec, space, backend, root, gl, budget, concurrency=1)
    base_args = dict(spec.baseline.args)
    # calibration: five baseline runs on distinct allocations (before the campaign's budget)
    cal = [plane.launch(base_args, "calibration", charged=False) for _ in range(calibration_runs)]
    values = [r.tokens_per_s_per_gpu for r in cal if r.tokens_per_s_per_gpu]
    calib = measure.calibrate(values, spec.band.floor, spec.band.k_sigma)
    plane.calibration_mean = calib.mean
    plane.band = calib.band
    plane.leader = calib.mean
    plane.expected_cost = statistics.fmean(r.charge_gpu_hours for r in cal)
    # the baseline's cached 20-step reference curve and resolved arguments (for the correctness checks)
    ref = plane.launch(base_args, "reference", steps=spec.gate.convergence_steps, charged=False)
    ref_log = root / ref.run_id / "log.txt"
    base_losses = read_losses(ref_log)
    base_resolved = read_resolved_args(ref_log)
    plane.reserve_gpu_hours = spec.budget.check_reserve_runs * ref.charge_gpu_hours
    prefilter = memory_prefilter(spec, space, PREFILTER_MARGIN.get(space.model, 0.1))
    tun = make_tuner(tuner, space, seed, prefilter)
    res = drive(tun, plane, early_abort=tuner in ("tpe", "tpe-prefilter", "random"))
    # shipping: up to three candidates beating the baseline by more than the band, fastest first
    search = [r for r in plane.records if r.kind == "search"]
    winners = sorted((r for r in search if r.outcome == "ok" and r.tokens_per_s_per_gpu
                      and measure.beats(r.tokens_per_s_per_gpu, calib.mean, calib.band)),
                     key=lambda r: -(r.tokens_per_s_per_gpu or 0.0))[:3]
    shipped: dict[str, ArgValue] = {}
    shipped_args = base_args
    checks = 0
    for w in winners:
        args = space.to_args(w.changes)
        chk = plane.launch(args, "check", steps=spec.gate.convergence_steps)
        checks += 1
        if chk.outcome != "ok":
            continue
        log = root / chk.run_id / "log.txt"
        l1 = check_resolved(gl, base_resolved, read_resolved_args(log), spec.baseline.env, spec.baseline.env)
        conv = check_convergence(base_losses, read_losses(log))
        if l1.passed and conv.passed:
            shipped, shipped_args = dict(w.changes), args
            break
    # final re-measurement: the shipped recipe and the baseline twice more (the evaluation's cost)
    if shipped:
        again = [plane.launch(shipped_args, "remeasure", charged=False) for _ in range(2)]
        base_again = [plane.launch(base_args, "remeasure", charged=False) for _ in range(2)]
        s_tps = [r.tokens_per_s_per_gpu for r in again if r.tokens_per_s_per_gpu]
        b_tps = [r.tokens_per_s_per_gpu for r in base_again if r.tokens_per_s_per_gpu]
        gain = statistics.fmean(s_tps) / statistics.fmean(b_tps) - 1.0 if s_tps and b_tps else 0.0
    else:
        gain = 0.0
    failed = [r for r in search if r.outcome in ("oom", "hang", "crash")]
    best = max((r.tokens_per_s_per_gpu or 0.0 for r in search), default=0.0)
    return CampaignResult(
        model=space.model, tuner=tuner, seed=seed, budget_gpu_hours=budget, calibration_mean=calib.mean,
        band=calib.band, gain=gain, shipped_changes=shipped,
        search_best_gain=max(0.0, best / calib.mean - 1.0) if best else 0.0,
        gpu_hours_used=plane.spent, launches=res.launches, failed_launches=len(failed),
        failed_gpu_hours=sum(r.charge_gpu_hours for r in failed), pruned=res.pruned, refused=res.refused,
        checks=checks, stop_reason=res.stop_reason, wall_seconds=time.perf_counter() - t0, records=plane.records,
    )
