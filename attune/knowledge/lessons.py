"""Lessons: general rules about levers that campaigns write back into the skill's catalog.

A lesson must transfer to new settings, so it may name no throughput figure and no model:
`check_text` refuses numbers with throughput, time, cost or speed-up units and names of model
families, known models and parameter counts, each with the reason. `add_lesson` validates a
lesson and appends it to lessons.yaml atomically (under a lock, to a temporary file that
replaces the original), so a crash never leaves half a lesson.

Standard library plus PyYAML only: `skills/attune/scripts/add_lesson.py` runs it with python3.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import os
import re
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from attune.core.errors import KnowledgeError
from attune.knowledge.layouts import load_yaml

CATALOG_DIR = Path(__file__).resolve().parents[2] / "skills" / "attune" / "catalog"
LESSONS_PATH = CATALOG_DIR / "lessons.yaml"
LEVERS_PATH = CATALOG_DIR / "levers.yaml"
MODELS_PATH = CATALOG_DIR / "models.yaml"
LESSONS_ENV = "ATTUNE_LESSONS_FILE"  # where add_lesson writes when --file is not given

TEXT_FIELDS = ("rule", "applies_when", "evidence")
MIN_RULE_CHARS = 20
MAX_FIELD_CHARS = 600

# Numbers that carry a throughput, time, cost or speed-up: (pattern, what it is).
_NUM = r"\d[\d,]*(?:\.\d+)?"
FIGURE_PATTERNS: tuple[tuple[str, str], ...] = (
    (rf"{_NUM}\s*%", "a percentage"),
    (rf"{_NUM}\s*(?:percent(?:age)?|pct)\b", "a percentage"),
    (rf"\b{_NUM}[x×](?![a-z0-9])", "a speed-up factor"),
    (rf"\b{_NUM}\s*times\s+(?:faster|slower|higher|lower|more|less|as\b)", "a speed-up factor"),
    (
        rf"\b{_NUM}\s*[kmb]?\s*(?:tokens?|toks?|samples?|sequences?|seqs?|rows?|iterations?|its?|steps?)"
        r"\s*(?:/|per)\s*(?:s|sec|second|gpu|min|minute|h|hour)\b",
        "a throughput figure",
    ),
    (rf"\b{_NUM}\s*[kmgtpe]?flop", "a FLOP rate"),
    (rf"\b{_NUM}\s*mfu\b", "an MFU figure"),
    (rf"\bmfu\s*(?:of|=|:|at|is|was|to|reached)?\s*{_NUM}", "an MFU figure"),
    (rf"\b{_NUM}\s*(?:gpu|node|accelerator|device)[- ]?(?:hours?|hrs?|h)\b", "a GPU-hour figure"),
    (rf"[$€£]\s*{_NUM}", "a cost figure"),
    (rf"\b{_NUM}\s*(?:usd|eur|dollars?)\b", "a cost figure"),
    (rf"\b{_NUM}\s*(?:ms|us|µs|msec|milliseconds?|microseconds?)\b", "a time figure"),
    (rf"\b{_NUM}\s*(?:s|sec|secs|seconds?)\b", "a time figure"),
    (rf"\b{_NUM}\s*[kmgt]i?b/s\b", "a bandwidth figure"),
    (rf"\b{_NUM}\s*[kmgt]bps\b", "a bandwidth figure"),
    (rf"\b(?:throughput|speed-?up|gain|improvement|regression|slowdown)\s*(?:of|by|was|is|=|:|to|reached)\s*{_NUM}",
     "a throughput figure"),
    (rf"\b(?:faster|slower|better|worse|quicker)\s+by\s+{_NUM}", "a speed-up figure"),
)

# Families of public models. A match anywhere, in any case, followed by no letter, is refused.
MODEL_FAMILIES: tuple[str, ...] = (
    "llama", "codellama", "mixtral", "mistral", "codestral", "ministral", "glm", "chatglm", "minimax",
    "qwen", "qwq", "gpt-oss", "gptoss", "gpt", "deepseek", "gemma", "falcon", "nemotron", "kimi",
    "grok", "olmo", "dbrx", "jamba", "baichuan", "internlm", "starcoder", "bloom", "bert", "palm",
    "claude", "gemini", "hunyuan", "ernie", "snowflake-arctic", "granite", "command-r", "phi-",
    "yi-", "t5", "opt-", "pythia", "mpt-", "stablelm", "llava", "tinygpt", "megatron-gpt",
)
PARAM_COUNT_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"(?<![a-z0-9])(?:\d+x)?\d+(?:\.\d+)?b\b", "a parameter count, which names a model"),
    (r"(?<![a-z0-9])a\d+(?:\.\d+)?b\b", "an active-parameter count, which names a model"),
)


class LessonError(KnowledgeError, ValueError):
    """Bad input or a lessons file that cannot be used (exit 2)."""


class LessonRefused(LessonError):
    """The lesson breaks a content rule. `problems` lists each reason."""

    def __init__(self, problems: list[dict[str, str]]) -> None:
        self.problems = problems
        lines = [f"{p['field']}: {p['reason']} ({p['match']!r})" for p in problems]
        super().__init__("lesson refused: " + "; ".join(lines))


@dataclass(frozen=True)
class Problem:
    field: str
    reason: str
    match: str

    def as_dict(self) -> dict[str, str]:
        return {"field": self.field, "reason": self.reason, "match": self.match}


def known_model_names(models_path: Path | str | None = None) -> list[str]:
    """Names and aliases from models.yaml plus the families list, lower case, longest first."""
    names = {f.lower() for f in MODEL_FAMILIES}
    p = Path(models_path) if models_path else MODELS_PATH
    with contextlib.suppress(OSError, yaml.YAMLError, AttributeError, TypeError):
        doc = load_yaml(p.read_text(encoding="utf-8")) or {}
        for m in doc.get("models", []):
            names.add(str(m["name"]).lower())
            names.update(str(a).lower() for a in m.get("aliases") or ())
    return sorted(names, key=lambda n: (-len(n), n))


def _name_pattern(name: str) -> str:
    esc = re.escape(name)
    tail = "" if name.endswith("-") else r"(?![a-z])"
    return rf"(?<![a-z0-9]){esc}{tail}"


def check_text(field: str, text: str, names: Iterable[str] | None = None) -> list[Problem]:
    """Every reason `text` may not go into a lesson (empty when it may)."""
    names = list(names) if names is not None else known_model_names()
    low = text.lower()
    problems: list[Problem] = []
    for pattern, what in FIGURE_PATTERNS:
        m = re.search(pattern, low)
        if m:
            problems.append(Problem(field, f"contains {what}; state the rule without throughput figures", m.group(0)))
    for name in names:
        m = re.search(_name_pattern(name), low)
        if m:
            problems.append(
                Problem(field, "names a model or model family; state the rule for a kind of model instead "
                        "(dense, MoE with many small experts, long sequence, ...)", m.group(0))
            )
            break
    for pattern, what in PARAM_COUNT_PATTERNS:
        m = re.search(pattern, low)
        if m:
            problems.append(Problem(field, f"contains {what}; describe the model's shape instead", m.group(0)))
    return problems


def lever_ids(levers_path: Path | str | None = None) -> set[str]:
    p = Path(levers_path) if levers_path else LEVERS_PATH
    try:
        doc = load_yaml(p.read_text(encoding="utf-8"))
        return {str(lv["id"]) for lv in doc["levers"]}
    except (OSError, yaml.YAMLError, KeyError, TypeError) as exc:
        raise LessonError(f"{p}: cannot read the lever catalog: {exc}") from None


def validate_lesson(
    lesson: dict[str, Any], *, levers: set[str] | None = None, names: Iterable[str] | None = None
) -> list[Problem]:
    """Content problems of one lesson (fields, length, lever id, figures, model names)."""
    problems: list[Problem] = []
    names = list(names) if names is not None else known_model_names()
    lever = lesson.get("lever")
    if not isinstance(lever, str) or not lever:
        problems.append(Problem("lever", "required: the id of the lever the rule is about", str(lever)))
    elif levers is not None and lever not in levers:
        problems.append(Problem("lever", "not a lever id of the catalog (levers.yaml)", lever))
    rule = lesson.get("rule")
    if not isinstance(rule, str) or len(rule.strip()) < MIN_RULE_CHARS:
        problems.append(Problem("rule", f"required: a rule of at least {MIN_RULE_CHARS} characters", str(rule)))
    for f in TEXT_FIELDS:
        v = lesson.get(f)
        if v is None:
            continue
        if not isinstance(v, str):
            problems.append(Problem(f, "must be text", repr(v)))
            continue
        if len(v) > MAX_FIELD_CHARS:
            problems.append(Problem(f, f"longer than {MAX_FIELD_CHARS} characters; keep a lesson short", v[:40]))
        problems.extend(check_text(f, v, names))
    return problems


def read_lessons(path: Path | str) -> list[dict[str, Any]]:
    p = Path(path)
    if not p.exists():
        return []
    try:
        doc = load_yaml(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise LessonError(f"{p}: invalid YAML: {exc}") from None
    if doc is None:
        return []
    if not isinstance(doc, list) or not all(isinstance(x, dict) for x in doc):
        raise LessonError(f"{p}: expected a YAML list of lessons")
    return doc


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    lock = path.with_name(f".{path.name}.lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def default_lessons_path() -> Path:
    env = os.environ.get(LESSONS_ENV)
    return Path(env) if env else LESSONS_PATH


PENDING_NAME = "lessons.pending.yaml"


def pending_path(lessons: Path | str) -> Path:
    """Where lessons an agent proposed wait for a person (beside the lessons file; no agent is told to read it)."""
    return Path(lessons).with_name(PENDING_NAME)


def _clean(text: str) -> str:
    """One line of printable text: control characters (terminal escapes among them) dropped."""
    return " ".join("".join(c if c.isprintable() else " " for c in text).split())


def add_lesson(
    path: Path | str | None,
    *,
    lever: str,
    rule: str,
    applies_when: str | None = None,
    evidence: str | None = None,
    levers_path: Path | str | None = None,
    models_path: Path | str | None = None,
    today: _dt.date | None = None,
    author: str | None = None,
    pending: bool = False,
) -> dict[str, Any]:
    """Validate a lesson and append it to the lessons file (or, `pending`, to the file of lessons waiting for a
    person: lessons.pending.yaml beside it); return the entry written.

    Raises LessonRefused (content rules) or LessonError (bad file, duplicate). Nothing is
    written unless every check passes.
    """
    p = Path(path) if path else default_lessons_path()
    accepted_file = p
    if pending:
        p = pending_path(p)
    rule, applies_when, evidence = (_clean(x) if isinstance(x, str) else x for x in (rule, applies_when, evidence))
    entry: dict[str, Any] = {"lever": lever, "rule": " ".join(rule.split()) if isinstance(rule, str) else rule}
    if applies_when:
        entry["applies_when"] = " ".join(applies_when.split())
    if evidence:
        entry["evidence"] = " ".join(evidence.split())
    problems = validate_lesson(entry, levers=lever_ids(levers_path), names=known_model_names(models_path))
    if problems:
        raise LessonRefused([pr.as_dict() for pr in problems])
    if not p.parent.is_dir():
        raise LessonError(f"{p.parent}: no such directory")
    with _locked(p):
        old_text = p.read_text(encoding="utf-8") if p.exists() else ""
        existing = read_lessons(p)
        both = existing + (read_lessons(accepted_file) if pending else read_lessons(pending_path(p)))
        for e in both:
            if e.get("lever") == entry["lever"] and _norm(str(e.get("rule", ""))) == _norm(entry["rule"]):
                raise LessonError(f"already recorded as {e.get('id')}: the same rule for lever {lever!r}")
        numbers = [int(m.group(1)) for e in both if (m := re.fullmatch(r"L(\d+)", str(e.get("id", ""))))]
        entry = {
            "id": f"L{(max(numbers) + 1 if numbers else 1):04d}",
            **entry,
            "added": (today or _dt.datetime.now(_dt.UTC).date()).isoformat(),
            **({"author": _clean(author)[:200]} if author else {}),
        }
        block = yaml.safe_dump([entry], sort_keys=False, allow_unicode=True, width=100)
        if old_text and not old_text.endswith("\n"):
            old_text += "\n"
        new_text = old_text + block
        parsed = load_yaml(new_text)
        if not isinstance(parsed, list) or parsed[-1] != entry:  # pragma: no cover - a guard
            raise LessonError(f"{p}: appending would not yield a valid lesson list; nothing written")
        _replace(p, new_text)
    return entry


def accept_lesson(path: Path | str | None, lesson_id: str, who: str, *, today: _dt.date | None = None) -> dict[str, Any]:
    """A person accepts a lesson an agent proposed: it moves from lessons.pending.yaml into the lessons file,
    marked with who accepted it and when. Raises LessonError when no pending lesson has that id."""
    p = Path(path) if path else default_lessons_path()
    pend = pending_path(p)
    with _locked(p):
        waiting = read_lessons(pend)
        match = [e for e in waiting if e.get("id") == lesson_id]
        if not match:
            raise LessonError(f"no pending lesson {lesson_id!r} in {pend}")
        entry = {**match[0], "accepted": f"{_clean(who)[:120]} on {(today or _dt.datetime.now(_dt.UTC).date()).isoformat()}"}
        old_text = p.read_text(encoding="utf-8") if p.exists() else ""
        if old_text and not old_text.endswith("\n"):
            old_text += "\n"
        _replace(p, old_text + yaml.safe_dump([entry], sort_keys=False, allow_unicode=True, width=100))
        rest = [e for e in waiting if e.get("id") != lesson_id]
        _replace(pend, yaml.safe_dump(rest, sort_keys=False, allow_unicode=True, width=100) if rest else "")
    return entry


def _replace(p: Path, new_text: str) -> None:
    """Write a file atomically (a temporary file, fsync, rename, fsync of the folder)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(new_text)
            f.flush()
            os.fsync(f.fileno())
        if p.exists():
            os.chmod(tmp, p.stat().st_mode & 0o777)
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dfd = os.open(p.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
