"""The broker in this process: its own handlers on its own `CampaignHandle`, without HTTP or a monitor thread.

`InProcessBroker(campaign_dir)` builds the same `Broker` as `attune broker serve` (`build_broker`),
holding the campaign's serve lock so that no HTTP broker serves it at the same time, and starts
neither a server nor the monitor thread. `client()` answers an `InProcessClient` with the interface
of `broker.client.BrokerClient` (`call`, `launch`, `run`, `wait`): a request is matched against the
HTTP app's route table (`broker.service.ROUTES`) and runs the same handler through `Broker.dispatch`
(the same validation, errors, status codes and audit log), its body and its answer passed through
JSON as over the wire. Waiting does not sleep: it runs the broker's monitor step (`Broker.poll_once`)
until the run has finished and been scored. On the sim backend each step moves the simulated clock
to the next event (a start, a logged step, an end), so a whole campaign runs as fast as the control
plane can score it; the early abort and the hang watchdog see every step as they would over HTTP.

The production control plane is the same: admission, the gate, the ledger, charging, promotion and
shipping all run in `attune.control.plane.Control`, `attune.control.lifecycle` and `attune.control.shipping`;
`broker.campaigns.CampaignHandle` is their transport.
This is how `attune tune` runs a built-in tuner on a simulated cluster, and how the simulator's tuner
comparison (`benchmarks/bench_sim_tuners.py`) measures the production code.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from pathlib import Path
from typing import Any

from starlette.routing import compile_path

from attune.readers.bounded import InputError, loads_json
from broker.campaigns import CampaignHandle
from broker.service import MAX_BODY_BYTES, MAX_JSON_DEPTH, ROUTES, Broker, Handler, _serve_locks, build_broker

_COMPILED: list[tuple[str, tuple[str, ...], re.Pattern[str], Handler, bool]] = [
    (r.name, r.methods, compile_path(r.path)[0], r.handler, r.auth) for r in ROUTES]
MAX_IDLE_POLLS = 100_000  # monitor steps in a row that change nothing before a wait gives up


def simulated(handle: CampaignHandle) -> bool:
    """Whether the campaign's backend runs on a simulated clock that only the monitor's polls move."""
    return handle.backend.name == "sim"


def step(broker: Broker, handle: CampaignHandle) -> int:
    """One pass of the broker's monitor: the events it logged. On the sim backend it moves the simulated
    clock and returns at once; on a real backend it then waits the poll interval, as the monitor thread."""
    n = broker.poll_once()
    if not simulated(handle):
        time.sleep(handle.spec.control.poll_interval_s)
    return n


class InProcessClient:
    """`BrokerClient`'s interface over a broker in this process (see the module doc)."""

    def __init__(self, broker: Broker, handle: CampaignHandle, *, audit: bool = True) -> None:
        self.broker = broker
        self.handle = handle
        self.audit = audit

    def close(self) -> None:
        pass

    def __enter__(self) -> InProcessClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, method: str, path: str, *, params: dict[str, Any] | None = None,
             body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        method = method.upper()
        for name, methods, rx, fn, _auth in _COMPILED:
            m = rx.match(path)
            if m is None or method not in methods:
                continue
            # as a query string carries them (httpx writes booleans as true/false)
            query = {k: ("true" if v is True else "false" if v is False else str(v))
                     for k, v in (params or {}).items() if v is not None}
            handle = self.handle  # the client holds the campaign's token: every route attributes to it
            wire_body: dict[str, Any] | None = None
            status, payload, reason = 0, {}, None
            if method == "POST" and name != "unknown":  # the body as the HTTP app reads it: bounded JSON
                raw = json.dumps(body or {}).encode()
                if len(raw) > MAX_BODY_BYTES:
                    status, payload = 413, {"error": "too_large", "reason": f"request body over {MAX_BODY_BYTES} bytes"}
                else:
                    try:
                        wire_body = loads_json(raw, "the body", MAX_JSON_DEPTH)
                    except InputError as exc:
                        status, payload = 400, {"error": "bad_request", "reason": str(exc)}
                reason = payload.get("reason")
            if not status:
                status, payload, reason = self.broker.dispatch(name, fn, handle, m.groupdict(), query, wire_body)
            if self.audit:
                entry: dict[str, Any] = {"route": name, "method": method, "path": path, "client": "in-process"}
                if "run_id" in m.groupdict():
                    entry["run_id"] = m.groupdict()["run_id"]
                self.broker.audit(handle, {**entry, "allowed": status < 400, "status": status, "reason": reason})
            return status, json.loads(json.dumps(payload, default=str))
        return 404, {"error": "not_found", "reason": f"no such route: {path}"}

    def launch(self, **request: Any) -> tuple[int, dict[str, Any]]:
        return self.call("POST", "/v1/runs", body=request)

    def run(self, run_id: str) -> tuple[int, dict[str, Any]]:
        return self.call("GET", f"/v1/runs/{run_id}")

    def _ledger_stamp(self) -> tuple[int, int]:
        try:
            st = os.stat(self.handle.dir / "ledger.jsonl")
        except OSError:
            return (-1, -1)
        return (st.st_size, st.st_mtime_ns)

    def step(self) -> int:
        """One pass of the broker's monitor (on the sim backend: the clock moves to the next event)."""
        return step(self.broker, self.handle)

    def wait(self, run_id: str, timeout_s: float = 120.0, interval_s: float = 0.0) -> dict[str, Any]:
        """Run the broker's monitor until the run has finished and been scored; returns its last status.
        `interval_s` is accepted for `BrokerClient`'s interface: on the sim backend the monitor step is the
        wait (nothing sleeps; MAX_IDLE_POLLS steps in a row that log nothing end it), elsewhere each step
        waits the campaign's `control.poll_interval_s` as the monitor thread would. `timeout_s` bounds the
        wall time."""
        deadline = time.monotonic() + timeout_s
        idle = 0
        seen: tuple[int, int] | None = None
        while True:
            stamp = self._ledger_stamp()
            if stamp != seen:  # the run's state changes only with a ledger row: read it only then
                seen = stamp
                run = self.handle.state().runs.get(run_id)
                if run is None:
                    status, payload = self.run(run_id)  # the handler's own 404
                    raise TimeoutError(f"run {run_id}: {payload}")
                if run.status == "finished" and run.verdict is not None:
                    status, payload = self.run(run_id)
                    if status == 200:
                        return payload
            idle = 0 if self.step() else idle + 1
            if (simulated(self.handle) and idle > MAX_IDLE_POLLS) or time.monotonic() > deadline:
                status, payload = self.run(run_id)
                raise TimeoutError(f"run {run_id} did not finish within {timeout_s:g} s: {payload}")


class InProcessBroker:
    """One campaign's broker in this process, under its serve lock (a context manager)."""

    def __init__(self, campaign_dir: Path | str, *, audit: bool = True) -> None:
        self.dir = Path(campaign_dir).resolve()
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(_serve_locks([self.dir]))
        try:
            self.broker = build_broker([self.dir])
        except BaseException:
            self._stack.close()
            raise
        self.handle = next(iter(self.broker.handles.values()))
        self.audit = audit

    def client(self) -> InProcessClient:
        return InProcessClient(self.broker, self.handle, audit=self.audit)

    def step(self) -> int:
        return step(self.broker, self.handle)

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> InProcessBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
