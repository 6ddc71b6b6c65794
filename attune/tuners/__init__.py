"""Built-in tuners that drive the same control plane as the agent.

The registry of their names is `attune.tuners.registry`; `attune.tuners.factory.make_tuner` builds
one for a campaign. Import the tuners from their modules (`attune.tuners.tpe`, ...): this package
stays light so that the command line can list the choices without importing Optuna.
"""

from __future__ import annotations

from attune.tuners.registry import BUILT_IN

TUNERS = BUILT_IN

__all__ = ["BUILT_IN", "TUNERS"]
