"""The run generator: clone the baseline job and apply only the requested edits.

A candidate is described by its *changes*: flags (`--name -> value`, where None or False removes
the flag) and environment variables (`NAME -> value`, None unsets), relative to a base recipe (the
baseline, the leader or another run). The generator

1. validates the changes: flag and variable names, plain values, variables on the campaign's
   allowlist, nothing that touches the pinned shape (sequence length, batch, steps), the stack
   fixes or the profiling arguments;
2. composes them with the base run's changes into the full difference from the baseline, which
   is what the ledger records and what identifies a recipe;
3. resolves the job: the baseline command with its placeholders filled, the candidate's
   arguments, then the profiling arguments (on a profiled run) and the campaign's stack fixes,
   which every job gets and no candidate can override.

`check_shape` then verifies a resolved job against the campaign's pinned shape, independently of
how it was generated.

Everything here is pure: no files, no processes, no ledger.
"""

from __future__ import annotations

import fnmatch
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attune.control.spec import CampaignSpec, is_env_name
from attune.core.containment import inside
from attune.core.errors import ControlError
from attune.core.job import JobSpec
from attune.core.recipe import ArgValue, Recipe, render_args
from attune.core.recipe import norm_value as _norm

# The flags that pin the workload's shape, per framework: (sequence length, global batch, steps).
PINNED_FLAGS: dict[str, dict[str, str]] = {
    "megatron-lm": {"seq_length": "--seq-length", "global_batch": "--global-batch-size", "steps": "--train-iters"},
    "megatron-bridge": {
        "seq_length": "--seq-length",
        "global_batch": "--global-batch-size",
        "steps": "--train-iters",
    },
    "torchtitan": {
        "seq_length": "--training.seq_len",
        "global_batch": "--training.global_batch_size",
        "steps": "--training.steps",
    },
}
PLACEHOLDERS = ("gpus", "gpus_per_node", "nodes", "run_dir")
MAX_VALUE_CHARS = 4096
# A candidate's flag names: --name, then letters, digits, '_', '-', '.' (no '=', no spaces, no quotes).
CANDIDATE_FLAG = re.compile(r"--[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}")
# A value is split on these into pieces; every piece is confined as a path (see confine_paths).
_PATH_SPLIT = re.compile(r"[,;:=\s]+")


class RunGenError(ControlError):
    """A request the generator refuses. `code` is a stable word; the message says what to change."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Changes:
    """A recipe's difference from the baseline (or a request's edits to a base recipe)."""

    args: dict[str, ArgValue] = field(default_factory=dict)
    env: dict[str, str | None] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"args": dict(self.args), "env": dict(self.env)}

    @property
    def empty(self) -> bool:
        return not self.args and not self.env


@dataclass(frozen=True)
class GeneratedRecipe:
    """A generated candidate recipe."""

    changes: Changes  # the full difference from the baseline
    args: dict[str, ArgValue]  # the candidate recipe's own arguments (before fixes)
    env: dict[str, str]  # the candidate recipe's own environment (before fixes)
    profile: bool
    recipe_key: str  # identity: identical recipes have the same key


# ----------------------------------------------------------------------------------------- values


def _smuggles_option(value: str) -> bool:
    """True when a flag value carries a word the job's argument parser would read as another option.

    A value's words become separate command-line words (list-valued flags), so `"x --train-iters 9"`
    would set a second, unchecked flag; a word starting with '-' is allowed only as a number."""
    for word in value.split():
        if word.startswith("-"):
            try:
                float(word)
            except ValueError:
                return True
    return False


def _check_value(where: str, value: Any, *, flag: bool = False) -> ArgValue:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise RunGenError("bad_change", f"{where}: expected a finite number, got {value!r}")
        return value
    if isinstance(value, str):
        if len(value) > MAX_VALUE_CHARS or any(c in value for c in "\x00\n\r"):
            raise RunGenError(
                "bad_change", f"{where}: expected a one-line string of at most {MAX_VALUE_CHARS} characters"
            )
        if flag and _smuggles_option(value):
            raise RunGenError(
                "bad_change",
                f"{where}: a value word starts with '-' and is not a number; it would be read as another "
                "flag (set each flag under its own key)",
            )
        return value
    raise RunGenError(
        "bad_change", f"{where}: expected a string, number, true (bare flag), or null/false (remove), got {value!r}"
    )


def parse_changes(obj: Any) -> Changes:
    """Validate a request's `changes` object: `{"args": {"--flag": value}, "env": {"NAME": "value"}}`."""
    if obj is None:
        return Changes()
    if not isinstance(obj, Mapping):
        raise RunGenError("bad_change", 'changes: expected an object {"args": {...}, "env": {...}}')
    unknown = sorted(set(obj) - {"args", "env"})
    if unknown:
        raise RunGenError("bad_change", f"changes: unknown key(s) {unknown}; expected only 'args' and 'env'")
    args_in, env_in = obj.get("args") or {}, obj.get("env") or {}
    if not isinstance(args_in, Mapping) or not isinstance(env_in, Mapping):
        raise RunGenError("bad_change", "changes.args and changes.env must be objects")
    args: dict[str, ArgValue] = {}
    for k, v in args_in.items():
        if not isinstance(k, str) or not CANDIDATE_FLAG.fullmatch(k):
            raise RunGenError("bad_change", (
                f"changes.args: {str(k)[:120]!r} is not a flag name (expected --name of letters, digits, "
                "'_', '-' and '.', at most 102 characters; a value goes in the value, not after '=')"))
        args[k] = _check_value(f"changes.args[{k}]", v, flag=True)
    env: dict[str, str | None] = {}
    for k, v in env_in.items():
        if not is_env_name(k):
            raise RunGenError("bad_change", f"changes.env: {k!r} is not an environment variable name")
        if v is not None and not isinstance(v, str | int | float) or isinstance(v, bool):
            raise RunGenError("bad_change", f"changes.env[{k}]: expected a string value or null (unset), got {v!r}")
        env[k] = None if v is None else str(_check_value(f"changes.env[{k}]", str(v)))
    return Changes(args, env)


def confine_paths(changes: Changes, run_dir: Path, workdir: Path, ctx: Mapping[str, Any]) -> None:
    """Refuse a candidate whose flag or variable values could name a path outside the run's own directory.

    The rule, for every flag and variable the candidate sets (listed or not): its value (after the
    placeholders are filled) is split on ',', ';', ':', '=' and white space, and *every* piece is taken
    for a path, whatever its spelling: a bare name (`policy.yaml`, `ledger.jsonl`) as much as one with a
    '/'. A relative piece is resolved against the run's directory, which is the job's working directory
    on every backend, symbolic links followed, and must land inside it; an absolute one must name a
    place inside it too; `~` is never expanded and is refused. A word that is no path at all (`full`,
    `4`, `Ring`) resolves inside the run and passes. `workdir` (the code's directory) is no base for
    a candidate's paths: jobs do not run there. Write `{run_dir}/name` or a bare `name`."""
    del workdir  # kept in the signature: callers pass the campaign's code directory
    base = os.path.realpath(run_dir)
    items = [(f"changes.args[{k}]", v) for k, v in changes.args.items()]
    items += [(f"changes.env[{k}]", v) for k, v in changes.env.items()]
    for where, value in items:
        if not isinstance(value, str):
            continue
        text = substitute(value, ctx)
        for piece in _PATH_SPLIT.split(text):
            if not piece:
                continue
            if piece.startswith("~"):
                raise RunGenError("path_outside_run", (
                    f"{where}: {piece!r} names a home directory; a path in a candidate's value must be inside the "
                    "run's own directory (write {run_dir}/name)"))
            real = os.path.realpath(os.path.join(base, piece))
            if not inside(real, base):
                raise RunGenError("path_outside_run", (
                    f"{where}: {piece!r} resolves to {real}, outside the run's own directory: a path in a "
                    "candidate's value must be inside it (write {run_dir}/name)"))


def job_command(command: list[str] | tuple[str, ...], ctx: Mapping[str, Any], workdir: Path) -> list[str]:
    """The baseline command with placeholders filled and, since a job runs in its run directory, every
    relative word that names a file of the code directory (`examples/tinygpt/train.py`, `pretrain_gpt.py`)
    made absolute against it. The command is the campaign's own (trusted), not a candidate's."""
    out = []
    for part in command:
        word = substitute(part, ctx)
        if word and not word.startswith("-") and not os.path.isabs(word) and os.path.exists(os.path.join(workdir, word)):
            word = os.path.join(os.path.abspath(workdir), word)
        out.append(word)
    return out


def substitute(text: str, ctx: Mapping[str, Any]) -> str:
    for key in PLACEHOLDERS:
        if key in ctx:
            text = text.replace("{" + key + "}", str(ctx[key]))
    return text


# ----------------------------------------------------------------------------------------- generator


class RunGenerator:
    """Generates candidates and jobs for one campaign spec."""

    def __init__(self, spec: CampaignSpec) -> None:
        self.spec = spec
        self.baseline = spec.baseline
        self.base_recipe = Recipe(dict(spec.baseline.args), dict(spec.baseline.env))
        pinned = PINNED_FLAGS.get(spec.framework, {})
        self.pinned_flags = set(pinned.values())
        self.fixed_args = set(spec.control.stack_fixes.args)
        self.fixed_env = set(spec.control.stack_fixes.env)
        self.profile_flags = set(spec.control.profile_args)

    # --- validation -------------------------------------------------------------------------
    def env_allowed(self, name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, pat) for pat in self.spec.control.env_allowlist)

    def check_edits(self, edits: Changes) -> None:
        for flag in edits.args:
            if flag in self.pinned_flags:
                raise RunGenError(
                    "pinned",
                    f"{flag} is pinned by the campaign's workload (sequence length, batch and steps are "
                    "the same for every candidate); leave it out of the changes",
                )
            if flag in self.fixed_args:
                raise RunGenError(
                    "stack_fix", f"{flag} is set by the campaign's stack fixes on every job; it cannot be changed"
                )
            if flag in self.profile_flags:
                raise RunGenError(
                    "profile_flag", f"{flag} is a profiling argument: ask for a profiled run (profile=true) instead"
                )
        for name in edits.env:
            if name in self.fixed_env:
                raise RunGenError(
                    "stack_fix", f"{name} is set by the campaign's stack fixes on every job; it cannot be changed"
                )
            if not self.env_allowed(name):
                raise RunGenError(
                    "env_not_allowlisted",
                    f"environment variable {name} is not on the campaign's allowlist "
                    f"({', '.join(self.spec.control.env_allowlist) or 'empty'})",
                )

    def confine(self, changes: Changes, run_dir: Path, workdir: Path) -> None:
        """`confine_paths` for this campaign's placeholders."""
        confine_paths(changes, run_dir, workdir, self.placeholders(run_dir))

    # --- recipes ----------------------------------------------------------------------------
    def apply(self, changes: Changes) -> tuple[dict[str, ArgValue], dict[str, str]]:
        """The recipe the full `changes` make of the baseline: (args, env)."""
        r = self.base_recipe.with_changes(changes.args, changes.env)
        return dict(r.args), dict(r.env)

    def diff(self, args: Mapping[str, ArgValue], env: Mapping[str, str]) -> Changes:
        """The difference of a recipe from the baseline (None marks a removed flag or variable)."""
        return Changes(*Recipe(args, env).diff(self.base_recipe))

    def candidate(self, base: Changes, edits: Changes, profile: bool) -> GeneratedRecipe:
        """Compose `edits` onto the recipe `base` (a difference from the baseline)."""
        self.check_edits(edits)
        r = self.base_recipe.with_changes(base.args, base.env).with_changes(edits.args, edits.env, profile)
        args, env = dict(r.args), dict(r.env)
        return GeneratedRecipe(self.diff(args, env), args, env, profile, r.key)

    def recipe_key(self, args: Mapping[str, ArgValue], env: Mapping[str, str], profile: bool) -> str:
        """The recipe's identity (`attune.core.recipe.Recipe.key`)."""
        return Recipe(args, env, profile).key

    # --- jobs -------------------------------------------------------------------------------
    def placeholders(self, run_dir: Path) -> dict[str, Any]:
        c = self.spec.cluster
        return {"gpus": c.gpus, "gpus_per_node": c.gpus_per_node, "nodes": c.nodes, "run_dir": str(run_dir)}

    def trusted_args(self, profile: bool) -> dict[str, ArgValue]:
        """The arguments no candidate may influence: profiling (when asked) then the stack fixes."""
        out: dict[str, ArgValue] = {}
        if profile:
            out.update(self.spec.control.profile_args)
        out.update(self.spec.control.stack_fixes.args)
        return out

    def profile_window(self, args: Mapping[str, ArgValue]) -> dict[str, ArgValue]:
        """Megatron-LM: a profiled run traces `profile_extra_steps` steps after the measured window (never
        inside it), on one rank per pipeline stage (the first rank of each stage in Megatron's default
        tp-cp-ep-dp-pp order); the run is that many steps longer. Other frameworks: nothing added."""
        extra = self.spec.control.profile_extra_steps
        prof = self.spec.control.profile_args
        if self.spec.framework != "megatron-lm" or extra <= 0 or not prof.get("--profile"):
            return {}
        if any(f in prof for f in ("--profile-step-start", "--profile-step-end", "--profile-ranks")):
            return {}  # the campaign chose its own window
        steps = self.spec.workload.steps_per_run
        out: dict[str, ArgValue] = {"--use-pytorch-profiler": True, "--profile-step-start": steps,
                                    "--profile-step-end": steps + extra, "--train-iters": steps + extra}
        gpus = self.spec.cluster.gpus
        try:
            pp = int(args.get("--pipeline-model-parallel-size") or 1)
        except (TypeError, ValueError):
            pp = 1
        if pp >= 1 and gpus % pp == 0:
            out["--profile-ranks"] = " ".join(str(s * (gpus // pp)) for s in range(pp))
        return out

    def resolve(self, cand: GeneratedRecipe, run_dir: Path, workdir: Path) -> JobSpec:
        """The job that runs `cand` in `run_dir` (its name is the job's id)."""
        ctx = self.placeholders(run_dir)
        args: dict[str, ArgValue] = dict(cand.args)
        args.update(self.trusted_args(cand.profile))
        if cand.profile:
            args.update(self.profile_window(args))
        args = {k: substitute(v, ctx) if isinstance(v, str) else v for k, v in args.items()}
        env = dict(cand.env)
        env.update(self.spec.control.stack_fixes.env)
        env = {k: substitute(v, ctx) for k, v in env.items()}
        command = job_command(self.baseline.command, ctx, workdir)
        argv = tuple(command + render_args(args))
        c = self.spec.cluster
        return JobSpec(job_id=run_dir.name, campaign=self.spec.name, argv=argv, env=env, workdir=workdir,
                       run_dir=run_dir, gpus=c.gpus, gpus_per_node=c.gpus_per_node,
                       time_limit_s=self.spec.control.time_limit_s, image=self.baseline.image, args=args)

    # --- the pinned shape -------------------------------------------------------------------
    def steps_flag(self) -> str | None:
        return PINNED_FLAGS.get(self.spec.framework, {}).get("steps")

    def expected_pins(self, profile: bool, steps: int | None = None) -> dict[str, Any]:
        """Each pinned flag's required value (None: must be absent), from the trusted recipe.

        `steps` overrides the run length (a correctness check run is longer than a measured run)."""
        trusted = dict(self.baseline.args)
        trusted.update(self.trusted_args(profile))
        if profile:
            trusted.update({k: v for k, v in self.profile_window(trusted).items() if k in self.pinned_flags})
        flag = self.steps_flag()
        if steps is not None and flag is not None:
            trusted[flag] = steps
        return {flag: _norm(trusted.get(flag)) for flag in sorted(self.pinned_flags)}

    def with_steps(self, cand: GeneratedRecipe, steps: int) -> GeneratedRecipe:
        """The same recipe run for `steps` steps (the only pinned flag a check run changes)."""
        flag = self.steps_flag()
        if flag is None:
            raise RunGenError("bad_request", f"framework {self.spec.framework} has no steps flag")
        args = {**cand.args, flag: steps}
        return GeneratedRecipe(cand.changes, args, dict(cand.env), cand.profile, self.recipe_key(args, cand.env, cand.profile))

    def check_shape(self, job: JobSpec, profile: bool, steps: int | None = None) -> list[str]:
        """Problems of a resolved job against the campaign's pinned shape (empty: it conforms)."""
        problems: list[str] = []
        c = self.spec.cluster
        if job.gpus != c.gpus:
            problems.append(f"the job asks for {job.gpus} GPUs; the campaign pins {c.gpus}")
        if job.gpus_per_node != c.gpus_per_node:
            problems.append(f"the job asks for {job.gpus_per_node} GPUs per node; the campaign pins {c.gpus_per_node}")
        if job.image != self.baseline.image:
            problems.append(f"the job's image {job.image!r} is not the campaign's image {self.baseline.image!r}")
        command = job_command(self.baseline.command, self.placeholders(job.run_dir), job.workdir)
        if list(job.argv[: len(command)]) != command:
            problems.append("the job's command is not the campaign's baseline command")
        expected = self.expected_pins(profile, steps)
        for flag, want in expected.items():
            got = _norm(job.args.get(flag))
            if got != want:
                problems.append(f"{flag} is {got!r} in the job; the campaign pins {want!r}")
        for key, fixed in self.spec.control.stack_fixes.env.items():
            if job.env.get(key) != substitute(fixed, self.placeholders(job.run_dir)):
                problems.append(f"stack fix {key}={fixed!r} is missing from the job's environment")
        return problems

    def check_baseline(self) -> list[str]:
        """Problems of the campaign's own baseline against its workload (a misconfigured campaign)."""
        pinned = PINNED_FLAGS.get(self.spec.framework, {})
        w = self.spec.workload
        want = {"seq_length": w.seq_length, "global_batch": w.global_batch, "steps": w.steps_per_run}
        problems = []
        for key, flag in pinned.items():
            if flag in self.baseline.args and _norm(self.baseline.args[flag]) != _norm(want[key]):
                problems.append(
                    f"baseline.args[{flag}] is {self.baseline.args[flag]!r} but workload.{key} is {want[key]!r}"
                )
        return problems
