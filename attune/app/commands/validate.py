"""`attune validate campaign.yaml`: check a campaign spec."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from attune.control.spec import SpecError, load_spec, spec_sha256
from attune.core.errors import EXIT_OK, EXIT_USAGE
from attune.core.output import add_json_flag, emit_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate", help="check a campaign.yaml; every problem is printed with its field")
    p.add_argument("spec", help="campaign.yaml, or a campaign directory holding one")
    add_json_flag(p)
    p.set_defaults(func=run)


def _gate_list_problem(spec: Any, where: str) -> str | None:
    """The correctness list resolved exactly as the broker resolves it (a bare name is a built-in list)."""
    from attune.control.plane import gate_list_source
    from gate.lists import ListError, load_list

    p = Path(where)
    campaign_dir = p if p.is_dir() else p.parent
    try:
        load_list(gate_list_source(spec, campaign_dir), expected_sha256=spec.gate.list_sha256)
    except (ListError, OSError) as exc:
        return f"the correctness list cannot be used: {str(exc).splitlines()[0]}"
    return None


def _search_space_warnings(spec: Any, where: str) -> list[str]:
    """Values of the campaign's own search space that its correctness list refuses (as the broker applies
    it to this campaign: `attune.control.plane.load_gate_list`), one move from the baseline at a time.
    A warning, not an error: the search still runs, but a tuner would spend nothing useful there."""
    from attune.control.plane import load_gate_list
    from gate.config_check import check_recipe
    from gate.lists import ListError

    p = Path(where)
    try:
        loaded = load_gate_list(spec, p if p.is_dir() else p.parent, None)
    except (ListError, OSError):
        return []  # reported as a problem already
    base_args = {k: v for k, v in spec.baseline.args.items() if v not in (None, False)}
    base_env = {k: str(v) for k, v in (spec.baseline.env or {}).items()}
    out: list[str] = []
    for key, values in (spec.search_space or {}).items():
        refused = []
        for value in values:
            args, env = dict(base_args), dict(base_env)
            target: dict[str, Any] = args if key.startswith("--") else env
            if value is None or value is False:
                target.pop(key, None)
            else:
                target[key] = value if key.startswith("--") else str(value)
            if args == base_args and env == base_env:
                continue
            result = check_recipe(loaded, base_args, args, base_env, env)
            if not result.passed:
                refused.append((value, result.refusals[0].reason))
        if refused:
            vals = ", ".join(repr(v) for v, _ in refused)
            out.append(f"search_space.{key}: the correctness list refuses {vals} "
                       f"({len(refused)} of {len(values)} values), e.g. {refused[0][1]}")
    return out


def search_space_problems(spec: Any, campaign_dir: Path) -> list[tuple[str, str]]:
    """Each search-space key that neither the baseline nor the correctness list knows (a typo would only
    show up as gate refusals during the search), with the nearest known name."""
    import difflib
    import fnmatch

    from attune.control.plane import gate_list_source
    from gate.lists import ListError, load_list

    if not spec.search_space:
        return []
    known = set(spec.baseline.args) | set(spec.baseline.env)
    patterns: list[str] = []
    try:
        lst = load_list(gate_list_source(spec, campaign_dir), expected_sha256=spec.gate.list_sha256).clist
    except (ListError, OSError):
        lst = None  # reported on its own
    if lst is not None:
        known |= {f for dest, e in lst.args.items() if (f := e.cli_flag(dest))}
        known |= set(lst.env)
        patterns = [p.pattern for p in lst.env_patterns]
    problems = []
    for key in spec.search_space:
        if key in known or (not key.startswith("-") and any(fnmatch.fnmatchcase(key, p) for p in patterns)):
            continue
        near = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.75)
        problems.append((f"search_space.{key}", (
            "not a flag or variable of the baseline or of the correctness list"
            + (f": did you mean {near[0]}?" if near else " (a lever the gate does not know is refused at every launch)"))))
    return problems


def run(args: argparse.Namespace) -> int:
    try:
        spec = load_spec(args.spec)
    except SpecError as exc:
        if args.json:
            emit_json({"valid": False, **exc.as_dict()})
        else:
            print(str(exc), file=sys.stderr)
        return EXIT_USAGE
    problem = _gate_list_problem(spec, args.spec)
    where = Path(args.spec)
    problems = search_space_problems(spec, where if where.is_dir() else where.parent)
    if problem is not None or problems:
        exc = SpecError(args.spec, ([("gate.lists", problem)] if problem is not None else []) + problems)
        if args.json:
            emit_json({"valid": False, **exc.as_dict()})
        else:
            print(str(exc), file=sys.stderr)
        return EXIT_USAGE
    warnings = _search_space_warnings(spec, args.spec)
    digest = spec_sha256(args.spec)
    summary = {
        "name": spec.name,
        "model": spec.model,
        "framework": spec.framework,
        "backend": spec.cluster.backend,
        "gpus": spec.cluster.gpus,
        "tokens_per_step": spec.workload.tokens,
        "window": list(spec.workload.window),
        "budget_gpu_hours": spec.budget.gpu_hours,
    }
    if args.json:
        emit_json({"valid": True, "file": str(args.spec), "sha256": digest, "problems": [], "warnings": warnings,
                   "campaign": summary})
    else:
        for w in warnings:
            print(f"warning: {w}", file=sys.stderr)
        print(f"{args.spec}: valid campaign {spec.name!r} ({spec.model} on {spec.cluster.gpus} x "
              f"{spec.cluster.accelerator}, {spec.cluster.backend} backend); sha256 {digest[:12]}")
    return EXIT_OK
