"""Shipping: after the stop, check the best candidates with the gate, ship one, re-measure it.

The control plane, not the agent, runs this step. It is a state machine over the ledger, so a
broker that restarts (or a campaign resumed days later) carries on where it stopped:

1. **Due** once the campaign has stopped (a stop record, or the budget spent) and no search run is
   in flight.
2. **Candidates**: finished search runs that beat the baseline's calibration mean by more than the
   band, fastest first, at most three (`MAX_CANDIDATES`).
3. **Reference**: one check run of the baseline (`gate.convergence_steps` steps, the baseline's data
   and seed), run once and cached: its loss curve and resolved arguments are what every candidate is
   compared with. A calibration run is the baseline's recipe, data and seed already: the control plane
   runs the first unprofiled one `gate.convergence_steps` steps long (`purpose: reference`), and when it
   finished well it is the reference, and no check run of the baseline is launched. Then
   `gate.replicate_check_runs` more check runs of the baseline (default: none where
   the calibration runs cover at least half of the check's judged steps, they are replicates already;
   else 2, `replicate_check_runs`): with
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
   A check rejected within the margin of its thresholds (`borderline` in its row, `gate.judge.borderline`)
   gets ONE replicate check run of the same candidate (`ShipAction.CHECK_REPLICATE`,
   `borderline_replicate`; admitted by the same pipeline, `plane.rule_one_replicate`, paid from the check
   reserve); once it finishes, the candidate is judged again with its own spread in the noise model
   (`ShipAction.REJUDGE`, a second `check_run` row that is the candidate's verdict).
5. **Final re-measurement**: the baseline and the shipped recipe run again, two repeats each, in a
   randomised interleaved order (seeded by the campaign, so a resumed campaign keeps the order); a
   recipe whose two repeats differ by more than the band gets a third; a repeat without a valid
   measurement is run again (at most `MAX_EXTRA_REPEATS` times). Each is a `remeasurement` row,
   charged outside the search budget (`charged_to: final`).

6. **Failed**, never success on nothing: a campaign that stopped without a calibrated baseline, or
   whose final re-measurement got no valid measurement of a recipe (every repeat failed or was
   invalid), ends failed: a `campaign_failed` row with the reason, and `evidence.json` says
   `"complete": false` with the reasons. `attune tune` exits non-zero on it.

This module is the policy alone: pure functions of the campaign's state (folded from the ledger)
that say what is due and what to do next (`plan` returns an `Action`: wait, launch a check or a
re-measurement run of a recipe, judge a finished check run, record a finished re-measurement, ship a
recipe, fail, done), and the rows those steps write (`remeasurement_row`, `shipped_row`, `failed_row`,
`evidence`). It imports nothing of the control plane that runs it: `attune.control.shipper` executes the
actions (admits runs through `Control`, runs the gate on a check run's logs, appends the rows,
writes `shipped/`).
"""

from __future__ import annotations

import random
import statistics
from collections import Counter
from dataclasses import dataclass
from typing import Any

from attune.control.rungen import Changes
from attune.core.campaign_paths import SHIPPED_DIR  # noqa: F401 - shipping.SHIPPED_DIR, as callers read it
from attune.core.measure import beats, gain
from attune.core.state import CampaignState, RunState
from attune.core.vocab import RunKind, RunOutcome, ShipAction

MAX_CANDIDATES = 3
REPEATS = 2
MAX_EXTRA_REPEATS = 2  # re-runs of a repeat without a valid measurement, per recipe
MAX_REFERENCE_ATTEMPTS = 2


@dataclass(frozen=True)
class Action:
    """The next step: wait, launch a check or re-measurement run of a recipe, judge a finished check
    run or record a finished re-measurement run, ship a recipe, or done."""

    kind: ShipAction
    of: str | None = None  # "baseline" or a run id (judge, record: the finished check or re-measurement run)
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
            if r.kind == RunKind.SEARCH and r.status == "finished" and r.outcome == RunOutcome.OK and r.valid
            and r.tokens_per_s_per_gpu is not None and beats(r.tokens_per_s_per_gpu, cal.mean, cal.band)]
    good.sort(key=lambda r: (-float(r.tokens_per_s_per_gpu or 0.0), r.admitted_seq or 0))
    return good[:limit]


# The replicate check runs a spec that leaves `gate.replicate_check_runs` unset gets when its calibration
# runs do not cover enough of the check's judged steps (with the reference: 3 pairs of same-objective runs).
DEFAULT_REPLICATE_CHECK_RUNS = 2
# The share of the check's judged steps the calibration runs must cover to stand in for those replicates.
CALIBRATION_COVERAGE_MIN = 0.5
# The convergence rule skips this share of a check's first steps (shared/reference/convergence-check.md).
JUDGE_SKIP_FRACTION = 0.20


def calibration_coverage(steps_per_run: int, convergence_steps: int) -> float:
    """The share of a check run's judged steps (after the rule's skipped first steps) that a calibration run's
    loss curve covers: it logs every step up to `steps_per_run`, the check runs `convergence_steps`."""
    skip = int(convergence_steps * JUDGE_SKIP_FRACTION)
    judged = convergence_steps - skip
    return max(0, min(steps_per_run, convergence_steps) - skip) / judged if judged > 0 else 0.0


def replicate_check_runs(spec: Any) -> int:
    """The baseline's replicate check runs a campaign runs before its checks: the spec's number when it gives
    one; else none where the calibration runs cover at least `CALIBRATION_COVERAGE_MIN` of the judged steps.
    Calibration runs are runs of the baseline's recipe, data and seed: their loss curves are replicates
    already (the shipper passes them to the judge as such), so a replicate check run would buy again the
    spread they measured. The steps past their end get the gate's extrapolated envelope (the largest noise
    seen; the judge notes it), and the reference rule of the convergence check does not use replicates at
    all: no verdict gets laxer. Else `DEFAULT_REPLICATE_CHECK_RUNS`."""
    given = spec.gate.replicate_check_runs
    if given is not None:
        return int(given)
    enough = spec.calibration.runs >= DEFAULT_REPLICATE_CHECK_RUNS and calibration_coverage(
        spec.workload.steps_per_run, spec.gate.convergence_steps) >= CALIBRATION_COVERAGE_MIN
    return 0 if enough else DEFAULT_REPLICATE_CHECK_RUNS


def _runs_of(state: CampaignState, kind: str, of: str) -> list[RunState]:
    return [r for r in state.runs.values() if r.kind == kind and r.base_run_id == of]


def _baseline_checks(state: CampaignState) -> list[RunState]:
    return [r for r in _runs_of(state, RunKind.CHECK, "baseline") if r.status == "finished" and r.outcome == RunOutcome.OK]


def reference_run(state: CampaignState) -> RunState | None:
    """The baseline's reference curve: the calibration run that ran as its check run, else its cached check
    run, the first one that finished well (later ones are replicates)."""
    cal = state.calibration_reference()
    if cal is not None:
        return cal
    ok = _baseline_checks(state)
    return ok[0] if ok else None


def replicate_runs(state: CampaignState) -> list[RunState]:
    """The baseline's check runs that finished well, the reference aside: its replicates, for the noise envelope."""
    ref = reference_run(state)
    return [r for r in _baseline_checks(state) if ref is None or r.run_id != ref.run_id]


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
    attempts = Counter(r.base_run_id for r in state.runs.values() if r.kind == RunKind.REMEASURE)
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


def unjudged_check(state: CampaignState) -> RunState | None:
    """A candidate's check run that finished and has no `check_run` verdict row yet (the baseline's own
    check runs are the reference and its replicates: they get none; a candidate's replicate check run is
    judged with its check run, `unjudged_replicate`)."""
    judged = {c.get("run_id") for c in state.checks}
    for r in state.runs.values():
        if (r.kind == RunKind.CHECK and r.base_run_id != "baseline" and r.status == "finished"
                and r.run_id not in judged and r.purpose != "replicate"):
            return r
    return None


# ------------------------------------------------------------------ a replicate where a check is borderline


def candidate_replicates(state: CampaignState, of: str) -> list[RunState]:
    """The replicate check runs of candidate `of` (at most one is ever admitted: `plane.rule_one_replicate`)."""
    return [r for r in state.runs.values() if r.kind == RunKind.CHECK and r.base_run_id == of and r.purpose == "replicate"]


def unjudged_replicate(state: CampaignState) -> RunState | None:
    """A candidate's replicate check run that finished (well or not) and whose verdict row is not written yet."""
    judged = {c.get("replicate_run_id") for c in state.checks}
    for r in state.runs.values():
        if r.kind == RunKind.CHECK and r.purpose == "replicate" and r.status == "finished" and r.run_id not in judged:
            return r
    return None


def borderline_replicate(state: CampaignState, candidate: str, verdict: dict[str, Any]) -> Action | None:
    """ONE replicate check run of a candidate whose check was rejected within the margin of its thresholds
    (`borderline` in its `check_run` row, `gate.judge.borderline`): its spread joins the noise model when the
    candidate is judged again. None when the check was not borderline, or the candidate already had (or was
    refused) its one replicate."""
    if verdict.get("passed") or not (verdict.get("borderline") or {}).get("borderline"):
        return None
    refused = any(x.get("of") == candidate and x.get("purpose") == "replicate" for x in state.refusals)
    if candidate_replicates(state, candidate) or refused or verdict.get("replicate_run_id"):
        return None
    why = (verdict.get("borderline") or {}).get("why", "")
    return Action(ShipAction.CHECK_REPLICATE, candidate, f"replicate check run of {candidate}: its check was "
                  f"borderline ({why}); the candidate's own spread joins the noise model")


def unrecorded_remeasurement(state: CampaignState) -> RunState | None:
    """A re-measurement run that finished with a measurement and has no `remeasurement` row yet."""
    recorded = {x.get("run_id") for x in state.remeasurements}
    for r in state.runs.values():
        if (r.kind == RunKind.REMEASURE and r.status == "finished" and r.outcome == RunOutcome.OK and r.tokens_per_s_per_gpu is not None
                and r.run_id not in recorded):
            return r
    return None


def remeasurement_row(run: RunState) -> dict[str, Any]:
    """The `remeasurement` row of a finished re-measurement run."""
    return {"run_id": run.run_id, "recipe_of": run.base_run_id, "tokens_per_s_per_gpu": run.tokens_per_s_per_gpu,
            "valid": bool(run.valid), "invalid_reasons": run.invalid_reasons}


def _calibration_problem(state: CampaignState) -> str:
    cal_runs = [r for r in state.runs.values() if r.kind == RunKind.CALIBRATION]
    bad = [r for r in cal_runs if r.status == "finished" and not (r.outcome == RunOutcome.OK and r.valid)]
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
        runs = [r for r in state.runs.values() if r.kind == RunKind.REMEASURE and r.base_run_id == recipe]
        outcomes = Counter(r.outcome or "?" for r in runs)
        invalid = [r for r in runs if r.outcome == RunOutcome.OK and not r.valid]
        detail = ", ".join(f"{n} {o}" for o, n in sorted(outcomes.items())) or "no run admitted"
        last = runs[-1] if runs else None
        why = ""
        if last is not None:
            why = f"; last: {last.run_id} {last.outcome}" + (f" ({last.reason})" if last.reason else "")
            if invalid:
                why += f", invalid: {'; '.join(invalid[-1].invalid_reasons)}"
        problems.append(f"no valid re-measurement of {recipe} ({len(runs)} run(s): {detail}){why}")
    return problems


def _plan_ship(state: CampaignState) -> Action:
    """Before anything ships: the reference and replicate check runs of the baseline, then each candidate's
    check run, fastest first; the first that passes ships, else the baseline."""
    cands = candidates(state)
    if not cands:
        return Action(ShipAction.SHIP, "baseline", "no search run beat the baseline by more than the band")
    refused = [x for x in state.refusals if x.get("kind") == "check" and x.get("code") == "budget"]
    if refused:
        return Action(ShipAction.SHIP, "baseline", "the reserve could not pay for the next correctness check: "
                      + str(refused[-1].get("reason")))
    ref = reference_run(state)
    unlaunchable = {x.get("of") for x in state.refusals if x.get("kind") == "check"}
    if ref is None:
        if "baseline" in unlaunchable or len(_runs_of(state, RunKind.CHECK, "baseline")) >= MAX_REFERENCE_ATTEMPTS:
            return Action(ShipAction.SHIP, "baseline", "the baseline's own check run could not be run: no reference curve")
        return Action(ShipAction.CHECK, "baseline", "the baseline's reference curve for the convergence check")
    done_reps = len(replicate_runs(state))
    own_ref = 0 if ref.kind == RunKind.CALIBRATION else 1
    failed = len(_runs_of(state, RunKind.CHECK, "baseline")) - own_ref - done_reps
    if done_reps < state.replicate_check_runs and failed < MAX_REFERENCE_ATTEMPTS:
        return Action(ShipAction.CHECK, "baseline", f"replicate check run {done_reps + 1} of {state.replicate_check_runs} of "
                      "the baseline: the noise envelope of the convergence check")
    for c in cands:
        if c.run_id in unlaunchable:  # its check run could not even be admitted (a shape problem, say)
            continue
        verdict = check_verdict(state, c.run_id)
        if verdict is not None:
            if verdict.get("passed"):
                return Action(ShipAction.SHIP, c.run_id, "the fastest candidate that passed the correctness gate")
            again = borderline_replicate(state, c.run_id, verdict)
            if again is not None:
                return again
            continue
        return Action(ShipAction.CHECK, c.run_id, f"correctness check of {c.run_id}")
    return Action(ShipAction.SHIP, "baseline", f"none of the {len(cands)} candidate(s) passed the correctness gate")


def plan(state: CampaignState) -> Action:
    """The next shipping step, from the campaign's state alone."""
    if state.failed is not None:
        return Action(ShipAction.FAILED, reason=str(state.failed.get("reason")))
    if not is_due(state):
        return Action(ShipAction.NOT_DUE, reason="the campaign has not stopped")
    pending = unjudged_check(state)
    if pending is not None:
        return Action(ShipAction.JUDGE, pending.run_id, f"the gate's verdict on check run {pending.run_id}")
    pending = unjudged_replicate(state)
    if pending is not None:
        return Action(ShipAction.REJUDGE, pending.run_id, f"the gate's verdict on {pending.base_run_id} with its "
                      f"replicate check run {pending.run_id}")
    pending = unrecorded_remeasurement(state)
    if pending is not None:
        return Action(ShipAction.RECORD, pending.run_id, f"the re-measurement of {pending.base_run_id} by {pending.run_id}")
    if state.in_flight:
        return Action(ShipAction.WAIT, reason="runs in flight: " + ", ".join(r.run_id for r in state.in_flight))
    if state.calibration is None:
        return Action(ShipAction.FAIL, reason=_calibration_problem(state))
    if state.shipped is None:
        return _plan_ship(state)
    nxt = next_remeasure(state)
    if nxt is not None:
        return Action(ShipAction.REMEASURE, nxt, "final re-measurement")
    problems = remeasure_problems(state)
    if problems:
        return Action(ShipAction.FAIL, (state.shipped or {}).get("run_id"), "; ".join(problems))
    return Action(ShipAction.DONE, (state.shipped or {}).get("run_id"), "shipped and re-measured")


def status(state: CampaignState) -> dict[str, Any]:
    """Where shipping stands, for `attune tune`, the broker's campaign status and the demo."""
    a = plan(state)
    phase = {"not_due": "searching", "wait": "waiting", "check": "checking", "ship": "checking", "judge": "checking",
             "check_replicate": "checking", "rejudge": "checking",
             "remeasure": "remeasuring", "record": "remeasuring", "done": "done", "fail": "failed", "failed": "failed"}[a.kind]
    if a.kind == ShipAction.WAIT and state.shipped is not None:
        phase = "remeasuring"
    elif a.kind == ShipAction.WAIT and not any(r.kind == RunKind.SEARCH for r in state.in_flight):
        phase = "checking" if state.shipped is None else "remeasuring"
    elif a.kind == ShipAction.WAIT:
        phase = "searching"
    return {
        "phase": phase, "done": a.kind == ShipAction.DONE, "failed": a.kind in (ShipAction.FAIL, ShipAction.FAILED),
        "failure": a.reason if a.kind in (ShipAction.FAIL, ShipAction.FAILED) else None, "next": a.kind, "of": a.of, "reason": a.reason,
        "candidates": [c.run_id for c in candidates(state)] if is_due(state) else [],
        "checks": [{"candidate_run_id": c.get("candidate_run_id"), "passed": c.get("passed")} for c in state.checks],
        "shipped": (state.shipped or {}).get("run_id"),
        "remeasured": remeasured(state),
    }


def done(state: CampaignState) -> bool:
    """Shipped and re-measured with valid measurements: the campaign succeeded."""
    return plan(state).kind == ShipAction.DONE


def ended(state: CampaignState) -> bool:
    """Nothing more runs: done, or failed (the failure is recorded, or about to be)."""
    return plan(state).kind in (ShipAction.DONE, ShipAction.FAIL, ShipAction.FAILED)


# ------------------------------------------------------------------------------------- rows


def changes_of(state: CampaignState, run_id: str) -> Changes:
    """The changes from the baseline of "baseline" (none) or of a search run."""
    if run_id == "baseline":
        return Changes()
    ch = state.runs[run_id].changes
    return Changes(dict(ch.get("args") or {}), dict(ch.get("env") or {}))


def shipped_row(state: CampaignState, run_id: str, reason: str, recipe: dict[str, Any]) -> dict[str, Any]:
    """The `shipped` row: `recipe` is the shipped command, arguments, environment and image."""
    run = state.runs.get(run_id)
    verdict = check_verdict(state, run_id) if run_id != "baseline" else None
    cal = state.calibration
    return {
        "run_id": run_id,
        "recipe": recipe,
        "changes": changes_of(state, run_id).as_dict(),
        "tokens_per_s_per_gpu": run.tokens_per_s_per_gpu if run else (cal.mean if cal else None),
        "gain_at_search": gain(run.tokens_per_s_per_gpu, cal.mean) if run and run.tokens_per_s_per_gpu and cal else 0.0,
        "check_run_id": verdict.get("run_id") if verdict else None,
        "candidates": [c.run_id for c in candidates(state)],
        "reason": reason,
    }


def failed_row(state: CampaignState, reason: str) -> dict[str, Any]:
    """The `campaign_failed` row."""
    phase = "calibration" if state.calibration is None else "remeasurement"
    return {"reason": reason, "phase": phase, "shipped": (state.shipped or {}).get("run_id")}


def _recipe_value(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def evidence(state: CampaignState, admitted_gate: dict[str, Any] | None = None) -> dict[str, Any]:
    """`shipped/evidence.json`: `admitted_gate` is layer 1's verdict when the shipped run was admitted."""
    shipped = state.shipped or {}
    run_id = str(shipped.get("run_id"))
    cal = state.calibration
    values = remeasured(state, valid_only=False)
    (bv, b_ok), (sv, s_ok) = recipe_values(state, "baseline"), recipe_values(state, run_id)
    base_v, ship_v = _recipe_value(bv), _recipe_value(sv)
    ref = reference_run(state)
    remeasure_done = next_remeasure(state) is None and not any(r.kind == RunKind.REMEASURE for r in state.in_flight)
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
