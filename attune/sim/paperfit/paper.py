"""The ATTUNE paper's measured points that the simulator is fitted to and checked against.

Each point is a recipe given as changes to one of the example campaigns' baselines
(`examples/campaigns/*`), with what the paper reports for it on its stack: tokens/s/GPU, or the
outcome (out of memory). Sources: Table 1 (public recipes), Table F1 (one GLM-4.5 campaign's
launches), Tables D2 and D3 (every shipped recipe the simulator can express), Table A2 (what the
baselines needed to fit). Table 2's figures are means of Tables D2/D3's ATTUNE rows, so they are
not separate points. `calibration` marks the four public recipes; `shipped` the recipes a campaign
shipped (they must rank above their public recipe); the rest are search-time points, some stopped
early (the agent's estimate, marked ~ in the paper).

`split` says how a point is used: `fit` points enter `benchmarks/fit_sim.py`'s loss; `holdout`
points never do and check the fit. The held-out subset is every recipe of the arms outside the
paper's Table 3 comparison of ATTUNE against the black-box tuners, that is the ablation arms of
Table 4 (multi-agent committee, public-guide catalog, minimal skill) and OptiCo, plus the runs of
Table F1 the agent stopped early (its own estimates, the least precise values in the paper). They
were chosen by arm, before looking at the simulator's errors, and they test what the fitted points
do not pin down alone: DeepEP without recomputation, the shared-expert overlap, cross-entropy
fusion, DeepEP and context parallelism at TP 1, a different pipeline split. Repeated measurements
of a fitted configuration by another arm (GLM-4.5's PP 4 recipe, shipped by three campaigns) are
held out too: they check noise, not the fit.

`TUNER_RESULTS` holds Table 3's black-box rows (the tuners' mean gains over three campaigns). They
are not a point's throughput: `benchmarks/bench_sim_tuners.py` measures them by running the tuners
on the simulator, and the fit table reports them as checked (not in the loss: one evaluation runs
18 campaigns).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from attune.sim.recipe import ArgValue

ROOT = Path(__file__).resolve().parents[3]
CAMPAIGNS = {
    "glm-4.5": ROOT / "examples" / "campaigns" / "glm45-128xb200",
    "llama-3.1-405b": ROOT / "examples" / "campaigns" / "llama31-405b-128xb200",
    "mixtral-8x22b": ROOT / "examples" / "campaigns" / "mixtral-8x22b-128xh100",
    "minimax-m2": ROOT / "examples" / "campaigns" / "minimax-m2-64xb200",
}
PUBLIC_TPS = {"glm-4.5": 723.6, "llama-3.1-405b": 397.3, "mixtral-8x22b": 1072.4, "minimax-m2": 895.2}


@dataclass(frozen=True)
class PaperPoint:
    model: str
    label: str
    changes: dict[str, ArgValue] = field(default_factory=dict)
    tps: float | None = None  # tokens/s/GPU the paper reports (None: an outcome only)
    outcome: str = "ok"  # ok | oom
    kind: str = "search"  # calibration | shipped | search | early (stopped early: an estimate)
    source: str = ""
    disagreement: str | None = None  # where the simulator is known to disagree, and why (docs/sim.md)
    split: str = "fit"  # fit | holdout (see the module doc)

    @property
    def table(self) -> str:
        """The paper's table the point comes from ("Table D2", "Table A2", ...)."""
        return self.source.split(" (")[0]


@dataclass(frozen=True)
class TunerResult:
    """One row of the paper's Table 3: a black-box tuner's means over three campaigns."""

    model: str
    tuner: str  # as `benchmarks/bench_sim_tuners.py` names it
    gain: float  # mean gain of the shipped recipe over the public recipe
    gpu_hours: float
    launches: float
    failed_share: float
    failed_gpu_hours: float
    source: str = "Table 3"


# Recurring change sets
_DEEPEP = {"--moe-token-dispatcher-type": "flex", "--moe-flex-dispatcher-backend": "deepep",
           "--moe-shared-expert-overlap": None}
_DP_OFF = {"--overlap-grad-reduce": None, "--overlap-param-gather": None}
_DP_ON = {"--overlap-grad-reduce": True, "--overlap-param-gather": True}
_FULL = {"--recompute-granularity": "full", "--recompute-method": "uniform", "--recompute-num-layers": 1}
_NO_REC = {"--recompute-granularity": None, "--recompute-method": None, "--recompute-num-layers": None,
           "--recompute-modules": None}
# (the offload fraction stays as the baseline gives it: without --optimizer-cpu-offload it is unused)
_OFFLOAD_OFF = {"--optimizer-cpu-offload": None, "--overlap-cpu-optimizer-d2h-h2d": None}


def _split(first: int | None, last: int | None) -> dict[str, ArgValue]:
    return {"--decoder-first-pipeline-num-layers": first, "--decoder-last-pipeline-num-layers": last}


def _tp1() -> dict[str, ArgValue]:
    return {"--tensor-model-parallel-size": 1, "--sequence-parallel": None, "--tp-comm-overlap": None}


G, L, X, M = "glm-4.5", "llama-3.1-405b", "mixtral-8x22b", "minimax-m2"

POINTS: tuple[PaperPoint, ...] = (
    # ---- the public recipes (Table 1, "our stack")
    PaperPoint(G, "public recipe", {}, 723.6, kind="calibration", source="Table 1"),
    PaperPoint(L, "public recipe", {}, 397.3, kind="calibration", source="Table 1"),
    PaperPoint(X, "public recipe", {}, 1072.4, kind="calibration", source="Table 1"),
    PaperPoint(M, "public recipe", {}, 895.2, kind="calibration", source="Table 1"),
    # ---- GLM-4.5 (Tables D2, F1)
    PaperPoint(G, "ATTUNE 1: PP16 EP8 4/4 DeepEP", {"--pipeline-model-parallel-size": 16,
               "--expert-model-parallel-size": 8, **_split(4, 4), **_DEEPEP}, 885.7, kind="shipped", source="Table D2"),
    PaperPoint(G, "ATTUNE 2: TP1 PP16 EP8 VP2 4/4 full", {**_tp1(), "--pipeline-model-parallel-size": 16,
               "--expert-model-parallel-size": 8, "--num-virtual-stages-per-pipeline-rank": 2, **_split(4, 4), **_FULL},
               1119.3, kind="shipped", source="Table D2"),
    PaperPoint(G, "ATTUNE 3: EP8 DeepEP, DP overlaps off", {"--expert-model-parallel-size": 8, **_DEEPEP, **_DP_OFF},
               902.1, kind="shipped", source="Table D2"),
    PaperPoint(G, "BO 1: PP4 even, DP overlaps off", {"--pipeline-model-parallel-size": 4, **_split(None, None),
               **_DP_OFF}, 762.8, kind="shipped", source="Table D2"),
    PaperPoint(G, "random 2: TP1 EP8 CP2 VP2, no recompute", {**_tp1(), "--expert-model-parallel-size": 8,
               "--context-parallel-size": 2, "--num-virtual-stages-per-pipeline-rank": 2, **_NO_REC, **_DP_OFF},
               892.8, kind="shipped", source="Table D2"),
    PaperPoint(G, "BO+pre-filter 1: PP4 even, DP overlaps off", {"--pipeline-model-parallel-size": 4,
               **_split(None, None), **_DP_OFF}, 765.6, kind="shipped", source="Table D2", split="holdout"),
    PaperPoint(G, "BO+pre-filter 3: PP4 even, DP overlaps off", {"--pipeline-model-parallel-size": 4,
               **_split(None, None), **_DP_OFF}, 766.8, kind="shipped", source="Table D2", split="holdout"),
    PaperPoint(G, "committee 1: shared-expert overlap off", {"--moe-shared-expert-overlap": None}, 763.3,
               kind="shipped", source="Table D2", split="holdout"),
    PaperPoint(G, "committee 2: TP1 PP16 EP8 4/4 full x2", {**_tp1(), "--pipeline-model-parallel-size": 16,
               "--expert-model-parallel-size": 8, **_split(4, 4), **_FULL, "--recompute-num-layers": 2}, 1126.7,
               kind="shipped", source="Table D2", split="holdout"),
    PaperPoint(G, "committee 3: EP8 DeepEP, DP overlaps off", {"--expert-model-parallel-size": 8, **_DEEPEP, **_DP_OFF},
               896.2, kind="shipped", source="Table D2", split="holdout"),
    PaperPoint(G, "public guide 1: EP8 no recompute DeepEP", {"--expert-model-parallel-size": 8, **_NO_REC, **_DEEPEP,
               **_DP_OFF}, 931.2, kind="shipped", source="Table D2", split="holdout"),
    PaperPoint(G, "public guide 2: EP8 no recompute DeepEP", {"--expert-model-parallel-size": 8, **_NO_REC, **_DEEPEP,
               **_DP_OFF}, 937.8, kind="shipped", source="Table D2", split="holdout"),
    PaperPoint(G, "public guide 3: EP8 no recompute DeepEP", {"--expert-model-parallel-size": 8, **_NO_REC, **_DEEPEP,
               **_DP_OFF}, 933.2, kind="shipped", source="Table D2", split="holdout"),
    PaperPoint(G, "minimal skill 1: EP8 no recompute DeepEP 48 SMs", {"--expert-model-parallel-size": 8, **_NO_REC,
               **_DEEPEP, "--moe-deepep-num-sms": 48, **_DP_OFF}, 955.7, kind="shipped", source="Table D2",
               split="holdout"),
    PaperPoint(G, "minimal skill 2: EP8 no recompute DeepEP", {"--expert-model-parallel-size": 8, **_NO_REC,
               **_DEEPEP, **_DP_OFF}, 938.2, kind="shipped", source="Table D2", split="holdout"),
    PaperPoint(G, "F1 pp16ep8", {"--pipeline-model-parallel-size": 16, "--expert-model-parallel-size": 8,
               **_split(4, 4)}, 707.6, source="Table F1"),
    PaperPoint(G, "F1 tp1pp8", _tp1(), None, outcome="oom", source="Table F1"),
    PaperPoint(G, "F1 tp1pp16", {**_tp1(), "--pipeline-model-parallel-size": 16, "--expert-model-parallel-size": 8,
               **_split(4, 4)}, None, outcome="oom", source="Table F1"),
    PaperPoint(G, "F1 tp1pp16fr", {**_tp1(), "--pipeline-model-parallel-size": 16, "--expert-model-parallel-size": 8,
               **_split(4, 4), **_FULL}, 1072.7, source="Table F1"),
    PaperPoint(G, "F1 tp1pp8fr", {**_tp1(), **_FULL}, 668.0, kind="early", source="Table F1", split="holdout"),
    PaperPoint(G, "F1 tp1pp16s53", {**_tp1(), "--pipeline-model-parallel-size": 16, "--expert-model-parallel-size": 8,
               **_split(5, 3), **_FULL}, 1083.0, kind="early", source="Table F1", split="holdout"),
    PaperPoint(G, "F1 tp1pp16dep", {**_tp1(), "--pipeline-model-parallel-size": 16, "--expert-model-parallel-size": 8,
               **_split(4, 4), **_FULL, **_DEEPEP}, 1022.0, kind="early", source="Table F1", split="holdout"),
    PaperPoint(G, "F1 tp1pp16vpp2", {**_tp1(), "--pipeline-model-parallel-size": 16, "--expert-model-parallel-size": 8,
               "--num-virtual-stages-per-pipeline-rank": 2, **_split(4, 4), **_FULL}, 1090.3, source="Table F1"),
    PaperPoint(G, "F1 tp1pp16cp2", {**_tp1(), "--pipeline-model-parallel-size": 16, "--expert-model-parallel-size": 8,
               **_split(4, 4), **_FULL, "--context-parallel-size": 2}, 602.0, kind="early", source="Table F1",
               split="holdout"),
    # ---- MiniMax-M2 (Table D3, Table A2)
    PaperPoint(M, "ATTUNE 1: TP1 PP4 15/15 MBS2 DP on, no offload", {**_tp1(), "--pipeline-model-parallel-size": 4,
               **_split(15, 15), "--micro-batch-size": 2, **_DP_ON, **_OFFLOAD_OFF}, 2423.1, kind="shipped",
               source="Table D3"),
    PaperPoint(M, "ATTUNE 2: PP8 7/7 MBS4, no offload", {"--pipeline-model-parallel-size": 8, **_split(7, 7),
               "--micro-batch-size": 4, **_OFFLOAD_OFF}, 2235.8, kind="shipped", source="Table D3"),
    PaperPoint(M, "ATTUNE 3: TP1 PP8 VP2 8/6 block 2, no offload", {**_tp1(), "--pipeline-model-parallel-size": 8,
               "--num-virtual-stages-per-pipeline-rank": 2, **_split(8, 6), "--recompute-method": "block",
               "--recompute-num-layers": 2, **_OFFLOAD_OFF}, 2434.4, kind="shipped", source="Table D3"),
    PaperPoint(M, "OptiCo 1: TP1, DP on, CE fusion", {**_tp1(), **_DP_ON, "--cross-entropy-loss-fusion": True},
               1092.0, kind="shipped", source="Table D3", split="holdout"),
    PaperPoint(M, "OptiCo 2: TP1, DP on, CE fusion", {**_tp1(), **_DP_ON, "--cross-entropy-loss-fusion": True},
               1114.6, kind="shipped", source="Table D3", split="holdout"),
    PaperPoint(M, "OptiCo 3: MBS2, DP on, CE fusion", {"--micro-batch-size": 2, **_DP_ON,
               "--cross-entropy-loss-fusion": True}, 1080.5, kind="shipped", source="Table D3", split="holdout"),
    PaperPoint(M, "BO 1: PP4 VP2 16/14 MBS2 DeepEP, no offload", {"--pipeline-model-parallel-size": 4,
               "--num-virtual-stages-per-pipeline-rank": 2, **_split(16, 14), "--micro-batch-size": 2, **_DEEPEP,
               **_OFFLOAD_OFF}, 1639.8, kind="shipped", source="Table D3"),
    PaperPoint(M, "BO 2: selective LayerNorm recompute", {"--recompute-granularity": "selective",
               "--recompute-method": None, "--recompute-num-layers": None, "--recompute-modules": "layernorm"},
               996.8, kind="shipped", source="Table D3"),
    PaperPoint(M, "BO 3: VP31, no offload", {"--num-virtual-stages-per-pipeline-rank": 31, **_OFFLOAD_OFF}, 1285.9,
               kind="shipped", source="Table D3"),
    PaperPoint(M, "BO+pre-filter 1: no offload", dict(_OFFLOAD_OFF), 1349.4, kind="shipped", source="Table D3"),
    PaperPoint(M, "BO+pre-filter 2: PP4 15/15, no offload", {"--pipeline-model-parallel-size": 4, **_split(15, 15),
               **_OFFLOAD_OFF}, 1384.1, kind="shipped", source="Table D3"),
    PaperPoint(M, "BO+pre-filter 3: TP1 PP8 EP4 CP2 7/7 MoE recompute DeepEP", {**_tp1(),
               "--pipeline-model-parallel-size": 8, "--expert-model-parallel-size": 4, "--context-parallel-size": 2,
               **_split(7, 7), "--recompute-granularity": "selective", "--recompute-method": None,
               "--recompute-num-layers": None, "--recompute-modules": "moe", **_DEEPEP, **_OFFLOAD_OFF}, 1441.2,
               kind="shipped", source="Table D3"),
    PaperPoint(M, "random 1: PP4 EP2 ETP2 CP2 15/15 MBS4 DeepEP, no offload", {"--pipeline-model-parallel-size": 4,
               "--expert-model-parallel-size": 2, "--expert-tensor-parallel-size": 2, "--context-parallel-size": 2,
               **_split(15, 15), "--micro-batch-size": 4, **_DEEPEP, **_OFFLOAD_OFF}, 961.8, kind="shipped",
               source="Table D3", disagreement="the simulator refuses DeepEP with expert-tensor parallelism 2 (its "
               "model of Megatron's argument check); the paper's stack ran it"),
    PaperPoint(M, "random 2: TP1 PP16 EP2 CP4 VP2 2/4 MBS2, no offload", {**_tp1(),
               "--pipeline-model-parallel-size": 16, "--expert-model-parallel-size": 2, "--context-parallel-size": 4,
               "--num-virtual-stages-per-pipeline-rank": 2, **_split(2, 4), "--micro-batch-size": 2, **_OFFLOAD_OFF},
               997.1, kind="shipped", source="Table D3"),
    PaperPoint(M, "random 3: TP1 PP4 EP4 15/15, no offload", {**_tp1(), "--pipeline-model-parallel-size": 4,
               "--expert-model-parallel-size": 4, **_split(15, 15), **_OFFLOAD_OFF}, 1605.9, kind="shipped",
               source="Table D3"),
    PaperPoint(M, "EP4 (offload on)", {"--expert-model-parallel-size": 4}, None, outcome="oom",
               source="Table A2 (EP 4 -> 8 to fit)"),
    # ---- Llama-3.1-405B (Table D3)
    PaperPoint(L, "ATTUNE 1: PP16 VP2 DP1", {"--pipeline-model-parallel-size": 16,
               "--num-virtual-stages-per-pipeline-rank": 2}, 444.7, kind="shipped", source="Table D3"),
    PaperPoint(L, "ATTUNE 2: VP2 16/14", {"--num-virtual-stages-per-pipeline-rank": 2,
               "--account-for-embedding-in-pipeline-split": None, "--account-for-loss-in-pipeline-split": None,
               **_split(16, 14)}, 415.3, kind="shipped", source="Table D3"),
    PaperPoint(L, "ATTUNE 3: VP4", {"--num-virtual-stages-per-pipeline-rank": 4}, 411.8, kind="shipped",
               source="Table D3"),
    # ---- Mixtral-8x22B (Table A2)
    PaperPoint(X, "no recompute", {"--recompute-granularity": None, "--recompute-modules": None}, None,
               outcome="oom", source="Table A2 (expert-activation recompute added to fit)"),
)

TUNER_RESULTS: tuple[TunerResult, ...] = (
    TunerResult(G, "tpe", 0.018, 1675, 19.7, 0.39, 186),
    TunerResult(G, "tpe-prefilter", 0.039, 1695, 13.7, 0.05, 58),
    TunerResult(G, "random", 0.078, 1688, 22.7, 0.51, 278),
    TunerResult(M, "tpe", 0.461, 492, 35.0, 0.53, 136),
    TunerResult(M, "tpe-prefilter", 0.555, 489, 22.7, 0.04, 23),
    TunerResult(M, "random", 0.327, 487, 38.0, 0.67, 202),
)


def points(model: str | None = None, kind: str | None = None, split: str | None = None) -> list[PaperPoint]:
    return [p for p in POINTS if (model is None or p.model == model) and (kind is None or p.kind == kind)
            and (split is None or p.split == split)]
