"""`attune catalog`: validate the tuning skill's lever catalog and lessons, write their schemas,
append a lesson."""

from __future__ import annotations

import argparse
from pathlib import Path

from attune.core.errors import EXIT_FAILED, EXIT_OK, UsageError
from attune.core.output import add_json_flag, emit_json
from attune.knowledge.catalog import (
    LESSONS_PATH,
    LEVERS_PATH,
    CatalogError,
    levers_json_schema,
    load_catalog,
    load_lessons,
    schema_texts,
)
from attune.knowledge.skilltools import add_lesson_args, run_add_lesson


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("catalog", help="the tuning skill's lever catalog and lessons")
    csub = p.add_subparsers(dest="catalog_command", metavar="ACTION")
    csub.required = True

    v = csub.add_parser("validate", help="validate levers.yaml and lessons.yaml and check the schemas are in sync")
    v.add_argument("--levers", type=Path, default=LEVERS_PATH, help="lever catalog (default: the skill's)")
    v.add_argument("--lessons", type=Path, default=LESSONS_PATH, help="lessons file (default: the skill's)")
    add_json_flag(v)
    v.set_defaults(func=run_validate)

    s = csub.add_parser("schema", help="print the lever catalog's JSON Schema, or rewrite both committed schemas")
    s.add_argument("--write", action="store_true", help="rewrite levers.schema.json and lessons.schema.json")
    s.set_defaults(func=run_schema)

    a = csub.add_parser("add-lesson", help="append a lesson (refuses throughput figures and model names)")
    add_lesson_args(a)
    a.set_defaults(func=run_add)

    acc = csub.add_parser("accept-lesson", help=(
        "accept a lesson an agent proposed (it waits in lessons.pending.yaml until then): a person's decision"))
    acc.add_argument("lesson_id", help="the pending lesson's id (L0001, ...)")
    acc.add_argument("--file", type=Path, help="lessons file (default: the skill's lessons.yaml)")
    acc.add_argument("--by", help="who accepts it (default: the login name)")
    add_json_flag(acc)
    acc.set_defaults(func=run_accept)


def run_validate(args: argparse.Namespace) -> int:
    for path in (args.levers, args.lessons):
        if not path.is_file():
            raise UsageError(f"{path}: no such file")
    problems: list[dict[str, str]] = []
    n_levers = n_lessons = 0
    catalog = None
    try:
        catalog = load_catalog(args.levers)
        n_levers = len(catalog.levers)
    except CatalogError as exc:
        problems += [{"file": exc.path, **p} for p in exc.as_dict()["problems"]]
    try:
        n_lessons = len(load_lessons(args.lessons, catalog))
    except CatalogError as exc:
        problems += [{"file": exc.path, **p} for p in exc.as_dict()["problems"]]
    stale = [str(p) for p, text in schema_texts().items() if not p.is_file() or p.read_text() != text]
    for p in stale:
        problems.append({"file": p, "field": "(file)", "message": "out of date: run `attune catalog schema --write`"})
    ok = not problems
    if args.json:
        emit_json({"ok": ok, "levers": n_levers, "lessons": n_lessons, "schemas_in_sync": not stale,
                   "problems": problems})
    else:
        for p in problems:
            print(f"{p['file']}: {p['field']}: {p['message']}")
        print(f"{'ok' if ok else 'FAILED'}: {n_levers} levers, {n_lessons} lessons")
    return EXIT_OK if ok else EXIT_FAILED


def run_schema(args: argparse.Namespace) -> int:
    if args.write:
        for path, text in schema_texts().items():
            path.write_text(text)
            print(f"wrote {path}")
        return EXIT_OK
    import json

    print(json.dumps(levers_json_schema(), indent=2, sort_keys=True))
    return EXIT_OK


def run_add(args: argparse.Namespace) -> int:
    return run_add_lesson(args, "attune catalog add-lesson", author="person (attune catalog add-lesson)")


def run_accept(args: argparse.Namespace) -> int:
    import getpass
    import re

    from attune.knowledge.lessons import LessonError, accept_lesson, default_lessons_path

    if not re.fullmatch(r"L\d{4,}", args.lesson_id):
        raise UsageError(f"lesson_id: expected an id like L0001, got {args.lesson_id!r}")
    who = args.by or getpass.getuser()
    try:
        entry = accept_lesson(args.file or default_lessons_path(), args.lesson_id, f"person {who}")
    except LessonError as exc:
        if args.json:
            emit_json({"accepted": False, "error": str(exc)})
        else:
            print(f"attune catalog accept-lesson: {exc}")
        return EXIT_FAILED
    if args.json:
        emit_json({"accepted": True, "lesson": entry})
    else:
        print(f"accepted {entry['id']} ({entry['accepted']})")
    return EXIT_OK
