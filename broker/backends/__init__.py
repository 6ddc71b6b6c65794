"""Backends behind one small interface (`broker.backends.base.Backend`).

`get_backend(name, settings)` builds one by the campaign's `cluster.backend`; the modules are
imported lazily so that a machine without, say, Slurm still loads the others.
"""

from __future__ import annotations

import importlib
from typing import Any

from broker.backends.base import Backend, BackendError

_BACKENDS = {
    "local": ("broker.backends.local", "LocalBackend"),
    "slurm": ("broker.backends.slurm", "SlurmBackend"),
    "sim": ("broker.backends.sim", "SimBackend"),
    "ray": ("broker.backends.ray", "RayBackend"),
}


def get_backend(name: str, settings: dict[str, Any] | None = None) -> Backend:
    try:
        module_name, cls_name = _BACKENDS[name]
    except KeyError:
        raise BackendError(f"unknown backend {name!r}; expected one of {sorted(_BACKENDS)}") from None
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise BackendError(f"backend {name!r} is not available in this build ({exc})") from None
    return getattr(module, cls_name)(**(settings or {}))
