"""The bookkeeping's caches give what an uncached read gives: a poll with nothing new reads and folds
nothing, yet any change of the ledger, its anchor or its key is read and checked at once; the
per-campaign Follower (`state.current`) answers as `state.load`; a spec file is parsed once per content."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from attune.control import spec as spec_mod
from attune.core import ledger, state
from attune.core.ledger import Ledger
from tests.test_state import STARTED

ROOT = Path(__file__).resolve().parents[1]


def _fill(d: Path, n: int = 3) -> Ledger:
    led = Ledger(d)
    led.append("campaign_started", dict(STARTED))
    for i in range(n):
        led.append("launch_admitted", {"run_id": f"r{i}", "kind": "search", "expected_gpu_hours": 1.0,
                                        "changes": {"args": {"--micro-batch-size": i + 1}, "env": {"A": ["x", 1]}}})
    return led


def _count_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = ledger.read

    def counting(*args: object, **kwargs: object) -> ledger.ReadResult:
        calls.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ledger, "read", counting)
    return calls


def test_a_poll_with_nothing_new_reads_nothing_and_a_new_row_is_read(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    led = _fill(tmp_path)
    calls = _count_reads(monkeypatch)
    follower = state.Follower(tmp_path)
    first = follower.snapshot()
    assert len(calls) == 1 and len(first.runs) == 3
    for _ in range(5):
        assert follower.snapshot() == first
    assert len(calls) == 1  # the bytes were compared, nothing was parsed or folded again
    led.append("run_started", {"run_id": "r0"})
    assert follower.snapshot().runs["r0"].status == "running" and len(calls) == 2
    assert first.runs["r0"].status == "admitted"  # the earlier snapshot kept its own run


def test_a_changed_anchor_is_checked_at_the_next_poll(tmp_path: Path) -> None:
    _fill(tmp_path)
    follower = state.Follower(tmp_path)
    follower.refresh()
    anchor = ledger.anchor_path(tmp_path)
    body = json.loads(anchor.read_bytes())
    body["rows"] -= 1  # the same size or near it, and a wrong MAC
    anchor.write_bytes(json.dumps(body, sort_keys=True).encode() + b"\n")
    with pytest.raises(ledger.LedgerError) as exc:
        follower.refresh()
    assert exc.value.kind == "anchor_missing"


def test_current_answers_as_load_and_raises_what_it_raises(tmp_path: Path) -> None:
    led = _fill(tmp_path)
    loaded, _ = state.load(tmp_path)
    got = state.current(tmp_path)
    assert got == loaded and got.as_dict() == loaded.as_dict()
    got.runs.pop("r0")  # the caller's own copy
    led.append("run_started", {"run_id": "r1"})
    again = state.current(tmp_path)
    assert "r0" in again.runs and again.runs["r1"].status == "running" and again == state.load(tmp_path)[0]
    path = tmp_path / ledger.LEDGER_NAME
    rows = [json.loads(x) for x in path.read_bytes().splitlines()]
    rows[1]["mac"], rows[2]["mac"] = rows[2]["mac"], rows[1]["mac"]  # same size, same last row
    path.write_bytes(b"".join(ledger.canonical(r) + b"\n" for r in rows))
    with pytest.raises(ledger.LedgerError) as full:
        state.load(tmp_path)
    with pytest.raises(ledger.LedgerError) as cached:
        state.current(tmp_path)
    assert cached.value.kind == full.value.kind == "rewritten"


def test_run_dicts_are_asdicts(tmp_path: Path) -> None:
    _fill(tmp_path)
    s, _ = state.load(tmp_path)
    for run in s.runs.values():
        d = state.run_dict(run)
        assert d == dataclasses.asdict(run) and list(d) == list(dataclasses.asdict(run))
        d["changes"]["env"]["A"].append("mine")  # a deep copy: the state is left alone
        assert run.changes["env"]["A"] == ["x", 1]


def test_a_spec_is_parsed_once_per_content(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copy(ROOT / "examples" / "campaigns" / "glm45-128xb200" / "campaign.yaml", tmp_path / "campaign.yaml")
    parses: list[int] = []
    real = spec_mod.yaml.load

    def counting(*args: object, **kwargs: object) -> object:
        parses.append(1)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(spec_mod.yaml, "load", counting)
    monkeypatch.setattr(spec_mod, "_PARSED", {})
    a, b = spec_mod.load_spec(tmp_path), spec_mod.load_spec(tmp_path)
    assert a == b and a is not b and len(parses) == 1
    text = (tmp_path / "campaign.yaml").read_text()
    (tmp_path / "campaign.yaml").write_text(text.replace(f"name: {a.name}", "name: edited-sim", 1))
    c = spec_mod.load_spec(tmp_path)
    assert c.name == "edited-sim" and a.name != "edited-sim" and len(parses) == 2  # new bytes: parsed again


def test_a_full_read_reuses_only_the_bytes_it_verified(tmp_path: Path) -> None:
    """A second full read re-parses the rows the first verified only while the file starts with those
    very bytes under the same key: a same-size edit of a verified row is named as without the reuse."""
    led = _fill(tmp_path)
    first = ledger.read(tmp_path)
    led.append("run_started", {"run_id": "r2"})
    second = ledger.read(tmp_path)  # the verified rows again, and the new one verified
    assert [r.hash for r in second.rows[:-1]] == [r.hash for r in first.rows] and second.rows[-1].type == "run_started"
    second.rows[1].data["changes"]["env"]["A"].append("mine")  # the caller's own objects
    assert ledger.read(tmp_path).rows[1].data["changes"]["env"]["A"] == ["x", 1]
    path = tmp_path / ledger.LEDGER_NAME
    rows = [json.loads(x) for x in path.read_bytes().splitlines()]
    rows[1]["mac"], rows[2]["mac"] = rows[2]["mac"], rows[1]["mac"]
    path.write_bytes(b"".join(ledger.canonical(r) + b"\n" for r in rows))
    with pytest.raises(ledger.LedgerError) as exc:
        ledger.read(tmp_path)
    assert exc.value.kind == "rewritten"
