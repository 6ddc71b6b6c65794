"""Shipping, executed: the actions `attune.control.shipping.plan` decides, carried out through the control plane.

`attune.control.shipping` is the policy (pure functions of the campaign's state); this module acts on it:
it admits the check and re-measurement runs through `Control.admit`'s one rule pipeline (a
`FinalRunRequest`; the run lifecycle hands them to the broker to submit), runs the gate on a finished
check run's logs and records its `check_run` verdict, records `remeasurement` rows, appends `shipped`
and `campaign_failed`, and writes `shipped/` (job.json, run.sh, the backend's job script,
evidence.json). It imports both `attune.control.plane` and `attune.control.shipping`; neither imports it.

`advance(control)` is the step the run lifecycle (`attune.control.lifecycle`) takes on each monitor
step once the campaign has stopped.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any

from attune.control import shipping
from attune.control.campaign import campaign_lock
from attune.control.plane import Control, FinalRunRequest, LaunchAnswer, load_gate_list
from attune.control.rungen import Changes, substitute
from attune.core.campaign_paths import RUN_JOB, RUN_LOG, SHIPPED_DIR, SHIPPED_EVIDENCE
from attune.core.recipe import render_value
from attune.core.state import CampaignState, RunState
from attune.core.vocab import RunOutcome, ShipAction

MAX_STEPS = 16  # verdicts and re-measurements recorded in one advance (one is due per finished run)


def advance(control: Control, backend: Any = None) -> LaunchAnswer | None:
    """Take the next shipping steps: record what the last run's end calls for (a check run's verdict, a
    re-measurement), then admit the next run (returned for the caller to submit), or ship, fail or
    finish the evidence. Returns None when no run is to be submitted."""
    for _ in range(MAX_STEPS):
        action = shipping.plan(control.state())
        if action.kind not in (ShipAction.JUDGE, ShipAction.REJUDGE, ShipAction.RECORD):
            break
        assert action.of is not None
        record(control, action)  # False: another writer recorded it first; plan again either way
    else:
        return None
    if action.kind in ("check", "remeasure"):
        assert action.of is not None
        decision = control.admit(FinalRunRequest(kind=action.kind, of=action.of))
        return decision if decision.admitted else None
    if action.kind == ShipAction.CHECK_REPLICATE:
        assert action.of is not None
        decision = control.admit(FinalRunRequest(kind="check", of=action.of, replicate=True))
        return decision if decision.admitted else None
    if action.kind == ShipAction.SHIP:
        assert action.of is not None
        ship(control, action.of, action.reason, backend)
    elif action.kind == ShipAction.FAIL:
        fail(control, action.reason, backend)
    elif action.kind == ShipAction.DONE:
        path = control.dir / SHIPPED_DIR / SHIPPED_EVIDENCE
        try:
            complete = bool(json.loads(path.read_text()).get("remeasurement", {}).get("complete"))
        except (OSError, ValueError):
            complete = False
        if not complete:
            write_shipped(control, control.state(), backend)
    return None


def record(control: Control, action: shipping.Action) -> bool:
    """Under the campaign lock: the `check_run` verdict of a finished check run (`judge`), or the
    `remeasurement` row of a finished re-measurement run (`record`). False if it was already there."""
    with campaign_lock(control.dir):
        state = control.state()
        if action.kind == ShipAction.JUDGE:
            run = shipping.unjudged_check(state)
            if run is None or run.run_id != action.of:
                return False
            control.ledger.append("check_run", evaluate_check(control, state, run, shipping.reference_run(state)))
            return True
        if action.kind == ShipAction.REJUDGE:
            rep = shipping.unjudged_replicate(state)
            if rep is None or rep.run_id != action.of:
                return False
            control.ledger.append("check_run", evaluate_replicate(control, state, rep))
            return True
        run = shipping.unrecorded_remeasurement(state)
        if run is None or run.run_id != action.of:
            return False
        control.ledger.append("remeasurement", shipping.remeasurement_row(run))
        return True


def ship(control: Control, run_id: str, reason: str, backend: Any = None) -> None:
    with campaign_lock(control.dir):
        state = control.state()
        if state.shipped is not None:
            return
        args, env = control.gen.apply(shipping.changes_of(state, run_id))
        recipe = {"command": list(control.spec.baseline.command), "args": args, "env": env,
                  "image": control.spec.baseline.image}
        control.ledger.append("shipped", shipping.shipped_row(state, run_id, reason, recipe))
    write_shipped(control, control.state(), backend)


def fail(control: Control, reason: str, backend: Any = None) -> None:
    """End the campaign failed: a `campaign_failed` row with the reason (once), and the evidence says so."""
    with campaign_lock(control.dir):
        state = control.state()
        if state.failed is not None:
            return
        control.ledger.append("campaign_failed", shipping.failed_row(state, reason))
    write_shipped(control, control.state(), backend)


# ------------------------------------------------------------------------------------- checks


def _job_env(control: Control, run_id: str) -> dict[str, str]:
    try:
        return dict(control.job_doc(run_id).get("env") or {})
    except (OSError, ValueError):
        return {}


def _layer1(control: Control, state: CampaignState, loaded: Any, ref: RunState,
            run: RunState) -> tuple[dict[str, Any], str]:
    """Layer 1 on the two check runs' resolved arguments and environment, and the change class it gives."""
    from gate.config_check import check_resolved

    b_res = _resolved_args(state, control.run_dir(ref.run_id) / RUN_LOG)
    c_res = _resolved_args(state, control.run_dir(run.run_id) / RUN_LOG)
    if not c_res or not b_res:
        return {"passed": False, "summary": "no resolved arguments block in the check run's log", "refusals": []}, \
            "unknown"
    r1 = check_resolved(loaded, b_res, c_res, _job_env(control, ref.run_id), _job_env(control, run.run_id))
    return ({"passed": r1.passed, "summary": r1.summary(), "refusals": [x.model_dump() for x in r1.refusals],
             "list_sha256": r1.list_sha256}, r1.change_class())


def _noise_runs(control: Control, state: CampaignState) -> list[tuple[str, str, dict[int, float | None]]]:
    """The baseline's replicate check runs and its calibration runs (replicates of the baseline): their spread
    is the noise envelope."""
    runs = [(r.run_id, "replicate", _losses(state, control.run_dir(r.run_id) / RUN_LOG))
            for r in shipping.replicate_runs(state)]
    ref = shipping.reference_run(state)  # a calibration run may be the reference: never paired with itself
    runs += [(rid, "calibration", _losses(state, control.run_dir(rid) / RUN_LOG)) for rid in state.calibration_run_ids
             if ref is None or rid != ref.run_id]
    return [x for x in runs if x[2]]


def _reason(l1: dict[str, Any], conv: dict[str, Any]) -> str:
    if l1["passed"] and conv["passed"]:
        return "passed both layers"
    return "; ".join(x for x in (None if l1["passed"] else f"layer 1: {l1['summary']}",
                                 None if conv["passed"] else f"convergence: {conv['summary']}") if x)


def evaluate_check(control: Control, state: CampaignState, run: RunState, ref: RunState | None) -> dict[str, Any]:
    """The gate's verdict on one candidate's check run, against the baseline's reference run."""
    from gate.convergence import loss_deviation
    from gate.judge import borderline, judge
    from gate.lists import ListError
    from gate.noise import config_for, precision_from

    data: dict[str, Any] = {"run_id": run.run_id, "candidate_run_id": run.base_run_id,
                            "baseline_check_run_id": ref.run_id if ref else None}
    if run.outcome != RunOutcome.OK:
        return {**data, "passed": False, "reason": f"the check run did not finish well ({run.outcome}: {run.reason})"}
    if ref is None:
        return {**data, "passed": False, "reason": "no reference run of the baseline"}
    try:
        loaded = load_gate_list(control.spec, control.dir, state.list_sha256)
    except (ListError, OSError) as exc:
        return {**data, "passed": False, "reason": f"the correctness list cannot be used: {exc}"}
    l1, change = _layer1(control, state, loaded, ref, run)
    ref_log = control.run_dir(ref.run_id) / RUN_LOG
    b_curve, c_curve = _losses(state, ref_log), _losses(state, control.run_dir(run.run_id) / RUN_LOG)
    noise_runs = _noise_runs(control, state)
    # the calibration runs are replicates of the baseline: their spread, with the replicate check runs', is
    # the noise envelope; layer 1's class of the change decides how the curve is judged
    g = judge(b_curve, c_curve, replicates=noise_runs,
              noise_config=config_for(*precision_from(_resolved_args(state, ref_log)), change=change))
    conv = _convergence_record(g, loss_deviation(b_curve, c_curve), [x[0] for x in noise_runs])
    passed = bool(l1["passed"] and conv["passed"])
    # borderline: only where layer 1 passed (a replicate cannot change a refused argument)
    edge = borderline(g) if l1["passed"] else {"borderline": False, "why": "layer 1 refuses"}
    return {**data, "passed": passed, "reason": _reason(l1, conv), "layer1": l1, "convergence": conv,
            "change": change, "borderline": edge}


def evaluate_replicate(control: Control, state: CampaignState, rep: RunState) -> dict[str, Any]:
    """The gate's verdict on a candidate judged again with its ONE replicate check run (its check was
    borderline): the candidate's check run and its replicate are each judged against the baseline's reference
    with the candidate's own spread (the pair of them) added to the noise model; it passes only if both pass."""
    from gate.convergence import loss_deviation
    from gate.judge import judge
    from gate.lists import ListError
    from gate.noise import config_for, precision_from

    cand = str(rep.base_run_id)
    first = next((c for c in state.checks if c.get("candidate_run_id") == cand and not c.get("replicate_run_id")), {})
    ref = shipping.reference_run(state)
    data: dict[str, Any] = {"run_id": rep.run_id, "candidate_run_id": cand, "replicate_run_id": rep.run_id,
                            "replicate_of": first.get("run_id"), "baseline_check_run_id": ref.run_id if ref else None,
                            "replicate": {"why": (first.get("borderline") or {}).get("why")}}
    orig = state.runs.get(str(first.get("run_id")))
    if rep.outcome != RunOutcome.OK or orig is None or ref is None:
        return {**data, "passed": False, "reason": (
            f"the replicate check run did not finish well ({rep.outcome}: {rep.reason}): the borderline verdict stands"
            if rep.outcome != RunOutcome.OK else "no check run or reference to judge with the replicate")}
    try:
        loaded = load_gate_list(control.spec, control.dir, state.list_sha256)
    except (ListError, OSError) as exc:
        return {**data, "passed": False, "reason": f"the correctness list cannot be used: {exc}"}
    l1, change = _layer1(control, state, loaded, ref, rep)
    ref_log = control.run_dir(ref.run_id) / RUN_LOG
    b_curve = _losses(state, ref_log)
    c_curve = _losses(state, control.run_dir(orig.run_id) / RUN_LOG)
    r_curve = _losses(state, control.run_dir(rep.run_id) / RUN_LOG)
    noise_runs = _noise_runs(control, state)
    cfg = config_for(*precision_from(_resolved_args(state, ref_log)), change=change)
    pair = [(orig.run_id, c_curve), (rep.run_id, r_curve)]
    g = judge(b_curve, c_curve, replicates=noise_runs, noise_config=cfg, candidate_runs=pair)
    g_rep = judge(b_curve, r_curve, replicates=noise_runs, noise_config=cfg, candidate_runs=pair)
    names = [x[0] for x in noise_runs] + [orig.run_id, rep.run_id]
    conv = _convergence_record(g, loss_deviation(b_curve, c_curve), names)
    conv_rep = _convergence_record(g_rep, loss_deviation(b_curve, r_curve), names)
    spread = next((p for p in g.noise_aware.envelope.pairs if {p.a, p.b} == {orig.run_id, rep.run_id}), None)
    both = {"passed": conv["passed"] and conv_rep["passed"],
            "summary": "; ".join(f"{w}: {c['summary']}" for w, c in (("check run", conv), ("replicate", conv_rep))
                                 if not c["passed"]) or conv["summary"]}
    passed = bool(l1["passed"] and both["passed"])
    data["replicate"] |= {"candidate_spread_rms": spread.rms_rel if spread else None,
                          "candidate_spread_max": spread.max_abs_rel if spread else None}
    return {**data, "passed": passed, "reason": _reason(l1, both), "layer1": l1, "convergence": conv,
            "convergence_replicate": conv_rep, "change": change}


def _convergence_record(g: Any, deviation: Any, noise_runs: list[str]) -> dict[str, Any]:
    """The `check_run` row's convergence part: the judge's verdict, the reference rule's and the noise-aware
    check's numbers, and which runs made the noise envelope."""
    r2, na = g.reference, g.noise_aware
    return {"passed": g.passed, "summary": g.summary, "reasons": list(g.reasons),
            "failed_checks": list(r2.failed_checks), "data_problems": list(r2.data_problems),
            "n_steps": r2.n_steps, "deviation": deviation,
            "assumptions": g.assumptions.model_dump() if g.assumptions else None,
            "correlation": r2.checks.correlation.value if r2.checks else None,
            "final_loss_rel_diff": r2.checks.final_loss.rel_diff if r2.checks else None,
            "reference": {"passed": r2.passed, "summary": r2.summary()},
            "excused": [e.model_dump() for e in g.excused],
            "noise_aware": {"passed": na.passed, "summary": na.summary(), "failed_checks": list(na.failed_checks),
                            "level_z": na.level.mean_z if na.level else None,
                            "trend_z": na.trend.drift_z if na.trend else None,
                            "outside": na.pointwise.outside if na.pointwise else None,
                            "envelope": na.envelope.basis, "noise_runs": noise_runs, "notes": list(na.notes)}}


def _losses(state: CampaignState, log: Path) -> dict[int, float | None]:
    """A run's loss per iteration, read with the campaign's framework reader; empty if unreadable."""
    from attune.readers.metrics import read_losses

    try:
        return read_losses(log, state.framework or "megatron-lm")
    except (OSError, ValueError):
        return {}


def _resolved_args(state: CampaignState, log: Path) -> dict[str, str]:
    """A run's resolved arguments, read with the campaign's framework reader; empty if the log has none."""
    from attune.readers.metrics import read_resolved_args

    try:
        return read_resolved_args(log, state.framework or "megatron-lm")
    except (OSError, ValueError):
        return {}


def write_shipped(control: Control, state: CampaignState, backend: Any = None) -> Path | None:
    """`shipped/`: the recipe as a runnable job (job.json, run.sh) and its correctness evidence."""
    if state.shipped is None:
        return None
    out = control.dir / SHIPPED_DIR
    out.mkdir(exist_ok=True)
    run_id = str(state.shipped["run_id"])
    spec = control.spec
    changes = shipping.changes_of(state, run_id)
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
        _comment(f"The recipe attune shipped for campaign {spec.name}: {run_id}"),
        _comment(f"Changes from the baseline: {_describe(changes) or 'none (the baseline ships)'}"),
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
    _write(out / SHIPPED_EVIDENCE, json.dumps(shipping.evidence(state, _admitted_gate(control, run_id)), indent=2,
                                             default=str) + "\n")
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
        from attune.control import workenv

        st = workenv.status(control.spec, control.dir)
        return st.python if st.state == "ready" else None
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", os.defpath)])
    found = shutil.which(cmd[0], path=path)
    return os.path.abspath(found) if found else None


def _sh_word(x: str) -> str:
    """`x` inside ${VAR:-...} in an assignment: as is when it is a plain path, else single-quoted."""
    import re

    return x if re.fullmatch(r"[A-Za-z0-9._+/-]+", x) else shlex.quote(x)


def _admitted_gate(control: Control, run_id: str) -> dict[str, Any] | None:
    """Layer 1's verdict recorded when the run was admitted (None for the baseline)."""
    gate = None
    for row in control.ledger.rows():
        if row.type == "launch_admitted" and row.data.get("run_id") == run_id:
            gate = row.data.get("gate")
    return gate


def _describe(ch: Changes) -> str:
    def show(v: object) -> str:
        return "unset" if v is None else str(v)

    parts = [f"{k}={show(v)}" for k, v in ch.args.items()] + [f"{k}={show(v)}" for k, v in ch.env.items()]
    return ", ".join(parts)


def _comment(text: str) -> str:
    """A `# ...` line no value can break out of (a character that is not printable becomes '?')."""
    return "# " + "".join(c if c.isprintable() else "?" for c in text)


def _write(path: Path, text: str, mode: int | None = None) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    if mode is not None:
        os.chmod(tmp, mode)
    os.replace(tmp, path)
