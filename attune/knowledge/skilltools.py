"""Command lines of the tuning skill's helper scripts (skills/attune/scripts/*.py).

Each `*_main(argv)` parses its arguments, prints text or one JSON document (--json), and
returns the exit code: 0 done, 1 the checked thing failed (a layout that does not fit, a
lesson refused), 2 bad input. Standard library plus PyYAML only, so that a bare `python3`
runs the scripts; the scripts are thin wrappers that put the plugin root on sys.path.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from attune.knowledge.layouts import (
    LayoutError,
    LayoutOptions,
    ModelDims,
    enumerate_layouts,
    find_model,
    layout_dict,
    layout_from_degrees,
    load_models,
    load_yaml,
    model_from_mapping,
)
from attune.knowledge.lessons import (
    LESSONS_ENV,
    LessonError,
    LessonRefused,
    add_lesson,
    default_lessons_path,
    pending_path,
)
from attune.knowledge.memory_estimate import RECOMPUTE_MODULES, MemoryOptions, accelerator_gib, estimate

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

_DIM_ARGS = (
    ("layers", int), ("hidden", int), ("heads", int), ("query_groups", int), ("head_dim", int),
    ("ffn", int), ("vocab", int), ("experts", int), ("topk", int), ("moe_ffn", int),
    ("shared_expert_ffn", int), ("dense_layers", int),
)


def _emit(payload: Any) -> None:
    json.dump(payload, sys.stdout, indent=2)
    sys.stdout.write("\n")


def _fail(prog: str, msg: str, as_json: bool) -> int:
    if as_json:
        _emit({"ok": False, "error": msg})
    print(f"{prog}: error: {msg}", file=sys.stderr)
    return EXIT_USAGE


# --------------------------------------------------------------------------- model arguments


def add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model (a known name, a file, and/or explicit dimensions that override it)")
    g.add_argument("--model", help="name or alias from catalog/models.yaml (e.g. glm-4.5, tinygpt)")
    g.add_argument("--models-file", type=Path, help="another models.yaml to read --model from")
    g.add_argument("--model-file", type=Path, help="a YAML file holding one model's fields")
    for name, typ in _DIM_ARGS:
        g.add_argument(f"--{name.replace('_', '-')}", dest=f"dim_{name}", type=typ, metavar="N")
    g.add_argument("--gated-mlp", dest="dim_gated_mlp", action=argparse.BooleanOptionalAction, default=None)
    g.add_argument(
        "--tied-embeddings", dest="dim_tied_embeddings", action=argparse.BooleanOptionalAction, default=None
    )


def model_from_args(args: argparse.Namespace) -> ModelDims:
    base: dict[str, Any] = {}
    if args.model_file:
        try:
            data = load_yaml(args.model_file.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as exc:
            raise LayoutError(f"--model-file {args.model_file}: {exc}") from None
        base = dict(model_from_mapping(data, str(args.model_file)).summary())
        base.pop("total_params"), base.pop("active_params")
    elif args.model:
        models = load_models(args.models_file) if args.models_file else load_models()
        m = find_model(args.model, models)
        base = dict(m.summary())
        base.pop("total_params"), base.pop("active_params")
        base["aliases"] = list(m.aliases)
    overrides = {
        k[4:]: v for k, v in vars(args).items() if k.startswith("dim_") and v is not None
    }
    if not base:
        missing = [f"--{f}" for f in ("layers", "hidden", "heads") if f not in overrides]
        if missing:
            raise LayoutError(f"give --model NAME, --model-file FILE, or at least {', '.join(missing)}")
        base = {"name": "custom"}
        if "ffn" not in overrides and not overrides.get("experts"):
            overrides["ffn"] = 4 * overrides["hidden"]  # the usual dense MLP width
    elif overrides:
        base["name"] = f"{base['name']} (modified)"
    base.update(overrides)
    return model_from_mapping(base, "model")


def _int_set(text: str) -> set[int]:
    try:
        vals = {int(x) for x in text.split(",") if x.strip()}
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not vals or min(vals) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return vals


def _modules(text: str) -> tuple[str, ...]:
    mods = tuple(m.strip() for m in text.split(",") if m.strip())
    bad = [m for m in mods if m not in RECOMPUTE_MODULES]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown module(s) {bad}; known: {', '.join(RECOMPUTE_MODULES)}")
    return mods


def add_memory_args(p: argparse.ArgumentParser, *, for_layouts: bool = False) -> None:
    g = p.add_argument_group("memory estimate")
    g.add_argument("--recompute", choices=("none", "selective", "full"), default="selective")
    g.add_argument("--recompute-modules", type=_modules, default=("core_attn",),
                   help=f"selective recompute modules, comma-separated ({', '.join(RECOMPUTE_MODULES)})")
    g.add_argument("--recompute-method", choices=("uniform", "block"), default="uniform")
    g.add_argument("--recompute-num-layers", type=int, default=1)
    g.add_argument("--no-distributed-optimizer", action="store_true")
    if not for_layouts:
        g.add_argument("--sequence-parallel", action=argparse.BooleanOptionalAction, default=None,
                       help="default: on when TP > 1")
    g.add_argument("--no-flash-attention", action="store_true", help="store attention scores (5 a s'/h)")
    g.add_argument("--optimizer-offload-fraction", type=float, default=0.0)
    g.add_argument("--param-bytes", type=int, default=2, help="1 with FP8 weights")
    g.add_argument("--grad-bytes", type=int, default=4, help="2 when gradients are reduced in BF16")
    g.add_argument("--margin", type=float, default=0.10, help="fraction added for fragmentation and buffers")
    cap = g.add_mutually_exclusive_group()
    cap.add_argument("--gpu-memory-gib", type=float, help="memory of one GPU in GiB")
    cap.add_argument("--accelerator", help="h100, h200 or b200 (their nvidia-smi totals)")


def memory_options(args: argparse.Namespace, seq_length: int, num_microbatches: int | None) -> MemoryOptions:
    cap = args.gpu_memory_gib
    if args.accelerator:
        cap = accelerator_gib(args.accelerator)
    return MemoryOptions(
        seq_length=seq_length,
        micro_batch=args.micro_batch,
        num_microbatches=num_microbatches,
        distributed_optimizer=not args.no_distributed_optimizer,
        sequence_parallel=getattr(args, "sequence_parallel", None),
        recompute=args.recompute,
        recompute_modules=args.recompute_modules,
        recompute_method=args.recompute_method,
        recompute_num_layers=args.recompute_num_layers,
        flash_attention=not args.no_flash_attention,
        optimizer_offload_fraction=args.optimizer_offload_fraction,
        param_bytes=args.param_bytes,
        grad_bytes=args.grad_bytes,
        margin=args.margin,
        gpu_memory_gib=cap,
    )


def _model_brief(m: ModelDims) -> dict[str, Any]:
    return {
        "name": m.name, "layers": m.layers, "hidden": m.hidden, "heads": m.heads,
        "query_groups": m.groups, "experts": m.experts, "topk": m.topk, "moe_ffn": m.moe_ffn,
        "ffn": m.ffn, "vocab": m.vocab, "seq_length": m.seq_length,
        "total_params": m.total_params(), "active_params": m.active_params(),
    }


# --------------------------------------------------------------------------- layouts.py


CONSTRAINTS = [
    "world = TP x PP x CP x DP",
    "MoE: ETP x EP x EDP = TP x CP x DP; routed experts divisible by EP; expert FFN width divisible by ETP",
    "attention heads and query groups divisible by TP",
    "layers split over PP stages (even, embedding/loss accounted, or uneven first/last); each stage divisible by VP",
    "VP > 1 needs PP >= 2 (PP > 2 unless --overlap-p2p-comm)",
    "seq_length divisible by 2 x CP when CP > 1",
    "global batch divisible by micro batch x DP (when --global-batch is given)",
]


def layouts_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="layouts.py",
        description="List every feasible parallel layout (TP, PP, VP, CP, EP, ETP, DP, EDP) of a model on a "
        "GPU count, optionally with a per-layout memory estimate.",
    )
    add_model_args(p)
    g = p.add_argument_group("cluster and workload")
    g.add_argument("--gpus", type=int, required=True, help="GPUs every job uses (pinned by the campaign)")
    g.add_argument("--gpus-per-node", type=int, default=8)
    g.add_argument("--seq-length", type=int, help="default: the model's typical sequence length")
    g.add_argument("--global-batch", type=int, help="rows per step; enables the microbatch checks")
    g.add_argument("--micro-batch", type=int, default=1)
    f = p.add_argument_group("filters")
    f.add_argument("--tp-within-node", action=argparse.BooleanOptionalAction, default=True,
                   help="keep each TP group inside a node (default: on)")
    f.add_argument("--ep-within-node", action="store_true", help="keep each ETP x EP group inside a node")
    f.add_argument("--even-only", action="store_true", help="only even pipeline splits")
    f.add_argument("--max-vp", type=int, help="largest virtual-stage count to list (default: no limit)")
    for d in ("tp", "pp", "vp", "cp", "ep", "etp", "dp", "edp"):
        f.add_argument(f"--{d}", type=_int_set, metavar="N[,N...]", help=f"only these {d.upper()} values")
    o = p.add_argument_group("output")
    o.add_argument("--memory", action="store_true", help="add a memory estimate to every layout")
    o.add_argument("--fits-only", action="store_true", help="with --memory and a GPU size: drop layouts that do not fit")
    o.add_argument("--limit", type=int, default=50, help="layouts to print (0: all); the count is always total")
    o.add_argument("--json", action="store_true", help="print one JSON document")
    add_memory_args(p, for_layouts=True)
    return p


def _layout_rows(args: argparse.Namespace, model: Any, reports: list[Any]) -> list[dict[str, Any]]:
    """Each layout's row, with its memory estimate when asked (dropping those that do not fit with --fits-only)."""
    seq = args.seq_length or model.seq_length
    rows: list[dict[str, Any]] = []
    for r in reports:
        d = r.as_dict()
        if args.memory:
            if seq is None:
                raise LayoutError("--memory needs --seq-length (the model has no typical one)")
            est = estimate(model, r.layout, memory_options(args, seq, r.num_microbatches))
            if args.fits_only and est.fits is False:
                continue
            peak = est.peak
            d["memory"] = {"peak_gib": round(peak.with_margin_bytes / 2**30, 3), "peak_stage": peak.stage,
                           "fits": est.fits}
        rows.append(d)
    return rows


def _print_layouts(args: argparse.Namespace, model: Any, rows: list[dict[str, Any]],
                   shown: list[dict[str, Any]]) -> None:
    moe = model.is_moe
    head = f"{'TP':>3} {'PP':>3} {'VP':>3} {'CP':>3} {'DP':>4}"
    head += f" {'EP':>4} {'ETP':>4} {'EDP':>4}" if moe else ""
    head += f"  {'split':<22}" + ("  mem GiB  fits" if args.memory else "")
    print(f"{model.name}: {len(rows)} feasible layout(s) on {args.gpus} GPUs ({args.gpus_per_node} per node)"
          + (f", showing {len(shown)}" if len(shown) < len(rows) else ""))
    print(head)
    for d in shown:
        sp = d["split"]
        split = sp["kind"] if sp["kind"] == "even" else f"{sp['kind']} {sp['first']}/{sp['middle']}/{sp['last']}"
        line = f"{d['tp']:>3} {d['pp']:>3} {d['vp']:>3} {d['cp']:>3} {d['dp']:>4}"
        if moe:
            line += f" {d['ep']:>4} {d['etp']:>4} {d['edp']:>4}"
        line += f"  {split:<22}"
        if args.memory:
            line += f"  {d['memory']['peak_gib']:>7.1f}  {d['memory']['fits']}"
        print(line)


def layouts_main(argv: Sequence[str] | None = None) -> int:
    p = layouts_parser()
    args = p.parse_args(argv)
    try:
        model = model_from_args(args)
        allowed = {d: getattr(args, d) for d in ("tp", "pp", "vp", "cp", "ep", "etp", "dp", "edp")
                   if getattr(args, d) is not None}
        opts = LayoutOptions(
            gpus=args.gpus, gpus_per_node=args.gpus_per_node, seq_length=args.seq_length,
            global_batch=args.global_batch, micro_batch=args.micro_batch, tp_within_node=args.tp_within_node,
            ep_within_node=args.ep_within_node, allow_uneven=not args.even_only, max_vp=args.max_vp,
            allowed=allowed,
        )
        if args.limit < 0:
            raise LayoutError(f"--limit must be >= 0, got {args.limit}")
        if args.fits_only and not (args.memory and (args.gpu_memory_gib or args.accelerator)):
            raise LayoutError("--fits-only needs --memory and a GPU size (--accelerator or --gpu-memory-gib)")
        rows = _layout_rows(args, model, enumerate_layouts(model, opts))
    except LayoutError as exc:
        return _fail("layouts.py", str(exc), args.json)
    shown = rows if args.limit == 0 else rows[: args.limit]
    payload = {
        "model": _model_brief(model),
        "gpus": args.gpus,
        "gpus_per_node": args.gpus_per_node,
        "seq_length": args.seq_length or model.seq_length,
        "global_batch": args.global_batch,
        "micro_batch": args.micro_batch,
        "filters": {
            "tp_within_node": args.tp_within_node, "ep_within_node": args.ep_within_node,
            "even_only": args.even_only, "max_vp": args.max_vp,
            **{k: sorted(v) for k, v in allowed.items()},
            "fits_only": args.fits_only,
        },
        "constraints": CONSTRAINTS,
        "count": len(rows),
        "shown": len(shown),
        "layouts": shown,
    }
    if args.json:
        _emit(payload)
        return EXIT_OK
    _print_layouts(args, model, rows, shown)
    return EXIT_OK


# --------------------------------------------------------------------------- memory.py


def memory_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="memory.py",
        description="Estimate each pipeline stage's peak memory for one layout (megatron.md formulas). "
        "Exit 1 when a GPU size is given and a stage does not fit.",
    )
    add_model_args(p)
    g = p.add_argument_group("layout")
    g.add_argument("--gpus", type=int, required=True)
    for d in ("tp", "pp", "cp", "vp"):
        g.add_argument(f"--{d}", type=int, default=1)
    g.add_argument("--ep", type=int)
    g.add_argument("--etp", type=int)
    g.add_argument("--first-stage-layers", type=int, help="--decoder-first-pipeline-num-layers")
    g.add_argument("--last-stage-layers", type=int, help="--decoder-last-pipeline-num-layers")
    g.add_argument("--account-embedding-loss", action="store_true",
                   help="the embedding and the loss each count as one layer in the split")
    w = p.add_argument_group("workload")
    w.add_argument("--seq-length", type=int, help="default: the model's typical sequence length")
    w.add_argument("--micro-batch", type=int, default=1)
    w.add_argument("--global-batch", type=int, help="caps the microbatches in flight at global / (micro x DP)")
    add_memory_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON document")
    return p


def memory_main(argv: Sequence[str] | None = None) -> int:
    p = memory_parser()
    args = p.parse_args(argv)
    try:
        model = model_from_args(args)
        layout = layout_from_degrees(
            model, args.gpus, tp=args.tp, pp=args.pp, cp=args.cp, vp=args.vp, ep=args.ep, etp=args.etp,
            first=args.first_stage_layers, last=args.last_stage_layers,
            account_embedding_loss=args.account_embedding_loss,
        )
        seq = args.seq_length or model.seq_length
        if seq is None:
            raise LayoutError("give --seq-length (the model has no typical one)")
        mb = None
        if args.global_batch is not None:
            per = args.micro_batch * layout.dp
            if args.global_batch <= 0 or args.global_batch % per:
                raise LayoutError(
                    f"--global-batch ({args.global_batch}) must be a positive multiple of micro batch x DP ({per})"
                )
            mb = args.global_batch // per
        opts = memory_options(args, seq, mb)
        est = estimate(model, layout, opts)
    except LayoutError as exc:
        return _fail("memory.py", str(exc), args.json)
    payload = {
        "model": _model_brief(model),
        "layout": layout_dict(layout),
        "options": {
            "seq_length": seq, "micro_batch": args.micro_batch, "num_microbatches": mb,
            "distributed_optimizer": opts.distributed_optimizer,
            "sequence_parallel": opts.sequence_parallel if opts.sequence_parallel is not None else layout.tp > 1,
            "recompute": opts.recompute, "recompute_modules": list(opts.recompute_modules),
            "recompute_method": opts.recompute_method, "recompute_num_layers": opts.recompute_num_layers,
            "flash_attention": opts.flash_attention, "optimizer_offload_fraction": opts.optimizer_offload_fraction,
            "param_bytes": opts.param_bytes, "grad_bytes": opts.grad_bytes,
        },
        **est.as_dict(),
    }
    code = EXIT_FAILED if est.fits is False else EXIT_OK
    if args.json:
        _emit(payload)
        return code
    lay = payload["layout"]
    deg = " ".join(f"{k.upper()}{lay[k]}" for k in ("tp", "pp", "vp", "cp", "dp", "ep", "etp", "edp")
                   if lay[k] is not None)
    print(f"{model.name} on {args.gpus} GPUs: {deg}; split {lay['split']['kind']} "
          f"{lay['split']['first']}/{lay['split']['middle']}/{lay['split']['last']}")
    print(f"{'stage':>5} {'layers':>6} {'weights':>8} {'activ':>8} {'in-flt':>6} {'logits':>7} {'total':>8} "
          f"{'+margin':>8}  fits")
    for s in payload["stages"]:
        print(f"{s['stage']:>5} {s['layers']:>6} {s['weights_gib']:>8.2f} {s['activations_gib']:>8.2f} "
              f"{s['microbatches_in_flight']:>6.2f} {s['logits_gib']:>7.2f} {s['total_gib']:>8.2f} "
              f"{s['with_margin_gib']:>8.2f}  {s['fits']}")
    cap = payload["gpu_memory_gib"]
    print(f"peak: stage {payload['peak_stage']} at {payload['peak_gib']:.2f} GiB with a {opts.margin:.0%} margin"
          + (f" of {cap:.1f} GiB: {'fits' if est.fits else 'does NOT fit'}" if cap else ""))
    return code


# --------------------------------------------------------------------------- add_lesson.py


def add_lesson_parser(prog: str = "add_lesson.py") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Append a lesson (a general rule about one lever) to the catalog's lessons.yaml. Refuses "
        "throughput figures and model names, with the reason; exit 1 when refused.",
    )
    add_lesson_args(p)
    return p


def add_lesson_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lever", required=True, help="the lever id from levers.yaml")
    p.add_argument("--rule", required=True, help="the rule, phrased as guidance")
    p.add_argument("--applies-when", help="the conditions under which the rule holds")
    p.add_argument("--evidence", help="what established it (qualitative: which runs, which trace)")
    p.add_argument("--file", type=Path, help=f"lessons file (default: ${LESSONS_ENV} or the skill's lessons.yaml)")
    p.add_argument("--levers-file", type=Path, help="lever catalog to check --lever against")
    p.add_argument("--json", action="store_true", help="print one JSON document")


def agent_author() -> str:
    """Who proposes a lesson through the skill's script: an agent, of the campaign it runs in."""
    where = os.environ.get("CLAUDE_PROJECT_DIR") or os.getcwd()
    return f"agent (campaign {os.path.basename(os.path.normpath(where))})"


def run_add_lesson(args: argparse.Namespace, prog: str, *, pending: bool = False, author: str | None = None) -> int:
    """Append a lesson; `pending` (an agent's proposal): to lessons.pending.yaml, until a person accepts it."""
    path = args.file or default_lessons_path()
    try:
        entry = add_lesson(
            path, lever=args.lever, rule=args.rule, applies_when=args.applies_when, evidence=args.evidence,
            levers_path=args.levers_file, pending=pending, author=author,
        )
    except LessonRefused as exc:
        if args.json:
            _emit({"added": False, "file": str(path), "problems": exc.problems})
        print(f"{prog}: refused: the lesson was not written", file=sys.stderr)
        for pr in exc.problems:
            print(f"  {pr['field']}: {pr['reason']} (found {pr['match']!r})", file=sys.stderr)
        return EXIT_FAILED
    except LessonError as exc:
        if args.json:
            _emit({"added": False, "file": str(path), "error": str(exc)})
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    written = pending_path(path) if pending else path
    if args.json:
        _emit({"added": True, "pending": pending, "file": str(written), "lesson": entry})
    elif pending:
        print(f"proposed {entry['id']}: it waits in {written} until a person accepts it "
              f"(attune catalog accept-lesson {entry['id']})")
    else:
        print(f"added {entry['id']} to {path}")
    return EXIT_OK


def add_lesson_main(argv: Sequence[str] | None = None) -> int:
    """The skill's script: an agent proposes; the lesson waits (pending) for a person."""
    p = add_lesson_parser()
    return run_add_lesson(p.parse_args(argv), "add_lesson.py", pending=True, author=agent_author())


# --------------------------------------------------------------------------- levers.py


def levers_main(argv: Sequence[str] | None = None) -> int:
    from attune.knowledge.lessons import LEVERS_PATH, read_lessons

    p = argparse.ArgumentParser(
        prog="levers.py",
        description="Look up the lever catalog: list levers (filtered) or show one in full with its lessons.",
    )
    p.add_argument("lever", nargs="?", help="a lever id to show in full")
    p.add_argument("--framework", choices=("megatron", "tinygpt"))
    p.add_argument("--class", dest="objective_class", choices=("structural", "same-math", "numeric"))
    p.add_argument("--category")
    p.add_argument("--search", help="case-insensitive text to find in any field")
    p.add_argument("--file", type=Path, default=LEVERS_PATH)
    p.add_argument("--lessons-file", type=Path)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    try:
        doc = load_yaml(args.file.read_text(encoding="utf-8"))
        levers = doc["levers"]
        lessons = read_lessons(args.lessons_file or default_lessons_path())
    except (OSError, yaml.YAMLError, KeyError, TypeError, LessonError) as exc:
        return _fail("levers.py", f"cannot read the catalog: {exc}", args.json)
    if args.lever:
        match = [lv for lv in levers if lv["id"] == args.lever]
        if not match:
            return _fail("levers.py", f"unknown lever {args.lever!r}; list them with levers.py", args.json)
        lv = dict(match[0])
        lv["lessons"] = [ls for ls in lessons if ls.get("lever") == args.lever]
        if args.json:
            _emit(lv)
        else:
            print(yaml.safe_dump(lv, sort_keys=False, allow_unicode=True, width=100), end="")
        return EXIT_OK
    rows = []
    for lv in levers:
        if args.framework and args.framework not in lv["frameworks"]:
            continue
        if args.objective_class and lv["objective_class"] != args.objective_class:
            continue
        if args.category and lv["category"] != args.category:
            continue
        if args.search and args.search.lower() not in json.dumps(lv).lower():
            continue
        rows.append({
            "id": lv["id"], "title": lv["title"], "objective_class": lv["objective_class"],
            "category": lv["category"], "flags": [f["name"] for f in lv["flags"]],
            "size": lv["rough_size"]["size"],
            "lessons": sum(1 for ls in lessons if ls.get("lever") == lv["id"]),
        })
    if args.json:
        _emit({"count": len(rows), "levers": rows})
        return EXIT_OK
    for r in rows:
        extra = f" [{r['lessons']} lesson(s)]" if r["lessons"] else ""
        print(f"{r['id']:<30} {r['objective_class']:<10} {r['size']:<10} {', '.join(r['flags'])}{extra}")
    print(f"{len(rows)} lever(s)")
    return EXIT_OK
