"""`attune broker`: the embedded local broker started on demand, its token, stop, idle exit, bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from broker.client import ensure_local_broker, running_broker
from tests._broker_helpers import FAKE_LIST, make_campaign, wait_for
from tests.conftest import EXAMPLE_CAMPAIGN, run_cli


def test_start_reuse_token_and_stop(tmp_path: Path) -> None:
    d = make_campaign(tmp_path)
    tok = run_cli("broker", "token", str(d), "--json")
    assert tok.returncode == 0
    token = json.loads(tok.stdout)["token"]
    assert (d / ".broker" / "token").read_text().strip() == token
    assert (d / ".broker" / "token").stat().st_mode & 0o777 == 0o600

    first = run_cli("broker", "start", str(d), "--json")
    assert first.returncode == 0, first.stderr
    a = json.loads(first.stdout)
    again = json.loads(run_cli("broker", "start", str(d), "--json").stdout)
    assert a["started"] is True and again["started"] is False and again["url"] == a["url"]
    assert running_broker(d)["pid"] == a["pid"]

    stop = run_cli("broker", "stop", str(d), "--json")
    assert stop.returncode == 0 and json.loads(stop.stdout)["stopped"] is True
    assert running_broker(d) is None and not (d / ".broker" / "endpoint.json").exists()
    assert json.loads(run_cli("broker", "stop", str(d), "--json").stdout)["stopped"] is False


def test_an_idle_local_broker_exits_by_itself(tmp_path: Path) -> None:
    d = make_campaign(tmp_path)
    ep = ensure_local_broker(d, idle_exit_s=0.5)
    assert ep.started
    wait_for(lambda: not (d / ".broker" / "endpoint.json").exists(), timeout_s=20, interval_s=0.2)
    assert running_broker(d) is None


def test_bad_input(tmp_path: Path) -> None:
    res = run_cli("broker", "serve", "--campaign", str(tmp_path / "nowhere"))
    assert res.returncode == 2 and "not a campaign directory" in res.stderr
    unstarted = tmp_path / "unstarted"
    unstarted.mkdir()
    shutil.copy(EXAMPLE_CAMPAIGN, unstarted / "campaign.yaml")
    (unstarted / "fake.yaml").write_text(FAKE_LIST)
    res = run_cli("broker", "serve", "--campaign", str(unstarted))
    assert res.returncode == 2 and "has not started" in res.stderr
    d = make_campaign(tmp_path / "c")
    res = run_cli("broker", "serve", "--campaign", str(d), "--port", "70000")
    assert res.returncode == 2 and "--port must be between 0 and 65535" in res.stderr
    res = run_cli("broker", "start", str(unstarted), "--json")
    assert res.returncode == 1 and "has not started" in res.stderr


# A stand-in for a broker that does not exit on SIGTERM (a shutdown stuck past the grace period): it answers the
# health check with its pid and ignores SIGTERM, so `stop_local_broker` must SIGKILL it, and nothing of its own
# removes its endpoint file.
_STUCK_BROKER = """
import http.server, json, os, signal, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"pid": os.getpid()}).encode()
        self.send_response(200); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a):
        pass
srv = http.server.HTTPServer(("127.0.0.1", 0), H)
path = sys.argv[1]
with open(path + ".tmp", "w") as f:
    json.dump({"url": f"http://127.0.0.1:{srv.server_address[1]}", "pid": os.getpid()}, f)
os.replace(path + ".tmp", path)
srv.serve_forever()
"""


def test_stopping_a_broker_that_must_be_killed_leaves_no_endpoint_file(tmp_path: Path) -> None:
    """`broker stop` on a broker that ignores SIGTERM kills it after the grace period; its endpoint file, which a
    killed process cannot remove, names a process that is gone and is removed by the stop (before: left behind, so
    the campaign still looked served until the next health check)."""
    import subprocess
    import sys

    from broker.client import stop_local_broker

    d = make_campaign(tmp_path)
    (d / ".broker").mkdir(exist_ok=True)
    endpoint = d / ".broker" / "endpoint.json"
    proc = subprocess.Popen([sys.executable, "-c", _STUCK_BROKER, str(endpoint)])
    try:
        wait_for(lambda: running_broker(d) is not None, timeout_s=20, interval_s=0.1)
        assert stop_local_broker(d, timeout_s=0.5) == proc.pid
        proc.wait(timeout=10)  # killed (SIGTERM is ignored; the stop reaped it, so its status reads 0 here)
        assert not endpoint.exists() and running_broker(d) is None
    finally:
        proc.kill()
        proc.wait()
