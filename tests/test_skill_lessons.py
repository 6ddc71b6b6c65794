from __future__ import annotations

import datetime as dt
import json
import multiprocessing
import re
import shlex
from pathlib import Path

import pytest
import yaml

from attune.knowledge.catalog import load_catalog, load_lessons
from attune.knowledge.lessons import (
    LessonError,
    LessonRefused,
    add_lesson,
    check_text,
    known_model_names,
    read_lessons,
)
from tests.conftest import run_cli
from tests.skill_helpers import SKILL, run_script

HEADER = "# lessons\n# appended by the tool only\n"
GOOD = ("Keep the expert all-to-all inside a node before trying another dispatcher; "
        "a deeper pipeline pays for the narrower expert group.")


@pytest.fixture
def lessons_file(tmp_path: Path) -> Path:
    p = tmp_path / "lessons.yaml"
    p.write_text(HEADER)
    return p


@pytest.mark.parametrize(
    ("text", "what"),
    [
        ("Lowering TP gave 12% more throughput", "percentage"),
        ("Lowering TP gave 12 percent more", "percentage"),
        ("DeepEP runs 1.5x faster inside a node", "speed-up"),
        ("the flex dispatcher ran 2 times faster", "speed-up"),
        ("reached 900 tokens/s per GPU", "throughput figure"),
        ("reached 1,072.4 tok/s/GPU", "throughput figure"),
        ("the leader sustains 400 TFLOP/s", "FLOP rate"),
        ("it reached 40 MFU", "MFU"),
        ("MFU of 9.7 is typical", "MFU"),
        ("step time fell to 350 ms", "time figure"),
        ("each step takes 5.3 s", "time figure"),
        ("found within 40 GPU-hours", "GPU-hour"),
        ("the campaign cost $112", "cost"),
        ("all-to-all reached 50 GB/s", "bandwidth"),
        ("a gain of 12 over the baseline", "throughput figure"),
        ("faster by 30 on this cluster", "speed-up"),
    ],
)
def test_throughput_figures_are_refused(text: str, what: str) -> None:
    problems = check_text("rule", text)
    assert problems and any(what in p.reason for p in problems), problems


@pytest.mark.parametrize(
    "text",
    [
        "On GLM-4.5 narrow EP to a node", "Llama 3 prefers fewer chunks", "qwen3 models like DeepEP",
        "deepseek-v3 style routing", "Mixtral needs expert-activation recompute", "gpt-oss has biases",
        "as seen on MiniMax-M2", "a GPT-style dense model", "the tinygpt example", "models like gemma-2",
        "a 405B dense model", "an 8x22b model", "a 30B-A3B MoE", "the A10B variant",
    ],
)
def test_model_names_and_sizes_are_refused(text: str) -> None:
    problems = check_text("rule", text)
    assert problems and any("model" in p.reason for p in problems), problems


@pytest.mark.parametrize(
    "text",
    [
        GOOD,
        "At TP 1 on a deep pipeline of 16 stages, full recompute hides in the idle time between one-row microbatches.",
        "Use two virtual stages rather than eight when inter-node sends dominate the step.",
        "The optimizer offload is rarely needed once the layout spreads experts over 8 GPUs per node.",
        "TP 2 x PP 8 layouts with EP 16 cross nodes; prefer EP 8.",
        "Adopt the alltoall dispatcher first; the fused one reserves SMs.",
        "Pipeline bubbles grow when the global batch leaves few microbatches per stage.",
    ],
)
def test_general_rules_pass(text: str) -> None:
    assert check_text("rule", text) == []


def test_the_refusal_list_includes_models_file_names() -> None:
    names = known_model_names()
    assert {"glm-4.5", "llama-3.1-405b", "mixtral-8x22b", "minimax-m2", "tinygpt", "llama", "qwen", "deepseek",
            "gpt-oss"} <= set(names)


def test_add_lesson_appends_with_ids_and_keeps_the_header(lessons_file: Path) -> None:
    day = dt.date(2026, 5, 1)
    first = add_lesson(lessons_file, lever="expert-parallel", rule=GOOD, applies_when="MoE with small experts",
                       evidence="two values measured on the same leader", today=day)
    second = add_lesson(lessons_file, lever="recompute-granularity",
                        rule="Retry an out-of-memory layout with full recompute before ruling it out.", today=day)
    assert (first["id"], second["id"]) == ("L0001", "L0002")
    text = lessons_file.read_text()
    assert text.startswith(HEADER)
    data = read_lessons(lessons_file)
    assert data == [first, second] and data[0]["added"] == "2026-05-01"
    # the result validates as a lessons file, content rules included
    assert [ls.id for ls in load_lessons(lessons_file, load_catalog())] == ["L0001", "L0002"]


def test_refusals_write_nothing(lessons_file: Path) -> None:
    before = lessons_file.read_bytes()
    with pytest.raises(LessonRefused) as exc:
        add_lesson(lessons_file, lever="tensor-parallel", rule="On GLM-4.5, TP 1 was 47% faster than TP 2")
    fields = {p["field"] for p in exc.value.problems}
    reasons = " ".join(p["reason"] for p in exc.value.problems)
    assert fields == {"rule"} and "percentage" in reasons and "model" in reasons
    with pytest.raises(LessonRefused, match="not a lever id"):
        add_lesson(lessons_file, lever="go-faster", rule=GOOD)
    with pytest.raises(LessonRefused, match="at least 20 characters"):
        add_lesson(lessons_file, lever="tensor-parallel", rule="lower TP")
    with pytest.raises(LessonRefused, match="evidence"):
        add_lesson(lessons_file, lever="tensor-parallel", rule=GOOD, evidence="measured 3% faster")
    assert lessons_file.read_bytes() == before
    assert not [p for p in lessons_file.parent.iterdir() if p.name.endswith(".tmp")]


def test_duplicates_and_bad_files_are_errors(lessons_file: Path, tmp_path: Path) -> None:
    add_lesson(lessons_file, lever="expert-parallel", rule=GOOD)
    with pytest.raises(LessonError, match="already recorded as L0001"):
        add_lesson(lessons_file, lever="expert-parallel", rule="  " + GOOD.upper().lower())
    broken = tmp_path / "broken.yaml"
    broken.write_text("{not: a list}\n")
    with pytest.raises(LessonError, match="expected a YAML list"):
        add_lesson(broken, lever="expert-parallel", rule=GOOD)
    with pytest.raises(LessonError, match="no such directory"):
        add_lesson(tmp_path / "missing" / "lessons.yaml", lever="expert-parallel", rule=GOOD)


def _append(path: str, i: int) -> str:
    return add_lesson(Path(path), lever="manual-gc",
                      rule=f"Collect garbage on every rank together, variant number {'abcdefgh'[i]} of this rule.")["id"]


def test_concurrent_appends_get_distinct_ids(lessons_file: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        ids = pool.starmap(_append, [(str(lessons_file), i) for i in range(8)])
    assert sorted(ids) == [f"L{i:04d}" for i in range(1, 9)]
    assert len(read_lessons(lessons_file)) == 8


def test_script_accepts_and_refuses_without_heavy_packages(lessons_file: Path) -> None:
    ok = run_script("add_lesson.py", "--file", str(lessons_file), "--lever", "cuda-graphs",
                    "--rule", "Capture only the static-shape scopes first; dropless expert compute changes shape.",
                    "--json")
    assert ok.returncode == 0, ok.stderr
    out = json.loads(ok.stdout)
    assert out["added"] is True and out["lesson"]["id"] == "L0001" and out["lesson"]["lever"] == "cuda-graphs"
    refused = run_script("add_lesson.py", "--file", str(lessons_file), "--lever", "cuda-graphs",
                         "--rule", "CUDA graphs gave 8% on qwen3-30b-a3b", "--json")
    assert refused.returncode == 1
    out = json.loads(refused.stdout)
    assert out["added"] is False and {p["field"] for p in out["problems"]} == {"rule"}
    assert "refused" in refused.stderr and "8%" in refused.stderr
    dup = run_script("add_lesson.py", "--file", str(lessons_file), "--lever", "cuda-graphs",
                     "--rule", "Capture only the static-shape scopes first; dropless expert compute changes shape.")
    assert dup.returncode == 2 and "already recorded" in dup.stderr
    # an agent's lesson waits, pending, beside the lessons file every later agent reads (issue 24, class 4)
    from attune.knowledge.lessons import pending_path

    assert out_ok_pending(ok.stdout) and len(read_lessons(lessons_file)) == 0
    waiting = read_lessons(pending_path(lessons_file))
    assert len(waiting) == 1 and waiting[0]["author"].startswith("agent (campaign ")


def out_ok_pending(stdout: str) -> bool:
    return json.loads(stdout)["pending"] is True


def test_a_person_accepts_a_pending_lesson(lessons_file: Path) -> None:
    from attune.knowledge.lessons import pending_path

    rule = "Capture only the static-shape scopes first; dropless expert compute changes shape."
    assert run_script("add_lesson.py", "--file", str(lessons_file), "--lever", "cuda-graphs", "--rule",
                      rule + "\x1b]8;;http://evil/\x07click\x1b]8;;\x07").returncode == 0
    assert read_lessons(lessons_file) == []
    assert "\x1b" not in pending_path(lessons_file).read_text()  # control sequences dropped on the way in
    bad = run_cli("catalog", "accept-lesson", "L0009", "--file", str(lessons_file), "--json")
    assert bad.returncode == 1 and json.loads(bad.stdout)["accepted"] is False
    res = run_cli("catalog", "accept-lesson", "L0001", "--file", str(lessons_file), "--by", "alice", "--json")
    assert res.returncode == 0, res.stderr
    got = read_lessons(lessons_file)
    assert [g["id"] for g in got] == ["L0001"] and got[0]["accepted"].startswith("person alice on ")
    assert got[0]["author"].startswith("agent (campaign ") and read_lessons(pending_path(lessons_file)) == []
    assert run_cli("catalog", "accept-lesson", "x1", "--file", str(lessons_file)).returncode == 2


def test_cli_add_lesson_and_env_default(lessons_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    res = run_cli("catalog", "add-lesson", "--file", str(lessons_file), "--lever", "virtual-pipeline",
                  "--rule", "Fewer virtual stages win when the step is bound by inter-node sends.", "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["lesson"]["id"] == "L0001"
    monkeypatch.setenv("ATTUNE_LESSONS_FILE", str(lessons_file))
    from attune.knowledge.lessons import default_lessons_path

    assert default_lessons_path() == lessons_file


def test_the_documented_example_is_accepted(lessons_file: Path) -> None:
    doc = (SKILL / "references" / "lessons.md").read_text()
    block = re.search(r"```\n(python3 .*?add_lesson\.py.*?)\n```", doc, re.S).group(1)
    argv = shlex.split(block.replace("\\\n", " "))
    argv = argv[argv.index(next(a for a in argv if a.endswith("add_lesson.py"))) + 1:]
    res = run_script("add_lesson.py", "--file", str(lessons_file), *argv)
    assert res.returncode == 0, res.stderr
    entry = yaml.safe_load(lessons_file.with_name("lessons.pending.yaml").read_text())[0]  # waits for a person
    assert entry["lever"] == "recompute-granularity" and entry["applies_when"] and entry["evidence"]
