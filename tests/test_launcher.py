"""The MCP server launcher provisions a venv in the plugin's data directory, once, and execs the server.

A throwaway plugin (its own pyproject.toml whose one dependency is a local wheel built here, and a
small server module) stands in for attune, so the real `python3 -m venv` + pip path runs offline.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = ROOT / "mcp_servers" / "launch.py"

SERVER = '''
import json, os, sys
import tinydep
sys.stdout.write(json.dumps({"python": sys.executable, "value": tinydep.VALUE, "argv": sys.argv[1:],
                             "pythonpath": os.environ.get("PYTHONPATH")}) + "\\n")
'''


def _wheel(dest: Path) -> Path:
    files = {
        "tinydep/__init__.py": b"VALUE = 42\n",
        "tinydep-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: tinydep\nVersion: 1.0\n",
        "tinydep-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("tinydep-1.0.dist-info/RECORD,,")
    path = dest / "tinydep-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr("tinydep-1.0.dist-info/RECORD", "\n".join(record) + "\n")
    return path


def _plugin(tmp: Path, dep: str) -> Path:
    root = tmp / "plugin"
    (root / "fakesrv").mkdir(parents=True)
    (root / "mcp_servers").mkdir()
    (root / "mcp_servers" / "launch.py").write_bytes(LAUNCH.read_bytes())
    (root / "attune" / "core").mkdir(parents=True)  # the launcher reads the server list and venv protocol from the core
    (root / "attune" / "__init__.py").write_text("")
    (root / "attune" / "core" / "__init__.py").write_text("")
    for kit in ("plugin_servers.py", "errors.py", "venvs.py"):  # the stdlib-only core the launcher imports
        (root / "attune" / "core" / kit).write_bytes((ROOT / "attune" / "core" / kit).read_bytes())
    (root / "fakesrv" / "__init__.py").write_text("")
    (root / "fakesrv" / "echo_server.py").write_text(SERVER)
    (root / "pyproject.toml").write_text(
        f'[project]\nname = "fake"\nversion = "9.9.9"\ndependencies = ["{dep}"]\n'
    )
    return root


def _env(data: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ATTUNE_PYTHON", "PYTHONPATH", "CLAUDE_PLUGIN_ROOT")}
    env.update({"CLAUDE_PLUGIN_DATA": str(data), "PIP_NO_INDEX": "1", "ATTUNE_NO_UV": "1", **extra})
    return env


def _start(root: Path, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(root / "mcp_servers" / "launch.py"), "--module", "fakesrv.echo_server", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=root.parent,
    )


def test_first_starts_provision_once_then_reuse(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path)
    root = _plugin(tmp_path, f"tinydep @ {wheel.as_uri()}")
    data = tmp_path / "data"
    env = _env(data)
    # Three servers starting at once (as Claude Code starts them): one builds, the others wait.
    procs = [_start(root, env, f"n{i}") for i in range(3)]
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
        got = json.loads(out)
        assert got["value"] == 42
        assert Path(got["pythonpath"]) == root
        assert str(data) in got["python"]
    venvs = [d for d in data.iterdir() if d.is_dir()]
    assert len(venvs) == 1 and venvs[0].name.startswith("venv-9.9.9-")
    marker = json.loads((venvs[0] / ".attune-ready").read_text())
    assert marker["version"] == "9.9.9" and marker["dependencies"] == [f"tinydep @ {wheel.as_uri()}"]
    log = (data / f"{venvs[0].name}.log").read_text()
    assert log.count("== provisioning") == 1
    stamp = (venvs[0] / ".attune-ready").stat().st_mtime_ns
    # A later start reuses the environment without touching it.
    p = _start(root, env, "again")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert json.loads(out)["argv"] == ["again"]
    assert (venvs[0] / ".attune-ready").stat().st_mtime_ns == stamp
    assert "installing" not in err
    # --where names the same environment without building anything.
    where = subprocess.run([sys.executable, str(root / "mcp_servers" / "launch.py"), "--where"],
                           capture_output=True, text=True, env=env, check=True)
    assert Path(where.stdout.strip()) == venvs[0]


def test_failed_provisioning_says_what_and_how_to_fix(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "tinydep-1.0-py3-none-any.whl"
    root = _plugin(tmp_path, f"tinydep @ {missing.as_uri()}")
    data = tmp_path / "data"
    p = _start(root, _env(data))
    out, err = p.communicate(timeout=240)
    assert p.returncode == 1
    assert out == ""  # stdout is the MCP transport: nothing leaks there
    assert "provisioning its Python environment failed" in err
    assert "step:  pip install" in err
    assert "log:" in err and "fix:" in err and "ATTUNE_PYTHON" in err
    assert not any((d / ".attune-ready").exists() for d in data.iterdir() if d.is_dir())


def test_attune_python_skips_provisioning(tmp_path: Path) -> None:
    root = _plugin(tmp_path, "tinydep")
    (root / "tinydep").mkdir()
    (root / "tinydep" / "__init__.py").write_text("VALUE = 7\n")
    data = tmp_path / "data"
    p = _start(root, _env(data, ATTUNE_PYTHON=sys.executable))
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert json.loads(out)["value"] == 7
    assert not data.exists()


@pytest.mark.parametrize("args, code", [(["nosuch"], 2), ([], 2)])
def test_bad_usage(args: list[str], code: int) -> None:
    p = subprocess.run([sys.executable, str(LAUNCH), *args], capture_output=True, text=True, timeout=30)
    assert p.returncode == code
    assert p.stdout == ""


def test_build_survives_a_killed_launcher(tmp_path: Path) -> None:
    """Claude Code kills a server that takes longer than MCP_TIMEOUT: the detached build still completes."""
    wheel = _wheel(tmp_path)
    root = _plugin(tmp_path, f"tinydep @ {wheel.as_uri()}")
    data = tmp_path / "data"
    env = _env(data)
    p = _start(root, env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(data.glob("venv-*/bin")):
        time.sleep(0.05)
    assert p.poll() is None, "the launcher finished before it could be killed"
    p.kill()
    p.wait()
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not any(data.glob("venv-*/.attune-ready")):
        time.sleep(0.2)
    assert any(data.glob("venv-*/.attune-ready"))
    p = _start(root, env)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0 and json.loads(out)["value"] == 42, err


FAKE_MCP = '''
import json, sys
import tinydep
for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue
    m = msg["method"]
    if m == "initialize":
        res = {"protocolVersion": msg["params"]["protocolVersion"], "capabilities": {"tools": {}},
               "serverInfo": {"name": "real", "version": "1"}}
    elif m == "tools/list":
        res = {"tools": [{"name": "hello", "inputSchema": {"type": "object"}, "description": "real"}]}
    elif m == "tools/call":
        res = {"content": [{"type": "text", "text": json.dumps({"value": tinydep.VALUE, "python": sys.executable,
                                                                 "args": msg["params"].get("arguments")})}]}
    else:
        res = {}
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": res}) + "\\n")
    sys.stdout.flush()
'''

SCHEMAS = {"servers": {"broker": {
    "initialize": {"protocolVersion": "2025-06-18", "capabilities": {"tools": {"listChanged": False}},
                   "serverInfo": {"name": "attune-broker", "version": "1"}, "instructions": "recorded"},
    "tools": [{"name": "hello", "description": "recorded", "inputSchema": {"type": "object"}}],
    "protocol_versions": ["2025-06-18"]}}}


def _mcp_plugin(tmp: Path, dep: str) -> Path:
    root = _plugin(tmp, dep)
    (root / "mcp_servers" / "__init__.py").write_text("")
    (root / "mcp_servers" / "broker_server.py").write_text(FAKE_MCP)
    (root / "mcp_servers" / "tool_schemas.json").write_text(json.dumps(SCHEMAS))
    return root


def _rpc(p: subprocess.Popen[str], msg: dict) -> None:
    assert p.stdin is not None
    p.stdin.write(json.dumps({"jsonrpc": "2.0", **msg}) + "\n")
    p.stdin.flush()


def _answer(p: subprocess.Popen[str]) -> dict:
    assert p.stdout is not None
    return json.loads(p.stdout.readline())


def _first_start(root: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(root / "mcp_servers" / "launch.py"), "broker"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=root.parent)


def test_a_first_start_lists_the_tools_at_once_and_serves_calls_when_ready(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path)
    root = _mcp_plugin(tmp_path, f"tinydep @ {wheel.as_uri()}")
    data = tmp_path / "data"
    p = _first_start(root, _env(data))
    try:
        _rpc(p, {"id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                                                             "clientInfo": {"name": "t", "version": "1"}}})
        init = _answer(p)
        _rpc(p, {"method": "notifications/initialized"})
        _rpc(p, {"id": 2, "method": "tools/list"})
        listed = _answer(p)
        # answered from the recorded schemas while the environment is still being built
        assert not any(data.glob("venv-*/.attune-ready")), "the build finished first: nothing shown"
        assert init["id"] == 1 and init["result"]["serverInfo"]["name"] == "attune-broker"
        assert listed["result"]["tools"][0]["description"] == "recorded"
        _rpc(p, {"id": 3, "method": "tools/call", "params": {"name": "hello", "arguments": {"x": 1}}})
        _rpc(p, {"id": 4, "method": "ping"})
        got = [_answer(p), _answer(p)]
        by_id = {m["id"]: m for m in got}
        assert by_id[4]["result"] == {}
        call = json.loads(by_id[3]["result"]["content"][0]["text"])
        assert call["value"] == 42 and str(data) in call["python"] and call["args"] == {"x": 1}
        # from now on the real server answers
        _rpc(p, {"id": 5, "method": "tools/list"})
        assert _answer(p)["result"]["tools"][0]["description"] == "real"
    finally:
        assert p.stdin is not None
        p.stdin.close()
        p.wait(timeout=30)
    assert p.returncode == 0, p.stderr.read() if p.stderr else ""


def test_a_failed_first_start_answers_calls_with_the_failure_and_builds_once(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "tinydep-1.0-py3-none-any.whl"
    root = _mcp_plugin(tmp_path, f"tinydep @ {missing.as_uri()}")
    data = tmp_path / "data"
    procs = [_first_start(root, _env(data)) for _ in range(3)]  # as Claude Code starts its servers: at once
    texts = []
    for p in procs:
        _rpc(p, {"id": 1, "method": "tools/list"})
        assert _answer(p)["result"]["tools"]
        _rpc(p, {"id": 2, "method": "tools/call", "params": {"name": "hello", "arguments": {}}})
        res = _answer(p)["result"]
        assert res["isError"] is True
        texts.append(res["content"][0]["text"])
        assert p.stdin is not None
        p.stdin.close()
        p.wait(timeout=60)
    for t in texts:
        assert "provisioning its Python environment failed" in t and "step:  pip install" in t
        assert "fix:" in t and "package index must be reachable" in t
    [log] = data.glob("venv-*.log")
    assert log.read_text().count("== provisioning") == 1  # one build, its failure reported by all
    [failed] = data.glob("venv-*.failed.json")
    rec = json.loads(failed.read_text())
    assert rec["step"] == "pip install" and "ATTUNE_PYTHON" in rec["fix"]
