"""Talking to a broker: where it is, its token, and starting the embedded one on demand.

`endpoint_for(campaign_dir)` answers (url, token) from, in order, the environment
(`ATTUNE_BROKER_URL` + `ATTUNE_BROKER_TOKEN`: a shared broker run by someone else), or a local
broker serving the campaign on loopback, which it starts if none is running (`ensure_local_broker`).
The local broker runs detached from its starter (a crashed MCP server does not take the jobs'
watchdog with it) and exits by itself once idle with nothing in flight.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from attune.core.campaign_paths import BROKER_LOG, BROKER_START_LOCK, CAMPAIGN_FILE
from attune.core.errors import BrokerError
from broker.service import BROKER_DIR, ENDPOINT_FILE, load_or_create_token

DEFAULT_IDLE_EXIT_S = 1800.0
START_TIMEOUT_S = 60.0


class BrokerUnavailable(BrokerError):
    """No broker could be reached or started."""


@dataclass(frozen=True)
class Endpoint:
    url: str
    token: str
    pid: int | None = None
    started: bool = False  # this call started it


def _healthy(url: str, timeout: float = 2.0) -> dict[str, Any] | None:
    try:
        r = httpx.get(f"{url}/v1/health", timeout=timeout)
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    try:
        return r.json()
    except ValueError:
        return None


def _read_endpoint(campaign_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((campaign_dir / BROKER_DIR / ENDPOINT_FILE).read_text())
    except (OSError, ValueError):
        return None


def running_broker(campaign_dir: Path) -> dict[str, Any] | None:
    """The endpoint of the broker serving this campaign, if one answers."""
    ep = _read_endpoint(campaign_dir)
    if not ep or "url" not in ep:
        return None
    health = _healthy(ep["url"])
    if health is None or (ep.get("pid") is not None and health.get("pid") != ep.get("pid")):
        return None
    return ep


def ensure_local_broker(campaign_dir: Path | str, *, idle_exit_s: float = DEFAULT_IDLE_EXIT_S,
                        timeout_s: float = START_TIMEOUT_S) -> Endpoint:
    """A local broker serving the campaign on loopback: the running one, or a new one started now."""
    d = Path(campaign_dir).resolve()
    if not (d / CAMPAIGN_FILE).exists():
        raise BrokerUnavailable(f"{d} holds no campaign.yaml")
    (d / BROKER_DIR).mkdir(mode=0o700, exist_ok=True)
    token = load_or_create_token(d)
    ep = running_broker(d)
    if ep:
        return Endpoint(ep["url"], token, ep.get("pid"))
    with open(d / BROKER_DIR / BROKER_START_LOCK, "a+b") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        ep = running_broker(d)
        if ep:
            return Endpoint(ep["url"], token, ep.get("pid"))
        log_path = d / BROKER_DIR / BROKER_LOG
        with contextlib.suppress(OSError):
            (d / BROKER_DIR / ENDPOINT_FILE).unlink()
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "attune", "broker", "serve", "--campaign", str(d), "--host", "127.0.0.1",
                 "--port", "0", "--idle-exit-s", str(idle_exit_s)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                cwd=str(Path(__file__).resolve().parents[1]),
                env={**os.environ, "PYTHONPATH": os.pathsep.join(
                    [str(Path(__file__).resolve().parents[1])] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])},
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                tail = log_path.read_text(errors="replace")[-2000:]
                raise BrokerUnavailable(f"the local broker exited with status {proc.returncode}:\n{tail}")
            ep = _read_endpoint(d)
            if ep and ep.get("pid") == proc.pid and _healthy(ep["url"]):
                return Endpoint(ep["url"], token, proc.pid, started=True)
            time.sleep(0.1)
        proc.terminate()
        raise BrokerUnavailable(f"the local broker did not come up within {timeout_s:g} s (log: {log_path})")


def _gone(pid: int) -> bool:
    """True once `pid` has exited (reaped here when it is this process's child, or a zombie)."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return True
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def stop_local_broker(campaign_dir: Path | str, *, timeout_s: float = 15.0) -> int | None:
    """Stop the broker serving the campaign (SIGTERM, then SIGKILL after `timeout_s`); its pid, or None."""
    d = Path(campaign_dir).resolve()
    ep = running_broker(d)
    if not ep or not isinstance(ep.get("pid"), int):
        return None
    pid = int(ep["pid"])
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return None
    deadline = time.monotonic() + timeout_s
    while not _gone(pid):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 5.0
            while not _gone(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            break
        time.sleep(0.05)
    if _gone(pid):
        # A broker killed before its shutdown removed its endpoint file (SIGKILL after the grace period, or a
        # graceful exit the kernel cut short) leaves it behind: it names a process that is gone, so it goes.
        left = _read_endpoint(d)
        if left is not None and left.get("pid") == pid:
            with contextlib.suppress(OSError):
                (d / BROKER_DIR / ENDPOINT_FILE).unlink()
    return pid


@contextlib.contextmanager
def stops_the_broker_it_starts(campaign_dir: Path | str) -> Iterator[None]:
    """Around a command that may start the campaign's local broker (`attune tune`, `attune demo`):
    on the way out (normal end, failure, KeyboardInterrupt) stop the local broker serving the campaign,
    unless one was already running when the command began (a Claude Code session may be using it) or
    the broker is a shared one named by ATTUNE_BROKER_URL."""
    shared = bool(os.environ.get("ATTUNE_BROKER_URL"))
    found = shared or running_broker(Path(campaign_dir).resolve()) is not None
    try:
        yield
    finally:
        if not found:
            with contextlib.suppress(OSError, BrokerUnavailable):
                stop_local_broker(campaign_dir)


def endpoint_for(campaign_dir: Path | str | None) -> Endpoint:
    """Where the agent's broker is: the environment's shared broker, or the campaign's local one."""
    url, token = os.environ.get("ATTUNE_BROKER_URL"), os.environ.get("ATTUNE_BROKER_TOKEN")
    if url:
        if not token:
            raise BrokerUnavailable("ATTUNE_BROKER_URL is set but ATTUNE_BROKER_TOKEN is not")
        return Endpoint(url.rstrip("/"), token)
    if campaign_dir is None:
        raise BrokerUnavailable("no campaign directory (set ATTUNE_CAMPAIGN_DIR) and no ATTUNE_BROKER_URL")
    return ensure_local_broker(campaign_dir)


class BrokerClient:
    """A small synchronous client (the CLI's, and the tests')."""

    def __init__(self, url: str, token: str, timeout_s: float = 120.0) -> None:
        self._c = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=timeout_s)

    def close(self) -> None:
        self._c.close()

    def __enter__(self) -> BrokerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, method: str, path: str, *, params: dict[str, Any] | None = None,
             body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        r = self._c.request(method, path, params={k: v for k, v in (params or {}).items() if v is not None},
                            json=body)
        try:
            payload = r.json()
        except ValueError:
            payload = {"error": "bad_response", "reason": r.text[:500]}
        return r.status_code, payload

    def launch(self, **request: Any) -> tuple[int, dict[str, Any]]:
        return self.call("POST", "/v1/runs", body=request)

    def run(self, run_id: str) -> tuple[int, dict[str, Any]]:
        return self.call("GET", f"/v1/runs/{run_id}")

    def wait(self, run_id: str, timeout_s: float = 120.0, interval_s: float = 0.2) -> dict[str, Any]:
        """Poll a run until it has finished (and been scored); returns its last status."""
        deadline = time.monotonic() + timeout_s
        while True:
            status, payload = self.run(run_id)
            if status == 200 and payload.get("status") == "finished" and payload.get("verdict") is not None:
                return payload
            if time.monotonic() > deadline:
                raise TimeoutError(f"run {run_id} did not finish within {timeout_s:g} s: {payload}")
            time.sleep(interval_s)


_IN_FLIGHT = re.compile(r"already in flight \(run ([A-Za-z0-9._-]+)\)")


class ReconnectingClient(BrokerClient):
    """A campaign's client that outlives its broker: a request that cannot reach the broker (it died, it is
    restarting) reaches it again through `endpoint_for`, which restarts the campaign's local broker, and is
    sent again, for up to `reconnect_s`. A launch that the dead broker may have admitted is not doubled: the
    control plane refuses the same recipe while its run is in flight, and that run is the launch's answer."""

    def __init__(self, campaign_dir: Path | str, *, reconnect_s: float = 300.0, timeout_s: float = 120.0,
                 say: Any = None) -> None:
        self.dir = Path(campaign_dir).resolve()
        self.reconnect_s = reconnect_s
        self.timeout_s = timeout_s
        self.say = say
        self.reconnects = 0
        ep = endpoint_for(self.dir)
        super().__init__(ep.url, ep.token, timeout_s)

    def _reconnect(self, why: BaseException, deadline: float) -> None:
        delay = 0.5
        while True:
            try:
                ep = endpoint_for(self.dir)
            except BrokerUnavailable as exc:
                if time.monotonic() + delay > deadline:
                    raise BrokerUnavailable(f"the campaign's broker went away ({why}) and could not be restarted "
                                            f"within {self.reconnect_s:g} s: {exc}") from None
                time.sleep(delay)
                delay = min(2 * delay, 5.0)
                continue
            with contextlib.suppress(Exception):
                self._c.close()
            self._c = httpx.Client(base_url=ep.url, headers={"Authorization": f"Bearer {ep.token}"},
                                   timeout=self.timeout_s)
            self.reconnects += 1
            if self.say:
                self.say(f"the broker went away ({type(why).__name__}); reconnected to {ep.url}")
            return

    def call(self, method: str, path: str, *, params: dict[str, Any] | None = None,
             body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        deadline = time.monotonic() + self.reconnect_s
        lost = False
        while True:
            try:
                status, payload = super().call(method, path, params=params, body=body)
            except httpx.TransportError as exc:
                if time.monotonic() > deadline:
                    raise BrokerUnavailable(f"the campaign's broker does not answer: {exc}") from None
                lost = True
                self._reconnect(exc, deadline)
                continue
            if lost and method == "POST" and path == "/v1/runs" and payload.get("code") == "identical":
                m = _IN_FLIGHT.search(str(payload.get("reason") or ""))
                if m:  # the broker that died had admitted this launch: its run is the answer
                    return 201, {"admitted": True, "run_id": m.group(1), "reconciled": True}
            return status, payload
