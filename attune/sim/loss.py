"""Loss curves of simulated runs: identical objectives give the same curve up to tiny noise.

The language-model loss of step k (0-based) is

    L(k) = L0 x (1 - d x (1 - exp(-k x lr_ratio x batch_ratio / tau)))   the slow decline of
                                                                          fine-tuning from the
                                                                          released weights
             x (1 + A x xi(rows of step k))                               the difficulty of the
                                                                          step's rows
             x (1 + departure(k))                                         what a changed objective
                                                                          does to it
             x (1 + eps_run(k))                                           run-to-run noise

`xi` is a deterministic standard normal drawn from the rows a step reads (the data path, the seed and
the global batch decide them), so every run that reads the same rows sees the same bumps; `eps_run`
(0.07%) is the nondeterminism of reductions and kernels, different in every run. Objective-preserving
changes (layouts, recomputation, dispatchers, overlaps) change nothing else, so their curves pass the
convergence check against the baseline's. The settings of `recipe.OBJECTIVE_FLAGS` act by their
value: the rows (data path, seed, global batch) and the decline (learning rate, tokens per step;
a learning rate more than 5x the reference makes the loss climb and wobble); a `subtle` setting's
value shifts the curve by tenths of a percent (the convergence check cannot see it), a `strong`
one by several percent with bumps of its own. The defects of `defects.py` depart from correct
training: `strong` from the first step (6% growing to 12%, with other bumps), `subtle` by a drift
of a few tenths of a percent. The MoE load-balancing loss is logged
next to it (`load_balancing_loss`), and `aux_halved` (GLM-4.5 at PP 32) halves only that.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass

from attune.sim.defects import Defect
from attune.sim.recipe import OBJECTIVE_FLAGS, SimRecipe

# Starting loss of each model on its campaign's rows (released weights, real text).
START_LOSS = {
    "llama-3.1-405b": 1.92,
    "mixtral-8x22b": 1.86,
    "glm-4.5": 2.31,
    "minimax-m2": 2.44,
    "qwen3-30b-a3b": 2.58,
    "gpt-oss-120b": 2.49,
}
DECLINE = 0.05
TAU_STEPS = 14.0
ROW_AMPLITUDE = 0.02
RUN_NOISE = 0.0007
REFERENCE_LR = 1e-6


def _normal(*key: object) -> float:
    h = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return random.Random(int.from_bytes(h, "big")).gauss(0.0, 1.0)


def _str(v: object) -> str:
    return "" if v is None else str(v)


@dataclass(frozen=True)
class LossModel:
    """The loss curve of one recipe; `run_key` seeds the run-to-run noise."""

    recipe: SimRecipe
    defects: tuple[Defect, ...] = ()

    def _rows_key(self) -> tuple[str, ...]:
        a = self.recipe.args
        return (self.recipe.model.name, _str(a.get("--data-path")), _str(a.get("--seed") or 1234),
                _str(a.get("--split")), str(self.recipe.gbs), str(self.recipe.seq))

    def _changes(self) -> list[tuple[str, str, str]]:
        """(flag, kind, value) of the objective-defining settings that act as a departure: the
        subtle and strong ones (data, batch and learning rate act through the rows and the decline)."""
        r = self.recipe
        out = []
        for flag, value in sorted(r.objective_settings().items()):
            kind = OBJECTIVE_FLAGS[flag]
            if kind not in ("subtle", "strong"):
                continue
            if flag == "--moe-router-topk" and _str(value) == str(r.model.topk):
                continue  # the model's own routing
            if flag == "--bf16":
                continue  # the reference precision
            out.append((flag, kind, _str(value)))
        return out

    def lm_loss(self, step: int, run_key: str) -> float:
        r = self.recipe
        base = START_LOSS.get(r.model.name, 2.5)
        lr_raw = r.args.get("--lr")
        lr = float(lr_raw) if lr_raw not in (None, True, False) else REFERENCE_LR
        lr_ratio = max(lr / REFERENCE_LR, 1e-3)
        batch_ratio = r.gbs * r.seq / 2.0**23
        decline = DECLINE * (1.0 - math.exp(-step * min(lr_ratio, 20.0) * batch_ratio / TAU_STEPS))
        value = base * (1.0 - decline)
        value *= 1.0 + ROW_AMPLITUDE * _normal("rows", self._rows_key(), step)
        departure = 0.0
        if lr_ratio > 5.0:  # far too high a learning rate for these weights: the loss climbs and wobbles
            departure += 0.05 * math.log2(lr_ratio / 2.0) * min(step, 20) / 20.0
            departure += 0.02 * _normal("lr-instability", lr, step)
        # A setting's effect is a function of its value: runs with the same value share it exactly, and
        # two values differ by it. Subtle settings move the loss by tenths of a percent; strong ones
        # shift it by several percent and bring their own step-to-step bumps.
        for flag, kind, v in self._changes():
            u1, u2 = _normal("offset", flag, v), _normal("drift", flag, v)
            if kind == "subtle":
                departure += 0.002 * u1 + 0.003 * u2 * (step + 1) / 20.0 + 0.0005 * _normal("s", flag, v, step)
            else:
                departure += 0.04 * u1 + 0.04 * u2 * min(step, 20) / 20.0 + 0.03 * _normal("b", flag, v, step)
        for d in self.defects:
            if d.effect != "objective":
                continue
            if d.detail == "strong":  # deviates from the first step
                departure += 0.06 + 0.06 * min(step, 20) / 20.0 + 0.03 * _normal("strong", d.id, step)
            elif d.detail == "subtle":
                departure += 0.003 * (step + 1) / 20.0 + 0.0008 * _normal("subtle-noise", d.id, step)
        value *= 1.0 + departure
        value *= 1.0 + RUN_NOISE * _normal("run", run_key, step)
        return value

    def aux_loss(self, step: int, run_key: str) -> float | None:
        """The load-balancing loss Megatron logs for a MoE model with an auxiliary loss, else None."""
        r = self.recipe
        if not r.aux_loss:
            return None
        value = 1.0 + 0.06 * math.exp(-step / 6.0) + 0.004 * _normal("aux-rows", self._rows_key(), step)
        # computed per microbatch: more rows per microbatch average over more tokens
        value *= 1.0 - 0.015 * math.log2(r.mbs)
        if any(d.detail == "aux_halved" for d in self.defects):
            value *= 0.5
        return value * (1.0 + 0.0005 * _normal("run-aux", run_key, step))

    def curve(self, steps: int, run_key: str) -> dict[int, float]:
        """Iteration (1-based, as logged) -> lm loss."""
        return {k + 1: self.lm_loss(k, run_key) for k in range(steps)}
