"""The run generator: only the requested edits, allowlisted variables, pinned shape, stack fixes."""

from __future__ import annotations

from pathlib import Path

import pytest

from attune.control.rungen import Changes, RunGenerator, RunGenError, parse_changes, render_args
from attune.control.spec import parse_spec
from tests._broker_helpers import FAKE_SPEC, deep_update


def gen(**over: object) -> RunGenerator:
    return RunGenerator(parse_spec(deep_update(FAKE_SPEC, dict(over))))


def test_candidate_applies_only_the_edits_and_records_the_full_diff() -> None:
    g = gen()
    base = Changes({"--fake-variant": 3}, {})
    c = g.candidate(base, parse_changes({"args": {"--fake-step-ms": 10}, "env": {"NCCL_ALGO": "Ring"}}), False)
    assert c.args == {"--seq-length": 128, "--global-batch-size": 16, "--train-iters": 14, "--fake-step-ms": 10,
                      "--fake-variant": 3}
    assert c.env == {"NCCL_ALGO": "Ring"}
    assert c.changes.as_dict() == {"args": {"--fake-step-ms": 10, "--fake-variant": 3}, "env": {"NCCL_ALGO": "Ring"}}
    # Setting a flag back to the baseline's value removes it from the diff; null removes a baseline flag.
    back = g.candidate(c.changes, parse_changes({"args": {"--fake-step-ms": 20, "--fake-variant": None},
                                                "env": {"NCCL_ALGO": None}}), False)
    assert back.changes.empty and back.recipe_key == g.candidate(Changes(), Changes(), False).recipe_key
    gone = g.candidate(Changes(), parse_changes({"args": {"--fake-step-ms": None}}), False)
    assert gone.changes.args == {"--fake-step-ms": None} and "--fake-step-ms" not in gone.args


def test_recipe_identity_ignores_spelling_but_not_profiling() -> None:
    g = gen()
    a = g.candidate(Changes(), parse_changes({"args": {"--fake-step-ms": 10}}), False)
    b = g.candidate(Changes(), parse_changes({"args": {"--fake-step-ms": "10"}}), False)
    p = g.candidate(Changes(), parse_changes({"args": {"--fake-step-ms": 10}}), True)
    assert a.recipe_key == b.recipe_key != p.recipe_key


def test_negative_numbers_stay_values() -> None:
    changes = parse_changes({"args": {"--x": "-1", "--y": "0 -2.5 16"}})
    assert changes.args == {"--x": "-1", "--y": "0 -2.5 16"}


@pytest.mark.parametrize(
    ("changes", "code", "words"),
    [
        ({"args": {"--seq-length": 256}}, "pinned", "--seq-length is pinned"),
        ({"args": {"--train-iters": 20}}, "pinned", "--train-iters is pinned"),
        ({"args": {"--run-dir": "/tmp/x"}}, "stack_fix", "--run-dir is set by the campaign's stack fixes"),
        ({"env": {"ATTUNE_FIX": "0"}}, "stack_fix", "ATTUNE_FIX is set by the campaign's stack fixes"),
        ({"args": {"--profile": True}}, "profile_flag", "profile=true"),
        ({"env": {"LD_PRELOAD": "/evil.so"}}, "env_not_allowlisted", "LD_PRELOAD is not on the campaign's allowlist"),
        ({"args": {"fake": 1}}, "bad_change", "is not a flag"),
        ({"args": {"--x": [1, 2]}}, "bad_change", "expected a string, number"),
        ({"args": {"--x": "a\nb"}}, "bad_change", "one-line string"),
        ({"args": {"--x": float("nan")}}, "bad_change", "finite number"),
        ({"env": {"1BAD": "x"}}, "bad_change", "not an environment variable name"),
        ({"other": {}}, "bad_change", "unknown key"),
        # a value's words become command-line words: an option word inside a value is a second flag
        ({"args": {"--recompute-modules": "core_attn --train-iters 999"}}, "bad_change", "read as another flag"),
        ({"args": {"--x": "--seq-length=4096"}}, "bad_change", "read as another flag"),
    ],
)
def test_refused_edits(changes: dict, code: str, words: str) -> None:
    with pytest.raises(RunGenError) as info:
        gen().candidate(Changes(), parse_changes(changes), False)
    assert info.value.code == code and words in info.value.message


def test_resolve_fills_placeholders_applies_fixes_and_passes_the_shape_check(tmp_path: Path) -> None:
    g = gen(baseline={"command": ["python", "tests/fake_trainer.py", "--nproc", "{gpus}"]})
    c = g.candidate(Changes(), parse_changes({"args": {"--fake-step-ms": 5}}), True)
    job = g.resolve(c, tmp_path / "r1", tmp_path)
    assert job.argv[:4] == ("python", "tests/fake_trainer.py", "--nproc", "2")
    assert job.args["--run-dir"] == str(tmp_path / "r1") and job.args["--profile"] is True
    assert job.env == {"ATTUNE_FIX": "1"}
    assert render_args({"--a": True, "--b": False, "--c": None, "--d": 0.5}) == ["--a", "--d", "0.5"]
    assert g.check_shape(job, profile=True) == []


def test_shape_check_catches_a_job_that_drifted(tmp_path: Path) -> None:
    from dataclasses import replace

    g = gen()
    c = g.candidate(Changes(), Changes(), False)
    job = g.resolve(c, tmp_path / "r1", tmp_path)
    bad = replace(job, gpus=4, image="other:latest", args={**job.args, "--seq-length": 4096},
                  argv=("bash", *job.argv[1:]), env={})
    problems = " | ".join(g.check_shape(bad, profile=False))
    for words in ("asks for 4 GPUs", "image 'other:latest'", "command is not", "--seq-length is '4096'",
                  "stack fix ATTUNE_FIX"):
        assert words in problems


def test_a_baseline_that_contradicts_its_workload_is_reported() -> None:
    g = gen(baseline={"args": {"--seq-length": 256}})
    assert g.check_baseline() == ["baseline.args[--seq-length] is 256 but workload.seq_length is 128"]
