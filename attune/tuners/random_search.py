"""Random search over the declared space: uniform over each lever's values, no repeats."""

from __future__ import annotations

import itertools
import random

from attune.core.recipe import Recipe
from attune.tuners.base import ArgValue, Candidate, Outcome, Tuner


class RandomTuner(Tuner):
    name = "random"

    def __init__(self, space: dict[str, list[ArgValue]], baseline: dict[str, ArgValue], seed: int = 0,
                 base: Recipe | None = None) -> None:
        super().__init__(space, baseline, seed, base)
        self.rng = random.Random(seed)
        self.tried.add(self.key({}))  # the baseline is measured by calibration
        total = 1
        for values in space.values():
            total *= len(values)
        self.size = total

    def ask(self) -> Candidate | None:
        if len(self.tried) >= self.size + 1:
            return None
        if self.size <= 4096:
            keys = list(self.space)
            pool = [self.diff(dict(zip(keys, combo, strict=True))) for combo in itertools.product(*self.space.values())]
            pool = [c for c in pool if self.key(c) not in self.tried]
            if not pool:
                return None
            changes = self.rng.choice(pool)
        else:
            for _ in range(1000):
                changes = self.diff({k: self.rng.choice(v) for k, v in self.space.items()})
                if self.key(changes) not in self.tried:
                    break
            else:
                return None
        self.tried.add(self.key(changes))
        return Candidate(changes=changes, lever="random", hypothesis="random sample of the declared space")

    def tell(self, candidate: Candidate, outcome: Outcome) -> None:
        return None
