"""Shared helpers of the skill tests: run a helper script the way the agent does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKILL = ROOT / "skills" / "attune"
SCRIPTS = SKILL / "scripts"

# Runs a script with the heavy packages made unimportable, proving that it needs only the
# standard library and PyYAML (what a bare `python3` on a user's machine has).
_BLOCKED = "pydantic", "numpy", "jsonschema", "mcp", "httpx", "torch", "rich"
_RUNNER = (
    "import runpy, sys\n"
    f"for m in {_BLOCKED!r}:\n"
    "    sys.modules[m] = None\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)


def run_script(name: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _RUNNER, str(SCRIPTS / name), *args],
        capture_output=True,
        text=True,
        cwd=cwd or ROOT,
        timeout=120,
    )
