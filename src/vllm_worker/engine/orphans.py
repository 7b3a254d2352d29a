"""Reap the engine's orphans when the worker is PID 1 of a container.

The image's ENTRYPOINT makes the worker PID 1, and PID 1 is where Linux re-parents every process
whose parent dies. When the engine's API server dies (killed, crashed, or its group killed by the
monitor), its own children (vLLM's engine core and CPU/GPU workers) are re-parented to the worker
and exit soon after; a process exits into a zombie until its parent waits for it, and nothing in
the worker waits for processes it never started. Each such zombie would stay in the container's
process table for the container's life, a few more at every in-place restart.

So the worker waits for exactly those: a zombie child of this process that does not lead its own
process group, in a group other than the worker's. The engine leads its own group
(`start_new_session`), and the worker's short probes run in the worker's group: both are left to
their `Popen`, whose own wait would otherwise read a status stolen by this one (`subprocess` then
reports 0 whatever the exit). Outside PID 1 (no orphans come here) nothing is started.
"""

from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger(__name__)

POLL_S = 1.0
PROC = "/proc"


def _stat(pid: str) -> tuple[str, int, int] | None:
    """(state, ppid, pgrp) of a process from /proc/PID/stat; None when it has gone."""
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError:
        return None
    # The command name is in parentheses and may hold spaces or parentheses itself.
    fields = text[text.rfind(")") + 2 :].split()
    try:
        return fields[0], int(fields[1]), int(fields[2])
    except (IndexError, ValueError):
        return None


def orphan_zombies(parent: int | None = None) -> list[int]:
    """Zombie children of `parent` (this process) that were re-parented to it: not group leaders, not in its group."""
    parent = os.getpid() if parent is None else parent
    own_group = os.getpgid(parent)
    found = []
    try:
        entries = os.listdir(PROC)
    except OSError:
        return []
    for name in entries:
        if not name.isdigit():
            continue
        stat = _stat(name)
        if stat is None:
            continue
        state, ppid, pgrp = stat
        pid = int(name)
        if state == "Z" and ppid == parent and pgrp != pid and pgrp != own_group:
            found.append(pid)
    return found


def reap() -> list[int]:
    """Wait for every orphan zombie of this process once; returns the pids reaped."""
    reaped = []
    for pid in orphan_zombies():
        try:
            done, _status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            continue
        if done == pid:
            reaped.append(pid)
    return reaped


def _loop(stop: threading.Event, interval: float) -> None:
    while not stop.wait(interval):
        try:
            pids = reap()
        except Exception:  # noqa: BLE001 - the reaper must never take the worker down
            log.exception("reaping orphaned processes failed")
            continue
        if pids:
            log.info("reaped %d orphaned engine process(es): %s", len(pids), ", ".join(map(str, sorted(pids))))


def start_reaper(interval: float = POLL_S, force: bool = False) -> threading.Event | None:
    """Reap orphans every `interval` seconds in a daemon thread when this process is PID 1 (or `force`).

    Returns the event that stops it, or None when none was started.
    """
    if os.getpid() != 1 and not force:
        return None
    stop = threading.Event()
    threading.Thread(target=_loop, args=(stop, interval), name="orphan-reaper", daemon=True).start()
    return stop
