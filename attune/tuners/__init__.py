"""Built-in tuners that drive the same control plane as the agent."""

from __future__ import annotations

from attune.tuners.base import Candidate, Outcome, Tuner
from attune.tuners.heuristic import HeuristicTuner
from attune.tuners.random_search import RandomTuner
from attune.tuners.tpe import TPETuner

TUNERS = ("heuristic", "tpe", "tpe-prefilter", "random")

__all__ = ["TUNERS", "Candidate", "HeuristicTuner", "Outcome", "RandomTuner", "TPETuner", "Tuner"]
