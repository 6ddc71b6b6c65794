"""Both convergence verdicts on real loss curves from public GPU runs, three corpora (tests/data).

- ``megatron-lm`` (development corpus, `tests/data/real_curves`): Megatron-LM's functional-test golden
  values at commit d98e8a64 (`collect.py` there says how cases and pairs are chosen). The bf16 floor
  (`gate.noise.LAYOUT_FLOOR_BY_PRECISION`) is derived from its layout pairs (`--derive` prints the figure).
- ``megatron-lm-2024`` (held out, `tests/data/real_curves_mlm2024`): the same kind of goldens at commit
  1115e062 (December 2024: other models, layouts, machines and containers, `dev` vs `lts`).
- ``torchtitan`` (held out, `tests/data/real_curves_torchtitan`): torchtitan's CI loss goldens across its
  history; each pair is one golden before and after a commit, classified from the commit alone.

Pair kinds: ``environment`` (same recipe on another machine type, container or platform), ``kernel``
(a same-math code change), ``layout`` (structural arguments only), all same-objective; ``objective``
(model, learning rate, data, loss, initialisation...): another objective.

For Megatron-LM pairs the baseline case's curves on its *other* machine types are the runs of its
objective the envelope learns from (kind ``environment``, the nearest thing to replicates these files
hold); torchtitan's goldens come from a deterministic CI (its runs reproduce bit for bit), so the
allowance is the floor. Each pair is judged on two cuts (the first 20 steps, and all the steps, up to
100, both have) and in two modes: ``strict`` (change class unknown: every step at replicate level) and
``layout`` (what layer 1 says of a layout change: drift and divergence). Same-objective pairs are judged
as layer 1 would class them (layout); objective pairs are judged in layout mode too, the backstop's
worst case (a change layer 1 missed, e.g. a code change), and in strict mode.

`python -m gate.evaluation.realcurves [--rows] [--json] [--derive]` prints the tables docs/gate.md shows.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel

from gate.judge import judge
from gate.noise import config_for, precision_of

DATA_DIR = Path(__file__).resolve().parents[2] / "tests" / "data"
DATA = DATA_DIR / "real_curves" / "curves.json"
CORPORA = {"megatron-lm": ("real_curves", "development"), "megatron-lm-2024": ("real_curves_mlm2024", "held out"),
           "torchtitan": ("real_curves_torchtitan", "held out")}
EXPECTED = {"environment": True, "kernel": True, "layout": True, "objective": False}
CUTS: dict[str, int | None] = {"20 steps": 20, "all steps": None}
# strict: change unknown, every step at replicate level; layout: layer 1 classes the change layout-only; infer:
# change unknown, judged as layout if and only if the difference test finds zero-mean, non-drifting noise (what
# `attune gate converge` does for a change of unknown class); bare: the same with the two curves alone, no envelope
# runs and no arguments (precision assumed bf16): what an outside evaluator gets from `attune gate converge BASE
# CAND --json` on two JSON curves.
MODES = ("strict", "layout", "infer", "bare")


class PairVerdict(BaseModel):
    corpus: str
    kind: str
    baseline: str
    candidate: str
    env: str
    cut: str
    mode: str
    steps: int
    replicates: int
    same_objective: bool
    reference: bool
    reference_why: str
    noise_aware: bool
    noise_aware_why: str
    gate: bool
    max_rel_diff: float | None
    mean_rel_diff: float | None = None
    same_sign_share: float | None = None
    assumed: str
    layer1_class: str | None = None  # what layer 1 makes of the cases' arguments (None: the corpus has none)
    layer1_refuses: bool = False  # layer 1 refuses the change outright (known objective change or unlisted)


def load(path: Path = DATA) -> dict[str, Any]:
    return json.loads(path.read_text())


Curve = dict[int, float | None]
# (kind, baseline, candidate, baseline curve, candidate curve, envelope runs, precision, layer 1's class or None,
#  whether layer 1 refuses the change outright)
Pair = tuple[str, str, str, Curve, Curve, list[tuple[str, str, Curve]], str, str | None, bool]


def _curve(doc: Mapping[str, Any], case: str, env: str) -> Curve:
    return {int(k): v for k, v in doc["cases"][case]["curves"][env]["lm_loss"].items()}


def _cut(curve: Mapping[int, float | None], last: int | None) -> Curve:
    return {s: v for s, v in curve.items() if last is None or s <= last}


def pairs(doc: Mapping[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """Megatron-LM corpora: (kind, baseline case, baseline env, candidate case, candidate env)."""
    out = []
    for case, c in sorted(doc["cases"].items()):
        envs = sorted(c["curves"])
        if len(envs) >= 2:
            out.append(("environment", case, envs[0], case, envs[1]))
    out += [("layout", r["baseline"], r["env"], r["candidate"], r["env"]) for r in doc["layout_pairs"]]
    out += [("objective", r["baseline"], r["env"], r["candidate"], r["env"]) for r in doc["objective_pairs"]]
    return out


def layer1(doc: Mapping[str, Any], a: str, b: str) -> tuple[str, bool]:
    """What `attune gate converge` without --change does with these cases given as JSON runs (their arguments
    and environment): layer 1 on the `megatron` list classes the change layout, objective or unknown, and says
    whether it refuses it outright (`ConfigCheckResult.blocking_refusals`: a known objective change or an
    unlisted one), which makes the verdict a reject whatever the curves show."""
    from gate.config_check import check_recipe
    from gate.lists import load_list

    ca, cb = doc["cases"][a], doc["cases"][b]
    r = check_recipe(load_list("megatron"), ca["args"], cb["args"], ca.get("env_vars") or {}, cb.get("env_vars") or {})
    return r.objective_class(), bool(r.blocking_refusals())


def layer1_class(doc: Mapping[str, Any], a: str, b: str) -> str:
    """Layer 1's class of the change between two cases (`layer1`)."""
    return layer1(doc, a, b)[0]


def _megatron_pairs(doc: Mapping[str, Any]) -> list[Pair]:
    out: list[Pair] = []
    for kind, a, ea, b, eb in pairs(doc):
        reps = [(f"{a}@{e}", "environment", _curve(doc, a, e)) for e in sorted(doc["cases"][a]["curves"])
                if e not in (ea, eb)]
        out.append((kind, a, b if ea == eb else f"{b}@{eb}", _curve(doc, a, ea), _curve(doc, b, eb), reps,
                    precision_of(doc["cases"][a]["args"]), *layer1(doc, a, b)))
    return out


def _torchtitan_pairs(doc: Mapping[str, Any]) -> list[Pair]:
    def c(key: str) -> Curve:
        return {int(k): v for k, v in doc["cases"][key]["lm_loss"].items()}
    # the CI runs in deterministic mode and asserts bitwise-equal losses: replicates are identical
    return [(p["kind"], p["baseline"], p["candidate"], c(p["baseline"]), c(p["candidate"]),
             [("replicate (deterministic CI)", "replicate", c(p["baseline"]))], "bf16", None, False)
            for p in doc["pairs"]]


def corpus_pairs(name: str) -> list[Pair]:
    doc = load(DATA_DIR / CORPORA[name][0] / "curves.json")
    return _torchtitan_pairs(doc) if name == "torchtitan" else _megatron_pairs(doc)


def _judge_row(corpus: str, pair: Pair, cut_name: str, last: int | None, mode: str) -> PairVerdict:
    kind, a, b, base0, cand0, reps0, precision, klass, refuses = pair
    base, cand = _cut(base0, last), _cut(cand0, last)
    common_last = min(max(base), max(cand))
    base, cand = _cut(base, common_last), _cut(cand, common_last)  # compare the steps both cover
    reps = [(n, k, _cut(r, common_last)) for n, k, r in reps0] if mode != "bare" else []
    cfg = (config_for("bf16", "default") if mode == "bare"
           else config_for(precision, "log", change="layout" if mode == "layout" else "unknown"))
    g = judge(base, cand, replicates=reps, noise_config=cfg, infer=mode in ("infer", "bare"), check_window=True)
    ref, na = g.reference, g.noise_aware
    signed = [(cand[s] - base[s]) / abs(base[s]) for s in na.steps if base[s]]  # type: ignore[operator]
    rels = [abs(x) for x in signed]
    pos = sum(x > 0 for x in signed)
    return PairVerdict(
        corpus=corpus, kind=kind, baseline=a, candidate=b, env="", cut=cut_name, mode=mode, steps=len(na.steps),
        replicates=len(reps), same_objective=EXPECTED[kind], reference=ref.passed,
        reference_why="pass" if ref.passed else ", ".join(ref.failed_checks or ["step sets differ"]),
        noise_aware=na.passed, noise_aware_why="pass" if na.passed else ", ".join(na.failed_checks or ["data"]),
        gate=g.passed, max_rel_diff=max(rels) if rels else None,
        mean_rel_diff=float(np.mean(signed)) if signed else None,
        same_sign_share=max(pos, len(signed) - pos) / len(signed) if signed else None, assumed=na.assumed(),
        layer1_class=klass, layer1_refuses=refuses)


def evaluate(corpora: list[str] | None = None) -> list[PairVerdict]:
    rows = []
    for name in corpora or list(CORPORA):
        for pair in corpus_pairs(name):
            for cut_name, last in CUTS.items():
                for mode in MODES:
                    rows.append(_judge_row(name, pair, cut_name, last, mode))
    return rows


def _product_mode(r: PairVerdict) -> str:
    """The mode `attune gate converge` judges a pair in from its cases' arguments: layout where layer 1 classes
    the change layout-only, strict where it refuses it (objective), inferred from the difference where the class
    is unknown (no change layer 1 classes, or no arguments)."""
    return {"layout": "layout", "objective": "strict"}.get(r.layer1_class or "unknown", "infer")


def _rejected(rows: list[PairVerdict], same_objective: bool, mode: str | None = None, reference: bool = False) -> int:
    """How many of `rows` (same-objective or objective pairs, judged in `mode`; None: as layer 1 classes them)
    are rejected, by layer 2 or (reference=True) by the reference rule alone."""
    sel = [r for r in rows if r.same_objective == same_objective and r.mode == (mode or _product_mode(r))]
    if mode is None and not reference:  # as `attune gate converge` judges them: layer 1's outright refusal counts
        return sum(r.layer1_refuses or not r.gate for r in sel)
    return sum(not (r.reference if reference else r.gate) for r in sel)


def headline(rows: list[PairVerdict]) -> list[dict[str, Any]]:
    """Per corpus and cut: same-objective pairs rejected (judged as layer 1 classes them: layout) and
    objective pairs rejected (layout mode: the backstop's worst case; strict mode in brackets). The `_layer1`
    figures judge each pair in the mode layer 1 gives from the cases' own arguments (what `attune gate converge`
    without --change does): layout where it classes the change layout, strict otherwise (no arguments, no
    change seen, an objective change)."""
    out = []
    for corpus in dict.fromkeys(r.corpus for r in rows):
        for cut in CUTS:
            sel = [r for r in rows if r.corpus == corpus and r.cut == cut]
            layout_rows = [r for r in sel if r.mode == "layout"]
            out.append({"corpus": corpus, "role": CORPORA[corpus][1], "cut": cut,
                        "legit_pairs": sum(r.same_objective for r in layout_rows),
                        "legit_rejected": _rejected(sel, True, "layout"),
                        "legit_rejected_strict": _rejected(sel, True, "strict"),
                        "objective_pairs": sum(not r.same_objective for r in layout_rows),
                        "objective_rejected": _rejected(sel, False, "layout"),
                        "objective_rejected_strict": _rejected(sel, False, "strict"),
                        "objective_rejected_reference": _rejected(sel, False, "layout", reference=True),
                        "legit_rejected_layer1": _rejected(sel, True),
                        "objective_rejected_layer1": _rejected(sel, False),
                        "legit_layer1_layout": sum(r.same_objective and r.layer1_class == "layout"
                                                   for r in layout_rows),
                        "legit_rejected_unknown": _rejected(sel, True, "infer"),
                        "objective_rejected_unknown": _rejected(sel, False, "infer"),
                        "legit_rejected_bare": _rejected(sel, True, "bare"),
                        "objective_rejected_bare": _rejected(sel, False, "bare")})
    return out


def format_headline(rows: list[PairVerdict]) -> str:
    lines = ["| corpus | role | cut | same-objective rejected (layout mode) | same-objective rejected (strict) | "
             "objective rejected (layout mode) | objective rejected (strict) | objective rejected (reference rule) | "
             "same-objective rejected (layer 1 classes; layout-classed) | objective rejected (layer 1 classes) | "
             "same-objective rejected (class unknown) | objective rejected (class unknown) | "
             "same-objective rejected (two curves alone) | objective rejected (two curves alone) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for h in headline(rows):
        n, m = h["legit_pairs"], h["objective_pairs"]
        lines.append(f"| {h['corpus']} | {h['role']} | {h['cut']} | {h['legit_rejected']}/{n} | "
                     f"{h['legit_rejected_strict']}/{n} | {h['objective_rejected']}/{m} | "
                     f"{h['objective_rejected_strict']}/{m} | {h['objective_rejected_reference']}/{m} | "
                     f"{h['legit_rejected_layer1']}/{n} ({h['legit_layer1_layout']}) | "
                     f"{h['objective_rejected_layer1']}/{m} | {h['legit_rejected_unknown']}/{n} | "
                     f"{h['objective_rejected_unknown']}/{m} | {h['legit_rejected_bare']}/{n} | "
                     f"{h['objective_rejected_bare']}/{m} |")
    return "\n".join(lines)


def format_rows(rows: list[PairVerdict]) -> str:
    """One line per pair, cut and mode: the judged window's largest and mean signed difference, the share of
    judged steps on the majority side (1.0: the gap never changes sign), and each verdict."""
    lines = ["| corpus | kind | baseline | candidate | cut | mode | steps | envelope runs | max diff | mean diff | "
             "same sign | reference | noise-aware | layer 2 |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md = "-" if r.max_rel_diff is None else f"{r.max_rel_diff:.2%}"
        mn = "-" if r.mean_rel_diff is None else f"{r.mean_rel_diff:+.2%}"
        ss = "-" if r.same_sign_share is None else f"{r.same_sign_share:.2f}"
        lines.append(f"| {r.corpus} | {r.kind} | {r.baseline} | {r.candidate} | {r.cut} | {r.mode} | {r.steps} | "
                     f"{r.replicates} | {md} | {mn} | {ss} | {r.reference_why} | {r.noise_aware_why} | "
                     f"{'pass' if r.gate else 'reject'} |")
    return "\n".join(lines)


def derive_floor(skip_fraction: float = 0.20) -> dict[str, Any]:
    """The bf16 allowance for a layout change, from the development corpus only: per layout pair (all
    steps), the RMS relative difference over the steps after the first `skip_fraction`; the median."""
    doc = load(DATA)
    per_pair = []
    for kind, a, ea, b, eb in pairs(doc):
        if kind != "layout":
            continue
        base, cand = _curve(doc, a, ea), _curve(doc, b, eb)
        common = sorted(s for s in set(base) & set(cand) if base[s] is not None and cand[s] is not None)
        kept = common[int(math.floor(len(common) * skip_fraction)):]
        e = np.array([(cand[s] - base[s]) / abs(base[s]) for s in kept])  # type: ignore[operator]
        per_pair.append(float(np.sqrt(np.mean(e ** 2))))
    return {"corpus": "megatron-lm (development)", "layout_pairs": len(per_pair),
            "median_rms_rel": float(np.median(per_pair)), "p90_rms_rel": float(np.quantile(per_pair, 0.9))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="both convergence verdicts on real public loss curves")
    ap.add_argument("--rows", action="store_true", help="also print every pair")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--derive", action="store_true", help="print the bf16 layout allowance from the development corpus")
    ns = ap.parse_args(argv)
    if ns.derive:
        print(json.dumps(derive_floor(), indent=1))
        return 0
    rows = evaluate()
    if ns.json:
        print(json.dumps({"headline": headline(rows), "rows": [r.model_dump() for r in rows]}, indent=1))
        return 0
    print(format_headline(rows))
    if ns.rows:
        print()
        print(format_rows(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
