"""Every file-reading command of the CLI against a corpus of bad inputs, and generated ones.

Each case must end with exit 1 or 2 and an error on stderr: no Python traceback, no hang (a case
still running after its timeout is killed and fails the test). The corpus (`tests/_cli_fuzz.py`)
holds non-regular files (FIFO, directory, /dev/zero, /dev/null, broken and looping links), a sparse
3 GiB file, deep JSON and YAML, an alias bomb, bad encodings, non-finite numbers, lone surrogates,
python tags and random bytes. The fuzz test then drives the same commands with inputs hypothesis
generates, for a bounded number of examples.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attune.control.campaign import start
from attune.core import ledger
from tests._cli_fuzz import ALL_BAD, make_bad, run_case
from tests.conftest import EXAMPLE_CAMPAIGN, ROOT

GOOD_CURVE = json.dumps({str(i): 3.0 - i * 0.01 for i in range(1, 30)})
GOOD_RECIPE = "args:\n  --lr: 0.001\n"


@pytest.fixture(scope="module")
def started(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("started") / "camp"
    d.mkdir()
    shutil.copy(EXAMPLE_CAMPAIGN, d / "campaign.yaml")
    start(d)
    return d


Slot = Callable[[Path, Path, str], list[str]]


def _file(tmp: Path, name: str) -> Path:
    p = tmp / "input.json" if "json" in name or name in ("lone surrogate",) else tmp / "input.yaml"
    make_bad(p, name)
    return p


def _good(tmp: Path, name: str, text: str) -> Path:
    p = tmp / name
    p.write_text(text)
    return p


def _campaign_with(tmp: Path, started: Path, bad: str, which: str) -> Path:
    d = tmp / "camp"
    d.mkdir()
    if which == "ledger.jsonl":
        shutil.copy(started / "campaign.yaml", d / "campaign.yaml")
        shutil.copy(started / "ledger.jsonl", d / "ledger.jsonl")
        ledger.adopt(d, started)
        (d / "ledger.jsonl").unlink()
    make_bad(d / which, bad)
    return d


SLOTS: dict[str, Slot] = {
    "validate": lambda t, s, b: ["validate", str(_file(t, b))],
    "init": lambda t, s, b: ["init", str(_campaign_with(t, s, b, "campaign.yaml"))],
    "sim estimate": lambda t, s, b: ["sim", "estimate", str(_file(t, b))],
    "status": lambda t, s, b: ["status", str(_campaign_with(t, s, b, "ledger.jsonl"))],
    "report": lambda t, s, b: ["report", str(_campaign_with(t, s, b, "ledger.jsonl"))],
    "ledger verify": lambda t, s, b: ["ledger", "verify", str(_campaign_with(t, s, b, "ledger.jsonl"))],
    "ledger show": lambda t, s, b: ["ledger", "show", str(_campaign_with(t, s, b, "ledger.jsonl"))],
    "metrics": lambda t, s, b: ["metrics", str(_file(t, b)), "--gpus", "8"],
    "gate converge": lambda t, s, b: ["gate", "converge", str(_file(t, b)), str(_good(t, "c.json", GOOD_CURVE))],
    "gate check --list": lambda t, s, b: ["gate", "check", "--list", str(_file(t, b)), "--baseline",
                                          str(_good(t, "b.yaml", GOOD_RECIPE))],
    "gate check --baseline": lambda t, s, b: ["gate", "check", "--model", "tinygpt", "--baseline", str(_file(t, b))],
    "gate explain --list": lambda t, s, b: ["gate", "explain", "--list", str(_file(t, b)), "--lr"],
    "trace analyze": lambda t, s, b: ["trace", "analyze", str(_file(t, b))],
    "catalog validate --levers": lambda t, s, b: ["catalog", "validate", "--levers", str(_file(t, b))],
    "catalog validate --lessons": lambda t, s, b: ["catalog", "validate", "--lessons", str(_file(t, b))],
}


# Inputs that are not bad for a slot: an empty, null or empty-list lessons file holds no lessons.
NOT_BAD = {("catalog validate --lessons", b) for b in ("empty", "list", "null")}


def _check(argv: list[str]) -> str | None:
    """What is wrong with how the CLI handled this bad input (None: it refused it properly)."""
    out = run_case(argv, timeout_s=60)
    if out.hung:
        return "HANG " + out.describe()
    if out.traceback:
        return "TRACEBACK " + out.describe()
    if out.rc not in (1, 2):
        return "EXIT " + out.describe()
    if not out.stderr.strip() and not out.stdout.strip():
        return "SILENT " + out.describe()
    return None


@pytest.mark.parametrize("slot", sorted(SLOTS))
def test_every_bad_input_is_refused_cleanly(slot: str, started: Path, tmp_path: Path) -> None:
    problems = []
    for i, bad in enumerate(ALL_BAD):
        case = tmp_path / f"case{i}"
        case.mkdir()
        if (slot, bad) in NOT_BAD:
            continue
        argv = SLOTS[slot](case, started, bad)
        why = _check(argv)
        if why:
            problems.append(f"[{bad}] {why}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("content,code", [(b"", 2), (b"garbage\n", 1), (b"\x00\x00", 1)])
def test_status_and_report_refuse_an_empty_or_corrupt_ledger(started: Path, tmp_path: Path, content: bytes,
                                                             code: int) -> None:
    d = tmp_path / "camp"
    d.mkdir()
    shutil.copy(started / "campaign.yaml", d / "campaign.yaml")
    (d / "ledger.jsonl").write_bytes(content)
    for cmd in (["status", str(d)], ["status", str(d), "--json"], ["report", str(d)]):
        out = run_case(cmd)
        assert out.rc == code, out.describe()
        assert "None" not in out.stdout and "Traceback" not in out.stderr, out.describe()


def test_the_real_cli_refuses_dev_zero_and_a_fifo_in_one_line(tmp_path: Path) -> None:
    """End to end through a fresh interpreter, as a user would run it."""
    fifo = tmp_path / "campaign.yaml"
    make_bad(fifo, "FIFO")
    for target in ("/dev/zero", str(fifo)):
        res = subprocess.run([sys.executable, "-m", "attune", "validate", target], capture_output=True, text=True,
                             cwd=ROOT, timeout=60)
        assert res.returncode == 2, res
        assert "Traceback" not in res.stderr and "not a regular file" in res.stderr, res.stderr


# ------------------------------------------------------------------------------- generated inputs


def _nested(depth: int, kind: str) -> bytes:
    if kind == "json":
        return b'{"a": ' * depth + b"1" + b"}" * depth
    return b"- " * depth + b"x\n"


json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                      st.text(max_size=20))
json_values = st.recursive(json_leaf, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                             st.dictionaries(st.text(max_size=8), kids, max_size=4)),
                           max_leaves=30)
generated = st.one_of(
    st.binary(max_size=3000),
    st.text(max_size=2000).map(lambda s: s.encode("utf-8", "surrogatepass")),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.tuples(st.integers(50, 5000), st.sampled_from(["json", "yaml"])).map(lambda t: _nested(*t)),
    st.tuples(json_values, st.binary(max_size=50)).map(lambda t: json.dumps(t[0]).encode() + t[1]),
)

FUZZED_SLOTS = ["validate", "init", "sim estimate", "status", "ledger verify", "metrics", "gate converge",
                "gate check --list", "gate check --baseline", "trace analyze", "catalog validate --levers"]


@pytest.mark.parametrize("slot", FUZZED_SLOTS)
@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=generated)
def test_fuzz_generated_inputs_never_crash_or_hang(slot: str, data: bytes, started: Path, tmp_path: Path) -> None:
    case = Path(tmp_path) / f"fz{abs(hash(data)) % 10**9}"
    shutil.rmtree(case, ignore_errors=True)
    case.mkdir()
    argv = SLOTS[slot](case, started, "empty")
    # Replace the slot's empty input with the generated bytes.
    target = next(Path(a) for a in argv if Path(a).is_relative_to(case) and Path(a).name not in ("c.json", "b.yaml"))
    if target.is_dir():
        target = target / ("campaign.yaml" if slot == "init" else "ledger.jsonl")
    target.write_bytes(data)
    out = run_case(argv)
    assert not out.hung and not out.traceback, out.describe()
    assert out.rc in (0, 1, 2), out.describe()
