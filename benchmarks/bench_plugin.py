"""The plugin's start-up costs: each hook's latency, and each MCP server's cold start.

Every hook runs as a fresh process on every event (PreToolUse on every tool call), so its latency is
the agent's. This prints each hook's median wall time next to `python -I -S -c pass` on the same
interpreter (the floor any Python hook pays), in a campaign whose ledger holds --rows rows. The cases
are run side by side (round robin, one run of each per round), so a busy machine slows them alike;
the PreToolUse target is a median within 1.5x of the floor's.

A server's cold start is part of every session's start: the time from spawning the launcher
(`mcp_servers/launch.py <server>`, as .mcp.json does) to the answer to `initialize`, and to the
answer to `tools/list`, over stdio with raw JSON-RPC. With --provision it also times a first start
on a fresh data directory (building the venv from the package index: needs network): the answers
to `initialize` and `tools/list` (served from the recorded schemas while the venv builds) and the
first successful tool call (which waits for the build), then the same on the warm start.

usage: python benchmarks/bench_plugin.py [--repeat 30] [--rows 2000] [--python PATH] [--provision] [--hooks-only]
                                        [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from attune.core.ledger import Ledger  # noqa: E402
from attune.core.plugin_servers import SERVERS  # noqa: E402


def make_campaign(d: Path, rows: int) -> None:
    (d / "notes").mkdir(parents=True)
    shutil.copy(ROOT / "examples" / "campaigns" / "tinygpt-local" / "campaign.yaml", d / "campaign.yaml")
    (d / "runs" / "r0").mkdir(parents=True)
    (d / "runs" / "r0" / "log.txt").write_text("iteration 1 loss 3.0\n" * 50)
    led = Ledger(d)
    led.append("campaign_started", {"name": "bench", "spec_sha256": "0" * 64, "gpus": 2, "budget_gpu_hours": 1e6,
                                    "reserve_gpu_hours": 10.0, "calibration_runs": 5})
    for i in range(5):
        led.append("calibration_run", {"run_id": f"cal{i}", "tokens_per_s_per_gpu": 1000.0 + i})
    i = 0
    while led.read().rows[-1].seq + 1 < rows:
        rid = f"r{i}"
        led.append("launch_admitted", {"run_id": rid, "kind": "search", "expected_gpu_hours": 1.0, "lever": "mbs",
                                       "changes": {"args": {"--micro-batch-size": 2}}, "hypothesis": "h" * 80})
        led.append("run_finished", {"run_id": rid, "outcome": "ok", "charge_gpu_hours": 1.0})
        led.append("measurement", {"run_id": rid, "tokens_per_s_per_gpu": 1000.0 + i % 50, "valid": True})
        led.append("diagnosis_recorded", {"text": f"diagnosis {i}"})
        i += 1


def time_proc(cmd: list[str], stdin: str, env: dict[str, str], repeat: int,
              cpu: list[float] | None = None) -> list[float]:
    """Wall times of `repeat` runs; with `cpu`, also appends each run's CPU time (user + system)."""
    import resource

    times = []
    for _ in range(repeat):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        p = subprocess.run(cmd, input=stdin, capture_output=True, text=True, env=env)
        times.append(time.perf_counter() - t0)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        if cpu is not None:
            cpu.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
        if p.returncode != 0:
            raise RuntimeError(f"{cmd} failed: {p.stderr}")
    return times


def bench_hooks(python: str, camp: Path, repeat: int) -> list[dict[str, Any]]:
    outside = camp.parent / "unrelated"
    outside.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "ATTUNE_CAMPAIGN_DIR"}
    env["CLAUDE_PLUGIN_ROOT"] = str(ROOT)

    def payload(project: Path, **kw: Any) -> str:
        return json.dumps({"session_id": "bench", "cwd": str(project), **kw})

    cases = [
        ("python -I -S -c pass (floor)", [python, "-I", "-S", "-c", "pass"], "", camp),
        ("PreToolUse Bash allow (grep in runs/)", "pre_tool_use",
         payload(camp, tool_name="Bash", tool_input={"command": "grep -n loss runs/r0/log.txt"}), camp),
        ("PreToolUse Bash allow (a pipeline)", "pre_tool_use",
         payload(camp, tool_name="Bash", tool_input={"command": "grep loss runs/r0/log.txt | sort | uniq -c"}), camp),
        ("PreToolUse Bash deny (sort --outp ledger)", "pre_tool_use",
         payload(camp, tool_name="Bash", tool_input={"command": "sort --outp ledger.jsonl notes/x"}), camp),
        ("PreToolUse Bash deny (obfuscated sbatch)", "pre_tool_use",
         payload(camp, tool_name="Bash", tool_input={"command": "s'b'atch job.sh"}), camp),
        ("PreToolUse Edit deny (ledger)", "pre_tool_use",
         payload(camp, tool_name="Edit", tool_input={"file_path": str(camp / "ledger.jsonl")}), camp),
        ("PreToolUse MCP tool allow", "pre_tool_use",
         payload(camp, tool_name="mcp__plugin_attune_metrics__run_metrics", tool_input={"run_id": "r0"}), camp),
        ("PreToolUse outside a campaign", "pre_tool_use",
         payload(outside, tool_name="Bash", tool_input={"command": "ls"}), outside),
        ("Stop (folds the ledger, blocks)", "stop", payload(camp, stop_hook_active=False), camp),
        ("SessionStart (folds the ledger)", "session_start", payload(camp, source="startup"), camp),
    ]
    times: list[list[float]] = [[] for _ in cases]
    cpus: list[list[float]] = [[] for _ in cases]
    for _ in range(repeat):  # round robin: every case once per round
        for k, (_label, what, stdin, project) in enumerate(cases):
            cmd = what if isinstance(what, list) else [python, "-I", "-S", str(ROOT / "hooks" / f"{what}.py")]
            times[k] += time_proc(cmd, stdin, {**env, "CLAUDE_PROJECT_DIR": str(project)}, 1, cpus[k])
    floor, floor_cpu = statistics.median(times[0]), statistics.median(cpus[0])
    return [{"hook": label, "median_ms": statistics.median(t) * 1e3,
             "p90_ms": sorted(t)[int(0.9 * (len(t) - 1))] * 1e3, "vs_floor": statistics.median(t) / floor,
             "cpu_ms": statistics.median(c) * 1e3, "cpu_vs_floor": statistics.median(c) / floor_cpu if floor_cpu else 0.0}
            for (label, *_), t, c in zip(cases, times, cpus, strict=True)]


def _rpc(proc: subprocess.Popen[bytes], msg: dict[str, Any]) -> None:
    assert proc.stdin is not None
    proc.stdin.write((json.dumps(msg) + "\n").encode())
    proc.stdin.flush()


def _wait_id(proc: subprocess.Popen[bytes], want: int, timeout: float) -> dict[str, Any]:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"server exited: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
        msg = json.loads(line)
        if msg.get("id") == want:
            return msg
    raise TimeoutError


def cold_start(cmd: list[str], env: dict[str, str], cwd: Path, timeout: float = 600,
               call: tuple[str, dict[str, Any]] | None = None) -> tuple[float, float, int, float | None]:
    """(seconds to the initialize answer, to the tools/list answer, number of tools, to a successful `call`)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            cwd=cwd)
    try:
        _rpc(proc, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}})
        _wait_id(proc, 1, timeout)
        t_init = time.perf_counter() - t0
        _rpc(proc, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        _rpc(proc, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        tools = _wait_id(proc, 2, timeout)["result"]["tools"]
        t_tools = time.perf_counter() - t0
        t_call = None
        if call is not None:
            _rpc(proc, {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                        "params": {"name": call[0], "arguments": call[1]}})
            res = _wait_id(proc, 3, timeout)
            if "error" in res or res.get("result", {}).get("isError"):
                raise RuntimeError(f"the first tool call failed: {json.dumps(res)[:2000]}")
            t_call = time.perf_counter() - t0
        return t_init, t_tools, len(tools), t_call
    finally:
        proc.kill()
        proc.wait()


def bench_servers(python: str, camp: Path, repeat: int, provision: bool) -> list[dict[str, Any]]:
    out = []
    base_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    base_env["ATTUNE_CAMPAIGN_DIR"] = str(camp)
    deps_python = os.environ.get("ATTUNE_PYTHON") or sys.executable
    for server in SERVERS:
        if not (ROOT / "mcp_servers" / f"{server}_server.py").exists():
            out.append({"server": server, "missing": True})
            continue
        row: dict[str, Any] = {"server": server}
        env = {**base_env, "ATTUNE_PYTHON": deps_python}
        runs = [cold_start([python, str(ROOT / "mcp_servers" / "launch.py"), server], env, camp)
                for _ in range(repeat)]
        row["init_s"] = statistics.median(r[0] for r in runs)
        row["tools_s"] = statistics.median(r[1] for r in runs)
        row["tools"] = runs[0][2]
        out.append(row)
    if provision:
        data = Path(tempfile.mkdtemp(prefix="attune-provision-"))
        env = {k: v for k, v in base_env.items() if k != "ATTUNE_PYTHON"}
        env["CLAUDE_PLUGIN_DATA"] = str(data)
        server, call = "gate", ("list_correctness_lists", {})
        first = cold_start([python, str(ROOT / "mcp_servers" / "launch.py"), server], env, camp, timeout=1800,
                           call=call)
        warm = cold_start([python, str(ROOT / "mcp_servers" / "launch.py"), server], env, camp, call=call)
        out.append({"server": f"{server} (first start: provisioning into a fresh CLAUDE_PLUGIN_DATA)",
                    "init_s": first[0], "tools_s": first[1], "tools": first[2], "first_call_s": first[3]})
        out.append({"server": f"{server} (provisioned venv, warm start)", "init_s": warm[0], "tools_s": warm[1],
                    "tools": warm[2], "first_call_s": warm[3]})
        shutil.rmtree(data, ignore_errors=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=30, help="runs per hook (servers: repeat // 6, at least 3)")
    ap.add_argument("--rows", type=int, default=2000, help="ledger rows in the benchmark campaign")
    ap.add_argument("--python", default=sys.executable, help="interpreter the hooks run on (hooks.json: python3)")
    ap.add_argument("--provision", action="store_true", help="also time a first start that builds the venv")
    ap.add_argument("--hooks-only", action="store_true", help="time the hooks only, not the servers")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    python = os.path.realpath(shutil.which(args.python) or args.python)
    with tempfile.TemporaryDirectory() as tmp:
        camp = Path(tmp) / "campaign"
        make_campaign(camp, args.rows)
        hooks = bench_hooks(python, camp, args.repeat)
        servers = [] if args.hooks_only else bench_servers(python, camp, max(3, args.repeat // 6), args.provision)
    if args.json:
        print(json.dumps({"python": python, "rows": args.rows, "hooks": hooks, "servers": servers}, indent=2))
        return 0
    ver = subprocess.run([python, "-c", "import sys; print(sys.version.split()[0])"], capture_output=True,
                         text=True).stdout.strip()
    print(f"interpreter: {python} (Python {ver}); ledger rows: {args.rows}; runs per hook: {args.repeat}")
    floor = hooks[0]["median_ms"]
    print(f"{'hook':44} {'median ms':>10} {'p90 ms':>8} {'vs floor':>9} {'CPU ms':>7} {'vs floor':>9}")
    for h in hooks:
        print(f"{h['hook']:44} {h['median_ms']:10.1f} {h['p90_ms']:8.1f} {h['median_ms'] / floor:8.2f}x "
              f"{h['cpu_ms']:7.1f} {h['cpu_vs_floor']:8.2f}x")
    worst = max(h["vs_floor"] for h in hooks if h["hook"].startswith("PreToolUse"))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"PreToolUse: worst median {worst:.2f}x the floor (target: within 1.5x); load average {load:.1f} "
          "(a loaded machine inflates every ratio: compare the CPU columns)")
    if not servers:
        return 0
    print()
    print(f"{'MCP server cold start (launcher -> server)':58} {'initialize s':>12} {'tools/list s':>12} {'tools':>6}"
          f" {'first call s':>12}")
    for s in servers:
        if s.get("missing"):
            print(f"{s['server']:58} {'(server module not present)':>32}")
            continue
        call = "" if s.get("first_call_s") is None else f" {s['first_call_s']:12.2f}"
        print(f"{s['server']:58} {s['init_s']:12.2f} {s['tools_s']:12.2f} {s['tools']:6d}{call}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
