"""The skill's search rules 2, 4, 5 and 6, enforced by the control plane (not only written in the skill).

Every check returns `RuleRefusal`s: a stable `code`, one line of prose, and the missing `items`. The
launch path refuses a candidate that breaks rule 2; `record_stop` refuses a stop while any stop rule
is open (the refusal is written to the ledger as a `stop_refused` row, so the Stop hook and
`campaign_status` show its codes and items). Every rule is waived once the search budget is spent,
and none applies to a campaign started for a black-box tuner (`search_rules: off` in its
`campaign_started` row: TPE and random search sample the space, they do not follow the skill).

Codes:
    rule2_one_lever          a candidate changes more than one lever or coupled set relative to the leader
    calibration_incomplete   a stop before the baseline's calibration is complete
    levers_not_run           a stop names levers that no search run changed
    rule4_lever_values       a lever named as tested was tried with one value, not at its feasible limit
    rule4_layout_unprobed    a stop before each of TP, PP, EP, CP and DP was probed (or shown infeasible)
    rule5_oom_not_retried    an out-of-memory layout the estimate ranks faster was not retried with
                             more memory savings
    rule6_winners_not_retested  flags that won on an earlier layout were not re-tested on the final one

Lever identity comes from the skill's lever catalog (`skills/attune/catalog/levers.yaml`): a flag
belongs to the levers that list it, and two levers form a coupled set when either names the other
in its `couplings`; a layout lever and a memory saving (recompute, offload) are one set (rule 5's
retry). A flag the catalog does not know is its own lever, and all such flags together count as one
set (nothing says they are unrelated).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from attune.control.spec import CampaignSpec
from attune.core.recipe import LAYOUT_FLAGS, MICRO_BATCH_FLAG, ParallelDims, Recipe, as_int, norm_value
from attune.core.state import CampaignState, RunState
from attune.core.vocab import RunKind, RunOutcome, Verdict

DIMENSIONS = ("tp", "pp", "ep", "cp", "dp")
RECOMPUTE_RANK = {None: 0, "none": 0, "selective": 1, "full": 2}
OFFLOAD_FLAGS = ("--optimizer-cpu-offload", "--cpu-offloading")
RULES_OFF = "off"
# The codes `stop_refusals` answers with (a refused stop; the Stop hook's hints are keyed by them).
STOP_RULE_CODES = ("calibration_incomplete", "levers_not_run", "rule4_lever_values", "rule4_layout_unprobed",
                   "rule5_oom_not_retried", "rule6_winners_not_retested")
# Rule 5 makes a layout and its memory savings one set: a new layout retried with recomputation or
# offload added back is one change, whatever the catalog's couplings say.
LAYOUT_LEVERS = frozenset({"tensor-parallel", "pipeline-parallel", "virtual-pipeline", "pipeline-stage-split",
                           "context-parallel", "expert-parallel", "expert-tensor-parallel", "data-parallel",
                           "micro-batch-size"})
MEMORY_LEVERS = frozenset({"recompute-granularity", "recompute-method", "recompute-modules",
                           "optimizer-cpu-offload"})


@dataclass
class RuleRefusal:
    code: str
    message: str
    items: list[str] = field(default_factory=list)
    # What a tuner can act on, item by item where a rule names runs or values: {"run_id"} for rule 5's
    # out-of-memory runs, {"name", "value"} for rule 6's winning values (`HeuristicTuner.repair`).
    targets: list[dict[str, str]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        return f"[{self.code}] {self.message}" + (": " + "; ".join(self.items) if self.items else "")


def budget_exhausted(state: CampaignState) -> bool:
    """The search budget is spent: nothing left, or less than one more run costs (a calibration run's mean charge)."""
    b = state.budget
    if b.spent:
        return True
    left = b.search_remaining
    charges = [state.runs[r].charge_gpu_hours for r in state.calibration_run_ids if r in state.runs]
    if left is not None and bool(charges) and left < sum(charges) / len(charges):
        return True
    # The control plane's own evidence: the last launch was a search run refused because its expected
    # cost does not fit what is left, and nothing is in flight that could give budget back.
    last = state.refusals[-1] if state.refusals else None
    return (last is not None and last.get("code") == "budget" and last.get("kind") == RunKind.SEARCH
            and not state.in_flight and last.get("seq", -1) > max(
                (r.admitted_seq for r in state.runs.values() if getattr(r, "admitted_seq", None) is not None),
                default=-1))


def enforced(state: CampaignState) -> bool:
    """Whether the rules bind now: the campaign follows them and its search budget is not spent."""
    return state.search_rules != RULES_OFF and not budget_exhausted(state)


# ----------------------------------------------------------------------------------- recipes


def recipe(spec: CampaignSpec, changes: Mapping[str, Any] | None) -> tuple[dict[str, Any], dict[str, str]]:
    """A run's full arguments and environment: the baseline with the run's changes applied."""
    ch = changes or {}
    r = Recipe(spec.baseline.args, spec.baseline.env).with_changes(ch.get("args"), ch.get("env"))
    return dict(r.args), dict(r.env)


def leader_recipe(spec: CampaignSpec, state: CampaignState) -> tuple[dict[str, Any], dict[str, str]]:
    run = state.runs.get(state.leader_run_id or "")
    return recipe(spec, run.changes if run is not None else None)


def degrees(args: Mapping[str, Any], gpus: int) -> dict[str, int]:
    """The parallel degrees a recipe's arguments set (DP derived from the GPU count) and its micro batch."""
    return {**ParallelDims.from_args(args, gpus).as_dict(), "mbs": as_int(args.get(MICRO_BATCH_FLAG), 1)}


def layout_key(args: Mapping[str, Any], gpus: int) -> tuple[int, ...]:
    d = degrees(args, gpus)
    return tuple(d[k] for k in ("tp", "pp", "cp", "ep", "etp", "vp", "mbs"))


def _layout_text(key: tuple[int, ...]) -> str:
    tp, pp, cp, ep, etp, vp, mbs = key
    return f"TP{tp}/PP{pp}/CP{cp}/EP{ep}/ETP{etp}/VP{vp}/MBS{mbs}"


def memory_savings(args: Mapping[str, Any]) -> tuple[int, int]:
    """(recompute rank: none 0 < selective 1 < full 2, offloads on)."""
    gran = args.get("--recompute-granularity")
    rank = RECOMPUTE_RANK.get(str(gran) if gran not in (None, False) else None, 1)
    if rank == 0 and args.get("--recompute-activations") not in (None, False):
        rank = 1
    offload = sum(1 for f in OFFLOAD_FLAGS if args.get(f) not in (None, False))
    return rank, offload


# ----------------------------------------------------------------------------------- levers


@functools.lru_cache(maxsize=4)
def _catalog(framework: str) -> tuple[dict[str, frozenset[str]], dict[str, frozenset[str]]]:
    """(flag -> lever ids, lever id -> coupled lever ids) for one framework family."""
    from attune.knowledge.catalog import load_catalog

    cat = load_catalog()
    family = "tinygpt" if framework == "tinygpt" else "megatron"
    flags: dict[str, set[str]] = {}
    coupled: dict[str, set[str]] = {}
    for lv in cat.levers:
        if family not in lv.frameworks:
            continue
        for f in lv.flags:
            flags.setdefault(f.name, set()).add(lv.id)
        for c in lv.couplings:
            coupled.setdefault(lv.id, set()).add(c.lever)
            coupled.setdefault(c.lever, set()).add(lv.id)
    for a in LAYOUT_LEVERS:
        for b in MEMORY_LEVERS:
            coupled.setdefault(a, set()).add(b)
            coupled.setdefault(b, set()).add(a)
    return ({k: frozenset(v) for k, v in flags.items()}, {k: frozenset(v) for k, v in coupled.items()})


def _framework(spec: CampaignSpec) -> str:
    return "tinygpt" if spec.model.startswith("tinygpt") else "megatron"


def levers_of(spec: CampaignSpec, name: str) -> frozenset[str]:
    """The catalog levers a flag or variable belongs to ({name} when the catalog does not list it)."""
    try:
        flags, _ = _catalog(_framework(spec))
    except Exception:  # no catalog: every flag is its own lever
        return frozenset({name})
    return flags.get(name, frozenset({name}))


def _coupled(spec: CampaignSpec) -> dict[str, frozenset[str]]:
    try:
        return _catalog(_framework(spec))[1]
    except Exception:
        return {}


def changed_names(a_args: Mapping[str, Any], a_env: Mapping[str, str], b_args: Mapping[str, Any],
                  b_env: Mapping[str, str]) -> list[str]:
    """Flags and variables whose value differs between two recipes."""
    out = [k for k in sorted(set(a_args) | set(b_args)) if norm_value(a_args.get(k)) != norm_value(b_args.get(k))]
    out += [k for k in sorted(set(a_env) | set(b_env)) if a_env.get(k) != b_env.get(k)]
    return out


def coupled_groups(spec: CampaignSpec, names: Iterable[str]) -> list[list[str]]:
    """The changed names split into groups connected through shared or coupled levers."""
    names = list(names)
    coupled = _coupled(spec)
    lev = {n: levers_of(spec, n) for n in names}

    def linked(a: str, b: str) -> bool:
        la, lb = lev[a], lev[b]
        if la & lb:
            return True
        if la == {a} and lb == {b}:
            return True  # flags the catalog does not know cannot be told apart: they count as one set
        return any(coupled.get(x, frozenset()) & lb for x in la)

    groups: list[list[str]] = []
    seen: set[str] = set()
    for n in names:
        if n in seen:
            continue
        group, todo = [], [n]
        seen.add(n)
        while todo:
            cur = todo.pop()
            group.append(cur)
            for m in names:
                if m not in seen and linked(cur, m):
                    seen.add(m)
                    todo.append(m)
        groups.append(sorted(group))
    return groups


def _forced_followers(spec: CampaignSpec, leader: Mapping[str, Any], args: Mapping[str, Any],
                      names: list[str]) -> set[str]:
    """Changed flags the framework's argument rules force (`attune.knowledge.coherence`): undoing the
    change alone would make the recipe incoherent, so they move with the lever, not as a lever."""
    from attune.knowledge.coherence import FOLLOWER_FLAGS, cohere

    layers = as_int(spec.baseline.args.get("--num-layers"), 0) or None
    out: set[str] = set()
    for n in names:
        if n not in FOLLOWER_FLAGS:
            continue
        undone = {k: v for k, v in args.items() if k != n}
        if leader.get(n) not in (None, False):
            undone[n] = leader[n]
        got = cohere(undone, layers=layers, before=leader).get(n)
        want = args.get(n)
        if (got in (None, False)) == (want in (None, False)) and str(got) == str(want) or (
                got in (None, False) and want in (None, False)):
            out.add(n)
    return out


def check_one_lever(spec: CampaignSpec, state: CampaignState, args: Mapping[str, Any],
                    env: Mapping[str, str]) -> RuleRefusal | None:
    """Rule 2: the candidate changes one lever or one coupled set relative to the leader."""
    if not enforced(state):
        return None
    l_args, l_env = leader_recipe(spec, state)
    profile = set(spec.control.profile_args)
    names = [n for n in changed_names(l_args, l_env, args, env) if n not in profile]
    forced = _forced_followers(spec, l_args, args, names)
    groups = coupled_groups(spec, [n for n in names if n not in forced] or names)
    if len(groups) <= 1:
        return None
    items = [" + ".join(g) + f" ({', '.join(sorted(set().union(*(levers_of(spec, n) for n in g))))})"
             for g in groups]
    return RuleRefusal("rule2_one_lever", (
        f"search rule 2: a candidate changes one lever or one coupled set relative to the leader "
        f"({state.leader_run_id}); this one changes {len(groups)} unrelated sets (the catalog's couplings "
        "decide what moves together): launch them one at a time"), items)


# ----------------------------------------------------------------------------------- the stop


def _search_runs(state: CampaignState) -> list[RunState]:
    return [r for r in state.runs.values() if r.kind == RunKind.SEARCH and r.status == "finished"
            and r.outcome not in (RunOutcome.CANCELLED, RunOutcome.INFRASTRUCTURE)]


def _launched_names(spec: CampaignSpec, state: CampaignState) -> dict[str, set[str]]:
    """lever or flag name -> ids of finished search runs that changed it (relative to the baseline)."""
    out: dict[str, set[str]] = {}
    for r in _search_runs(state):
        names = set(r.changes.get("args") or {}) | set(r.changes.get("env") or {})
        keys = set(names)
        for n in names:
            keys |= levers_of(spec, n)
        if r.lever:
            keys.add(r.lever)
        for k in keys:
            out.setdefault(k, set()).add(r.run_id)
    return out


def _flags_for(spec: CampaignSpec, state: CampaignState, lever: str) -> set[str]:
    """The flags a lever name stands for: itself when it is a flag, else the catalog's flags, and the flags
    changed by the runs launched under that lever name."""
    if lever.startswith("--") or lever in spec.baseline.env or lever.isupper():
        return {lever}
    out: set[str] = set()
    try:
        flags, _ = _catalog(_framework(spec))
        out = {f for f, ids in flags.items() if lever in ids}
    except Exception:
        pass
    base_args, base_env = recipe(spec, None)
    for r in _search_runs(state):
        if r.lever == lever:
            a, e = recipe(spec, r.changes)
            out |= set(changed_names(base_args, base_env, a, e))
    return out or {lever}


def _at_limit(spec: CampaignSpec, flag: str, value: Any, feasible: dict[str, list[int]] | None) -> bool:
    if value is None or isinstance(value, bool) or value is False:
        return True
    space = spec.search_space.get(flag) if spec.search_space else None
    if space:
        ends = {str(space[0]), str(space[-1])}
        if str(value) in ends:
            return True
    dim = next((d for d, f in LAYOUT_FLAGS.items() if f == flag), None)
    if feasible and dim in feasible and feasible[dim]:
        v = as_int(value, -1)
        return v in (min(feasible[dim]), max(feasible[dim]))
    return False


@functools.lru_cache(maxsize=16)
def _feasible_degrees(model: str, gpus: int, gpn: int, seq: int | None, gbs: int | None,
                      mbs: int) -> dict[str, list[int]] | None:
    """Each degree's feasible values per the layout enumerator (None: the enumerator does not know the model)."""
    from attune.knowledge.layouts import LayoutError, LayoutOptions, enumerate_layouts, find_model

    try:
        m = find_model(model)
        reports = enumerate_layouts(m, LayoutOptions(gpus=gpus, gpus_per_node=gpn, seq_length=seq,
                                                     global_batch=gbs, micro_batch=mbs,
                                                     allowed={"vp": {1}}))
    except (LayoutError, KeyError, ValueError):
        return None
    vals: dict[str, set[int]] = {d: set() for d in DIMENSIONS}
    for r in reports:
        lay = r.layout
        vals["tp"].add(lay.tp)
        vals["pp"].add(lay.pp)
        vals["cp"].add(lay.cp)
        vals["dp"].add(lay.dp)
        vals["ep"].add(lay.ep or 1)
    return {k: sorted(v) for k, v in vals.items()}


def feasible_degrees(spec: CampaignSpec) -> dict[str, list[int]] | None:
    mbs = as_int(spec.baseline.args.get("--micro-batch-size"), 1)
    return _feasible_degrees(spec.model, spec.cluster.gpus, spec.cluster.gpus_per_node, spec.workload.seq_length,
                             spec.workload.global_batch, mbs)


def _estimate_step_s(spec: CampaignSpec, args: Mapping[str, Any], env: Mapping[str, str]) -> float | None:
    """The analytic step-time estimate (memory not considered); None where it does not apply."""
    try:
        from attune.sim.api import resolve_accelerator, resolve_model
        from attune.sim.recipe import build_recipe
        from attune.sim.steptime import step_time

        model = resolve_model(spec.model)
        acc = resolve_accelerator(spec.cluster.accelerator)
        r = build_recipe(model, acc, spec.cluster.gpus, dict(args), dict(env), spec.cluster.gpus_per_node)
        s = float(step_time(r).seconds)
        return s if math.isfinite(s) and s > 0 else None
    except Exception:
        return None


@dataclass
class _StopContext:
    """What the stop rules read: the campaign, its finished search runs and the leader's recipe."""

    spec: CampaignSpec
    state: CampaignState
    levers_tested: list[str]
    not_run: list[str]
    feasible: dict[str, list[int]] | None
    leader_args: dict[str, Any]
    leader_env: dict[str, str]
    runs: list[RunState]
    full: dict[str, tuple[dict[str, Any], dict[str, str]]]  # run id -> its full recipe

    @property
    def gpus(self) -> int:
        return self.spec.cluster.gpus


def _rule_levers_not_run(c: _StopContext) -> RuleRefusal | None:
    if not c.not_run:
        return None
    return RuleRefusal("levers_not_run", (
        "levers_tested names levers that no finished search run changed: list only levers the campaign "
        "measured"), c.not_run)


def _lever_values(c: _StopContext, flags: set[str]) -> tuple[set[tuple[str, str]], bool]:
    """The (flag, value) pairs the search runs gave a lever's flags, and whether one was at its limit."""
    spec = c.spec
    values: set[tuple[str, str]] = set()
    at_limit = False
    for r in c.runs:
        a, e = c.full[r.run_id]
        for f in flags:
            base = spec.baseline.args.get(f, spec.baseline.env.get(f))
            v = a.get(f, e.get(f))
            if str(v) != str(base):
                values.add((f, str(v)))
                at_limit = at_limit or _at_limit(spec, f, v, c.feasible)
    return values, at_limit


def _rule4_lever_values(c: _StopContext) -> RuleRefusal | None:
    """Rule 4, first half: a lever named as tested (and not part of the leader) saw two values or its limit."""
    leader_names = set(changed_names(*recipe(c.spec, None), c.leader_args, c.leader_env))
    few: list[str] = []
    for lv in c.levers_tested:
        if lv in c.not_run:
            continue
        flags = _flags_for(c.spec, c.state, lv)
        if flags & leader_names:
            continue
        values, at_limit = _lever_values(c, flags)
        if len(values) < 2 and not at_limit:
            tried = ", ".join(f"{f}={v}" for f, v in sorted(values)) or "no value"
            few.append(f"{lv} (tried {tried})")
    if not few:
        return None
    return RuleRefusal("rule4_lever_values", (
        "search rule 4: a lever is ruled out only after two values or its feasible limit"), few)


def _rule4_layout_unprobed(c: _StopContext) -> RuleRefusal | None:
    """Rule 4, second half: each of TP, PP, EP, CP and DP probed, or shown infeasible."""
    if c.feasible is None:
        return None
    feasible = c.feasible
    base_deg = degrees(c.spec.baseline.args, c.gpus)
    probed = {d: False for d in DIMENSIONS}
    for r in c.runs:
        deg = degrees(c.full[r.run_id][0], c.gpus)
        for d in DIMENSIONS:
            probed[d] = probed[d] or deg[d] != base_deg[d]
    missing = [f"{d.upper()} (baseline {base_deg[d]}; feasible {feasible[d]})" for d in DIMENSIONS
               if not probed[d] and any(v != base_deg[d] for v in feasible[d])]
    if not missing:
        return None
    return RuleRefusal("rule4_layout_unprobed", (
        "search rule 4: the topology is exhausted only after each of TP, PP, EP, CP and DP was probed "
        "(a degree the layout enumerator shows infeasible to move is exempt)"), missing)


def _more_savings(save: tuple[int, int], other: tuple[int, int]) -> bool:
    return other[0] > save[0] or other[1] > save[1]


def _retried_with_more_savings(c: _StopContext, r: RunState, key: tuple[int, ...], save: tuple[int, int]) -> bool:
    """A run of the same layout with more savings, before or after, answers the question. The calibrated
    baseline and the leader are measured recipes too: when the retry (the layout with its savings added
    back) is one of them, it was measured already and need not be launched again."""
    measured = [recipe(c.spec, None)[0]] if c.state.calibration is not None else []
    measured.append(c.leader_args)
    if any(layout_key(m, c.gpus) == key and _more_savings(save, memory_savings(m)) for m in measured):
        return True
    for o in c.runs:
        if o.run_id == r.run_id:
            continue
        oa = c.full[o.run_id][0]
        if layout_key(oa, c.gpus) != key:
            continue
        if o.outcome == RunOutcome.OK or _more_savings(save, memory_savings(oa)):
            return True
    return False


def _rule5_oom_not_retried(c: _StopContext) -> RuleRefusal | None:
    """Rule 5: an out-of-memory layout the estimate ranks faster, retried with more memory savings."""
    leader_s = _estimate_step_s(c.spec, c.leader_args, c.leader_env)
    leader_save = memory_savings(c.leader_args)
    open5: list[str] = []
    runs5: list[dict[str, str]] = []
    for r in c.runs:
        if r.outcome != RunOutcome.OOM:
            continue
        a, e = c.full[r.run_id]
        key = layout_key(a, c.gpus)
        save = memory_savings(a)
        if save[0] >= 2 and save[1] >= leader_save[1]:
            continue  # nothing left to add back: full recomputation, and every offload the leader uses
        est = _estimate_step_s(c.spec, a, e)
        if est is not None and leader_s is not None and est >= leader_s:
            continue  # the estimate ranks it no faster than the leader
        if not _retried_with_more_savings(c, r, key, save):
            why = "the estimate ranks it faster than the leader" if est is not None and leader_s is not None \
                else "no estimate says it is slower"
            open5.append(f"{r.run_id} {_layout_text(key)} ({why}; retry it with full recomputation or offload)")
            runs5.append({"run_id": r.run_id})
    if not open5:
        return None
    return RuleRefusal("rule5_oom_not_retried", (
        "search rule 5: a layout that ran out of memory is ruled out only after a retry with the memory "
        "savings added back"), open5, runs5)


def _rule6_winners_not_retested(c: _StopContext) -> RuleRefusal | None:
    """Rule 6: flags that won on an earlier layout, re-tested on the final layout."""
    spec, state, gpus, full, runs = c.spec, c.state, c.gpus, c.full, c.runs
    final_key = layout_key(c.leader_args, gpus)
    layout_flags = set(LAYOUT_FLAGS.values()) | {
        "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers", "--sequence-parallel"}
    open6: list[str] = []
    values6: dict[tuple[str, str], None] = {}
    winners = [r for r in runs if r.verdict == Verdict.LEADER and r.run_id != state.leader_run_id]
    for w in winners:
        wa, we = full[w.run_id]
        if layout_key(wa, gpus) == final_key:
            continue
        base_args, base_env = (recipe(spec, state.runs[w.base_run_id].changes)
                               if w.base_run_id in state.runs else recipe(spec, None))
        for name in changed_names(base_args, base_env, wa, we):
            if name in layout_flags:
                continue
            value = wa.get(name, we.get(name))
            tested = any(layout_key(full[o.run_id][0], gpus) == final_key
                         and str(full[o.run_id][0].get(name, full[o.run_id][1].get(name))) == str(value)
                         for o in runs)
            if not tested:
                open6.append(f"{name}={value} (won in {w.run_id} on {_layout_text(layout_key(wa, gpus))})")
                values6[(name, str(value))] = None
    if not open6:
        return None
    return RuleRefusal("rule6_winners_not_retested", (
        f"search rule 6: flags that won on earlier layouts must be re-tested on the final layout "
        f"({_layout_text(final_key)})"), sorted(set(open6)), [{"name": n, "value": v} for n, v in values6])


# The stop rules after calibration, in the order their refusals are listed.
STOP_RULES = (_rule_levers_not_run, _rule4_lever_values, _rule4_layout_unprobed, _rule5_oom_not_retried,
              _rule6_winners_not_retested)


def stop_refusals(spec: CampaignSpec, state: CampaignState, levers_tested: list[str]) -> list[RuleRefusal]:
    """Every open stop rule (empty: the stop may be recorded)."""
    if not enforced(state):
        return []
    if state.calibration is None:
        return [RuleRefusal("calibration_incomplete", (
            "the baseline's calibration is not complete, so no measurement can be judged yet: finish the "
            "calibration runs first"), [f"{len(state.calibration_values)}/{state.calibration_runs_required} "
                                        "good calibration runs"])]
    launched = _launched_names(spec, state)
    not_run = [lv for lv in levers_tested if lv not in launched]
    feasible = feasible_degrees(spec)
    l_args, l_env = leader_recipe(spec, state)
    runs = _search_runs(state)
    full = {r.run_id: recipe(spec, r.changes) for r in runs}
    c = _StopContext(spec, state, levers_tested, not_run, feasible, l_args, l_env, runs, full)
    return [refusal for rule in STOP_RULES if (refusal := rule(c)) is not None]
