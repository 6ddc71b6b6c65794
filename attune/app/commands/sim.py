"""`attune sim`: the simulated GPU cluster (a test bed and evaluation harness, not real GPUs).

    attune sim estimate CAMPAIGN.yaml [--set FLAG=VALUE ...] [--env NAME=VALUE ...] [--json]

predicts what the campaign's baseline (with the changes given by --set) would do on the simulated
cluster: its outcome (ok, oom, hang, crash), tokens/s/GPU, peak memory per pipeline stage and the
step-time terms. docs/sim.md describes the model and the JSON shape.
"""

from __future__ import annotations

import argparse
from typing import Any

from pydantic import ValidationError

from attune.control.spec import SpecError, load_spec
from attune.core.errors import EXIT_OK, UsageError
from attune.core.output import add_json_flag, emit_json
from attune.sim.api import SimInputError, apply_overrides, parse_override, resolve_accelerator, resolve_model
from attune.sim.constants import DEFAULT
from attune.sim.estimate import estimate, terms_help
from attune.sim.run import SimSettings

NOTE = "simulated: a test bed and evaluation harness, not a measurement or prediction of real GPUs"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sim", help="the simulated GPU cluster (test bed): estimate a recipe")
    ssub = p.add_subparsers(dest="sim_command", metavar="ACTION")
    ssub.required = True
    e = ssub.add_parser("estimate", help="predict a campaign's baseline (plus --set changes) on the simulated cluster")
    e.add_argument("campaign", help="campaign.yaml or a campaign directory")
    e.add_argument("--set", dest="sets", action="append", default=[], metavar="FLAG=VALUE",
                   help="change a training flag (repeatable); a bare --set FLAG sets it, FLAG=false removes it")
    e.add_argument("--env", dest="envs", action="append", default=[], metavar="NAME=VALUE",
                   help="set an environment variable of the job (repeatable)")
    add_json_flag(e)
    e.set_defaults(func=run_estimate)


def _settings(spec: Any) -> tuple[Any, bool]:
    """(constants, deepep_internode) from a sim campaign's cluster settings; defaults otherwise."""
    if spec.cluster.backend != "sim":
        return DEFAULT, False
    try:
        s = SimSettings(**spec.cluster.settings)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first["loc"])
        raise UsageError(f"cluster.settings.{loc}: {first['msg']}") from None
    except (SimInputError, ValueError) as exc:
        raise UsageError(f"cluster.settings: {exc}") from None
    return s.constants_obj(), s.deepep_internode


def run_estimate(args: argparse.Namespace) -> int:
    try:
        spec = load_spec(args.campaign)
    except SpecError as exc:
        raise UsageError(str(exc)) from None
    try:
        overrides = dict(parse_override(s) for s in args.sets)
        model = resolve_model(spec.model)
        acc = resolve_accelerator(spec.cluster.accelerator)
    except SimInputError as exc:
        raise UsageError(str(exc)) from None
    env = dict(spec.baseline.env)
    for item in args.envs:
        name, eq, value = item.partition("=")
        if not eq or not name:
            raise UsageError(f"--env {item!r}: expected NAME=VALUE")
        env[name] = value
    constants, deepep_internode = _settings(spec)
    flags = apply_overrides(spec.baseline.args, overrides)
    est = estimate(model, acc, spec.cluster.gpus, flags, env, spec.cluster.gpus_per_node, constants, deepep_internode)
    payload = {
        "campaign": spec.name,
        "model": model.name,
        "accelerator": acc.name,
        "gpus": spec.cluster.gpus,
        "changes": {k: v for k, v in overrides.items()},
        **est.as_dict(),
        "simulated": True,
        "note": NOTE,
    }
    if args.json:
        emit_json(payload)
        return EXIT_OK
    _print(payload)
    return EXIT_OK


def _print(p: dict[str, Any]) -> None:
    print(f"{p['campaign']}: {p['model']} on {p['gpus']} x {p['accelerator']} ({NOTE})")
    if p["changes"]:
        print("changes: " + ", ".join(f"{k}={v}" for k, v in p["changes"].items()))
    lay = p.get("layout")
    if lay:
        print(f"layout: TP{lay['tp']} PP{lay['pp']} VP{lay['vp']} CP{lay['cp']} DP{lay['dp']} EP{lay['ep']} "
              f"ETP{lay['etp']} EDP{lay['edp']}; stage layers {lay['stage_layers']}; "
              f"{p['microbatches']} microbatches per step")
    print(f"outcome: {p['outcome']} ({p['reason']})")
    if p["tokens_per_s_per_gpu"] is not None:
        print(f"throughput: {p['tokens_per_s_per_gpu']:.1f} tokens/s/GPU; step {p['step_time_ms'] / 1e3:.2f} s; "
              f"MFU {p['mfu'] * 100:.1f}%; slowest stage {p['critical_stage']}")
        helps = terms_help()
        for name, ms in p["terms_ms"].items():
            if ms > 0:
                print(f"  {name:18} {ms / 1e3:10.3f} s  {helps[name]}")
    mem = p.get("memory")
    if mem:
        print(f"memory: peak {mem['peak_gib']:.1f} GiB on stage {mem['peak_stage']} of {mem['capacity_gib']:.1f} GiB")
        for st in mem["stages"]:
            print(f"  stage {st['stage']:2d} (rank {st['first_rank']:4d}): peak {st['peak_gib']:7.1f} GiB "
                  f"(weights+optimizer {st['weights_gib']:.1f}, activations {st['activations_gib']:.1f}, "
                  f"buffers {st['buffers_gib']:.1f})")
    if p.get("unmodelled_flags"):
        print("flags the simulator does not model (no effect): " + " ".join(p["unmodelled_flags"]))
    for d in p["defects"]:
        print(f"defect: {d['id']} ({d['effect']}) - {d['source']}")
