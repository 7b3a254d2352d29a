"""Test-side handle on the scripted `vllm serve` stand-in (tests/support/fake_vllm.py).

One per worker under test: the variables that point the worker at the stand-in, what the
stand-in recorded (every launch's argv and pid, every request), and a clean-up for any
launch a failed test left running.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any, Sequence

from tests.support import fake_vllm
from tests.support.engine_env import free_port


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


class FakeEngine:
    """The scripted engine of one worker: its variables for the worker, and what it saw."""

    def __init__(self, root: Path, launches: Sequence[dict[str, Any]], record_env: Sequence[str] = ()) -> None:
        self.state_dir = root / "fake-vllm"
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.script = fake_vllm.write_script(root / "fake-vllm-script.json", launches)
        self.port = free_port()
        self.record_env = list(record_env)

    def env(self, exit_with_parent: bool = True) -> dict[str, str]:
        return {
            "VLLM_COMMAND": fake_vllm.command(),
            "VLLM_PORT": str(self.port),
            "FAKE_VLLM_SCRIPT": str(self.script),
            "FAKE_VLLM_STATE_DIR": str(self.state_dir),
            "FAKE_VLLM_RECORD_ENV": ",".join(self.record_env),
            "FAKE_VLLM_EXIT_WITH_PARENT": "1" if exit_with_parent else "0",
        }

    def launches(self) -> list[dict[str, Any]]:
        return fake_vllm.launches(self.state_dir)

    def argvs(self) -> list[list[str]]:
        return [launch["argv"] for launch in self.launches()]

    def requests(self) -> list[dict[str, Any]]:
        return fake_vllm.requests(self.state_dir)

    def kill_leftovers(self) -> None:
        for launch in self.launches():
            if alive(launch["pid"]):
                try:
                    os.kill(launch["pid"], signal.SIGKILL)
                except ProcessLookupError:
                    pass
