"""Exit codes, and the exception tree: one root for the project, one root per layer.

Every exception attune raises on purpose derives from `AttuneError` through its layer's root, so a
caller can catch one layer's refusals without catching a programming error, and a reader finds every
layer's errors by one name. The roots live here, in the stdlib-only core, because every layer (the
hooks and the plugin launcher included) may import the core and none may import a layer above it.
A layer's own errors keep their names and their stdlib base (`ValueError`, `OSError`) beside the
root; tests/test_errors.py holds each layer's exceptions to its root."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1  # the checked thing failed: a gate rejected, a bar not met
EXIT_USAGE = 2  # bad input or usage


class AttuneError(Exception):
    """The root of every exception attune raises on purpose."""


# ------------------------------------------------------------------------ one root per layer
# (the layers of docs/architecture.md and tests/test_layering.py, lowest first)


class CoreError(AttuneError):
    """attune.core: the stdlib-only kit (ledger, YAML subset, paths)."""


class ReaderError(AttuneError):
    """attune.readers: logs, metrics and traces read under bounds."""


class KnowledgeError(AttuneError):
    """attune.knowledge: the lever catalog, layouts, lessons."""


class SimError(AttuneError):
    """attune.sim: the simulator."""


class GateError(AttuneError):
    """gate: the correctness gate (lists, inputs, verdicts)."""


class ControlError(AttuneError):
    """attune.control: the control plane; raised as is when a campaign cannot be driven as it is
    (not started, spec changed, bad configuration)."""


class TunerError(AttuneError):
    """attune.tuners: the tuners."""


class BackendError(AttuneError):
    """broker.backends: a backend refused or failed an operation."""


class TTBError(AttuneError):
    """attune.ttb: TrainingThroughputBench entries, workloads, pages."""


class BrokerError(AttuneError):
    """broker: the broker service; raised as is when the broker cannot start as configured."""


class PluginServerError(AttuneError):
    """mcp_servers: the MCP servers and the plugin launcher."""


class AppError(AttuneError):
    """attune.app: the CLI and its commands."""


class HookError(AttuneError):
    """hooks: the Claude Code hooks."""


# ------------------------------------------------------------------------ core's own


class UsageError(CoreError):
    """Bad input: the CLI prints the message and exits 2."""
