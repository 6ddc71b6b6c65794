"""`attune gate`: the correctness gate from the command line.

    attune gate check --model M --baseline RECIPE (--candidate RECIPE | --set FLAG[=V] ...) [--json]
    attune gate check --model M --resolved --baseline LOG --candidate LOG [--baseline-env F] [--candidate-env F]
    attune gate converge BASELINE CANDIDATE [--json]
    attune gate explain ARG --model M [--json]
    attune gate lists [--json]
    attune gate validate [--json]            (tinygpt runs with known answers)
    attune gate component [--compile] [--json]   (tinygpt component tests against the lists)

Exit codes: 0 the candidate passes, 1 it is refused/rejected, 2 bad input.
The JSON shapes are documented in docs/gate.md.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from attune.core.errors import EXIT_FAILED, EXIT_OK, UsageError
from attune.core.output import add_json_flag, emit_json
from gate import config_check, convergence, inputs, judge, lists, noise
from gate.evaluation import validate


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("gate", help="the correctness gate: configuration and convergence checks",
                                   description="The correctness gate: a faster recipe ships only if it trains the "
                                   "same objective.")
    sub = parser.add_subparsers(dest="gate_command", metavar="GATE_COMMAND")
    sub.required = True

    p = sub.add_parser("check", help="layer 1: classify every change of a candidate against the model's list")
    _add_list_args(p)
    p.add_argument("--baseline", required=True, help="baseline recipe (JSON/YAML {args, env}); with --resolved, "
                   "a training log or JSON {args: {attribute: value}, env}")
    p.add_argument("--candidate", help="candidate recipe, same form as --baseline")
    p.add_argument("--set", action="append", default=[], metavar="FLAG[=VALUE]",
                   help="change the baseline: tensor-model-parallel-size=2, or a bare flag: sequence-parallel")
    p.add_argument("--unset", action="append", default=[], metavar="FLAG", help="remove a flag from the baseline")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="set an environment variable in the candidate")
    p.add_argument("--resolved", action="store_true",
                   help="compare fully resolved arguments (of check runs) instead of recipes")
    p.add_argument("--baseline-env", help="with --resolved: the baseline run's environment (JSON or KEY=VALUE lines)")
    p.add_argument("--candidate-env", help="with --resolved: the candidate run's environment")
    add_json_flag(p)
    p.set_defaults(func=run_check)

    p = sub.add_parser("converge", help="layer 2: the convergence check of a candidate's loss against the baseline's")
    p.add_argument("baseline", help="baseline training log, or JSON {step: loss}")
    p.add_argument("candidate", help="candidate training log, or JSON {step: loss}")
    p.add_argument("--min-steps", type=int, default=convergence.ConvergenceConfig().min_steps,
                   help="fewest common steps that can be judged (default %(default)s)")
    p.add_argument("--replicate", action="append", default=[], metavar="RUN",
                   help="a replicate run of the baseline's recipe (log or JSON curve); repeatable; sets the noise envelope")
    p.add_argument("--calibration", action="append", default=[], metavar="RUN",
                   help="a calibration run of the baseline (its steps that overlap count); repeatable")
    p.add_argument("--precision", choices=sorted(noise.FLOOR_BY_PRECISION),
                   help="compute precision, sets the noise floor (default: read from the baseline log's arguments; "
                   f"when they cannot be read, e.g. JSON curves, {noise.DEFAULT_PRECISION} is assumed, the precision "
                   "of LLM mixed-precision training; every verdict states which and how it was known)")
    p.add_argument("--change", choices=["unknown", "layout"], default=None,
                   help="what changed: 'layout' (only structural / same-math arguments: judged for drift and "
                   "divergence after the first 20%% of the steps) or 'unknown' (every step held to the noise "
                   "envelope). Default: layer 1 classes it from the two runs' arguments (a training log's "
                   "arguments block, or a JSON run's 'args'); without arguments, 'unknown'")
    p.add_argument("--model", help="the correctness list layer 1 classes the change with (default: megatron)")
    p.add_argument("--list", dest="list_path", help="path to a correctness list file (instead of --model)")
    p.add_argument("--list-sha256", help="the hash the campaign pins; a different list is refused")
    p.add_argument("--k-sigma", type=float, default=noise.NoiseConfig().k_sigma,
                   help="envelope half-width in noise units (default %(default)s)")
    add_json_flag(p)
    p.set_defaults(func=run_converge)

    p = sub.add_parser("explain", help="an argument's class on a model, and why")
    p.add_argument("name", help="a flag (--sequence-parallel), attribute (sequence_parallel) or environment variable")
    _add_list_args(p)
    add_json_flag(p)
    p.set_defaults(func=run_explain)

    p = sub.add_parser("lists", help="the built-in correctness lists and their SHA-256")
    add_json_flag(p)
    p.set_defaults(func=run_lists)

    validate.register_cli(sub)  # `gate validate` and `gate component` (tinygpt runs; torch imported lazily)


def _add_list_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--model", help=f"built-in list: {', '.join(lists.builtin_models())}")
    g.add_argument("--list", dest="list_path", help="path to a correctness list file")
    p.add_argument("--list-sha256", help="the hash the campaign pins; a different list is refused")


def _load(args: argparse.Namespace) -> lists.LoadedList:
    try:
        return lists.load_list(args.model or args.list_path, expected_sha256=args.list_sha256)
    except lists.ListError as exc:
        raise UsageError(str(exc)) from exc


def _flag(text: str) -> str:
    t = text.strip()
    if not t:
        raise UsageError("empty flag name")
    return t if t.startswith("--") else "--" + t


def run_check(args: argparse.Namespace) -> int:
    loaded = _load(args)
    try:
        if args.resolved:
            if args.set or args.unset or args.env:
                raise UsageError("--set/--unset/--env apply to recipes; with --resolved give --candidate")
            if not args.candidate:
                raise UsageError("--resolved needs --candidate (a check run's log or resolved-args JSON)")
            b_args, b_env = inputs.load_resolved(args.baseline)
            c_args, c_env = inputs.load_resolved(args.candidate)
            if args.baseline_env:
                b_env = {**b_env, **inputs.load_env(args.baseline_env)}
            if args.candidate_env:
                c_env = {**c_env, **inputs.load_env(args.candidate_env)}
            result = config_check.check_resolved(loaded, b_args, c_args, b_env, c_env)
        else:
            if args.baseline_env or args.candidate_env:
                raise UsageError("--baseline-env/--candidate-env go with --resolved; recipes carry their env")
            b_args, b_env = inputs.load_recipe(args.baseline)
            if args.candidate:
                c_args, c_env = inputs.load_recipe(args.candidate)
            else:
                c_args, c_env = dict(b_args), dict(b_env)
            changes: dict[str, Any] = {}
            for item in args.set:
                flag, eq, value = item.partition("=")
                changes[_flag(flag)] = value if eq else True
            for item in args.unset:
                changes[_flag(item)] = None
            c_args = config_check.apply_changes(c_args, changes)
            for item in args.env:
                key, eq, value = item.partition("=")
                if not eq or not key:
                    raise UsageError(f"--env expects KEY=VALUE, got {item!r}")
                c_env[key] = value
            if not args.candidate and not changes and not args.env:
                raise UsageError("give --candidate or at least one --set/--unset/--env change")
            result = config_check.check_recipe(loaded, b_args, c_args, b_env, c_env)
    except (inputs.GateInputError, ValueError) as exc:
        raise UsageError(str(exc)) from exc
    if args.json:
        emit_json({**result.model_dump(mode="json"), "summary": result.summary()})
    else:
        _print_check(result)
    return EXIT_OK if result.passed else EXIT_FAILED


def _print_check(result: config_check.ConfigCheckResult) -> None:
    print(f"model {result.model} (list sha256 {result.list_sha256[:16]}), {result.mode} check")
    if not result.changes:
        print("  no changes")
    for c in result.changes:
        mark = "ok     " if c.allowed else "REFUSED"
        label = c.flag or c.name
        print(f"  {mark} {label} [{c.klass}] {c.baseline!r} -> {c.candidate!r}: {c.reason}")
    for r in result.refusals:
        if r.klass == "defect" or (r.klass == "frozen" and r.name not in {c.name for c in result.changes}):
            print(f"  REFUSED {r.name} [{r.klass}]: {r.reason}")
    print("PASS" if result.passed else f"REFUSED ({len(result.refusals)} reason(s))")


def _converge_inputs(args: argparse.Namespace) -> tuple[inputs.RunInput, inputs.RunInput,
                                                         list[tuple[str, str, noise.Curve]]]:
    """The baseline's and the candidate's runs and the other runs' curves; bad files or options are usage errors."""
    try:
        base = inputs.load_run(args.baseline)
        cand = inputs.load_run(args.candidate)
        runs = ([(Path(p).name, "replicate", inputs.load_curve(p)) for p in args.replicate]
                + [(Path(p).name, "calibration", inputs.load_curve(p)) for p in args.calibration])
    except inputs.GateInputError as exc:
        raise UsageError(str(exc)) from exc
    if args.min_steps < 2:
        raise UsageError("--min-steps must be at least 2")
    if not (args.k_sigma > 0 and math.isfinite(args.k_sigma)):
        raise UsageError("--k-sigma must be a positive number")
    return base, cand, runs


def _ok(passed: bool) -> str:
    return "ok" if passed else "FAIL"


def _print_reference(g: judge.GateConvergence) -> None:
    result = g.reference
    print(f"reference rule: {result.summary()}")
    if result.checks is not None:
        c = result.checks
        corr = "undefined" if c.correlation.value is None else f"{c.correlation.value:.5f}"
        print(f"  correlation   {corr} (min {c.correlation.threshold})  {_ok(c.correlation.passed)}")
        print(f"  point-wise    {c.pointwise.failing_steps}/{c.pointwise.compared_steps} failing, "
              f"max diff {c.pointwise.max_rel_diff:.4%}  {_ok(c.pointwise.passed)}")
        print(f"  final loss    {c.final_loss.candidate:.6g} vs {c.final_loss.baseline:.6g} "
              f"({c.final_loss.rel_diff:.4%}, max {c.final_loss.tolerance:.0%})  "
              f"{_ok(c.final_loss.passed)}")
        print(f"  outliers      {c.outliers.count} ({c.outliers.ratio:.0%}, max {c.outliers.max_ratio:.0%})  "
              f"{_ok(c.outliers.passed)}")
    for p in result.data_problems:
        print(f"  data: {p}")
    for e in g.excused:
        print(f"  excused ({e.check}): {e.why}")


def _print_noise_aware(na: noise.NoiseAwareResult) -> None:
    print(na.summary())
    if na.level is not None and na.trend is not None and na.pointwise is not None:
        print(f"  level         {na.level.mean_rel_diff:+.4%} = {na.level.mean_z:+.2f} noise units "
              f"(limit {na.level.limit_z:g})  {_ok(na.level.passed)}")
        print(f"  trend         {na.trend.drift_rel:+.4%} over the window = {na.trend.drift_z:+.2f} noise units  "
              f"{_ok(na.trend.passed)}")
        print(f"  envelope      {na.pointwise.outside}/{na.pointwise.compared} steps outside "
              f"(allowed {na.pointwise.allowed})  {_ok(na.pointwise.passed)}")
    if na.gap is not None:
        print(f"  end gap       {na.gap.mean_rel_diff:+.4%} = {na.gap.mean_z:+.2f} noise units  {_ok(na.gap.passed)}")
    print(f"  envelope: {na.envelope.basis}")
    for n in na.notes:
        print(f"  note: {n}")


def _layer1(args: argparse.Namespace, base: inputs.RunInput, cand: inputs.RunInput) -> dict[str, Any] | None:
    """Layer 1 on the two runs' arguments when both carry them in the same form (None otherwise): its class of the
    change, the refusals that reject outright (`blocking_refusals`), and its summary for the verdict."""
    if base.args is None or cand.args is None or base.form != cand.form:
        return None
    loaded = lists.load_list(args.list_path or args.model or "megatron", expected_sha256=args.list_sha256)
    if base.form == "resolved":
        r1 = config_check.check_resolved(loaded, base.args, cand.args, base.env, cand.env)
    else:
        r1 = config_check.check_recipe(loaded, base.args, cand.args, base.env, cand.env)
    blocking = r1.blocking_refusals()
    return {"class": r1.objective_class(), "blocking": blocking,
            "refusals": [f"layer 1: {r.name} [{r.klass}]: {r.reason}" for r in blocking],
            "doc": {"model": r1.model, "list_sha256": r1.list_sha256, "mode": r1.mode, "passed": r1.passed,
                    "summary": r1.summary(), "refuses": bool(blocking),
                    "changes": [{"name": c.name, "class": c.klass, "allowed": c.allowed,
                                 "baseline": c.baseline, "candidate": c.candidate} for c in r1.changes]}}


def _change_class(args: argparse.Namespace, base: inputs.RunInput, cand: inputs.RunInput) -> dict[str, Any]:
    """The change's class and where it comes from: `--change` ('given'), layer 1 on the two runs' arguments
    ('layer1'), or 'unknown' when neither says, with what `--change layout` would do. Layer 1 runs whenever both
    runs carry arguments, `--change` or not: its outright refusals (`layer1_refusals`) reject in either case."""
    l1 = _layer1(args, base, cand)
    refusals = l1["refusals"] if l1 else []
    outright = ("; layer 1 refuses it outright (" + ", ".join(f"{r.name} [{r.klass}]" for r in l1["blocking"])
                + "): the verdict is a reject whatever the curves show, and layer 2's own verdict is reported next "
                "to it") if l1 and l1["blocking"] else ""
    if args.change is not None:
        return {"change_class": args.change, "change_source": "given", "mode": args.change,
                "change_note": f"--change {args.change} given" + outright, "layer1": l1["doc"] if l1 else None,
                "layer1_refusals": refusals}
    if l1 is None:
        missing = [n for n, r in (("baseline", base), ("candidate", cand)) if r.args is None]
        why = (f"the {' and '.join(missing)} carr{'y' if len(missing) > 1 else 'ies'} no arguments" if missing
               else "one run gives a recipe's --flags, the other resolved attributes")
        return {"change_class": "unknown", "change_source": "unknown", "mode": "unknown", "layer1": None,
                "layer1_refusals": [],
                "change_note": (f"change class unknown ({why}): judged as a layout change (drift and divergence "
                                f"after the first 20% of the steps, layout allowance "
                                f"{noise.LAYOUT_FLOOR_BY_PRECISION['bf16']:.2%} bf16) if and only if the difference "
                                "looks like zero-mean, non-drifting noise under the difference test, else strictly, "
                                f"every step at replicate level (floor {noise.FLOOR_BY_PRECISION['bf16']:.2%} bf16); "
                                "`difference` and the assumptions say which. --change layout or --change unknown "
                                "sets the mode")}
    klass = l1["class"]
    mode = "layout" if klass == "layout" else "unknown"
    note = {"layout": "layer 1 classes every change layout-only: judged for drift and divergence",
            "objective": "layer 1 refuses a change of what is trained: the curve check is the backstop, every step "
                         "at replicate level",
            "unknown": ("layer 1 sees no change its list classes (none, or only unlisted ones): judged as a layout "
                        "change if and only if the difference looks like zero-mean, non-drifting noise under the "
                        "difference test, else strictly, every step at replicate level")}[klass]
    return {"change_class": klass, "change_source": "layer1", "mode": mode, "change_note": note + outright,
            "layer1_refusals": refusals, "layer1": l1["doc"]}


def run_converge(args: argparse.Namespace) -> int:
    base_run, cand_run, runs = _converge_inputs(args)
    base, cand = base_run.curve, cand_run.curve
    try:
        change = _change_class(args, base_run, cand_run)
    except (lists.ListError, ValueError) as exc:
        raise UsageError(str(exc)) from exc
    if args.precision:
        precision, source = args.precision, "given"
    elif base_run.args:
        precision, source = noise.precision_of(base_run.args), base_run.source
    else:
        precision, source = noise.precision_from(None)
    ncfg = noise.config_for(precision, source, k_sigma=args.k_sigma, min_steps=args.min_steps, change=change["mode"])
    # a change of unknown class (not given, and layer 1 neither vouches for it nor refuses it): the mode follows
    # the difference test; a given class and layer 1's layout or objective class are kept as they are
    # a strict judgment of curves longer than the reference's 20-step check window also judges that window alone
    g = judge.judge(base, cand, replicates=runs, reference_config=convergence.ConvergenceConfig(min_steps=args.min_steps),
                    noise_config=ncfg, infer=change["change_class"] == "unknown", check_window=True)
    result, na = g.reference, g.noise_aware
    # objective changes are layer 1's job first: a change it knows changes what is trained, or one its list does not
    # name, is refused outright when the runs carry their arguments; the curve check is the backstop, reported too
    refused = change.get("layer1_refusals") or []
    passed = g.passed and not refused
    reasons = [*refused, *g.reasons]
    summary = (("refused by layer 1: " + "; ".join(r.removeprefix("layer 1: ") for r in refused) + " | " + g.summary)
               if refused else g.summary)
    if args.json:
        emit_json({**result.model_dump(mode="json"), "passed": passed, "summary": summary,
                   "reasons": reasons, "layer2_passed": g.passed, "layer2_summary": g.summary,
                   "layer2_reasons": g.reasons,
                   "check_window": g.check_window.model_dump(mode="json", include={"passed", "summary", "reasons"})
                   if g.check_window else None,
                   "reference_passed": result.passed, "reference_summary": result.summary(),
                   "reference_reasons": result.reasons, "precision": precision, "precision_source": source,
                   "assumptions": g.assumptions.model_dump() if g.assumptions else None,
                   "change_class": change["change_class"], "change_source": change["change_source"],
                   "change_note": change["change_note"], "layer1": change["layer1"],
                   "difference": g.difference.model_dump() if g.difference else None,
                   "noise_aware": _noise_json(na), "excused": [e.model_dump() for e in g.excused],
                   "reference_common": g.reference_common.model_dump(mode="json") if g.reference_common else None,
                   "deviation": convergence.loss_deviation(base, cand),
                   "baseline": str(args.baseline), "candidate": str(args.candidate)})
    else:
        print(summary)
        print(f"assumed: {na.assumed()}")
        print(f"change: {change['change_class']} ({change['change_source']}): {change['change_note']}")
        if g.difference is not None:
            print(f"difference test: {g.difference.why}")
        _print_reference(g)
        _print_noise_aware(na)
        if g.check_window is not None:
            print(f"check window (first {judge.CHECK_WINDOW_STEPS} steps, judged on their own): {g.check_window.summary}")
    return EXIT_OK if passed else EXIT_FAILED


def _noise_json(na: noise.NoiseAwareResult) -> dict:
    doc = na.model_dump(mode="json")
    doc["summary"] = na.summary()
    env = doc["envelope"]
    env["sigma_rel"] = {str(k): v for k, v in env["sigma_rel"].items()}
    env["samples"] = {str(k): v for k, v in env["samples"].items()}
    return doc


def run_explain(args: argparse.Namespace) -> int:
    loaded = _load(args)
    info = config_check.explain_arg(loaded, args.name)
    info = {"model": loaded.model, "list_sha256": loaded.sha256, **info}
    if args.json:
        emit_json(info)
    else:
        print(f"{info['name']} on {loaded.model}: {info['class']}")
        print(f"  why: {info['why']}")
        for key in ("flag", "default", "value", "values", "component_test", "component_evidence", "pattern"):
            if info.get(key) is not None:
                print(f"  {key}: {info[key]}")
        if info.get("defects"):
            print(f"  known defects that read it: {', '.join(info['defects'])}")
        print(f"  a change is {info['verdict_on_change']}")
    return EXIT_OK


def run_lists(args: argparse.Namespace) -> int:
    rows = []
    for m in lists.builtin_models():
        try:
            loaded = lists.load_list(m)
        except lists.ListError as exc:
            print(f"attune gate lists: {exc}", file=sys.stderr)
            return EXIT_FAILED
        c = loaded.clist
        classes: dict[str, int] = {}
        for e in c.args.values():
            classes[e.klass] = classes.get(e.klass, 0) + 1
        rows.append({"model": m, "path": str(loaded.path), "sha256": loaded.sha256, "args": len(c.args),
                     "classes": classes, "env": len(c.env), "env_patterns": len(c.env_patterns),
                     "defects": [d.id for d in c.defects]})
    if args.json:
        emit_json({"lists": rows})
    else:
        for r in rows:
            print(f"{r['model']:<16} {r['sha256']}  {r['args']} args, {len(r['defects'])} defects")
    return EXIT_OK
