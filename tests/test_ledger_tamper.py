"""A corpus of ledger tamperings, each detected and named; and the cases that must still verify.

The attacker can write the campaign directory (the ledger file) but not the key directory outside it
(`${XDG_STATE_HOME:-~/.local/state}/attune/ledger-keys/`), where the key and the anchor live; the key
and anchor tamperings model a lost key or anchor. Every tampering is checked through `verify`, through
`read` (what every reader uses) and, for a sample, through the CLI.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from attune.core import ledger
from attune.core.ledger import LEDGER_NAME, Ledger, LedgerError, row_hash
from tests.conftest import EXAMPLE_CAMPAIGN, ROOT, run_cli

ROWS = 70


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tmpl") / "camp"
    d.mkdir()
    led = Ledger(d)
    led.append("campaign_started", {"name": "t", "spec_sha256": "0" * 64, "gpus": 8})
    for i in range(1, ROWS):
        if i % 3 == 0:
            led.append("run_finished", {"run_id": f"r{i:03d}", "outcome": "ok", "charge_gpu_hours": 0.5})
        else:
            led.append("diagnosis_recorded", {"text": f"row {i}"})
    return d


@pytest.fixture(scope="module")
def foldable_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same shape (row 3 a run_finished, ROWS rows), with every finished run admitted first."""
    d = tmp_path_factory.mktemp("tmpl") / "camp"
    d.mkdir()
    led = Ledger(d)
    led.append("campaign_started", {"name": "t", "spec_sha256": "0" * 64, "gpus": 8})
    for i in range(1, ROWS):
        if i % 3 == 0:
            led.append("run_finished", {"run_id": f"r{i:03d}", "outcome": "ok", "charge_gpu_hours": 0.5})
        elif i % 3 == 2:
            led.append("launch_admitted", {"run_id": f"r{i + 1:03d}", "kind": "search", "expected_gpu_hours": 0.5,
                                           "text": f"row {i}"})
        else:
            led.append("diagnosis_recorded", {"text": f"row {i}"})
    return d


def _copy(template: Path, where: Path) -> Path:
    where.mkdir()
    shutil.copy(template / LEDGER_NAME, where / LEDGER_NAME)
    ledger.adopt(where, template)
    return where


def _rewrite_first(d: Path) -> None:
    rows = _rows(d)
    rows[0]["hash"] = "f" * 64
    _write(d, rows)


def _rows(d: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (d / LEDGER_NAME).read_bytes().splitlines()]


def _write(d: Path, rows: list[dict[str, Any]]) -> None:
    (d / LEDGER_NAME).write_bytes(b"".join(ledger.canonical(r) + b"\n" for r in rows))


def _rechain(rows: list[dict[str, Any]], start: int = 0, keep_mac: bool = True) -> list[dict[str, Any]]:
    """Recompute seq, prev and hash from `start` on, as an attacker without the key can."""
    prev = rows[start - 1]["hash"] if start > 0 else ledger.GENESIS
    for i in range(start, len(rows)):
        r = rows[i]
        r["seq"], r["prev"] = i, prev
        r["hash"] = row_hash(r["seq"], r["ts"], r["type"], r["data"], r["prev"])
        if not keep_mac:
            r.pop("mac", None)
        prev = r["hash"]
    return rows


def _fresh_chain(n: int) -> list[dict[str, Any]]:
    rows = [{"seq": 0, "ts": "2026-01-01T00:00:00+00:00", "type": "campaign_started",
             "data": {"name": "t", "spec_sha256": "1" * 64, "gpus": 8}, "prev": "", "hash": ""}]
    rows += [{"seq": i, "ts": "2026-01-01T00:00:00+00:00", "type": "diagnosis_recorded",
              "data": {"text": f"forged {i}"}, "prev": "", "hash": ""} for i in range(1, n)]
    return _rechain(rows, keep_mac=False)


def _set(rows: list[dict[str, Any]], i: int, **data: Any) -> list[dict[str, Any]]:
    rows[i]["data"] = {**rows[i]["data"], **data}
    return rows


def _negative_charge(rows: list[dict[str, Any]], at: int) -> dict[str, Any]:
    r = {"seq": at, "ts": rows[-1]["ts"], "type": "run_finished",
         "data": {"run_id": "r999", "outcome": "ok", "charge_gpu_hours": -1000.0}, "prev": rows[at - 1]["hash"]}
    r["hash"] = row_hash(r["seq"], r["ts"], r["type"], r["data"], r["prev"])
    r["mac"] = rows[at - 1]["mac"]
    return r


def _truncate_bytes(d: Path, keep: int) -> None:
    with open(d / LEDGER_NAME, "r+b") as fh:
        fh.truncate(keep)


def _size(d: Path) -> int:
    return (d / LEDGER_NAME).stat().st_size


Tamper = Callable[[Path, Path], None]
M = ROWS // 2  # a middle row

TAMPERINGS: dict[str, tuple[Tamper, str]] = {
    "drop the last row": (lambda d, t: _write(d, _rows(d)[:-1]), "dropped_tail"),
    "drop the last 10 rows": (lambda d, t: _write(d, _rows(d)[:-10]), "dropped_tail"),
    "keep only the first row": (lambda d, t: _write(d, _rows(d)[:1]), "dropped_tail"),
    "truncate to zero": (lambda d, t: _truncate_bytes(d, 0), "truncated"),
    "delete the file": (lambda d, t: (d / LEDGER_NAME).unlink(), "truncated"),
    "truncate mid-file (half the bytes)": (lambda d, t: _truncate_bytes(d, _size(d) // 2), "truncated"),
    "cut the last newline": (lambda d, t: _truncate_bytes(d, _size(d) - 1), "truncated"),
    "rewrite a middle row, chain recomputed, MACs kept": (
        lambda d, t: _write(d, _rechain(_set(_rows(d), M, text="nothing to see"), M)), "rewritten"),
    "rewrite a middle row, chain recomputed, MACs dropped": (
        lambda d, t: _write(d, _rechain(_set(_rows(d), M, text="x"), M, keep_mac=False)), "rewritten"),
    "edit a middle row without recomputing": (lambda d, t: _write(d, _set(_rows(d), M, text="y")), "altered"),
    "lower a charge, chain recomputed": (
        lambda d, t: _write(d, _rechain(_set(_rows(d), 3, charge_gpu_hours=0.0), 3)), "rewritten"),
    "append a forged row without a MAC": (
        lambda d, t: _write(d, _rechain([*_rows(d), {**_rows(d)[1], "data": {"text": "forged"}}], ROWS,
                                        keep_mac=False)), "forged"),
    "append a forged row with a copied MAC": (
        lambda d, t: _write(d, _rechain([*_rows(d), {**_rows(d)[1], "data": {"text": "forged"}}], ROWS)), "forged"),
    "append run_finished with a negative charge": (
        lambda d, t: _write(d, [*_rows(d), _negative_charge(_rows(d), ROWS)]), "forged"),
    "replace the last row by a negative charge": (
        lambda d, t: _write(d, [*_rows(d)[:-1], _negative_charge(_rows(d), ROWS - 1)]), "rewritten"),
    "swap two middle rows": (
        lambda d, t: _write(d, (lambda r: r[:M] + [r[M + 1], r[M]] + r[M + 2:])(_rows(d))), "out_of_order"),
    "duplicate a middle row": (lambda d, t: _write(d, (lambda r: r[:M + 1] + r[M:])(_rows(d))), "out_of_order"),
    "delete a middle row": (lambda d, t: _write(d, (lambda r: r[:M] + r[M + 1:])(_rows(d))), "out_of_order"),
    "delete a middle row and renumber the rest": (
        lambda d, t: _write(d, _rechain((lambda r: r[:M] + r[M + 1:])(_rows(d)), M)), "rewritten"),
    "delete a middle row, renumber, pad back to the anchored count": (
        lambda d, t: _write(d, _rechain((lambda r: r[:M] + r[M + 1:] + [r[-1]])(_rows(d)), M)), "rewritten"),
    "replace the ledger by a fresh chain of the same length": (lambda d, t: _write(d, _fresh_chain(ROWS)),
                                                               "rewritten"),
    "replace the ledger by a longer fresh chain": (lambda d, t: _write(d, _fresh_chain(ROWS + 5)), "rewritten"),
    "swap MACs of two rows": (
        lambda d, t: _write(d, (lambda r: (r[M].__setitem__("mac", r[M + 1]["mac"]), r)[1])(_rows(d))), "rewritten"),
    "a garbage line in the middle": (
        lambda d, t: (d / LEDGER_NAME).write_bytes(b"".join(
            (b"garbage\n" if i == M else x + b"\n") for i, x in enumerate((d / LEDGER_NAME).read_bytes().splitlines()))),
        "corrupt"),
    "a JSON list in place of a row": (
        lambda d, t: (d / LEDGER_NAME).write_bytes(b"".join(
            (b"[1, 2]\n" if i == M else x + b"\n") for i, x in enumerate((d / LEDGER_NAME).read_bytes().splitlines()))),
        "corrupt"),
    "a 5 MB line appended": (lambda d, t: (d / LEDGER_NAME).open("ab").write(b"x" * (5 * 2**20) + b"\n"), "corrupt"),
    "the key deleted": (lambda d, t: ledger.key_path(d).unlink(), "key_missing"),
    "the anchor deleted": (lambda d, t: ledger.anchor_path(d).unlink(), "anchor_missing"),
    "the anchor garbled": (lambda d, t: ledger.anchor_path(d).write_text("{}"), "anchor_missing"),
    "the anchor's count raised without the key": (
        lambda d, t: ledger.anchor_path(d).write_text(json.dumps(
            {**json.loads(ledger.anchor_path(d).read_text()), "rows": ROWS + 1})), "anchor_missing"),
    # A directory copied elsewhere is no tampering: its rows are checked with the original's key, found by its
    # first row (tests/test_messages.py). A copy whose first row is not its original's has no key: refused.
    "the directory copied elsewhere, its first row rewritten": (
        lambda d, t: (ledger.key_path(d).unlink(), ledger.anchor_path(d).unlink(), _rewrite_first(d)),
        "key_missing"),
}


@pytest.mark.parametrize("name", sorted(TAMPERINGS))
def test_every_tampering_is_detected_and_named(template: Path, tmp_path: Path, name: str) -> None:
    tamper, kind = TAMPERINGS[name]
    d = _copy(template, tmp_path / "c")
    assert ledger.verify(d).ok
    tamper(d, template)
    rep = ledger.verify(d)
    assert not rep.ok and rep.problem == kind, (rep.problem, rep.error)
    if (d / LEDGER_NAME).exists():
        with pytest.raises(LedgerError) as exc:
            ledger.read(d)
        assert exc.value.kind == kind
    if kind not in ("key_missing", "anchor_missing", "corrupt", "out_of_order", "altered") and "MACs of" not in name:
        with pytest.raises(LedgerError):  # the control plane never extends a tampered ledger
            Ledger(d).append("diagnosis_recorded", {"text": "after"})


@pytest.mark.parametrize("name", sorted(TAMPERINGS))
def test_an_incremental_reader_that_read_the_ledger_before_detects_every_tampering(
        foldable_template: Path, tmp_path: Path, name: str) -> None:
    """The control plane's state reader (`state.Follower`) reads only new rows: a tampering of rows it
    has already read is still detected at its next refresh, and named as a full read names it."""
    from attune.core.state import Follower

    tamper, kind = TAMPERINGS[name]
    d = _copy(foldable_template, tmp_path / "c")
    follower = Follower(d)
    assert follower.refresh().last_seq == ROWS - 1 and follower.refresh().budget.charged == 0.5 * (ROWS // 3)
    tamper(d, foldable_template)
    if not (d / LEDGER_NAME).exists():
        assert follower.refresh().last_seq == -1  # what a full read folds: nothing (verify says truncated)
        return
    with pytest.raises(LedgerError) as exc:
        follower.refresh()
    assert exc.value.kind == kind, (exc.value.kind, str(exc.value))


def test_a_mid_file_truncation_is_not_reported_as_a_torn_line(template: Path, tmp_path: Path) -> None:
    d = _copy(template, tmp_path / "c")
    _truncate_bytes(d, _size(d) // 2)
    rep = ledger.verify(d)
    assert not rep.ok and "not a torn last line" in rep.error and f"anchor records {ROWS}" in rep.error


@pytest.mark.parametrize("cmd", [["ledger", "verify"], ["status"], ["report"], ["ledger", "show"]])
def test_the_cli_readers_fail_on_a_dropped_tail(template: Path, tmp_path: Path, cmd: list[str]) -> None:
    d = _copy(template, tmp_path / "c")
    shutil.copy(EXAMPLE_CAMPAIGN, d / "campaign.yaml")
    _write(d, _rows(d)[:-3])
    res = run_cli(*cmd, str(d))
    assert res.returncode == 1, res
    assert "dropped" in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_ledger_verify_json_names_the_problem(template: Path, tmp_path: Path) -> None:
    d = _copy(template, tmp_path / "c")
    _write(d, _rechain(_set(_rows(d), M, text="z"), M))
    res = run_cli("ledger", "verify", str(d), "--json")
    out = json.loads(res.stdout)
    assert res.returncode == 1 and out["ok"] is False and out["problem"] == "rewritten"


# ------------------------------------------------------------------------------- what must still verify


def test_an_untouched_ledger_verifies_authenticated(template: Path, tmp_path: Path) -> None:
    d = _copy(template, tmp_path / "c")
    rep = ledger.verify(d)
    assert rep.ok and rep.authenticated and rep.anchor_rows == ROWS and rep.rows == ROWS
    res = run_cli("ledger", "verify", str(d))
    assert res.returncode == 0 and "MAC" in res.stdout


def test_a_torn_last_line_still_verifies_and_is_repaired(template: Path, tmp_path: Path) -> None:
    d = _copy(template, tmp_path / "c")
    with open(d / LEDGER_NAME, "ab") as fh:
        fh.write(b'{"seq": 70, "ts": "2026-')
    rep = ledger.verify(d)
    assert rep.ok and rep.torn_tail and rep.rows == ROWS
    row = Ledger(d).append("diagnosis_recorded", {"text": "after the tear"})
    assert row.seq == ROWS and ledger.verify(d).ok and ledger.verify(d).anchor_rows == ROWS + 1


def test_an_anchor_one_row_behind_after_a_crash_verifies_and_catches_up(template: Path, tmp_path: Path) -> None:
    d = _copy(template, tmp_path / "c")
    rows = _rows(d)
    key = ledger._load_key(ledger.key_path(d))
    ledger._write_anchor(d, key, ROWS - 1, rows[-2]["hash"])  # the row was fsynced, the anchor not yet moved
    assert ledger.verify(d).ok
    Ledger(d).append("diagnosis_recorded", {"text": "next"})
    rep = ledger.verify(d)
    assert rep.ok and rep.anchor_rows == ROWS + 1


def test_a_reader_without_the_key_checks_the_chain_and_the_anchor(template: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    d = _copy(template, tmp_path / "c")
    monkeypatch.setenv(ledger.AUTH_ENV, "chain")
    rep = ledger.verify(d)
    assert rep.ok and not rep.authenticated and ledger.AUTH_ENV in (rep.note or "")
    _write(d, _rows(d)[:-2])
    rep = ledger.verify(d)
    assert not rep.ok and rep.problem == "dropped_tail"  # the anchor is still read
    _write(d, _fresh_chain(ROWS + 1))  # without the key, a recomputed chain of more rows cannot be told apart...
    rep = ledger.verify(d)
    assert not rep.ok and rep.problem == "rewritten"  # ...except that its row at the anchored head differs


def test_init_files_the_key_and_anchor_outside_the_campaign(tmp_path: Path) -> None:
    camp, state = tmp_path / "camp", tmp_path / "state"
    camp.mkdir()
    shutil.copy(EXAMPLE_CAMPAIGN, camp / "campaign.yaml")
    env = {**os.environ, "XDG_STATE_HOME": str(state)}
    res = subprocess.run([sys.executable, "-m", "attune", "init", str(camp)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    keys = state / "attune" / "ledger-keys"
    cid = ledger.campaign_id(camp)
    assert stat.S_IMODE(keys.stat().st_mode) == 0o700
    assert stat.S_IMODE((keys / cid).stat().st_mode) == 0o600
    assert stat.S_IMODE((keys / f"{cid}.anchor").stat().st_mode) == 0o600
    assert json.loads((keys / f"{cid}.anchor").read_text())["rows"] == 1
    assert not any("key" in p.name for p in camp.rglob("*"))
    # Without that state directory, the ledger's key is missing: verify says so.
    res = subprocess.run([sys.executable, "-m", "attune", "ledger", "verify", str(camp)], cwd=ROOT,
                         env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "elsewhere")}, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 1 and "key missing" in res.stderr


STARTED = {"name": "t", "spec_sha256": "0" * 64, "gpus": 8}


def test_a_deleted_ledger_is_not_silently_started_again(tmp_path: Path) -> None:
    d = tmp_path / "c"
    d.mkdir()
    Ledger(d).append("campaign_started", STARTED)
    Ledger(d).append("diagnosis_recorded", {"text": "history"})
    (d / LEDGER_NAME).unlink()
    with pytest.raises(LedgerError, match="is gone but its anchor records 2 rows") as exc:
        Ledger(d).append("run_finished", {"run_id": "r1", "outcome": "ok", "charge_gpu_hours": 0.0})
    assert exc.value.kind == "truncated"
    # A campaign started here again (attune init) gets a new key; the old one is kept, retired.
    Ledger(d).append("campaign_started", STARTED)
    rep = ledger.verify(d)
    assert rep.ok and rep.rows == 1 and rep.anchor_rows == 1
    assert len(list(ledger.keys_dir().glob(ledger.campaign_id(d) + "*.retired-*"))) == 2


def test_a_directory_made_again_starts_a_new_ledger(tmp_path: Path) -> None:
    d = tmp_path / "c"
    d.mkdir()
    Ledger(d).append("campaign_started", STARTED)
    Ledger(d).append("diagnosis_recorded", {"text": "first campaign"})
    shutil.rmtree(d)
    d.mkdir()
    Ledger(d).append("campaign_started", STARTED)
    rep = ledger.verify(d)
    assert rep.ok and rep.rows == 1 and rep.anchor_rows == 1
