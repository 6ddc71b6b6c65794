"""`attune ttb verify ENTRY...`: recompute an entry from its stored evidence, offline.

Each check is an item with a verdict; an entry verifies only if every item passes:

- `files`: every listed file is there with its SHA-256, and no other file is in the entry;
- `ledger`: the stored ledger's hash chain verifies and ends at the entry's head (`head.check_head`);
- `protocol`: the stored campaign.yaml follows the entry's TTB protocol, for the entry's model and hardware;
- `recipe`: the entry's arguments and environment are the ones the ledger's `shipped` row records;
- `throughput`: each re-measurement and calibration log, scored again by the metrics reader, gives
  the value the ledger recorded, and the entry's tokens/s/GPU, band and gain follow from them;
- `layer1`: the configuration check, with the correctness list the campaign pinned (stored in the
  entry and checked against its SHA-256), on the recipe's changes and on the check runs' resolved
  arguments read again from their logs;
- `layer2`: the convergence check on the check runs' loss curves read again from their logs, which
  must pass and agree with the stored curves and with the verdict the ledger recorded;
- `cost`: the cost per million tokens follows from the throughput and the entry's price.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import stat
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attune.core.campaign_paths import CAMPAIGN_FILE, run_job, run_log
from attune.core.containment import inside
from attune.core.errors import TTBError
from attune.ttb.entry import ENTRY_FILE, Entry, EntryError, load_entry, usd_per_million
from attune.ttb.head import check_head

REL_TOL = 1e-6


@dataclass
class Item:
    item: str
    ok: bool
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return {"item": self.item, "ok": self.ok, "detail": self.detail}


@dataclass
class EntryReport:
    entry: str
    ok: bool
    items: list[Item] = field(default_factory=list)

    @property
    def failed(self) -> list[Item]:
        return [i for i in self.items if not i.ok]

    def as_dict(self) -> dict[str, Any]:
        return {"entry": self.entry, "ok": self.ok, "failed": [i.item for i in self.failed],
                "items": [i.as_dict() for i in self.items]}


def _close(a: float | None, b: float | None, tol: float = REL_TOL) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(float(a), float(b), rel_tol=tol, abs_tol=1e-12)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class _Fail(TTBError):
    pass


def special_files(d: Path) -> list[str]:
    """Every path of the entry's tree that is not a plain file or folder (symbolic links, which may lead to
    a keys folder or ~/.ssh, FIFOs, devices, sockets), or the entry itself when it is a link. Read with
    lstat, never following a link."""
    if d.is_symlink() or not d.is_dir():
        return [f"{d}: the entry is a link or not a folder"]
    bad = []
    for top, dirs, files in os.walk(d, followlinks=False):
        for name in sorted(dirs + files):
            p = Path(top) / name
            mode = p.lstat().st_mode
            rel = p.relative_to(d)
            if stat.S_ISLNK(mode):
                bad.append(f"{rel}: a symbolic link (an entry holds plain files only)")
            elif not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                bad.append(f"{rel}: a special file (an entry holds plain files only)")
    return bad


def copy_listed(src: Path, dst: Path, files: list[str]) -> None:
    """Copy only the files an entry lists (and its entry file), each a plain file read without following
    links: what is published is what was verified, nothing a link or an unlisted file adds."""
    if special_files(src):
        raise ValueError(f"{src}: holds links or special files; refusing to copy it")
    dst.mkdir(parents=True)
    for rel in sorted({*files, ENTRY_FILE}):
        s, t = src / rel, dst / rel
        if not inside(s.resolve(), src.resolve()) or not stat.S_ISREG(s.lstat().st_mode):
            raise ValueError(f"{src}: {rel} is not a plain file of the entry")
        t.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(s, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as fi, open(t, "wb") as fo:
            shutil.copyfileobj(fi, fo)


def verify_entry(directory: str | Path, *, entry: Entry | None = None) -> EntryReport:
    d = Path(directory)
    return _EntryChecks(d, entry or load_entry(d)).report()


class _EntryChecks:
    """The items of one entry's verification, in order; each reads the evidence afresh."""

    def __init__(self, d: Path, e: Entry) -> None:
        self.d, self.e, self.ev = d, e, d / "evidence"
        self.items: list[Item] = []
        self.state: Any = None
        self.spec: Any = None
        self.shipped: dict[str, Any] = {}
        self.shipped_id = ""

    def run(self, name: str, fn: Any) -> Any:
        items = self.items
        try:
            detail, value = fn()
        except _Fail as exc:
            items.append(Item(name, False, str(exc)))
            return None
        except Exception as exc:  # noqa: BLE001 - a broken piece of evidence fails its item, never the verifier
            items.append(Item(name, False, f"{type(exc).__name__}: {exc}"))
            return None
        items.append(Item(name, True, detail))
        return value

    def report(self) -> EntryReport:
        d, items, run = self.d, self.items, self.run
        run("files", self.files)
        self.state = run("ledger", self.ledger)
        self.spec = run("protocol", self.spec_check)
        if self.state is None or self.spec is None:
            for name in ("recipe", "throughput", "layer1", "layer2", "cost"):
                items.append(Item(name, False, "not checked: the ledger or the campaign spec does not verify"))
            return EntryReport(str(d), False, items)

        self.shipped = self.state.shipped or {}
        self.shipped_id = str(self.shipped.get("run_id"))
        run("recipe", self.recipe)
        run("throughput", self.throughput)
        run("layer1", self.layer1)
        run("layer2", self.layer2)
        run("cost", self.cost)
        return EntryReport(str(d), all(i.ok for i in items), items)

    def files(self) -> tuple[str, None]:
        d, e = self.d, self.e
        bad = special_files(d)
        if bad:  # a link or a special file: nothing of the entry is trusted, nothing is read through it
            raise _Fail("; ".join(bad[:5]) + (f" (+{len(bad) - 5} more)" if len(bad) > 5 else ""))
        for rel, digest in sorted(e.files.items()):
            p = (d / rel).resolve()
            if not inside(p, d.resolve()) or not p.is_file():
                bad.append(f"{rel}: missing")
            elif _sha256(p) != digest:
                bad.append(f"{rel}: SHA-256 differs")
        if e.recipe.script not in e.files:
            bad.append(f"recipe.script {e.recipe.script!r} is not one of the entry's files")
        listed = set(e.files) | {ENTRY_FILE}
        extra = sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file() and str(p.relative_to(d)) not in listed)
        bad += [f"{x}: not listed in the entry" for x in extra]
        if bad:
            raise _Fail("; ".join(bad[:5]) + (f" (+{len(bad) - 5} more)" if len(bad) > 5 else ""))
        return f"{len(e.files)} files match their SHA-256", None

    def ledger(self) -> tuple[str, Any]:
        e, ev = self.e, self.ev
        problem = check_head(ev, e.ledger.model_dump())
        if problem:
            raise _Fail(problem)
        from attune.core.state import load

        state, _ = load(ev, chain_only=True)
        return f"chain of {e.ledger.rows} rows ends at {e.ledger.last_hash[:16]}...", state

    def spec_check(self) -> tuple[str, Any]:
        e, ev, state = self.e, self.ev, self.state
        from attune.control.spec import load_spec
        from attune.ttb import protocol as proto

        spec = load_spec(ev / CAMPAIGN_FILE)
        if state is not None and state.spec_sha256 != _sha256(ev / CAMPAIGN_FILE):
            raise _Fail("campaign.yaml is not the spec the ledger's campaign_started row pinned")
        p = proto.PROTOCOLS.get(e.protocol)
        if p is None:
            raise _Fail(f"unknown protocol {e.protocol!r}")
        probs = proto.problems(spec, p)
        h = e.hardware
        for name, got, want in (("model", spec.model, e.model), ("accelerator", spec.cluster.accelerator, h.accelerator),
                                ("gpus", spec.cluster.gpus, h.gpus), ("gpus_per_node", spec.cluster.gpus_per_node,
                                                                      h.gpus_per_node),
                                ("simulated", spec.cluster.backend == "sim", e.simulated)):
            if got != want:
                probs.append(f"{name}: the campaign says {got!r}, the entry {want!r}")
        if probs:
            raise _Fail("; ".join(probs))
        return f"{e.protocol} workload, {spec.model} on {h.gpus} x {h.accelerator}", spec

    def recipe(self) -> tuple[str, None]:
        e, ev, state, spec, shipped, shipped_id = self.e, self.ev, self.state, self.spec, self.shipped, self.shipped_id
        rec = shipped.get("recipe") or {}
        probs = []
        if not e.gate.shipped_baseline and shipped_id != e.gate.candidate_check_run and state.runs.get(
                str(e.gate.candidate_check_run)) is not None and state.runs[str(e.gate.candidate_check_run)].base_run_id != shipped_id:
            probs.append(f"the check run {e.gate.candidate_check_run} is not a check of the shipped run {shipped_id}")
        for flag in sorted(set(rec.get("args") or {}) | set(e.recipe.args)):
            a, b = (rec.get("args") or {}).get(flag), e.recipe.args.get(flag)
            if a != b:
                probs.append(f"argument {flag}: the ledger shipped {a!r}, the entry says {b!r}")
        if dict(rec.get("env") or {}) != e.recipe.env:
            probs.append("environment differs from the ledger's shipped recipe")
        if dict(shipped.get("changes") or {}) != e.recipe.changes_from_campaign_baseline:
            probs.append("changes differ from the ledger's shipped row")
        from attune.control.spec import load_spec
        from attune.ttb.submit import diff_args

        pub = ev / "public-recipe.yaml"
        public_args = dict(load_spec(pub).baseline.args) if pub.is_file() else dict(spec.baseline.args)
        if diff_args(public_args, e.recipe.args, set(spec.control.stack_fixes.args)) != e.recipe.diff_from_public_recipe:
            probs.append("the diff from the public recipe does not follow from the stored public recipe")
        if probs:
            raise _Fail("; ".join(probs))
        return f"{len(e.recipe.args)} arguments match the ledger's shipped recipe ({shipped_id})", None

    def throughput(self) -> tuple[str, None]:
        e, ev, state, spec, shipped_id = self.e, self.ev, self.state, self.spec, self.shipped_id
        from attune.control.plane import score_run

        t = e.throughput
        measured = {r["run_id"]: r for r in state.remeasurements}
        ledger_valid = [r for r in state.remeasurements if r.get("recipe_of") == shipped_id and r.get("valid")]
        if [str(r["run_id"]) for r in ledger_valid] != t.runs:
            raise _Fail(f"re-measurement runs {t.runs} are not the ledger's {[r['run_id'] for r in ledger_valid]}")
        probs = []

        def rescore(rid: str) -> float | None:
            s = score_run(spec, run_log(ev, rid), exit_code=0, seconds_since_progress=None)
            return s.tokens_per_s_per_gpu

        for rid, claimed in zip(t.runs, t.values, strict=True):
            got = rescore(rid)
            if not _close(got, claimed) or not _close(got, float(measured[rid]["tokens_per_s_per_gpu"])):
                probs.append(f"run {rid}: its log gives {got} tokens/s/GPU, the entry says {claimed}, "
                             f"the ledger {measured[rid]['tokens_per_s_per_gpu']}")
        if not _close(statistics.fmean(t.values), t.tokens_per_s_per_gpu):
            probs.append(f"tokens/s/GPU {t.tokens_per_s_per_gpu} is not the mean of its runs "
                         f"({statistics.fmean(t.values)})")
        probs += self._calibration_problems(rescore)
        base = [float(r["tokens_per_s_per_gpu"]) for r in state.remeasurements
                if r.get("recipe_of") == "baseline" and r.get("valid")]
        probs += self._baseline_problems(rescore)
        base_mean = statistics.fmean(base) if base else None
        if not _close(base_mean, t.baseline_tokens_per_s_per_gpu):
            probs.append(f"baseline re-measurement {t.baseline_tokens_per_s_per_gpu} is not the ledger's {base_mean}")
        elif base_mean and not _close(t.gain, t.tokens_per_s_per_gpu / base_mean - 1.0):
            probs.append(f"gain {t.gain} does not follow from the throughputs")
        if probs:
            raise _Fail("; ".join(probs))
        return (f"{len(t.runs)} re-measurement(s) and {len(t.calibration_runs)} calibration run(s) rescored from their "
                f"logs: {t.tokens_per_s_per_gpu:,.1f} tokens/s/GPU, band {t.band:.1%}"), None

    def _calibration_problems(self, rescore: Callable[[str], float | None]) -> list[str]:
        """The calibration logs, scored again, give the ledger's values and the entry's band."""
        from attune.core.measure import calibrate

        e, state, spec = self.e, self.state, self.spec
        t = e.throughput
        probs = []
        cal_vals = []
        for rid in t.calibration_runs:
            got = rescore(rid)
            cal_vals.append(got or 0.0)
        if t.calibration_runs != list(state.calibration_run_ids):
            probs.append("calibration runs differ from the ledger's")
        elif not all(_close(a, b) for a, b in zip(cal_vals, state.calibration_values, strict=True)):
            probs.append("a calibration log does not give the value the ledger recorded")
        else:
            cal = calibrate(cal_vals, spec.band.floor, spec.band.k_sigma)
            if not (_close(cal.mean, t.calibration_mean) and _close(cal.band, t.band)
                    and _close(cal.rel_sigma, t.calibration_rel_sigma)):
                probs.append(f"calibration: the logs give mean {cal.mean:.6g}, band {cal.band:.4g}; the entry says "
                             f"{t.calibration_mean:.6g}, {t.band:.4g}")
        return probs

    def _baseline_problems(self, rescore: Callable[[str], float | None]) -> list[str]:
        """The baseline's valid re-measurement logs, scored again, give the ledger's values."""
        probs = []
        for r in self.state.remeasurements:
            if r.get("recipe_of") == "baseline" and r.get("valid"):
                got = rescore(str(r["run_id"]))
                if not _close(got, float(r["tokens_per_s_per_gpu"])):
                    probs.append(f"baseline run {r['run_id']}: its log gives {got}, the ledger {r['tokens_per_s_per_gpu']}")
        return probs

    def _curves_and_resolved(self) -> dict[str, tuple[dict[int, float | None], dict[str, str], dict[str, str]]]:
        e, ev, spec = self.e, self.ev, self.spec
        from attune.readers.metrics import read_losses, read_resolved_args

        out = {}
        for role, rid in (("baseline", e.gate.baseline_check_run), ("candidate", e.gate.candidate_check_run)):
            log = run_log(ev, str(rid))
            curve = read_losses(log, spec.framework)
            resolved = read_resolved_args(log, spec.framework)
            stored_c = json.loads((ev / "curves" / f"{role}.json").read_text())
            stored_r = json.loads((ev / "resolved" / f"{role}.json").read_text())
            from gate.inputs import curve_to_json

            if stored_c.get("loss") != curve_to_json(curve) or stored_c.get("run_id") != rid:
                raise _Fail(f"the stored {role} curve differs from the one in its check run's log")
            if stored_r.get("args") != resolved:
                raise _Fail(f"the stored {role} resolved arguments differ from its check run's log")
            job = run_job(ev, str(rid))
            env = dict(json.loads(job.read_text()).get("env") or {}) if job.is_file() else {}
            out[role] = (curve, resolved, env)
        return out

    def layer1(self) -> tuple[str, None]:
        e, ev, state, spec = self.e, self.ev, self.state, self.spec
        from gate.config_check import apply_changes, check_recipe, check_resolved
        from gate.lists import load_list

        pinned = state.list_sha256 or spec.gate.list_sha256
        if pinned is None:
            raise _Fail("the campaign pins no correctness list SHA-256 (gate.list_sha256)")
        loaded = load_list(ev / "gate-list.yaml", expected_sha256=pinned)  # raises on a different list
        if e.gate.list_sha256 != loaded.sha256:
            raise _Fail(f"the entry's list SHA-256 {e.gate.list_sha256} is not the campaign's {loaded.sha256}")
        changes = e.recipe.changes_from_campaign_baseline
        cand_args = apply_changes(spec.baseline.args, dict(changes.get("args") or {}))
        base_env = dict(spec.baseline.env)
        cand_env = {**base_env, **{k: v for k, v in (changes.get("env") or {}).items() if v is not None}}
        for k, v in (changes.get("env") or {}).items():
            if v is None:
                cand_env.pop(k, None)
        r0 = check_recipe(loaded, spec.baseline.args, cand_args, base_env, cand_env)
        if not r0.passed:
            raise _Fail(f"on the recipe's changes: {r0.summary()}")
        if e.gate.shipped_baseline:
            return "the baseline ships: no change to check", None
        cr = self._curves_and_resolved()
        (_, b_res, b_env), (_, c_res, c_env) = cr["baseline"], cr["candidate"]
        if not b_res or not c_res:
            raise _Fail("a check run's log has no resolved arguments")
        r1 = check_resolved(loaded, b_res, c_res, b_env, c_env)
        if not r1.passed:
            raise _Fail(f"on the check runs' resolved arguments: {r1.summary()}")
        return f"passes on the changes and on {len(c_res)} resolved arguments (list {loaded.sha256[:12]})", None

    def layer2(self) -> tuple[str, None]:
        e, state = self.e, self.state
        from gate.convergence import check_convergence

        if e.gate.shipped_baseline:
            return "the baseline ships: no candidate curve to check", None
        cr = self._curves_and_resolved()
        r2 = check_convergence(cr["baseline"][0], cr["candidate"][0])
        if not r2.passed:
            raise _Fail(f"the stored curves fail the convergence check: {r2.summary()}")
        rec = next((c for c in state.checks if c.get("run_id") == e.gate.candidate_check_run), None)
        if rec is None or not rec.get("passed"):
            raise _Fail(f"the ledger has no passed verdict for check run {e.gate.candidate_check_run}")
        conv = rec.get("convergence") or {}
        corr = r2.checks.correlation.value if r2.checks else None
        final = r2.checks.final_loss.rel_diff if r2.checks else None
        if not (_close(corr, conv.get("correlation"), 1e-9) and _close(final, conv.get("final_loss_rel_diff"), 1e-9)):
            raise _Fail(f"the curves give correlation {corr}, final-loss difference {final}; the ledger's verdict "
                        f"recorded {conv.get('correlation')}, {conv.get('final_loss_rel_diff')}")
        return f"passes on {r2.n_steps} steps (correlation {corr:.4f}), as the ledger recorded", None

    def cost(self) -> tuple[str, None]:
        e = self.e
        want = usd_per_million(e.throughput.tokens_per_s_per_gpu, e.cost.price_per_gpu_hour)
        if not _close(want, e.cost.usd_per_million_tokens):
            raise _Fail(f"cost per million tokens {e.cost.usd_per_million_tokens} does not follow from "
                        f"{e.throughput.tokens_per_s_per_gpu} tokens/s/GPU at {e.cost.price_per_gpu_hour}/GPU-hour ({want})")
        return ("no price for this accelerator" if want is None else f"${want:.4f} per million tokens"), None


def verify_many(paths: list[str | Path]) -> tuple[list[EntryReport], list[str]]:
    """Reports for entries (a directory holding entry.json, or a directory of such directories) and
    the inputs that are not entries at all."""
    reports, bad = [], []
    for p in expand(paths, bad):
        try:
            reports.append(verify_entry(p))
        except EntryError as exc:
            bad.append(str(exc))
    return reports, bad


def expand(paths: list[str | Path], bad: list[str]) -> list[Path]:
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if (p / ENTRY_FILE).is_file():
            out.append(p)
        elif p.is_dir() and any((c / ENTRY_FILE).is_file() for c in p.iterdir()):
            out += sorted(c for c in p.iterdir() if (c / ENTRY_FILE).is_file())
        else:
            bad.append(f"{p}: no {ENTRY_FILE} (not an entry or a directory of entries)")
    return out
