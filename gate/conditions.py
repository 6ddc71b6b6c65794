"""A small interpreter for the declarative defect conditions of a correctness list.

A condition is data (see :class:`gate.lists.ArgCondition` and friends), evaluated
against a configuration: attribute name -> value, plus the environment. Nothing is
ever passed to ``eval``. A comparison against an argument the configuration does not
have is false (``unset`` is the way to ask for absence); ``ne`` and ``not_in`` on an
absent argument are false as well, so a defect never fires on missing information
without saying so: :func:`explain` reports the arguments it could not see.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gate import names
from gate.lists import AllCondition, AnyCondition, ArgCondition, EnvCondition, NotCondition

_MISSING = object()


def _is_set(v: Any) -> bool:
    return v is not _MISSING and v is not None and v is not False


def _compare(op: str, actual: Any, expected: Any) -> bool:
    if actual is not _MISSING:
        actual = names.normalize(actual)  # a resolved block prints None, True, 4 as text
    if op == "set":
        return _is_set(actual)
    if op == "unset":
        return not _is_set(actual)
    if actual is _MISSING:
        return False
    a = actual
    if op == "eq":
        return a == names.normalize(expected)
    if op == "ne":
        return a != names.normalize(expected)
    if op in ("in", "not_in"):
        members = [names.normalize(x) for x in expected]
        return (a in members) if op == "in" else (a not in members)
    # ordering: numbers only (bools are not numbers here)
    if isinstance(a, bool) or not isinstance(a, (int, float)):
        return False
    e = names.normalize(expected)
    if op == "lt":
        return a < e
    if op == "le":
        return a <= e
    if op == "gt":
        return a > e
    if op == "ge":
        return a >= e
    raise ValueError(f"unknown op {op!r}")


def evaluate(cond: Any, args: Mapping[str, Any], env: Mapping[str, str]) -> bool:
    """True when the configuration matches the condition."""
    if isinstance(cond, AllCondition):
        return all(evaluate(c, args, env) for c in cond.all)
    if isinstance(cond, AnyCondition):
        return any(evaluate(c, args, env) for c in cond.any)
    if isinstance(cond, NotCondition):
        return not evaluate(cond.not_, args, env)
    if isinstance(cond, ArgCondition):
        return _compare(cond.op, args.get(cond.arg, _MISSING), cond.value)
    if isinstance(cond, EnvCondition):
        return _compare(cond.op, env.get(cond.env, _MISSING), cond.value)
    raise TypeError(f"not a condition: {cond!r}")


def describe(cond: Any) -> str:
    """The condition in words, e.g. ``expert_model_parallel_size == 1 and expert_tensor_parallel_size >= 4``."""
    symbols = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "in": "in", "not_in": "not in"}
    if isinstance(cond, AllCondition):
        return " and ".join(_paren(c) for c in cond.all)
    if isinstance(cond, AnyCondition):
        return " or ".join(_paren(c) for c in cond.any)
    if isinstance(cond, NotCondition):
        return f"not {_paren(cond.not_)}"
    name = cond.arg if isinstance(cond, ArgCondition) else f"env {cond.env}"
    if cond.op == "set":
        return f"{name} is set"
    if cond.op == "unset":
        return f"{name} is not set"
    return f"{name} {symbols[cond.op]} {cond.value!r}"


def _paren(c: Any) -> str:
    text = describe(c)
    return f"({text})" if isinstance(c, (AllCondition, AnyCondition)) else text


def referenced(cond: Any) -> tuple[list[str], list[str]]:
    """(argument names, environment names) a condition reads."""
    if isinstance(cond, ArgCondition):
        return [cond.arg], []
    if isinstance(cond, EnvCondition):
        return [], [cond.env]
    subs = cond.all if isinstance(cond, AllCondition) else cond.any if isinstance(cond, AnyCondition) else [cond.not_]
    a: list[str] = []
    e: list[str] = []
    for s in subs:
        x, y = referenced(s)
        a += x
        e += y
    return a, e


def explain(cond: Any, args: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """The values the condition read, and the argument names it could not find."""
    arg_names, env_names = referenced(cond)
    seen = {n: names.to_jsonable(args[n]) for n in arg_names if n in args}
    missing = sorted({n for n in arg_names if n not in args})
    env_seen = {n: env[n] for n in env_names if n in env}
    return {"condition": describe(cond), "values": seen, "env": env_seen, "not_in_configuration": missing}
