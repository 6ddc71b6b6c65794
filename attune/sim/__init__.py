"""The simulated GPU cluster: a test bed and evaluation harness, not a claim about real GPUs.

    from attune.sim import estimate
    est = estimate("glm-4.5", "B200", 128, flags)      # outcome, tokens/s/GPU, terms, memory
    est.outcome, est.tokens_per_s_per_gpu, est.step.terms, est.memory.peak

Modules: `recipe` (a Megatron command line, resolved), `steptime` (the step-time model and its
terms), `memory` (peak memory per stage), `defects` (how the world misbehaves), `loss` (loss
curves), `estimate` (all of it for one recipe), `run` (one job on the simulated clock, with its
Megatron-LM log), `kineto` (traces of profiled runs), `constants` (every assumed and fitted figure).
The fit to the paper's measured points is a side product in `attune.sim.paperfit`, which this package
never imports. The backend is `broker.backends.sim`; docs/sim.md has the details.
"""

from attune.sim.estimate import Estimate, estimate, estimate_recipe
from attune.sim.recipe import RecipeError, SimRecipe, build_recipe

__all__ = ["Estimate", "RecipeError", "SimRecipe", "build_recipe", "estimate", "estimate_recipe"]
