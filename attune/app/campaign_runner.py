"""A whole campaign, start to finish, resumable from its ledger: `attune tune` and `attune demo`.

    start (freeze the spec) -> calibration (the baseline, `calibration.runs` times, through the broker)
    -> the search (a built-in tuner through the broker, or headless Claude Code with the plugin)
    -> the stop -> shipping (the broker's control plane: checks, ship, final re-measurement)
    -> the report

Every step reads the ledger first, so the same command resumes a campaign after any interruption:
calibration launches only the runs still missing; runs that were in flight are waited for (the
broker runs detached from this process and finishes them); a built-in tuner is replayed against the
ledger (a candidate whose recipe already ran gets that run's outcome back instead of a launch, so
no run is lost or repeated: the control plane refuses an identical recipe anyway); a Claude session
is resumed with `--resume`; shipping carries on from its last row.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attune.app import report as report_mod
from attune.control import shipping
from attune.control.campaign import start
from attune.control.rungen import Changes, RunGenerator, RunGenError, parse_changes
from attune.control.spec import CampaignSpec
from attune.core import ledger as ledger_mod
from attune.core.errors import AppError
from attune.core.state import CampaignState, RunState, load
from attune.core.vocab import PROFILE_LOST_OUTCOMES, RunKind, RunOutcome, Verdict
from attune.tuners.base import Candidate, Outcome, split_changes
from attune.tuners.driver import drive
from attune.tuners.factory import make_tuner
from attune.tuners.registry import AGENT, BLACK_BOX, TRANSPORTS, TUNE_CHOICES

TUNERS = TUNE_CHOICES
MAX_REFUSED_CALIBRATIONS = 5  # refused calibration launches in a row before the runner gives up
EARLY_ABORT_TUNERS = BLACK_BOX


class RunnerError(AppError):
    """The campaign cannot go on (the baseline keeps failing, the broker cannot be reached)."""


# ------------------------------------------------------------------------------------ events


def _budget_set(d: dict[str, Any], state: CampaignState) -> str:
    cal = state.calibration
    band = f"; mean {cal.mean:,.1f} tokens/s/GPU, band {cal.band:.2%}" if cal else ""
    return f"calibration complete{band}; budget {d['gpu_hours']:.4g} GPU-h (reserve {d.get('reserve_gpu_hours') or 0:.3g})"


def _launch_admitted(d: dict[str, Any], state: CampaignState) -> str:
    ch = d.get("changes") or {}
    parts = [f"{k}={'unset' if v is None else v}" for k, v in (ch.get("args") or {}).items()] + [
        f"{k}={'unset' if v is None else v}" for k, v in (ch.get("env") or {}).items()]
    what = {"calibration": "calibration run", "check": f"check run of {d.get('base_run_id')}",
            "remeasure": f"final re-measurement of {d.get('base_run_id')}"}.get(d["kind"], "search run")
    return f"launch {d['run_id']}: {what}" + (f" ({', '.join(parts)})" if parts and d["kind"] == "search" else "")


def _measurement(d: dict[str, Any], state: CampaignState) -> str:
    run = state.runs.get(d["run_id"])
    tps = d.get("tokens_per_s_per_gpu")
    cal = state.calibration
    g = f" ({tps / cal.mean - 1:+.1%})" if tps and cal and run and run.kind == RunKind.SEARCH else ""
    out = run.outcome if run else "?"
    val = f"{tps:,.1f} tokens/s/GPU{g}" if tps else "no measurement"
    return f"  {d['run_id']}: {out}, {val}, {d.get('verdict')}"


def _leader_changed(d: dict[str, Any], state: CampaignState) -> str:
    g = d.get("gain_over_baseline")
    return f"  new leader {d['run_id']}" + (f": {g:+.1%} over the baseline" if g is not None else "")


def _check_run(d: dict[str, Any], state: CampaignState) -> str:
    return (f"  gate on {d['candidate_run_id']}: {'passed' if d['passed'] else 'rejected'}"
            f" ({str(d.get('reason'))[:160]})")


# One progress line per ledger row type worth a line: (row data, the state after the row) -> the line.
_DESCRIBE: dict[str, Callable[[dict[str, Any], CampaignState], str]] = {
    "campaign_started": lambda d, _: f"campaign {d['name']} started ({d.get('gpus')} GPUs, {d.get('backend')} backend)",
    "budget_set": _budget_set,
    "launch_admitted": _launch_admitted,
    "measurement": _measurement,
    "launch_refused": lambda d, _: f"  refused ({d.get('code')}): {str(d.get('reason'))[:160]}",
    "leader_changed": _leader_changed,
    "stop_recorded": lambda d, _: f"stop: {str(d.get('diagnosis'))[:200]}",
    "check_run": _check_run,
    "shipped": lambda d, _: f"shipped {d['run_id']}: {d.get('reason')}",
    "campaign_failed": lambda d, _: f"the campaign FAILED: {d.get('reason')}",
    "remeasurement": lambda d, _: f"  re-measured {d['recipe_of']}: {d['tokens_per_s_per_gpu']:,.1f} tokens/s/GPU",
}


def describe_row(row: ledger_mod.Row, state: CampaignState) -> str | None:
    """One line for a ledger row, for progress output (None: not worth a line)."""
    describe = _DESCRIBE.get(row.type)
    return describe(row.data, state) if describe is not None else None


class LedgerWatcher:
    """Follows a campaign's ledger and turns new rows into progress lines."""

    def __init__(self, campaign_dir: Path) -> None:
        self.dir = campaign_dir
        self.state = CampaignState()
        self.offset = 0

    def poll(self) -> list[str]:
        try:
            if os.stat(self.dir / ledger_mod.LEDGER_NAME).st_size == self.offset:
                return []  # nothing appended since the last poll (rows are only ever appended)
        except OSError:
            return []
        try:
            res = ledger_mod.read(self.dir, self.offset, self.state.last_seq + 1, self.state.last_hash)
        except ledger_mod.LedgerError:
            return []
        lines = []
        for row in res.rows:
            self.state.apply(row)
            line = describe_row(row, self.state)
            if line:
                lines.append(line)
        self.offset = res.end_offset
        return lines


# ------------------------------------------------------------------------------------ replay


class ReplayPlane:
    """A tuner's control plane that answers from the ledger for recipes that already ran.

    Resuming a campaign replays the tuner from the start: a deterministic tuner proposes the same
    candidates in the same order, and each one that already has a finished run gets that run's
    outcome back without a launch. New candidates go to the broker as usual."""

    def __init__(self, inner: Any, spec: CampaignSpec, state: CampaignState) -> None:
        self.inner = inner
        self.concurrency = inner.concurrency
        self.gen = RunGenerator(spec)
        self.done: dict[str, RunState] = {
            r.recipe_key: r for r in state.runs.values()
            if r.kind == RunKind.SEARCH and r.status == "finished" and r.recipe_key and not r.profile
            and r.outcome != RunOutcome.INFRASTRUCTURE}
        # Infrastructure failures replay too, in order, before the recipe's measured run (if any): the tuner
        # sees what it saw the first time (a fault, then its retry), and a fault is never launched again.
        self.faults: dict[str, list[RunState]] = {}
        for r in sorted(state.runs.values(), key=lambda r: r.admitted_seq or 0):
            if (r.kind == RunKind.SEARCH and r.status == "finished" and r.recipe_key and not r.profile
                    and r.outcome == RunOutcome.INFRASTRUCTURE):
                self.faults.setdefault(r.recipe_key, []).append(r)
        self.replayed = 0

    def _key(self, cand: Candidate) -> str | None:
        try:
            c = self.gen.candidate(Changes(), parse_changes(split_changes(cand.changes)), False)
        except RunGenError:
            return None
        return c.recipe_key

    def evaluate(self, candidate: Candidate, prune_below: float | None) -> Outcome:
        key = self._key(candidate)
        fault = self.faults[key].pop(0) if key and self.faults.get(key) else None
        if fault is not None:
            self.replayed += 1
            return Outcome(run_id=fault.run_id, outcome=RunOutcome.INFRASTRUCTURE, reason=fault.reason,
                           extra={"replayed": True, "verdict": fault.verdict})
        run = self.done.get(key) if key else None
        if run is not None:
            self.replayed += 1
            return Outcome(run_id=run.run_id, outcome=run.outcome or "failed",
                           tokens_per_s_per_gpu=run.tokens_per_s_per_gpu, valid=bool(run.valid),
                           promoted=run.verdict == Verdict.LEADER, reason="replayed from the ledger",
                           extra={"replayed": True, "verdict": run.verdict})
        return self.inner.evaluate(candidate, prune_below)

    def can_launch(self) -> bool:
        return self.inner.can_launch()

    def baseline_tps(self) -> float:
        return self.inner.baseline_tps()

    def leader_tps(self) -> float:
        return self.inner.leader_tps()

    def record_stop(self, evidence: dict[str, Any]) -> None:
        self.inner.record_stop({**evidence, "replayed": self.replayed})


# ------------------------------------------------------------------------------------ runner


@dataclass
class TuneResult:
    campaign_dir: Path
    tuner: str
    shipped: str | None
    report_md: Path
    report_html: Path
    headline: dict[str, Any]
    seconds: float
    replayed: int = 0
    notes: list[str] = field(default_factory=list)
    failed: str | None = None  # why the campaign ended failed (no valid evidence); None: it succeeded

    def as_dict(self) -> dict[str, Any]:
        return {"campaign_dir": str(self.campaign_dir), "tuner": self.tuner,
                "outcome": "failed" if self.failed else "shipped", "failed": self.failed, "shipped": self.shipped,
                "report_md": str(self.report_md), "report_html": str(self.report_html),
                "headline": self.headline, "noise": self.headline.get("noise"),
                "seconds": round(self.seconds, 1), "replayed": self.replayed,
                "notes": self.notes}


def _say_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _check_calibration(st: CampaignState, spec: CampaignSpec) -> None:
    """Raise RunnerError when calibration cannot succeed: the cluster never took a job of this campaign and
    refused the baseline's submission, or the baseline keeps failing or measuring invalid."""
    required = spec.calibration.runs
    done = [r for r in st.runs.values() if r.kind == RunKind.CALIBRATION and r.status == "finished"]
    failed = [r for r in done if r.outcome != RunOutcome.OK]
    invalid = [r for r in done if r.outcome == RunOutcome.OK and not r.valid]
    unsubmitted = [r for r in failed if (r.reason or "").startswith("submission failed")]
    if unsubmitted and not any(r.started_at is not None for r in st.runs.values()):
        # The cluster never ran a job of this campaign and refused this one (unreachable, or no node
        # can hold it): more attempts fail the same way. The backend's words name the cluster.
        last = unsubmitted[-1]
        raise RunnerError(
            f"the {spec.cluster.backend} cluster did not take the baseline's calibration run {last.run_id}: "
            f"{last.reason}. Nothing can be measured until it does: check the cluster (cluster: in "
            "campaign.yaml) and the job's size, then run the same command again")
    if len(failed) > required or len(invalid) > 3 * required:
        last = (failed or invalid)[-1]
        raise RunnerError(
            f"the baseline failed {len(failed)} and measured invalid {len(invalid)} calibration runs (last: "
            f"{last.run_id} {last.outcome}: {last.reason}; {'; '.join(last.invalid_reasons)}); "
            + ("the cluster keeps failing the runs: check it (attune status shows each run's reason)"
               if all(r.outcome == RunOutcome.INFRASTRUCTURE for r in failed) and failed
               else "fix the recipe or the machine's load"))


class CampaignRunner:
    def __init__(
        self,
        campaign_dir: Path | str,
        tuner: str,
        *,
        seed: int = 0,
        max_passes: int = 3,
        claude: str = "claude",
        claude_args: list[str] | None = None,
        claude_env: dict[str, str] | None = None,
        max_attempts: int = 20,
        say: Callable[[str], None] | None = _say_stderr,
        poll_s: float = 1.0,
        transport: str = "auto",
        knob_space: bool = False,
    ) -> None:
        if tuner not in TUNERS:
            raise ValueError(f"tuner must be one of {', '.join(TUNERS)}, got {tuner!r}")
        self.dir = Path(campaign_dir).resolve()
        self.tuner_name = tuner
        self.seed = seed
        self.max_passes = max_passes
        self.claude = claude
        self.claude_args = claude_args or []
        self.claude_env = claude_env
        self.max_attempts = max_attempts
        self.say = say
        self.poll_s = poll_s
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}, got {transport!r}")
        self.transport = transport
        self.knob_space = knob_space  # search the model's frozen Table E1 knobs (attune.tuners.knobs)
        self._inproc: Any = None  # broker.inprocess.InProcessBroker while a campaign runs in this process
        self.watcher = LedgerWatcher(self.dir)
        self.replayed = 0
        self.notes: list[str] = []
        self._progress_lock = threading.Lock()

    # --- plumbing ---------------------------------------------------------------------------
    def _progress(self) -> None:
        with self._progress_lock:
            for line in self.watcher.poll():
                if self.say:
                    self.say(line)

    def _progress_loop(self, stop: threading.Event) -> None:
        while not stop.wait(self.poll_s):
            with contextlib.suppress(Exception):  # progress output must never stop the campaign
                self._progress()

    def state(self) -> CampaignState:
        st, _ = load(self.dir)
        return st

    def _current(self) -> CampaignState:
        """The campaign's state after `_progress()`: in process, the progress watcher's incremental fold of
        the ledger (nothing else writes it meanwhile); over HTTP, the ledger read afresh."""
        if self._inproc is not None:
            return self.watcher.state
        return self.state()

    def _client(self) -> Any:
        from broker.client import ReconnectingClient

        if self._inproc is not None:
            return self._inproc.client()
        # Over HTTP the calibration, the search and the stop all outlive the broker: a dead one is restarted.
        return ReconnectingClient(self.dir, say=self.say)

    def _ensure_broker(self) -> None:
        """The broker must be up while anything is to be watched or shipped (it restarts a dead one)."""
        from broker.client import endpoint_for

        if self._inproc is None:
            endpoint_for(self.dir)

    def _tick(self) -> None:
        """Let time pass: over HTTP, sleep (the broker's monitor works meanwhile); in process, run the
        broker's monitor step, which on the sim backend moves the simulated clock."""
        if self._inproc is not None:
            self._inproc.step()
        else:
            time.sleep(self.poll_s)

    def _in_process(self, spec: CampaignSpec) -> bool:
        """Whether to run the broker in this process: asked for, or (auto) a built-in tuner on a simulated
        cluster, one run at a time, with no shared broker named and no broker already serving the campaign.
        (With several runs in flight the outcomes reach the tuner in an order set by thread timing, over
        HTTP as in process; the broker's own monitor then keeps the simulated clock moving.)"""
        if self.transport != "auto":
            return self.transport == "in-process"
        if (self.tuner_name == AGENT or spec.cluster.backend != "sim" or spec.budget.concurrency != 1
                or os.environ.get("ATTUNE_BROKER_URL")):
            return False
        from broker.client import running_broker

        return running_broker(self.dir) is None

    def _wait(self, done: Callable[[CampaignState], bool], what: str) -> CampaignState:
        last_ensure = 0.0
        stuck = 0
        while True:
            self._progress()
            st = self._current()
            if done(st):
                return st
            if self._inproc is not None and not st.in_flight:
                # In process nothing moves unless this loop steps the monitor: steps that find nothing in
                # flight and change nothing mean the wait can never end.
                stuck = stuck + 1 if self._inproc.step() == 0 else 0
                if stuck > 3:
                    raise RunnerError(f"waiting for {what}, but nothing is in flight and the control plane has "
                                      "nothing to do (see `attune status`)")
                continue
            if time.monotonic() - last_ensure > 30.0:
                self._ensure_broker()
                last_ensure = time.monotonic()
            self._tick()

    # --- the steps --------------------------------------------------------------------------
    def run(self) -> TuneResult:
        t0 = time.monotonic()
        if self.tuner_name == AGENT:
            from attune.app import sandbox

            why = sandbox.unavailable()
            if why:  # before anything is written: the same command would fail the same way
                raise RunnerError(
                    f"the claude tuner (the default) runs Claude Code inside its OS sandbox, which is unavailable "
                    f"here: {why}. Install what is missing and run the command again, or run a built-in tuner "
                    f"instead: attune tune {self.dir / 'campaign.yaml'} --tuner heuristic")
        # A black-box tuner samples the space: the skill's search rules bind the agent and the heuristic only.
        spec, _ = start(self.dir, search_rules="off" if self.tuner_name in EARLY_ABORT_TUNERS else "enforced")
        if self.tuner_name != "claude":
            self._make_tuner(spec)  # a bad search space fails before any run
        self.prepare_environment(spec)
        if self.tuner_name == AGENT and self.transport == "in-process":
            raise RunnerError("the claude tuner reaches the broker over HTTP (its MCP server): use --transport http")
        if self._in_process(spec):
            from broker.inprocess import InProcessBroker

            self._inproc = InProcessBroker(self.dir)
        self._ensure_broker()
        self._progress()
        stop = threading.Event()
        ticker = threading.Thread(target=self._progress_loop, args=(stop,), name="attune-progress", daemon=True)
        if self._inproc is None:  # in process, progress is reported at each step of the runner itself
            ticker.start()
        try:
            if self.tuner_name == "claude":
                self.run_claude()
            else:
                with self._client() as client:
                    self.calibrate(client, spec)
                    self.search(client, spec)
            st = self._wait(lambda s: s.failed is not None or shipping.done(s), "shipping")
        finally:
            stop.set()
            if ticker.is_alive():
                ticker.join(timeout=5)
            if self._inproc is not None:
                self._inproc.close()
                self._inproc = None
        self._progress()
        from attune.app.summary import write_summary

        write_summary(self.dir)  # notes/summary.md (kept if the agent wrote one), read by the next campaign
        md, page, rep = report_mod.write(self.dir)
        return TuneResult(self.dir, self.tuner_name, (st.shipped or {}).get("run_id"), md, page,
                          dict(rep.headline.__dict__), time.monotonic() - t0, self.replayed, self.notes,
                          failed=str(st.failed.get("reason")) if st.failed else None)

    def prepare_environment(self, spec: CampaignSpec) -> None:
        """The jobs' Python environment (spec `environment`, local backend): built here, with its progress,
        when no interpreter at hand has the workload's modules; a failure ends the command with the fix."""
        from attune.control import workenv

        st = workenv.status(spec, self.dir)
        if st.state in ("ready", "unchecked"):
            return
        if self.say:
            self.say(f"building the workload's Python environment ({', '.join(st.packages)}) in {st.directory}; "
                     f"log {st.log}")
        st = workenv.build_and_wait(spec, self.dir, say=self.say)
        if st.state != "ready":
            raise RunnerError(f"the workload's Python environment is not ready: {st.reason}"
                              + (f" (log {st.log})" if st.log else "") + (f". Fix: {st.fix}" if st.fix else ""))
        if self.say:
            self.say(f"workload environment ready: {st.python}")

    def calibrate(self, client: Any, spec: CampaignSpec) -> None:
        required = spec.calibration.runs
        refused: list[dict[str, Any]] = []  # refused calibration launches since the last admitted one
        while True:
            self._progress()
            st = self._current()
            if st.calibration is not None or st.failed is not None:
                return
            _check_calibration(st, spec)
            open_ = [r for r in st.in_flight if r.kind == RunKind.CALIBRATION]
            want = required - len(st.calibration_values) - len(open_)
            room = spec.budget.concurrency - len(st.in_flight)
            for _ in range(max(0, min(want, room))):
                # Diagnosis first: one calibration run is profiled where the tuner reads a profile (its trace
                # window follows the measured steps, so the run still calibrates). A profiled run lost to an
                # infrastructure fault (or cancelled) left no profile: the next calibration run is profiled.
                profile = self._wants_profile(spec) and not any(
                    r.kind == RunKind.CALIBRATION and r.profile and r.outcome not in PROFILE_LOST_OUTCOMES
                    for r in st.runs.values())
                status, payload = client.launch(kind="calibration", **({"profile": True} if profile else {}))
                if profile:
                    st = self._current()
                if status == 201 and payload.get("admitted", True):
                    refused.clear()
                    continue
                if payload.get("code") != "concurrency":
                    refused.append(payload)
                if len(refused) >= MAX_REFUSED_CALIBRATIONS:
                    last = refused[-1]
                    raise RunnerError(
                        f"the control plane refused {len(refused)} calibration launches in a row (last: "
                        f"{last.get('code') or last.get('error')}: {str(last.get('reason'))[:400]}); nothing can be "
                        "measured until that is fixed (attune validate checks the spec)")
                break
            self._tick()

    def search(self, client: Any, spec: CampaignSpec) -> None:
        from broker.tuner_plane import BrokerControlPlane

        st = self.state()
        if st.stop is not None or st.failed is not None:
            return
        # Runs admitted before an interruption finish first (the broker watches them), so replay sees them.
        st = self._wait(lambda s: not any(r.kind == RunKind.SEARCH for r in s.in_flight), "runs in flight")
        if st.stop is not None:
            return
        tuner = self._make_tuner(spec)
        self._diagnose_first(client, spec, tuner, st)
        replay = ReplayPlane(BrokerControlPlane(client, poll_s=min(self.poll_s, 1.0)), spec, st)
        from attune.tuners.coherent import CoherentPlane

        # Every tuner launches whole recipes: the framework's argument rules applied before a launch.
        plane: Any = CoherentPlane(replay, spec) if spec.framework == "megatron-lm" else replay
        if self.knob_space:
            from attune.tuners.knobs import KnobPlane, knob_space

            plane = KnobPlane(plane, knob_space(spec))

        def on_outcome(_c: Candidate, _o: Outcome) -> None:
            self._progress()

        from attune.control.campaign import StopRefusedError

        try:
            # Lost runs are cut for every tuner (the heuristic too): the early abort below the leader.
            drive(tuner, plane, early_abort=True, on_outcome=on_outcome)
        except StopRefusedError as exc:
            raise RunnerError(
                f"the {self.tuner_name} tuner has nothing left to try, but {exc} (widen the search space so "
                "the rules can be met, or give the campaign to an agent)") from None
        self.replayed = replay.replayed
        if replay.replayed and self.say:
            self.say(f"resumed: {replay.replayed} candidate(s) answered from the ledger, none launched twice")

    def _wants_profile(self, spec: CampaignSpec) -> bool:
        if not hasattr(self, "_profile_wanted"):
            want = getattr(self._make_tuner(spec), "wants_profile", None)
            self._profile_wanted = bool(want()) if callable(want) else False
        return self._profile_wanted

    def _diagnose_first(self, client: Any, spec: CampaignSpec, tuner: Any, st: Any) -> None:
        """Read the profiled calibration run's traces, order the tuner's levers by the largest exposed cost,
        and record the diagnosis (the profile, the order and its reason) in the ledger. A profile that
        cannot be read leaves the catalog's order, and says why."""
        want = getattr(tuner, "wants_profile", None)
        if not callable(want) or not want():
            return
        from attune.core.campaign_paths import RUN_TRACES_DIR, run_dir
        from attune.tuners.diagnosis import diagnose_traces

        runs = [r for r in st.runs.values() if r.kind == RunKind.CALIBRATION and r.profile
                and r.status == "finished" and r.outcome == "ok"]
        if not runs:
            return
        run = runs[0]
        try:
            diag = diagnose_traces(run_dir(self.dir, run.run_id) / RUN_TRACES_DIR, dict(spec.baseline.args), run.run_id)
        except Exception as exc:  # a job-written trace is input: a bad one orders nothing
            text = f"diagnosis first: the profile of {run.run_id} could not be read ({str(exc)[:200]}); catalog order kept"
            client.call("POST", "/v1/diagnoses", body={"run_id": run.run_id, "diagnosis": text})
            return
        why = tuner.diagnose(diag.shares, source=run.run_id)
        top = diag.largest()
        order = ", ".join(tuner.order[:6])
        text = f"diagnosis first (profiled calibration run): {diag.text()}. Lever order: {order}. Why: {why}"
        client.call("POST", "/v1/diagnoses", body={"run_id": run.run_id, "diagnosis": text[:3900],
                                                  "bottleneck": top[0][0] if top else None})

    def _make_tuner(self, spec: CampaignSpec) -> Any:
        knobs = None
        if self.knob_space:
            from attune.tuners.knobs import knob_space

            knobs = knob_space(spec)
        return make_tuner(spec, self.tuner_name, self.seed, self.max_passes, knobs=knobs)

    def run_claude(self) -> None:
        from attune.app.headless import ClaudeLauncher

        launcher = ClaudeLauncher(self.dir, claude=self.claude, max_attempts=self.max_attempts,
                                  extra_args=self.claude_args, env=self.claude_env)
        rc = launcher.run()
        if rc != 0:
            raise RunnerError(f"the Claude Code sessions did not finish the campaign (exit {rc}); "
                              "rerun the same command to resume")
