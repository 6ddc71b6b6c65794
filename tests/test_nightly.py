"""The nightly script: one campaign directory per night, an unfinished one resumed first, no overlap.

`attune` is replaced by a stub that records its arguments (the campaign itself is `attune tune`'s,
tested in tests/test_tune.py)."""

from __future__ import annotations

import fcntl
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NIGHTLY = ROOT / "examples" / "nightly" / "nightly.sh"

STUB = """#!/bin/sh
echo "$@" >> "$STUB_LOG"
d=$(dirname "$2")
[ -n "${STUB_FINISH:-}" ] && echo report > "$d/report.html"
echo '{"shipped": "baseline"}'
"""


def _run(tmp: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "ATTUNE": str(tmp / "attune"), "TEMPLATE": str(tmp / "campaign.yaml"),
           "CAMPAIGNS": str(tmp / "nightly"), "TUNER": "heuristic", "STUB_LOG": str(tmp / "calls"), **extra}
    return subprocess.run(["sh", str(NIGHTLY)], env=env, capture_output=True, text=True, timeout=60)


def test_nightly_resumes_the_unfinished_campaign_then_starts_a_new_one(tmp_path: Path) -> None:
    (tmp_path / "attune").write_text(STUB)
    (tmp_path / "attune").chmod(0o755)
    (tmp_path / "campaign.yaml").write_text("name: x\n")
    assert _run(tmp_path).returncode == 0
    [night] = sorted((tmp_path / "nightly").glob("20*"))
    assert (night / "campaign.yaml").read_text() == "name: x\n"
    assert (night / "tune.json").read_text().strip() == '{"shipped": "baseline"}'
    # It started (a ledger) but did not finish (no report): the next run resumes the same directory.
    (night / "ledger.jsonl").write_text("")
    later = tmp_path / "nightly" / "2000-01-01"
    later.mkdir()
    assert _run(tmp_path, STUB_FINISH="1").returncode == 0
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls == [f"tune {night}/campaign.yaml --tuner heuristic --json"] * 2
    # Finished now: another run would start a new campaign, unless one already holds the lock.
    with open(tmp_path / "nightly" / ".nightly.lock", "w") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        held = _run(tmp_path)
    assert held.returncode == 0 and "holds" in held.stderr
    assert len((tmp_path / "calls").read_text().splitlines()) == 2


def test_a_failed_campaign_makes_the_night_fail_with_the_reason(tmp_path: Path) -> None:
    stub = STUB.replace("echo '{\"shipped\": \"baseline\"}'",
                        "echo '{\"outcome\": \"failed\", \"failed\": \"no valid calibration\"}'\nexit 1")
    (tmp_path / "attune").write_text(stub)
    (tmp_path / "attune").chmod(0o755)
    (tmp_path / "campaign.yaml").write_text("name: x\n")
    res = _run(tmp_path)
    assert res.returncode == 1, res.stderr
    assert "FAILED (attune tune exit 1)" in res.stderr and "no valid calibration" in res.stderr
    assert "done:" not in res.stderr
