"""Both convergence verdicts on real loss curves from public GPU runs (tests/data/real_curves).

The curves are Megatron-LM's functional-test golden values (`collect.py` there says how they are
chosen; `PROVENANCE.md` names the repository, commit and files). Three kinds of pair:

- ``environment``: one test case measured on two machine types (same model and recipe); the
  envelope comes from the case's other machine types (needs three or more);
- ``layout``: two cases differing only in structural arguments, same machine type: same objective;
- ``objective``: two cases differing in a numeric argument (model, learning rate, data, ...),
  same machine type: a different objective.

For a pair, the baseline case's curves on its *other* machine types are the runs of its objective
the envelope learns from (kind ``environment``): the nearest thing to replicates these files hold.
Each pair is judged on two cuts: the first 20 steps, and all the steps (up to 100) both have. The
noise floor follows the baseline case's precision (`gate.noise.FLOOR_BY_PRECISION`; these runs are
bf16).

`python -m gate.realcurves` prints the table docs/gate.md shows.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from gate.judge import judge
from gate.noise import config_for, precision_of

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "real_curves" / "curves.json"
EXPECTED = {"environment": True, "layout": True, "objective": False}
CUTS: dict[str, int | None] = {"20 steps": 20, "all steps": None}


class PairVerdict(BaseModel):
    kind: str
    baseline: str
    candidate: str
    env: str
    cut: str
    steps: int
    replicates: int
    same_objective: bool
    reference: bool
    reference_why: str
    noise_aware: bool
    noise_aware_why: str
    gate: bool
    max_rel_diff: float | None


def load(path: Path = DATA) -> dict[str, Any]:
    return json.loads(path.read_text())


def _curve(doc: Mapping[str, Any], case: str, env: str) -> dict[int, float | None]:
    return {int(k): v for k, v in doc["cases"][case]["curves"][env]["lm_loss"].items()}


def _cut(curve: Mapping[int, float | None], last: int | None) -> dict[int, float | None]:
    return {s: v for s, v in curve.items() if last is None or s <= last}


def pairs(doc: Mapping[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """(kind, baseline case, baseline env, candidate case, candidate env)."""
    out = []
    for case, c in sorted(doc["cases"].items()):
        envs = sorted(c["curves"])
        if len(envs) >= 3:
            out.append(("environment", case, envs[0], case, envs[1]))
    out += [("layout", r["baseline"], r["env"], r["candidate"], r["env"]) for r in doc["layout_pairs"]]
    out += [("objective", r["baseline"], r["env"], r["candidate"], r["env"]) for r in doc["objective_pairs"]]
    return out


def evaluate(doc: Mapping[str, Any] | None = None) -> list[PairVerdict]:
    doc = doc or load()
    rows = []
    for kind, a, ea, b, eb in pairs(doc):
        for cut_name, last in CUTS.items():
            base, cand = _cut(_curve(doc, a, ea), last), _cut(_curve(doc, b, eb), last)
            common_last = min(max(base), max(cand))
            base, cand = _cut(base, common_last), _cut(cand, common_last)  # compare the steps both cover
            reps = [(f"{a}@{e}", "environment", _cut(_curve(doc, a, e), common_last))
                    for e in sorted(doc["cases"][a]["curves"]) if e not in (ea, eb)]
            cfg = config_for(precision_of(doc["cases"][a]["args"]))
            g = judge(base, cand, replicates=reps, noise_config=cfg)
            ref, na = g.reference, g.noise_aware
            rels = [abs((cand[s] - base[s]) / base[s]) for s in na.steps if base[s]]  # type: ignore[operator]
            rows.append(PairVerdict(
                kind=kind, baseline=a, candidate=b, env=ea if ea == eb else f"{ea} vs {eb}", cut=cut_name,
                steps=len(na.steps), replicates=len(reps), same_objective=EXPECTED[kind],
                reference=ref.passed,
                reference_why="pass" if ref.passed else ", ".join(ref.failed_checks or ["step sets differ"]),
                noise_aware=na.passed, noise_aware_why="pass" if na.passed else ", ".join(na.failed_checks or ["data"]),
                gate=g.passed, max_rel_diff=max(rels) if rels else None))
    return rows


def counts(rows: list[PairVerdict]) -> list[dict[str, Any]]:
    out = []
    for kind in EXPECTED:
        for cut in CUTS:
            sel = [r for r in rows if r.kind == kind and r.cut == cut]
            if not sel:
                continue
            out.append({"kind": kind, "cut": cut, "pairs": len(sel),
                        "reference_passes": sum(r.reference for r in sel),
                        "noise_aware_passes": sum(r.noise_aware for r in sel),
                        "gate_passes": sum(r.gate for r in sel),
                        "expected": "pass" if EXPECTED[kind] else "reject"})
    return out


def format_counts(rows: list[PairVerdict]) -> str:
    lines = ["| pairs | cut | n | expected | reference rule passes | noise-aware passes | layer 2 (combined) passes |",
             "|---|---|---|---|---|---|---|"]
    for c in counts(rows):
        lines.append(f"| {c['kind']} | {c['cut']} | {c['pairs']} | {c['expected']} | {c['reference_passes']} | "
                     f"{c['noise_aware_passes']} | {c['gate_passes']} |")
    return "\n".join(lines)


def format_rows(rows: list[PairVerdict]) -> str:
    lines = ["| kind | baseline | candidate | machine | cut | steps | envelope runs | max diff | reference | "
             "noise-aware | layer 2 |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md = "-" if r.max_rel_diff is None else f"{r.max_rel_diff:.2%}"
        lines.append(f"| {r.kind} | {r.baseline} | {r.candidate} | {r.env} | {r.cut} | {r.steps} | {r.replicates} | "
                     f"{md} | {r.reference_why} | {r.noise_aware_why} | {'pass' if r.gate else 'reject'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="both convergence verdicts on real public loss curves")
    ap.add_argument("--rows", action="store_true", help="also print every pair")
    ap.add_argument("--json", action="store_true")
    ns = ap.parse_args(argv)
    rows = evaluate()
    if ns.json:
        print(json.dumps({"counts": counts(rows), "rows": [r.model_dump() for r in rows]}, indent=1))
        return 0
    print(format_counts(rows))
    if ns.rows:
        print()
        print(format_rows(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
