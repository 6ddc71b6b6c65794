"""A deterministic, diagnosis-driven tuner: the skill's search rules, applied mechanically.

It is the fallback where no agent is available. From the leader, it changes one lever at a time
(rule 2), trying a lever's values nearest the leader's first; a lever is ruled out only after two
of its values fail to beat the leader, or when its values run out (rule 4); a parallel degree moves
with the degrees it forces (the factory's layout coupler: the nearest feasible layout). A candidate
that runs out of memory is retried once with full recomputation added (rule 5). When a parallel
degree wins, every lever is probed again from the new layout at once; after a pass that improved
the leader, the levers that won before are re-tested on it first (rule 6). A layout is its placement degrees (TP, PP,
CP, EP, expert TP): virtual stages schedule the same placement, so their win keeps what was learned. It stops, with evidence, when
a full pass over the levers finds nothing that beats the leader.

Spending launches (issue 23): the memory estimate is anchored by measurement, the largest estimated peak of
a recipe that ran against the smallest of one that ran out of memory (`_fit`), which orders values and picks
the coupled moves that pay for an out-of-memory move with more sharding. Once a run has run out of memory,
a move the anchored estimate says does not fit is measured with full recomputation first (rule 5's retry
before its out-of-memory run, `_memory_first`), the move as it is only where that measurement leaves it room
to win; values beyond one that ran out of memory with every saving, which the estimate says need more
memory still, are not launched (`_beyond_oom`); and a value that lost clearly (below the early abort's
clear-loss line) is not probed again from a new layout, nor a value past two clear losses in one direction
the farther of which lost more (`_lost_clearly`).

Node-local groups (`NODE_GROUPS`: TP x CP, expert TP x EP; the catalog keeps them inside a node): a placement
move that lost after it pushed such a group across nodes is measured again at once as a re-balanced move, the
group's other degree moved the other way by the same factor so that the data-parallel size stays
(`_rebalance`); and where the leader's group already crosses nodes, the lever's value that brings it inside
one is measured first (`_into_node_first`), also when it lies behind a win measured on an earlier layout;
a re-balanced move that wins keeps its partner degree's direction too. All need the cluster's GPUs per node
(`node_gpus`).

Levers are taken in the order of `priority` (the catalog's expected-gain order), else in the
order the campaign declares them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from attune.core.measure import PRUNER
from attune.core.recipe import DEGREE_FLAG_NAMES, DEGREE_FLAGS, Recipe, as_int
from attune.core.vocab import RunOutcome
from attune.tuners.base import ArgValue, Candidate, Outcome, Tuner, recipe_key
from attune.tuners.diagnosis import RECOMPUTE_SHARE_OF_COMPUTE

MEMORY_SAVERS: dict[str, ArgValue] = {"--recompute-granularity": "full", "--recompute-activations": True}
# The placement degrees: a layout is where ranks hold which shard. Virtual stages are the pipeline's
# schedule on the same placement, not a degree: a lesson learned on a layout holds across them, and a
# virtual-stage win does not re-probe every lever.
PLACEMENT_FLAGS = DEGREE_FLAG_NAMES - {"--num-virtual-stages-per-pipeline-rank"}
FULL_RECOMPUTE: dict[str, ArgValue] = {"--recompute-granularity": "full", "--recompute-method": "uniform",
                                       "--recompute-num-layers": 1}
# Outcomes that say nothing about the recipe (attune.core.vocab's infrastructure and cancelled).
NOT_THE_RECIPES = frozenset({RunOutcome.INFRASTRUCTURE, RunOutcome.CANCELLED})
# Coupled moves queued to pay for one out-of-memory move with more sharding (`_pay_for_memory`).
PAYERS = 2
# Re-balanced moves queued for one placement move that lost (`_rebalance`): the move with another placement
# degree moved the other way by the same factor, so the data-parallel size (and the batch geometry) stays.
REBALANCERS = 1
# The groups whose collectives run in every layer and belong inside a node (the catalog: keep TP inside a
# node, CP crossing nodes slows it, an EP group inside a node rides NVLink); Megatron orders ranks so that
# each group's ranks are consecutive, so a group fits a node when the product of its degrees does.
NODE_GROUPS: tuple[tuple[str, ...], ...] = (
    (DEGREE_FLAGS["tp"], DEGREE_FLAGS["cp"]),
    (DEGREE_FLAGS["etp"], DEGREE_FLAGS["ep"]),
)
# Full recomputation repeats each layer's forward pass: forward 1, backward 2, recompute 1, a quarter of
# the compute with it (`attune.tuners.diagnosis.RECOMPUTE_SHARE_OF_COMPUTE`, which also gives selective
# recomputation's share). Going back from full to a lighter recomputation removes at most the difference of
# the two shares from the step, so it speeds the step up by at most 1 / (1 - difference).
FULL_RECOMPUTE_MAX_SPEEDUP = 1.0 / (1.0 - RECOMPUTE_SHARE_OF_COMPUTE["full"])


def recompute_max_speedup(granularity: ArgValue) -> float:
    """The most a step can gain going from full recomputation back to `granularity` (None: none)."""
    lighter = 0.0 if granularity in (None, False) else RECOMPUTE_SHARE_OF_COMPUTE.get(str(granularity), 0.0)
    saved = RECOMPUTE_SHARE_OF_COMPUTE["full"] - lighter
    return 1.0 / (1.0 - saved) if 0.0 < saved < 1.0 else 1.0
Coupler = Callable[[dict[str, ArgValue], str, ArgValue], "dict[str, ArgValue] | None"]
# The framework's argument rules over a recipe's full flags (`attune.knowledge.coherence.cohere`):
# (the candidate's flags, the flags it moved from) -> the coherent flags.
Coherer = Callable[[dict[str, ArgValue], dict[str, ArgValue]], dict[str, ArgValue]]
# A candidate's full flags -> whether the memory estimate says it fits (None: no estimate). It orders
# candidates (a likely out-of-memory one later) and never rules one out alone.
MemoryFit = Callable[[dict[str, ArgValue]], "bool | None"]
# A candidate's full flags -> the memory estimate's peak bytes per GPU (None: no estimate). Compared with the
# peaks of recipes measured to run and to run out of memory, it says whether a recipe fits where the
# estimate's absolute figure runs high or low (the estimate's error is mostly shared by nearby layouts).
MemoryPeak = Callable[[dict[str, ArgValue]], "float | None"]


def _recompute_fixup(full: dict[str, ArgValue], baseline: dict[str, ArgValue]) -> dict[str, ArgValue]:
    """A granularity moved away from the baseline's: full recomputation needs a method and a layer count
    (Megatron) and takes no module list (`--recompute-modules` is selective recomputation's: Megatron
    refuses it with full); other granularities take neither method nor count. The baseline's own
    granularity is left as it is."""
    if full.get("--recompute-granularity") == baseline.get("--recompute-granularity"):
        return full
    out = dict(full)
    if out.get("--recompute-granularity") == "full":
        if out.get("--recompute-method") in (None, False):
            out["--recompute-method"] = "uniform"
        if out.get("--recompute-num-layers") in (None, False):
            out["--recompute-num-layers"] = 1
        if "--recompute-modules" in out:
            out["--recompute-modules"] = None
    elif "--recompute-granularity" in out:
        out["--recompute-method"] = None
        out["--recompute-num-layers"] = None
    return out


_MISSING = object()


def _paid_token(tok: dict[str, Any]) -> dict[str, Any]:
    """A coupled move's token from the out-of-memory move's: not the move behind a memory-first retry itself (it
    is a recipe of its own, which rule 5 retries with full recomputation when it runs out of memory)."""
    return {k: v for k, v in tok.items() if k not in ("after_retry", "plain")}


def _space_value(values: list[ArgValue], degree: int) -> Any:
    """The space's own spelling of a degree (1 may be spelled unset), or _MISSING."""
    for v in values:
        if as_int(v, 1) == degree:
            return v
    return _MISSING


class HeuristicTuner(Tuner):
    name = "heuristic"

    def __init__(
        self,
        space: dict[str, list[ArgValue]],
        baseline: dict[str, ArgValue],
        seed: int = 0,
        priority: list[str] | None = None,
        hypotheses: dict[str, str] | None = None,
        max_passes: int = 3,
        couple: Coupler | None = None,
        extra_baseline: dict[str, ArgValue] | None = None,
        memory_retry: bool | None = None,
        base: Recipe | None = None,
        cohere: Coherer | None = None,
        fits: MemoryFit | None = None,
        attacks: dict[str, list[str]] | None = None,
        gain_class: dict[str, int] | None = None,
        peak: MemoryPeak | None = None,
        node_gpus: int | None = None,
    ) -> None:
        super().__init__(space, baseline, seed, base)
        # Flags outside the space that a coupled move may set (the pipeline split, recompute details).
        self.extra = {k: v for k, v in (extra_baseline or {}).items() if k not in space}
        self.baseline = {**self.extra, **baseline}
        self.keys = list(space) + list(self.extra)
        self.couple = couple
        self.cohere = cohere
        self.fits = fits
        self.peak = peak
        self.node_gpus = node_gpus  # GPUs per node: where the node-local groups must fit (`_rebalance`)
        # The memory estimate anchored by measurement: the largest peak of a recipe that ran (the baseline
        # did: it calibrated) and the smallest of one that ran out of memory.
        self.ran_peak: float | None = self._peak_of(self.baseline)
        self.oom_peak: float | None = None
        # What it learned about a lever on a layout (the leader's parallel degrees): ruled out there, why.
        self.learned: dict[tuple[str, str], str] = {}
        self.win_dir: dict[str, tuple[ArgValue, ArgValue]] = {}  # lever -> (from, to) of its last win
        self.win_layout: dict[str, str] = {}  # lever -> the layout it won on
        self.retest_done = False
        # (lever, the value that won, the layout it won on), every win and every lever a winner changed with
        # its own (rule 6 re-tests those won on another layout whose value the final leader does not carry)
        self.wins_seen: list[tuple[str, ArgValue, str]] = []
        self.retest_values: dict[str, list[ArgValue]] = {}
        self.must_measure: set[tuple[str, str]] = set()
        # (layout, lever, value) of every measured run: what rule 6 need not measure again
        self.measured_at: set[tuple[str, str, str]] = set()
        self.measured: list[str] = []  # levers with at least one measured candidate
        self.moved: dict[str, set[ArgValue]] = {}  # parallel degree -> the values launched candidates ran with
        self.probed: set[str] = set()  # degrees rule 4's last check has probed
        self.restart = False  # a layout lever won: probe every lever again from the new leader
        # Rule 5's retry adds full recomputation (a Megatron memory saving) even where the space has no
        # recompute lever: the retry is part of the rule, not a search choice.
        self.memory_retry = "--recompute-granularity" in space if memory_retry is None else memory_retry
        order = [k for k in (priority or []) if k in space] + [k for k in space if k not in (priority or [])]
        self.order = order
        self.hypotheses = hypotheses or {}
        self.attacks = dict(attacks or {})  # lever -> the exposed costs it attacks (the catalog's)
        # lever -> the catalog's expected-gain class (rank of `rough_size`): a diagnosis reorders only inside one
        self.gain_class = dict(gain_class) if gain_class is not None else None
        self.diagnosis: dict[str, Any] | None = None  # the profile read before the search, and the order it set
        self.leader: dict[str, ArgValue] = {}  # changes of the current leader relative to the baseline
        self.max_passes = max_passes
        self.passes = 0
        self.won: list[str] = []  # levers that produced a leader, in order
        self.ruled_out: dict[str, str] = {}
        self.queue: deque[tuple[str, ArgValue]] = deque()
        self.failures: dict[str, int] = {}  # per lever: values that did not beat the leader this pass
        self.current_lever: str | None = None
        self.improved_this_pass = False
        self.pending_retry: deque[Candidate] = deque()
        # Coupled moves that pay for an out-of-memory move (`_pay_for_memory`), with the leader's layout then.
        self.deferred: deque[tuple[str, Candidate]] = deque()
        # (layout, lever) -> (the value that ran out of memory with every memory saving it could take, its
        # estimated peak): values beyond it need more memory still (`_beyond_oom`).
        self.oom_at: dict[tuple[str, str], tuple[ArgValue, float]] = {}
        # (layout, lever) -> the lever's values that ran out of memory from that layout (`_spare_one_more`)
        self.oom_values: dict[tuple[str, str], set[str]] = {}
        # (layout, lever) pairs whose ruling-out already spared one more value, or whose degree 1 was already
        # paid for (`_pay_for_one`): each at most once per layout
        self.spared: set[tuple[str, str]] = set()
        self.one_paid: set[tuple[str, str]] = set()
        # run id -> (lever, changes) of every candidate that ran: what a refused stop names (`repair`)
        self.run_changes: dict[str, tuple[str, dict[str, ArgValue]]] = {}
        # lever -> {value: the layout it lost clearly on}: below the early abort's clear-loss line (a quarter
        # under the leader, many times any band), a lesson kept across layouts (`_lost_clearly`).
        self.clear_losses: dict[str, dict[str, str]] = {}
        # lever -> [(value, its throughput over the leader's)] of those clear losses, for the trend
        self.clear_loss_trend: dict[str, list[tuple[ArgValue, float]]] = {}
        # lever -> the values other than the baseline's its launched runs gave it (rule 4 asks for two)
        self.values_run: dict[str, set[str]] = {}
        self.tried.add(self.key({}))
        self._lever_iter: deque[str] = deque()
        self._start_pass()

    # ---- bookkeeping -------------------------------------------------------------------
    def _value(self, lever: str) -> ArgValue:
        return self.leader.get(lever, self.baseline.get(lever))

    def _start_pass(self) -> None:
        self.passes += 1
        self.improved_this_pass = False
        self._lever_iter = deque(self.order)

    def _layout(self, changes: dict[str, ArgValue] | None = None) -> str:
        """The layout a recipe runs on (its parallel degrees): what a lever's lesson is kept against."""
        full = self._full(self.leader if changes is None else changes)
        return recipe_key({f: (1 if full.get(f) in (None, False) else full.get(f)) for f in sorted(PLACEMENT_FLAGS)})

    def _values_to_try(self, lever: str) -> list[ArgValue]:
        values = list(self.space[lever])
        cur = self._value(lever)
        if cur is None and lever in DEGREE_FLAG_NAMES:
            cur = 1  # an unset parallel degree is 1: trying 1 would measure the leader again
        if cur in values:
            i = values.index(cur)
            # Neighbours first, alternating outward: i+1, i-1, i+2, i-2, ...
            out: list[ArgValue] = []
            for d in range(1, len(values)):
                for j in (i + d, i - d):
                    if 0 <= j < len(values):
                        out.append(values[j])
        else:
            out = [v for v in values if v != cur]
        won = self.win_dir.get(lever)
        if won is not None and won[1] == cur:
            # The lever won moving from won[0] to cur: going back is what it already measured as slower. Not
            # for a value that brings a crossing node-local group inside a node once the layout has moved on
            # since that win: the win was measured with the group elsewhere.
            moved_on = self.win_layout.get(lever) not in (None, self._layout())
            out = [v for v in out if self._beyond(lever, v, won[1], won[0])
                   or (moved_on and self._brings_inside(lever, v))]
        return self._into_node_first(lever, self._memory_order(lever, out))

    def _brings_inside(self, lever: str, value: ArgValue) -> bool:
        """Whether moving `lever` to `value` from the leader brings a node-local group that crosses nodes inside
        one, at the move's nearest feasible layout (the group may hold the lever, or follow it: a deeper
        pipeline leaves fewer data-parallel ranks for the experts), and pushes no other group across."""
        if not self.node_gpus or lever not in PLACEMENT_FLAGS:
            return False
        leader = self._full(self.leader)
        crossing = self._node_groups_crossing(leader)
        if not crossing:
            return False
        full: dict[str, ArgValue] | None = {**leader, lever: value}
        if self.couple is not None and full is not None:
            full = self.couple(full, lever, value)
        if full is None:
            return False
        after = self._node_groups_crossing(full)
        return len(after) < len(crossing) and all(g in crossing for g in after)

    def _into_node_first(self, lever: str, values: list[ArgValue]) -> list[ArgValue]:
        """Values that bring a node-local group the leader has across nodes back inside one (`NODE_GROUPS`:
        the catalog's "shrink EP to fit a node", "keep TP inside a node") go first, in their order: a lever is
        not ruled out on two values that both leave the group across nodes."""
        return sorted(values, key=lambda v: 0 if self._brings_inside(lever, v) else 1)

    def _memory_order(self, lever: str, values: list[ArgValue]) -> list[ArgValue]:
        """Among values equally near the leader's, one the memory estimate says will not fit goes second
        (never dropped, never pushed past a nearer value: the estimate runs high on some models, and
        rule 5 retries an out-of-memory layout with its memory savings anyway)."""
        if (self.fits is None and self.peak is None) or len(values) < 2:
            return values
        space = list(self.space[lever])
        cur = self._value(lever)

        def rank(v: ArgValue) -> tuple[int, int]:
            dist = abs(space.index(v) - space.index(cur)) if cur in space and v in space else 0
            full = {**self._full(self.leader), lever: v}
            if self.couple is not None:
                full = self.couple(full, lever, v) or full
            return dist, 1 if self._fit(full) is False else 0

        return sorted(values, key=rank)

    @staticmethod
    def _estimate(fn: Callable[[dict[str, ArgValue]], Any] | None, full: dict[str, ArgValue]) -> Any:
        """`fn(full)` for a memory estimate, None where there is none or it cannot be made (it says nothing)."""
        if fn is None:
            return None
        try:
            return fn(full)
        except Exception:  # an estimate that cannot be made says nothing
            return None

    def _peak_of(self, full: dict[str, ArgValue]) -> float | None:
        return self._estimate(self.peak, full)

    def _fit(self, full: dict[str, ArgValue]) -> bool | None:
        """Whether the memory estimate says the recipe fits, anchored by measurement: its peak against the
        largest peak of a recipe that ran and the smallest of one that ran out of memory, nearer the first
        fits, nearer the second does not (no larger than one that ran fits, no smaller than one that ran out
        of memory does not, where only one is known); without anchors, the estimate's own verdict. None: no
        estimate. It orders candidates, never rules one out."""
        p = self._peak_of(full)
        ran, oom = self.ran_peak, self.oom_peak
        if p is not None and ran is not None and oom is not None and ran < oom:
            return p < (ran + oom) / 2
        if p is not None and ran is not None and p <= ran:
            return True
        if p is not None and oom is not None and p >= oom:
            return False
        return self._estimate(self.fits, full)

    def _fit_measured(self, full: dict[str, ArgValue]) -> bool | None:
        """`_fit` where a measured out-of-memory run anchors the estimate, else None (the estimate's figure
        alone decides nothing here)."""
        return None if self.oom_peak is None else self._fit(full)

    def _memory_first(self, cand: Candidate) -> Candidate:
        """Rule 5's retry before the out-of-memory run, not after: a move the estimate, anchored by a run
        that ran out of memory (`_fit_measured`), says does not fit is measured first with full
        recomputation added back. The move as it is follows only where that measurement leaves it room to
        beat the leader (`recompute_max_speedup`, `_after_memory_first`): the estimate orders the two, the
        retry's measurement decides whether the second runs."""
        tok: dict[str, Any] = dict(cand.token or {})
        full = self._full(cand.changes)
        if not self.memory_retry or tok.get("retried") or full.get("--recompute-granularity") == "full":
            return cand
        if self._fit_measured(full) is not False:
            return cand
        changes = self.diff(self._coherent(self._full({**cand.changes, **FULL_RECOMPUTE}), full))
        if self.key(changes) in self.tried:
            return cand
        self.tried.add(self.key(changes))
        return Candidate(
            changes=changes, lever=cand.lever,
            hypothesis=(f"{cand.hypothesis}; memory first: the estimate, anchored by a run that ran out of memory, "
                        "says it does not fit as it is, so it is measured with full recomputation added back first"),
            token={**tok, "retried": True, "oom_changes": dict(cand.changes), "plain": cand})

    def _after_memory_first(self, tok: dict[str, Any], outcome: Outcome) -> bool:
        """The move behind a memory-first retry (`_memory_first`) runs next where the retry ran, did not
        lead, and its measurement leaves room to beat the leader; a retry out of memory says the move is too
        (it saves less). True: it is queued."""
        plain = tok.get("plain")
        if not isinstance(plain, Candidate) or outcome.outcome in (RunOutcome.OOM, RunOutcome.REFUSED):
            return False
        if outcome.promoted or not self._may_pay(outcome, self._full(plain.changes).get("--recompute-granularity")):
            # A retry that leads is the leader now: less recomputation is a move from it (the recompute
            # lever's, where the space has one), the anchored estimate says it does not fit.
            return False
        ptok = {**(plain.token or {}), "retried": True, "after_retry": True}
        self.pending_retry.appendleft(Candidate(
            changes=plain.changes, lever=plain.lever, expected_gain=plain.expected_gain, token=ptok,
            hypothesis=f"{plain.hypothesis}; its memory-first retry leaves it room to beat the leader"))
        return True

    def _beyond_oom(self, lever: str, value: ArgValue) -> bool:
        """A value further from the leader's than one that ran out of memory on this layout with every memory
        saving it could take (same direction), which the memory estimate says needs at least as much memory:
        a measurement and the estimate together say it cannot fit, so it is not launched (the memory it
        lacks is what the queued coupled moves pay for)."""
        rec = self.oom_at.get((self._layout(), lever))
        if rec is None or not self._beyond(lever, value, rec[0], self._value(lever)):
            return False
        full: dict[str, ArgValue] | None = {**self._full(self.leader), lever: value}
        if self.couple is not None and full is not None:
            full = self.couple(full, lever, value)
        p = None if full is None else self._peak_of(full)
        return p is not None and p >= rec[1]

    def _lost_clearly(self, lever: str, value: ArgValue) -> bool:
        """A value of the lever that lost clearly on an earlier layout (`clear_losses`) is not probed again
        from a new one: the leader it would have to beat is faster still."""
        where = self.clear_losses.get(lever, {}).get(str(value))
        return (where is not None and where != self._layout()) or self._past_a_worsening_loss(lever, value)

    def _past_a_worsening_loss(self, lever: str, value: ArgValue) -> bool:
        """A value beyond two clear losses of the lever in the same direction from the leader's value, the
        farther of which lost more: the measured trend says it loses more still."""
        cur = self._value(lever)
        values = list(self.space[lever])
        if cur not in values or value not in values:
            return False
        on_the_way = [(abs(values.index(v) - values.index(cur)), r) for v, r in self.clear_loss_trend.get(lever, [])
                      if v in values and v != cur and self._beyond(lever, value, v, cur)]
        on_the_way.sort()
        return len(on_the_way) >= 2 and on_the_way[-1][1] < on_the_way[-2][1] and on_the_way[-1][0] > on_the_way[-2][0]

    def _note_clear_loss(self, tok: dict[str, Any], outcome: Outcome, lever: str) -> None:
        tps, leader = outcome.tokens_per_s_per_gpu, outcome.extra.get("leader_tps")
        if outcome.promoted or tps is None or not isinstance(leader, (int, float)) or "value" not in tok:
            return
        if tok.get("retried") or tok.get("paid"):
            return  # a retry or a coupled move is not the lever's value as it is
        if tps < PRUNER.clear_fraction * leader:
            self.clear_losses.setdefault(lever, {}).setdefault(str(tok["value"]), self._layout())
            self.clear_loss_trend.setdefault(lever, []).append((tok["value"], tps / leader))

    def _anchor(self, full: dict[str, ArgValue], outcome: str) -> None:
        """A measured outcome anchors the memory estimate (`_fit`): it ran, or it ran out of memory."""
        if outcome in (RunOutcome.REFUSED, *NOT_THE_RECIPES):
            return
        p = self._peak_of(full)
        if p is None:
            return
        if outcome == RunOutcome.OOM:
            self.oom_peak = p if self.oom_peak is None else min(self.oom_peak, p)
        elif outcome in (RunOutcome.OK, RunOutcome.PRUNED):
            self.ran_peak = p if self.ran_peak is None else max(self.ran_peak, p)

    def _full(self, changes: dict[str, ArgValue]) -> dict[str, ArgValue]:
        return {**{k: self.baseline.get(k) for k in self.keys}, **changes}

    def _candidate(self, lever: str, value: ArgValue, why: str, origin: dict[str, ArgValue] | None = None) -> Candidate | None:
        full: dict[str, ArgValue] | None = {**self._full(self.leader if origin is None else origin), lever: value}
        if self.couple is not None and full is not None:
            full = self.couple(full, lever, value)  # rule 2: a degree moves with the degrees it forces
        if full is None:
            return None  # no feasible layout has this value
        full = self._coherent(full, self._full(self.leader if origin is None else origin))
        changes = self.diff(full)
        key = self.key(changes)
        if key in self.tried:
            return None
        self.tried.add(key)
        base = self.hypotheses.get(lever, f"{lever} is a bottleneck lever")
        return Candidate(
            changes=changes,
            lever=lever,
            hypothesis=f"{base}; try {lever}={value} from {self._value(lever)} ({why})",
            token={"lever": lever, "value": value},
        )

    def _coherent(self, full: dict[str, ArgValue], before: dict[str, ArgValue]) -> dict[str, ArgValue]:
        """Every co-dependent flag follows the lever that moved (the framework's argument rules)."""
        if self.cohere is not None:
            return self.cohere(full, before)
        if "--recompute-granularity" in self.space or self.memory_retry:
            return _recompute_fixup(full, self.baseline)
        return full

    def wants_profile(self) -> bool:
        """Diagnosis first: a profile of the baseline can reorder the levers when the catalog says what
        they attack."""
        return bool(self.attacks) and self.diagnosis is None

    def diagnose(self, shares: dict[str, float], source: str = "") -> str:
        """Diagnosis first: order the levers so that the one attacking the largest exposed cost of the
        profiled step goes first (`attune.tuners.diagnosis.order_by_diagnosis`). Only before the first
        candidate is asked; returns the reason recorded with the new order."""
        from attune.tuners.diagnosis import order_by_diagnosis

        if self.measured or self.current_lever is not None:
            return "the search has started: the lever order stays"
        order, why = order_by_diagnosis(self.order, self.attacks, shares, groups=self.gain_class)
        self.order = order
        self._lever_iter = deque(order)
        self.diagnosis = {"source": source, "order": list(order), "reason": why,
                          "shares": {k: round(v, 4) for k, v in shares.items() if v > 0}}
        return why

    # ---- the interface -----------------------------------------------------------------
    def ask(self) -> Candidate | None:
        if self.pending_retry:
            return self.pending_retry.popleft()
        while True:
            cand = self._next_from_queue()
            if cand is not None:
                return cand
            if self.current_lever is not None and self.current_lever not in self.ruled_out:
                self._rule_out(self.current_lever, "values exhausted without beating the leader")
            if self.restart:
                # The layout moved: its neighbours are new recipes (a lower TP may now fit a deeper
                # pipeline), so the levers are probed again from the new leader, in priority order, save
                # those already ruled out on this same layout (what was learned there is kept).
                self.restart = False
                here = self._layout()
                self.ruled_out = {lv: why for (lay, lv), why in self.learned.items() if lay == here}
                self._lever_iter = deque(self.order)
            if not self._lever_iter:
                paid = self._next_deferred()
                if paid is not None:
                    return paid
                if self.retest_done or not self.improved_this_pass or self.passes >= self.max_passes:
                    return self._rule4_probe()
                # Rule 6, and only what it asks: a lever that won on an earlier layout and whose winning
                # value the leader no longer carries is re-tested once on the final layout. Levers ruled
                # out on this layout are never run through again.
                self._retest_pass()
                continue
            lever = self._lever_iter.popleft()
            if lever in self.ruled_out:
                continue
            self.current_lever = lever
            self.failures[lever] = 0
            values = self.retest_values.pop(lever, None)
            self.queue = deque((lever, v) for v in (self._values_to_try(lever) if values is None else values))

    def _retest_pass(self) -> None:
        """Rule 6, and only what it asks: a value that won on an earlier layout (a lever's own win, or a lever
        its winner changed with it) and that the leader no longer carries is measured once on the final
        layout, unless a run there measured it already. Nothing else is run through again."""
        self._start_pass()
        self.retest_done = True
        here = self._layout()
        pending: dict[str, list[ArgValue]] = {}
        for lever, value, where in self.wins_seen:
            if (lever in DEGREE_FLAG_NAMES or where == here or str(self._value(lever)) == str(value)
                    or (here, lever, str(value)) in self.measured_at or value in pending.get(lever, [])):
                continue
            pending.setdefault(lever, []).append(value)
        self.retest_values = pending
        self.current_lever = None  # the last lever's lesson is recorded already
        self.must_measure = {(lever, str(v)) for lever, values in pending.items() for v in values}
        self._lever_iter = deque(pending)
        self.ruled_out = {lv: why for (lay, lv), why in self.learned.items() if lay == here and lv not in pending}

    def _next_from_queue(self) -> Candidate | None:
        """The current lever's next value worth a launch (None: its queue is through)."""
        while self.queue:
            lever, value = self.queue.popleft()
            if len(self.values_run.get(lever, ())) >= 2 and (lever, str(value)) not in self.must_measure and (
                    self._beyond_oom(lever, value) or self._lost_clearly(lever, value)):
                continue  # skipped only where rule 4's two values are measured already (never what rule 6 asks)
            cand = self._candidate(lever, value, "rule 4: two values before ruling out")
            if cand is not None:
                return self._memory_first(cand)
        return None

    def _next_deferred(self) -> Candidate | None:
        """The next coupled move made on the leader's current layout (stale ones are dropped)."""
        here = self._layout()
        while self.deferred:
            made_on, cand = self.deferred.popleft()
            if made_on == here:
                return cand
        return None

    def _drop_stale(self) -> None:
        """A new leader makes the coupled moves queued on the old layout stale: they are dropped, and since they
        never ran, a move from the new leader may ask for the same recipe again."""
        here = self._layout()
        for made_on, cand in self.deferred:
            if made_on != here:
                self.tried.discard(self.key(cand.changes))
        self.deferred = deque((m, c) for m, c in self.deferred if m == here)

    def _rule4_probe(self) -> Candidate | None:
        """Rule 4's last check before the stop: a parallel degree of the space that no launched candidate
        moved (its moves from the leader had no feasible layout, or its turn never came) is probed once,
        from the leader if a layout allows it, else from the baseline."""
        for lever in self.order:
            if lever not in DEGREE_FLAG_NAMES:
                continue
            base = self.baseline.get(lever)
            base = 1 if base is None else base
            if lever in self.probed or any(v != base for v in self.moved.get(lever, ())):
                continue
            for value in self.space[lever]:
                if value == base or value is None:
                    continue
                why = "rule 4: every parallel degree probed before the stop"
                cand = self._candidate(lever, value, why) or self._candidate(lever, value, why, origin={})
                if cand is not None:
                    self.probed.add(lever)
                    return cand
        return None

    def tell(self, candidate: Candidate, outcome: Outcome) -> None:
        tok: dict[str, Any] = candidate.token or {}
        lever = tok.get("lever", candidate.lever)
        if outcome.outcome in NOT_THE_RECIPES:
            self._infra_outcome(candidate, tok)
            return
        self._note_measured(candidate, outcome, lever)
        self._note_clear_loss(tok, outcome, lever)
        if outcome.run_id:
            self.run_changes[outcome.run_id] = (lever, dict(candidate.changes))
        if outcome.outcome == RunOutcome.OOM and "value" in tok:
            self.oom_values.setdefault((self._layout(), lever), set()).add(str(tok["value"]))
        plain_next = tok.get("plain") is not None and self._after_memory_first(tok, outcome)
        if outcome.promoted:
            self._promote(candidate, tok, lever)
            return
        if self._memory_outcome(candidate, outcome, tok, lever, plain_next):
            return
        if tok.get("rebalanced"):
            return  # the lever's value was judged by its own move; its coupled move is one more look at it
        if outcome.outcome in (RunOutcome.OK, RunOutcome.PRUNED):
            self._rebalance(candidate.changes, tok, lever)
        # Outcomes arrive out of order when runs overlap: a late outcome of another lever counts against
        # that lever, never against the one being probed now.
        self.failures[lever] = self.failures.get(lever, 0) + 1
        if self.failures[lever] >= 2:
            if lever == self.current_lever and self._spare_one_more(lever):
                return  # one more value first; its failure rules the lever out
            self._rule_out(lever, "two values did not beat the leader")
            if lever == self.current_lever:
                self.queue.clear()

    def _note_measured(self, candidate: Candidate, outcome: Outcome, lever: str) -> None:
        """What a measured outcome teaches whatever its verdict: the lever was measured, the memory anchor,
        the parallel degrees launched."""
        if outcome.outcome == RunOutcome.REFUSED:
            return
        if lever not in self.measured:
            self.measured.append(lever)
        full = self._full(candidate.changes)
        self._anchor(full, outcome.outcome)
        where = self._layout(candidate.changes)
        for flag in self.space:
            self.measured_at.add((where, flag, str(full.get(flag))))
            if str(full.get(flag)) != str(self.baseline.get(flag)):
                self.values_run.setdefault(flag, set()).add(str(full.get(flag)))
        for flag in DEGREE_FLAG_NAMES & set(self.space):
            self.moved.setdefault(flag, set()).add(1 if full.get(flag) is None else full.get(flag))

    def _promote(self, candidate: Candidate, tok: dict[str, Any], lever: str) -> None:
        old = self._value(lever)
        was = self._layout()
        self.win_dir[lever] = (old, tok.get("value"))
        partner = tok.get("partner") if tok.get("rebalanced") else None
        if partner is not None:
            # A re-balanced move won: its partner degree moved too, and going back on it is going back across
            # the node it left (what the move's own loss measured), so it keeps the direction that won as well.
            self.win_dir[partner[0]] = (partner[1], partner[2])
        before = self._full(self.leader)
        self.leader = dict(candidate.changes)
        self.win_layout[lever] = self._layout()
        self._won_with(lever, before)
        self._drop_stale()
        self.improved_this_pass = True
        # a placement lever won, or a coupled move moved the layout with it
        self.restart = self.restart or lever in PLACEMENT_FLAGS or self.win_layout[lever] != was
        if lever not in self.won:
            self.won.append(lever)
        # Keep moving in the direction that won, drop the other direction.
        self.failures[lever] = 0
        self.queue = deque(
            (lever, v) for v in self._values_to_try(lever) if self._beyond(lever, v, tok.get("value"), old)
        )

    def _won_with(self, lever: str, before: dict[str, ArgValue]) -> None:
        """The other non-placement levers of the space that the new leader changed with `lever` (rule 5's
        retry adds full recomputation back to a layout move) won with it: rule 6 re-tests them on the final
        layout like any winner (the control plane's stop rule counts every flag a winner changed). Not a direction
        that won: the value it replaced may have run out of memory there, and may fit another layout."""
        after = self._full(self.leader)
        self.wins_seen.append((lever, after.get(lever), self._layout()))
        for flag in self.space:
            if flag == lever or flag in DEGREE_FLAG_NAMES or str(after.get(flag)) == str(before.get(flag)):
                continue
            self.wins_seen.append((flag, after.get(flag), self._layout()))

    def _memory_outcome(self, candidate: Candidate, outcome: Outcome, tok: dict[str, Any], lever: str,
                        plain_next: bool) -> bool:
        """Rule 5 and the coupled moves that pay for memory. True: the outcome does not count against the
        lever's value (a retry of it, or the move behind its memory-first retry, is still to come)."""
        oom = outcome.outcome == RunOutcome.OOM
        if tok.get("after_retry"):
            # The move behind its memory-first retry: the retry counted for the lever; out of memory, the
            # memory it lacks may still be paid for by sharding (as after rule 5's retry).
            if oom:
                self._pay_for_memory(candidate.changes, tok, lever)
            return True
        if oom and tok.get("paid") and not tok.get("paid_retry"):
            # A coupled move that ran out of memory: rule 5 holds for its layout too.
            return self._retry_after_oom(candidate, {**tok, "paid_retry": True}, lever)
        if oom and not tok.get("retried"):
            if self._retry_after_oom(candidate, tok, lever):
                return True
            oom_peak = self._peak_of(self._full(candidate.changes))
            if oom_peak is not None and "value" in tok:
                self.oom_at[(self._layout(), lever)] = (tok["value"], oom_peak)
            return self._pay_for_memory(candidate.changes, tok, lever)
        if plain_next:
            return False  # the move itself runs next: whether its memory needs paying for, its own run says
        if tok.get("retried") and not tok.get("paid") and "oom_changes" in tok and self._may_pay(
                outcome, self._full(tok["oom_changes"]).get("--recompute-granularity")):
            # Rule 5's retry did not lead: the memory the move lacked may be paid for by sharding instead.
            self._pay_for_memory(tok["oom_changes"], tok, lever)
        return False

    def _spare_one_more(self, lever: str) -> bool:
        """Rule 4 says two values; for a parallel degree, two values can both miss a third that behaves
        otherwise, and that one value is measured before the degree is ruled out (once per layout): a value
        past one that ran out of memory which the anchored memory estimate says fits (a wider EP fits where a
        narrower one did not, even with the shallower pipeline it forces: an out-of-memory run is no speed
        measurement), or the degree at 1 from a leader above 2 (its collective gone altogether: no expert
        all-to-all at EP 1, no per-layer tensor collective at TP 1), unless the estimate says it does not fit.
        True: the queue now holds that value alone."""
        key = (self._layout(), lever)
        if key in self.spared or lever not in PLACEMENT_FLAGS:
            return False
        cur = self._value(lever)
        ooms = [x for x in self.space[lever] if str(x) in self.oom_values.get(key, ())]
        for _, value in self.queue:
            past_oom = any(self._beyond(lever, value, u, cur) for u in ooms)
            if not past_oom and not (value == 1 and as_int(cur, 1) > 2):
                continue
            full: dict[str, ArgValue] | None = {**self._full(self.leader), lever: value}
            if self.couple is not None and full is not None:
                full = self.couple(full, lever, value)
            fit = None if full is None else self._fit(full)
            if full is None or fit is False or (past_oom and fit is not True and value != 1):
                continue
            self.spared.add(key)
            self.queue = deque([(lever, value)])
            return True
        return False

    def _rule_out(self, lever: str, why: str) -> None:
        self.ruled_out[lever] = why
        self.learned[(self._layout(), lever)] = why

    def _infra_outcome(self, candidate: Candidate, tok: dict[str, Any]) -> None:
        """An infrastructure fault or a cancellation says nothing about the recipe: it never counts against
        the lever, and the lever is not measured by it. The candidate is asked again once (the control plane
        admits one retry of an infrastructure failure); after that its value is left unmeasured."""
        if tok.get("infra_retried"):
            return
        self.pending_retry.append(Candidate(
            changes=dict(candidate.changes), lever=candidate.lever,
            hypothesis=f"{candidate.hypothesis} (again: the last run failed on infrastructure, not on the recipe)",
            expected_gain=candidate.expected_gain, token={**tok, "infra_retried": True}))

    def _retry_after_oom(self, candidate: Candidate, tok: dict[str, Any], lever: str) -> bool:
        """Rule 5 for a first out-of-memory: queue the candidate again with full recomputation (where the
        memory retry is on and it had less), else with the first memory saver it lacks. False: nothing new
        to try, the outcome counts as a failure."""
        if self.memory_retry and candidate.changes.get(
                "--recompute-granularity", self.baseline.get("--recompute-granularity")) != "full":
            # Give the layout its memory savings back (full recomputation) and measure it again.
            changes = self.diff(self._coherent(self._full({**candidate.changes, **FULL_RECOMPUTE}),
                                               self._full(candidate.changes)))
            if self.key(changes) not in self.tried:
                self.tried.add(self.key(changes))
                self.pending_retry.append(Candidate(
                    changes=changes, lever=lever,
                    hypothesis=(f"rule 5: {lever}={tok.get('value')} ran out of memory; add back full recomputation "
                                "and measure again before ruling the layout out"),
                    token={**tok, "retried": True, "oom_changes": dict(candidate.changes)},
                ))
                return True
        for saver, val in MEMORY_SAVERS.items():
            if saver in self.space and candidate.changes.get(saver) != val and saver != lever:
                changes = self.diff(self._coherent(self._full({**candidate.changes, saver: val}),
                                                   self._full(candidate.changes)))
                if self.key(changes) not in self.tried:
                    self.tried.add(self.key(changes))
                    self.pending_retry.append(Candidate(
                        changes=changes, lever=lever,
                        hypothesis=f"rule 5: {lever} ran out of memory; add back {saver}={val} and measure again",
                        token={**tok, "retried": True},
                    ))
                    return True
        return False

    @staticmethod
    def _may_pay(retry: Outcome, granularity: ArgValue = None) -> bool:
        """Whether paying for the memory with sharding can beat the leader, by the retry's measurement: the
        paid move keeps the out-of-memory move's recomputation (`granularity`), so it saves at most the
        difference between full recomputation, which the retry added, and that one
        (`recompute_max_speedup`), and the degree that pays costs something; a retry slower than the leader
        by more than that cannot be rescued. A retry without a measurement (out of memory again) says
        nothing: pay."""
        tps, leader = retry.tokens_per_s_per_gpu, retry.extra.get("leader_tps")
        if tps is None or not isinstance(leader, (int, float)) or leader <= 0:
            return True
        return tps * recompute_max_speedup(granularity) > leader

    def _pay_for_memory(self, oom: dict[str, ArgValue], tok: dict[str, Any], lever: str) -> bool:
        """A coupled move, first-class: a move that ran out of memory (less recomputation, a narrower TP or EP)
        paid for by more sharding elsewhere (a deeper pipeline, more TP, CP or EP: the smallest value up of
        another placement degree that the anchored estimate says fits, at its nearest feasible layout, the
        moved lever kept). Only moves the memory estimate says fit are queued (it orders the payers; without
        an estimate, the next value up and the first one), fewest degrees moved first, a degree that would go
        back the way it won last, at most `PAYERS` of them. They run once the lever pass is through, and only
        while the leader is still on the layout they were made from (a new leader makes them stale, and a
        move from it may ask for the same recipe again). False: nothing to queue."""
        origin = self._full(oom)
        moved = origin.get(lever)
        here = self._layout()
        options = self._payers(origin, lever, moved)
        if options and options[0][0][0] == 1:
            options = options[:1]
        fresh = self._fresh(options, PAYERS)
        for changes, flag, value in fresh:
            self.deferred.append((here, Candidate(
                changes=changes, lever=lever,
                hypothesis=(f"coupled move: {lever}={moved} ran out of memory; pay for it with {flag}={value} "
                            "(more sharding) instead of the memory saving it dropped"),
                token={**_paid_token(tok), "retried": True, "paid": True},
            )))
        return self._pay_for_one(origin, tok, lever) or bool(fresh)

    def _pay_for_one(self, origin: dict[str, ArgValue], tok: dict[str, Any], lever: str) -> bool:
        """A degree that ran out of memory on its way down toward 1 (EP 8 -> 4) is also tried at 1, paid for
        like the move (`_payers`; once per layout and degree): at 1 its collective is gone altogether (no
        expert all-to-all), which the values between do not show, and the memory it costs is what a deeper
        pipeline pays for. False: nothing to queue."""
        moved, cur = origin.get(lever), self._value(lever)
        key = (self._layout(), lever)
        if (lever not in PLACEMENT_FLAGS or key in self.one_paid or 1 not in self.space[lever]
                or not 1 < as_int(moved, 1) < as_int(cur, 1)):
            return False
        self.one_paid.add(key)
        full: dict[str, ArgValue] | None = {**origin, lever: 1}
        if self.couple is not None:
            full = self.couple(full, lever, 1)
        if full is None:
            return False
        fresh = self._fresh(self._payers(self._coherent(full, origin), lever, 1), 1)
        for changes, flag, value in fresh:
            self.deferred.append((key[0], Candidate(
                changes=changes, lever=lever,
                hypothesis=(f"coupled move: {lever}={moved} ran out of memory; at 1 its collective is gone "
                            f"altogether: pay for {lever}=1 with {flag}={value}"),
                token={**_paid_token(tok), "value": 1, "retried": True, "paid": True},
            )))
        return bool(fresh)

    def _payers(self, origin: dict[str, ArgValue], lever: str, moved: ArgValue
                ) -> list[tuple[tuple[int, int, int], dict[str, ArgValue], str, ArgValue]]:
        """The coherent recipes that pay for `origin`'s memory with another placement degree moved up, each by
        the smallest step the anchored memory estimate says fits (a narrower TP may need a pipeline two steps
        deeper), as ((estimate unsure, goes back on a win, degrees moved), flags, the paying degree, its value),
        best first: a degree that pays by going back the way it won (measured slower) comes after one that
        does not."""
        options: list[tuple[tuple[int, int, int], dict[str, ArgValue], str, ArgValue]] = []
        for flag in self.order:
            if flag not in PLACEMENT_FLAGS or flag == lever:
                continue
            cur = origin.get(flag)
            cur_n = 1 if cur in (None, False) else cur
            ups = sorted(v for v in self.space[flag] if isinstance(v, int) and isinstance(cur_n, int) and v > cur_n)
            for value in ups:  # the smallest step up that the anchored estimate says fits
                full: dict[str, ArgValue] | None = {**origin, flag: value}
                if self.couple is not None and full is not None:
                    full = self.couple(full, flag, value)
                if full is None or (lever in self.space and str(full.get(lever)) != str(moved)):
                    continue  # no feasible layout pays for it, or the one that does undoes the move
                full = self._coherent(full, origin)
                fit = self._fit(full)
                if fit is False:
                    continue
                n_moved = sum(1 for f in PLACEMENT_FLAGS if str(full.get(f)) != str(origin.get(f)))
                back = self._goes_back(flag, cur_n, value)
                options.append(((0 if fit else 1, 1 if back else 0, n_moved), full, flag, value))
                break
        return sorted(options, key=lambda o: o[0])

    def _goes_back(self, flag: str, cur: ArgValue, value: ArgValue) -> bool:
        """Whether moving the degree `flag` from `cur` to `value` goes back the way its last win took it (a
        direction measured as slower), by the degrees' sizes: a win may have come from a value outside the space
        (a coupled move's)."""
        won = self.win_dir.get(flag)
        if won is None or not all(isinstance(v, int) or v in (None, False) for v in (*won, cur, value)):
            return False
        before, after = (as_int(v, 1) for v in won)
        return as_int(cur, 1) == after and (as_int(value, 1) - after) * (after - before) < 0

    def _node_groups_crossing(self, full: dict[str, ArgValue]) -> list[tuple[str, ...]]:
        """The node-local groups (`NODE_GROUPS`) whose ranks span more than one node in this recipe."""
        if not self.node_gpus:
            return []
        out = []
        for group in NODE_GROUPS:
            size = 1
            for flag in group:
                value = full.get(flag)
                if value in (None, False) and flag == DEGREE_FLAGS["etp"]:
                    value = full.get(DEGREE_FLAGS["tp"])  # expert TP unset follows TP
                size *= as_int(value, 1)
            if size > self.node_gpus:
                out.append(group)
        return out

    def _fresh(self, options: list[tuple[Any, dict[str, ArgValue], str, ArgValue]], limit: int
               ) -> list[tuple[dict[str, ArgValue], str, ArgValue]]:
        """The first `limit` options (rank, flags, the degree that moves, its value) whose recipe was never
        tried, as (changes, degree, value); each is marked tried."""
        out: list[tuple[dict[str, ArgValue], str, ArgValue]] = []
        for _, full, flag, value in options:
            if len(out) >= limit:
                break
            changes = self.diff(full)
            key = self.key(changes)
            if key not in self.tried:
                self.tried.add(key)
                out.append((changes, flag, value))
        return out

    def _rebalanced(self, origin: dict[str, ArgValue], lever: str, flag: str, new: int, old: int
                    ) -> tuple[tuple[int, int], dict[str, ArgValue], str, ArgValue] | None:
        """`origin` (the lost move, `lever` old -> new) with `flag` moved the other way by the same factor, as
        (rank, flags, flag, value); None where no feasible recipe does that alone, it undoes the move, the
        memory estimate says it fails, or a node-local group still crosses nodes."""
        cur = as_int(origin.get(flag), 1)
        if (cur * old) % new:
            return None
        value = _space_value(self.space[flag], cur * old // new)
        if value is _MISSING:
            return None
        full: dict[str, ArgValue] | None = {**origin, flag: value}
        if self.couple is not None and full is not None:
            full = self.couple(full, flag, value)
        if full is None or str(full.get(lever)) != str(origin.get(lever)):
            return None
        if sum(1 for f in PLACEMENT_FLAGS if as_int(full.get(f), 1) != as_int(origin.get(f), 1)) > 1:
            return None  # only the partner moves: the data-parallel size stays
        full = self._coherent(full, origin)
        fit = self._fit(full)
        if fit is False or self._node_groups_crossing(full):
            return None
        return (0 if fit else 1, self.order.index(flag)), full, flag, value

    def _rebalance(self, changes: dict[str, ArgValue], tok: dict[str, Any], lever: str) -> bool:
        """A coupled move, first-class: a placement degree's move that ran and lost after it pushed a
        node-local group across nodes (TP x CP, the tensor and context collectives of every layer; ETP x EP,
        the expert all-to-all: the catalog keeps them inside a node), measured again with the group's other
        degree moved the other way by the same factor, so the group fits its node again and the
        data-parallel size and batch geometry stay. Only a move of the lever's own value (not a retry or
        another coupled move), and only a re-balance the memory estimate does not say fails, at most
        `REBALANCERS` of them. It runs next, as the lever's own coupled move, and its outcome never counts
        against the lever (rule 4's two values are two values)."""
        if lever not in PLACEMENT_FLAGS or "value" not in tok or tok.get("retried") or tok.get("paid"):
            return False
        origin = self._full(changes)
        new, old = as_int(origin.get(lever), 1), as_int(self._value(lever), 1)
        if new <= old:
            return False
        before = self._node_groups_crossing(self._full(self.leader))
        crossing = [g for g in self._node_groups_crossing(origin) if g not in before and lever in g]
        options = [opt for flag in (f for g in crossing for f in g) if flag != lever and flag in self.space
                   if (opt := self._rebalanced(origin, lever, flag, new, old)) is not None]
        fresh = self._fresh(sorted(options, key=lambda o: o[0]), REBALANCERS)
        for diff, flag, value in fresh:
            self.pending_retry.append(Candidate(
                changes=diff, lever=lever,
                hypothesis=(f"re-balanced move: {lever}={tok['value']} lost with its node-local group across "
                            f"nodes; move {flag} to {value} with it, so the group fits a node of "
                            f"{self.node_gpus} GPUs and the data-parallel size stays"),
                token={**tok, "rebalanced": True, "partner": (flag, origin.get(flag), value)}))
        return bool(fresh)

    def _beyond(self, lever: str, value: ArgValue, won_value: ArgValue, prev: ArgValue) -> bool:
        """Whether `value` lies further along the direction that took `prev` to `won_value`."""
        values = self.space[lever]
        if won_value not in values or value not in values:
            return True
        if prev not in values:
            return True
        direction = values.index(won_value) - values.index(prev)
        return (values.index(value) - values.index(won_value)) * direction > 0

    def repair(self, refusals: list[Any]) -> bool:
        """A stop the control plane refused (its search rules), answered with the runs it asks for, once each:
        rule 5's out-of-memory run (a `run_id` target) measured again with full recomputation (else the first
        memory saving it lacks), rule 6's winning value (a `name`/`value` target) measured on the final layout.
        The tuner's own rules are meant to leave nothing for these; this is the net under them. True: something
        was queued, the search goes on."""
        queued = 0
        for refusal in refusals:
            code = getattr(refusal, "code", "")
            for target in getattr(refusal, "targets", None) or []:
                cand = (self._repair_oom(str(target.get("run_id"))) if code == "rule5_oom_not_retried"
                        else self._repair_retest(str(target.get("name")), str(target.get("value")))
                        if code == "rule6_winners_not_retested" else None)
                if cand is not None:
                    self.pending_retry.append(cand)
                    queued += 1
        return queued > 0

    def _queue_once(self, full: dict[str, ArgValue], before: dict[str, ArgValue], lever: str, why: str,
                    token: dict[str, Any]) -> Candidate | None:
        changes = self.diff(self._coherent(full, before))
        if self.key(changes) in self.tried:
            return None
        self.tried.add(self.key(changes))
        return Candidate(changes=changes, lever=lever, hypothesis=why, token=token)

    def _repair_oom(self, run_id: str) -> Candidate | None:
        if run_id not in self.run_changes:
            return None
        lever, changes = self.run_changes[run_id]
        full = self._full(changes)
        savers = {**FULL_RECOMPUTE} if self.memory_retry else next(
            ({k: v} for k, v in MEMORY_SAVERS.items() if k in self.space and full.get(k) != v), {})
        if not savers:
            return None
        return self._queue_once({**full, **savers}, full, lever,
                                f"rule 5: {run_id} ran out of memory; measure its layout with its memory savings added back",
                                {"lever": lever, "retried": True, "repair": True})

    def _repair_retest(self, name: str, text: str) -> Candidate | None:
        value = next((v for v in self.space.get(name, ()) if str(v) == text), _MISSING)
        if value is _MISSING:
            return None
        full = self._full(self.leader)
        return self._queue_once({**full, name: value}, full, name,
                                f"rule 6: re-test {name}={value}, which won on an earlier layout, on the final one",
                                {"lever": name, "value": value, "repair": True})

    def summary(self) -> dict[str, Any]:
        return {
            "tuner": self.name,
            "levers_tested": [k for k in self.order if k in self.measured],
            "levers_won": list(self.won),
            "ruled_out": dict(self.ruled_out),
            "leader_changes": dict(self.leader),
            "passes": self.passes,
            **({"diagnosis": self.diagnosis} if self.diagnosis else {}),
        }
