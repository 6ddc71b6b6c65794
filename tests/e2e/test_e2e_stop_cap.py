"""A nightly `claude -p` whose agent keeps ending its turn must not exit 0 (issue 26).

Claude Code overrides the Stop hook after a cap of consecutive blocks (CLAUDE_CODE_STOP_HOOK_BLOCK_CAP) and
would end the run with a success result. In the real client, with a scripted model that only ever ends its
turn in a campaign that never started, the Stop hook blocks up to the cap, then records why the session
ended (session_end.json, the hook log) and the process exits non-zero with the reason on stderr.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from attune.core import session_end
from tests.e2e.harness import ROOT, run_session

EXAMPLE = ROOT / "examples" / "campaigns" / "tinygpt-local" / "campaign.yaml"


def test_agent_that_keeps_ending_its_turn_fails_the_run(claude: str, tmp_path: Path) -> None:
    camp = tmp_path / "camp"
    camp.mkdir()
    shutil.copy(EXAMPLE, camp / "campaign.yaml")
    cap = 3
    s = run_session(camp, [], tmp_path, prompt="/goal tune this recipe", max_turns=30, timeout=240,
                    extra_env={"CLAUDE_CODE_STOP_HOOK_BLOCK_CAP": str(cap)})
    detail = s.describe()
    assert s.returncode != 0, detail
    assert "the session ended unfinished" in s.stderr and "not_started" in s.stderr, detail
    rec = session_end.read(str(camp))
    assert rec is not None and rec["blocks"] == cap + 1, (rec, detail)
    assert "not_started" in rec["reason"]
    stops = [r for r in s.hook_log() if r.get("event") == "Stop"]
    assert [r.get("decision") for r in stops] == ["block"] * cap + ["allow"], stops
    assert stops[-1].get("outcome") == "failed"
