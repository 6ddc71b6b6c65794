"""Correctness lists: per model, the class of every argument the search may touch.

A list is a YAML file under ``gate/lists/`` validated by the pydantic model
:class:`CorrectnessList` (its JSON Schema is ``gate/lists/schema.json``, kept in
sync by a test). Arguments are keyed by the attribute name Megatron resolves them
to (``tensor_model_parallel_size``); see :mod:`gate.names` for the flag spelling.

Classes:
- ``structural``: placement, scheduling or bookkeeping; the math is unchanged. Any value.
- ``same_math``: another path to the same function. Allowed only for the listed
  ``values`` and only if its component test passed on this model.
- ``numeric``: changes what is trained (precision, loss, batch, optimizer, data). Never changed.
- ``frozen``: pinned to ``value`` for this model; a candidate must keep it.

Anything not listed is refused. Known stack defects are declarative conditions over
the resolved configuration (:mod:`gate.conditions`), never code.

A campaign pins the SHA-256 of its list file; :func:`load_list` refuses a list whose
hash differs from the pinned one.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from attune.core.errors import GateError
from attune.readers import bounded
from gate import names

LISTS_DIR = Path(__file__).parent / "lists"
SCHEMA_PATH = LISTS_DIR / "schema.json"

Scalar = str | int | float | bool | None
Value = Scalar | list[Scalar]
ComponentStatus = Literal["passed", "failed", "untested"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


# ---------------------------------------------------------------- argument entries


class _ArgCommon(_Strict):
    why: str = Field(min_length=1, description="Why the argument has this class on this model.")
    flag: str | None = Field(
        default=None,
        description="Command-line spelling when it is not '--' + the name with dashes "
        "(e.g. '--no-gradient-accumulation-fusion').",
    )
    negated: bool = Field(default=False, description="The flag stores False into the attribute (a --no-X flag).")
    derived: bool = Field(
        default=False,
        description="No command-line flag of its own: set by the framework from other arguments; "
        "seen only in the resolved-arguments block.",
    )
    default: Value = Field(
        default=None, description="The value the framework uses when the flag is not given, if known."
    )

    @field_validator("flag")
    @classmethod
    def _flag_form(cls, v: str | None) -> str | None:
        if v is not None and not names.FLAG_RE.match(v):
            raise ValueError(f"flag must look like --name, got {v!r}")
        return v

    def cli_flag(self, dest: str) -> str | None:
        if self.derived:
            return None
        if self.flag:
            return self.flag
        if self.negated:
            return "--no-" + dest.replace("_", "-")
        return names.default_flag(dest)

    def has_default(self) -> bool:
        return "default" in self.model_fields_set


class StructuralArg(_ArgCommon):
    klass: Literal["structural"] = Field(alias="class")


class NumericArg(_ArgCommon):
    klass: Literal["numeric"] = Field(alias="class")


class FrozenArg(_ArgCommon):
    klass: Literal["frozen"] = Field(alias="class")
    value: Value = Field(description="The pinned value; null means the flag must not be given.")


class SameMathArg(_ArgCommon):
    klass: Literal["same_math"] = Field(alias="class")
    values: list[Value] = Field(min_length=1, description="Values the swap may take on this model.")
    component_test: ComponentStatus = Field(description="Outcome of the swap's component test on this model.")
    component_evidence: str | None = Field(default=None, description="Where the component test result comes from.")


ArgEntry = Annotated[
    Union[StructuralArg, SameMathArg, NumericArg, FrozenArg],  # noqa: UP007 (pydantic discriminated union)
    Field(discriminator="klass"),
]


# ---------------------------------------------------------------- environment entries


class _EnvCommon(_Strict):
    why: str = Field(min_length=1)


class StructuralEnv(_EnvCommon):
    klass: Literal["structural"] = Field(alias="class")


class NumericEnv(_EnvCommon):
    klass: Literal["numeric"] = Field(alias="class")


class FrozenEnv(_EnvCommon):
    klass: Literal["frozen"] = Field(alias="class")
    value: str | None = Field(description="The pinned value; null means the variable must be unset.")


class SameMathEnv(_EnvCommon):
    klass: Literal["same_math"] = Field(alias="class")
    values: list[str | None] = Field(min_length=1)
    component_test: ComponentStatus
    component_evidence: str | None = None


EnvEntry = Annotated[
    Union[StructuralEnv, SameMathEnv, NumericEnv, FrozenEnv],  # noqa: UP007
    Field(discriminator="klass"),
]


class EnvPattern(_Strict):
    pattern: str = Field(min_length=1, description="A shell-style glob over variable names, e.g. 'NCCL_*'.")
    klass: Literal["structural", "numeric"] = Field(alias="class")
    why: str = Field(min_length=1)


# ---------------------------------------------------------------- defect conditions

Op = Literal["eq", "ne", "lt", "le", "gt", "ge", "in", "not_in", "set", "unset"]


class ArgCondition(_Strict):
    arg: str = Field(description="Attribute name in the resolved configuration.")
    op: Op
    value: Value = None

    @model_validator(mode="after")
    def _needs_value(self) -> ArgCondition:
        _check_op_value(self.op, self.value, "value" in self.model_fields_set)
        return self


class EnvCondition(_Strict):
    env: str = Field(description="Environment variable name.")
    op: Op
    value: Value = None

    @model_validator(mode="after")
    def _needs_value(self) -> EnvCondition:
        _check_op_value(self.op, self.value, "value" in self.model_fields_set)
        return self


class AllCondition(_Strict):
    all: list[Condition] = Field(min_length=1)


class AnyCondition(_Strict):
    any: list[Condition] = Field(min_length=1)


class NotCondition(_Strict):
    not_: Condition = Field(alias="not")


Condition = Union[AllCondition, AnyCondition, NotCondition, ArgCondition, EnvCondition]  # noqa: UP007
AllCondition.model_rebuild()
AnyCondition.model_rebuild()
NotCondition.model_rebuild()


def _check_op_value(op: str, value: Any, given: bool) -> None:
    if op in ("set", "unset"):
        if given:
            raise ValueError(f"op {op!r} takes no value")
        return
    if not given:
        raise ValueError(f"op {op!r} needs a value")
    if op in ("in", "not_in") and not isinstance(value, list):
        raise ValueError(f"op {op!r} needs a list value")
    if op in ("lt", "le", "gt", "ge") and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ValueError(f"op {op!r} needs a number")


class Defect(_Strict):
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    description: str = Field(min_length=1, description="The configuration that is refused.")
    shows: str = Field(min_length=1, description="How the defect shows (what goes wrong).")
    source: str = Field(min_length=1, description="Where the defect is documented.")
    when: Condition


# ---------------------------------------------------------------- the list


class CorrectnessList(_Strict):
    schema_version: Literal[1]
    model: str = Field(min_length=1)
    description: str = Field(min_length=1)
    sources: list[str] = Field(default_factory=list)
    args: dict[str, ArgEntry]
    env: dict[str, EnvEntry] = Field(default_factory=dict)
    env_patterns: list[EnvPattern] = Field(default_factory=list)
    defects: list[Defect] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> CorrectnessList:
        seen_flags: dict[str, str] = {}
        for dest, entry in self.args.items():
            if not names.DEST_RE.match(dest):
                raise ValueError(f"args.{dest}: argument names are attribute names (lower_snake_case)")
            if entry.derived and (entry.flag or entry.negated):
                raise ValueError(f"args.{dest}: a derived argument has no flag")
            flag = entry.cli_flag(dest)
            if flag is not None:
                if flag in seen_flags:
                    raise ValueError(f"args.{dest}: flag {flag} is also the flag of args.{seen_flags[flag]}")
                seen_flags[flag] = dest
            if (
                isinstance(entry, SameMathArg)
                and entry.has_default()
                and not any(names.same(entry.default, v) for v in entry.values)
            ):
                raise ValueError(f"args.{dest}: the default {entry.default!r} must be one of its values")
        ids: set[str] = set()
        for defect in self.defects:
            if defect.id in ids:
                raise ValueError(f"defects: duplicate id {defect.id!r}")
            ids.add(defect.id)
            for arg in _condition_args(defect.when):
                if arg not in self.args:
                    raise ValueError(f"defects.{defect.id}: condition names unlisted argument {arg!r}")
        return self

    @cached_property
    def flag_index(self) -> dict[str, str]:
        """Command-line flag -> attribute name, for every listed non-derived argument."""
        out: dict[str, str] = {}
        for dest, entry in self.args.items():
            flag = entry.cli_flag(dest)
            if flag is not None:
                out[flag] = dest
        return out

    def arg(self, dest: str) -> StructuralArg | SameMathArg | NumericArg | FrozenArg | None:
        return self.args.get(dest)

    def env_entry(self, name: str) -> StructuralEnv | SameMathEnv | NumericEnv | FrozenEnv | EnvPattern | None:
        """The entry for an environment variable: an exact entry first, then the first matching pattern."""
        if name in self.env:
            return self.env[name]
        for pat in self.env_patterns:
            if fnmatch.fnmatchcase(name, pat.pattern):
                return pat
        return None


def _condition_args(cond: Any) -> list[str]:
    if isinstance(cond, ArgCondition):
        return [cond.arg]
    if isinstance(cond, AllCondition):
        return [a for c in cond.all for a in _condition_args(c)]
    if isinstance(cond, AnyCondition):
        return [a for c in cond.any for a in _condition_args(c)]
    if isinstance(cond, NotCondition):
        return _condition_args(cond.not_)
    return []


# ---------------------------------------------------------------- loading and hashing


class ListError(GateError, ValueError):
    """A list that cannot be used: missing, malformed, or not the pinned one."""


def list_sha256(path: str | Path) -> str:
    """SHA-256 (hex) of the list file's bytes: what a campaign pins."""
    try:
        return hashlib.sha256(bounded.read_bytes(path, "correctness list")).hexdigest()
    except bounded.InputError as exc:
        raise ListError(str(exc)) from None


def builtin_models() -> list[str]:
    return sorted(p.stem for p in LISTS_DIR.glob("*.yaml"))


def list_path(model_or_path: str | Path) -> Path:
    """A built-in model name (``tinygpt``) or a path to a list file."""
    p = Path(model_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        return p
    candidate = LISTS_DIR / f"{model_or_path}.yaml"
    if not candidate.exists():
        raise ListError(
            f"no correctness list for model {str(model_or_path)!r}; built-in lists: {', '.join(builtin_models())}"
        )
    return candidate


def load_list(model_or_path: str | Path, expected_sha256: str | None = None) -> LoadedList:
    """Load and validate a list; refuse it if ``expected_sha256`` is given and differs."""
    path = list_path(model_or_path)
    try:
        raw = bounded.read_bytes(path, "correctness list")
    except bounded.InputError as exc:
        raise ListError(str(exc)) from None
    digest = hashlib.sha256(raw).hexdigest()
    if expected_sha256 is not None and digest != expected_sha256.strip().lower():
        raise ListError(
            f"correctness list {path} has sha256 {digest}, but the campaign pins {expected_sha256}: "
            "the list changed since the campaign started, refusing it"
        )
    try:
        data = bounded.loads_yaml(bounded.decode_utf8(raw, f"correctness list {path}"), f"correctness list {path}")
    except bounded.InputError as exc:
        raise ListError(str(exc)) from None
    try:
        clist = CorrectnessList.model_validate(data)
    except ValidationError as exc:
        raise ListError(f"correctness list {path} does not match the schema:\n{exc}") from exc
    return LoadedList(path=path, sha256=digest, clist=clist)


# Settings a campaign fixes for all of its runs (the broker pins them): a list describes a class of
# objectives, not one cluster, so where it freezes one of these its value is the campaign's own.
CAMPAIGN_BOUND = ("world_size", "seq_length", "global_batch_size")


def for_campaign(loaded: LoadedList, bound: dict[str, Any]) -> LoadedList:
    """The list as it applies to one campaign: each frozen entry of `CAMPAIGN_BOUND` given in `bound`
    (e.g. {"world_size": 64, "seq_length": 4096}) pinned at the campaign's value instead of the one the
    file was written for. Other entries, the file and its hash are unchanged (the campaign still pins
    the file's SHA-256)."""
    args = dict(loaded.clist.args)
    changed = False
    for dest in CAMPAIGN_BOUND:
        entry = args.get(dest)
        if isinstance(entry, FrozenArg) and dest in bound and bound[dest] is not None \
                and entry.value != bound[dest]:
            args[dest] = entry.model_copy(update={"value": bound[dest]})
            changed = True
    if not changed:
        return loaded
    return LoadedList(path=loaded.path, sha256=loaded.sha256, clist=loaded.clist.model_copy(update={"args": args}))


class LoadedList:
    """A validated list with the file it came from and that file's hash."""

    def __init__(self, path: Path, sha256: str, clist: CorrectnessList) -> None:
        self.path = path
        self.sha256 = sha256
        self.clist = clist

    @property
    def model(self) -> str:
        return self.clist.model

    def __repr__(self) -> str:
        return f"LoadedList({self.clist.model!r}, {self.path}, sha256={self.sha256[:12]})"


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a list file, generated from the pydantic model."""
    schema = CorrectnessList.model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "attune correctness list"
    return schema


def write_schema(path: Path = SCHEMA_PATH) -> None:
    path.write_text(json.dumps(json_schema(), indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":  # regenerate: python -m gate.lists
    write_schema()
    print(SCHEMA_PATH)
