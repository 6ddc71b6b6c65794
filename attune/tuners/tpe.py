"""Optuna's TPE over the declared space, with the baseline as the first trial.

Multivariate TPE with the constant liar (so that trials in flight are not proposed again), 8
start-up trials. `tpe-prefilter` puts the memory estimate in front: a candidate the estimate says
cannot fit is told as a failure (score 0) without launching.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import optuna

from attune.core.recipe import Recipe
from attune.core.vocab import RunOutcome
from attune.tuners.base import ArgValue, Candidate, Outcome, Tuner

Prefilter = Callable[[dict[str, ArgValue]], str | None]  # returns a reason to skip, or None


class TPETuner(Tuner):
    name = "tpe"

    def __init__(
        self,
        space: dict[str, list[ArgValue]],
        baseline: dict[str, ArgValue],
        seed: int = 0,
        n_startup_trials: int = 8,
        prefilter: Prefilter | None = None,
        max_skips: int = 200,
        base: Recipe | None = None,
    ) -> None:
        super().__init__(space, baseline, seed, base)
        optuna.logging.set_verbosity(logging.WARNING)
        sampler = optuna.samplers.TPESampler(
            seed=seed, multivariate=True, constant_liar=True, n_startup_trials=n_startup_trials
        )
        self.study = optuna.create_study(direction="maximize", sampler=sampler)
        self.prefilter = prefilter
        self.max_skips = max_skips
        self.skipped: list[dict[str, object]] = []
        if prefilter is not None:
            self.name = "tpe-prefilter"
        # The baseline is the first trial: its value is known from calibration (the driver tells it).
        # A flag the baseline leaves unset (or sets to a value the space does not list) has no choice to
        # enqueue: the baseline is then not a point of the space, and TPE starts from its own draws.
        base: dict[str, ArgValue] = {}
        for k, values in space.items():
            v = baseline.get(k)
            same = [c for c in values if str(c) == str(v)] if v is not None else [c for c in values if c is None]
            if same:
                base[k] = same[0]
        self._baseline_pending = len(base) == len(space)
        if self._baseline_pending:
            self.study.enqueue_trial(base, skip_if_exists=True)
        self.size = 1
        for values in space.values():
            self.size *= len(values)

    def _sample(self) -> tuple[optuna.trial.Trial, dict[str, ArgValue]]:
        trial = self.study.ask()
        full = {k: trial.suggest_categorical(k, list(values)) for k, values in self.space.items()}
        return trial, full

    def ask(self) -> Candidate | None:
        for _ in range(self.max_skips):
            if len(self.tried) >= self.size:
                return None
            trial, full = self._sample()
            changes = self.diff(full)
            key = self.key(changes)
            if self._baseline_pending:
                self._baseline_pending = False
                self.tried.add(key)
                return Candidate(changes=changes, lever="baseline", hypothesis="the baseline, TPE's first trial",
                                 token=trial)
            if key in self.tried:
                # Already measured: tell TPE the known value rather than launching it again.
                prior = [t for t in self.study.trials if t.user_attrs.get("key") == key and t.value is not None]
                self.study.tell(trial, prior[0].value if prior else 0.0)
                continue
            if self.prefilter is not None and (reason := self.prefilter(full)):
                self.tried.add(key)
                self.skipped.append({"changes": changes, "reason": reason})
                trial.set_user_attr("key", key)
                self.study.tell(trial, 0.0)
                continue
            self.tried.add(key)
            trial.set_user_attr("key", key)
            return Candidate(changes=changes, lever="tpe", hypothesis="TPE proposal", token=trial)
        return None

    def tell(self, candidate: Candidate, outcome: Outcome) -> None:
        trial = candidate.token
        trial.set_user_attr("key", self.key(candidate.changes))
        if outcome.outcome == RunOutcome.PRUNED:
            self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        elif outcome.outcome in (RunOutcome.INFRASTRUCTURE, RunOutcome.CANCELLED):
            # Not the recipe's doing: a failed trial, which the sampler leaves out (never a score of zero).
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        else:
            self.study.tell(trial, outcome.score)

    def summary(self) -> dict[str, object]:
        out = super().summary()
        out["prefiltered"] = len(self.skipped)
        return out
