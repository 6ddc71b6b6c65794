"""The correctness gate: a faster recipe ships only if it trains the same objective.

- :mod:`gate.lists`: per-model correctness lists (argument classes, pins, known defects).
- :mod:`gate.config_check`: layer 1, the configuration check (recipe dry run and resolved re-check).
- :mod:`gate.convergence`: layer 2, the convergence check of a 20-step loss curve.

Training logs (losses by iteration, the resolved-arguments block) are read by the framework's reader
in :mod:`attune.readers.metrics` (`read_losses`, `read_resolved_args`).
"""

from gate.config_check import ConfigCheckResult, check_recipe, check_resolved
from gate.convergence import ConvergenceConfig, ConvergenceResult, check_convergence
from gate.lists import ListError, LoadedList, list_sha256, load_list

__all__ = [
    "ConfigCheckResult",
    "ConvergenceConfig",
    "ConvergenceResult",
    "ListError",
    "LoadedList",
    "check_convergence",
    "check_recipe",
    "check_resolved",
    "list_sha256",
    "load_list",
]
