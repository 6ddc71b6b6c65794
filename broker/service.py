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

A monitor thread polls every campaign's runs in flight (start, hang watchdog, finish).
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
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from attune.bounded import InputError, loads_json
from attune.campaign import RecordError
from attune.campaign_paths import (
    AUDIT_FILE,
    BROKER_DIR,
    BROKER_ENDPOINT,
    BROKER_SERVE_LOCK,
    BROKER_TOKEN,
    CAMPAIGN_FILE,
    LEDGER_FILE,
)
from attune.launch import ControlError, LaunchRequest
from attune.ledger import LedgerError
from attune.spec import SpecError
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


class BrokerError(Exception):
    """The broker cannot start as configured."""


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


Handler = Callable[..., tuple[int, dict[str, Any], str | None]]


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
        routes = [Route(path, self._wrap(name, fn, auth=auth), methods=list(methods))
                  for name, methods, path, fn, auth in ROUTES]

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
                    return JSONResponse({"error": "unauthorized", "reason": f"{why}: send Authorization: Bearer "
                                         "<the campaign's token>"}, status_code=401)
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
            return status, {"error": code, "reason": reason}, audit_reason or reason

        try:
            status, payload, reason = fn(self, handle, path_params, query, body)
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
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
            return refuse(422, "bad_request", problems)
        except (RecordError, _BadQuery) as exc:
            return refuse(409 if isinstance(exc, RecordError) else 400,
                          "refused" if isinstance(exc, RecordError) else "bad_request", str(exc))
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
        return JSONResponse({"error": code, "reason": reason}, status_code=status)


# ------------------------------------------------------------------------------------ handlers


class _BadQuery(Exception):
    pass


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


def _int(q: Any, name: str, default: int | None, lo: int, hi: int) -> int | None:
    raw = q.get(name)
    if raw is None or raw == "":
        return default
    try:
        v = int(raw)
    except ValueError:
        raise _BadQuery(f"{name} must be an integer, got {raw!r}") from None
    if not lo <= v <= hi:
        raise _BadQuery(f"{name} must be between {lo} and {hi}, got {v}")
    return v


def _bool(q: Any, name: str, default: bool) -> bool:
    raw = q.get(name)
    if raw is None:
        return default
    if raw.lower() in ("1", "true", "yes"):
        return True
    if raw.lower() in ("0", "false", "no"):
        return False
    raise _BadQuery(f"{name} must be true or false, got {raw!r}")


def _unknown(b: Broker, h: None, p: dict[str, Any], q: Any, body: Any) -> tuple[int, dict[str, Any], str | None]:
    return 404, {"error": "not_found", "reason": f"no such route: /{p.get('path', '')}"}, "refused: no such route"


def _health(b: Broker, h: None, p: dict[str, Any], q: Any, body: Any) -> tuple[int, dict[str, Any], str | None]:
    return 200, {"ok": True, "service": "attune-broker", "pid": os.getpid()}, None


def shipping_status(s: Any) -> dict[str, Any]:
    from attune import shipping

    return shipping.status(s)


def campaign_summary(h: CampaignHandle) -> dict[str, Any]:
    s = h.state()
    d = s.as_dict()
    in_flight = [h.run_summary(r) for r in s.in_flight]
    return {
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
    }


def _campaign(b: Broker, h: CampaignHandle, p: Any, q: Any, body: Any) -> tuple[int, dict[str, Any], str | None]:
    return 200, campaign_summary(h), None


def _launch(b: Broker, h: CampaignHandle, p: Any, q: Any, body: dict[str, Any]) -> tuple[int, dict[str, Any], str | None]:
    req = LaunchRequest.model_validate(body)
    out = h.launch(req)
    if not out["admitted"]:
        return 409, out, f"launch refused ({out['code']}): {out['reason']}"
    reason = f"launch admitted: {out['run_id']}"
    if not out.get("submitted"):
        reason += f", but submission failed: {out.get('submit_error')}"
    return 201, out, reason


def _list_runs(b: Broker, h: CampaignHandle, p: Any, q: Any, body: Any) -> tuple[int, dict[str, Any], str | None]:
    offset = _int(q, "offset", 0, 0, 10**9) or 0
    limit = _int(q, "limit", 50, 1, 200) or 50
    status = q.get("status")
    runs = list(h.state().runs.values())
    if status:
        if status not in ("admitted", "running", "finished", "in_flight"):
            raise _BadQuery(f"status must be admitted, running, finished or in_flight, got {status!r}")
        runs = [r for r in runs if (r.status != "finished" if status == "in_flight" else r.status == status)]
    page = runs[offset: offset + limit]
    keys = ("run_id", "kind", "status", "lever", "outcome", "tokens_per_s_per_gpu", "valid", "verdict",
            "charge_gpu_hours", "expected_gpu_hours", "profile", "changes")
    items = [{k: getattr(r, k) for k in keys} for r in page]
    nxt = offset + limit if offset + limit < len(runs) else None
    return 200, {"runs": items, "total": len(runs), "offset": offset, "next_offset": nxt}, None


def _run_status(b: Broker, h: CampaignHandle, p: dict[str, Any], q: Any, body: Any) -> tuple[int, dict[str, Any], str | None]:
    run = h.run(p["run_id"])
    return 200, h.run_summary(run, live=True), None


def _cancel(b: Broker, h: CampaignHandle, p: dict[str, Any], q: Any, body: Any) -> tuple[int, dict[str, Any], str | None]:
    out = h.cancel(p["run_id"], str((body or {}).get("reason") or "cancelled"))
    return 200, out, f"cancel: {out.get('reason') or out.get('outcome')}"


def _read_log(b: Broker, h: CampaignHandle, p: dict[str, Any], q: Any, body: Any) -> tuple[int, dict[str, Any], str | None]:
    tail = _int(q, "tail", None, 1, 500)
    offset = _int(q, "offset_line", None, 1, 10**9)
    max_lines = _int(q, "max_lines", 200, 1, 500) or 200
    return 200, h.read_log(p["run_id"], tail, offset, max_lines), None


def _search_log(b: Broker, h: CampaignHandle, p: dict[str, Any], q: Any, body: Any) -> tuple[int, dict[str, Any], str | None]:
    pattern = q.get("pattern") or ""
    return 200, h.search_log(p["run_id"], pattern, _int(q, "max_results", 50, 1, 200) or 50,
                             _bool(q, "regex", True), _bool(q, "ignore_case", False)), None


def _list_files(b: Broker, h: CampaignHandle, p: dict[str, Any], q: Any, body: Any) -> tuple[int, dict[str, Any], str | None]:
    return 200, h.list_files(p["run_id"]), None


def _read_file(b: Broker, h: CampaignHandle, p: dict[str, Any], q: Any, body: Any) -> tuple[int, dict[str, Any], str | None]:
    return 200, h.read_file(p["run_id"], p["path"], _int(q, "offset_line", 1, 1, 10**9) or 1,
                            _int(q, "max_lines", 200, 1, 500) or 200), None


def _need_image(h: CampaignHandle) -> Any:
    if h.image is None:
        raise FileAccessError("not_found", f"the {h.backend.name} backend offers no window into its image")
    return h.image


def _image_list(b: Broker, h: CampaignHandle, p: Any, q: Any, body: Any) -> tuple[int, dict[str, Any], str | None]:
    return 200, _need_image(h).list(q.get("path", ""), _int(q, "offset", 0, 0, 10**9) or 0,
                                    _int(q, "limit", 200, 1, 500) or 200), None


def _image_read(b: Broker, h: CampaignHandle, p: Any, q: Any, body: Any) -> tuple[int, dict[str, Any], str | None]:
    path = q.get("path") or ""
    if not path:
        raise _BadQuery("path is required")
    return 200, _need_image(h).read(path, _int(q, "offset_line", 1, 1, 10**9) or 1,
                                    _int(q, "max_lines", 200, 1, 500) or 200), None


def _image_search(b: Broker, h: CampaignHandle, p: Any, q: Any, body: Any) -> tuple[int, dict[str, Any], str | None]:
    return 200, _need_image(h).search(q.get("pattern") or "", q.get("path", ""), q.get("glob") or None,
                                      _int(q, "max_results", 50, 1, 200) or 50, _bool(q, "regex", True),
                                      _bool(q, "ignore_case", False)), None


def _assumption(b: Broker, h: CampaignHandle, p: Any, q: Any, body: dict[str, Any]) -> tuple[int, dict[str, Any], str | None]:
    return 201, h.assumption(body.get("question"), body.get("default"), body.get("context")), "assumption recorded"


def _stop(b: Broker, h: CampaignHandle, p: Any, q: Any, body: dict[str, Any]) -> tuple[int, dict[str, Any], str | None]:
    from attune.campaign import StopRefused

    try:
        return 201, h.stop(body.get("levers_tested"), body.get("diagnosis"), body.get("leader")), "stop recorded"
    except StopRefused as exc:  # the search rules: codes and missing items, not only prose
        return 409, {"error": "stop_refused", "reason": str(exc),
                     "refusals": [r.as_dict() for r in exc.refusals]}, "stop refused: " + ", ".join(
                         r.code for r in exc.refusals)


def _diagnosis(b: Broker, h: CampaignHandle, p: Any, q: Any, body: dict[str, Any]) -> tuple[int, dict[str, Any], str | None]:
    from attune.campaign import record_diagnosis

    row = record_diagnosis(h.dir, body.get("run_id"), body.get("diagnosis"), body.get("bottleneck"))
    return 201, {"recorded": True, "seq": row.seq}, "diagnosis recorded"


# ------------------------------------------------------------------------------------ routes

# (audit name, methods, path, handler, needs the campaign's token): the HTTP app's routes, and the
# in-process client's (`broker.inprocess`), in matching order.
ROUTES: list[tuple[str, tuple[str, ...], str, Handler, bool]] = [
    ("health", ("GET",), "/v1/health", _health, False),
    ("campaign_status", ("GET",), "/v1/campaign", _campaign, True),
    ("launch", ("POST",), "/v1/runs", _launch, True),
    ("list_runs", ("GET",), "/v1/runs", _list_runs, True),
    ("run_status", ("GET",), "/v1/runs/{run_id}", _run_status, True),
    ("cancel", ("POST",), "/v1/runs/{run_id}/cancel", _cancel, True),
    ("read_run_log", ("GET",), "/v1/runs/{run_id}/log", _read_log, True),
    ("search_run_log", ("GET",), "/v1/runs/{run_id}/log/search", _search_log, True),
    ("list_run_files", ("GET",), "/v1/runs/{run_id}/files", _list_files, True),
    ("read_run_file", ("GET",), "/v1/runs/{run_id}/files/{path:path}", _read_file, True),
    ("image_list", ("GET",), "/v1/image/list", _image_list, True),
    ("image_read", ("GET",), "/v1/image/read", _image_read, True),
    ("image_search", ("GET",), "/v1/image/search", _image_search, True),
    ("record_assumption", ("POST",), "/v1/assumptions", _assumption, True),
    ("record_stop", ("POST",), "/v1/stop", _stop, True),
    ("record_diagnosis", ("POST",), "/v1/diagnoses", _diagnosis, True),
    # Anything else is refused, and audited like every other request.
    ("unknown", ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"), "/{path:path}", _unknown, False),
]


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
            from attune.spec import load_spec

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
