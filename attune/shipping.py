"""Shipping: after the stop, check the best candidates with the gate, ship one, re-measure it.

The control plane, not the agent, runs this step. It is a state machine over the ledger, so a
broker that restarts (or a campaign resumed days later) carries on where it stopped:

1. **Due** once the campaign has stopped (a stop record, or the budget spent) and no search run is
   in flight.
2. **Candidates**: finished search runs that beat the baseline's calibration mean by more than the
   band, fastest first, at most three (`MAX_CANDIDATES`).
3. **Reference**: one check run of the baseline (`gate.convergence_steps` steps, the baseline's data
   and seed), run once and cached: its loss curve and resolved arguments are what every candidate is
   compared with. Then `gate.replicate_check_runs` (default 2) more check runs of the baseline: with
   the reference they give three pairs of runs of the same objective, the fewest from which a
   spread can be read, and they cover every step of the check (the calibration runs, which also
   count, cover only `steps_per_run`). They set the noise envelope of the convergence check
   (`gate.noise`; on a deterministic stack they reproduce the reference exactly, and say so). Check
   runs are paid from the check reserve alone (`launch.check_budget_refusal`), which counts these
   replicates.
4. **Checks**, fastest candidate first: a check run of the candidate recipe (same steps, data and
   seed: the gate refuses any change of those), then layer 1 again on the fully resolved arguments
   and environment of both check runs (`gate.config_check.check_resolved`), then layer 2 on the two
   loss curves (`gate.judge.judge`: the reference rule and the noise-aware check against the
   envelope of the baseline's replicates and calibration runs, both verdicts recorded). Each verdict
   is a `check_run` row. The first candidate that passes ships; if none does (or the reserve cannot
   pay for another check), the baseline ships. `shipped` row, and `shipped/` on disk.
5. **Final re-measurement**: the baseline and the shipped recipe run again, two repeats each, in a
   randomised interleaved order (seeded by the campaign, so a resumed campaign keeps the order); a
   recipe whose two repeats differ by more than the band gets a third; a repeat without a valid
   measurement is run again (at most `MAX_EXTRA_REPEATS` times). Each is a `remeasurement` row,
   charged outside the search budget (`charged_to: final`).

6. **Failed**, never success on nothing: a campaign that stopped without a calibrated baseline, or
   whose final re-measurement got no valid measurement of a recipe (every repeat failed or was
   invalid), ends failed: a `campaign_failed` row with the reason, and `evidence.json` says
   `"complete": false` with the reasons. `attune tune` exits non-zero on it.

`advance(control)` takes one step and returns the admission of a run to submit (the broker submits
it), or None. `record_final_run` is called by `Control.finish` when a check or re-measurement run
ends, under the campaign lock.
"""

from __future__ import annotations

import json
import os
import random
import shlex
import statistics
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attune.campaign import campaign_lock
from attune.campaign_paths import RUN_JOB, RUN_LOG, SHIPPED_DIR, SHIPPED_EVIDENCE
from attune.measure import beats, gain
from attune.rungen import Changes, render_value, substitute
from attune.state import CampaignState, RunState

if TYPE_CHECKING:
    from attune.launch import Admission, Control

MAX_CANDIDATES = 3
REPEATS = 2
MAX_EXTRA_REPEATS = 2  # re-runs of a repeat without a valid measurement, per recipe
MAX_REFERENCE_ATTEMPTS = 2


@dataclass(frozen=True)
class Action:
    """The next step: wait, launch a check or re-measurement run of a recipe, ship a recipe, or done."""

    kind: str  # wait | not_due | check | remeasure | ship | done | fail (record the failure) | failed
    of: str | None = None  # "baseline" or a run id
    reason: str = ""


# ------------------------------------------------------------------------------------- reading


def is_due(state: CampaignState) -> bool:
    return state.name is not None and (state.stop is not None or state.budget.spent)


def candidates(state: CampaignState, limit: int = MAX_CANDIDATES) -> list[RunState]:
    """Search runs that beat the baseline by more than the band, fastest first, at most `limit`."""
    cal = state.calibration
    if cal is None:
        return []
    good = [r for r in state.runs.values()
            if r.kind == "search" and r.status == "finished" and r.outcome == "ok" and r.valid
            and r.tokens_per_s_per_gpu is not None and beats(r.tokens_per_s_per_gpu, cal.mean, cal.band)]
    good.sort(key=lambda r: (-float(r.tokens_per_s_per_gpu or 0.0), r.admitted_seq or 0))
    return good[:limit]


def _runs_of(state: CampaignState, kind: str, of: str) -> list[RunState]:
    return [r for r in state.runs.values() if r.kind == kind and r.base_run_id == of]


def _baseline_checks(state: CampaignState) -> list[RunState]:
    return [r for r in _runs_of(state, "check", "baseline") if r.status == "finished" and r.outcome == "ok"]


def reference_run(state: CampaignState) -> RunState | None:
    """The baseline's cached check run: the first one that finished well (later ones are replicates)."""
    ok = _baseline_checks(state)
    return ok[0] if ok else None


def replicate_runs(state: CampaignState) -> list[RunState]:
    """The baseline's other check runs that finished well: its replicates, for the noise envelope."""
    return _baseline_checks(state)[1:]


def check_verdict(state: CampaignState, run_id: str) -> dict[str, Any] | None:
    found = [c for c in state.checks if c.get("candidate_run_id") == run_id]
    return found[-1] if found else None


def _remeasure_rng(state: CampaignState, salt: str) -> random.Random:
    return random.Random(f"{state.name}:{state.spec_sha256}:{salt}")


def remeasure_order(state: CampaignState) -> list[str]:
    """The randomised, interleaved order of the final re-measurement's first two rounds."""
    shipped = (state.shipped or {}).get("run_id")
    recipes = ["baseline"] if shipped in (None, "baseline") else ["baseline", str(shipped)]
    rng = _remeasure_rng(state, "order")
    order: list[str] = []
    for _ in range(REPEATS):
        rnd = list(recipes)
        rng.shuffle(rnd)
        order += rnd
    return order


def remeasured(state: CampaignState, valid_only: bool = True) -> dict[str, list[float]]:
    """Each recipe's re-measured throughputs (valid repeats; with `valid_only=False`, every repeat)."""
    out: dict[str, list[float]] = {}
    for r in state.remeasurements:
        if valid_only and not r.get("valid", True):
            continue
        out.setdefault(str(r["recipe_of"]), []).append(float(r["tokens_per_s_per_gpu"]))
    return out


def recipe_values(state: CampaignState, recipe: str) -> tuple[list[float], bool]:
    """A recipe's final values: its valid repeats, or, when none was valid (a busy machine makes the
    window uneven), every repeat that measured something. The flag says which."""
    valid = remeasured(state).get(recipe, [])
    if valid:
        return valid, True
    return remeasured(state, valid_only=False).get(recipe, []), False


def next_remeasure(state: CampaignState) -> str | None:
    """The recipe whose repeat runs next, or None when the re-measurement is complete."""
    if state.shipped is None:
        return None
    values = remeasured(state)
    counts = Counter({k: len(v) for k, v in values.items()})
    attempts = Counter(r.base_run_id for r in state.runs.values() if r.kind == "remeasure")
    band = state.calibration.band if state.calibration else 0.0

    refused = {x.get("of") for x in state.refusals if x.get("kind") == "remeasure"}

    def gave_up(recipe: str, need: int) -> bool:
        return recipe in refused or attempts[recipe] >= need + MAX_EXTRA_REPEATS

    order = remeasure_order(state)
    used: Counter[str] = Counter()
    for recipe in order:
        used[recipe] += 1
        if counts[recipe] < used[recipe] and not gave_up(recipe, used[recipe]):
            return recipe
    third = sorted(set(order))
    _remeasure_rng(state, "third").shuffle(third)
    for recipe in third:
        vals = values.get(recipe, [])
        if len(vals) == REPEATS and abs(vals[0] - vals[1]) / statistics.fmean(vals) > band and not gave_up(recipe, 3):
            return recipe
    return None


def _calibration_problem(state: CampaignState) -> str:
    cal_runs = [r for r in state.runs.values() if r.kind == "calibration"]
    bad = [r for r in cal_runs if r.status == "finished" and not (r.outcome == "ok" and r.valid)]
    why = ""
    if bad:
        last = bad[-1]
        why = (f"; last failed or invalid run {last.run_id}: {last.outcome}"
               + (f" ({last.reason})" if last.reason else "")
               + (f", {'; '.join(last.invalid_reasons)}" if last.invalid_reasons else ""))
    return (f"no valid calibration: {len(state.calibration_values)} of {state.calibration_runs_required} good baseline "
            f"runs ({len(cal_runs)} launched, {len(bad)} failed or invalid){why}; without a measured baseline "
            "nothing can be shipped or compared")


def remeasure_problems(state: CampaignState) -> list[str]:
    """Why the final re-measurement is not valid evidence: recipes without a valid repeat."""
    problems = []
    for recipe in sorted(set(remeasure_order(state))):
        if remeasured(state).get(recipe):
            continue
        runs = [r for r in state.runs.values() if r.kind == "remeasure" and r.base_run_id == recipe]
        outcomes = Counter(r.outcome or "?" for r in runs)
        invalid = [r for r in runs if r.outcome == "ok" and not r.valid]
        detail = ", ".join(f"{n} {o}" for o, n in sorted(outcomes.items())) or "no run admitted"
        last = runs[-1] if runs else None
        why = ""
        if last is not None:
            why = f"; last: {last.run_id} {last.outcome}" + (f" ({last.reason})" if last.reason else "")
            if invalid:
                why += f", invalid: {'; '.join(invalid[-1].invalid_reasons)}"
        problems.append(f"no valid re-measurement of {recipe} ({len(runs)} run(s): {detail}){why}")
    return problems


def plan(state: CampaignState) -> Action:
    """The next shipping step, from the campaign's state alone."""
    if state.failed is not None:
        return Action("failed", reason=str(state.failed.get("reason")))
    if not is_due(state):
        return Action("not_due", reason="the campaign has not stopped")
    if state.in_flight:
        return Action("wait", reason="runs in flight: " + ", ".join(r.run_id for r in state.in_flight))
    if state.calibration is None:
        return Action("fail", reason=_calibration_problem(state))
    if state.shipped is None:
        cands = candidates(state)
        if not cands:
            return Action("ship", "baseline", "no search run beat the baseline by more than the band")
        refused = [x for x in state.refusals if x.get("kind") == "check" and x.get("code") == "budget"]
        if refused:
            return Action("ship", "baseline", "the reserve could not pay for the next correctness check: "
                          + str(refused[-1].get("reason")))
        ref = reference_run(state)
        unlaunchable = {x.get("of") for x in state.refusals if x.get("kind") == "check"}
        if ref is None:
            if "baseline" in unlaunchable or len(_runs_of(state, "check", "baseline")) >= MAX_REFERENCE_ATTEMPTS:
                return Action("ship", "baseline", "the baseline's own check run could not be run: no reference curve")
            return Action("check", "baseline", "the baseline's reference curve for the convergence check")
        done_reps = len(replicate_runs(state))
        failed = len(_runs_of(state, "check", "baseline")) - 1 - done_reps
        if done_reps < state.replicate_check_runs and failed < MAX_REFERENCE_ATTEMPTS:
            return Action("check", "baseline", f"replicate check run {done_reps + 1} of {state.replicate_check_runs} of "
                          "the baseline: the noise envelope of the convergence check")
        for c in cands:
            if c.run_id in unlaunchable:  # its check run could not even be admitted (a shape problem, say)
                continue
            verdict = check_verdict(state, c.run_id)
            if verdict is not None:
                if verdict.get("passed"):
                    return Action("ship", c.run_id, "the fastest candidate that passed the correctness gate")
                continue
            return Action("check", c.run_id, f"correctness check of {c.run_id}")
        return Action("ship", "baseline", f"none of the {len(cands)} candidate(s) passed the correctness gate")
    nxt = next_remeasure(state)
    if nxt is not None:
        return Action("remeasure", nxt, "final re-measurement")
    problems = remeasure_problems(state)
    if problems:
        return Action("fail", (state.shipped or {}).get("run_id"), "; ".join(problems))
    return Action("done", (state.shipped or {}).get("run_id"), "shipped and re-measured")


def status(state: CampaignState) -> dict[str, Any]:
    """Where shipping stands, for `attune tune`, the broker's campaign status and the demo."""
    a = plan(state)
    phase = {"not_due": "searching", "wait": "waiting", "check": "checking", "ship": "checking",
             "remeasure": "remeasuring", "done": "done", "fail": "failed", "failed": "failed"}[a.kind]
    if a.kind == "wait" and state.shipped is not None:
        phase = "remeasuring"
    elif a.kind == "wait" and not any(r.kind == "search" for r in state.in_flight):
        phase = "checking" if state.shipped is None else "remeasuring"
    elif a.kind == "wait":
        phase = "searching"
    return {
        "phase": phase, "done": a.kind == "done", "failed": a.kind in ("fail", "failed"),
        "failure": a.reason if a.kind in ("fail", "failed") else None, "next": a.kind, "of": a.of, "reason": a.reason,
        "candidates": [c.run_id for c in candidates(state)] if is_due(state) else [],
        "checks": [{"candidate_run_id": c.get("candidate_run_id"), "passed": c.get("passed")} for c in state.checks],
        "shipped": (state.shipped or {}).get("run_id"),
        "remeasured": remeasured(state),
    }


def done(state: CampaignState) -> bool:
    """Shipped and re-measured with valid measurements: the campaign succeeded."""
    return plan(state).kind == "done"


def ended(state: CampaignState) -> bool:
    """Nothing more runs: done, or failed (the failure is recorded, or about to be)."""
    return plan(state).kind in ("done", "fail", "failed")


# ------------------------------------------------------------------------------------- checks


def _job_env(control: Control, run_id: str) -> dict[str, str]:
    try:
        return dict(control.job_doc(run_id).get("env") or {})
    except (OSError, ValueError):
        return {}


def evaluate_check(control: Control, state: CampaignState, run: RunState, ref: RunState | None) -> dict[str, Any]:
    """The gate's verdict on one candidate's check run, against the baseline's reference run."""
    from attune.launch import load_gate_list
    from gate.config_check import check_resolved
    from gate.convergence import loss_deviation
    from gate.judge import judge
    from gate.lists import ListError
    from gate.noise import config_for, precision_of

    data: dict[str, Any] = {"run_id": run.run_id, "candidate_run_id": run.base_run_id,
                            "baseline_check_run_id": ref.run_id if ref else None}
    if run.outcome != "ok":
        return {**data, "passed": False, "reason": f"the check run did not finish well ({run.outcome}: {run.reason})"}
    if ref is None:
        return {**data, "passed": False, "reason": "no reference run of the baseline"}
    cand_log = control.run_dir(run.run_id) / RUN_LOG
    ref_log = control.run_dir(ref.run_id) / RUN_LOG
    try:
        loaded = load_gate_list(control.spec, control.dir, state.list_sha256)
    except (ListError, OSError) as exc:
        return {**data, "passed": False, "reason": f"the correctness list cannot be used: {exc}"}
    b_res, c_res = _resolved_args(state, ref_log), _resolved_args(state, cand_log)
    if not c_res or not b_res:
        l1: dict[str, Any] = {"passed": False, "summary": "no resolved arguments block in the check run's log",
                              "refusals": []}
    else:
        r1 = check_resolved(loaded, b_res, c_res, _job_env(control, ref.run_id), _job_env(control, run.run_id))
        l1 = {"passed": r1.passed, "summary": r1.summary(), "refusals": [x.model_dump() for x in r1.refusals],
              "list_sha256": r1.list_sha256}
    b_curve, c_curve = _losses(state, ref_log), _losses(state, cand_log)
    noise_runs = [(r.run_id, "replicate", _losses(state, control.run_dir(r.run_id) / RUN_LOG))
                  for r in replicate_runs(state)]
    noise_runs += [(rid, "calibration", _losses(state, control.run_dir(rid) / RUN_LOG))
                   for rid in state.calibration_run_ids]
    g = judge(b_curve, c_curve, replicates=[x for x in noise_runs if x[2]],
              noise_config=config_for(precision_of(b_res or {})))
    r2, na = g.reference, g.noise_aware
    conv = {"passed": g.passed, "summary": g.summary, "reasons": list(g.reasons),
            "failed_checks": list(r2.failed_checks), "data_problems": list(r2.data_problems),
            "n_steps": r2.n_steps, "deviation": loss_deviation(b_curve, c_curve),
            "correlation": r2.checks.correlation.value if r2.checks else None,
            "final_loss_rel_diff": r2.checks.final_loss.rel_diff if r2.checks else None,
            "reference": {"passed": r2.passed, "summary": r2.summary()},
            "excused": [e.model_dump() for e in g.excused],
            "noise_aware": {"passed": na.passed, "summary": na.summary(), "failed_checks": list(na.failed_checks),
                            "level_z": na.level.mean_z if na.level else None,
                            "trend_z": na.trend.drift_z if na.trend else None,
                            "outside": na.pointwise.outside if na.pointwise else None,
                            "envelope": na.envelope.basis, "noise_runs": [x[0] for x in noise_runs if x[2]],
                            "notes": list(na.notes)}}
    passed = bool(l1["passed"] and conv["passed"])
    reason = "passed both layers" if passed else "; ".join(
        x for x in (None if l1["passed"] else f"layer 1: {l1['summary']}",
                    None if conv["passed"] else f"convergence: {conv['summary']}") if x)
    return {**data, "passed": passed, "reason": reason, "layer1": l1, "convergence": conv}


def _losses(state: CampaignState, log: Path) -> dict[int, float | None]:
    """A run's loss per iteration, read with the campaign's framework reader; empty if unreadable."""
    from attune.metrics import read_losses

    try:
        return read_losses(log, state.framework or "megatron-lm")
    except (OSError, ValueError):
        return {}


def _resolved_args(state: CampaignState, log: Path) -> dict[str, str]:
    """A run's resolved arguments, read with the campaign's framework reader; empty if the log has none."""
    from attune.metrics import read_resolved_args

    try:
        return read_resolved_args(log, state.framework or "megatron-lm")
    except (OSError, ValueError):
        return {}


def record_final_run(control: Control, run_id: str) -> dict[str, Any]:
    """Under the campaign lock, after `run_finished` and `measurement`: the check or re-measurement row."""
    state = control.state()
    run = state.runs[run_id]
    if run.kind == "remeasure":
        if run.outcome == "ok" and run.tokens_per_s_per_gpu is not None:
            control.ledger.append("remeasurement", {"run_id": run_id, "recipe_of": run.base_run_id,
                                                    "tokens_per_s_per_gpu": run.tokens_per_s_per_gpu,
                                                    "valid": bool(run.valid), "invalid_reasons": run.invalid_reasons})
            return {"remeasured": run.base_run_id}
        return {"remeasured": None}
    if run.base_run_id == "baseline":
        return {"reference": True}
    data = evaluate_check(control, state, run, reference_run(state))
    control.ledger.append("check_run", data)
    return {"check_passed": data["passed"]}


# ------------------------------------------------------------------------------------- acting


def advance(control: Control, backend: Any = None) -> Admission | None:
    """Take the next shipping step. Returns an admitted run for the caller to submit, or None."""
    state = control.state()
    action = plan(state)
    if action.kind in ("check", "remeasure"):
        assert action.of is not None
        decision = control.admit_final(action.kind, action.of)
        return decision if decision.admitted else None
    if action.kind == "ship":
        assert action.of is not None
        ship(control, action.of, action.reason, backend)
    elif action.kind == "fail":
        fail(control, action.reason, backend)
    elif action.kind == "done":
        path = control.dir / SHIPPED_DIR / SHIPPED_EVIDENCE
        try:
            complete = bool(json.loads(path.read_text()).get("remeasurement", {}).get("complete"))
        except (OSError, ValueError):
            complete = False
        if not complete:
            write_shipped(control, control.state(), backend)
    return None


def ship(control: Control, run_id: str, reason: str, backend: Any = None) -> None:
    with campaign_lock(control.dir):
        state = control.state()
        if state.shipped is not None:
            return
        changes = _changes(state, run_id)
        args, env = control.gen.apply(changes)
        run = state.runs.get(run_id)
        verdict = check_verdict(state, run_id) if run_id != "baseline" else None
        control.ledger.append("shipped", {
            "run_id": run_id,
            "recipe": {"command": list(control.spec.baseline.command), "args": args, "env": env,
                       "image": control.spec.baseline.image},
            "changes": changes.as_dict(),
            "tokens_per_s_per_gpu": run.tokens_per_s_per_gpu if run else (state.calibration.mean if state.calibration
                                                                          else None),
            "gain_at_search": (gain(run.tokens_per_s_per_gpu, state.calibration.mean)
                               if run and run.tokens_per_s_per_gpu and state.calibration else 0.0),
            "check_run_id": verdict.get("run_id") if verdict else None,
            "candidates": [c.run_id for c in candidates(state)],
            "reason": reason,
        })
    write_shipped(control, control.state(), backend)


def fail(control: Control, reason: str, backend: Any = None) -> None:
    """End the campaign failed: a `campaign_failed` row with the reason (once), and the evidence says so."""
    with campaign_lock(control.dir):
        state = control.state()
        if state.failed is not None:
            return
        phase = "calibration" if state.calibration is None else "remeasurement"
        control.ledger.append("campaign_failed", {"reason": reason, "phase": phase,
                                                  "shipped": (state.shipped or {}).get("run_id")})
    write_shipped(control, control.state(), backend)


def _changes(state: CampaignState, run_id: str) -> Changes:
    if run_id == "baseline":
        return Changes()
    ch = state.runs[run_id].changes
    return Changes(dict(ch.get("args") or {}), dict(ch.get("env") or {}))


def _recipe_value(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def write_shipped(control: Control, state: CampaignState, backend: Any = None) -> Path | None:
    """`shipped/`: the recipe as a runnable job (job.json, run.sh) and its correctness evidence."""
    if state.shipped is None:
        return None
    out = control.dir / SHIPPED_DIR
    out.mkdir(exist_ok=True)
    run_id = str(state.shipped["run_id"])
    spec = control.spec
    changes = _changes(state, run_id)
    cand = control.gen.candidate(changes, Changes(), False)
    run_dir = out / "run"
    job = control.gen.resolve(cand, run_dir, control.workdir)
    python = interpreter(control, state, run_id)
    if python is not None:
        from dataclasses import replace

        job = replace(job, argv=(python, *job.argv[1:]))
    placeholders = control.gen.placeholders(Path("${RUN_DIR}"))
    command = [substitute(a, placeholders) for a in spec.baseline.command]
    args = {k: substitute(v, placeholders) if isinstance(v, str) else v
            for k, v in {**cand.args, **control.gen.trusted_args(False)}.items()}
    env = {**cand.env, **spec.control.stack_fixes.env}
    _write(out / RUN_JOB, json.dumps({
        "campaign": spec.name, "shipped": run_id, "changes": changes.as_dict(),
        "argv": list(job.argv), "args": job.args, "env": job.env, "gpus": job.gpus,
        "gpus_per_node": job.gpus_per_node, "image": job.image, "workdir": str(job.workdir),
        "backend": spec.cluster.backend, "run_dir": str(run_dir),
    }, indent=2, default=str) + "\n")

    def q(x: str) -> str:
        rest = x.replace("${RUN_DIR}", "")
        if "${RUN_DIR}" in x and not any(c in rest for c in '"$`\\'):
            return f'"{x}"'
        return shlex.quote(x)

    lines = [
        "#!/bin/sh",
        f"# The recipe attune shipped for campaign {spec.name}: {run_id}",
        f"# Changes from the baseline: {_describe(changes) or 'none (the baseline ships)'}",
        f"# {spec.cluster.gpus} GPU(s), {spec.cluster.gpus_per_node} per node; correctness evidence: evidence.json",
        "# The run length is the campaign's measurement length: set the steps you need for training.",
        "# Usage: RUN_DIR=/path/for/outputs sh run.sh",
        "set -e",
        'RUN_DIR="${RUN_DIR:-$(pwd)/run}"',
        'mkdir -p "$RUN_DIR"',
        f"cd {shlex.quote(str(control.workdir))}",
    ]
    lines += [f"export {k}={shlex.quote(str(v))}" for k, v in env.items()]
    parts = [" ".join(q(a) for a in command)]
    if python is not None:
        lines += [PYTHON_COMMENT, f"PYTHON=${{PYTHON:-{_sh_word(python)}}}"]
        parts = [" ".join(['"$PYTHON"'] + [q(a) for a in command[1:]])]
    parts += [" ".join([flag] + [q(x) for x in render_value(v)]) for flag, v in args.items()
              if v is not None and v is not False]
    lines.append("exec " + " \\\n    ".join(parts))
    _write(out / "run.sh", "\n".join(lines) + "\n", mode=0o755)
    if backend is not None and spec.cluster.backend != "local":
        from dataclasses import replace

        js = replace(job, job_id=f"{spec.name}-shipped")
        _write(out / f"job.{spec.cluster.backend}.sh", backend.render(js))
    _write(out / SHIPPED_EVIDENCE, json.dumps(evidence(control, state), indent=2, default=str) + "\n")
    return out


PYTHON_COMMENT = "# The interpreter the campaign's measured runs used (set PYTHON to run with another):"


def interpreter(control: Control, state: CampaignState, run_id: str) -> str | None:
    """The interpreter the recipe's measured runs ran with, when the command starts with `python`, else None.

    On the local backend a job's `python` is the workload's interpreter (spec `environment`: the control
    plane wrote it into the job's argv), or else the broker's own (the local backend puts it first on
    PATH). On a cluster the job's image is its environment, and its `python` stays as written."""
    import shutil
    import sys

    cmd = control.spec.baseline.command
    if control.spec.cluster.backend != "local" or not cmd or os.path.basename(cmd[0]) not in ("python", "python3"):
        return None
    measured = ([run_id] if run_id != "baseline" else []) + list(state.calibration_run_ids)
    for rid in measured:
        try:
            argv = control.job_doc(rid).get("argv") or []
        except (OSError, ValueError):
            continue
        if argv and os.path.isabs(str(argv[0])):
            return str(argv[0])
        break
    if control.spec.environment is not None:
        from attune import workenv

        st = workenv.status(control.spec, control.dir)
        return st.python if st.state == "ready" else None
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", os.defpath)])
    found = shutil.which(cmd[0], path=path)
    return os.path.abspath(found) if found else None


def _sh_word(x: str) -> str:
    """`x` inside ${VAR:-...} in an assignment: as is when it is a plain path, else single-quoted."""
    import re

    return x if re.fullmatch(r"[A-Za-z0-9._+/-]+", x) else shlex.quote(x)


def evidence(control: Control, state: CampaignState) -> dict[str, Any]:
    shipped = state.shipped or {}
    run_id = str(shipped.get("run_id"))
    cal = state.calibration
    values = remeasured(state, valid_only=False)
    (bv, b_ok), (sv, s_ok) = recipe_values(state, "baseline"), recipe_values(state, run_id)
    base_v, ship_v = _recipe_value(bv), _recipe_value(sv)
    admitted_gate = None
    for row in control.ledger.rows():
        if row.type == "launch_admitted" and row.data.get("run_id") == run_id:
            admitted_gate = row.data.get("gate")
    ref = reference_run(state)
    remeasure_done = next_remeasure(state) is None and not any(r.kind == "remeasure" for r in state.in_flight)
    incomplete = []
    if cal is None:
        incomplete.append(_calibration_problem(state))
    if not remeasure_done:
        incomplete.append("the final re-measurement is still running")
    else:
        incomplete += remeasure_problems(state)
    if state.failed is not None and str(state.failed.get("reason")) not in incomplete:
        incomplete.append(str(state.failed.get("reason")))
    return {
        "campaign": state.name, "shipped": run_id, "reason": shipped.get("reason"),
        "complete": not incomplete, "incomplete": incomplete,
        "failed": state.failed.get("reason") if state.failed else None,
        "changes": shipped.get("changes"),
        "list_sha256": state.list_sha256,
        "calibration": {"runs": state.calibration_run_ids, "values": state.calibration_values,
                        "mean": cal.mean if cal else None, "rel_sigma": cal.rel_sigma if cal else None,
                        "band": cal.band if cal else None},
        "search_measurement": {"tokens_per_s_per_gpu": shipped.get("tokens_per_s_per_gpu"),
                               "gain": shipped.get("gain_at_search")},
        "layer1_at_launch": admitted_gate,
        "reference_check_run": ref.run_id if ref else None,
        "checks": [{k: v for k, v in c.items() if k != "seq"} for c in state.checks],
        "remeasurement": {
            "order": remeasure_order(state), "values": values,
            "valid_only": {"baseline": b_ok, run_id: s_ok},
            "baseline_tokens_per_s_per_gpu": base_v, "shipped_tokens_per_s_per_gpu": ship_v,
            "gain": gain(ship_v, base_v) if base_v and ship_v else None,
            # complete only with valid measurements of the calibrated baseline and of both recipes
            "complete": not incomplete,
        },
    }


def _describe(ch: Changes) -> str:
    def show(v: object) -> str:
        return "unset" if v is None else str(v)

    parts = [f"{k}={show(v)}" for k, v in ch.args.items()] + [f"{k}={show(v)}" for k, v in ch.env.items()]
    return ", ".join(parts)


def _write(path: Path, text: str, mode: int | None = None) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    if mode is not None:
        os.chmod(tmp, mode)
    os.replace(tmp, path)
