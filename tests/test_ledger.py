from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attune.core import ledger
from attune.core.ledger import LEDGER_NAME, TORN_NAME, Ledger, LedgerError
from tests.conftest import run_cli

WRITER = Path(__file__).with_name("ledger_writer.py")


def _writer(d: Path, count: int, pad: int = 200, tear: bool = False) -> subprocess.Popen[str]:
    cmd = [sys.executable, str(WRITER), str(d), str(count), str(pad)] + (["--tear"] if tear else [])
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)


def _acks(out: str) -> dict[int, str]:
    acks = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "ack":
            acks[int(parts[1])] = parts[2]
    return acks


def test_append_chains_and_verifies(tmp_path: Path) -> None:
    led = Ledger(tmp_path)
    a = led.append("diagnosis_recorded", {"text": "one"})
    b = led.append("assumption_recorded", {"question": "q?", "default": "take the default"})
    assert (a.seq, b.seq) == (0, 1)
    assert a.prev == ledger.GENESIS and b.prev == a.hash
    rows = led.rows()
    assert [r.hash for r in rows] == [a.hash, b.hash]
    rep = ledger.verify(tmp_path)
    assert rep.ok and rep.rows == 2 and not rep.torn_tail and rep.last_hash == b.hash


@pytest.mark.parametrize(
    ("type_", "data", "message"),
    [
        ("no_such_event", {}, "unknown row type"),
        ("run_finished", {"run_id": "r1"}, "missing data field"),
        ("diagnosis_recorded", {"text": float("nan")}, "not plain JSON"),
        ("diagnosis_recorded", {"text": object()}, "not plain JSON"),
    ],
)
def test_bad_events_are_refused_and_nothing_is_written(tmp_path: Path, type_: str, data: dict, message: str) -> None:
    with pytest.raises(LedgerError, match=message):
        Ledger(tmp_path).append(type_, data)
    assert not (tmp_path / LEDGER_NAME).exists()


def test_edit_in_the_middle_breaks_the_chain_at_that_row(tmp_path: Path) -> None:
    led = Ledger(tmp_path)
    for i in range(5):
        led.append("diagnosis_recorded", {"text": f"row {i}"})
    lines = (tmp_path / LEDGER_NAME).read_text().splitlines(keepends=True)
    lines[2] = lines[2].replace("row 2", "row X")
    (tmp_path / LEDGER_NAME).write_text("".join(lines))
    rep = ledger.verify(tmp_path)
    assert not rep.ok and rep.rows == 2
    assert "line 3" in rep.error and "hash mismatch" in rep.error
    with pytest.raises(LedgerError, match="line 3"):
        ledger.read(tmp_path)
    res = run_cli("ledger", "verify", str(tmp_path), "--json")
    assert res.returncode == 1
    assert json.loads(res.stdout)["ok"] is False


def test_deleted_row_is_caught(tmp_path: Path) -> None:
    led = Ledger(tmp_path)
    for i in range(4):
        led.append("diagnosis_recorded", {"text": f"row {i}"})
    lines = (tmp_path / LEDGER_NAME).read_text().splitlines(keepends=True)
    del lines[1]
    (tmp_path / LEDGER_NAME).write_text("".join(lines))
    rep = ledger.verify(tmp_path)
    assert not rep.ok and "line 2" in rep.error and "sequence number" in rep.error


def test_torn_tail_is_reported_ignored_and_repaired_by_next_append(tmp_path: Path) -> None:
    led = Ledger(tmp_path)
    led.append("diagnosis_recorded", {"text": "kept"})
    with open(tmp_path / LEDGER_NAME, "ab") as fh:
        fh.write(b'{"seq": 1, "ts": "x", "type": "diagnosis_recorded", "data": {"text": "half')
    res = ledger.read(tmp_path)
    assert [r.data["text"] for r in res.rows] == ["kept"]
    assert res.torn_tail is not None and "half" in res.torn_tail
    rep = ledger.verify(tmp_path)
    assert rep.ok and rep.torn_tail and rep.rows == 1
    out = run_cli("ledger", "verify", str(tmp_path))
    assert out.returncode == 0 and "torn last line" in out.stdout
    # The next append moves the fragment aside (never merges it) and chains to the last good row.
    row = led.append("diagnosis_recorded", {"text": "after"})
    assert row.seq == 1
    assert [r.data["text"] for r in led.rows()] == ["kept", "after"]
    torn = [json.loads(x) for x in (tmp_path / TORN_NAME).read_text().splitlines()]
    assert len(torn) == 1 and "half" in torn[0]["fragment"]
    assert ledger.verify(tmp_path).ok and not ledger.verify(tmp_path).torn_tail


def test_sigkill_at_random_moments_loses_no_acknowledged_row(tmp_path: Path) -> None:
    rng = random.Random(20261129)
    acked: dict[int, str] = {}
    rounds = 25
    torn_seen = 0
    for i in range(rounds):
        tear = i % 5 == 4  # every fifth writer crashes in the middle of writing a line
        proc = _writer(tmp_path, count=10_000 if not tear else rng.randint(1, 20), pad=rng.choice([50, 2000, 20000]), tear=tear)
        if not tear:
            time.sleep(rng.uniform(0.05, 0.4))
            proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == -signal.SIGKILL
        acked.update(_acks(out))
        res = ledger.read(tmp_path)  # raises if the chain is broken anywhere
        torn_seen += res.torn_tail is not None
        by_seq = {r.seq: r.hash for r in res.rows}
        lost = [s for s in acked if by_seq.get(s) != acked[s]]
        assert not lost, f"acknowledged rows lost after round {i}: {lost[:5]}"
    assert torn_seen >= rounds // 5  # every tearing writer left a torn tail that was reported
    rep = ledger.verify(tmp_path)
    assert rep.ok and rep.rows >= len(acked) > 0


def test_concurrent_writers_produce_one_valid_chain(tmp_path: Path) -> None:
    procs = [_writer(tmp_path, count=150, pad=100) for _ in range(6)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    acked = {}
    for out in outs:
        acks = _acks(out)
        assert len(acks) == 150
        acked.update(acks)
    rows = ledger.read(tmp_path).rows
    assert len(rows) == 900 == len(acked)
    assert [r.seq for r in rows] == list(range(900))
    assert {r.seq: r.hash for r in rows} == acked
    texts = {r.data["text"] for r in rows}
    assert len(texts) == 900  # every row from every writer is present exactly once


def test_ledger_show_cli(tmp_path: Path) -> None:
    led = Ledger(tmp_path)
    for i in range(3):
        led.append("diagnosis_recorded", {"text": f"row {i}"})
    res = run_cli("ledger", "show", str(tmp_path), "--tail", "2", "--json")
    assert res.returncode == 0
    rows = json.loads(res.stdout)["rows"]
    assert [r["seq"] for r in rows] == [1, 2]
    missing = run_cli("ledger", "verify", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "no ledger.jsonl" in missing.stderr
