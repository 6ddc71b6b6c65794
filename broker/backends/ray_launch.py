"""The driver of a multi-node job on the Ray backend (runs on the cluster, inside the Ray job; stdlib and Ray only).

broker/backends/ray.py embeds this file's text in the job's script (`python - <<...`). It reserves one
placement-group bundle per node (`strategy`: STRICT_SPREAD puts each on its own node), prints the nodes
it holds and the start line (charging starts when every node is held), starts the per-node script on
each bundle's node with NODE_RANK / NNODES / MASTER_ADDR / MASTER_PORT (and torchrun's PET_* forms of
them), and copies every node's output to its own stdout (the job's log), whole lines at a time.

It ends when every node's script has ended: with 0 when all succeeded, else with the first failing
exit code, after stopping the others. SIGTERM (Ray's stop) stops every node's process tree and exits
143. A node lost under the job kills this driver with SIGKILL: the backend classifies a driver killed
by a signal as an infrastructure failure.

A node's processes are stopped as a tree, not as a process group: launchers such as torchrun put each
rank in a session of its own, so a rank outlives a signal to the node script's group (and once its
parent is killed it is re-parented, out of reach). A watchdog beside each node script records the tree
as it grows and kills every recorded process still alive when the actor's worker or the script ends.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

START_MARK = "attune-ray: job started "
NODES_MARK = "attune-ray: nodes "

# broker/backends/proctree.py's text: ray.py fills it in when it embeds this file in a job's script. The
# actor runs it for its tree helpers and starts it as each node's watchdog (`python -I -c`).
PROCTREE_SOURCE = ""


def _proctree_source() -> str:
    if PROCTREE_SOURCE:
        return PROCTREE_SOURCE
    from pathlib import Path  # run from a checkout (tests): the file beside this one

    return Path(__file__).with_name("proctree.py").read_text()


def main() -> int:
    cfg = json.loads(os.environ["ATTUNE_RAY_LAUNCH"])
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    ray.init(log_to_driver=False)
    n = int(cfg["nodes"])
    extra = {"bundle_label_selector": [cfg["selector"]] * n} if cfg.get("selector") else {}
    pg = placement_group([cfg["bundle"]] * n, strategy=cfg["strategy"], **extra)
    ray.get(pg.ready())

    @ray.remote(num_cpus=0)
    class NodeProcess:
        def __init__(self) -> None:
            self.proc: subprocess.Popen[bytes] | None = None
            self.buf: list[bytes] = []
            self.lock = threading.Lock()
            self.pump: threading.Thread | None = None

        def where(self) -> tuple[str, str]:
            return ray.util.get_node_ip_address(), ray.get_runtime_context().get_node_id()

        def free_port(self) -> int:
            import socket

            with socket.socket() as s:
                s.bind(("", 0))
                return int(s.getsockname()[1])

        def start(self, script: str, env: dict[str, str]) -> None:
            # The node script exports the job's environment: it goes in a private file (mkstemp: mode 0600),
            # never on the command line, where every user of the node could read it.
            fd, path = tempfile.mkstemp(prefix="attune-node-", suffix=".sh")
            with os.fdopen(fd, "w") as fh:
                fh.write(script)
            self.proc = subprocess.Popen(["bash", path], env={**os.environ, **env}, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
            # The node's process tree goes with this actor's worker (the job stopped, its driver lost).
            subprocess.Popen([sys.executable, "-I", "-c", _proctree_source(), str(os.getpid()), str(self.proc.pid)],
                             start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
            self.pump = threading.Thread(target=self._pump, daemon=True)
            self.pump.start()

        def _pump(self) -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for line in iter(self.proc.stdout.readline, b""):
                with self.lock:
                    self.buf.append(line)

        def read(self) -> tuple[bytes, int | None]:
            with self.lock:
                out, self.buf = b"".join(self.buf), []
            done = self.pump is not None and not self.pump.is_alive()
            return out, (self.proc.wait() if done and self.proc is not None else None)

        def stop(self, grace_s: float) -> None:
            """SIGTERM to the node script's whole process tree, SIGKILL to what is left after the grace. A script
            that has ended is not walked (its pid may be another process's by now): what it left behind is the
            watchdog's, which recorded its tree while it ran."""
            if self.proc is None or self.proc.poll() is not None:
                return
            helpers: dict[str, object] = {"__name__": "proctree"}
            exec(_proctree_source(), helpers)  # noqa: S102 - the backend's own file, shipped with this one
            helpers["stop_tree"](self.proc.pid, grace_s, kill_wait_s=2.0)  # type: ignore[operator]
            self.proc.poll()

    actors = [NodeProcess.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
        placement_group=pg, placement_group_bundle_index=i)).remote() for i in range(n)]
    where = ray.get([a.where.remote() for a in actors])
    port = ray.get(actors[0].free_port.remote())
    out = sys.stdout.buffer
    out.write(f"{NODES_MARK}{','.join(node for _, node in where)}\n".encode())
    out.write(f"{START_MARK}{time.time():.6f} pid {os.getpid()} on {n} nodes, master {where[0][0]}:{port}\n".encode())
    out.flush()

    def stop_all(*_: object) -> None:
        try:
            ray.get([a.stop.remote(1.0) for a in actors], timeout=2.5)
        finally:
            os._exit(143)

    signal.signal(signal.SIGTERM, stop_all)
    master = where[0][0]
    for i, a in enumerate(actors):
        env = {"NODE_RANK": str(i), "NNODES": str(n), "MASTER_ADDR": master, "MASTER_PORT": str(port),
               "PET_NODE_RANK": str(i), "PET_NNODES": str(n), "PET_MASTER_ADDR": master, "PET_MASTER_PORT": str(port)}
        ray.get(a.start.remote(cfg["node_script"], env))
    codes: list[int | None] = [None] * n
    while True:
        try:
            results = ray.get([a.read.remote() for a in actors])
        except Exception as exc:  # a node (or its worker) lost under the job
            out.write(f"attune-ray: a node of the job was lost: {type(exc).__name__}\n".encode())
            out.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        for i, (data, code) in enumerate(results):
            if data:
                out.write(data)
            codes[i] = code
        out.flush()
        failed = [c for c in codes if c not in (None, 0)]
        if failed:
            ray.get([a.stop.remote(3.0) for a in actors], timeout=10)
            return failed[0] if failed[0] > 0 else 128 - failed[0]
        if all(c == 0 for c in codes):
            return 0
        time.sleep(0.3)


if __name__ == "__main__":
    sys.exit(main())
