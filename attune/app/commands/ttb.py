"""`attune ttb ...`: TrainingThroughputBench: workload, templates, submit, verify, build, best.

    attune ttb workload build --tokenizer DIR|bytes --out DIR [--conversations FILE.jsonl] ...
    attune ttb workload verify DIR
    attune ttb template CAMPAIGN --out DIR [--protocol ttb-v1|ttb-v1-local] [--data PATH]
    attune ttb submit CAMPAIGN_DIR [--entries DIR] [--prices FILE]
    attune ttb verify ENTRY...
    attune ttb build ENTRY... --out DIR [--prices FILE]
    attune ttb best MODEL ACCELERATOR [--entries DIR]
    attune ttb schema [--write]

Exit codes: 0 ok, 1 the checked thing failed (a refused submission, an entry that does not
verify, no verified entry), 2 bad input.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from attune.core.campaign_paths import CAMPAIGN_FILE
from attune.core.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from attune.core.output import add_json_flag, emit_json

DEFAULT_ENTRIES = Path("ttb") / "entries"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ttb", help="TrainingThroughputBench: submit, verify and publish the fastest verified recipes")
    tsub = p.add_subparsers(dest="ttb_command", metavar="SUBCOMMAND")
    tsub.required = True

    w = tsub.add_parser("workload", help="build or verify the TTB rows")
    wsub = w.add_subparsers(dest="workload_command", metavar="ACTION")
    wsub.required = True
    wb = wsub.add_parser("build", help="render, tokenize and pack conversations into hash-listed rows")
    wb.add_argument("--tokenizer", required=True, help="a Hugging Face tokenizer directory, or 'bytes'")
    wb.add_argument("--conversations", help="a JSONL file of {messages: [...]}; default: the Tulu 3 SFT mixture")
    wb.add_argument("--protocol", default="ttb-v1", help="ttb-v1 (default) or ttb-v1-local: sets the row length")
    wb.add_argument("--seq-length", type=int, help="tokens per row (default: the protocol's)")
    wb.add_argument("--rows", type=int, help="rows to build (default: 14 steps x the protocol's global batch)")
    wb.add_argument("--repeat", action="store_true", help="read a short source again from its start")
    wb.add_argument("--tinygpt", help="also write the rows in tinygpt's format to this directory")
    wb.add_argument("--out", required=True, help="output directory (rows.u32 and manifest.json)")
    add_json_flag(wb)
    wb.set_defaults(func=_workload_build)
    wv = wsub.add_parser("verify", help="check every row against the manifest's hashes")
    wv.add_argument("dir")
    add_json_flag(wv)
    wv.set_defaults(func=_workload_verify)

    t = tsub.add_parser("template", help="a TTB campaign directory from a model's campaign")
    t.add_argument("campaign", help="the model's campaign.yaml or directory")
    t.add_argument("--out", required=True, help="directory for campaign.yaml and gate-list.yaml")
    t.add_argument("--protocol", default="ttb-v1")
    t.add_argument("--data", help="the --data-path the baseline reads (must contain the protocol's data id)")
    add_json_flag(t)
    t.set_defaults(func=_template)

    s = tsub.add_parser("submit", help="an entry from a finished TTB campaign's shipped recipe")
    s.add_argument("campaign", help="campaign directory")
    s.add_argument("--entries", default=str(DEFAULT_ENTRIES), help="where entries live (default ttb/entries)")
    s.add_argument("--prices", help="price table (default ttb/prices.yaml)")
    s.add_argument("--public-recipe", help="the model's public recipe as a campaign.yaml (default: the baseline)")
    add_json_flag(s)
    s.set_defaults(func=_submit)

    v = tsub.add_parser("verify", help="recompute entries from their stored evidence, offline")
    v.add_argument("entries", nargs="+", help="entry directories, or directories of entries")
    add_json_flag(v)
    v.set_defaults(func=_verify)

    b = tsub.add_parser("build", help="the leaderboard: a static page and a JSON index")
    b.add_argument("entries", nargs="+", help="entry directories, or directories of entries")
    b.add_argument("--out", required=True, help="output directory (index.html, index.json, entries/)")
    b.add_argument("--prices", help="price table (default ttb/prices.yaml)")
    add_json_flag(b)
    b.set_defaults(func=_build)

    q = tsub.add_parser("best", help="the fastest verified recipe for a model and accelerator (a prior)")
    q.add_argument("model")
    q.add_argument("accelerator")
    q.add_argument("--entries", default=str(DEFAULT_ENTRIES))
    q.add_argument("--include-simulated", action="store_true", help="fall back to simulated entries")
    add_json_flag(q)
    q.set_defaults(func=_best)

    sc = tsub.add_parser("schema", help="print the entry JSON Schema (--write: update the committed file)")
    sc.add_argument("--write", action="store_true")
    sc.set_defaults(func=_schema)


def _err(msg: str) -> int:
    print(f"attune ttb: error: {msg}", file=sys.stderr)
    return EXIT_USAGE


def _prices(path: str | None) -> Any:
    from attune.ttb.entry import load_prices

    return load_prices(path)


def _workload_build(args: argparse.Namespace) -> int:
    from attune.ttb import protocol as proto
    from attune.ttb import workload as wl

    p = proto.PROTOCOLS.get(args.protocol)
    if p is None:
        return _err(f"--protocol: expected one of {', '.join(proto.PROTOCOLS)}, got {args.protocol!r}")
    seq = args.seq_length or p.seq_length
    rows = args.rows or p.steps_per_run * p.global_batch
    try:
        res = wl.build_rows(args.out, tokenizer=args.tokenizer, seq_length=seq, num_rows=rows,
                            conversations=args.conversations, repeat=args.repeat, protocol=p.id)
        tiny = str(wl.export_tinygpt(wl.Rows(res.out), args.tinygpt)) if args.tinygpt else None
    except wl.WorkloadError as exc:
        return _err(str(exc))
    out = {"out": str(res.out), "rows": res.num_rows, "seq_length": seq, "conversations": res.conversations,
           "tokens_sha256": res.tokens_sha256, "manifest_sha256": wl.manifest_sha256(res.out), "tinygpt": tiny}
    if args.json:
        emit_json(out)
    else:
        print(f"{res.num_rows} rows of {seq} tokens from {res.conversations} conversations in {res.out}")
    return EXIT_OK


def _workload_verify(args: argparse.Namespace) -> int:
    from attune.ttb import workload as wl

    try:
        rows = wl.Rows(args.dir)
    except wl.WorkloadError as exc:
        return _err(str(exc))
    try:
        n = rows.verify()
        ok, detail = True, f"{n} rows match their hashes"
    except wl.RowHashError as exc:
        ok, detail = False, str(exc)
    if args.json:
        emit_json({"dir": args.dir, "ok": ok, "detail": detail})
    else:
        print(("ok: " if ok else "FAILED: ") + detail)
    return EXIT_OK if ok else EXIT_FAILED


def _template(args: argparse.Namespace) -> int:
    from attune.control.spec import SpecError, load_spec
    from attune.ttb import protocol as proto

    p = proto.PROTOCOLS.get(args.protocol)
    if p is None:
        return _err(f"--protocol: expected one of {', '.join(proto.PROTOCOLS)}, got {args.protocol!r}")
    try:
        out = proto.write_campaign(args.campaign, args.out, p, args.data)
        spec = load_spec(out)
    except (OSError, ValueError) as exc:
        return _err(str(exc))
    except SpecError as exc:
        return _err(str(exc))
    probs = proto.problems(spec, p)
    if args.json:
        emit_json({"out": str(out), "protocol": p.id, "campaign": spec.name, "problems": probs})
    else:
        print(f"{out / CAMPAIGN_FILE}: {spec.name} ({p.id})")
    return EXIT_OK if not probs else EXIT_FAILED


def _submit(args: argparse.Namespace) -> int:
    from attune.ttb.entry import EntryError
    from attune.ttb.submit import SubmitRefused, submit

    d = Path(args.campaign)
    if not d.is_dir():
        return _err(f"{d}: not a directory")
    try:
        prices = _prices(args.prices)
        path, entry = submit(d, args.entries, prices, public_recipe=args.public_recipe)
    except EntryError as exc:
        return _err(str(exc))
    except SubmitRefused as exc:
        if args.json:
            emit_json({"campaign": str(d), "submitted": False, "reason": str(exc)})
        else:
            print(f"attune ttb submit: refused: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        emit_json({"campaign": str(d), "submitted": True, "entry": str(path), "id": entry.id,
                   "tokens_per_s_per_gpu": entry.throughput.tokens_per_s_per_gpu,
                   "usd_per_million_tokens": entry.cost.usd_per_million_tokens, "simulated": entry.simulated})
    else:
        print(f"entry {entry.id}: {entry.throughput.tokens_per_s_per_gpu:,.1f} tokens/s/GPU -> {path}")
    return EXIT_OK


def _verify(args: argparse.Namespace) -> int:
    from attune.ttb.verify import verify_many

    reports, bad = verify_many(args.entries)
    if bad:
        for b in bad:
            print(f"attune ttb verify: error: {b}", file=sys.stderr)
        if args.json:
            emit_json({"ok": False, "errors": bad, "entries": [r.as_dict() for r in reports]})
        return EXIT_USAGE
    ok = all(r.ok for r in reports)
    if args.json:
        emit_json({"ok": ok, "entries": [r.as_dict() for r in reports]})
    else:
        for r in reports:
            print(f"{'ok    ' if r.ok else 'FAILED'} {r.entry}")
            for i in r.items:
                print(f"    {'ok  ' if i.ok else 'FAIL'} {i.item}: {i.detail}")
    return EXIT_OK if ok else EXIT_FAILED


def _build(args: argparse.Namespace) -> int:
    from attune.ttb.entry import EntryError
    from attune.ttb.page import build
    from attune.ttb.verify import expand

    bad: list[str] = []
    paths = expand(args.entries, bad)
    if bad:
        return _err("; ".join(bad))
    try:
        index = build(paths, args.out, _prices(args.prices))
    except (EntryError, ValueError) as exc:
        return _err(str(exc))
    summary = {"out": args.out, "html": str(Path(args.out) / "index.html"), "index": str(Path(args.out) / "index.json"),
               "leaderboard": len(index["leaderboard"]), "history": len(index["history"]),
               "not_verified": [x["id"] for x in index["not_verified"]]}
    if args.json:
        emit_json(summary)
    else:
        print(f"{summary['leaderboard']} leading recipe(s), {summary['history']} in history, "
              f"{len(summary['not_verified'])} not verified -> {summary['html']}")
    return EXIT_OK


def _best(args: argparse.Namespace) -> int:
    from attune.ttb.lookup import best

    res = best(args.entries, args.model, args.accelerator, include_simulated=args.include_simulated)
    if args.json:
        emit_json(res)
    elif res["found"]:
        r = res["entry"]
        print(f"{r['id']}: {r['tokens_per_s_per_gpu']:,.1f} tokens/s/GPU{' (' + r['label'] + ')' if r['label'] else ''}")
        print(f"recipe: {r['recipe_script']}")
    else:
        print(res["reason"])
    return EXIT_OK if res["found"] else EXIT_FAILED


def _schema(args: argparse.Namespace) -> int:
    from attune.ttb.entry import SCHEMA_PATH, schema_text

    if args.write:
        SCHEMA_PATH.write_text(schema_text(), encoding="utf-8")
        print(f"wrote {SCHEMA_PATH}")
    else:
        sys.stdout.write(schema_text())
    return EXIT_OK
