"""A job's process tree: find it, signal it, and outlive its owner to clean it up (stdlib only).

Backends stop a job as a tree, not only as a process group: launchers such as torchrun start each rank in
a session of its own, so a signal to the job's group misses the ranks, and once their parent is killed
they are re-parented out of reach. A process is named by (pid, start time), so a reused pid is never
signalled.

This file is also shipped as text inside the Ray backend's multi-node driver (broker/backends/ray.py
embeds it), and run there as a watchdog: `python -I -c <this file's text> OWNER_PID ROOT_PID` records
ROOT's tree every half second and, once OWNER or ROOT is gone, kills every recorded process still alive.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

Known = dict[int, int]  # pid -> start time (clock ticks since boot)


def _stat(pid: int) -> tuple[int, int, str] | None:
    """(parent pid, start time, state) from /proc/PID/stat, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            text = fh.read()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()  # comm may hold spaces and ')'
    try:
        return int(fields[1]), int(fields[19]), fields[0]
    except (IndexError, ValueError):
        return None


def tree(root: int) -> Known:
    """ROOT and every live descendant of it."""
    table: dict[int, tuple[int, int, str]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return {}
    for name in names:
        if name.isdigit():
            st = _stat(int(name))
            if st is not None and st[2] != "Z":
                table[int(name)] = st
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _start, _state) in table.items():
        kids.setdefault(ppid, []).append(pid)
    found: Known = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        if pid in found or pid not in table:
            continue
        found[pid] = table[pid][1]
        todo.extend(kids.get(pid, ()))
    return found


def alive(known: Known) -> Known:
    """The recorded processes that still run as themselves (same start time, not a zombie)."""
    out: Known = {}
    for pid, start in known.items():
        st = _stat(pid)
        if st is not None and st[1] == start and st[2] != "Z":
            out[pid] = start
    return out


def signal_all(known: Known, sig: int) -> None:
    for pid in alive(known):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def stop_tree(root: int, grace_s: float, known: Known | None = None, kill_wait_s: float = 5.0) -> bool:
    """SIGTERM to ROOT's tree (with the processes in `known`, recorded earlier), SIGKILL to what is left
    after `grace_s`. True when none of them runs any more."""
    seen: Known = dict(known or {})
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, kill_wait_s)):
        seen.update(tree(root))
        signal_all(seen, sig)
        deadline = time.monotonic() + wait
        while alive(seen) and time.monotonic() < deadline:
            seen.update(tree(root))
            time.sleep(0.05)
        if not alive(seen):
            return True
    return False


def watch(owner: int, root: int, period_s: float = 0.5) -> None:
    """Record ROOT's tree while OWNER and ROOT run; then kill every recorded process still alive."""
    st = _stat(owner)
    owner_known: Known = {owner: st[1]} if st is not None else {}
    known = tree(root)
    while alive(owner_known) and root in alive(known):
        known.update(tree(root))
        time.sleep(period_s)
    known.update(tree(root))
    deadline = time.monotonic() + 30
    while alive(known) and time.monotonic() < deadline:
        signal_all(known, signal.SIGKILL)
        time.sleep(0.2)


if __name__ == "__main__":
    watch(int(sys.argv[1]), int(sys.argv[2]))
