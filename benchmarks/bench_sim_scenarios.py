"""Simulated scenarios the tuners were not developed on: how much of the best gain does each ship?

Generates N scenarios deterministically from a seed: a model of the simulator's catalog
(`attune.knowledge.layouts.load_models`, tinygpt excepted), an accelerator (`attune.sim.hardware`), a
cluster size, a workload (sequence length, global batch) and a starting recipe: a feasible layout
(`enumerate_layouts`) with a recomputation setting that the noise-free estimate says runs, with a step
shorter than the control plane's hang timeout (else calibration is killed as a hang), drawn at random, so the baseline is not a published recipe. Each scenario's campaign searches the same generic
space (TP, PP, EP for MoE models, CP, recomputation granularity) under the generic
Megatron correctness list (`gate/lists/megatron.yaml`).

Per scenario:
- best: an exhaustive sweep of the space through the noise-free estimate (`attune.sim.estimate`), each
  point made coherent by the same argument rules every tuner uses (`attune.tuners.coherent`) and kept
  only where the correctness list accepts it (`gate.config_check.check_recipe`): the best gain over the
  estimated baseline;
- a whole `attune tune` campaign (in process, concurrency 1, sim seed from the scenario) with the
  heuristic and with tpe-prefilter: the shipped gain (the report's re-measured gain) and the share of the
  budget charged (without the final re-measurement, which the plane charges outside the budget).

Prints per scenario the best gain, the heuristic's shipped gain, their ratio, tpe-prefilter's shipped
gain, the budget fractions, and the averages. Targets (issue 23): heuristic >= 80% of the best on
average, >= tpe-prefilter, <= 50% of the budget. The simulated cluster is a test bed, not real GPUs.

    python benchmarks/bench_sim_scenarios.py [--seed 7] [--scenarios 10] [--tuners heuristic tpe-prefilter]
        [--jobs N] [--json] [--table earlier.json]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import itertools
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TP, PP, EP = "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--expert-model-parallel-size"
CP, ETP, RG = "--context-parallel-size", "--expert-tensor-parallel-size", "--recompute-granularity"
DISPATCH = "--moe-token-dispatcher-type"
ACCELERATORS = ("H100", "H200", "B200")
CLUSTERS = (16, 32, 64, 128)
BAND_FLOOR = 0.03  # every scenario campaign's band floor


def _recompute(gran: str) -> dict[str, Any]:
    if gran == "full":
        return {RG: "full", "--recompute-method": "uniform", "--recompute-num-layers": 1}
    return {RG: "selective"}


def _baseline_args(model: Any, lay: Any, seq: int, gbs: int, gran: str) -> dict[str, Any]:
    args: dict[str, Any] = {
        "--num-layers": model.layers, "--seq-length": seq, "--micro-batch-size": 1, "--global-batch-size": gbs,
        "--train-iters": 14, TP: lay.tp, PP: lay.pp, CP: lay.cp, "--bf16": True,
        "--use-distributed-optimizer": True, "--log-interval": 1, "--log-throughput": True,
        "--make-vocab-size-divisible-by": 8,  # the padded vocabulary stays the same at any TP up to 8
        "--lr": 1.0e-5, "--seed": 1234, "--data-path": "synthetic", **_recompute(gran)}
    if lay.tp > 1:
        args["--sequence-parallel"] = True
    if lay.split is not None and lay.split.kind != "even":
        for text in lay.split.flags():
            name, _, val = text.partition("=")
            args[name] = int(val) if val else True
    if model.is_moe:
        args.update({EP: lay.ep or 1, ETP: 1, DISPATCH: "alltoall", "--moe-grouped-gemm": True})
    return args


def _space(model: Any, args: dict[str, Any]) -> dict[str, list[Any]]:
    """The generic space, with the starting recipe's own values added (a tuner starts from them)."""
    space: dict[str, list[Any]] = {TP: [1, 2, 4, 8], PP: [1, 2, 4, 8, 16], CP: [1, 2], RG: ["selective", "full"]}
    if model.is_moe:
        space[EP] = [e for e in (1, 2, 4, 8, 16, 32) if model.experts % e == 0]
    for k in (TP, PP, CP, EP):
        if k in space and args.get(k) not in space[k]:
            space[k] = sorted({*space[k], args[k]})
    return space


def make_scenarios(seed: int, n: int) -> list[dict[str, Any]]:
    """N scenarios, each with a starting recipe the noise-free estimate says runs (module doc)."""
    from attune.control.spec import ControlSettings
    from attune.knowledge.layouts import LayoutError, LayoutOptions, enumerate_layouts, load_models
    from attune.sim.constants import DEFAULT as SIM_CONSTANTS
    from attune.sim.estimate import estimate
    from attune.sim.run import SimSettings

    # A step that outlasts the hang watchdog (the control plane's, the simulated cluster's) never logs
    # progress in time: such a baseline cannot be calibrated, so it is not a scenario. Step 0 is the
    # longest (the simulator's warm-up factor); a margin for its noise.
    hang_s = min(float(ControlSettings.model_fields["hang_timeout_s"].default),
                 float(SimSettings.model_fields["hang_kill_s"].default)) * 0.8 / (1.0 + SIM_CONSTANTS.warmup_step0)

    rng = random.Random(seed)
    models = [m for m in load_models().values() if m.name != "tinygpt"]
    out: list[dict[str, Any]] = []
    tries = 0
    while len(out) < n and tries < 400 * n:
        tries += 1
        model = models[len(out) % len(models)] if rng.random() < 0.5 else rng.choice(models)
        acc, gpus = rng.choice(ACCELERATORS), rng.choice(CLUSTERS)
        seq, gbs = rng.choice((4096, 8192)), rng.choice((256, 512, 1024))
        try:
            lays = enumerate_layouts(model, LayoutOptions(gpus=gpus, gpus_per_node=8, seq_length=seq,
                                                          global_batch=gbs, allowed={"vp": {1}, "etp": {1}}))
        except LayoutError:
            continue
        rng.shuffle(lays)
        for rep in lays[:12]:
            gran = rng.choice(("selective", "full"))
            args = _baseline_args(model, rep.layout, seq, gbs, gran)
            e = estimate(model.name, acc, gpus, args, {"CUDA_DEVICE_MAX_CONNECTIONS": "1"})
            if e.outcome == "ok" and e.tokens_per_s_per_gpu and e.step is not None and e.step.seconds < hang_s:
                out.append({"id": f"s{len(out) + 1:02d}", "model": model.name, "accelerator": acc, "gpus": gpus,
                            "seq": seq, "gbs": gbs, "args": args, "space": _space(model, args),
                            "sim_seed": rng.randrange(1, 10**6)})
                break
    return out


def campaign_yaml(sc: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": f"scenario-{sc['id']}", "model": sc["model"], "framework": "megatron-lm",
        "cluster": {"backend": "sim", "gpus": sc["gpus"], "gpus_per_node": 8, "accelerator": sc["accelerator"],
                    "settings": {"model": sc["model"], "accelerator": sc["accelerator"],
                                 "nodes": max(1, sc["gpus"] // 8) + 2, "seed": sc["sim_seed"],
                                 "throughput_noise": 0.0095, "startup_s": 381, "infra_fault_rate": 0.0}},
        "baseline": {"command": ["torchrun", "--nnodes", "{nodes}", "--nproc-per-node", "{gpus_per_node}",
                                 "pretrain_gpt.py"],
                     "args": sc["args"], "env": {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}},
        "workload": {"seq_length": sc["seq"], "global_batch": sc["gbs"], "precision": "bf16",
                     "steps_per_run": 14, "window": [4, 13]},
        "budget": {"check_reserve_runs": 3, "concurrency": 1},
        "calibration": {"runs": 5}, "band": {"floor": BAND_FLOOR, "k_sigma": 3.0},
        "gate": {"lists": "megatron", "convergence_steps": 20},
        "search_space": sc["space"], "control": {"poll_interval_s": 0.02},
    }


def sweep(d: Path) -> dict[str, Any]:
    """Every point of the space, coherent and gate-accepted, through the noise-free estimate: the best gain."""
    from attune.control.plane import load_gate_list
    from attune.control.spec import load_spec
    from attune.sim.estimate import estimate
    from attune.tuners.coherent import coherent_changes, full_args
    from gate.config_check import check_recipe

    spec = load_spec(d / "campaign.yaml")
    loaded = load_gate_list(spec, d, None)
    base = {k: v for k, v in spec.baseline.args.items() if v not in (None, False)}
    env = dict(spec.baseline.env or {})

    def tps(args: dict[str, Any]) -> float | None:
        e = estimate(spec.model, spec.cluster.accelerator, spec.cluster.gpus, args, env, gpus_per_node=8)
        return e.tokens_per_s_per_gpu if e.outcome == "ok" else None

    t0 = tps(base)
    assert t0, "the scenario's baseline must run"
    keys = list(spec.search_space)
    best, best_changes, points, accepted, running = 0.0, {}, 0, 0, 0
    seen: set[str] = set()
    for combo in itertools.product(*(spec.search_space[k] for k in keys)):
        changes = {k: v for k, v in zip(keys, combo, strict=True) if str(base.get(k)) != str(v)}
        fixed = coherent_changes(spec, changes)
        key = json.dumps(fixed, sort_keys=True, default=str)
        if key in seen:
            continue
        seen.add(key)
        points += 1
        args = full_args(base, fixed)
        if not check_recipe(loaded, base, args, env, env).passed:
            continue
        accepted += 1
        t = tps(args)
        if t is None:
            continue
        running += 1
        if t / t0 - 1.0 > best:
            best, best_changes = t / t0 - 1.0, fixed
    return {"best": best, "best_changes": best_changes, "points": points, "accepted": accepted, "running": running}


def campaign(d: Path, tuner: str) -> dict[str, Any]:
    from attune.app import report
    from attune.app.campaign_runner import CampaignRunner, RunnerError
    from attune.core.state import load

    failed: str | None = None
    try:
        failed = CampaignRunner(d, tuner, seed=1, say=None, transport="in-process", knob_space=False).run().failed
    except RunnerError as exc:
        failed = str(exc)
    st, _ = load(d)
    h = report.build(d).headline.__dict__
    total = st.budget.total or 0.0
    return {"gain": h["gain"] or 0.0, "budget_fraction": (st.budget.charged / total) if total else None,
            "launches": h["launches"], "stop": (st.stop or {}).get("diagnosis"), "failed": failed}


def run_scenario(sc: dict[str, Any], tuners: list[str], root: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    base = Path(root) / sc["id"]
    out: dict[str, Any] = {k: sc[k] for k in ("id", "model", "accelerator", "gpus", "seq", "gbs")}
    out["baseline_layout"] = {k.strip("-").split("-")[0]: sc["args"].get(k) for k in (TP, PP, EP, CP, RG)}
    doc = campaign_yaml(sc)
    first = base / "sweep"
    first.mkdir(parents=True)
    (first / "campaign.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    out.update(sweep(first))
    for tuner in tuners:
        d = base / tuner
        d.mkdir(parents=True)
        (d / "campaign.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        out[tuner] = campaign(d, tuner)
    out["wall_s"] = time.perf_counter() - t0
    return out


def _pct(v: float | None, width: int, sign: bool = False) -> str:
    return f"{'-':>{width}s}" if v is None else (f"{v:+{width}.1%}" if sign else f"{v:{width}.0%}")


def _mean(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.fmean(got) if got else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--scenarios", type=int, default=10)
    ap.add_argument("--tuners", nargs="+", default=["heuristic", "tpe-prefilter"])
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--table", type=Path, help="print the table of an earlier --json output instead of running")
    ns = ap.parse_args()
    if ns.scenarios < 1:
        print("--scenarios: must be at least 1", file=sys.stderr)
        return 2
    if ns.table is not None:
        doc = json.loads(ns.table.read_text())
        ns.seed, ns.json = doc["seed"], False
        ns.tuners = [t for t in ("heuristic", "tpe-prefilter", "tpe", "random") if t in doc["rows"][0]]
        return _print(doc["rows"], ns)
    scenarios = make_scenarios(ns.seed, ns.scenarios)
    shm = Path("/dev/shm")
    root = tempfile.mkdtemp(prefix="bench-scen-", dir=str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None)
    try:  # the campaign directories live in memory (/dev/shm): hundreds of MB per scenario, removed at the end
        if ns.jobs > 1:
            with cf.ProcessPoolExecutor(max_workers=ns.jobs) as pool:
                rows = list(pool.map(run_scenario, scenarios, [ns.tuners] * len(scenarios), [root] * len(scenarios)))
        else:
            rows = [run_scenario(sc, ns.tuners, root) for sc in scenarios]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return _print(rows, ns)


def _print(rows: list[dict[str, Any]], ns: argparse.Namespace) -> int:
    h, other = ns.tuners[0], (ns.tuners[1] if len(ns.tuners) > 1 else None)
    for r in rows:
        r["ratio"] = (r[h]["gain"] / r["best"]) if r["best"] > 0 else None
    if ns.json:
        print(json.dumps({"seed": ns.seed, "rows": rows}, indent=1, default=str))
        return 0
    print(f"{len(rows)} simulated scenarios (seed {ns.seed}); best = exhaustive noise-free sweep of gate-accepted "
          "recipes; gains are shipped (re-measured) gains; budget = share of the campaign budget charged")
    hdr = f"{'id':4s} {'model':15s} {'acc':4s} {'gpus':>4s} {'baseline (tp,pp,ep,cp,rc)':27s} {'best':>7s} " \
          f"{h[:9]:>9s} {'ratio':>6s} {'budget':>6s}"
    if other:
        hdr += f" {other[:13]:>13s} {'budget':>6s}"
    print(hdr)
    for r in rows:
        b = r["baseline_layout"]
        lay = f"{b['tensor']},{b['pipeline']},{b.get('expert') or '-'},{b['context']},{str(b['recompute'])[:4]}"
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
        line = (f"{r['id']:4s} {r['model']:15s} {r['accelerator']:4s} {r['gpus']:4d} {lay:27s} {_pct(r['best'], 7, True)} "
                f"{_pct(r[h]['gain'], 9, True)} {ratio:>6s} {_pct(r[h]['budget_fraction'], 6)}")
        if other:
            line += f" {_pct(r[other]['gain'], 13, True)} {_pct(r[other]['budget_fraction'], 6)}"
        print(line)
    ratios: list[float | None] = [r["ratio"] for r in rows]
    mean_best = statistics.fmean(r["best"] for r in rows)
    mean_h = statistics.fmean(r[h]["gain"] for r in rows)
    mr = _mean(ratios)
    avg = (f"mean {'':49s} {mean_best:+7.1%} {mean_h:+9.1%} {'-' if mr is None else f'{mr:.2f}':>6s} "
           f"{_pct(_mean([r[h]['budget_fraction'] for r in rows]), 6)}")
    if other:
        avg += (f" {statistics.fmean(r[other]['gain'] for r in rows):+13.1%} "
                f"{_pct(_mean([r[other]['budget_fraction'] for r in rows]), 6)}")
    print(avg)
    # A best gain below the band's floor cannot be told from noise by any tuner: such a scenario has no
    # shippable gain, and its ratio says nothing of the tuner (listed, and left out of this second mean).
    floor = BAND_FLOOR
    sub = [r["id"] for r in rows if r["best"] < floor]
    shippable = [r["ratio"] for r in rows if r["best"] >= floor]
    ms = _mean(shippable)
    print(f"scenarios whose best is below the band floor ({floor:.0%}): {', '.join(sub) or 'none'}; mean ratio over "
          f"the other {len(shippable)}: {'-' if ms is None else f'{ms:.2f}'}")
    print(f"heuristic / best, mean of gains: {mean_h / mean_best if mean_best > 0 else float('nan'):.2f}; "
          f"own stops: {sum('nothing more' in (r[h]['stop'] or '') for r in rows)}/{len(rows)}; "
          f"failed campaigns: {sum(1 for r in rows for t in ns.tuners if r[t]['failed'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
