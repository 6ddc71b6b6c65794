"""A training recipe: its flags and environment, its parallel degrees, its identity and its command line.

One place for what every layer needs to say about a recipe (stdlib only, so the hooks may use it):

- `ArgValue`: a flag's value. `True` is a bare flag (`--use-flash-attn`); `None` and `False` mean the
  flag is absent; anything else is written after the flag (`4`, `"4"`, `0.5`, `"core_attn moe_act"`).
- The canonical form (`norm_value`, `Recipe.canonical`): a value as the command line sees it, so `4` and
  `"4"` are the same, `None` and `False` both mean absent, and a list-valued flag's words are joined by
  one space. Two recipes are identical exactly when their canonical forms are equal.
- `Recipe`: a full recipe (the baseline with changes folded in), frozen. `Recipe.key` is THE identity:
  the control plane's identical-recipe rule and every tuner's "already tried" set use it.
- `render_args` / `parse_argv`: the one argv renderer and its parser (`parse_argv(render_args(a))` gives
  back `a` in canonical form).
- `ParallelDims`: the typed parallel degrees (TP, PP, VP, CP, EP, ETP and DP derived from the world
  size) a recipe's flags set, with the arithmetic validity rules (`ParallelDims.problems`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

ArgValue = str | int | float | bool | None

# The flag of each parallel degree (Megatron-LM's spelling). DP is derived from the world size.
DEGREE_FLAGS: dict[str, str] = {
    "tp": "--tensor-model-parallel-size",
    "pp": "--pipeline-model-parallel-size",
    "cp": "--context-parallel-size",
    "ep": "--expert-model-parallel-size",
    "etp": "--expert-tensor-parallel-size",
    "vp": "--num-virtual-stages-per-pipeline-rank",
}
DEGREE_FLAG_NAMES = frozenset(DEGREE_FLAGS.values())
MICRO_BATCH_FLAG = "--micro-batch-size"
# A layout: the degrees and the micro batch (what the search rules count as one layout).
LAYOUT_FLAGS: dict[str, str] = {**DEGREE_FLAGS, "mbs": MICRO_BATCH_FLAG}


# ----------------------------------------------------------------------------------------- values


def render_value(value: ArgValue) -> list[str]:
    """How one flag's value appears on the command line (the words after the flag)."""
    if value is True:
        return []
    if isinstance(value, float):
        return [repr(value)]
    if isinstance(value, str) and len(value.split()) > 1:
        return value.split()  # a list-valued flag (nargs="+"): "0 16 32" is three words on the command line
    return [str(value)]


def render_args(args: Mapping[str, ArgValue]) -> list[str]:
    """The flags as command-line words: a bare flag for True, nothing for None/False, else flag and value."""
    out: list[str] = []
    for flag, value in args.items():
        if value is None or value is False:
            continue
        out.append(flag)
        out.extend(render_value(value))
    return out


def norm_value(value: ArgValue) -> str | bool | None:
    """A value in canonical form: None when absent (None/False), True for a bare flag, else its words."""
    if value is None or value is False:
        return None
    if value is True:
        return True
    return " ".join(render_value(value))


def as_int(value: Any, default: int) -> int:
    """A flag's integer value; `default` when absent, bare, or not an integer."""
    if value is None or value is False or value is True:
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def parse_argv(argv: Sequence[str]) -> tuple[list[str], dict[str, ArgValue]]:
    """Split a command line into (the program part, {--flag: value}).

    A token starting with `--` is a flag; the tokens after it up to the next flag are its value,
    joined by single spaces (`--recompute-modules core_attn moe_act`); a flag with no value is bare
    (True). `--flag=value` works too. `--no-x` is kept as written. Values are strings."""
    prog: list[str] = []
    args: dict[str, ArgValue] = {}
    toks = list(argv)
    i = 0
    while i < len(toks) and not toks[i].startswith("--"):
        prog.append(toks[i])
        i += 1
    current: str | None = None
    for t in toks[i:]:
        if t.startswith("--") and len(t) > 2:
            name, eq, val = t.partition("=")
            current = name
            args[name] = val if eq else True
        elif current is not None:
            prev = args[current]
            args[current] = t if prev is True else f"{prev} {t}"
    return prog, args


def apply_changes(args: Mapping[str, ArgValue], env: Mapping[str, str], changes_args: Mapping[str, ArgValue] | None,
                  changes_env: Mapping[str, Any] | None) -> tuple[dict[str, ArgValue], dict[str, str]]:
    """`args`/`env` with changes applied: a None/False flag is removed, a None variable unset."""
    out_args = dict(args)
    for k, v in (changes_args or {}).items():
        if v is None or v is False:
            out_args.pop(k, None)
        else:
            out_args[k] = v
    out_env = dict(env)
    for k, v in (changes_env or {}).items():
        if v is None:
            out_env.pop(k, None)
        else:
            out_env[k] = str(v)
    return out_args, out_env


def split_flat(flat: Mapping[str, Any]) -> tuple[dict[str, ArgValue], dict[str, str | None]]:
    """A flat mapping of changes (`--flag` keys are arguments, others environment variables) as (args, env);
    a variable's value as a string (None: unset)."""
    args = {k: v for k, v in flat.items() if k.startswith("--")}
    env = {k: None if v is None else str(v) for k, v in flat.items() if not k.startswith("--")}
    return args, env


# ----------------------------------------------------------------------------------------- degrees


@dataclass(frozen=True)
class ParallelDims:
    """The parallel degrees of a recipe on `world` ranks. DP = world / (TP x PP x CP)."""

    world: int
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int = 1
    vp: int = 1

    @classmethod
    def from_args(cls, args: Mapping[str, ArgValue], world: int, etp_default: int | None = None) -> ParallelDims:
        """The degrees a recipe's flags set (an absent or bare degree is 1; ETP defaults to `etp_default`,
        else to TP, Megatron-LM's default)."""
        d = {k: as_int(args.get(f), 1) for k, f in DEGREE_FLAGS.items()}
        d["etp"] = as_int(args.get(DEGREE_FLAGS["etp"]), d["tp"] if etp_default is None else etp_default)
        return cls(world=world, **d)

    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp * self.cp

    @property
    def dp(self) -> int:
        """Data parallelism (at least 1; `problems` says when TP x PP x CP does not divide the world)."""
        return max(1, self.world // max(1, self.model_parallel))

    @property
    def edp(self) -> int:
        """Expert data parallelism: the TP x CP x DP ranks of a stage over EP x ETP (at least 1)."""
        return max(1, self.tp * self.cp * self.dp // max(1, self.ep * self.etp))

    def as_dict(self) -> dict[str, int]:
        return {"tp": self.tp, "pp": self.pp, "cp": self.cp, "ep": self.ep, "etp": self.etp, "vp": self.vp,
                "dp": self.dp}

    def flags(self, dims: Iterable[str] = tuple(DEGREE_FLAGS)) -> dict[str, int]:
        """The degrees `dims` (default: all but DP) as flags, in that order."""
        return {DEGREE_FLAGS[d]: getattr(self, d) for d in dims}

    def problems(self, *, layers: int | None = None, heads: int | None = None, groups: int | None = None,
                 experts: int | None = None, moe_ffn: int | None = None, seq_length: int | None = None,
                 global_batch: int | None = None, micro_batch: int | None = None,
                 even_split: bool = False) -> list[str]:
        """The arithmetic validity rules the degrees break (empty: none), each as one line. Rules that
        need a model or workload fact are checked only where it is given:

        every degree and the world positive; TP x PP x CP divides the world; VP > 1 needs PP >= 2; the
        layers cover PP x VP stages (with `even_split`, divisible by PP x VP); TP divides the attention
        heads and query groups; EP divides the routed experts and ETP the expert FFN width; EP x ETP
        divides TP x CP x DP; the sequence divisible by 2 x CP (CP > 1); the global batch divisible by
        micro batch x DP."""
        out = [f"{name} must be a positive integer, got {v!r}" for name, v in
               (("world", self.world), *self.as_dict().items()) if name != "dp" and (not isinstance(v, int) or v <= 0)]
        if out:
            return out
        tp, pp, cp, vp = self.tp, self.pp, self.cp, self.vp
        rules = [
            (self.world % self.model_parallel != 0,
             f"world size ({self.world}) must be divisible by TP x PP x CP ({tp}x{pp}x{cp})"),
            (vp > 1 and pp < 2, "virtual stages (VP > 1) need PP >= 2"),
            (layers is not None and layers < pp * vp, f"{layers} layers cannot fill PP {pp} x VP {vp} stages"),
            (layers is not None and even_split and layers % (pp * vp) != 0,
             f"{layers} layers are not divisible by PP x VP ({pp}x{vp})"),
            (heads is not None and heads % tp != 0, f"TP {tp} must divide the attention heads ({heads})"),
            (groups is not None and groups % tp != 0, f"TP {tp} must divide the query groups ({groups})"),
            (bool(experts) and experts % self.ep != 0, f"EP {self.ep} must divide the routed experts ({experts})"),
            (bool(moe_ffn) and moe_ffn % self.etp != 0, f"ETP {self.etp} must divide the expert FFN width ({moe_ffn})"),
            (bool(experts) and (tp * cp * self.dp) % (self.ep * self.etp) != 0,
             f"ETP x EP ({self.etp}x{self.ep}) must divide TP x CP x DP ({tp}x{cp}x{self.dp})"),
            (seq_length is not None and cp > 1 and seq_length % (2 * cp) != 0,
             f"the sequence length ({seq_length}) must be divisible by 2 x CP ({2 * cp})"),
            (global_batch is not None and global_batch % ((micro_batch or 1) * self.dp) != 0,
             f"the global batch ({global_batch}) must be divisible by micro batch x DP "
             f"({micro_batch or 1}x{self.dp})"),
        ]
        return [message for broken, message in rules if broken]


# ----------------------------------------------------------------------------------------- recipes


@dataclass(frozen=True)
class Recipe:
    """A full recipe: flags, environment, and whether the run is profiled. Build one from the baseline
    with `with_changes` / `with_flat`; compare recipes by `key` (equal keys: the same command line)."""

    args: Mapping[str, ArgValue] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    profile: bool = False

    @classmethod
    def from_argv(cls, argv: Sequence[str], env: Mapping[str, str] | None = None) -> tuple[list[str], Recipe]:
        """(the program part, the recipe) of a command line."""
        prog, args = parse_argv(argv)
        return prog, cls(args, dict(env or {}))

    def with_changes(self, args: Mapping[str, ArgValue] | None = None, env: Mapping[str, Any] | None = None,
                     profile: bool | None = None) -> Recipe:
        """This recipe with changes applied (a None/False flag removed, a None variable unset)."""
        a, e = apply_changes(self.args, self.env, args, env)
        return Recipe(a, e, self.profile if profile is None else profile)

    def with_flat(self, flat: Mapping[str, Any]) -> Recipe:
        """This recipe with a flat mapping of changes applied (`--flag` keys arguments, others variables)."""
        return self.with_changes(*split_flat(flat))

    def canonical(self) -> dict[str, Any]:
        """The canonical form: present flags' canonical values and the variables, each sorted by name."""
        args = {k: norm_value(v) for k, v in self.args.items()}
        return {"args": {k: v for k, v in sorted(args.items()) if v is not None},
                "env": dict(sorted(self.env.items())), "profile": bool(self.profile)}

    @property
    def key(self) -> str:
        """The recipe's identity: identical recipes, and only they, share it."""
        body = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(body.encode()).hexdigest()

    def diff(self, base: Recipe) -> tuple[dict[str, ArgValue], dict[str, str | None]]:
        """This recipe's difference from `base` as (args, env) changes, sorted by name (None: removed)."""
        base_args = {k: norm_value(v) for k, v in base.args.items() if norm_value(v) is not None}
        out_args: dict[str, ArgValue] = {}
        for k, v in self.args.items():
            if norm_value(v) is not None and base_args.get(k) != norm_value(v):
                out_args[k] = v
        for k in base_args:
            if norm_value(self.args.get(k)) is None:
                out_args[k] = None
        out_env: dict[str, str | None] = {k: v for k, v in self.env.items() if base.env.get(k) != v}
        out_env.update({k: None for k in base.env if k not in self.env})
        return dict(sorted(out_args.items())), dict(sorted(out_env.items()))

    def argv(self) -> list[str]:
        """The recipe's flags as command-line words (`render_args`)."""
        return render_args(self.args)

    def degrees(self, world: int, etp_default: int | None = None) -> ParallelDims:
        return ParallelDims.from_args(self.args, world, etp_default)
