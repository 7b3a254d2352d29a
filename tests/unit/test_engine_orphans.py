"""engine/orphans.py: the worker as PID 1 waits for the engine's re-parented children, and only those.

Run in a child Python that makes itself a subreaper (prctl PR_SET_CHILD_SUBREAPER), which is what
PID 1 is to a container: orphans are re-parented to it. tests/image runs the real thing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from tests.support.worker_proc import SRC

SCRIPT = textwrap.dedent(
    """
    import ctypes, json, os, subprocess, time
    from vllm_worker.engine import orphans

    assert ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER

    # An "engine": leads its own group, starts a child in that group, and dies before it.
    engine = subprocess.Popen(["sh", "-c", "sleep 0.3 & exit 7"], start_new_session=True)
    # A probe of the worker's own, in the worker's group.
    probe = subprocess.Popen(["sh", "-c", "exit 3"])
    time.sleep(1.0)  # all three are zombies now; the sleep is re-parented here

    zombies = orphans.orphan_zombies()
    reaped = orphans.reap()
    print(json.dumps({
        "zombies": len(zombies),
        "reaped": len(reaped),
        "left": orphans.orphan_zombies(),
        "engine": engine.wait(timeout=5),
        "probe": probe.wait(timeout=5),
        "not_pid_1": orphans.start_reaper() is None,
    }))
    """
)


def test_the_engines_orphan_is_reaped_and_the_workers_own_children_keep_their_exit_status() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, env={"PYTHONPATH": str(SRC)}
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"zombies": 1, "reaped": 1, "left": [], "engine": 7, "probe": 3, "not_pid_1": True}
