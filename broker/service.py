"""The broker service: the agent's only path to the cluster, over HTTP, one token per campaign.

A request carries `Authorization: Bearer <token>`; the token names exactly one campaign, and the
request sees and touches only that campaign's runs and files. Every request, allowed or refused,
is appended to the audit log with its reason: the campaign's `audit.jsonl` for requests made
with its token, and the broker's own `audit.jsonl` (in its state directory) for all of them.

Routes (JSON in, JSON out; see docs/broker.md for the shapes):

    GET  /v1/health                          liveness (no token)
    GET  /v1/campaign                        the campaign's state: budget, calibration, leader, runs in flight
    POST /v1/runs                            launch (search candidate or calibration run)
    GET  /v1/runs                            list runs (paged)
    GET  /v1/runs/{run_id}                   one run, with live progress while it runs
    POST /v1/runs/{run_id}/cancel            cancel (kills the job, charges it, records it)
    GET  /v1/runs/{run_id}/log               tail, or a page of lines
    GET  /v1/runs/{run_id}/log/search        regex search of the log
    GET  /v1/runs/{run_id}/files             the run directory's files
    GET  /v1/runs/{run_id}/files/{path}      a page of one of them
    GET  /v1/image/list | read | search      the training image (bounded)
    POST /v1/assumptions                     record an assumption
    POST /v1/stop                            record a stop with its evidence (409 stop_refused: the
                                             search rules' codes and missing items)
    POST /v1/diagnoses                       record one finished run's diagnosis

The request and answer shapes are broker/wire.py's models (shared with the broker MCP server). Every
handler has one signature, `(Call) -> Reply`: the campaign, path parameters, query and body in, the
status, the answer (a wire model) and the audit reason out; `ROUTES` maps the routes to them.

A monitor thread polls every campaign's runs in flight and hands what the backend says of each to the
control plane's run lifecycle (attune/control/lifecycle.py: start, hang watchdog, finish, shipping).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import logging
import os
import secrets
import signal
import socket
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from attune.control.campaign import RecordError
from attune.control.plane import ControlError
from attune.control.spec import SpecError
from attune.core import ledger as ledger_mod
from attune.core.campaign_paths import (
    AUDIT_FILE,
    BROKER_DIR,
    BROKER_ENDPOINT,
    BROKER_SERVE_LOCK,
    BROKER_TOKEN,
    CAMPAIGN_FILE,
    LEDGER_FILE,
)
from attune.core.errors import BrokerError
from attune.core.ledger import LedgerError
from attune.readers.bounded import InputError, loads_json
from broker import wire
from broker.backends import get_backend
from broker.backends.base import Backend, BackendError
from broker.campaigns import CampaignHandle, NotFound
from broker.files import FileAccessError

log = logging.getLogger("attune.broker")

TOKEN_FILE = BROKER_TOKEN
ENDPOINT_FILE = BROKER_ENDPOINT
SERVE_LOCK = BROKER_SERVE_LOCK
MAX_BODY_BYTES = 256 * 1024
IDLE_AFTER_S = 5.0  # no request for this long, nothing in flight, ledgers unchanged: the monitor idles
IDLE_POLL_S = 1.0  # the idle monitor's wake-up interval (a stat of each ledger; no pass)
MAX_JSON_DEPTH = 16  # no route takes anything deeper


# ------------------------------------------------------------------------------------ tokens


def token_path(campaign_dir: Path) -> Path:
    return Path(campaign_dir) / BROKER_DIR / TOKEN_FILE


def load_or_create_token(campaign_dir: Path) -> str:
    """The campaign's broker token (created, mode 600, on first use)."""
    path = token_path(campaign_dir)
    path.parent.mkdir(mode=0o700, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        token = path.read_text().strip()
        if len(token) < 16:
            raise BrokerError(f"{path} does not hold a usable token") from None
        return token
    token = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w") as fh:
        fh.write(token + "\n")
    return token


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


# ------------------------------------------------------------------------------------ audit


def append_jsonl(path: Path, entry: dict[str, Any]) -> None:
    line = (json.dumps(entry, sort_keys=True, default=str) + "\n").encode()
    with open(path, "ab") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())


# ------------------------------------------------------------------------------------ broker


class Broker:
    """Campaigns, their tokens, the audit log and the monitor."""

    def __init__(self, handles: list[CampaignHandle], tokens: dict[str, str], state_dir: Path,
                 idle_exit_s: float | None = None) -> None:
        self.handles = {h.name: h for h in handles}
        self._by_digest = {_digest(tok): name for tok, name in tokens.items()}
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.audit_path = self.state_dir / AUDIT_FILE
        self.idle_exit_s = idle_exit_s
        self.last_request = time.monotonic()
        self._stop = threading.Event()
        self._wake = threading.Event()  # set by a request or a stop: the monitor polls at once
        self._monitor: threading.Thread | None = None
        self.on_idle: Callable[[], None] | None = None

    # --- auth and audit ---------------------------------------------------------------------
    def authenticate(self, request: Request) -> tuple[CampaignHandle | None, str | None]:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None, "no bearer token"
        digest = _digest(token.strip())
        for known, name in self._by_digest.items():
            if hmac.compare_digest(known, digest):
                return self.handles[name], None
        return None, "unknown token"

    def audit(self, handle: CampaignHandle | None, entry: dict[str, Any]) -> None:
        entry = {"ts": datetime.now(UTC).isoformat(timespec="microseconds"),
                 "campaign": handle.name if handle else None, **entry}
        try:
            append_jsonl(self.audit_path, entry)
            if handle is not None:
                append_jsonl(handle.dir / AUDIT_FILE, entry)
        except OSError:
            log.exception("cannot write the audit log")

    def owner_of_run(self, run_id: str, asking: CampaignHandle) -> str | None:
        """The other campaign holding `run_id`, if any (for the audit of out-of-scope attempts)."""
        for name, h in self.handles.items():
            if h is not asking and (h.control.run_dir(run_id)).exists():
                return name
        return None

    # --- monitor ----------------------------------------------------------------------------
    def poll_once(self) -> int:
        """One pass over every campaign's runs in flight; returns how many events it logged."""
        n = 0
        for h in self.handles.values():
            for event in h.poll():
                log.info("campaign %s: %s", h.name, event)
                n += 1
        return n

    def _ledger_stamps(self) -> tuple[tuple[int, int], ...]:
        stamps = []
        for h in self.handles.values():
            try:
                st = os.stat(h.dir / LEDGER_FILE)
                stamps.append((st.st_size, st.st_mtime_ns))
            except OSError:
                stamps.append((-1, -1))
        return tuple(stamps)

    def _monitor_loop(self) -> None:
        """Poll at the campaigns' interval while anything happens. Idle (no request for IDLE_AFTER_S, and
        the last pass logged nothing, wrote nothing and found nothing in flight), wake every IDLE_POLL_S
        and skip the pass, which reads every ledger, until a ledger changes. A request wakes it at once."""
        base = min(h.spec.control.poll_interval_s for h in self.handles.values())
        interval, idle, stamps = base, False, None
        while True:
            self._wake.wait(interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            now = time.monotonic()
            quiet = now - self.last_request > min(IDLE_AFTER_S, self.idle_exit_s or IDLE_AFTER_S)
            before = self._ledger_stamps()
            if idle and quiet and before == stamps:
                interval = max(base, IDLE_POLL_S)
            else:
                busy = True
                try:
                    busy = self.poll_once() > 0 or any(h.state().in_flight for h in self.handles.values())
                except Exception:
                    log.exception("monitor pass failed")
                stamps = self._ledger_stamps()
                idle = quiet and not busy and stamps == before  # a pass that changed nothing
                interval = max(base, IDLE_POLL_S) if idle else base
            if idle and self.idle_exit_s is not None and now - self.last_request > self.idle_exit_s \
                    and self.on_idle is not None:
                log.info("idle for %.0f s with nothing in flight: exiting", self.idle_exit_s)
                self.on_idle()
                return

    def start_monitor(self) -> None:
        if self._monitor is None:
            self._monitor = threading.Thread(target=self._monitor_loop, name="broker-monitor", daemon=True)
            self._monitor.start()

    def stop_monitor(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._monitor is not None:
            self._monitor.join(timeout=10)

    # --- the app ----------------------------------------------------------------------------
    def app(self) -> Starlette:
        routes = [Route(r.path, self._wrap(r.name, r.handler, auth=r.auth), methods=list(r.methods)) for r in ROUTES]

        @contextlib.asynccontextmanager
        async def lifespan(app: Starlette):  # type: ignore[no-untyped-def]
            self.start_monitor()
            try:
                yield
            finally:
                self.stop_monitor()

        return Starlette(routes=routes, lifespan=lifespan)

    def _wrap(self, name: str, fn: Handler, auth: bool = True) -> Callable[[Request], Awaitable[JSONResponse]]:
        async def endpoint(request: Request) -> JSONResponse:
            self.last_request = time.monotonic()
            self._wake.set()
            handle: CampaignHandle | None = None
            base = {"route": name, "method": request.method, "path": request.url.path,
                    "client": request.client.host if request.client else None}
            run_id = request.path_params.get("run_id")
            if run_id is not None:
                base["run_id"] = run_id
            if not auth:
                handle, _ = self.authenticate(request)  # only to attribute the request in the audit
            if auth:
                handle, why = self.authenticate(request)
                if handle is None:
                    self.audit(None, {**base, "allowed": False, "status": 401, "reason": f"refused: {why}"})
                    return JSONResponse(dump(wire.ErrorAnswer(error="unauthorized", reason=(
                        f"{why}: send Authorization: Bearer <the campaign's token>"))), status_code=401)
            body: dict[str, Any] | None = None
            if request.method == "POST" and name != "unknown":
                declared = request.headers.get("content-length", "0")
                if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
                    return self._refuse(handle, base, 413, "too_large", f"request body over {MAX_BODY_BYTES} bytes")
                raw = await _read_body(request, MAX_BODY_BYTES)  # counted while reading (chunked bodies too)
                if raw is None:
                    return self._refuse(handle, base, 413, "too_large", f"request body over {MAX_BODY_BYTES} bytes")
                try:
                    body = loads_json(raw, "the body", MAX_JSON_DEPTH) if raw.strip() else {}
                except InputError as exc:
                    return self._refuse(handle, base, 400, "bad_request", str(exc))
                if not isinstance(body, dict):
                    return self._refuse(handle, base, 400, "bad_request", "the body must be a JSON object")
            status, payload, reason = await run_in_threadpool(
                self.dispatch, name, fn, handle, dict(request.path_params), request.query_params, body)
            self.audit(handle, {**base, "allowed": status < 400, "status": status, "reason": reason})
            return JSONResponse(payload, status_code=status)

        return endpoint

    def dispatch(self, name: str, fn: Handler, handle: CampaignHandle | None, path_params: dict[str, Any],
                 query: Any, body: dict[str, Any] | None) -> tuple[int, dict[str, Any], str | None]:
        """Run one route's handler: (status, payload, the audit's reason). Every exception a handler may
        raise becomes its status and error code here, for the HTTP app and the in-process client alike
        (`broker.inprocess`)."""

        def refuse(status: int, code: str, reason: str,
                   audit_reason: str | None = None) -> tuple[int, dict[str, Any], str | None]:
            return status, dump(wire.ErrorAnswer(error=code, reason=reason)), audit_reason or reason

        try:
            status, answer, reason = fn(Call(self, handle, path_params, query, body))
            payload = dump(answer)
        except NotFound as exc:
            what = str(exc.args[0]) if exc.args else "?"
            other = self.owner_of_run(what, handle) if handle is not None else None
            audit_reason = (f"out of scope: run {what!r} belongs to another campaign" if other
                            else f"no run {what!r} in this campaign")
            return refuse(404, "not_found", f"no run {what!r} in this campaign", audit_reason)
        except FileAccessError as exc:
            status = {"not_found": 404, "out_of_scope": 403, "too_large": 413}.get(exc.code, 400)
            audit_reason = f"out of scope: {exc.message}" if exc.code == "out_of_scope" else exc.message
            return refuse(status, exc.code, exc.message, audit_reason)
        except ValidationError as exc:  # a body that does not fit its wire model
            return refuse(422, "bad_request", _problems(exc))
        except RecordError as exc:  # its code: "refused", or one a caller acts on (stop_already_recorded)
            return refuse(409, exc.code, str(exc))
        except _BadQuery as exc:
            return refuse(400, "bad_request", str(exc))
        except LedgerError as exc:
            if exc.kind == "bad_request":  # a record the ledger refuses: the request's fault
                return refuse(422, "bad_request", str(exc))
            log.exception("route %s failed", name)
            return refuse(503, "unavailable", f"the campaign's ledger: {exc}")
        except BackendError as exc:
            log.exception("route %s failed", name)
            return refuse(503, "unavailable", str(exc))
        except (InputError, UnicodeError, RecursionError) as exc:  # bad input that got past the parsing
            return refuse(400, "bad_request", f"{type(exc).__name__}: {str(exc)[:300]}")
        except Exception as exc:  # never crash the broker on one request
            log.exception("route %s failed", name)
            return refuse(500, "internal", f"{type(exc).__name__}: {exc}")
        return status, payload, reason or ("ok" if status < 400 else payload.get("reason"))

    def _refuse(self, handle: CampaignHandle | None, base: dict[str, Any], status: int, code: str, reason: str,
                audit_reason: str | None = None) -> JSONResponse:
        self.audit(handle, {**base, "allowed": False, "status": status, "reason": audit_reason or reason})
        return JSONResponse(dump(wire.ErrorAnswer(error=code, reason=reason)), status_code=status)


# ------------------------------------------------------------------------------------ handlers


class _BadQuery(BrokerError):
    pass


Q = TypeVar("Q", bound=BaseModel)
B = TypeVar("B", bound=BaseModel)
A = TypeVar("A", bound=BaseModel)


class _WireError(BrokerError, RuntimeError):
    """An answer that does not fit its wire model: the broker's own bug (500), never the request's."""


@dataclass(frozen=True)
class Call:
    """One request as a handler sees it: the broker, the campaign its token names, the route's path
    parameters, the query and the JSON body (POST routes; None otherwise)."""

    broker: Broker
    handle: CampaignHandle | None
    path_params: Mapping[str, str]
    query_params: Mapping[str, str]
    body: dict[str, Any] | None = None

    @property
    def campaign(self) -> CampaignHandle:
        if self.handle is None:  # only the routes without a token (health, unknown) have none
            raise RuntimeError("this route needs the campaign's token")
        return self.handle

    @property
    def run_id(self) -> str:
        return self.path_params["run_id"]

    def query(self, model: type[Q]) -> Q:
        """The query, validated (a bad value is a 400 naming the parameter; empty values are unset)."""
        try:
            return model.model_validate({k: v for k, v in self.query_params.items() if v != ""})
        except ValidationError as exc:
            raise _BadQuery(_problems(exc)) from None

    def parse_body(self, model: type[B]) -> B:
        """The body, validated (a body that does not fit is a 422 naming the field)."""
        return model.model_validate(self.body or {})


class Reply(NamedTuple):
    status: int
    answer: BaseModel
    audit: str | None = None  # the audit row's reason ("ok" when None and allowed)


Handler = Callable[[Call], Reply]


def _problems(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'the body'}: {e['msg']}" for e in exc.errors())


def answer(model: type[A], data: Mapping[str, Any]) -> A:
    """A handler's answer, built with its wire model."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _WireError(f"the answer does not fit {model.__name__}: {_problems(exc)}") from None


def dump(a: BaseModel) -> dict[str, Any]:
    """The JSON of an answer: the fields it was built with (no defaults added)."""
    return a.model_dump(mode="json", exclude_unset=True)


async def _read_body(request: Request, limit: int) -> bytes | None:
    """The body, or None as soon as more than `limit` bytes arrived (the rest is never read)."""
    chunks: list[bytes] = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _unknown(c: Call) -> Reply:
    return Reply(404, wire.ErrorAnswer(error="not_found", reason=f"no such route: /{c.path_params.get('path', '')}"),
                 "refused: no such route")


def _health(c: Call) -> Reply:
    return Reply(200, wire.Health(ok=True, service="attune-broker", pid=os.getpid()))


def shipping_status(s: Any) -> dict[str, Any]:
    from attune.control import shipping

    return shipping.status(s)


def campaign_summary(h: CampaignHandle) -> wire.CampaignSummary:
    s = h.state()
    d = s.as_dict()
    in_flight = [h.run_summary(r) for r in s.in_flight]
    return answer(wire.CampaignSummary, {
        "name": d["name"], "model": h.spec.model, "framework": h.spec.framework, "backend": h.backend.name,
        "gpus": d["gpus"], "budget": d["budget"], "calibration": d["calibration"], "leader": d["leader"],
        "concurrency": h.spec.budget.concurrency, "in_flight": in_flight,
        "launches": d["launches"], "failed_launches": d["failed_launches"], "launches_refused": d["launches_refused"],
        "runs": len(s.runs), "stop": d["stop"], "shipped": d["shipped"], "last_diagnosis": d["last_diagnosis"],
        "missing_for_stop": d["missing_for_stop"], "stop_blockers": d["stop_blockers"],
        "search_rules": d["search_rules"], "rows": d["rows"], "shipping": shipping_status(s),
        "remeasurements": d["remeasurements"], "checks": d["checks"], "failed": d["failed"],
        "hang_timeout_s": h.spec.control.hang_timeout_s, "env_allowlist": h.spec.control.env_allowlist,
        "image_roots": h.image.describe() if h.image else [],
    })


def _campaign(c: Call) -> Reply:
    return Reply(200, campaign_summary(c.campaign))


def _verify_ledger(c: Call) -> Reply:
    """The ledger checked by the broker, with the key no agent may read (`attune ledger verify` without it)."""
    rep = ledger_mod.verify(c.campaign.dir).as_dict()
    out = answer(wire.LedgerVerification, {k: rep.get(k) for k in wire.LedgerVerification.model_fields})
    return Reply(200, out, "ledger verified" if out.ok else f"ledger verification failed: {out.problem}")


def _launch(c: Call) -> Reply:
    out = c.campaign.admit(c.parse_body(wire.LaunchRequest))  # the control plane's answer, served as it is
    if not out.admitted:
        return Reply(409, out, f"launch refused ({out.code}): {out.reason}")
    reason = f"launch admitted: {out.run_id}"
    if not out.submitted:
        reason += f", but submission failed: {out.submit_error}"
    return Reply(201, out, reason)


_RUN_ROW = tuple(wire.RunRow.model_fields)


def _list_runs(c: Call) -> Reply:
    q = c.query(wire.ListRunsQuery)
    runs = list(c.campaign.state().runs.values())
    if q.status:
        runs = [r for r in runs if (r.status != "finished" if q.status == "in_flight" else r.status == q.status)]
    page = runs[q.offset: q.offset + q.limit]
    nxt = q.offset + q.limit if q.offset + q.limit < len(runs) else None
    return Reply(200, answer(wire.RunList, {"runs": [{k: getattr(r, k) for k in _RUN_ROW} for r in page],
                                            "total": len(runs), "offset": q.offset, "next_offset": nxt}))


def _run_status(c: Call) -> Reply:
    h = c.campaign
    return Reply(200, answer(wire.RunInfo, h.run_summary(h.run(c.run_id), live=True)))


def _cancel(c: Call) -> Reply:
    req = c.parse_body(wire.CancelRequest)
    out = answer(wire.CancelAnswer, c.campaign.cancel(c.run_id, req.reason or "cancelled"))
    return Reply(200, out, f"cancel: {out.reason or out.outcome}")


def _read_log(c: Call) -> Reply:
    q = c.query(wire.LogQuery)
    return Reply(200, answer(wire.LinesPage, c.campaign.read_log(c.run_id, q.tail, q.offset_line, q.max_lines)))


def _search_log(c: Call) -> Reply:
    q = c.query(wire.LogSearchQuery)
    return Reply(200, answer(wire.SearchAnswer, c.campaign.search_log(c.run_id, q.pattern, q.max_results, q.regex,
                                                                      q.ignore_case)))


def _list_files(c: Call) -> Reply:
    return Reply(200, answer(wire.DirPage, c.campaign.list_files(c.run_id)))


def _read_file(c: Call) -> Reply:
    q = c.query(wire.PageQuery)
    return Reply(200, answer(wire.LinesPage, c.campaign.read_file(c.run_id, c.path_params["path"], q.offset_line,
                                                                  q.max_lines)))


def _need_image(h: CampaignHandle) -> Any:
    if h.image is None:
        raise FileAccessError("not_found", f"the {h.backend.name} backend offers no window into its image")
    return h.image


def _image_list(c: Call) -> Reply:
    q = c.query(wire.ImageListQuery)
    return Reply(200, answer(wire.DirPage, _need_image(c.campaign).list(q.path, q.offset, q.limit)))


def _image_read(c: Call) -> Reply:
    q = c.query(wire.ImageReadQuery)
    return Reply(200, answer(wire.LinesPage, _need_image(c.campaign).read(q.path, q.offset_line, q.max_lines)))


def _image_search(c: Call) -> Reply:
    q = c.query(wire.ImageSearchQuery)
    return Reply(200, answer(wire.SearchAnswer, _need_image(c.campaign).search(
        q.pattern, q.path, q.glob, q.max_results, q.regex, q.ignore_case)))


def _assumption(c: Call) -> Reply:
    req = c.parse_body(wire.AssumptionRequest)
    return Reply(201, answer(wire.Recorded, c.campaign.assumption(req.question, req.default, req.context)),
                 "assumption recorded")


def _stop(c: Call) -> Reply:
    from attune.control.campaign import StopRefusedError

    req = c.parse_body(wire.StopRequest)
    try:
        return Reply(201, answer(wire.Recorded, c.campaign.stop(req.levers_tested, req.diagnosis, req.leader)),
                     "stop recorded")
    except StopRefusedError as exc:  # the search rules: codes and missing items, not only prose
        refused = answer(wire.StopRefused, {"error": "stop_refused", "reason": str(exc),
                                            "refusals": [r.as_dict() for r in exc.refusals]})
        return Reply(409, refused, "stop refused: " + ", ".join(r.code for r in exc.refusals))


def _diagnosis(c: Call) -> Reply:
    from attune.control.campaign import record_diagnosis

    req = c.parse_body(wire.DiagnosisRequest)
    row = record_diagnosis(c.campaign.dir, req.run_id, req.diagnosis, req.bottleneck)
    return Reply(201, answer(wire.Recorded, {"recorded": True, "seq": row.seq}), "diagnosis recorded")


class RouteSpec(NamedTuple):
    path: str
    name: str  # the audit's route name
    handler: Handler
    methods: tuple[str, ...]
    auth: bool = True


ROUTES: tuple[RouteSpec, ...] = (
    RouteSpec("/v1/health", "health", _health, ("GET",), auth=False),
    RouteSpec("/v1/campaign", "campaign_status", _campaign, ("GET",)),
    RouteSpec("/v1/ledger/verify", "verify_ledger", _verify_ledger, ("GET",)),
    RouteSpec("/v1/runs", "launch", _launch, ("POST",)),
    RouteSpec("/v1/runs", "list_runs", _list_runs, ("GET",)),
    RouteSpec("/v1/runs/{run_id}", "run_status", _run_status, ("GET",)),
    RouteSpec("/v1/runs/{run_id}/cancel", "cancel", _cancel, ("POST",)),
    RouteSpec("/v1/runs/{run_id}/log", "read_run_log", _read_log, ("GET",)),
    RouteSpec("/v1/runs/{run_id}/log/search", "search_run_log", _search_log, ("GET",)),
    RouteSpec("/v1/runs/{run_id}/files", "list_run_files", _list_files, ("GET",)),
    RouteSpec("/v1/runs/{run_id}/files/{path:path}", "read_run_file", _read_file, ("GET",)),
    RouteSpec("/v1/image/list", "image_list", _image_list, ("GET",)),
    RouteSpec("/v1/image/read", "image_read", _image_read, ("GET",)),
    RouteSpec("/v1/image/search", "image_search", _image_search, ("GET",)),
    RouteSpec("/v1/assumptions", "record_assumption", _assumption, ("POST",)),
    RouteSpec("/v1/stop", "record_stop", _stop, ("POST",)),
    RouteSpec("/v1/diagnoses", "record_diagnosis", _diagnosis, ("POST",)),
    # Anything else is refused, and audited like every other request.
    RouteSpec("/{path:path}", "unknown", _unknown, ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"),
              auth=False),
)


# ------------------------------------------------------------------------------------ serving


def build_broker(campaign_dirs: list[Path], state_dir: Path | None = None,
                 idle_exit_s: float | None = None) -> Broker:
    """Load each campaign (started, spec unchanged), share backends with identical settings, issue tokens."""
    if not campaign_dirs:
        raise BrokerError("serve at least one campaign (--campaign DIR)")
    backends: dict[str, Backend] = {}
    handles: list[CampaignHandle] = []
    tokens: dict[str, str] = {}
    for d in campaign_dirs:
        d = Path(d).resolve()
        try:
            from attune.control.spec import load_spec

            spec = load_spec(d / CAMPAIGN_FILE)
            key = json.dumps([spec.cluster.backend, spec.cluster.backend_settings()], sort_keys=True, default=str)
            if key not in backends:
                backends[key] = get_backend(spec.cluster.backend, spec.cluster.backend_settings())
            h = CampaignHandle(d, backend=backends[key])
        except (SpecError, ControlError, LedgerError, BackendError, TypeError) as exc:
            raise BrokerError(f"campaign {d}: {exc}") from None
        if h.name in {x.name for x in handles}:
            raise BrokerError(f"two campaigns are named {h.name!r}; a broker serves each name once")
        handles.append(h)
        tokens[load_or_create_token(d)] = h.name
    if state_dir is None:
        state_dir = (handles[0].dir / BROKER_DIR) if len(handles) == 1 else Path.home() / ".local/state/attune-broker"
    return Broker(handles, tokens, state_dir, idle_exit_s=idle_exit_s)


@contextlib.contextmanager
def _serve_locks(dirs: list[Path]):  # type: ignore[no-untyped-def]
    """One broker per campaign: hold each campaign's serve lock while serving."""
    handles = []
    try:
        for d in dirs:
            p = Path(d) / BROKER_DIR / SERVE_LOCK
            p.parent.mkdir(mode=0o700, exist_ok=True)
            fh = open(p, "a+b")  # noqa: SIM115 - held for the whole serve
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                fh.close()
                raise BrokerError(f"campaign {d} is already served by another broker "
                                  f"(see {Path(d) / BROKER_DIR / ENDPOINT_FILE})") from None
            handles.append(fh)
        yield
    finally:
        for fh in handles:
            fh.close()


def _exit_on_signal(signum: int, frame: Any) -> None:
    raise SystemExit(0)


def serve(campaign_dirs: list[Path], host: str = "127.0.0.1", port: int = 0, state_dir: Path | None = None,
          idle_exit_s: float | None = None, log_level: str = "warning",
          on_ready: Callable[[str], None] | None = None) -> None:
    """Serve until interrupted (or idle). Writes each campaign's .broker/endpoint.json once listening."""
    import uvicorn

    dirs = [Path(d).resolve() for d in campaign_dirs]
    with _serve_locks(dirs):
        broker = build_broker(dirs, state_dir, idle_exit_s)
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        actual = sock.getsockname()[1]
        url = f"http://{'[' + host + ']' if ':' in host else host}:{actual}"
        config = uvicorn.Config(broker.app(), log_level=log_level, access_log=False, lifespan="on")
        server = uvicorn.Server(config)
        broker.on_idle = lambda: setattr(server, "should_exit", True)
        endpoint = {"url": url, "pid": os.getpid(), "started_at": time.time(),
                    "campaigns": sorted(broker.handles)}
        written = []
        for h in broker.handles.values():
            p = h.dir / BROKER_DIR / ENDPOINT_FILE
            tmp = p.with_suffix(".tmp")
            tmp.write_text(json.dumps(endpoint) + "\n")
            os.replace(tmp, p)
            written.append(p)
        if on_ready is not None:
            on_ready(url)
        print(f"attune broker serving {', '.join(sorted(broker.handles))} at {url}", file=sys.stderr, flush=True)
        if threading.current_thread() is threading.main_thread():
            # uvicorn shuts down gracefully on SIGTERM and then re-raises it; exit through Python so that
            # the `finally` below removes the endpoint files.
            signal.signal(signal.SIGTERM, _exit_on_signal)
        try:
            server.run(sockets=[sock])
        except SystemExit:
            pass
        finally:
            for p in written:
                with contextlib.suppress(OSError, ValueError):
                    if json.loads(p.read_text()).get("pid") == os.getpid():
                        p.unlink()
