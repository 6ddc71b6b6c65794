"""Layer 1 of the correctness gate: the configuration check.

Two entry points share one classifier:

- :func:`check_recipe` (before launch, a dry run): baseline and candidate recipes in
  command-line form (``{"--tensor-model-parallel-size": 2, "--sequence-parallel": True}``
  plus an environment mapping). Each flag is mapped to its attribute through the list.
- :func:`check_resolved` (on a check run): the fully resolved arguments (attribute
  names, as a run prints them) and environment of the baseline and the candidate.
  This catches a flag that silently changes another argument.

Every changed argument or variable is classified against the model's list; numeric,
frozen and unlisted changes are refused, and so are same-math swaps outside their
listed values or without a passed component test. The candidate's configuration is
then matched against the list's known stack defects, and its pinned (frozen) values
are verified. Each refusal names the argument, its class and the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, Field

from gate import conditions, names
from gate.lists import (
    CorrectnessList,
    EnvPattern,
    FrozenArg,
    FrozenEnv,
    LoadedList,
    NumericArg,
    NumericEnv,
    SameMathArg,
    SameMathEnv,
    StructuralArg,
    StructuralEnv,
)

Klass = Literal["structural", "same_math", "numeric", "frozen", "unlisted"]
_MISSING = object()


class Change(BaseModel):
    """One argument or environment variable that differs between baseline and candidate."""

    name: str = Field(description="Attribute name (arguments) or variable name (environment).")
    kind: Literal["arg", "env"]
    flag: str | None = Field(default=None, description="Command-line spelling, for arguments.")
    baseline: Any = None
    candidate: Any = None
    klass: Klass
    allowed: bool
    reason: str


class ConfigRefusal(BaseModel):
    """Why the check refuses: a change, a pinned value, or a known defect."""

    name: str = Field(description="The argument, variable, or defect id.")
    kind: Literal["arg", "env", "defect"]
    klass: Literal["numeric", "frozen", "unlisted", "same_math", "defect"]
    reason: str


class DefectHit(BaseModel):
    id: str
    description: str
    shows: str
    source: str
    condition: str
    values: dict[str, Any]


class ConfigCheckResult(BaseModel):
    model: str
    list_sha256: str
    mode: Literal["recipe", "resolved"]
    passed: bool
    changes: list[Change]
    refusals: list[ConfigRefusal]
    defects: list[DefectHit]

    def summary(self) -> str:
        if self.passed:
            n = len(self.changes)
            return f"layer 1 passes on {self.model}: {n} change(s), all structural or tested same-math swaps"
        return f"layer 1 refuses on {self.model}: " + "; ".join(f"{r.name} [{r.klass}]: {r.reason}" for r in self.refusals)

    def change_class(self) -> Literal["layout", "unknown"]:
        """What layer 2 is told changed: 'layout' when layer 1 passes and found at least one change, every one
        structural or a tested same-math swap (the arithmetic is reordered, the objective is not); else
        'unknown' (no change seen, e.g. a code change, or a refused one: every step at replicate level)."""
        ok = self.passed and self.changes and all(c.allowed and c.klass in ("structural", "same_math")
                                                  for c in self.changes)
        return "layout" if ok else "unknown"

    def objective_class(self) -> Literal["layout", "objective", "unknown"]:
        """What layer 1 says the change is, for a verdict to report: 'layout' (`change_class`), 'objective' when
        it refuses a change whose class it knows changes what is trained (numeric, frozen, a same-math swap
        outside its values or whose component test failed, a known defect), else 'unknown' (no change seen, or only
        unlisted ones or untested swaps: layer 1 cannot tell). Layer 2 judges 'objective' and 'unknown' alike, at replicate level."""
        if self.change_class() == "layout":
            return "layout"
        return "objective" if any(_known_objective(r) for r in self.refusals) else "unknown"

    def blocking_refusals(self) -> list[ConfigRefusal]:
        """The refusals that settle a verdict on their own, whatever the curves show: a change layer 1 knows changes
        what is trained (numeric, frozen, a same-math swap outside its values or whose component test failed, a
        known defect) or one its list does not name (unlisted: anything not listed is refused). An untested
        same-math swap is not among them: it is not known to change the objective, and the curves judge it."""
        return [r for r in self.refusals if _known_objective(r) or r.klass == "unlisted"]


def _known_objective(r: ConfigRefusal) -> bool:
    """Whether a refusal is of a change known to change the objective (an untested same-math swap is not)."""
    return r.klass in ("numeric", "frozen", "defect") or (r.klass == "same_math" and "has not run" not in r.reason)


# ----------------------------------------------------------------- recipe (flag form) -> attributes


def recipe_to_config(clist: CorrectnessList, args: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Map a recipe's flags to attributes. Returns (configuration, unlisted flags -> value).

    A flag whose value is ``False`` or ``None`` is not given. A bare flag is ``True``;
    a ``--no-X`` flag stores ``False``. Attributes the recipe does not give take the
    list's declared default, if any.
    """
    config: dict[str, Any] = {}
    unlisted: dict[str, Any] = {}
    for flag, value in args.items():
        if not isinstance(flag, str) or not names.FLAG_RE.match(flag):
            raise ValueError(f"recipe argument {flag!r} is not a flag (expected --name)")
        if value is None or value is False:
            continue
        dest = clist.flag_index.get(flag)
        if dest is None:
            unlisted[flag] = value
            continue
        entry = clist.args[dest]
        config[dest] = False if entry.negated else value
    for dest, entry in clist.args.items():
        if dest in config:
            continue
        if entry.has_default():
            config[dest] = entry.default
        elif entry.negated:
            config[dest] = True
    return config, unlisted


def _absent(entry: Any, other: Any) -> Any:
    """The value of an attribute a configuration does not mention."""
    if entry is not None and entry.has_default():
        return entry.default
    if isinstance(other, bool):
        return (not other) if entry is None or not entry.negated else True
    return None


# ----------------------------------------------------------------- classification


def _classify_arg(clist: CorrectnessList, dest: str, b: Any, c: Any) -> Change:
    entry = clist.arg(dest)
    flag = entry.cli_flag(dest) if entry is not None else None
    base = {"name": dest, "kind": "arg", "flag": flag, "baseline": names.to_jsonable(b), "candidate": names.to_jsonable(c)}
    model = clist.model
    if entry is None:
        return Change(**base, klass="unlisted", allowed=False,
                      reason=f"not in the correctness list for {model}; anything unlisted is refused")
    if isinstance(entry, StructuralArg):
        return Change(**base, klass="structural", allowed=True, reason=f"structural: {entry.why}")
    if isinstance(entry, NumericArg):
        return Change(**base, klass="numeric", allowed=False, reason=f"numeric, changes what is trained: {entry.why}")
    if isinstance(entry, FrozenArg):
        return Change(**base, klass="frozen", allowed=False,
                      reason=f"frozen at {entry.value!r} on {model}: {entry.why}")
    assert isinstance(entry, SameMathArg)
    return _classify_swap(base, entry.values, entry.component_test, entry.why, model, c)


def _classify_swap(base: dict[str, Any], values: list[Any], status: str, why: str, model: str, c: Any) -> Change:
    if not any(names.same(c, v) for v in values):
        return Change(**base, klass="same_math", allowed=False,
                      reason=f"same-math swap outside its listed values {values!r} on {model}")
    if status != "passed":
        return Change(**base, klass="same_math", allowed=False,
                      reason=f"same-math swap whose component test {'failed' if status == 'failed' else 'has not run'} "
                      f"on {model}: {why}")
    return Change(**base, klass="same_math", allowed=True, reason=f"same-math swap with a passed component test: {why}")


def _classify_env(clist: CorrectnessList, name: str, b: str | None, c: str | None) -> Change:
    entry = clist.env_entry(name)
    base = {"name": name, "kind": "env", "baseline": b, "candidate": c}
    model = clist.model
    if entry is None:
        return Change(**base, klass="unlisted", allowed=False,
                      reason=f"environment variable not in the correctness list for {model}; anything unlisted is refused")
    if isinstance(entry, (StructuralEnv,)) or (isinstance(entry, EnvPattern) and entry.klass == "structural"):
        return Change(**base, klass="structural", allowed=True, reason=f"structural: {entry.why}")
    if isinstance(entry, (NumericEnv, EnvPattern)):
        return Change(**base, klass="numeric", allowed=False, reason=f"numeric, changes what is trained: {entry.why}")
    if isinstance(entry, FrozenEnv):
        return Change(**base, klass="frozen", allowed=False, reason=f"frozen at {entry.value!r} on {model}: {entry.why}")
    assert isinstance(entry, SameMathEnv)
    return _classify_swap(base, list(entry.values), entry.component_test, entry.why, model, c)


def _env_changes(clist: CorrectnessList, base_env: Mapping[str, str], cand_env: Mapping[str, str]) -> list[Change]:
    out = []
    for name in sorted(set(base_env) | set(cand_env)):
        b, c = base_env.get(name), cand_env.get(name)
        if b is not None and c is not None and str(b) == str(c):
            continue
        if b is None and c is None:
            continue
        out.append(_classify_env(clist, name, None if b is None else str(b), None if c is None else str(c)))
    return out


def _pin_refusals(clist: CorrectnessList, config: Mapping[str, Any], env: Mapping[str, str],
                  changed: set[str], absent_is_unset: bool) -> list[ConfigRefusal]:
    """Frozen settings the candidate does not hold at their pinned value (and that are not already a refused change).

    In a recipe, an argument or variable it does not mention is not visible (the
    resolved re-check sees it); in a resolved configuration, absent means unset.
    """
    out = []
    for dest, entry in clist.args.items():
        if not isinstance(entry, FrozenArg) or dest in changed:
            continue
        if dest not in config and not absent_is_unset:
            continue
        actual = config.get(dest)
        if entry.value is None or entry.value is False:  # pinned off: absent, null and false all hold it
            holds = actual is None or actual is False or names.same(actual, False)
        else:
            holds = names.same(actual, entry.value)
        if not holds:
            out.append(ConfigRefusal(name=dest, kind="arg", klass="frozen",
                               reason=f"frozen at {entry.value!r} on {clist.model}, the candidate has "
                               f"{names.to_jsonable(actual)!r}: {entry.why}"))
    for name, env_entry in clist.env.items():
        if not isinstance(env_entry, FrozenEnv) or name in changed:
            continue
        if name not in env and not absent_is_unset:
            continue
        actual_env = env.get(name)
        if actual_env != env_entry.value:
            out.append(ConfigRefusal(name=name, kind="env", klass="frozen",
                               reason=f"frozen at {env_entry.value!r} on {clist.model}, the candidate has "
                               f"{actual_env!r}: {env_entry.why}"))
    return out


def _defects(clist: CorrectnessList, config: Mapping[str, Any], env: Mapping[str, str]) -> list[DefectHit]:
    hits = []
    for d in clist.defects:
        if conditions.evaluate(d.when, config, env):
            info = conditions.explain(d.when, config, env)
            hits.append(DefectHit(id=d.id, description=d.description, shows=d.shows, source=d.source,
                                  condition=info["condition"], values=info["values"]))
    return hits


def _finish(loaded: LoadedList, mode: Literal["recipe", "resolved"], changes: list[Change],
            cand_config: Mapping[str, Any], cand_env: Mapping[str, str]) -> ConfigCheckResult:
    clist = loaded.clist
    refusals = [ConfigRefusal(name=c.name, kind=c.kind, klass=c.klass, reason=c.reason)  # type: ignore[arg-type]
                for c in changes if not c.allowed]
    refusals += _pin_refusals(clist, cand_config, cand_env, {c.name for c in changes}, mode == "resolved")
    defects = _defects(clist, cand_config, cand_env)
    refusals += [ConfigRefusal(name=h.id, kind="defect", klass="defect",
                         reason=f"known stack defect on {clist.model}: {h.description} ({h.shows}); "
                         f"matched {h.condition} with {h.values}") for h in defects]
    return ConfigCheckResult(model=clist.model, list_sha256=loaded.sha256, mode=mode, passed=not refusals,
                             changes=changes, refusals=refusals, defects=defects)


# ----------------------------------------------------------------- entry points


def check_recipe(loaded: LoadedList, baseline_args: Mapping[str, Any], candidate_args: Mapping[str, Any],
                 baseline_env: Mapping[str, str] | None = None,
                 candidate_env: Mapping[str, str] | None = None) -> ConfigCheckResult:
    """Layer 1 before launch, on recipes in command-line form."""
    clist = loaded.clist
    base_cfg, base_unlisted = recipe_to_config(clist, baseline_args)
    cand_cfg, cand_unlisted = recipe_to_config(clist, candidate_args)
    changes: list[Change] = []
    for dest in sorted(set(base_cfg) | set(cand_cfg)):
        entry = clist.arg(dest)
        b, c = base_cfg.get(dest, _MISSING), cand_cfg.get(dest, _MISSING)
        if b is _MISSING:
            b = _absent(entry, c)
        if c is _MISSING:
            c = _absent(entry, b)
        if names.same(b, c):
            continue
        changes.append(_classify_arg(clist, dest, b, c))
    for flag in sorted(set(base_unlisted) | set(cand_unlisted)):
        b, c = base_unlisted.get(flag), cand_unlisted.get(flag)
        if flag in base_unlisted and flag in cand_unlisted and names.same(b, c):
            continue
        changes.append(Change(name=flag, kind="arg", flag=flag, baseline=names.to_jsonable(b),
                              candidate=names.to_jsonable(c), klass="unlisted", allowed=False,
                              reason=f"flag not in the correctness list for {clist.model}; anything unlisted is refused"))
    changes += _env_changes(clist, baseline_env or {}, candidate_env or {})
    return _finish(loaded, "recipe", changes, cand_cfg, candidate_env or {})


def check_resolved(loaded: LoadedList, baseline_resolved: Mapping[str, Any], candidate_resolved: Mapping[str, Any],
                   baseline_env: Mapping[str, str] | None = None,
                   candidate_env: Mapping[str, str] | None = None) -> ConfigCheckResult:
    """Layer 1 on a check run: every resolved attribute and variable, baseline against candidate."""
    clist = loaded.clist
    changes: list[Change] = []
    for dest in sorted(set(baseline_resolved) | set(candidate_resolved)):
        b = baseline_resolved.get(dest)
        c = candidate_resolved.get(dest)
        if names.same(b, c):
            continue
        changes.append(_classify_arg(clist, dest, b, c))
    changes += _env_changes(clist, baseline_env or {}, candidate_env or {})
    return _finish(loaded, "resolved", changes, candidate_resolved, candidate_env or {})


def apply_changes(baseline_args: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """The candidate recipe: the baseline with ``changes`` applied (a value of None or False removes a flag)."""
    out = dict(baseline_args)
    for k, v in changes.items():
        if v is None or v is False:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def explain_arg(loaded: LoadedList, name: str) -> dict[str, Any]:
    """An argument's (or environment variable's) class on this model, and why."""
    clist = loaded.clist
    dest = resolve_arg_name(clist, name)
    if dest is not None:
        e = clist.args[dest]
        out: dict[str, Any] = {"name": dest, "kind": "arg", "flag": e.cli_flag(dest), "class": e.klass,
                               "why": e.why, "derived": e.derived}
        if e.has_default():
            out["default"] = e.default
        if isinstance(e, FrozenArg):
            out["value"] = e.value
        if isinstance(e, SameMathArg):
            out.update(values=e.values, component_test=e.component_test, component_evidence=e.component_evidence)
        out["defects"] = [d.id for d in clist.defects if dest in conditions.referenced(d.when)[0]]
        out["verdict_on_change"] = _verdict_words(out)
        return out
    if not name.startswith("--"):
        env_e = clist.env_entry(name)
        if env_e is not None:
            out = {"name": name, "kind": "env", "class": env_e.klass, "why": env_e.why}
            if isinstance(env_e, EnvPattern):
                out["pattern"] = env_e.pattern
            if isinstance(env_e, FrozenEnv):
                out["value"] = env_e.value
            if isinstance(env_e, SameMathEnv):
                out.update(values=env_e.values, component_test=env_e.component_test)
            out["verdict_on_change"] = _verdict_words(out)
            return out
    return {"name": name, "kind": "env" if name.isupper() else "arg", "class": "unlisted",
            "why": f"not in the correctness list for {clist.model}",
            "verdict_on_change": "refused: anything unlisted is refused"}


def resolve_arg_name(clist: CorrectnessList, name: str) -> str | None:
    """A listed attribute from a flag (``--no-rope-fusion``), a flag without dashes (``no-rope-fusion``)
    or an attribute name (``apply_rope_fusion``); None if the list has no such argument."""
    if name.startswith("--"):
        return clist.flag_index.get(name)
    if name in clist.args:
        return name
    if "--" + name in clist.flag_index:
        return clist.flag_index["--" + name]
    snake = name.replace("-", "_")
    return snake if snake in clist.args else None


def _verdict_words(info: Mapping[str, Any]) -> str:
    k = info["class"]
    if k == "structural":
        return "allowed: any value (feasibility is checked separately)"
    if k == "numeric":
        return "refused: changes what is trained"
    if k == "frozen":
        return f"refused: pinned to {info.get('value')!r}"
    if info.get("component_test") != "passed":
        return f"refused: component test {info.get('component_test')} on this model"
    return f"allowed for values {info.get('values')!r}"
