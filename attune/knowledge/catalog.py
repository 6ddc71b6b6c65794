"""The lever catalog and the lessons list: pydantic models, their JSON Schemas, and loaders.

The catalog (`skills/attune/catalog/levers.yaml`) records, for every setting the search may
change, how it works, when it helps and hurts, which way it moves throughput and memory, how
big the effect usually is, what it couples with, what makes it infeasible, and how to verify
it took effect. It is data, so the agent can filter it and tests can check it. The committed
JSON Schemas (`levers.schema.json`, `lessons.schema.json`) are generated from these models by
`attune catalog schema --write`; a test keeps them in sync.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from attune.core.errors import KnowledgeError
from attune.knowledge.lessons import (
    CATALOG_DIR,
    LESSONS_PATH,
    LEVERS_PATH,
    known_model_names,
    validate_lesson,
)
from attune.readers import bounded

LEVERS_SCHEMA_PATH = CATALOG_DIR / "levers.schema.json"
LESSONS_SCHEMA_PATH = CATALOG_DIR / "lessons.schema.json"

ObjectiveClass = Literal["structural", "same-math", "numeric"]
Framework = Literal["megatron", "tinygpt"]
Category = Literal["parallelism", "pipeline", "memory", "communication", "moe", "kernels", "host", "numeric"]
Effect = Literal["up", "down", "none", "either"]
SizeClass = Literal["negligible", "small", "medium", "large", "varies"]
# The exposed costs of a step a profile can show (the trace analyzer's labels, plus the recomputation and
# the optimizer read from the compute): what a lever attacks, so a diagnosis can pick the lever to try first.
CostKind = Literal["all_to_all", "tp_collective", "cp_collective", "dp_reduce", "pipeline_p2p", "memcpy",
                   "host_launch", "host_python", "host_data_loading", "recompute", "optimizer"]

LeverId = Annotated[str, Field(pattern=r"^[a-z0-9]+(?:-[a-z0-9]+)*$", min_length=2, max_length=60)]
Text = Annotated[str, Field(min_length=3)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Flag(_Strict):
    """One argument or environment variable a lever sets."""

    name: str = Field(description="a command-line flag (--name) or an environment variable (NAME)")
    kind: Literal["arg", "env", "launcher"] = Field(
        description="arg: a training-script argument; env: an environment variable; launcher: a launcher setting"
    )
    values: list[str | int | float | bool] = Field(
        default_factory=list, description="typical values to try (the image decides what is valid)"
    )

    @model_validator(mode="after")
    def _name_matches_kind(self) -> Flag:
        if self.kind == "arg" and not re.fullmatch(r"--[a-z0-9][a-z0-9-]*", self.name):
            raise ValueError(f"an arg flag must look like --flag-name, got {self.name!r}")
        if self.kind == "env" and not re.fullmatch(r"[A-Z_][A-Z0-9_]*", self.name):
            raise ValueError(f"an env flag must be an upper-case variable name, got {self.name!r}")
        return self


class Direction(_Strict):
    """Which way the lever usually moves throughput and peak memory when turned the way `move` says."""

    move: Text = Field(description="the change this direction describes, e.g. 'raise TP', 'enable'")
    throughput: Effect
    memory: Effect


class RoughSize(_Strict):
    """How large the throughput effect usually is. small: inside a typical 3% noise band;
    medium: a few to ten percent; large: more than ten percent; varies: depends on the bottleneck."""

    size: SizeClass
    note: Text


class Coupling(_Strict):
    lever: LeverId = Field(description="id of another lever in this catalog")
    note: Text = Field(description="how the two interact")


class Lever(_Strict):
    """One setting the search may change, with what is known about it."""

    id: LeverId
    title: Text
    frameworks: list[Framework] = Field(min_length=1, description="training stacks the lever exists in")
    category: Category
    flags: list[Flag] = Field(min_length=1)
    objective_class: ObjectiveClass = Field(
        description="structural: placement and scheduling only; same-math: the same function by another "
        "path (needs a component test before it may run on a model); numeric: changes what is trained "
        "(the gate refuses it)"
    )
    mechanism: Text = Field(description="what the lever changes in the step")
    helps_when: list[Text] = Field(min_length=1)
    hurts_when: list[Text] = Field(min_length=1)
    direction: Direction
    rough_size: RoughSize
    attacks: list[CostKind] = Field(default_factory=list, description=(
        "the exposed costs of a step (a profile's breakdown) this lever can shrink; a tuner tries first the "
        "lever that attacks the largest one"))
    couplings: list[Coupling] = Field(default_factory=list)
    constraints: list[Text] = Field(default_factory=list, description="feasibility rules to check before launch")
    verify: list[Text] = Field(min_length=1, description="how to confirm the change took effect and did its job")
    code_hints: list[Text] = Field(
        default_factory=list, description="where in the framework source to read the flag's implementation"
    )
    sources: list[Text] = Field(min_length=1, description="where the knowledge comes from")

    @field_validator("flags")
    @classmethod
    def _unique_flags(cls, v: list[Flag]) -> list[Flag]:
        names = [f.name for f in v]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"duplicate flag(s) {dup}")
        return v

    @field_validator("attacks")
    @classmethod
    def _unique_attacks(cls, v: list[str]) -> list[str]:
        dup = sorted({n for n in v if v.count(n) > 1})
        if dup:
            raise ValueError(f"duplicate cost kind(s) {dup}")
        return v


class LeverCatalog(_Strict):
    """The whole catalog file."""

    version: Literal[1] = 1
    levers: list[Lever] = Field(min_length=1)

    @model_validator(mode="after")
    def _ids_and_couplings(self) -> LeverCatalog:
        ids = [lv.id for lv in self.levers]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"duplicate lever id(s) {dup}")
        known = set(ids)
        for lv in self.levers:
            for c in lv.couplings:
                if c.lever not in known:
                    raise ValueError(f"lever {lv.id!r}: coupling names unknown lever {c.lever!r}")
                if c.lever == lv.id:
                    raise ValueError(f"lever {lv.id!r}: couples with itself")
        return self

    def get(self, lever_id: str) -> Lever:
        for lv in self.levers:
            if lv.id == lever_id:
                return lv
        raise KeyError(lever_id)


class Lesson(_Strict):
    """A rule a campaign learned about a lever: guidance only, no throughput figures, no model names."""

    id: str = Field(pattern=r"^L\d{4,}$")
    lever: LeverId
    rule: Text
    applies_when: str | None = None
    evidence: str | None = None
    added: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$", description="UTC date the lesson was added")
    author: str | None = Field(None, max_length=200, description=(
        "who wrote it: 'agent (campaign <dir>)' for a lesson an agent proposed, 'person' otherwise"))
    accepted: str | None = Field(None, max_length=200, description=(
        "who accepted an agent's lesson and when (a person, `attune catalog accept-lesson`); agent lessons wait "
        "in lessons.pending.yaml until then"))


class LessonList(BaseModel):
    """lessons.yaml: a list of lessons, oldest first."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    lessons: list[Lesson]


class CatalogError(KnowledgeError):
    """A catalog or lessons file that does not validate. `problems` lists (where, message)."""

    def __init__(self, path: Path | str, problems: list[tuple[str, str]]) -> None:
        self.path = str(path)
        self.problems = problems
        super().__init__(f"{path}: " + "; ".join(f"{w}: {m}" for w, m in problems))

    def as_dict(self) -> dict[str, Any]:
        return {"file": self.path, "problems": [{"field": f, "message": m} for f, m in self.problems]}


def _loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else ("." if out else "") + str(part)
    return out or "(top level)"


def _msg(err: Any) -> str:
    msg = str(err["msg"])
    return msg[len("Value error, "):] if msg.startswith("Value error, ") else msg


def _read_yaml(path: Path) -> Any:
    try:
        return bounded.read_yaml(path, "catalog file")
    except bounded.InputError as exc:
        raise CatalogError(path, [("(file)", str(exc))]) from None


_CATALOG_CACHE: dict[tuple[str, int, int, int, int], LeverCatalog] = {}


def load_catalog(path: Path | str | None = None) -> LeverCatalog:
    """The lever catalog, parsed and validated once per file identity (an unchanged file is not read
    again); callers read it, never change it."""
    from attune.knowledge.layouts import file_identity

    p = Path(path) if path else LEVERS_PATH
    ident = file_identity(p)
    if ident is not None and ident in _CATALOG_CACHE:
        return _CATALOG_CACHE[ident]
    data = _read_yaml(p)
    try:
        cat = LeverCatalog.model_validate(data)
        if ident is not None:
            _CATALOG_CACHE[ident] = cat
        return cat
    except ValidationError as exc:
        raise CatalogError(p, [(_loc(tuple(e["loc"])), _msg(e)) for e in exc.errors()]) from None


def load_lessons(
    path: Path | str | None = None, catalog: LeverCatalog | None = None, *, check_content: bool = True
) -> list[Lesson]:
    """Validate lessons.yaml: shape, unique ids, known levers, and (by default) the content rules."""
    p = Path(path) if path else LESSONS_PATH
    data = _read_yaml(p)
    try:
        lessons = LessonList.model_validate({"lessons": data or []}).lessons
    except ValidationError as exc:
        raise CatalogError(p, [(_loc(tuple(e["loc"])[1:]), _msg(e)) for e in exc.errors()]) from None
    problems: list[tuple[str, str]] = []
    ids = [ls.id for ls in lessons]
    for dup in sorted({i for i in ids if ids.count(i) > 1}):
        problems.append((dup, "duplicate lesson id"))
    levers = {lv.id for lv in catalog.levers} if catalog else None
    names = known_model_names()
    if check_content:
        for i, ls in enumerate(lessons):
            for pr in validate_lesson(ls.model_dump(), levers=levers, names=names):
                problems.append((f"[{i}].{pr.field}", f"{pr.reason} ({pr.match!r})"))
    if problems:
        raise CatalogError(p, problems)
    return lessons


def _schema(model: type[BaseModel], urn: str) -> dict[str, Any]:
    schema = model.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = f"urn:attune:schema:{urn}"
    return schema


def levers_json_schema() -> dict[str, Any]:
    return _schema(LeverCatalog, "levers")


def lessons_json_schema() -> dict[str, Any]:
    """lessons.yaml is a bare list, so its schema is an array of Lesson."""
    inner = _schema(Lesson, "lessons")
    defs = inner.pop("$defs", {})
    out: dict[str, Any] = {
        "$schema": inner.pop("$schema"),
        "$id": inner.pop("$id"),
        "title": "Lessons",
        "description": LessonList.__doc__,
        "type": ["array", "null"],
        "items": inner,
    }
    if defs:
        out["$defs"] = defs
    return out


def schema_texts() -> dict[Path, str]:
    """The committed schema files and their expected contents."""
    return {
        LEVERS_SCHEMA_PATH: json.dumps(levers_json_schema(), indent=2, sort_keys=True) + "\n",
        LESSONS_SCHEMA_PATH: json.dumps(lessons_json_schema(), indent=2, sort_keys=True) + "\n",
    }
