"""Diagnosis first: a profiled run's per-stage breakdown -> the step's exposed costs -> which lever goes first.

The trace analyzer (`attune.readers.traces`) splits the slowest stage's step into compute, exposed
communication by kind (expert all-to-all, tensor-parallel collectives, context-parallel exchange,
data-parallel reduce, pipeline send/receive with the bubble), memory copies and host-side idle time.
Two costs hide inside its compute: the recomputed forward pass (read from the recipe's own
recomputation flags: full recomputation repeats the forward, a quarter of forward + backward +
recompute) and the optimizer step (its kernels, by name). `cost_shares` gives every cost as a share of
the step; `order_by_diagnosis` moves the levers that attack the largest costs ahead of the others of the
same expected-gain class (the catalog's `rough_size`), using only the lever catalog's `attacks` and
`rough_size` fields (data, never model names): a diagnosis picks among levers of equal catalog priority,
it never puts a small lever before a large one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attune.tuners.base import ArgValue

# Full recomputation runs each layer's forward once more: forward 1, backward 2, recompute 1 of the
# compute. Selective recomputation repeats only the cheap modules (attention's core): a small share.
RECOMPUTE_SHARE_OF_COMPUTE = {"full": 0.25, "selective": 0.05}
# A cost below this share of the step is noise for ordering purposes: the catalog order stands.
MIN_SHARE = 0.10
_OPTIMIZER_KERNEL = re.compile(r"adam|optimizer|multi_tensor_apply", re.IGNORECASE)
# The analyzer's wait labels that are costs a lever can attack (everything else is folded or ignored).
_COMM_LABELS = ("all_to_all", "tp_collective", "cp_collective", "dp_reduce", "pipeline_p2p")
_WAIT_LABELS = {"memcpy": "memcpy_exposed_us", "host_launch": "launch_us", "host_python": "python_us",
                "host_data_loading": "data_loading_us"}


@dataclass
class Diagnosis:
    """A step's exposed costs (share of the step) and the run they were read from."""

    shares: dict[str, float]
    run_id: str | None = None
    stage: int | None = None
    step_ms: float = 0.0
    notes: list[str] = field(default_factory=list)

    def largest(self) -> list[tuple[str, float]]:
        return sorted(((k, v) for k, v in self.shares.items() if v > 0), key=lambda kv: -kv[1])

    def text(self, n: int = 4) -> str:
        top = ", ".join(f"{k} {v * 100:.0f}%" for k, v in self.largest()[:n]) or "no exposed cost found"
        where = f"stage {self.stage}, " if self.stage is not None else ""
        return f"{where}step {self.step_ms:.0f} ms; largest exposed costs: {top}"


def _recompute_share(args: Mapping[str, ArgValue]) -> float:
    gran = args.get("--recompute-granularity")
    if gran in (None, False) and args.get("--recompute-activations") not in (None, False):
        gran = "selective"
    return RECOMPUTE_SHARE_OF_COMPUTE.get(str(gran), 0.0) if gran not in (None, False) else 0.0


def cost_shares(report: Any, args: Mapping[str, ArgValue], run_id: str | None = None) -> Diagnosis:
    """The slowest stage's costs (`TraceReport` from `analyze_paths`), each as a share of the step."""
    slow = report.slowest_stage
    stage = next((s for s in report.stages if slow is not None and s.stage == slow.stage), None)
    if stage is None and report.stages:
        stage = max(report.stages, key=lambda s: s.busy_us)
    if stage is None:
        return Diagnosis({}, run_id, notes=["no profiled steps in the traces"])
    b = stage.breakdown
    step = b.step_us if b.step_us > 0 else 1.0
    shares: dict[str, float] = {k: b.comm_exposed_by_kind.get(k, 0.0) / step for k in _COMM_LABELS}
    shares.update({k: getattr(b, f) / step for k, f in _WAIT_LABELS.items()})
    ranks = [r for r in report.ranks if r.stage == stage.stage] or list(report.ranks)
    opt = [sum((t.per_step_us or 0.0) for t in r.top_kernels if _OPTIMIZER_KERNEL.search(t.name)) for r in ranks]
    opt_us = sum(opt) / len(opt) if opt else 0.0
    compute = max(0.0, b.compute_us - opt_us)
    shares["optimizer"] = opt_us / step
    shares["recompute"] = compute * _recompute_share(args) / step
    return Diagnosis(shares, run_id, stage.stage, b.step_us / 1000.0)


def diagnose_traces(trace_dir: Path, args: Mapping[str, ArgValue], run_id: str | None = None) -> Diagnosis:
    """Analyse a profiled run's traces (its run directory's `traces/`) and read its costs."""
    from attune.readers.traces import analyze_paths

    return cost_shares(analyze_paths([trace_dir], jobs=1, top_n=20), args, run_id)


def order_by_diagnosis(order: list[str], attacks: Mapping[str, list[str]], shares: Mapping[str, float],
                       min_share: float = MIN_SHARE,
                       groups: Mapping[str, int] | None = None) -> tuple[list[str], str]:
    """Within each of the catalog's expected-gain classes (`groups`: lever -> its `rough_size` rank), the
    levers attacking a cost of at least `min_share` of the step go first, the one attacking the largest
    cost first (ties keep the catalog's order); every class keeps its places in the order, so a diagnosis
    never puts a small lever before a large one. Without `groups` the whole order is one class. A lever
    outside `groups` keeps its place. Returns the new order with its reason."""
    def score(lever: str) -> float:
        s = max((shares.get(k, 0.0) for k in attacks.get(lever, [])), default=0.0)
        return s if s >= min_share else 0.0

    def group(lever: str) -> object:
        if groups is None:
            return 0
        return groups.get(lever, ("alone", lever))

    new = list(order)
    for g in dict.fromkeys(group(lv) for lv in order):
        places = [i for i, lv in enumerate(order) if group(lv) == g]
        ranked = sorted((order[i] for i in places), key=lambda lv: (-score(lv), order.index(lv)))
        for i, lv in zip(places, ranked, strict=True):
            new[i] = lv
    moved = [lv for lv in order if score(lv) > 0]
    if not moved:
        return list(order), f"no lever attacks a cost of {min_share * 100:.0f}% or more of the step: catalog order kept"
    firsts = "; ".join(
        f"{lv} (attacks {max(attacks[lv], key=lambda k: shares.get(k, 0.0))} {score(lv) * 100:.0f}%)"
        for lv in sorted(moved, key=lambda lv: -score(lv))[:3])
    scope = "within each of the catalog's expected-gain classes" if groups is not None else "over all levers"
    if new == list(order):
        return new, f"largest exposed cost first, {scope}: the catalog order already has it ({firsts})"
    return new, f"largest exposed cost first, {scope}: {firsts}"
