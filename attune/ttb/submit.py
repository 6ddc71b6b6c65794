"""`attune ttb submit CAMPAIGN_DIR`: a TTB entry from a finished campaign's shipped recipe.

Refused (`SubmitRefused`, with the reason) when the ledger does not verify, the campaign did not
follow a TTB protocol, it has not shipped or not finished its final re-measurement, or its shipped
recipe has no passed correctness verdict. The entry is written to a temporary directory and renamed
into place, so a refusal or a crash leaves nothing half-written.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import statistics
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attune import __version__
from attune.core.campaign_paths import (
    CAMPAIGN_FILE,
    LEDGER_FILE,
    RUN_JOB,
    RUN_LOG,
    RUNS_DIR,
    SHIPPED_DIR,
    SHIPPED_EVIDENCE,
    run_job,
    run_log,
)
from attune.core.errors import TTBError
from attune.ttb import protocol as proto
from attune.ttb.entry import (
    ENTRY_FILE,
    SIM_LABEL,
    Cost,
    Entry,
    Gate,
    Hardware,
    LedgerHead,
    PriceTable,
    Recipe,
    Software,
    Throughput,
    usd_per_million,
)
from attune.ttb.head import ledger_head
from attune.ttb.paths import Relocator

if TYPE_CHECKING:
    from attune.control.spec import CampaignSpec
    from attune.core.measure import Calibration
    from attune.core.state import CampaignState, RunState


class SubmitRefused(TTBError):
    """The campaign cannot become an entry; the message says why."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-").lower()


def diff_args(public: dict[str, Any], entry: dict[str, Any], skip: set[str] | frozenset[str] = frozenset()) -> dict[str, Any]:
    """flag -> {public, entry} for each argument that differs (absent and false/null are the same)."""
    out = {}
    for k in sorted((set(public) | set(entry)) - set(skip)):
        a, b = public.get(k), entry.get(k)
        if a != b and not (a in (None, False) and b in (None, False)):
            out[k] = {"public": a, "entry": b}
    return out


@dataclass
class _Admitted:
    """A campaign that may become an entry, and what its entry is built from."""

    d: Path
    spec: CampaignSpec
    state: CampaignState
    protocol: proto.Protocol
    is_baseline: bool
    verdict: dict[str, Any] | None  # the shipped recipe's passed check (None: the baseline ships)
    ev_path: Path
    cal: Calibration
    valid: list[dict[str, Any]]  # the shipped recipe's valid re-measurements
    base_vals: list[float]  # the baseline's
    runs_needed: set[str]  # the runs whose logs the entry keeps
    ref: RunState | None  # the check's reference run
    cand_check: Any  # the candidate's check run id


def _load_campaign(d: Path) -> tuple[CampaignSpec, proto.Protocol, CampaignState]:
    """The campaign's spec, its TTB protocol and its state; refused unless the ledger verifies."""
    from attune.control.spec import SpecError, load_spec
    from attune.core import ledger
    from attune.core.state import load

    if not (d / CAMPAIGN_FILE).is_file():
        raise SubmitRefused(f"{d}: no campaign.yaml (not a campaign directory)")
    try:
        spec = load_spec(d)
    except SpecError as exc:
        raise SubmitRefused(f"campaign.yaml does not validate: {exc.problems[0][0]}: {exc.problems[0][1]}") from None
    rep = ledger.verify(d)
    if not rep.ok:
        raise SubmitRefused(f"the ledger does not verify: {rep.error}")
    protocol, why = proto.match(spec)
    if protocol is None:
        first = why.get(proto.TTB_V1.id) or ["unknown"]
        raise SubmitRefused("the campaign did not use the TTB workload: " + "; ".join(first))
    state, _ = load(d)
    return spec, protocol, state


def _shipped_verdict(state: CampaignState) -> tuple[str, bool, dict[str, Any] | None]:
    """(shipped run id, the baseline ships?, its passed check verdict); refused unless it passed."""
    from attune.control import shipping

    if state.shipped is None:
        raise SubmitRefused("the campaign has not shipped a recipe (it failed or has not finished)")
    shipped_id = str(state.shipped.get("run_id"))
    is_baseline = shipped_id == "baseline"
    verdict = None if is_baseline else shipping.check_verdict(state, shipped_id)
    if not is_baseline and not (verdict and verdict.get("passed")):
        raise SubmitRefused(f"the shipped recipe {shipped_id} did not pass the correctness gate"
                            + (f": {verdict.get('reason')}" if verdict else ": no check verdict"))
    return shipped_id, is_baseline, verdict


def _evidence_runs(d: Path, state: CampaignState, valid: list[dict[str, Any]],
                   verdict: dict[str, Any] | None) -> tuple[set[str], RunState | None, Any]:
    """(the runs whose logs the entry keeps, the check's reference run, the candidate's check run id);
    refused when a log is missing."""
    from attune.control import shipping

    runs_needed = {str(r["run_id"]) for r in valid} | set(state.calibration_run_ids)
    runs_needed |= {str(r["run_id"]) for r in state.remeasurements if r.get("recipe_of") == "baseline"}
    ref = shipping.reference_run(state)
    cand_check = verdict.get("run_id") if verdict else None
    for rid in (ref.run_id if ref else None, cand_check):
        if rid:
            runs_needed.add(str(rid))
    missing = [r for r in sorted(runs_needed) if not run_log(d, r).is_file()]
    if missing:
        raise SubmitRefused(f"evidence missing: no log for run(s) {', '.join(missing)}")
    return runs_needed, ref, cand_check


def _admit(campaign_dir: str | Path) -> _Admitted:
    """Refuse (SubmitRefused) a campaign that cannot become an entry."""
    from attune.control import shipping

    d = Path(campaign_dir)
    spec, protocol, state = _load_campaign(d)
    shipped_id, is_baseline, verdict = _shipped_verdict(state)
    if not shipping.done(state):
        raise SubmitRefused("the final re-measurement is not complete (rerun attune tune to finish it)")
    ev_path = d / SHIPPED_DIR / SHIPPED_EVIDENCE
    if not (d / SHIPPED_DIR / "run.sh").is_file() or not ev_path.is_file():
        raise SubmitRefused(f"{d / SHIPPED_DIR}: run.sh or evidence.json is missing")
    cal = state.calibration
    if cal is None:
        raise SubmitRefused("the campaign has no calibration")
    valid = [r for r in state.remeasurements if r.get("recipe_of") == shipped_id and r.get("valid")]
    if not valid:
        raise SubmitRefused(f"the shipped recipe {shipped_id} has no valid re-measurement")
    base_vals = [float(r["tokens_per_s_per_gpu"]) for r in state.remeasurements
                 if r.get("recipe_of") == "baseline" and r.get("valid")]
    runs_needed, ref, cand_check = _evidence_runs(d, state, valid, verdict)
    return _Admitted(d, spec, state, protocol, is_baseline, verdict, ev_path, cal, valid, base_vals,
                     runs_needed, ref, cand_check)


class _EntryFiles:
    """The files written into an entry's directory, with their SHA-256."""

    def __init__(self, tmp: Path, reloc: Relocator) -> None:
        self.tmp, self.reloc = tmp, reloc
        self.files: dict[str, str] = {}

    def put(self, src: Path | None, rel: str, text: str | None = None) -> None:
        """Copy `src` (its machine paths rewritten: attune.ttb.paths), or write `text`."""
        tmp, reloc, files = self.tmp, self.reloc, self.files
        dst = tmp / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if text is None:
            assert src is not None
            if rel.endswith(".json"):
                text = reloc.json_file(src)
            elif rel.endswith(".txt"):
                text = reloc.text(src.read_text(encoding="utf-8", errors="surrogateescape"))
        if text is not None:
            dst.write_text(text, encoding="utf-8", errors="surrogateescape")
        else:
            assert src is not None
            shutil.copyfile(src, dst)  # the spec, the lists, the public recipe: pinned by hash, kept as written
        files[rel] = sha256_file(dst)


def _put_runs(writer: _EntryFiles, d: Path, runs_needed: set[str], ref_id: str | None, cand_check: Any,
              framework: str) -> None:
    """The runs' logs (and job files), and the check runs' loss curves and resolved arguments read from them
    by the campaign framework's reader."""
    from attune.readers.metrics import read_losses, read_resolved_args
    from gate.inputs import curve_to_json

    put, tmp = writer.put, writer.tmp
    for rid in sorted(runs_needed):
        put(run_log(d, rid), f"evidence/{RUNS_DIR}/{rid}/{RUN_LOG}")
        if run_job(d, rid).is_file():
            put(run_job(d, rid), f"evidence/{RUNS_DIR}/{rid}/{RUN_JOB}")
    for role, rid in (("baseline", ref_id), ("candidate", cand_check)):
        if not rid:
            continue
        log = run_log(tmp / "evidence", str(rid))  # as the entry holds it
        put(None, f"evidence/curves/{role}.json",
            json.dumps({"run_id": rid, "loss": curve_to_json(read_losses(log, framework))}, indent=1) + "\n")
        try:
            resolved = read_resolved_args(log, framework)
        except ValueError:
            resolved = {}
        put(None, f"evidence/resolved/{role}.json", json.dumps({"run_id": rid, "args": resolved},
                                                                indent=1, sort_keys=True) + "\n")


def _public_recipe(writer: _EntryFiles, d: Path, spec: CampaignSpec,
                   public_recipe: str | Path | None) -> tuple[dict[str, Any], str]:
    """(the public recipe's arguments, where they are from): the given recipe, else the campaign's
    public-recipe.yaml, else its baseline. A public recipe file is kept in the entry."""
    from attune.control.spec import SpecError, load_spec

    public_args: dict[str, Any] = dict(spec.baseline.args)
    public_src = f"the campaign's baseline ({spec.name})"
    if public_recipe is None and (d / proto.PUBLIC_RECIPE).is_file():
        public_recipe = d / proto.PUBLIC_RECIPE
    if public_recipe is not None:
        try:
            pub = load_spec(public_recipe)
        except SpecError as exc:
            raise SubmitRefused(f"the public recipe {public_recipe} does not validate: {exc.problems[0]}") from None
        public_args, public_src = dict(pub.baseline.args), f"{pub.name} ({Path(public_recipe).name})"
        writer.put(Path(public_recipe), "evidence/public-recipe.yaml")
    return public_args, public_src


def _throughput(adm: _Admitted) -> Throughput:
    """The shipped recipe's re-measured throughput, against the baseline's and the calibration."""
    from attune.core.hardware import peak_flops

    spec, valid, cal = adm.spec, adm.valid, adm.cal
    tps = statistics.fmean(float(r["tokens_per_s_per_gpu"]) for r in valid)
    base_tps = statistics.fmean(adm.base_vals) if adm.base_vals else None
    peak = peak_flops(spec.cluster.accelerator, spec.workload.precision)
    mfu = (spec.workload.flops_per_token * tps / peak) if (peak and spec.workload.flops_per_token) else None
    return Throughput(
        tokens_per_s_per_gpu=tps, runs=[str(r["run_id"]) for r in valid],
        values=[float(r["tokens_per_s_per_gpu"]) for r in valid], baseline_tokens_per_s_per_gpu=base_tps,
        gain=(tps / base_tps - 1.0) if base_tps else None, calibration_mean=cal.mean,
        calibration_rel_sigma=cal.rel_sigma, band=cal.band, calibration_runs=list(adm.state.calibration_run_ids),
        mfu=mfu)


def _entry_recipe(shipped_row: dict[str, Any], spec: CampaignSpec, public_args: dict[str, Any],
                  public_src: str) -> Recipe:
    """The ledger's shipped recipe (machine paths rewritten), and its diff from the public recipe."""
    recipe = shipped_row.get("recipe") or {}
    args = dict(recipe.get("args") or {})
    return Recipe(command=list(recipe.get("command") or spec.baseline.command), args=args,
                  env=dict(recipe.get("env") or {}),
                  changes_from_campaign_baseline=dict(shipped_row.get("changes") or {}),
                  diff_from_public_recipe=diff_args(public_args, args, set(spec.control.stack_fixes.args)),
                  public_recipe=public_src, script="recipe/run.sh")


def _label(sim: bool, protocol: proto.Protocol) -> str | None:
    label = SIM_LABEL if sim else None
    if not protocol.comparable:
        label = (label + "; " if label else "") + f"{protocol.id}: CPU-example scale, not comparable with ttb-v1"
    return label


def submit(campaign_dir: str | Path, out_root: str | Path, prices: PriceTable, *,
           public_recipe: str | Path | None = None, now: datetime | None = None) -> tuple[Path, Entry]:
    """Build the entry directory under `out_root`; returns its path and model."""

    adm = _admit(campaign_dir)
    d, spec, state, protocol, is_baseline = adm.d, adm.spec, adm.state, adm.protocol, adm.is_baseline
    verdict, ev_path, runs_needed, ref, cand_check = adm.verdict, adm.ev_path, adm.runs_needed, adm.ref, adm.cand_check
    source_head = ledger_head(d)
    from attune.control.plane import SOURCE_ROOT

    reloc = Relocator(d, (d / spec.control.workdir).resolve() if spec.control.workdir else SOURCE_ROOT, SOURCE_ROOT)
    throughput = _throughput(adm)
    tps = throughput.tokens_per_s_per_gpu
    price = prices.per_gpu_hour.get(spec.cluster.accelerator)
    sim = spec.cluster.backend == "sim"
    out_root = Path(out_root)
    out_root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{_slug(spec.model)}.", dir=out_root))
    os.chmod(tmp, 0o755)
    try:
        writer = _EntryFiles(tmp, reloc)
        put, files = writer.put, writer.files

        put(None, "recipe/run.sh", reloc.run_sh(d / SHIPPED_DIR / "run.sh"))
        os.chmod(tmp / "recipe/run.sh", 0o755)
        job_json = d / SHIPPED_DIR / RUN_JOB
        if job_json.is_file():
            put(job_json, "recipe/job.json")
        put(d / CAMPAIGN_FILE, f"evidence/{CAMPAIGN_FILE}")
        put(None, "evidence/ledger.jsonl", reloc.ledger_file(d / LEDGER_FILE))
        head = ledger_head(tmp / "evidence", copy=True)
        if head["rows"] != source_head["rows"]:
            raise SubmitRefused("the ledger changed while it was being copied; submit again")
        head["source_last_hash"] = source_head["last_hash"]
        head["authenticated"], head["mac"] = source_head["authenticated"], source_head["mac"]
        entry_id = _slug(f"{spec.model}-{spec.cluster.accelerator}x{spec.cluster.gpus}-{protocol.id}-{head['last_hash'][:10]}")
        final = out_root / entry_id
        if final.exists():
            raise SubmitRefused(f"{final} exists: this campaign was already submitted")
        put(ev_path, "evidence/shipped-evidence.json")
        from attune.control.plane import load_gate_list

        try:
            loaded_list = load_gate_list(spec, d, state.list_sha256)
            put(Path(loaded_list.path), "evidence/gate-list.yaml")
        except (OSError, ValueError) as exc:
            raise SubmitRefused(f"the campaign's correctness list cannot be used: {exc}") from None
        _put_runs(writer, d, runs_needed, ref.run_id if ref else None, cand_check, spec.framework)

        public_args, public_src = _public_recipe(writer, d, spec, public_recipe)
        entry = Entry(
            id=entry_id,
            submitted=(now or datetime.now(UTC)).isoformat(timespec="seconds"),
            protocol=protocol.id, simulated=sim, label=_label(sim, protocol), model=spec.model, campaign=spec.name,
            hardware=Hardware(accelerator=spec.cluster.accelerator, gpus=spec.cluster.gpus,
                              gpus_per_node=spec.cluster.gpus_per_node, nodes=spec.cluster.nodes,
                              backend=spec.cluster.backend),
            software=Software(framework=spec.framework, framework_version=None, image=spec.baseline.image,
                              attune_version=__version__),
            recipe=_entry_recipe(reloc.obj(state.shipped), spec, public_args, public_src),
            throughput=throughput,
            cost=Cost(price_per_gpu_hour=price, usd_per_million_tokens=usd_per_million(tps, price),
                      price_table=f"{prices.name}: {spec.cluster.accelerator}" if price is not None
                      else f"{prices.name}: no price for {spec.cluster.accelerator}"),
            gate=Gate(list_sha256=loaded_list.sha256, candidate_check_run=cand_check,
                      baseline_check_run=ref.run_id if ref else None,
                      layer1=(verdict or {}).get("layer1"), convergence=(verdict or {}).get("convergence"),
                      passed=True, shipped_baseline=is_baseline),
            ledger=LedgerHead(**head),
            files=files,
        )
        (tmp / ENTRY_FILE).write_text(entry.model_dump_json(indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final, entry
