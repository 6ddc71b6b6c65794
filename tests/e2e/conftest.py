from __future__ import annotations

import pytest

from tests.e2e.harness import claude_binary


@pytest.fixture(scope="session")
def claude() -> str:
    path, why = claude_binary()
    if path is None:
        pytest.skip(f"the real Claude Code CLI is not available: {why}")
    return path
