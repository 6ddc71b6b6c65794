"""A hostile agent's probes against the real broker service (`attune broker serve`) over HTTP.

Every probe must be refused with a 4xx status and a reason (never a 500 or 503), and must leave
exactly one audit row saying so. The corpus covers path-valued job arguments (listed flags or not),
malformed flag names, hostile JSON (non-finite numbers, lone surrogates, deep nesting), oversized
bodies (declared and chunked), catastrophic regular expressions, confinement of files and runs, and
authentication.
"""

from __future__ import annotations

import json
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from broker.service import MAX_BODY_BYTES
from tests._broker_helpers import ROOT, make_campaign, search, wait_for


class Broker:
    def __init__(self, d: Path, url: str, state: Path, proc: subprocess.Popen[bytes]) -> None:
        self.dir, self.url, self.state, self.proc = d, url, state, proc
        self.token = (d / ".broker" / "token").read_text().strip()
        self.http = httpx.Client(base_url=url, timeout=60, headers={"Authorization": f"Bearer {self.token}"})

    def audit(self) -> list[dict[str, Any]]:
        p = self.state / "audit.jsonl"
        return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    root = tmp_path_factory.mktemp("probes")
    d = make_campaign(root, "probe-a", control={"env_allowlist": ["NCCL_*", "PROBE_*"]})
    other = make_campaign(root, "probe-b")
    state = root / "broker-state"
    proc = subprocess.Popen(
        [sys.executable, "-m", "attune", "broker", "serve", "--campaign", str(d), "--port", "0",
         "--state-dir", str(state)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    endpoint = d / ".broker" / "endpoint.json"
    wait_for(lambda: endpoint.exists() or proc.poll() is not None, timeout_s=60)
    assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
    b = Broker(d, json.loads(endpoint.read_text())["url"], state, proc)
    b.other = other  # type: ignore[attr-defined]
    yield b
    b.http.close()
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=30)


def _refused(b: Broker, res: httpx.Response, *, status: int | tuple[int, ...] | None = None) -> dict[str, Any]:
    """The probe was refused with a 4xx and a reason, and the audit log's last row says so."""
    assert 400 <= res.status_code < 500, (res.status_code, res.text[:500])
    if status is not None:
        assert res.status_code in ((status,) if isinstance(status, int) else status), (res.status_code, res.text)
    body = res.json()
    assert body.get("reason"), body
    last = b.audit()[-1]
    assert last["allowed"] is False and last["status"] == res.status_code and last["reason"], last
    return body


# ------------------------------------------------------------------------------- path-valued arguments

OUTSIDE_VALUES = [
    "/other/campaign/ledger.jsonl",
    "/tmp/x",
    "../../ledger.jsonl",
    "..",
    "~/x",
    "~root",
    "a,/etc/passwd",
    "key=/etc/passwd",
    "a:/etc/passwd",
    "x;../y",
    "{run_dir}/../r001-other/log.txt",
    "{run_dir}/../../ledger.jsonl",
    "{run_dir}/a:/etc/x",
    "//etc/passwd",
    "file:///etc/passwd",
    "foo /etc",
    "{run_dir}/../../../../../../etc/passwd",
]
FLAGS = ["--metrics-out", "--save", "--load", "--tensorboard-dir", "--data-path", "--never-listed-flag"]


@pytest.mark.parametrize("value", OUTSIDE_VALUES)
def test_a_path_outside_the_run_directory_is_refused_for_any_flag(broker: Broker, value: str) -> None:
    for flag in FLAGS[:2] if value != OUTSIDE_VALUES[0] else FLAGS:
        res = broker.http.post("/v1/runs", json=search({flag: value}))
        body = _refused(broker, res, status=409)
        assert body["code"] == "path_outside_run" and flag in body["reason"], body
    ledger = broker.dir / "ledger.jsonl"
    last = json.loads(ledger.read_text().splitlines()[-1])
    assert last["type"] == "launch_refused" and last["data"]["code"] == "path_outside_run"


def test_a_path_in_an_environment_value_is_confined_too(broker: Broker) -> None:
    body = {**search({}), "changes": {"env": {"NCCL_DEBUG_FILE": "/tmp/nccl.%h"}}}
    res = broker.http.post("/v1/runs", json=body)
    assert _refused(broker, res, status=409)["code"] == "path_outside_run"


# A job's working directory is its run directory, so a relative name ("." , "./x", a bare file name, even one
# spelled like a campaign file) is a place inside the run.
@pytest.mark.parametrize("value", ["{run_dir}/metrics.json", "{run_dir}", "{run_dir}/sub/dir/x", "cosine", "3e-4",
                                   ".", "./x", "ledger.jsonl", "runs/r001-calibration/log.txt"])
def test_values_inside_the_run_directory_pass_the_path_rule(broker: Broker, value: str) -> None:
    res = broker.http.post("/v1/runs", json=search({"--metrics-out": value}))
    body = res.json()
    # The campaign is not calibrated, so the launch is refused, but not for the path.
    assert res.status_code == 409 and body["code"] == "not_calibrated", body


BAD_FLAGS = ["--metrics-out=/tmp/x", "--a b", "-x", "---x", "--", "--a;rm", "--\u00e4", "--a\u0000", "",
             "--" + "a" * 200, "--a\n", "--a'", "--a\"", "--$(id)", "metrics-out", "--a/b"]


@pytest.mark.parametrize("flag", BAD_FLAGS)
def test_bad_flag_names_are_refused_with_a_reason(broker: Broker, flag: str) -> None:
    res = broker.http.post("/v1/runs", json=search({flag: "1"}))
    body = _refused(broker, res)
    assert "flag" in body["reason"] or "code_locations" in body["reason"], body


# ------------------------------------------------------------------------------- hostile JSON

HOSTILE_BODIES: list[tuple[str, bytes]] = [
    ("1e999", b'{"kind": "search", "expected_gain": 1e999}'),
    ("-1e999", b'{"kind": "search", "expected_gain": -1e999}'),
    ("NaN", b'{"kind": "search", "expected_gain": NaN}'),
    ("Infinity", b'{"kind": "search", "expected_gain": Infinity}'),
    ("huge int", b'{"kind": "search", "expected_gain": ' + b"9" * 5000 + b"}"),
    ("lone surrogate value", b'{"kind": "search", "hypothesis": "\\ud800"}'),
    ("lone surrogate key", b'{"kind": "search", "changes": {"args": {"--x\\udfff": 1}}}'),
    ("lone surrogate in a flag value", b'{"kind": "search", "changes": {"args": {"--x": "\\udc00"}}}'),
    ("nested 20", b'{"a":' * 20 + b"1" + b"}" * 20),
    ("nested 1000", b"[" * 1000 + b"]" * 1000),
    ("nested 100000", b"[" * 100000),
    ("nested in changes", b'{"changes": {"args": {"--x": ' + b"[" * 50 + b"]" * 50 + b"}}}"),
    ("not JSON", b"{not json"),
    ("array", b"[1, 2]"),
    ("string", b'"search"'),
    ("number", b"7"),
    ("null", b"null"),
    ("latin-1 bytes", b'{"hypothesis": "\xe9t\xe9"}'),
    ("NUL", b'{"hypothesis": "\x00"}'),
    ("UTF-16", '{"kind": "search"}'.encode("utf-16")),
    ("unknown field", b'{"kind": "search", "rm": true}'),
    ("unknown kind", b'{"kind": "check"}'),
    ("changes is a list", b'{"kind": "search", "changes": []}'),
    ("changes.args is a list", b'{"kind": "search", "changes": {"args": ["--x"]}}'),
    ("flag value is an object", b'{"kind": "search", "changes": {"args": {"--x": {"a": 1}}}}'),
    ("env name", b'{"kind": "search", "changes": {"env": {"A B": "1"}}}'),
    ("profile a string", b'{"kind": "search", "profile": "yes please"}'),
    ("expected_gain a string", b'{"kind": "search", "expected_gain": "lots"}'),
    ("base a number", b'{"kind": "search", "base": 3}'),
    ("code_locations a list", b'{"kind": "search", "code_locations": ["x"]}'),
    ("prune_below negative", b'{"kind": "search", "prune_below": -1}'),
    ("hypothesis too long", json.dumps({"kind": "search", "hypothesis": "h" * 5000}).encode()),
]


@pytest.mark.parametrize("name,raw", HOSTILE_BODIES, ids=[n for n, _ in HOSTILE_BODIES])
def test_hostile_json_is_refused_with_a_4xx_and_an_audit_row(broker: Broker, name: str, raw: bytes) -> None:
    res = broker.http.post("/v1/runs", content=raw, headers={"Content-Type": "application/json"})
    _refused(broker, res)


@pytest.mark.parametrize("route", ["/v1/assumptions", "/v1/stop", "/v1/runs/r001-x/cancel"])
@pytest.mark.parametrize("raw", [b'{"question": 1e999, "default": "x"}', b'{"question": "\\ud800", "default": "x"}',
                                 b"[" * 5000, b'{"levers_tested": "x", "diagnosis": 5, "leader": []}',
                                 b'{"question": ["a"], "default": {"b": 1}}', b'{"reason": {"a": 1}}'])
def test_every_posting_route_refuses_hostile_json(broker: Broker, route: str, raw: bytes) -> None:
    res = broker.http.post(route, content=raw)
    _refused(broker, res)


# ------------------------------------------------------------------------------- body size

def test_a_declared_oversized_body_is_refused_before_reading(broker: Broker) -> None:
    res = broker.http.post("/v1/runs", content=b"{" + b" " * (MAX_BODY_BYTES + 10) + b"}")
    _refused(broker, res, status=413)


def test_a_huge_chunked_body_is_cut_off_early(broker: Broker) -> None:
    """200 MB sent chunked (no Content-Length): the 413 comes after a small part of it."""
    u = urlsplit(broker.url)
    sock = socket.create_connection((u.hostname, u.port), timeout=60)
    head = (f"POST /v1/runs HTTP/1.1\r\nHost: {u.hostname}\r\nAuthorization: Bearer {broker.token}\r\n"
            "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n").encode()
    sock.sendall(head)
    chunk = b"%x\r\n" % (64 * 1024) + b" " * (64 * 1024) + b"\r\n"
    total, sent, reply = 200 * 2**20, 0, b""
    try:
        while sent < total:
            readable, _, _ = select.select([sock], [], [], 0)
            if readable:
                break
            sock.sendall(chunk)
            sent += 64 * 1024
    except (BrokenPipeError, ConnectionResetError):
        pass
    try:
        while b"\r\n\r\n" not in reply:
            part = sock.recv(65536)
            if not part:
                break
            reply += part
    except ConnectionResetError:
        pass
    sock.close()
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    assert sent < 64 * 2**20, f"the broker read {sent} bytes before refusing"
    last = broker.audit()[-1]
    assert last["status"] == 413 and last["allowed"] is False


# ------------------------------------------------------------------------------- log search

@pytest.fixture(scope="module")
def run_with_log(broker: Broker) -> str:
    res = broker.http.post("/v1/runs", json={"kind": "calibration"})
    assert res.status_code == 201, res.text
    run_id = res.json()["run_id"]
    wait_for(lambda: broker.http.get(f"/v1/runs/{run_id}").json()["status"] == "finished", timeout_s=120)
    with open(broker.dir / "runs" / run_id / "log.txt", "a") as fh:
        fh.write("." * 5000 + "\n" + "a" * 5000 + "\n")
    return run_id


CATASTROPHIC = [r"(\.+)+X", r"(a+)+$", r"(a|a)+b", r"(a|aa)+c", r"(.*a){20}", r"(\w+\s?)+Z", r"^(([a-z])+.)+[A-Z]([a-z])+$"]


@pytest.mark.parametrize("pattern", CATASTROPHIC)
def test_a_catastrophic_regex_neither_stalls_the_search_nor_the_broker(broker: Broker, run_with_log: str,
                                                                      pattern: str) -> None:
    health: list[int] = []

    def poll() -> None:
        with httpx.Client(base_url=broker.url, timeout=30) as c:
            health.append(c.get("/v1/health").status_code)

    t = threading.Thread(target=poll)
    t.start()
    res = broker.http.get(f"/v1/runs/{run_with_log}/log/search", params={"pattern": pattern}, timeout=30)
    t.join()
    assert res.status_code == 200, res.text
    assert health == [200]


@pytest.mark.parametrize("pattern", [r"(a)\1", r"(?=a)", r"(?<!a)b", "(", "a{99999}", "x" * 300, ""])
def test_patterns_the_linear_engine_cannot_run_are_refused(broker: Broker, run_with_log: str, pattern: str) -> None:
    res = broker.http.get(f"/v1/runs/{run_with_log}/log/search", params={"pattern": pattern})
    _refused(broker, res, status=400)


def test_a_plain_search_still_finds_lines(broker: Broker, run_with_log: str) -> None:
    res = broker.http.get(f"/v1/runs/{run_with_log}/log/search", params={"pattern": r"^a{10}", "regex": "true"})
    assert res.status_code == 200 and res.json()["matches"], res.text
    res = broker.http.get(f"/v1/runs/{run_with_log}/log/search", params={"pattern": "(", "regex": "false"})
    assert res.status_code == 200


# ------------------------------------------------------------------------------- confinement and queries

QUERIES = [
    ("GET", "/v1/runs/{run}/files/../../ledger.jsonl"),
    ("GET", "/v1/runs/{run}/files/%2e%2e/%2e%2e/ledger.jsonl"),
    ("GET", "/v1/runs/{run}/files/..%2f..%2fledger.jsonl"),
    ("GET", "/v1/runs/{run}/files/a%00b"),
    ("GET", "/v1/runs/../ledger.jsonl"),
    ("GET", "/v1/runs/" + "r" * 5000),
    ("GET", "/v1/runs/r%C3%A9"),
    ("GET", "/v1/runs/{run}/log?tail=-1"),
    ("GET", "/v1/runs/{run}/log?tail=abc"),
    ("GET", "/v1/runs/{run}/log?offset_line=1e999"),
    ("GET", "/v1/runs/{run}/log?max_lines=99999999999999999999999"),
    ("GET", "/v1/runs/{run}/log/search?pattern=a&max_results=0"),
    ("GET", "/v1/runs/{run}/log/search?pattern=a&regex=maybe"),
    ("GET", "/v1/runs?status=bogus"),
    ("GET", "/v1/runs?offset=-5"),
    ("GET", "/v1/image/read?path=/etc/passwd"),
    ("GET", "/v1/image/read?path=../../ledger.jsonl"),
    ("GET", "/v1/image/read?path="),
    ("GET", "/v1/image/list?path=../.."),
    ("GET", "/v1/image/search?pattern=(a)%5C1"),
    ("PUT", "/v1/runs"),
    ("DELETE", "/v1/runs/{run}"),
    ("GET", "/v1/admin"),
    ("POST", "/v1/runs/{run}/cancel"),
]


@pytest.mark.parametrize("method,path", QUERIES)
def test_out_of_scope_and_malformed_queries_are_refused(broker: Broker, run_with_log: str, method: str,
                                                        path: str) -> None:
    path = path.replace("{run}", run_with_log)
    res = broker.http.request(method, path)
    if method == "POST":  # a finished run cannot be cancelled: a 200 that says so, and audited
        assert res.status_code == 200 and res.json()["cancelled"] is False
        return
    _refused(broker, res)


def test_the_other_campaigns_runs_are_out_of_reach(broker: Broker) -> None:
    other = broker.other  # type: ignore[attr-defined]
    res = broker.http.post("/v1/runs", json=search({"--x": str(other / "ledger.jsonl")}))
    assert _refused(broker, res, status=409)["code"] == "path_outside_run"
    res = broker.http.get("/v1/runs/r999-none")
    _refused(broker, res, status=404)


@pytest.mark.parametrize("header", [None, "Bearer", "Bearer  x y", "Basic abc", "Bearer wrong-token-0123456789",
                                    "bearer\tx"])
def test_requests_without_the_token_are_refused_and_audited(broker: Broker, header: str | None) -> None:
    headers = {} if header is None else {"Authorization": header}
    with httpx.Client(base_url=broker.url, timeout=30) as c:
        res = c.get("/v1/campaign", headers=headers)
    _refused(broker, res, status=401)


def test_health_still_answers_and_no_request_got_a_5xx(broker: Broker) -> None:
    with httpx.Client(base_url=broker.url, timeout=30) as c:
        assert c.get("/v1/health").status_code == 200
    statuses = [r["status"] for r in broker.audit()]
    assert statuses and all(s < 500 for s in statuses), sorted(set(statuses))
