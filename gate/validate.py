"""The gate's validation on tinygpt: runs whose answer is known (in the spirit of the paper's Table 5).

Every case is a real 20-step tinygpt training run (``examples/tinygpt/train.py``; ``torchrun``
for two data-parallel ranks), compared with a baseline run on the same data and seed:

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

from gate import config_check, convergence, lists, logparse

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "examples" / "tinygpt" / "train.py"

DENSE_BASE: dict[str, Any] = {
    "--num-layers": 4, "--hidden-size": 128, "--num-attention-heads": 4, "--seq-length": 128,
    "--micro-batch-size": 2, "--global-batch-size": 16, "--lr": 1e-3, "--seed": 1234,
}
MOE_BASE: dict[str, Any] = {**DENSE_BASE, "--num-experts": 4, "--moe-router-topk": 2}
QUICK_SHAPE: dict[str, Any] = {"--num-layers": 2, "--hidden-size": 64, "--seq-length": 64}
BASE_ENV = {"OMP_NUM_THREADS": "1"}

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


CASES: list[Case] = [
    Case(name="replicate-1", group="legitimate", description="baseline replicate, same data and seed", quick=True),
    Case(name="replicate-2", group="legitimate", description="baseline replicate, same data and seed"),
    Case(name="data-parallel-2", group="legitimate", description="2 data-parallel ranks (torchrun)", nproc=2,
         quick=True),
    Case(name="dp2-buckets-overlap", group="legitimate", description="2 ranks, small buckets, overlapped reduction",
         nproc=2, changes={"--ddp-bucket-size": 20000, "--overlap-grad-reduce": True}),
    Case(name="microbatch-4", group="legitimate", description="4 rows per microbatch (was 2)",
         changes={"--micro-batch-size": 4}),
    Case(name="recompute-full", group="legitimate", description="full activation recomputation",
         changes={"--recompute-granularity": "full"}),
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
    Case(name="lr-x10", group="argument", description="learning rate x10", changes={"--lr": 1e-2}, quick=True),
    Case(name="global-batch-32", group="argument", description="global batch 16 -> 32",
         changes={"--global-batch-size": 32}),
    Case(name="grad-reduce-bf16", group="argument", description="gradients accumulated and reduced in BF16",
         changes={"--grad-reduce-in-bf16": True}),
    Case(name="bf16", group="argument", description="BF16 compute", changes={"--bf16": True}),
    Case(name="seed", group="argument", description="another seed", changes={"--seed": 4321}),
    Case(name="eod-mask-loss", group="argument", description="no loss on end-of-text positions",
         changes={"--eod-mask-loss": True}),
    Case(name="moe-aux-loss-x10", group="argument", description="MoE load-balancing coefficient x10",
         baseline="moe", changes={"--moe-aux-loss-coeff": 0.1}),
    Case(name="moe-microbatch-4", group="argument", description="MoE, 4 rows per microbatch (per-microbatch loss)",
         baseline="moe", changes={"--micro-batch-size": 4}),
    Case(name="torch-compile", group="argument",
         description="torch.compile (same-math swap whose component test failed)", changes={"--torch-compile": True}),
    Case(name="labels-offset", group="fault", description="labels offset by one more token",
         fault_env={"TINYGPT_FAULT": "labels-offset"}, quick=True),
    Case(name="loss-mask-shift", group="fault", description="loss mask shifted by one token, count kept",
         fault_env={"TINYGPT_FAULT": "loss-mask-shift"}),
    Case(name="skip-bucket-reduce-0", group="fault", description="2 ranks, first gradient bucket not reduced",
         nproc=2, fault_env={"TINYGPT_FAULT": "skip-bucket-reduce", "TINYGPT_FAULT_BUCKET": "0"}),
    Case(name="skip-bucket-reduce-1", group="fault", description="2 ranks, second gradient bucket not reduced",
         nproc=2, fault_env={"TINYGPT_FAULT": "skip-bucket-reduce", "TINYGPT_FAULT_BUCKET": "1"}),
    Case(name="moe-zero-lb-loss", group="fault", description="MoE load-balancing loss zeroed", baseline="moe",
         fault_env={"TINYGPT_FAULT": "zero-lb-loss"}),
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
    layer2: str = Field(description="'pass', 'rejected: <checks or data problem>', or 'no run'")
    layer2_passed: bool | None
    max_rel_dev: float | None
    final_rel_dev: float | None
    correlation: float | None
    gate: Literal["passes", "rejects"]
    outcome: Literal["correct", "false reject", "missed", "caught", "refused"]
    run_info: RunInfo | None = None


class ValidationReport(BaseModel):
    steps: int
    quick: bool
    rows: list[Row]
    baselines: dict[str, RunInfo]
    summary: dict[str, Any]


def _argv(args: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for k, v in args.items():
        if v is None or v is False:
            continue
        out.append(k)
        if v is not True:
            out.append(str(v))
    return out


def _run(args: dict[str, Any], nproc: int, env_extra: dict[str, str], log: Path) -> RunInfo:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TINYGPT_")}
    env.update(env_extra)
    if nproc > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               str(TRAIN), *_argv(args)]
    else:
        cmd = [sys.executable, str(TRAIN), *_argv(args)]
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=str(REPO), timeout=1800)
    return RunInfo(log=str(log), returncode=proc.returncode, seconds=time.perf_counter() - t0)


def _resolved(log: Path) -> dict[str, str] | None:
    try:
        return logparse.read_resolved_args(log)
    except ValueError:
        return None


def _names(result: config_check.ConfigCheckResult) -> list[str]:
    return [f"{r.name} [{r.klass}]" for r in result.refusals]


def run_validation(cases: list[Case] | None = None, steps: int = 20, quick: bool = False,
                   workdir: Path | None = None, run_refused: bool = True,
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
        for kind in sorted({c.baseline for c in selected}):
            say(f"baseline {kind}")
            base_runs[kind] = _run(bases[kind], 1, BASE_ENV, work / f"baseline-{kind}.log")
            if base_runs[kind].returncode != 0:
                raise RuntimeError(f"the {kind} baseline run failed (rc {base_runs[kind].returncode}); "
                                   f"see {base_runs[kind].log}")
        rows = []
        for case in selected:
            say(case.name)
            rows.append(_score(case, bases[case.baseline], base_runs[case.baseline], list_for[case.baseline],
                               work, run_refused))
        summary = _summary(rows)
        return ValidationReport(steps=steps, quick=quick, rows=rows, baselines=base_runs, summary=summary)
    finally:
        if own_tmp:
            shutil.rmtree(work, ignore_errors=True)


def _score(case: Case, base_args: dict[str, Any], base_run: RunInfo, loaded: lists.LoadedList, work: Path,
           run_refused: bool) -> Row:
    cand_args = config_check.apply_changes(base_args, case.changes)
    l1 = config_check.check_recipe(loaded, base_args, cand_args, BASE_ENV, BASE_ENV)
    info: RunInfo | None = None
    l1r: config_check.ConfigCheckResult | None = None
    l2: convergence.ConvergenceResult | None = None
    dev: dict[str, Any] = {"max_rel": None, "final_rel": None}
    if l1.passed or run_refused:
        info = _run(cand_args, case.nproc, {**BASE_ENV, **case.fault_env}, work / f"{case.name}.log")
        b_res, c_res = _resolved(Path(base_run.log)), _resolved(Path(info.log))
        if b_res is not None and c_res is not None:
            l1r = config_check.check_resolved(loaded, b_res, c_res, BASE_ENV, BASE_ENV)
        base_curve = logparse.read_losses(base_run.log)
        cand_curve = logparse.read_losses(info.log)
        l2 = convergence.check_convergence(base_curve, cand_curve)
        dev = convergence.loss_deviation(base_curve, cand_curve)
    refusals = _names(l1) + [n for n in (_names(l1r) if l1r else []) if n not in _names(l1)]
    l1_pass = l1.passed and (l1r is None or l1r.passed)
    layer1 = "pass" if l1_pass else "refused: " + ", ".join(refusals)
    if l2 is None:
        layer2 = "no run"
    elif l2.passed:
        layer2 = "pass"
    else:
        why = l2.failed_checks or ["data: " + "; ".join(l2.data_problems)]
        if info is not None and info.returncode != 0:
            why = [f"run failed (rc {info.returncode})"] + why
        layer2 = "rejected: " + ", ".join(why)
    gate_passes = l1_pass and l2 is not None and l2.passed
    if case.group == "legitimate":
        outcome = "correct" if gate_passes else "false reject"
    elif case.group == "argument":
        outcome = "refused" if not l1_pass else ("caught" if not gate_passes else "missed")
    else:
        outcome = "caught" if not gate_passes else "missed"
    corr = l2.checks.correlation.value if (l2 is not None and l2.checks is not None) else None
    return Row(run=case.name, group=case.group, description=case.description, expected=case.expected,
               list=loaded.model, layer1=layer1, layer1_recipe_passed=l1.passed,
               layer1_resolved_passed=None if l1r is None else l1r.passed, layer2=layer2,
               layer2_passed=None if l2 is None else l2.passed, max_rel_dev=dev["max_rel"],
               final_rel_dev=dev["final_rel"], correlation=corr, gate="passes" if gate_passes else "rejects",
               outcome=outcome, run_info=info)  # type: ignore[arg-type]


def _summary(rows: list[Row]) -> dict[str, Any]:
    legit = [r for r in rows if r.group == "legitimate"]
    args = [r for r in rows if r.group == "argument"]
    faults = [r for r in rows if r.group == "fault"]
    return {
        "legitimate": {"runs": len(legit), "passed": sum(r.outcome == "correct" for r in legit),
                       "false_rejects": [r.run for r in legit if r.outcome != "correct"]},
        "arguments": {"runs": len(args), "refused_by_layer1": sum(r.outcome == "refused" for r in args),
                      "not_refused": [r.run for r in args if r.outcome != "refused"],
                      "layer2_alone_would_reject": [r.run for r in args if r.layer2_passed is False]},
        "faults": {"runs": len(faults), "caught": [r.run for r in faults if r.outcome == "caught"],
                   "missed": [{"run": r.run, "max_rel_dev": r.max_rel_dev, "final_rel_dev": r.final_rel_dev}
                              for r in faults if r.outcome == "missed"]},
        "gate_ok": all(r.outcome == "correct" for r in legit) and all(r.outcome == "refused" for r in args),
    }


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}%"


def format_table(report: ValidationReport) -> str:
    head = ["run", "expected", "layer 1", "layer 2", "loss deviation (max / final)", "outcome"]
    body = [[r.run, r.expected, r.layer1, r.layer2, f"{_pct(r.max_rel_dev)} / {_pct(r.final_rel_dev)}", r.outcome]
            for r in report.rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"  # noqa: E731
    out = [line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(b) for b in body]
    s = report.summary
    out.append("")
    out.append(f"legitimate: {s['legitimate']['passed']}/{s['legitimate']['runs']} pass; "
               f"arguments: {s['arguments']['refused_by_layer1']}/{s['arguments']['runs']} refused by layer 1; "
               f"faults: {len(s['faults']['caught'])}/{s['faults']['runs']} caught by layer 2")
    for m in s["faults"]["missed"]:
        out.append(f"missed: {m['run']} (moved the loss by at most {_pct(m['max_rel_dev'])}, "
                   f"{_pct(m['final_rel_dev'])} at the last step)")
    return "\n".join(out)


# ---------------------------------------------------------------- CLI (registered by attune.commands.gate)


def register_cli(sub: Any) -> None:
    from attune.output import add_json_flag

    p = sub.add_parser("validate", help="validate the gate on tinygpt runs whose answer is known")
    p.add_argument("--steps", type=int, default=20, help="training steps per run (default %(default)s)")
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
    from attune.errors import EXIT_FAILED, EXIT_OK, UsageError
    from attune.output import emit_json

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
                                run_refused=not args.no_refused_runs,
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
    from gate import component

    results = component.tinygpt_suite(include_compile=include_compile)
    rows = []
    consistent = True
    for r in results:
        entry = lists.load_list(r.model).clist.args.get(r.swap)
        recorded = getattr(entry, "component_test", None)
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
    from attune.errors import EXIT_FAILED, EXIT_OK
    from attune.output import emit_json

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
