"""The vocabulary, the campaign paths and the job type: standard library only, and the ledger keeps
its plain strings."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from attune.core import campaign_paths, vocab
from attune.core.job import JobSpec
from attune.core.ledger import Ledger
from attune.core.vocab import FAILED_OUTCOMES, RECIPE_FAILURES, STOPPED_OUTCOMES, RunKind, RunOutcome, Verdict

ROOT = Path(__file__).resolve().parents[1]
STDLIB_ONLY = ("attune/core/vocab.py", "attune/core/campaign_paths.py", "attune/core/job.py")


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
    return out


def test_the_shared_modules_import_only_the_standard_library_and_each_other() -> None:
    allowed = {p.removesuffix(".py").replace("/", ".") for p in STDLIB_ONLY}
    for rel in STDLIB_ONLY:
        for mod in _imports(ROOT / rel):
            top = mod.split(".")[0]
            assert mod in allowed or (top != "attune" and top in sys.stdlib_module_names), f"{rel} imports {mod}"


def test_the_names_load_on_a_bare_interpreter_without_pathlib() -> None:
    """What a hook may do: no site packages, and the names cost no import of their own."""
    code = ("import sys; sys.path.insert(0, '.'); import attune.core.campaign_paths as c, attune.core.vocab as v; "
            "print(c.RUN_LOG, v.RunOutcome.OK, 'pathlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-S", "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["log.txt", "ok", "False"]


def test_failed_outcomes_are_recipe_failures_and_infrastructure_and_not_the_stopped_ones() -> None:
    assert {"oom", "hang", "crash"} == RECIPE_FAILURES
    assert RECIPE_FAILURES | {"infrastructure"} == FAILED_OUTCOMES
    assert not FAILED_OUTCOMES & STOPPED_OUTCOMES and RunOutcome.OK not in FAILED_OUTCOMES | STOPPED_OUTCOMES
    assert set(vocab.FAILURE_CLASSES) == FAILED_OUTCOMES | {RunOutcome.OK}


def test_enum_members_are_their_strings_in_the_ledger(tmp_path: Path) -> None:
    led = Ledger(tmp_path)
    led.append("run_finished", {"run_id": "r1", "outcome": RunOutcome.OOM, "charge_gpu_hours": 0.0,
                                "kind": RunKind.SEARCH, "verdict": Verdict.LEADER})
    row = json.loads(campaign_paths.ledger_file(tmp_path).read_text().splitlines()[-1])
    assert row["data"]["outcome"] == "oom" and type(row["data"]["outcome"]) is str
    assert (row["data"]["kind"], row["data"]["verdict"]) == ("search", "leader")
    assert RunOutcome("oom") is RunOutcome.OOM and f"{Verdict.WITHIN_BAND}" == "within_band"


def test_one_job_type_runs_where_its_log_is() -> None:
    job = JobSpec(job_id="r001-x", campaign="c", argv=("python", "t.py"), env={}, workdir=Path("/w"),
                  run_dir=campaign_paths.run_dir("/c", "r001-x"), gpus=9, gpus_per_node=8)
    assert job.log_path == campaign_paths.run_log("/c", "r001-x") and job.nodes == 2 and job.args == {}


def _codes_written_by_the_control_plane() -> set[str]:
    """Every literal first argument of Refusal(...) and RunGenError(...) in the control plane, plus the
    codes WorkloadEnvError and search rule 2 pass on."""
    out: set[str] = set()
    for path in (ROOT / "attune" / "control").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("Refusal", "RuleRefusal", "RunGenError") and node.args
                    and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                out.add(node.args[0].value)
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "__init__"
                    and node.args and isinstance(node.args[0], ast.Constant)):
                out.add(node.args[0].value)
    return out


def test_every_refusal_code_the_control_plane_writes_is_in_the_enum() -> None:
    from attune.control.search_rules import STOP_RULE_CODES

    written = _codes_written_by_the_control_plane() - set(STOP_RULE_CODES)  # stop refusals are another list
    assert {"environment", "not_started", "rule2_one_lever", "path_outside_run", "spec_changed"} <= written
    assert written <= {c.value for c in vocab.RefusalCode}, written - {c.value for c in vocab.RefusalCode}


def test_the_agent_facing_lists_name_every_refusal_code() -> None:
    from broker import wire

    desc = wire.LaunchResult.model_fields["code"].description or ""
    schemas = (ROOT / "mcp_servers" / "tool_schemas.json").read_text()
    for code in vocab.RefusalCode:
        assert f"{code.value}" in desc.replace("(", ",").replace(",", " ").split(), code
        assert code.value in schemas, f"tool_schemas.json lacks {code}: python mcp_servers/launch.py --write-schemas"


def test_run_status_and_ship_actions_are_their_strings() -> None:
    from attune.control import shipping

    assert [s.value for s in vocab.RunStatus] == ["admitted", "running", "finished"]
    assert vocab.ShipAction.SHIP == "ship" and json.dumps({"k": vocab.ShipAction.NOT_DUE}) == '{"k": "not_due"}'
    assert shipping.Action(vocab.ShipAction.WAIT).kind == "wait"
