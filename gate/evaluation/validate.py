"""The gate's validation on tinygpt: runs whose answer is known (in the spirit of the paper's Table 5).

Every case is a real tinygpt training run on the validation workload (60 steps, ``DENSE_BASE``;
``examples/tinygpt/train.py``, ``torchrun`` for two data-parallel ranks), compared with a baseline run on the same data and seed, and with the
noise envelope of that baseline's replicate check runs (`gate.noise`):

- legitimate runs (replicates, single structural or same-math changes) must pass both layers;
- objective-changing arguments must be refused by layer 1 (they are still run, outside any
  campaign, to show what layer 2 alone would have said);
- injected code faults (``TINYGPT_FAULT``; a fault lives in code, so layer 1 cannot see it and the
  switch is not part of the recipe or its recorded environment) should be caught by layer 2;
  the ones it misses are reported as missed, with how far they moved the loss.

Layer 1 runs twice per case: on the recipe (the dry run before launch) and on the resolved
arguments both runs print. ``attune gate validate`` prints the table; docs/gate.md shows one.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from attune.core.recipe import render_args
from attune.readers.metrics import read_losses, read_resolved_args
from gate import config_check, convergence, judge, lists, noise

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "examples" / "tinygpt" / "train.py"
FRAMEWORK = "megatron-lm"  # tinygpt logs in Megatron-LM's format

# The validation workload (pinned; docs/gate.md). At the example's campaign setting (4 layers, lr 1e-3,
# 20 steps) tinygpt learns little beyond unigram statistics, which most faults leave intact. Here a
# higher learning rate (5e-3 after 3 warm-up steps), untied output weights and a 60-step check run take
# the loss from 5.96 to about 2.97: past the unigram plateau (3.3) into context, where faults show.
DENSE_BASE: dict[str, Any] = {
    "--num-layers": 2, "--hidden-size": 128, "--num-attention-heads": 4, "--seq-length": 64,
    "--micro-batch-size": 4, "--global-batch-size": 16, "--lr": 5e-3, "--lr-warmup-iters": 3,
    "--untie-embeddings-and-output-weights": True, "--seed": 1234,
}
DEFAULT_STEPS = 60
MOE_BASE: dict[str, Any] = {**DENSE_BASE, "--num-experts": 4, "--moe-router-topk": 2}
QUICK_SHAPE: dict[str, Any] = {"--hidden-size": 64}
BASE_ENV = {"OMP_NUM_THREADS": "1"}
# Replicate check runs of each baseline that set the noise envelope (as shipping does: two, so that
# the baseline and its replicates give three pairs, the fewest from which a spread can be read).
REPLICATES = 2

Group = Literal["legitimate", "argument", "fault"]


class Case(BaseModel):
    name: str
    group: Group
    description: str
    baseline: Literal["dense", "moe"] = "dense"
    changes: dict[str, Any] = Field(default_factory=dict, description="Flag changes to the baseline recipe.")
    nproc: int = 1
    fault_env: dict[str, str] = Field(default_factory=dict, description="Code-fault switches (not config).")
    quick: bool = Field(default=False, description="Part of the small CI selection.")

    @property
    def expected(self) -> str:
        return {"legitimate": "pass", "argument": "refused (layer 1)", "fault": "caught (layer 2)"}[self.group]


def _fault(name: str, **extra: str) -> dict[str, str]:
    return {"TINYGPT_FAULT": name, **extra}


CASES: list[Case] = [
    Case(name="replicate-1", group="legitimate", description="baseline replicate, same data and seed", quick=True),
    Case(name="replicate-2", group="legitimate", description="baseline replicate, same data and seed"),
    Case(name="data-parallel-2", group="legitimate", description="2 data-parallel ranks (torchrun)", nproc=2,
         quick=True),
    Case(name="dp2-microbatch-1", group="legitimate", description="2 ranks, 1 row per microbatch", nproc=2,
         changes={"--micro-batch-size": 1}),
    Case(name="dp2-buckets-overlap", group="legitimate", description="2 ranks, small buckets, overlapped reduction",
         nproc=2, changes={"--ddp-bucket-size": 20000, "--overlap-grad-reduce": True}),
    Case(name="microbatch-2", group="legitimate", description="2 rows per microbatch (was 4)",
         changes={"--micro-batch-size": 2}),
    Case(name="microbatch-16", group="legitimate", description="the whole batch in one microbatch",
         changes={"--micro-batch-size": 16}),
    Case(name="buckets-small", group="legitimate", description="gradient buckets of 20000 elements",
         changes={"--ddp-bucket-size": 20000}),
    Case(name="recompute-full", group="legitimate", description="full activation recomputation",
         changes={"--recompute-granularity": "full"}),
    Case(name="recompute-block", group="legitimate", description="full recomputation of the first layer only",
         changes={"--recompute-granularity": "full", "--recompute-method": "block", "--recompute-num-layers": 1}),
    Case(name="recompute-selective", group="legitimate", description="selective (attention) recomputation",
         changes={"--recompute-granularity": "selective"}),
    Case(name="threads-2", group="legitimate", description="2 intra-op threads", changes={"--num-threads": 2}),
    Case(name="optimizer-foreach", group="legitimate", description="foreach AdamW (same-math swap, tested)",
         changes={"--optimizer-impl": "foreach"}),
    Case(name="optimizer-fused", group="legitimate", description="fused AdamW (same-math swap, tested)",
         changes={"--optimizer-impl": "fused"}),
    Case(name="moe-replicate", group="legitimate", description="MoE baseline replicate", baseline="moe"),
    Case(name="moe-data-parallel-2", group="legitimate", description="MoE, 2 data-parallel ranks", baseline="moe",
         nproc=2),
    Case(name="moe-recompute-full", group="legitimate", description="MoE, full activation recomputation",
         baseline="moe", changes={"--recompute-granularity": "full"}),
    Case(name="moe-optimizer-foreach", group="legitimate", description="MoE, foreach AdamW", baseline="moe",
         changes={"--optimizer-impl": "foreach"}),
    Case(name="lr-x2", group="argument", description="learning rate x2", changes={"--lr": 1e-2}, quick=True),
    Case(name="global-batch-32", group="argument", description="global batch 16 -> 32",
         changes={"--global-batch-size": 32}),
    Case(name="grad-reduce-bf16", group="argument", description="gradients accumulated and reduced in BF16",
         changes={"--grad-reduce-in-bf16": True}),
    Case(name="bf16", group="argument", description="BF16 compute", changes={"--bf16": True}),
    Case(name="seed", group="argument", description="another seed", changes={"--seed": 4321}),
    Case(name="eod-mask-loss", group="argument", description="no loss on end-of-text positions",
         changes={"--eod-mask-loss": True}),
    Case(name="warmup-6", group="argument", description="6 warm-up steps (was 3)", changes={"--lr-warmup-iters": 6}),
    Case(name="clip-grad-0.5", group="argument", description="gradient clipping at 0.5 (was 1.0)",
         changes={"--clip-grad": 0.5}),
    Case(name="moe-aux-loss-x10", group="argument", description="MoE load-balancing coefficient x10",
         baseline="moe", changes={"--moe-aux-loss-coeff": 0.1}),
    Case(name="moe-microbatch-2", group="argument", description="MoE, 2 rows per microbatch (per-microbatch loss)",
         baseline="moe", changes={"--micro-batch-size": 2}),
    Case(name="torch-compile", group="argument",
         description="torch.compile (same-math swap whose component test failed)", changes={"--torch-compile": True}),
    Case(name="labels-offset", group="fault", description="labels offset by one more token",
         fault_env=_fault("labels-offset"), quick=True),
    Case(name="loss-mask-shift", group="fault", description="loss mask shifted by one token, count kept",
         fault_env=_fault("loss-mask-shift")),
    Case(name="skip-bucket-reduce-0", group="fault", description="2 ranks, first gradient bucket not reduced",
         nproc=2, fault_env=_fault("skip-bucket-reduce", TINYGPT_FAULT_BUCKET="0")),
    Case(name="skip-bucket-reduce-1", group="fault", description="2 ranks, second gradient bucket not reduced",
         nproc=2, fault_env=_fault("skip-bucket-reduce", TINYGPT_FAULT_BUCKET="1")),
    Case(name="moe-dropped-aux-loss", group="fault", description="MoE load-balancing (aux) loss dropped",
         baseline="moe", fault_env=_fault("zero-lb-loss")),
    Case(name="wrong-attention-mask", group="fault", description="causal mask off by one (sees the next token)",
         fault_env=_fault("wrong-attention-mask")),
    Case(name="stale-gradient", group="fault", description="optimizer steps with the previous step's gradient",
         fault_env=_fault("stale-gradient")),
    Case(name="scaled-loss", group="fault", description="gradient of 0.25 x the loss (logged loss unscaled)",
         fault_env=_fault("scaled-loss")),
    Case(name="wrong-position-ids", group="fault", description="every position id is 0",
         fault_env=_fault("wrong-position-ids")),
]


class RunInfo(BaseModel):
    log: str
    returncode: int
    seconds: float


class Row(BaseModel):
    run: str
    group: Group
    description: str
    expected: str
    list: str
    layer1: str = Field(description="'pass' or 'refused: <argument [class]>, ...' (recipe and resolved checks)")
    layer1_recipe_passed: bool
    layer1_resolved_passed: bool | None
    layer2: str = Field(description="the gate's layer-2 verdict: 'pass', 'rejected: <why>', or 'no run'")
    layer2_passed: bool | None
    reference: str = Field(description="the reference rule alone: 'pass', 'rejected: <checks>', or 'no run'")
    reference_passed: bool | None
    noise_aware: str = Field(description="the noise-aware check alone: 'pass', 'rejected: <checks>', or 'no run'")
    noise_aware_passed: bool | None
    max_rel_dev: float | None
    final_rel_dev: float | None
    mean_z: float | None = Field(description="the candidate's mean difference from the baseline, in noise units")
    correlation: float | None
    gate: Literal["passes", "rejects"]
    outcome: Literal["correct", "false reject", "missed", "caught", "refused"]
    reference_outcome: Literal["correct", "false reject", "missed", "caught", "refused"] | None = Field(
        description="what the outcome would be with the reference rule alone as layer 2")
    run_info: RunInfo | None = None


class ValidationReport(BaseModel):
    steps: int
    quick: bool
    workload: dict[str, Any]
    replicates: int
    envelopes: dict[str, dict[str, Any]] = Field(description="per baseline: the noise envelope's basis and pairs")
    rows: list[Row]
    baselines: dict[str, RunInfo]
    summary: dict[str, Any]


def _run(args: dict[str, Any], nproc: int, env_extra: dict[str, str], log: Path) -> RunInfo:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TINYGPT_")}
    env.update(env_extra)
    if nproc > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               str(TRAIN), *render_args(args)]
    else:
        cmd = [sys.executable, str(TRAIN), *render_args(args)]
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=str(REPO), timeout=1800)
    return RunInfo(log=str(log), returncode=proc.returncode, seconds=time.perf_counter() - t0)


def _resolved(log: Path) -> dict[str, str] | None:
    try:
        return read_resolved_args(log, FRAMEWORK)
    except ValueError:
        return None


def _names(result: config_check.ConfigCheckResult) -> list[str]:
    return [f"{r.name} [{r.klass}]" for r in result.refusals]


def run_validation(cases: list[Case] | None = None, steps: int = DEFAULT_STEPS, quick: bool = False,
                   workdir: Path | None = None, run_refused: bool = True, replicates: int = REPLICATES,
                   progress: Any = None) -> ValidationReport:
    """Run the cases (all, or the quick selection) and score the gate on them."""
    if not TRAIN.exists():
        raise FileNotFoundError(f"tinygpt is not in this checkout ({TRAIN})")
    selected = cases if cases is not None else [c for c in CASES if c.quick or not quick]
    own_tmp = workdir is None
    work = Path(tempfile.mkdtemp(prefix="gate-validate-")) if own_tmp else workdir
    work.mkdir(parents=True, exist_ok=True)
    shape = QUICK_SHAPE if quick else {}
    bases = {"dense": {**DENSE_BASE, **shape, "--train-iters": steps},
             "moe": {**MOE_BASE, **shape, "--train-iters": steps}}
    list_for = {"dense": lists.load_list("tinygpt"), "moe": lists.load_list("tinygpt-moe")}
    say = progress or (lambda _msg: None)
    try:
        base_runs: dict[str, RunInfo] = {}
        envelopes: dict[str, noise.NoiseEnvelope] = {}
        for kind in sorted({c.baseline for c in selected}):
            say(f"baseline {kind}")
            base_runs[kind] = _run(bases[kind], 1, BASE_ENV, work / f"baseline-{kind}.log")
            if base_runs[kind].returncode != 0:
                raise RuntimeError(f"the {kind} baseline run failed (rc {base_runs[kind].returncode}); "
                                   f"see {base_runs[kind].log}")
            reps = []
            for i in range(replicates):
                say(f"baseline {kind}: replicate check run {i + 1}/{replicates} (noise envelope)")
                info = _run(bases[kind], 1, BASE_ENV, work / f"baseline-{kind}-replicate-{i + 1}.log")
                if info.returncode != 0:
                    raise RuntimeError(f"a replicate of the {kind} baseline failed (rc {info.returncode}); "
                                       f"see {info.log}")
                reps.append((f"replicate-check-{i + 1}", "replicate", read_losses(info.log, FRAMEWORK)))
            cfg = noise.config_for(*noise.precision_from(_resolved(Path(base_runs[kind].log))))
            envelopes[kind] = noise.build_envelope(read_losses(base_runs[kind].log, FRAMEWORK), reps, cfg)
        rows = []
        for case in selected:
            say(case.name)
            rows.append(_score(case, bases[case.baseline], base_runs[case.baseline], envelopes[case.baseline],
                               list_for[case.baseline], work, run_refused))
        summary = _summary(rows)
        env_out = {k: {"basis": e.basis, "deterministic": e.deterministic,
                       "pairs": [p.model_dump() for p in e.pairs]} for k, e in envelopes.items()}
        return ValidationReport(steps=steps, quick=quick, workload={**DENSE_BASE, **shape, "--train-iters": steps},
                                replicates=replicates, envelopes=env_out, rows=rows, baselines=base_runs,
                                summary=summary)
    finally:
        if own_tmp:
            shutil.rmtree(work, ignore_errors=True)


def _verdict(passed: bool | None, failed: list[str], problems: list[str], info: RunInfo | None) -> str:
    if passed is None:
        return "no run"
    if passed:
        return "pass"
    why = failed or (["data: " + "; ".join(problems)] if problems else [])
    if info is not None and info.returncode != 0:
        why = [f"run failed (rc {info.returncode})"] + why
    return "rejected: " + ", ".join(why)


def _outcome(group: Group, l1_pass: bool, gate_passes: bool) -> Any:
    if group == "legitimate":
        return "correct" if gate_passes else "false reject"
    if group == "argument":
        return "refused" if not l1_pass else ("caught" if not gate_passes else "missed")
    return "caught" if not gate_passes else "missed"


def _run_candidate(case: Case, cand_args: dict[str, Any], base_run: RunInfo, env: noise.NoiseEnvelope,
                   loaded: lists.LoadedList, work: Path, l1: config_check.ConfigCheckResult
                   ) -> tuple[RunInfo, config_check.ConfigCheckResult | None, judge.GateConvergence,
                              dict[str, Any]]:
    """Run the candidate and judge it: its resolved-args check (when both logs carry them), layer 2's
    verdict against the baseline (told what layer 1 says changed) and the loss deviation."""
    info = _run(cand_args, case.nproc, {**BASE_ENV, **case.fault_env}, work / f"{case.name}.log")
    return info, *score_logs(Path(base_run.log), Path(info.log), env, loaded, l1)


def score_logs(base_log: Path, cand_log: Path, env: noise.NoiseEnvelope, loaded: lists.LoadedList,
               l1: config_check.ConfigCheckResult
               ) -> tuple[config_check.ConfigCheckResult | None, judge.GateConvergence, dict[str, Any]]:
    """Layer 1 on the resolved arguments and layer 2 on the losses of two finished runs' logs."""
    b_res, c_res = _resolved(base_log), _resolved(cand_log)
    l1r = None
    if b_res is not None and c_res is not None:
        l1r = config_check.check_resolved(loaded, b_res, c_res, BASE_ENV, BASE_ENV)
    base_curve = read_losses(base_log, FRAMEWORK)
    cand_curve = read_losses(cand_log, FRAMEWORK)
    change = l1.change_class() if (l1r is None or l1r.passed) else "unknown"
    cfg = noise.config_for(*noise.precision_from(b_res), change=change)
    l2 = judge.judge(base_curve, cand_curve, envelope=env, noise_config=cfg)
    return l1r, l2, convergence.loss_deviation(base_curve, cand_curve)


def _layer1(l1: config_check.ConfigCheckResult, l1r: config_check.ConfigCheckResult | None) -> tuple[bool, str]:
    """Whether layer 1 passed (the recipe and, where read, the resolved arguments) and its verdict text."""
    refusals = _names(l1) + [n for n in (_names(l1r) if l1r else []) if n not in _names(l1)]
    l1_pass = l1.passed and (l1r is None or l1r.passed)
    return l1_pass, "pass" if l1_pass else "refused: " + ", ".join(refusals)


def _passed(result: Any) -> bool | None:
    return None if result is None else result.passed


def _rule_verdict(result: convergence.ConvergenceResult | noise.NoiseAwareResult | None,
                  info: RunInfo | None) -> str:
    """One layer-2 rule's verdict text."""
    return _verdict(_passed(result), result.failed_checks if result else [],
                    result.data_problems if result else [], info)


def _layer2(l2: judge.GateConvergence | None, info: RunInfo | None) -> str:
    """Layer 2's verdict text: the noise-aware rule's failures, and the reference rule's when it counts."""
    ref, na = (l2.reference, l2.noise_aware) if l2 is not None else (None, None)
    failed: list[str] = []
    if l2 and ref and na:
        failed = ([f"reference {c}" for c in ref.failed_checks if not l2.reference_counts]
                  + [f"noise-aware {c}" for c in na.failed_checks])
    return _verdict(_passed(l2), failed, (na.data_problems if na else []), info)


def _score(case: Case, base_args: dict[str, Any], base_run: RunInfo, env: noise.NoiseEnvelope,
           loaded: lists.LoadedList, work: Path, run_refused: bool) -> Row:
    cand_args = config_check.apply_changes(base_args, case.changes)
    l1 = config_check.check_recipe(loaded, base_args, cand_args, BASE_ENV, BASE_ENV)
    info: RunInfo | None = None
    l1r: config_check.ConfigCheckResult | None = None
    l2: judge.GateConvergence | None = None
    dev: dict[str, Any] = {"max_rel": None, "final_rel": None}
    if l1.passed or run_refused:
        info, l1r, l2, dev = _run_candidate(case, cand_args, base_run, env, loaded, work, l1)
    l1_pass, layer1 = _layer1(l1, l1r)
    ref, na = (l2.reference, l2.noise_aware) if l2 is not None else (None, None)
    gate_passes = l1_pass and l2 is not None and l2.passed
    ref_gate = l1_pass and ref is not None and ref.passed
    return Row(run=case.name, group=case.group, description=case.description, expected=case.expected,
               list=loaded.model, layer1=layer1, layer1_recipe_passed=l1.passed,
               layer1_resolved_passed=_passed(l1r), layer2=_layer2(l2, info),
               layer2_passed=_passed(l2),
               reference=_rule_verdict(ref, info), reference_passed=_passed(ref),
               noise_aware=_rule_verdict(na, info), noise_aware_passed=_passed(na),
               max_rel_dev=dev["max_rel"], final_rel_dev=dev["final_rel"],
               mean_z=na.level.mean_z if (na is not None and na.level is not None) else None,
               correlation=ref.checks.correlation.value if (ref is not None and ref.checks is not None) else None,
               gate="passes" if gate_passes else "rejects", outcome=_outcome(case.group, l1_pass, gate_passes),
               reference_outcome=_outcome(case.group, l1_pass, ref_gate) if l2 is not None or not l1_pass else None,
               run_info=info)


def _summary(rows: list[Row]) -> dict[str, Any]:
    legit = [r for r in rows if r.group == "legitimate"]
    args = [r for r in rows if r.group == "argument"]
    faults = [r for r in rows if r.group == "fault"]
    return {
        "legitimate": _legitimate_summary(legit),
        "arguments": _arguments_summary(args),
        "faults": _faults_summary(faults),
        "gate_ok": all(r.outcome == "correct" for r in legit) and all(r.outcome == "refused" for r in args),
    }


def _legitimate_summary(legit: list[Row]) -> dict[str, Any]:
    return {"runs": len(legit), "passed": sum(r.outcome == "correct" for r in legit),
            "false_rejects": [r.run for r in legit if r.outcome != "correct"],
            "reference_false_rejects": [r.run for r in legit if r.reference_passed is False]}


def _arguments_summary(args: list[Row]) -> dict[str, Any]:
    return {"runs": len(args), "refused_by_layer1": sum(r.outcome == "refused" for r in args),
            "not_refused": [r.run for r in args if r.outcome != "refused"],
            "layer2_alone_would_reject": [r.run for r in args if r.layer2_passed is False],
            "reference_alone_would_reject": [r.run for r in args if r.reference_passed is False]}


def _faults_summary(faults: list[Row]) -> dict[str, Any]:
    return {"runs": len(faults), "caught": [r.run for r in faults if r.outcome == "caught"],
            "caught_by_reference": [r.run for r in faults if r.reference_passed is False],
            "missed": [{"run": r.run, "max_rel_dev": r.max_rel_dev, "final_rel_dev": r.final_rel_dev,
                        "mean_z": r.mean_z} for r in faults if r.outcome == "missed"]}


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}%"


def _short(v: str) -> str:
    return v.replace("rejected: ", "rejects: ")


def format_table(report: ValidationReport) -> str:
    head = ["run", "expected", "layer 1", "reference rule", "noise-aware", "layer 2", "loss dev. (max / final)",
            "mean z", "outcome"]
    body = [[r.run, r.expected, r.layer1, _short(r.reference), _short(r.noise_aware), _short(r.layer2),
             f"{_pct(r.max_rel_dev)} / {_pct(r.final_rel_dev)}", "-" if r.mean_z is None else f"{r.mean_z:+.1f}",
             r.outcome] for r in report.rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"  # noqa: E731
    out = [line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(b) for b in body]
    s = report.summary
    out.append("")
    for kind, e in report.envelopes.items():
        out.append(f"envelope ({kind}): {e['basis']}")
    out.append(f"legitimate: {s['legitimate']['passed']}/{s['legitimate']['runs']} pass "
               f"(reference rule alone: {len(s['legitimate']['reference_false_rejects'])} false reject(s)); "
               f"arguments: {s['arguments']['refused_by_layer1']}/{s['arguments']['runs']} refused by layer 1; "
               f"faults: {len(s['faults']['caught'])}/{s['faults']['runs']} caught by layer 2 "
               f"(reference rule alone: {len(s['faults']['caught_by_reference'])})")
    for m in s["faults"]["missed"]:
        z = "-" if m["mean_z"] is None else f"{m['mean_z']:+.1f}"
        out.append(f"missed: {m['run']} (moved the loss by at most {_pct(m['max_rel_dev'])}, "
                   f"{_pct(m['final_rel_dev'])} at the last step; mean {z} noise units)")
    return "\n".join(out)


# ---------------------------------------------------------------- CLI (registered by attune.app.commands.gate)


def register_cli(sub: Any) -> None:
    from attune.core.output import add_json_flag

    p = sub.add_parser("validate", help="validate the gate on tinygpt runs whose answer is known")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="training steps per run (default %(default)s)")
    p.add_argument("--replicates", type=int, default=REPLICATES,
                   help="replicate check runs per baseline for the noise envelope (default %(default)s)")
    p.add_argument("--quick", action="store_true", help="a small selection on a smaller model (CI)")
    p.add_argument("--only", help="comma-separated case names")
    p.add_argument("--no-refused-runs", action="store_true",
                   help="do not run the cases layer 1 refuses (their layer-2 outcome is then not shown)")
    p.add_argument("--keep", help="keep the run logs in this directory")
    add_json_flag(p)
    p.set_defaults(func=_cli_validate)

    p = sub.add_parser("component", help="run tinygpt's component tests and compare them with its lists")
    p.add_argument("--compile", action="store_true", help="also test torch.compile (slow on CPU)")
    add_json_flag(p)
    p.set_defaults(func=_cli_component)


def _cli_validate(args: argparse.Namespace) -> int:
    from attune.core.errors import EXIT_FAILED, EXIT_OK, UsageError
    from attune.core.output import emit_json

    if args.replicates < 0 or args.replicates > 10:
        raise UsageError("--replicates must be between 0 and 10")
    if args.steps < 5:
        raise UsageError("--steps must be at least 5 (the convergence check needs 5 steps)")
    cases = None
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        known = {c.name: c for c in CASES}
        unknown = [n for n in wanted if n not in known]
        if unknown:
            raise UsageError(f"unknown case(s) {unknown}; known: {', '.join(known)}")
        cases = [known[n] for n in wanted]
    try:
        report = run_validation(cases, steps=args.steps, quick=args.quick,
                                workdir=Path(args.keep) if args.keep else None,
                                run_refused=not args.no_refused_runs, replicates=args.replicates,
                                progress=lambda m: print(f"gate validate: {m}", file=sys.stderr, flush=True))
    except (FileNotFoundError, RuntimeError) as exc:
        raise UsageError(str(exc)) from exc
    if args.json:
        emit_json(report.model_dump(mode="json"))
    else:
        print(format_table(report))
    return EXIT_OK if report.summary["gate_ok"] else EXIT_FAILED


def component_report(include_compile: bool = False) -> dict[str, Any]:
    """Run tinygpt's component tests and check each outcome against the status its list records."""
    from gate.evaluation import component

    results = component.tinygpt_suite(include_compile=include_compile)
    rows = []
    consistent = True
    for r in results:
        entry = lists.load_list(r.model).clist.args.get(r.swap)
        recorded = getattr(entry, "component_test", None) or (f"class {entry.klass}" if entry is not None else None)
        if r.control:
            ok = not r.passed  # a control must fail, whatever the list says
        elif entry is None:
            ok = False
        elif r.passed:
            ok = recorded == "passed" and any(r.candidate == v for v in entry.values)
        else:
            ok = recorded == "failed"
        consistent &= ok
        rows.append({**r.model_dump(mode="json"), "list_records": recorded, "consistent": ok})
    return {"results": rows, "consistent": consistent}


def _cli_component(args: argparse.Namespace) -> int:
    from attune.core.errors import EXIT_FAILED, EXIT_OK
    from attune.core.output import emit_json

    rep = component_report(include_compile=args.compile)
    if args.json:
        emit_json(rep)
    else:
        for r in rep["results"]:
            routing = "" if r["routing_identical"] is None else (
                f", routing {'identical' if r['routing_identical'] else 'DIFFERS'} "
                f"({r['routing_mismatches']}/{r['routing_total']} tokens differ)")
            tag = "control " if r["control"] else ""
            print(f"{tag}{r['model']} {r['swap']} {r['default']!r} -> {r['candidate']!r}: "
                  f"{'PASS' if r['passed'] else 'FAIL'} ({r['reason']}{routing}); list records "
                  f"{r['list_records']}: {'consistent' if r['consistent'] else 'INCONSISTENT'}")
    return EXIT_OK if rep["consistent"] else EXIT_FAILED
