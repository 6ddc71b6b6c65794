"""The messages a user reads, fixed where they are made (issue 26): each test runs the command as a user
would and reads what it prints."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from attune.core.ledger import Ledger
from tests.conftest import EXAMPLE_CAMPAIGN, ROOT, run_cli
from tests.test_report import _campaign


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "attune", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=120, env=env)


def test_tune_without_the_sandbox_tools_says_what_to_install_or_which_tuner(campaign_dir: Path,
                                                                            tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    p = _cli("tune", str(campaign_dir / "campaign.yaml"), env={**os.environ, "PATH": str(empty)})
    assert p.returncode == 1, p.stderr
    assert "bwrap and socat not found" in p.stderr and "apt-get install -y bubblewrap socat" in p.stderr
    assert "--tuner heuristic" in p.stderr and "rerun the same command" not in p.stderr
    assert not (campaign_dir / "ledger.jsonl").exists()  # nothing half-written


def test_a_typo_in_a_search_space_lever_fails_validate_with_the_near_name(campaign_dir: Path) -> None:
    spec = yaml.safe_load((campaign_dir / "campaign.yaml").read_text())
    spec["search_space"]["--micro-batch-sze"] = spec["search_space"].pop("--micro-batch-size")
    (campaign_dir / "campaign.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    p = run_cli("validate", str(campaign_dir / "campaign.yaml"))
    assert p.returncode == 2
    assert "search_space.--micro-batch-sze" in p.stderr and "did you mean --micro-batch-size?" in p.stderr
    j = run_cli("validate", str(campaign_dir), "--json")
    assert j.returncode == 2 and json.loads(j.stdout)["problems"][0]["field"] == "search_space.--micro-batch-sze"
    assert run_cli("validate", str(EXAMPLE_CAMPAIGN)).returncode == 0


def test_a_moved_or_copied_campaign_still_reports_and_tampering_is_still_caught(campaign_dir: Path,
                                                                                 tmp_path: Path) -> None:
    _campaign(campaign_dir)
    copy = tmp_path / "copied"
    shutil.copytree(campaign_dir, copy)
    moved = tmp_path / "moved"
    shutil.move(str(campaign_dir), moved)
    for d in (copy, moved):
        st = run_cli("status", str(d), "--json")
        assert st.returncode == 0, st.stdout + st.stderr
        assert json.loads(st.stdout)["authenticated"] is True
        rep = run_cli("report", str(d))
        assert rep.returncode == 0, rep.stderr
    Ledger(moved).append("diagnosis_recorded", {"text": "the moved campaign goes on"})  # its key followed it
    lines = (copy / "ledger.jsonl").read_text().splitlines()
    assert '"30 x baseline run"' in lines[1]
    lines[1] = lines[1].replace('"30 x baseline run"', '"31 x baseline run"')
    (copy / "ledger.jsonl").write_text("\n".join(lines) + "\n")
    bad = run_cli("status", str(copy))
    assert bad.returncode == 1 and "does not verify" in bad.stderr


def _report_ledger(d: Path) -> None:
    from attune.control.campaign import start

    start(d)
    led = Ledger(d)
    led.append("budget_set", {"gpu_hours": 2.0, "reserve_gpu_hours": 0.1, "reason": "x"})
    for i, v in enumerate([1000.0, 1010.0, 990.0, 1005.0, 995.0]):
        rid = f"cal-{i}"
        led.append("launch_admitted", {"run_id": rid, "kind": "calibration", "expected_gpu_hours": 0.01})
        led.append("run_finished", {"run_id": rid, "outcome": "ok", "charge_gpu_hours": 0.01})
        led.append("measurement", {"run_id": rid, "tokens_per_s_per_gpu": v, "valid": True})
        led.append("calibration_run", {"run_id": rid, "tokens_per_s_per_gpu": v})
    desc = ("the micro-batch size sets the GEMM shapes and the per-step overhead: a larger one fills the cores "
            "better and runs fewer optimizer-independent steps, until the activations no longer fit")
    for i, (value, outcome) in enumerate([(2, "infrastructure"), (2, "infrastructure"), (4, "infrastructure"),
                                          (4, "infrastructure"), (8, "oom")]):
        rid = f"r{i:03d}-micro-batch-size-with-a-long-name"
        led.append("launch_admitted", {"run_id": rid, "kind": "search", "expected_gpu_hours": 0.02,
                                       "lever": "--micro-batch-size", "changes": {"args": {"--micro-batch-size": value}},
                                       "hypothesis": f"{desc.strip()}; try --micro-batch-size={value} from 1"})
        led.append("run_finished", {"run_id": rid, "outcome": outcome, "charge_gpu_hours": 0.0})
    led.append("stop_refused", {"levers_tested": ["--micro-batch-size"], "refusals": [
        {"code": "levers_not_run", "message": "x", "items": ["--micro-batch-size"]}]})


def test_the_report_counts_every_failed_run_says_why_it_stopped_and_shows_a_description_once(
        campaign_dir: Path) -> None:
    _report_ledger(campaign_dir)
    p = run_cli("report", str(campaign_dir))
    assert p.returncode == 0, p.stderr
    md = (campaign_dir / "report.md").read_text()
    assert "5 run(s) failed, 4 of them on infrastructure" in md
    assert "0 failed" not in md
    assert "not finished: stopped short: the last stop was refused by the search rules (levers_not_run)" in md
    assert "not finished yet" not in md
    assert md.count("the micro-batch size sets the GEMM shapes") == 1  # on the lever's first row only
    assert "...; try --micro-batch-size=4 from 1" in md


@pytest.mark.parametrize("columns", ["80", "40"])
def test_status_never_truncates_run_ids(campaign_dir: Path, columns: str) -> None:
    _report_ledger(campaign_dir)
    p = _cli("status", str(campaign_dir), env={**os.environ, "COLUMNS": columns})
    assert p.returncode == 0, p.stderr
    for i in range(5):
        assert f"r{i:03d}-micro-batch-size-with-a-long-name" in p.stdout, p.stdout


def test_demo_progress_lines_are_not_hard_wrapped_off_a_terminal(capsys: pytest.CaptureFixture[str],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from attune.app.commands.demo import Display

    monkeypatch.setenv("COLUMNS", "40")
    line = "launch r012-micro-batch-size: search run (--micro-batch-size=4, --recompute-granularity=full)"
    Display(None, quiet=False).say(line)
    err = capsys.readouterr().err
    assert line in err and err.count("\n") == 1


@pytest.mark.parametrize("argv", [["status", "--json"], ["tune", "x", "--tuner", "bogus", "--json"],
                                  ["report", "--json", "--no-such-flag", "d"]])
def test_usage_errors_under_json_are_json(argv: list[str]) -> None:
    p = run_cli(*argv)
    assert p.returncode == 2
    doc = json.loads(p.stdout)
    assert doc["ok"] is False and doc["error"] == "usage" and doc["reason"] and doc["exit_code"] == 2


def test_the_readme_ttb_walkthrough_writes_outside_the_repository() -> None:
    text = (ROOT / "README.md").read_text()
    block = text[text.index("attune ttb template examples/campaigns"):]
    block = block[:block.index("```")]
    submits = [line for line in block.splitlines() if line.startswith("attune ttb submit")]
    assert submits and all("--entries" in s and "--entries ttb/entries" not in s for s in submits)


def test_an_unreachable_cluster_fails_at_the_first_attempt_naming_it(tmp_path: Path) -> None:
    pytest.importorskip("ray.job_submission", reason="Ray is not installed")
    from tests._broker_helpers import tune

    spec = yaml.safe_load(EXAMPLE_CAMPAIGN.read_text())
    spec["name"] = "ray-away"
    spec["cluster"] = {"backend": "ray", "gpus": 1, "gpus_per_node": 1, "accelerator": "cpu",
                       "ray": {"address": "http://127.0.0.1:9", "gpu_request": "none", "request_timeout_s": 3}}
    d = tmp_path / "ray-away"
    d.mkdir()
    (d / "campaign.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    p = tune(d, timeout=300)
    assert p.returncode == 1, p.stderr
    assert "http://127.0.0.1:9" in p.stderr and "did not take the baseline's calibration run" in p.stderr
    assert "fix the recipe or the machine's load" not in p.stderr
    from attune.core.state import load

    st, _ = load(d)
    assert len([r for r in st.runs.values() if r.kind == "calibration"]) == 1  # one attempt, not six
