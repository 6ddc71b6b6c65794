from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_CAMPAIGN = ROOT / "examples" / "campaigns" / "tinygpt-local" / "campaign.yaml"


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real `attune` CLI in a subprocess (as a user would)."""
    return subprocess.run(
        [sys.executable, "-m", "attune", *args], capture_output=True, text=True, cwd=cwd or ROOT, timeout=120
    )


@pytest.fixture
def campaign_dir(tmp_path: Path) -> Path:
    d = tmp_path / "campaign"
    d.mkdir()
    shutil.copy(EXAMPLE_CAMPAIGN, d / "campaign.yaml")
    return d
