"""The built-in tuners' control plane, through the broker (`attune.tuners.driver.ControlPlane`).

A black-box tuner gets exactly what the agent gets: the same broker, admission, gate, identical-
recipe rule, charging, scoring and promotion. Its candidates are changes relative to the baseline;
the early abort (prune a run below a fraction of the leader after a few measured steps) is done by
the broker's monitor, so the decision stays in the control plane.
"""

from __future__ import annotations

from typing import Any

from attune.control.campaign import StopRefusedError
from attune.control.search_rules import RuleRefusal
from attune.core.vocab import RunOutcome, Verdict
from attune.tuners.base import Candidate, Outcome, split_changes
from broker import wire
from broker.client import BrokerClient


def _rule_refusals(payload: dict[str, Any]) -> list[RuleRefusal]:
    """The search rules' refusals in a 409 stop answer, as the control plane's own type."""
    return [RuleRefusal(str(r.get("code")), str(r.get("message") or ""), [str(x) for x in r.get("items") or []],
                        [{str(k): str(v) for k, v in t.items()} for t in r.get("targets") or [] if isinstance(t, dict)])
            for r in payload.get("refusals") or [] if isinstance(r, dict)]


class BrokerControlPlane:
    """`ControlPlane` over a broker client (one campaign's token)."""

    def __init__(self, client: BrokerClient, *, run_timeout_s: float = 24 * 3600.0, poll_s: float = 1.0) -> None:
        self.client = client
        self.run_timeout_s = run_timeout_s
        self.poll_s = poll_s
        self._status: dict[str, Any] | None = None
        self.concurrency = 1
        self.concurrency = int(self._campaign()["concurrency"])

    def _campaign(self) -> dict[str, Any]:
        """The campaign's status. One run at a time, it is asked once between two launches: the driver's
        can_launch and leader_tps before one launch read the same answer. With several runs in flight it
        is asked every time (another thread's launch or result may have changed it)."""
        if self._status is None or self.concurrency > 1:
            status, payload = self.client.call("GET", "/v1/campaign")
            if status != 200:
                raise RuntimeError(f"the broker refused the campaign status: {payload}")
            self._status = payload
        return self._status

    def can_launch(self) -> bool:
        c = self._campaign()
        left = c["budget"]["search_remaining_gpu_hours"]
        return c["stop"] is None and c["calibration"]["mean"] is not None and left is not None and left > 0

    def baseline_tps(self) -> float:
        mean = self._campaign()["calibration"]["mean"]
        if mean is None:
            raise RuntimeError("the baseline is not calibrated yet")
        return float(mean)

    def leader_tps(self) -> float:
        c = self._campaign()
        return float(c["leader"]["tokens_per_s_per_gpu"] or c["calibration"]["mean"])

    def evaluate(self, candidate: Candidate, prune_below: float | None) -> Outcome:
        self._status = None
        try:
            return self._evaluate(candidate, prune_below)
        finally:
            self._status = None

    def _evaluate(self, candidate: Candidate, prune_below: float | None) -> Outcome:
        changes = split_changes(candidate.changes)
        new_flags = [k for k, v in candidate.changes.items() if k.startswith("--") and v not in (None, False)]
        req = wire.LaunchRequest(
            kind="search", changes=changes, base="baseline", hypothesis=candidate.hypothesis, lever=candidate.lever,
            expected_gain=candidate.expected_gain if candidate.expected_gain is not None else 0.0,
            code_locations={f: "campaign.yaml search_space (declared by the campaign's owner)" for f in new_flags},
            prune_below=prune_below,
        )
        status, p = self.client.launch(**req.model_dump(mode="json"))
        if status != 201 or not p.get("admitted"):
            code = p.get("code") or p.get("error")
            return Outcome(run_id=None, outcome=RunOutcome.REFUSED, reason=f"{code}: {p.get('reason')}", code=code)
        run = self.client.wait(p["run_id"], timeout_s=self.run_timeout_s, interval_s=self.poll_s)
        self._diagnose(candidate, run)
        return Outcome(
            run_id=run["run_id"], outcome=run["outcome"], tokens_per_s_per_gpu=run["tokens_per_s_per_gpu"],
            valid=bool(run["valid"]), promoted=run["verdict"] == Verdict.LEADER, reason=run.get("reason"),
            extra={"verdict": run["verdict"], "charge_gpu_hours": run["charge_gpu_hours"]},
        )

    def _diagnose(self, candidate: Candidate, run: dict[str, Any]) -> None:
        """A built-in tuner's diagnosis is mechanical: what the control plane measured and classified."""
        tps = run.get("tokens_per_s_per_gpu")
        what = (f"{tps:,.1f} tokens/s/GPU, verdict {run.get('verdict')}" if run.get("outcome") == "ok" and tps
                else f"{run.get('outcome')}: {' '.join(str(run.get('reason') or '').split())[:300]}")
        self.client.call("POST", "/v1/diagnoses", body=wire.DiagnosisRequest(
            run_id=run["run_id"], bottleneck=None if run.get("outcome") == "ok" else run.get("outcome"),
            diagnosis=f"{candidate.lever} (tuner, no profile read): {what}").model_dump(mode="json"))

    def record_stop(self, evidence: dict[str, Any]) -> None:
        self._status = None
        levers = [str(x) for x in evidence.get("levers_tested") or []] or ["(none)"]
        diagnosis = (f"{evidence.get('tuner', 'tuner')}: {evidence.get('reason', 'stopped')}; "
                     f"{evidence.get('launches', 0)} launches, {evidence.get('failed', 0)} failed")
        status, payload = self.client.call("POST", "/v1/stop", body=wire.StopRequest(
            levers_tested=levers, diagnosis=diagnosis).model_dump(mode="json"))
        refusals = list(payload.get("refusals") or []) if status == 409 else []
        not_run = {str(x) for r in refusals if r.get("code") == "levers_not_run" for x in r.get("items") or []}
        if not_run and all(r.get("code") == "levers_not_run" for r in refusals):
            # Levers none of whose runs finished with a measurement (infrastructure faults): they were not
            # tested, so the stop names the levers that were, and says which could not be measured.
            kept = [lv for lv in levers if lv not in not_run] or ["(none)"]
            status, payload = self.client.call("POST", "/v1/stop", body=wire.StopRequest(
                levers_tested=kept, diagnosis=f"{diagnosis}; not measured (infrastructure): "
                                              f"{', '.join(sorted(not_run))}").model_dump(mode="json"))
        if status == 409 and payload.get("error") == "stop_refused":
            raise StopRefusedError(_rule_refusals(payload))
        if status != 201 and payload.get("error") != "stop_already_recorded":
            raise RuntimeError(f"the broker refused the stop record: {payload}")
