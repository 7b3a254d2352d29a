"""A process that holds GPU memory the way a previous engine does, for the GPU tier and its readings.

The pre-launch memory wait exists because a process that held the card (an engine that died, or the
previous container's) gives its memory back some time after it ends. On a machine with a GPU this
child takes a given amount through torch (the Python named by TORCH_PYTHON, default `python3`: the
worker's own environment has no torch), says so on its first line, holds it for a while and exits;
or it is killed. It runs in the machine's own environment (PYTHONPATH dropped), never the worker's.
"""

from __future__ import annotations

import os
import subprocess

GiB = 1 << 30

_HOLD = r"""
import os, sys, time, torch
size, hold_s = int(sys.argv[1]), float(sys.argv[2])
x = torch.empty(size, dtype=torch.uint8, device="cuda")
x.fill_(1)
torch.cuda.synchronize()
print("holding", os.getpid(), flush=True)
time.sleep(hold_s)
"""


def torch_python() -> str:
    return os.environ.get("TORCH_PYTHON", "python3")


def machine_env() -> dict[str, str]:
    """The machine's own environment, for a child that needs torch: none of the worker's packages."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    return env


def hold(size_bytes: int, hold_s: float) -> subprocess.Popen[str]:
    """Start a holder of `size_bytes` on device 0 for `hold_s` seconds; returns once it holds them."""
    child = subprocess.Popen(
        [torch_python(), "-c", _HOLD, str(size_bytes), str(hold_s)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=machine_env(),
    )
    assert child.stdout is not None and child.stderr is not None
    line = child.stdout.readline()
    if not line.startswith("holding"):
        child.kill()
        raise RuntimeError(f"the GPU memory holder did not start: {line}{child.stderr.read()[-2000:]}")
    return child
