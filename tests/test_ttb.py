"""TrainingThroughputBench: the workload builder, submit's refusals, the verifier against tampering, the
page in real headless Chromium, and the best-recipe lookup.

One real simulated TTB campaign (MiniMax-M2 on the simulated 64 x B200 cluster, heuristic tuner,
through `attune tune`) is run once per module and every entry test starts from a fresh copy of it.
"""

from __future__ import annotations

import html.parser
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from attune.core import ledger
from attune.ttb import protocol as proto
from attune.ttb import workload as wl
from attune.ttb.entry import SIM_LABEL, load_entry, load_prices, usd_per_million
from attune.ttb.lookup import best
from attune.ttb.submit import SubmitRefused, sha256_file, submit
from attune.ttb.verify import verify_entry

ROOT = Path(__file__).resolve().parents[1]
MIXTRAL = ROOT / "examples" / "campaigns" / "mixtral-8x22b-128xh100"
MINIMAX = ROOT / "examples" / "campaigns" / "minimax-m2-64xb200"
ATTUNE = [sys.executable, "-m", "attune"]

pytest.importorskip("tokenizers", reason="the ttb extra (scripts/setup.sh installs it)")


def _cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ATTUNE, *args], capture_output=True, text=True, cwd=cwd, timeout=600)


# ---------------------------------------------------------------------------------- workload


def test_workload_round_trip_with_a_real_tokenizer_and_chat_template(tmp_path: Path) -> None:
    tok = wl.load_tokenizer(wl.SAMPLE_TOKENIZER)
    convs = list(wl.read_jsonl(wl.SAMPLE_CONVERSATIONS))
    text = wl.render(tok.chat_template, convs[3])
    assert text.startswith("<|user|>\n") and "<|assistant|>\n" in text and text.count("<|user|>") == 2
    expected, used = wl.pack(iter(convs), tok, tok.chat_template, 64, None)
    res = wl.build_rows(tmp_path / "rows", tokenizer=wl.SAMPLE_TOKENIZER, seq_length=64, num_rows=None,
                        conversations=wl.SAMPLE_CONVERSATIONS)
    assert res.num_rows == expected.shape[0] > 10 and res.conversations == used == len(convs)
    rows = wl.Rows(tmp_path / "rows")
    got = np.stack([rows.row(i) for i in range(len(rows))])
    assert np.array_equal(got, expected) and rows.verify() == res.num_rows
    # every conversation ends with the end-of-sequence token; rows are cut at exactly 64 tokens
    assert int((expected == tok.eos_id).sum()) in (len(convs), len(convs) - 1)
    # decoding the first row gives back the first conversation's rendered text
    from tokenizers import Tokenizer

    hf = Tokenizer.from_file(str(wl.SAMPLE_TOKENIZER / "tokenizer.json"))
    first = wl.render(tok.chat_template, convs[0])
    assert first.startswith(hf.decode(list(expected[0][:20]), skip_special_tokens=False))
    steps = list(rows.batches(global_batch=2, steps=3))
    assert len(steps) == 3 and np.array_equal(steps[1][0], expected[2])
    m = json.loads((tmp_path / "rows" / wl.MANIFEST).read_text())
    assert m["tokenizer"]["vocab_size"] == 640 and len(m["row_hashes"]) == res.num_rows


def test_a_changed_row_is_refused_on_read(tmp_path: Path) -> None:
    wl.build_rows(tmp_path, tokenizer="bytes", seq_length=32, num_rows=40, conversations=wl.SAMPLE_CONVERSATIONS)
    path = tmp_path / wl.ROWS_FILE
    data = bytearray(path.read_bytes())
    data[7 * 32 * 4 + 5] ^= 0x01  # one bit of row 7
    path.write_bytes(bytes(data))
    rows = wl.Rows(tmp_path)
    rows.row(6)
    rows.row(8)
    with pytest.raises(wl.RowHashError, match="row 7"):
        rows.row(7)
    with pytest.raises(wl.RowHashError):
        list(rows.batches(global_batch=4, steps=2))
    r = _cli("ttb", "workload", "verify", str(tmp_path), "--json")
    assert r.returncode == 1 and not json.loads(r.stdout)["ok"] and "row 7" in json.loads(r.stdout)["detail"]
    path.write_bytes(bytes(data[:-4]))
    with pytest.raises(wl.WorkloadError, match="bytes"):
        wl.Rows(tmp_path)


def test_bad_conversations_name_the_line(tmp_path: Path) -> None:
    f = tmp_path / "c.jsonl"
    f.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n{"messages": [{"role": "wizard", "content": 1}]}\n')
    r = _cli("ttb", "workload", "build", "--tokenizer", "bytes", "--conversations", str(f), "--seq-length", "4",
             "--rows", "50", "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and "c.jsonl:2: messages[0]" in r.stderr and not (tmp_path / "o").exists()


def test_the_committed_local_workload_verifies_and_feeds_tinygpt() -> None:
    d = ROOT / "ttb" / "workloads" / "ttb-v1-local-sft"
    rows = wl.Rows(d)
    assert rows.verify() == 320 and rows.seq_length == proto.TTB_V1_LOCAL.seq_length
    sys.path.insert(0, str(ROOT))
    from examples.tinygpt.data import PackedRows

    packed = PackedRows(d / "tinygpt", 128)
    assert np.array_equal(packed.row(3)[:128], rows.row(3)) and packed.row(3)[128] == rows.row(4)[0]


# ---------------------------------------------------------------------------------- campaigns


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("ttb") / "minimax"
    r = _cli("ttb", "template", str(MINIMAX), "--out", str(d), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["protocol"] == "ttb-v1"
    r = _cli("tune", str(d / "campaign.yaml"), "--tuner", "heuristic", "--quiet", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["shipped"] not in (None, "baseline")
    return d


@pytest.fixture(scope="module")
def submitted(campaign: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The module campaign's entry, submitted once; tests get a copy (`entry`)."""
    path, _ = submit(campaign, tmp_path_factory.mktemp("ttb-entries") / "entries", load_prices())
    return path


@pytest.fixture
def entry(submitted: Path, tmp_path: Path) -> Path:
    path = tmp_path / "entries" / submitted.name
    shutil.copytree(submitted, path)
    return path


def _rechain(path: Path, edit) -> None:  # noqa: ANN001 - a callable on each row's dict
    """Rewrite a ledger with `edit` applied to each row and a valid hash chain (a consistent forgery)."""
    prev = ledger.GENESIS
    out = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        edit(row)
        row["prev"] = prev
        row["hash"] = ledger.row_hash(row["seq"], row["ts"], row["type"], row["data"], prev)
        prev = row["hash"]
        out.append(json.dumps(row, sort_keys=True, separators=(",", ":")))
    path.write_text("\n".join(out) + "\n")


def _reissue(d: Path, edit=None, stop_before: str | None = None) -> None:  # noqa: ANN001
    """A copied campaign's ledger written again, row by row, under the copy's own key (ledger keys are
    filed by the directory's real path): optionally with `edit` applied to each row's dict and cut
    before the first row of type `stop_before`. This is what a campaign that really ended so would hold."""
    from datetime import datetime

    rows = ledger.read(d, chain_only=True).rows
    (d / "ledger.jsonl").unlink()
    book = ledger.Ledger(d)
    for r in rows:
        if stop_before and r.type == stop_before:
            break
        row = {"type": r.type, "data": json.loads(json.dumps(r.data))}
        if edit:
            edit(row)
        book.append(row["type"], row["data"], now=datetime.fromisoformat(r.ts.replace("Z", "+00:00")))


def test_the_template_pins_the_protocol(campaign: Path, tmp_path: Path) -> None:
    from attune.control.spec import load_spec

    spec = load_spec(campaign)
    assert proto.match(spec)[0] is proto.TTB_V1
    assert (spec.workload.seq_length, spec.workload.global_batch, spec.workload.precision) == (8192, 128, "bf16")
    assert spec.gate.list_sha256 == sha256_file(campaign / "gate-list.yaml")
    # Mixtral's public recipe trains 4,096-token rows: its template moves the sequence length in the
    # gate list's pin, and adds the context parallelism it needs to fit 8,192-token rows on H100.
    mx = tmp_path / "mixtral"
    r = _cli("ttb", "template", str(MIXTRAL), "--out", str(mx), "--json")
    assert r.returncode == 0, r.stderr
    mspec = load_spec(mx)
    assert proto.match(mspec)[0] is proto.TTB_V1
    assert mspec.baseline.args["--context-parallel-size"] == 2
    assert mspec.gate.list_sha256 == sha256_file(mx / "gate-list.yaml")
    assert "value: 8192" in (mx / "gate-list.yaml").read_text()


def test_submit_writes_an_entry_that_verifies(entry: Path, campaign: Path) -> None:
    e = load_entry(entry)
    assert e.simulated and e.label and SIM_LABEL in e.label and e.protocol == "ttb-v1"
    assert e.hardware.accelerator == "B200" and e.hardware.nodes == 8
    assert e.cost.usd_per_million_tokens == pytest.approx(usd_per_million(e.throughput.tokens_per_s_per_gpu, 6.0))
    diff = e.recipe.diff_from_public_recipe
    assert diff and all(v["public"] != v["entry"] for v in diff.values())
    assert all(e.recipe.args.get(k) == v["entry"] for k, v in diff.items() if v["entry"] not in (None, False))
    assert (entry / "recipe" / "run.sh").read_text().startswith("#!/bin/sh")
    rep = verify_entry(entry)
    assert rep.ok, rep.as_dict()
    assert [i.item for i in rep.items] == ["files", "ledger", "protocol", "recipe", "throughput", "layer1", "layer2",
                                           "cost"]
    with pytest.raises(SubmitRefused, match="already submitted"):
        submit(campaign, entry.parent, load_prices())


def test_submit_refuses_a_campaign_without_the_ttb_workload(tmp_path: Path) -> None:
    d = tmp_path / "plain"
    d.mkdir()
    shutil.copy(MIXTRAL / "campaign.yaml", d / "campaign.yaml")
    from attune.control.campaign import start

    start(d)  # what `attune init` does
    r = _cli("ttb", "submit", str(d), "--entries", str(tmp_path / "entries"), "--json")
    assert r.returncode == 1
    out = json.loads(r.stdout)
    assert not out["submitted"] and "did not use the TTB workload" in out["reason"] and "8192" in out["reason"]
    assert not (tmp_path / "entries").exists() or not any((tmp_path / "entries").iterdir())


def test_submit_refuses_a_failed_campaign(campaign: Path, tmp_path: Path) -> None:
    d = tmp_path / "unfinished"
    shutil.copytree(campaign, d)
    _reissue(d, stop_before="shipped")
    with pytest.raises(SubmitRefused, match="has not shipped"):
        submit(d, tmp_path / "entries", load_prices())


def test_submit_refuses_a_recipe_that_did_not_pass_the_gate(campaign: Path, tmp_path: Path) -> None:
    d = tmp_path / "gate-failed"
    shutil.copytree(campaign, d)

    def fail(row: dict) -> None:
        if row["type"] == "check_run":
            row["data"]["passed"] = False
            row["data"]["reason"] = "convergence: final loss differs by 9%"

    _reissue(d, fail)
    assert ledger.verify(d).ok
    with pytest.raises(SubmitRefused, match="did not pass the correctness gate.*final loss differs"):
        submit(d, tmp_path / "entries", load_prices())
    assert not (tmp_path / "entries").exists() or not any((tmp_path / "entries").iterdir())


def _edit_entry(entry: Path, fn) -> None:  # noqa: ANN001
    data = json.loads((entry / "entry.json").read_text())
    fn(data)
    (entry / "entry.json").write_text(json.dumps(data, indent=2))


def _failed(entry: Path, cli: bool = False) -> dict[str, str]:
    """The items that fail, from `attune ttb verify --json` (cli) or in process (the same function)."""
    if not cli:
        rep = verify_entry(entry)
        assert not rep.ok
        return {i.item: i.detail for i in rep.failed}
    r = _cli("ttb", "verify", str(entry), "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    out = json.loads(r.stdout)["entries"][0]
    return {i["item"]: i["detail"] for i in out["items"] if not i["ok"]}


def test_verify_catches_a_tampered_throughput(entry: Path) -> None:
    _edit_entry(entry, lambda d: d["throughput"].update(
        tokens_per_s_per_gpu=d["throughput"]["tokens_per_s_per_gpu"] * 1.08,
        values=[v * 1.08 for v in d["throughput"]["values"]]))
    failed = _failed(entry, cli=True)
    assert "throughput" in failed and "its log gives" in failed["throughput"]


def test_verify_catches_a_tampered_curve_even_with_its_hash_updated(entry: Path) -> None:
    e = load_entry(entry)
    rel = f"evidence/runs/{e.gate.candidate_check_run}/log.txt"
    log = entry / rel
    lines = []
    for line in log.read_text().splitlines(keepends=True):
        if " iteration " in line and "lm loss:" in line:
            head, tail = line.split("lm loss:", 1)
            value, rest = tail.strip().split(" ", 1) if " " in tail.strip() else (tail.strip(), "")
            line = f"{head}lm loss: {float(value) * 0.97:.6E} {rest}".rstrip() + "\n"
        lines.append(line)
    log.write_text("".join(lines))
    assert "files" in _failed(entry)  # the plain tamper: the hash no longer matches
    _edit_entry(entry, lambda d: d["files"].update({rel: sha256_file(log)}))  # a forger updates the hash
    failed = _failed(entry)
    assert "files" not in failed and "layer2" in failed
    assert "curve" in failed["layer2"]


def test_verify_catches_a_changed_argument(entry: Path) -> None:
    _edit_entry(entry, lambda d: d["recipe"]["args"].update({"--pipeline-model-parallel-size": 16}))
    failed = _failed(entry)
    assert "recipe" in failed and "--pipeline-model-parallel-size" in failed["recipe"]


def test_verify_runs_layer1_on_the_changes(entry: Path) -> None:
    _edit_entry(entry, lambda d: d["recipe"]["changes_from_campaign_baseline"].setdefault("args", {}).update(
        {"--lr": 1e-3}))
    failed = _failed(entry)
    assert "layer1" in failed and "lr" in failed["layer1"]


def test_verify_catches_a_forged_ledger_head(entry: Path) -> None:
    _edit_entry(entry, lambda d: d["ledger"].update(last_hash="f" * 64))
    failed = _failed(entry)
    assert set(failed) >= {"ledger"} and "claims" in failed["ledger"]


def test_verify_catches_a_rewritten_ledger_against_the_logs(entry: Path) -> None:
    """A forger who rewrites a measurement in the ledger and rechains it still has to match the logs."""
    def inflate(row: dict) -> None:
        if row["type"] == "remeasurement":
            row["data"]["tokens_per_s_per_gpu"] *= 1.2

    path = entry / "evidence" / "ledger.jsonl"
    _rechain(path, inflate)
    # On this machine the copy's MACs are checked with the original campaign's key (found by the first
    # row), which the forger lacks; a verifier elsewhere has only the chain, which the forger rebuilt.
    rep = ledger.verify(entry / "evidence", chain_only=True)
    head = {"rows": rep.rows, "last_hash": rep.last_hash}
    _edit_entry(entry, lambda d: (d["ledger"].update(head), d["files"].update(
        {"evidence/ledger.jsonl": sha256_file(path)})))
    failed = _failed(entry)
    assert "ledger" not in failed and "throughput" in failed


def test_verify_with_bad_input_exits_2(tmp_path: Path) -> None:
    r = _cli("ttb", "verify", str(tmp_path))
    assert r.returncode == 2 and "no entry.json" in r.stderr


# ---------------------------------------------------------------------------------- page


class _Dom(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[dict]] = {}
        self._table: str | None = None
        self._row: dict | None = None
        self._cell: str | None = None
        self.aria: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list) -> None:  # noqa: ANN001
        a = dict(attrs)
        if tag == "table":
            self._table = a.get("id")
            self.tables[self._table] = []
        elif tag == "th" and "aria-sort" in a:
            self.aria[f"{self._table}:{a['data-key']}"] = a["aria-sort"]
        elif tag == "tr" and "data-id" in a:
            self._row = {"id": a["data-id"], "hidden": "hidden" in a, "class": a.get("class"), "text": "", "_links": []}
            self.tables[self._table].append(self._row)
        elif tag == "td" and self._row is not None:
            self._cell = a["data-key"]
            self._row[self._cell] = a.get("data-value")
        elif tag == "a" and self._row is not None:
            self._row["_links"].append(a["href"])

    def handle_endtag(self, tag: str) -> None:
        if tag == "tr":
            self._row = None

    def handle_data(self, data: str) -> None:
        if self._row is not None:
            self._row["text"] += data


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def _dump(page: Path, fragment: str, profile: Path) -> _Dom:
    cmd = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-quic",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={profile}", "--dump-dom", page.as_uri() + fragment]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    dom = _Dom()
    dom.feed(r.stdout)
    return dom


@pytest.fixture
def site(entry: Path, tmp_path: Path) -> Path:
    """The committed seed entries plus this module's campaign: two MiniMax-M2 entries on one board."""
    entries = sorted(p for p in (ROOT / "ttb" / "entries").iterdir() if (p / "entry.json").is_file())
    r = _cli("ttb", "build", *map(str, entries), str(entry), "--out", str(tmp_path / "site"), "--json")
    assert r.returncode == 0, r.stderr
    return tmp_path / "site"


@pytest.mark.skipif(_chromium() is None, reason="chromium is not installed (.ci/run installs it)")
def test_the_page_in_headless_chromium(site: Path, tmp_path: Path) -> None:
    index = json.loads((site / "index.json").read_text())
    sim_board = "ttb-v1 (simulated)"
    sim_rows = [r for r in index["leaderboard"] if r["board"] == sim_board]
    assert len(sim_rows) >= 2 and index["history"], "the second MiniMax-M2 entry goes to the history"
    assert all(r["simulated"] for r in sim_rows) and not index["not_verified"]
    page = site / "index.html"

    dom = _dump(page, "#sort=usd_per_million_tokens&dir=asc", tmp_path / "p1")
    table = dom.tables["board-ttb-v1--simulated"]
    costs = [float(r["usd_per_million_tokens"]) for r in table]
    assert costs == sorted(costs) and len(table) == len(sim_rows)
    assert dom.aria["board-ttb-v1--simulated:usd_per_million_tokens"] == "ascending"
    for r in table:
        assert r["class"] == "sim" and SIM_LABEL in r["text"]
        recipe, evidence = r["_links"]
        assert (site / recipe).is_file() and (site / recipe).read_text().startswith("#!/bin/sh")
        assert json.loads((site / evidence).read_text())["id"] == r["id"]

    dom = _dump(page, "#sort=tokens_per_s_per_gpu&dir=desc", tmp_path / "p2")
    tps = [float(r["tokens_per_s_per_gpu"]) for r in dom.tables["board-ttb-v1--simulated"]]
    assert tps == sorted(tps, reverse=True)
    assert [r["id"] for r in dom.tables["history"]] == [h["id"] for h in index["history"]]

    dom = _dump(page, "#model=minimax-m2", tmp_path / "p3")
    shown = [r for r in dom.tables["board-ttb-v1--simulated"] if not r["hidden"]]
    assert [r["id"] for r in shown] == [r["id"] for r in sim_rows if r["model"] == "minimax-m2"]

    dom = _dump(page, "#sim=0", tmp_path / "p4")
    assert all(r["hidden"] for r in dom.tables["board-ttb-v1--simulated"])


def test_best_is_a_verified_prior(entry: Path) -> None:
    root = entry.parent
    assert not best(root, "minimax-m2", "B200")["found"]  # simulated entries only when asked
    res = best(root, "minimax-m2", "B200", include_simulated=True)
    assert res["found"] and res["entry"]["id"] == entry.name and "measures it" in res["note"]
    assert res["entry"]["label"] and SIM_LABEL in res["entry"]["label"]
    _edit_entry(entry, lambda d: d["ledger"].update(last_hash="0" * 64))
    res = best(root, "minimax-m2", "B200", include_simulated=True)
    assert not res["found"] and "does not verify" in res["skipped"][0]


def test_the_committed_seed_entries_verify() -> None:
    entries = sorted(p for p in (ROOT / "ttb" / "entries").iterdir() if (p / "entry.json").is_file())
    assert entries
    r = _cli("ttb", "verify", *map(str, entries), "--json")
    assert r.returncode == 0, r.stdout[-3000:]


def _entry_dirs() -> list[Path]:
    return sorted(p for p in (ROOT / "ttb" / "entries").iterdir() if (p / "entry.json").is_file())


def test_machine_paths_become_relative_or_placeholders(tmp_path: Path) -> None:
    from attune.ttb.paths import Relocator, absolute_paths

    camp, repo = tmp_path / "camp", tmp_path / "repo"
    camp.mkdir()
    repo.mkdir()
    r = Relocator(camp, repo, repo)
    assert r.text(f"--run-dir {camp}/runs/r001 in {camp}/ and {camp}") == "--run-dir runs/r001 in . and ."
    assert r.text(f"{tmp_path}/camp-2/x") == f"{tmp_path}/camp-2/x"  # a sibling sharing the prefix is left alone
    assert r.obj({"workdir": str(repo), "argv": [f"{repo}/examples/t.py", f"--x={camp}/a"]}) == {
        "workdir": "${ATTUNE_REPO}", "argv": ["${ATTUNE_REPO}/examples/t.py", "--x=a"]}
    assert r.cd_line() == 'cd "${ATTUNE_REPO:-.}"'
    inner = repo / "c"  # a campaign inside the checkout: the longer prefix wins
    inner.mkdir()
    assert Relocator(inner, repo, repo).text(f"{inner}/runs/r1 {repo}/x") == "runs/r1 ${ATTUNE_REPO}/x"
    elsewhere = Relocator(camp, tmp_path / "wd", repo)
    assert elsewhere.text(f"{tmp_path}/wd/a") == "${ATTUNE_WORKDIR}/a" and "ATTUNE_WORKDIR" in elsewhere.cd_line()
    assert absolute_paths(f"#!/bin/sh\ncd {repo}\n") == [str(repo)]
    assert absolute_paths("#!/bin/sh\ncd ${ATTUNE_REPO}/x; 3 tokens/s/GPU; see http://host/a/b\n") == []


def test_no_entry_file_holds_a_machine_path(entry: Path, campaign: Path) -> None:
    """Neither the committed seeds nor a fresh entry carry a path of the machine they came from: only the
    documented placeholders (docs/ttb.md) and paths relative to the campaign directory."""
    import re

    from attune.ttb.paths import PLACEHOLDERS, absolute_paths

    # the campaign itself records its machine's paths (the jobs' working directory), so this can fail
    assert str(ROOT) in (campaign / "shipped" / "job.json").read_text()
    for d in [*_entry_dirs(), entry]:
        for f in sorted(p for p in d.rglob("*") if p.is_file()):
            text = f.read_text(encoding="utf-8", errors="replace")
            assert absolute_paths(text) == [], f"{f.relative_to(d.parent)}: {absolute_paths(text)[:3]}"
            if f.name != "run.sh":
                assert set(re.findall(r"\$\{[A-Z_]+\}", text)) <= set(PLACEHOLDERS), f
    job = json.loads((entry / "recipe" / "job.json").read_text())
    assert job["workdir"] == "${ATTUNE_REPO}" and job["run_dir"] == "shipped/run"
    e = load_entry(entry)
    assert e.ledger.source_last_hash == ledger.verify(campaign).last_hash


def test_the_seed_recipe_script_runs_from_a_users_checkout(tmp_path: Path) -> None:
    """The tinygpt seed's run.sh, with a stand-in `python` that records where and how it was run."""
    import os

    script = next((ROOT / "ttb" / "entries").glob("tinygpt-*/recipe/run.sh"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text('#!/bin/sh\npwd > "$OUT"\nprintf "%s\\n" "$@" >> "$OUT"\n')
    os.chmod(bin_dir / "python", 0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "OUT": str(tmp_path / "out"), "RUN_DIR": str(tmp_path / "run")}
    for cwd, extra in ((tmp_path, {"ATTUNE_REPO": str(ROOT)}), (ROOT, {})):  # named, or the current directory
        r = subprocess.run(["sh", str(script)], cwd=cwd, env={**env, **extra}, capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, r.stderr
        where, *argv = (tmp_path / "out").read_text().splitlines()
        assert Path(where) == ROOT
        assert (ROOT / next(a for a in argv if a.endswith(".py"))).is_file()
        assert (ROOT / argv[argv.index("--data-path") + 1]).is_dir()
        assert argv[argv.index("--run-dir") + 1] == str(tmp_path / "run")


def test_the_broker_mcp_server_gives_the_best_known_recipe_as_a_prior(entry: Path, campaign: Path) -> None:
    import asyncio

    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    env = {"ATTUNE_CAMPAIGN_DIR": str(campaign), "ATTUNE_TTB_ENTRIES": str(entry.parent), "PYTHONPATH": str(ROOT),
           "PATH": __import__("os").environ["PATH"]}
    params = StdioServerParameters(command=sys.executable, args=["-m", "mcp_servers.broker_server"], env=env,
                                   cwd=str(ROOT))

    async def go() -> tuple[dict, dict]:
        async with Client(params, read_timeout_seconds=90) as client:
            real = (await client.call_tool("ttb_best_known_recipe", {})).structured_content
            sim = (await client.call_tool("ttb_best_known_recipe", {"include_simulated": True})).structured_content
            return real, sim

    real, sim = asyncio.run(go())
    assert real["found"] is False and "no verified TTB entry for minimax-m2 on B200" in real["reason"]
    assert sim["found"] and sim["entry_id"] == entry.name and SIM_LABEL in sim["label"]
    assert sim["args"] == load_entry(entry).recipe.args and "measures it" in sim["note"]


def test_build_refuses_to_replace_a_directory_that_is_not_a_build(entry: Path, tmp_path: Path) -> None:
    keep = tmp_path / "mine"
    keep.mkdir()
    (keep / "notes.txt").write_text("mine")
    r = _cli("ttb", "build", str(entry), "--out", str(keep))
    assert r.returncode == 2 and "not an earlier leaderboard build" in r.stderr
    assert (keep / "notes.txt").read_text() == "mine"
    from attune.ttb.page import build

    build([entry], tmp_path / "site", load_prices())
    (tmp_path / "site" / "stale.txt").write_text("from the last build")
    index = build([entry], tmp_path / "site", load_prices())  # a rebuild replaces it
    assert [r["id"] for r in index["leaderboard"]] == [entry.name] and not (tmp_path / "site" / "stale.txt").exists()


@pytest.mark.parametrize("kind", ["dir_link", "file_link", "listed_link", "fifo"])
def test_an_entry_with_a_link_or_special_file_is_refused_and_never_published(entry: Path, tmp_path: Path,
                                                                            kind: str) -> None:
    """Issue 24, class 3: a directory symlink (to a keys folder, ~/.ssh) in an entry is refused by verify, and
    build publishes nothing it holds: the secret never reaches the site (real effect: the file's absence)."""
    import os

    from attune.ttb.page import build

    secret = tmp_path / "keys"
    secret.mkdir()
    (secret / "id_ed25519").write_text("PRIVATE KEY MATERIAL")
    if kind == "dir_link":
        (entry / "evidence_keys").symlink_to(secret)
    elif kind == "file_link":
        (entry / "extra").symlink_to(secret / "id_ed25519")
    elif kind == "listed_link":  # a listed file replaced by a link to the same bytes
        data = json.loads((entry / "entry.json").read_text())
        rel = sorted(data["files"])[0]
        real = tmp_path / "copy"
        shutil.copyfile(entry / rel, real)
        (entry / rel).unlink()
        (entry / rel).symlink_to(real)
    else:
        os.mkfifo(entry / "pipe")
    failed = _failed(entry)
    assert "files" in failed and ("link" in failed["files"] or "special" in failed["files"]), failed
    index = build([entry], tmp_path / "site", load_prices())
    assert index["leaderboard"] == [] and index["not_verified"]
    site = tmp_path / "site"
    assert not any("PRIVATE KEY" in f.read_text(errors="replace") for f in site.rglob("*") if f.is_file())
    assert not any(f.is_symlink() for f in site.rglob("*"))


def test_build_copies_only_the_listed_files(entry: Path, tmp_path: Path) -> None:
    from attune.ttb.verify import copy_listed

    out = tmp_path / "copy"
    data = json.loads((entry / "entry.json").read_text())
    copy_listed(entry, out, list(data["files"]))
    got = sorted(str(f.relative_to(out)) for f in out.rglob("*") if f.is_file())
    assert got == sorted({*data["files"], "entry.json"})


def test_rows_of_the_protocol_length_with_a_real_tokenizer(tmp_path: Path) -> None:
    res = wl.build_rows(tmp_path, tokenizer=wl.SAMPLE_TOKENIZER, seq_length=proto.TTB_V1.seq_length, num_rows=2,
                        conversations=wl.SAMPLE_CONVERSATIONS, repeat=True, protocol="ttb-v1")
    rows = wl.Rows(tmp_path)
    assert res.num_rows == 2 and rows.row(1).shape == (8192,) and rows.manifest["source"]["repeated"]
    with pytest.raises(wl.WorkloadError, match="rows of 8192 tokens, 3 are needed"):
        wl.build_rows(tmp_path / "short", tokenizer=wl.SAMPLE_TOKENIZER, seq_length=8192, num_rows=3,
                      conversations=wl.SAMPLE_CONVERSATIONS)


@pytest.mark.parametrize("example", sorted(p.name for p in (ROOT / "examples" / "campaigns").iterdir()
                                           if (p / "campaign.yaml").is_file() and "tinygpt" not in p.name))
def test_every_example_campaign_has_a_ttb_template(example: str, tmp_path: Path) -> None:
    from attune.control.spec import load_spec
    from gate.lists import load_list

    out = proto.write_campaign(ROOT / "examples" / "campaigns" / example, tmp_path / example)
    spec = load_spec(out)
    assert proto.match(spec)[0] is proto.TTB_V1
    assert spec.baseline.args["--seq-length"] == 8192 and spec.baseline.args["--global-batch-size"] == 128
    load_list(out / "gate-list.yaml", expected_sha256=spec.gate.list_sha256)
    assert (out / proto.PUBLIC_RECIPE).read_bytes() == (ROOT / "examples" / "campaigns" / example /
                                                        "campaign.yaml").read_bytes()


def test_the_committed_entry_schema_is_current() -> None:
    import jsonschema

    from attune.ttb.entry import SCHEMA_PATH, schema_text

    assert SCHEMA_PATH.read_text() == schema_text(), "run `attune ttb schema --write`"
    schema = json.loads(SCHEMA_PATH.read_text())
    for p in (ROOT / "ttb" / "entries").iterdir():
        if (p / "entry.json").is_file():
            jsonschema.validate(json.loads((p / "entry.json").read_text()), schema)
