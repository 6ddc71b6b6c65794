"""The simulated landscape a black-box tuner draws from: Table E1's knob space, drawn uniformly.

Draws knob values uniformly from a model's frozen Table E1 space (`attune.tuners.knobs`), turns each
into its recipe with the launcher's co-changes, and runs the noise-free estimate (`attune.sim.estimate`)
on the example campaign: per draw the outcome (infeasible without a launch, out of memory, crash, ok)
and, where it runs, the gain over the simulated baseline. Prints the outcome counts, the share of
running draws above each gain, the same by (optimizer offload, rows per microbatch) where the space has
offload, and the draws the memory pre-filter admits. A whole campaign is `bench_sim_tuners.py`; this is
what its tuners search, in about a second. The simulated cluster is a test bed, not real GPUs.

    python benchmarks/sim_landscape.py [--model minimax-m2] [--draws 6000] [--seed 0] [--top 10]
"""

from __future__ import annotations

import argparse
import collections
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from attune.control.spec import load_spec  # noqa: E402
from attune.sim.estimate import estimate  # noqa: E402
from attune.tuners.knobs import Infeasible, knob_space  # noqa: E402

EXAMPLES = {
    "glm-4.5": ROOT / "examples" / "campaigns" / "glm45-128xb200",
    "minimax-m2": ROOT / "examples" / "campaigns" / "minimax-m2-64xb200",
}
THRESHOLDS = (0.0, 0.1, 0.3, 0.5, 1.0, 1.5)


def _share(gains: list[float]) -> str:
    n = len(gains)
    return "  ".join(f">{t:+.0%} {sum(g > t for g in gains) / n:.2f}" for t in THRESHOLDS) if n else "-"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="minimax-m2", choices=list(EXAMPLES))
    ap.add_argument("--draws", type=int, default=6000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--top", type=int, default=10, help="print the best running draws")
    ns = ap.parse_args()
    if ns.draws < 1:
        print("--draws: must be at least 1", file=sys.stderr)
        return 2
    spec = load_spec(EXAMPLES[ns.model] / "campaign.yaml")
    ks = knob_space(spec)
    prefilter = ks.prefilter()
    env = dict(spec.baseline.env or {})

    def run(args: dict) -> tuple[str, float | None]:
        e = estimate(spec.model, spec.cluster.accelerator, spec.cluster.gpus, args, env,
                     gpus_per_node=spec.cluster.gpus_per_node)
        return e.outcome, e.tokens_per_s_per_gpu

    _, base = run(ks.to_args({}))
    assert base, "the baseline must run"
    rng = random.Random(ns.seed)
    outcomes: collections.Counter[str] = collections.Counter()
    gains: list[float] = []
    admitted: list[float] = []
    by_group: dict[tuple, list[float]] = collections.defaultdict(list)
    best: list[tuple[float, dict]] = []
    for _ in range(ns.draws):
        draw = {k: rng.choice(v) for k, v in ks.space.items()}
        try:
            args = ks.to_args(draw)
        except Infeasible:
            outcomes["infeasible"] += 1
            continue
        outcome, tps = run(args)
        outcomes[outcome] += 1
        if outcome != "ok" or not tps:
            continue
        g = tps / base - 1.0
        gains.append(g)
        by_group[(draw.get("offload", "-"), draw.get("--micro-batch-size"))].append(g)
        if prefilter(draw) is None:
            admitted.append(g)
        best.append((g, draw))
    print(f"{ns.model}: {ns.draws} uniform draws of Table E1's space (seed {ns.seed}); simulated baseline "
          f"{base:.1f} tokens/s/GPU (noise-free)")
    print("outcomes:", dict(outcomes))
    print(f"running draws ({len(gains)}), share above a gain:  {_share(gains)}")
    print(f"running draws the pre-filter admits ({len(admitted)}):  {_share(admitted)}")
    for (off, mbs), gs in sorted(by_group.items(), key=lambda kv: (str(kv[0][0]), kv[0][1] or 0)):
        print(f"  offload {off:3s} rows {mbs!s:>3s} ({len(gs):4d}):  {_share(gs)}")
    for g, draw in sorted(best, key=lambda x: -x[0])[:ns.top]:
        short = {k.strip("-").replace("-model-parallel-size", "").replace("-parallel-size", ""): v for k, v in draw.items()}
        print(f"  {g:+.0%}  {short}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
