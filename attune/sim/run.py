"""One simulated training job, from its command line to its log lines on the simulated clock.

`plan_run` decides everything about a job when it starts: the outcome the estimate predicts (with
the world's defects), every step's duration (the model's step time x a per-run throughput factor x
a small per-step jitter, step 0 and steps 1-3 slower as in real runs), the loss curve, an
infrastructure fault at the configured rate, and the Megatron-LM log lines with the moment each one
is written. The backend then releases the lines as its clock passes them.

Charging follows the paper: a job holds its GPUs from start to release, start-up included; a failed
job is released where it fails (argument errors after seconds, out of memory at model construction
or in step 0, a hang when the NCCL watchdog aborts it, a stall when the cluster's no-progress watchdog
or the time limit kills it, or a step so slow that the log does not advance for `hang_kill_s`).
"""

from __future__ import annotations

import hashlib
import itertools
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from attune.sim import megatron_log as ml
from attune.sim.api import args_from_command, resolve_accelerator, resolve_model
from attune.sim.constants import DEFAULT, Constants
from attune.sim.estimate import Estimate, estimate_recipe
from attune.sim.loss import LossModel
from attune.sim.memory import MemoryReport
from attune.sim.recipe import (
    ArgValue,
    RecipeError,
    SimRecipe,
    build_recipe,
    resolved_arguments,
    unmodelled_flags,
)

MIB = 1024.0


class SimSettings(BaseModel):
    """The simulated cluster: the campaign's `cluster.settings` when `cluster.backend` is sim."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(min_length=1, description="model name from skills/attune/catalog/models.yaml")
    accelerator: str = Field(min_length=1, description="H100, H200 or B200")
    nodes: int | None = Field(None, gt=0, description="nodes in the cluster (None: as many as a job asks)")
    gpus_per_node: int = Field(8, gt=0)
    seed: int = Field(0, description="seeds every random draw (noise, faults, the run-to-run loss noise)")
    throughput_noise: float = Field(0.01, ge=0, lt=0.5, description="relative sigma of a run's throughput")
    step_jitter: float = Field(0.002, ge=0, lt=0.2, description="relative sigma of one step's time within a run")
    startup_s: float = Field(480.0, ge=0, description="launch, checkpoint load and set-up before step 0")
    crash_after_s: float = Field(45.0, ge=0, description="when argument validation fails after launch")
    nccl_timeout_s: float = Field(600.0, gt=0, description="the NCCL watchdog's collective timeout")
    hang_kill_s: float = Field(1800.0, gt=0, description="the cluster kills a job without log progress this long")
    time_limit_s: float | None = Field(None, gt=0, description="default time limit of a job")
    infra_fault_rate: float = Field(0.0, ge=0, description="node failures per node-hour")
    epoch: float = Field(1_790_000_000.0, description="the simulated clock's start, epoch seconds")
    deepep_internode: bool = Field(False, description="whether DeepEP can initialise across nodes")
    profile_overhead: float = Field(0.05, ge=0, description="profiled steps run this much longer")
    constants: dict[str, float] = Field(default_factory=dict, description="overrides of attune.sim.constants")

    @field_validator("model")
    @classmethod
    def _known_model(cls, v: str) -> str:
        resolve_model(v)
        return v

    @field_validator("accelerator")
    @classmethod
    def _known_acc(cls, v: str) -> str:
        resolve_accelerator(v)
        return v

    def constants_obj(self) -> Constants:
        return DEFAULT.with_overrides(**self.constants) if self.constants else DEFAULT


def _rng(*key: object) -> random.Random:
    h = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return random.Random(int.from_bytes(h, "big"))


@dataclass
class RunPlan:
    """Everything that will happen to one job, relative to its start."""

    outcome: str  # ok | oom | hang | crash | infrastructure
    state: str  # completed | failed | timeout | infrastructure
    exit_code: int | None
    duration_s: float  # start to release
    lines: list[tuple[float, str]]  # (seconds after start, line)
    reason: str
    estimate: Estimate | None
    step_times_s: list[float] = field(default_factory=list)
    losses: dict[int, float] = field(default_factory=dict)
    last_progress_s: float = 0.0  # when the log last advanced
    write_traces: Callable[[Path], list[Path]] | None = None
    trace_at_s: float | None = None  # when the traces are complete (the profiled steps are done)


def plan_run(
    settings: SimSettings,
    job_key: str,
    argv: list[str] | tuple[str, ...],
    env: Mapping[str, str],
    gpus: int,
    start_epoch: float,
    nodes: list[str] | None = None,
    time_limit_s: float | None = None,
    args: Mapping[str, ArgValue] | None = None,
) -> RunPlan:
    """Plan one job started at `start_epoch` (simulated seconds)."""
    c = settings.constants_obj()
    model = resolve_model(settings.model)
    acc = resolve_accelerator(settings.accelerator)
    flags = dict(args) if args is not None else args_from_command(argv)
    nodes = nodes or []
    lines: list[tuple[float, str]] = []

    def at(t: float, text: str) -> None:
        lines.append((t, text))

    at(0.0, f"[sim] simulated {settings.accelerator} cluster (a test bed, not a real GPU): job {job_key} on "
            f"{len(nodes) or -(-gpus // settings.gpus_per_node)} node(s) {','.join(nodes[:4])}"
            f"{'...' if len(nodes) > 4 else ''}")
    limit = time_limit_s or settings.time_limit_s
    try:
        recipe = build_recipe(model, acc, gpus, flags, env, settings.gpus_per_node)
    except RecipeError as exc:
        t = settings.crash_after_s
        for line in ml.traceback_lines(0, f"AssertionError: {exc}", "megatron/training/arguments.py"):
            at(t, line)
        return _finish(RunPlan("crash", "failed", 1, t + 1.0, lines, f"AssertionError: {exc}", None,
                               last_progress_s=t), settings, job_key, nodes, start_epoch, limit)
    at(2.0, ml.parallel_sizes_line(gpus, recipe.dp, recipe.cp, recipe.tp, recipe.pp))
    unknown = unmodelled_flags(flags)
    if unknown:
        at(2.0, f"[sim] WARNING: flags the simulator does not model (no effect here): {' '.join(unknown)}")
    for line in ml.arguments_block(resolved_arguments(recipe)):
        at(3.0, line)
    est = estimate_recipe(recipe, c, settings.deepep_internode)
    startup = settings.startup_s
    rank_fail = recipe.first_rank_of_stage(est.memory.peak.stage) if est.memory else 0
    failed = _failure_at_start(est, settings, rank_fail, lines)
    if failed is not None:
        return _finish(failed, settings, job_key, nodes, start_epoch, limit)
    at(startup, f"[after model, optimizer, and learning rate scheduler are built] datetime: "
                f"{ml.timestamp(start_epoch + startup)}")
    at(startup, "training ...")
    # a nominal step for failures in step 0 (the step-time model only runs for runnable recipes)
    nominal = est.step.seconds if est.step else 60.0
    warm0 = nominal * (1.0 + c.warmup_step0)
    failed = _failure_in_step0(est, settings, rank_fail, warm0, lines)
    if failed is not None:
        return _finish(failed, settings, job_key, nodes, start_epoch, limit)
    # ---- it runs
    assert est.step is not None
    rng = _rng(settings.seed, job_key, "throughput")
    factor = 1.0 + settings.throughput_noise * rng.gauss(0.0, 1.0)
    factor = max(factor, 0.5)
    loss_model = LossModel(recipe, tuple(est.defects))
    lr = _learning_rate(flags)
    t = startup
    step_times: list[float] = []
    losses: dict[int, float] = {}
    prof_start, prof_end = recipe.profile_steps
    trace_at = None
    mem = est.memory
    for k in range(recipe.train_iters):
        it = k + 1
        s = _step_seconds(k, est.step.seconds, factor, c, settings, rng, recipe)
        t += s
        step_times.append(s)
        loss = loss_model.lm_loss(k, f"{settings.seed}/{job_key}")
        losses[it] = loss
        extra = {}
        aux = loss_model.aux_loss(k, f"{settings.seed}/{job_key}")
        if aux is not None:
            extra["load_balancing_loss"] = aux
        tflops = est.step.flops_per_token * recipe.tokens_per_step / (recipe.gpus * s) / 1e12
        at(t, ml.iteration_line(epoch_s=start_epoch + t, iteration=it, train_iters=recipe.train_iters,
                                gbs=recipe.gbs, step_ms=s * 1e3, tflops=tflops, lr=lr, lm_loss=loss,
                                extra_losses=extra, grad_norm=0.6 + 0.3 * abs(rng.gauss(0, 1))))
        if it == 1 and mem is not None:
            lines.extend((t, line) for line in _memory_lines(mem, rng))
        if recipe.profile and k == prof_end - 1:
            trace_at = t
    at(t + 3.0, f"[after training is done] datetime: {ml.timestamp(start_epoch + t + 3.0)}")
    hung = _watchdog(settings, startup, step_times, lines, est)
    if hung is not None:
        return _finish(hung, settings, job_key, nodes, start_epoch, limit)
    plan = RunPlan("ok", "completed", 0, t + 5.0, lines, est.reason, est, step_times, losses, last_progress_s=t)
    if recipe.profile and trace_at is not None:
        from attune.sim.kineto import trace_writer

        plan.write_traces = trace_writer(recipe, est, step_times, prof_start, prof_end, start_epoch, startup, factor)
        plan.trace_at_s = trace_at
    return _finish(plan, settings, job_key, nodes, start_epoch, limit)


def _learning_rate(flags: Mapping[str, ArgValue]) -> float:
    return float(flags.get("--lr") or 1e-6) if not isinstance(flags.get("--lr"), bool) else 1e-6


def _step_seconds(k: int, base_s: float, factor: float, c: Constants, settings: SimSettings, rng: random.Random,
                  recipe: SimRecipe) -> float:
    """Step k's time: the model's step over the run's noise factor, warm-up, jitter and profiler overhead."""
    warm = 1.0 + (c.warmup_step0 if k == 0 else c.warmup_steps13 if k <= 3 else 0.0)
    s = base_s / factor * warm * (1.0 + settings.step_jitter * rng.gauss(0.0, 1.0))
    prof_start, prof_end = recipe.profile_steps
    if recipe.profile and prof_start <= k < prof_end:
        s *= 1.0 + settings.profile_overhead
    return s


def _memory_lines(mem: MemoryReport, rng: random.Random) -> list[str]:
    """The memory report Megatron prints after the first step, one line per pipeline stage's first rank."""
    out = []
    for st in mem.stages:
        jitter = 1.0 + 0.002 * rng.gauss(0.0, 1.0)
        out.append(ml.memory_line(st.first_rank, 1, st.allocated_gib * MIB, st.peak_gib * MIB * jitter,
                                  st.reserved_gib * MIB * jitter, st.reserved_gib * MIB * jitter))
    return out


def _failure_at_start(est: Estimate, settings: SimSettings, rank_fail: int,
                      lines: list[tuple[float, str]]) -> RunPlan | None:
    """A crash at start-up or an OOM while the model is built (None: the job gets to training)."""
    startup = settings.startup_s

    def at(t: float, text: str) -> None:
        lines.append((t, text))

    if est.outcome == "crash" and est.failure_at == "start":
        t = startup * 0.5
        for line in ml.traceback_lines(rank_fail, est.reason, "megatron/core/transformer/moe/token_dispatcher.py"):
            at(t, line)
        return RunPlan("crash", "failed", 1, t + 2.0, lines, est.reason, est, last_progress_s=t)
    if est.outcome == "oom" and est.failure_at == "init":
        t = startup * 0.8
        for line in ml.traceback_lines(rank_fail, _oom_text(est), "megatron/training/training.py"):
            at(t, line)
        return RunPlan("oom", "failed", 1, t + 2.0, lines, est.reason, est, last_progress_s=t)
    return None


def _failure_in_step0(est: Estimate, settings: SimSettings, rank_fail: int, warm0: float,
                      lines: list[tuple[float, str]]) -> RunPlan | None:
    """An OOM, a crash or a hang in the first step (None: the job runs)."""
    startup = settings.startup_s

    def at(t: float, text: str) -> None:
        lines.append((t, text))

    if est.outcome == "oom":
        t = startup + 0.6 * warm0
        for line in ml.traceback_lines(rank_fail, _oom_text(est), "megatron/core/pipeline_parallel/schedules.py"):
            at(t, line)
        return RunPlan("oom", "failed", 1, t + 2.0, lines, est.reason, est, last_progress_s=startup)
    if est.outcome == "crash":
        t = startup + 0.3 * warm0
        for line in ml.traceback_lines(rank_fail, est.reason, "transformer_engine/pytorch/module/rmsnorm.py"):
            at(t, line)
        return RunPlan("crash", "failed", 1, t + 2.0, lines, est.reason, est, last_progress_s=startup)
    if est.outcome == "hang":
        if est.stall:
            t = startup + settings.hang_kill_s
            at(t, f"[sim] no log progress for {settings.hang_kill_s:.0f} s: the cluster's watchdog cancels the job "
                  f"as hung ({est.reason})")
            return RunPlan("hang", "timeout", None, t, lines, est.reason, est, last_progress_s=startup)
        t = startup + settings.nccl_timeout_s
        ms = int(settings.nccl_timeout_s * 1000)
        for rk in sorted({0, rank_fail}):
            at(t, f"[rank{rk}]:[E ProcessGroupNCCL.cpp:632] [Rank {rk}] Watchdog caught collective operation "
                  f"timeout: WorkNCCL(SeqNum=17, OpType=ALLTOALL_BASE, NumelIn=8388608, NumelOut=8388608, "
                  f"Timeout(ms)={ms}) ran for {ms + 12} milliseconds before timing out.")
        at(t + 1.0, "terminate called after throwing an instance of 'c10::DistBackendError'")
        return RunPlan("hang", "failed", 134, t + 5.0, lines, est.reason, est, last_progress_s=startup)
    return None


def _watchdog(settings: SimSettings, startup: float, step_times: list[float], lines: list[tuple[float, str]],
              est: Estimate) -> RunPlan | None:
    """The cluster's watchdog: a job whose log does not advance for hang_kill_s is cancelled as hung."""
    progress = [startup] + [startup + sum(step_times[: i + 1]) for i in range(len(step_times))]
    for prev, nxt in itertools.pairwise(progress):
        if nxt - prev > settings.hang_kill_s:
            kill = prev + settings.hang_kill_s
            kept = [(tt, line) for tt, line in lines if tt <= prev]
            kept.append((kill, f"[sim] no log progress for {settings.hang_kill_s:.0f} s: the cluster's watchdog "
                               f"cancels the job as hung (a step takes {nxt - prev:.0f} s)"))
            return RunPlan("hang", "timeout", None, kill, kept, "no log progress (a step outlasts the watchdog)",
                           est, step_times, {}, last_progress_s=prev)
    return None


def _oom_text(est: Estimate) -> str:
    cap = est.memory.capacity_gib if est.memory else 0.0
    need = est.memory.peak.peak_gib if est.memory else 0.0
    return (f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {max(need - cap, 0.25) + 0.5:.2f} GiB. "
            f"GPU 0 has a total capacity of {cap:.2f} GiB of which {0.31:.2f} GiB is free. "
            f"Of the allocated memory {cap - 1.2:.2f} GiB is allocated by PyTorch.")


def _finish(plan: RunPlan, settings: SimSettings, job_key: str, nodes: list[str], start_epoch: float,
            limit: float | None) -> RunPlan:
    """Apply the time limit and an infrastructure fault (drawn at the configured rate)."""
    n_nodes = max(1, len(nodes))
    if settings.infra_fault_rate > 0:
        rng = _rng(settings.seed, job_key, "infra")
        hours = plan.duration_s / 3600.0
        p = 1.0 - pow(2.718281828459045, -settings.infra_fault_rate * n_nodes * hours)
        if rng.random() < p:
            t = rng.uniform(0.05, 0.95) * plan.duration_s
            bad = nodes[rng.randrange(len(nodes))] if nodes else "sim-node-000"
            kept = [(tt, line) for tt, line in plan.lines if tt < t]
            kept.append((t, f"[rank0]: RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:2017, unhandled system "
                            f"error (run with NCCL_DEBUG=INFO for details), NCCL version 2.28.9 ({bad})"))
            kept.append((t + 1.0, f"slurmstepd: error: *** JOB {job_key} ON {bad} CANCELLED AT "
                                  f"{ml.timestamp(start_epoch + t + 1.0)[:19]} DUE TO NODE FAILURE ***"))
            return RunPlan("infrastructure", "infrastructure", None, t + 1.0, kept, f"node failure on {bad}",
                           plan.estimate, list(plan.step_times_s), {}, last_progress_s=min(plan.last_progress_s, t))
    if limit is not None and plan.duration_s > limit:
        kept = [(tt, line) for tt, line in plan.lines if tt < limit]
        kept.append((limit, f"slurmstepd: error: *** JOB {job_key} ON {nodes[0] if nodes else 'sim-node-000'} "
                            f"CANCELLED AT {ml.timestamp(start_epoch + limit)[:19]} DUE TO TIME LIMIT ***"))
        outcome = plan.outcome if plan.outcome != "ok" else "hang"
        return RunPlan(outcome, "timeout", None, limit, kept, f"time limit ({limit:.0f} s)", plan.estimate,
                       plan.step_times_s, plan.losses, last_progress_s=min(plan.last_progress_s, limit))
    return plan

