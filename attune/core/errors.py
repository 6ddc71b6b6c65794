"""Exit codes and the error types the CLI maps onto them."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1  # the checked thing failed: a gate rejected, a bar not met
EXIT_USAGE = 2  # bad input or usage


class UsageError(Exception):
    """Bad input: the CLI prints the message and exits 2."""
