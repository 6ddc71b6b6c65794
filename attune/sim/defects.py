"""How the simulated world misbehaves: the stack defects of the paper's Table B1, and two more.

These are facts about the (simulated) stack, not the gate's knowledge of it: a configuration with a
defect hangs, crashes or silently changes training whether or not anything refuses it first. The ids
match the defect ids of the gate's correctness lists (`gate/lists/<model>.yaml`), so a test can check
that layer 1 refuses every defect the world has. Two behaviours come from the paper's Appendix E
rather than Table B1, and no list refuses them: the data-parallel overlaps hang on GLM-4.5 when
expert data parallelism exceeds 1 (the black-box launcher there turns them off), and DeepEP cannot
initialise across nodes on the paper's network (GLM-4.5 draws offered it within a node only;
MiniMax-M2 draws across nodes failed at start-up).

Effects:
- ``hang``: the job makes no progress from step 0; the NCCL watchdog aborts it after its timeout.
- ``stall``: a step takes longer than any deadline; the job is killed for making no progress.
- ``crash_start``: the job fails at start-up, before step 0.
- ``crash_step0``: the job fails in step 0.
- ``objective``: it runs, at normal speed, but trains something else: ``strong`` departs from the
  baseline's loss from the first step, ``subtle`` moves it by less than the convergence check's
  tolerance, ``aux_halved`` halves the load-balancing loss and leaves the language-model loss alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from attune.sim.recipe import SimRecipe

MOE_EVAL = ("mixtral-8x22b", "glm-4.5", "minimax-m2")


@dataclass(frozen=True)
class Defect:
    id: str
    models: tuple[str, ...]  # model names ("*": every model)
    effect: str  # hang | stall | crash_start | crash_step0 | objective
    detail: str  # for objective: strong | subtle | aux_halved
    message: str  # what the log shows
    source: str
    when: Callable[[SimRecipe], bool]

    def applies(self, r: SimRecipe) -> bool:
        return ("*" in self.models or r.model.name in self.models) and self.when(r)


DEFECTS: tuple[Defect, ...] = (
    Defect("fused-routing", MOE_EVAL, "objective", "subtle",
           "fused router kernel breaks exact BF16 ties differently; some tokens reach other experts",
           "ATTUNE paper, Table B1", lambda r: r.router_fusion),
    Defect("grad-accum-fusion-off", MOE_EVAL, "objective", "subtle",
           "gradient-accumulation fusion off adds a BF16 rounding where main gradients are FP32",
           "ATTUNE paper, Table B1", lambda r: not r.grad_accum_fusion),
    Defect("ep1-etp4", MOE_EVAL, "objective", "strong",
           "expert parallelism 1 with expert-tensor parallelism >= 4 silently changes training",
           "ATTUNE paper, Table B1", lambda r: r.ep == 1 and r.etp >= 4),
    Defect("cp8-virtual-stages", ("mixtral-8x22b",), "hang", "",
           "context parallelism 8 with virtual pipeline stages hangs at step 0",
           "ATTUNE paper, Table B1", lambda r: r.cp == 8 and r.vp > 1),
    Defect("cp-above-4", ("glm-4.5",), "stall", "",
           "context parallelism above 4: a step outlasts any job deadline",
           "ATTUNE paper, Table B1", lambda r: r.cp > 4),
    Defect("tp16", ("minimax-m2",), "crash_step0", "",
           "RuntimeError: tensor parallelism 16 cannot run this model (Transformer Engine RMSNorm on the gathered query)",
           "ATTUNE paper, Table B1", lambda r: r.tp == 16),
    Defect("mbs-above-32", ("minimax-m2",), "crash_step0", "",
           "RuntimeError: Transformer Engine RMSNorm: the tensor-parallel-gathered query exceeds 2^31 elements",
           "ATTUNE paper, Table B1", lambda r: r.mbs > 32),
    Defect("pp32", ("glm-4.5",), "objective", "aux_halved",
           "pipeline parallelism 32 halves the load-balancing loss; the language-model loss is unchanged",
           "ATTUNE paper, Table B1", lambda r: r.pp == 32),
    Defect("dp-overlap-edp", ("glm-4.5",), "hang", "",
           "data-parallel overlaps with expert data parallelism > 1 hang at step 0 (the stack's re-entry bug)",
           "ATTUNE paper, Appendix E (the launcher turns the overlaps off)",
           lambda r: r.edp > 1 and (r.overlap_grad_reduce or r.overlap_param_gather)),
)

DEEPEP_INTERNODE = Defect(
    "deepep-internode", ("*",), "crash_start", "",
    "RuntimeError: DeepEP: failed to initialise internode buffers (NVSHMEM/IBGDA unavailable on this network)",
    "ATTUNE paper, Appendix E (DeepEP cannot initialise across nodes on the paper's network)",
    lambda r: r.deepep and r.ep_nodes > 1,
)


def defects_for(r: SimRecipe, deepep_internode: bool = False) -> list[Defect]:
    """The world's defects this recipe hits, in the order they would strike."""
    hits = [d for d in DEFECTS if d.applies(r)]
    if not deepep_internode and DEEPEP_INTERNODE.applies(r):
        hits.insert(0, DEEPEP_INTERNODE)
    order = {"crash_start": 0, "crash_step0": 1, "hang": 2, "stall": 3, "objective": 4}
    return sorted(hits, key=lambda d: order[d.effect])
