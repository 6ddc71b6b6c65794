"""The path rule of candidate values (`attune.control.rungen.confine_paths`), directly: what passes, what is
refused, links that lead out, and a value a leader carries into later candidates."""

from __future__ import annotations

from pathlib import Path

import pytest

from attune.control.rungen import Changes, RunGenError, confine_paths, parse_changes


def _ctx(run_dir: Path) -> dict[str, object]:
    return {"gpus": 8, "gpus_per_node": 8, "nodes": 1, "run_dir": str(run_dir)}


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    work = tmp_path / "work"
    run = tmp_path / "camp" / "runs" / "r002-x"
    work.mkdir()
    run.mkdir(parents=True)
    return run, work


@pytest.mark.parametrize("value", ["{run_dir}/m.json", "{run_dir}", "{run_dir}/a/b/c", "cosine", "3e-4", "1,2,3",
                                   "a=b", "{run_dir}/x,{run_dir}/y", "{run_dir}/x:{run_dir}/y", ".", "x/y",
                                   "policy.yaml", "ledger.jsonl", "typing_extensions.py", "a/../b"])
def test_values_inside_the_run_directory_or_not_paths_pass(dirs: tuple[Path, Path], value: str) -> None:
    run, work = dirs
    confine_paths(Changes({"--out": value}), run, work, _ctx(run))


@pytest.mark.parametrize("value", ["/etc/passwd", "..", "~", "~/x", "../policy.yaml", "x/../../y", "{run_dir}/..", "{run_dir}/../r001-a",
                                   "{run_dir}/x,/etc/y", "k=/etc/y", "{run_dir}/x y/../../..", "/", "//x",
                                   "{run_dir}/x;/y"])
def test_values_that_leave_the_run_directory_are_refused(dirs: tuple[Path, Path], value: str) -> None:
    run, work = dirs
    with pytest.raises(RunGenError) as exc:
        confine_paths(Changes({"--out": value}), run, work, _ctx(run))
    assert exc.value.code == "path_outside_run" and "--out" in exc.value.message


def test_a_link_inside_the_run_directory_that_leads_out_is_refused(dirs: tuple[Path, Path]) -> None:
    run, work = dirs
    (run / "out").symlink_to("/etc")
    with pytest.raises(RunGenError, match="resolves to /etc/passwd"):
        confine_paths(Changes({"--out": "{run_dir}/out/passwd"}), run, work, _ctx(run))


def test_environment_values_are_confined_too(dirs: tuple[Path, Path]) -> None:
    run, work = dirs
    with pytest.raises(RunGenError, match=r"changes.env\[NCCL_DEBUG_FILE\]"):
        confine_paths(Changes({}, {"NCCL_DEBUG_FILE": "/tmp/nccl"}), run, work, _ctx(run))


def test_a_leaders_path_value_is_refused_for_the_candidates_that_inherit_it(dirs: tuple[Path, Path]) -> None:
    """A recipe admitted before the rule (from an older ledger) names another run's directory: every
    candidate built on it carries that value in its full changes and is refused."""
    run, work = dirs
    leader_changes = Changes({"--metrics-out": str(run.parent / "r001-lead" / "m.json"), "--fast": True})
    with pytest.raises(RunGenError, match="--metrics-out"):
        confine_paths(leader_changes, run, work, _ctx(run))


@pytest.mark.parametrize("flag", ["--x=/tmp/y", "--a b", "--a/b", "-x", "--", "--\u00e4", "--a'"])
def test_candidate_flag_names_are_strict(flag: str) -> None:
    with pytest.raises(RunGenError, match="not a flag name"):
        parse_changes({"args": {flag: 1}})


@pytest.mark.parametrize("flag", ["--lr", "--training.seq_len", "--use-flash-attn", "--tp_size", "--x1"])
def test_ordinary_flag_names_pass(flag: str) -> None:
    assert flag in parse_changes({"args": {flag: 1}}).args


@pytest.mark.parametrize("name", ["policy.yaml", "ledger.jsonl", "typing_extensions.py", "campaign.yaml"])
def test_a_bare_name_is_a_path_of_the_run_never_of_the_code_or_campaign(dirs: tuple[Path, Path], name: str) -> None:
    """Issue 24, class 1: a value without a slash is still a path. It is resolved against the run's own
    directory (the job's working directory on every backend), so it lands there, whatever the code's
    directory holds; a link the run directory holds under that name is followed."""
    run, work = dirs
    (work / name).write_text("x")
    confine_paths(Changes({"--metrics-out": name}), run, work, _ctx(run))  # inside the run: passes
    (run / name).symlink_to(work / name)
    with pytest.raises(RunGenError, match="outside the run"):
        confine_paths(Changes({"--metrics-out": name}), run, work, _ctx(run))
