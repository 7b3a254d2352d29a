"""Runs the worker as a process, the way a Runpod container does.

Integration tests must see what a deployed worker does: the console entry point,
the real runpod SDK job loop, the real environment parsing, SIGTERM on scale-down.
`WorkerProcess` starts ``<python> -m vllm_worker run`` with a hermetic environment
(a fresh HOME, so no developer credentials or caches leak in), keeps everything it
prints (stdout and stderr, in order) in a file and in memory so tests can assert on
logs, e.g. that a secret never appears, and stops it with SIGTERM.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Mapping, Sequence

import psutil

from tests.support.control_plane import ControlPlane

REPO_ROOT = Path(__file__).resolve().parents[2]
SRC = REPO_ROOT / "src"


def base_env(home: Path) -> dict[str, str]:
    """The minimal environment a container gives its entry point."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join([str(SRC), str(REPO_ROOT)]),
        "TMPDIR": os.environ.get("TMPDIR", "/tmp"),
    }
    return env


class WorkerProcess:
    """A worker process with captured output; a context manager that stops it on exit."""

    def __init__(
        self,
        env: Mapping[str, str],
        args: Sequence[str] = ("run",),
        control_plane: ControlPlane | None = None,
        command: Sequence[str] | None = None,
        workdir: Path | None = None,
    ) -> None:
        """`env` is applied last, over the base and the control plane's variables.

        `command` replaces ``<python> -m vllm_worker`` (then `args` follow it), so the
        same harness can run any SDK worker script.
        """
        self._workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="worker-proc-"))
        home = self._workdir / "home"
        home.mkdir(parents=True, exist_ok=True)
        full_env = base_env(home)
        if control_plane is not None:
            full_env.update(control_plane.env())
        full_env.update(env)
        self.env = full_env
        base_cmd = list(command) if command is not None else [sys.executable, "-m", "vllm_worker"]
        self.argv = [*base_cmd, *args]
        self.log_path = self._workdir / "worker.log"
        self.killed = False
        self._chunks: list[str] = []
        self._cond = threading.Condition()
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> "WorkerProcess":
        self._proc = subprocess.Popen(
            self.argv,
            env=self.env,
            cwd=self._workdir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, name="worker-log", daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        with open(self.log_path, "wb") as sink:
            for line in iter(self._proc.stdout.readline, b""):
                sink.write(line)
                sink.flush()
                with self._cond:
                    self._chunks.append(line.decode("utf-8", errors="replace"))
                    self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError("worker not started")
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def wait(self, timeout: float) -> int:
        """Wait for the worker to exit on its own; returns its exit code."""
        if self._proc is None:
            raise RuntimeError("worker not started")
        code = self._proc.wait(timeout)
        self._join_reader()
        return code

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM the worker (as the platform does) and wait; returns the exit code.

        If it has not exited within `timeout`, its process group is SIGKILLed,
        `killed` is set, and the (negative) code is returned.
        """
        if self._proc is None:
            raise RuntimeError("worker not started")
        if self._proc.poll() is None:
            try:
                self._proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.killed = True
                try:
                    os.killpg(self._proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self._proc.wait()
        self._join_reader()
        return self._proc.returncode

    def _join_reader(self) -> None:
        if self._reader is not None:
            self._reader.join(timeout=10)

    def __enter__(self) -> "WorkerProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self.stop()

    # ------------------------------------------------------------------ output

    def log(self) -> str:
        """Everything the worker printed so far (stdout and stderr interleaved)."""
        with self._cond:
            return "".join(self._chunks)

    def wait_for_log(self, pattern: str | re.Pattern[str], timeout: float = 30.0) -> re.Match[str]:
        """Block until the output matches the regex; raises TimeoutError with the output's tail.

        Fails at once if the worker exits without having printed a match.
        """
        regex = re.compile(pattern) if isinstance(pattern, str) else pattern
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                match = regex.search("".join(self._chunks))
                if match:
                    return match
                exited = self._proc is not None and self._proc.poll() is not None
                reader_done = self._reader is not None and not self._reader.is_alive()
                if exited and reader_done:
                    raise AssertionError(
                        f"worker exited ({self._proc.returncode}) without printing {regex.pattern!r}; "
                        f"output tail:\n{self._tail()}"
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{regex.pattern!r} not printed within {timeout}s; output tail:\n{self._tail()}")
                self._cond.wait(min(left, 0.5))

    def _tail(self, lines: int = 60) -> str:
        return "".join("".join(self._chunks).splitlines(keepends=True)[-lines:])


def engine_processes(worker_pid: int) -> list[psutil.Process]:
    """Everything the worker started: the engine's API server, engine core and worker processes."""
    return psutil.Process(worker_pid).children(recursive=True)


def engine_leader(worker_pid: int) -> psutil.Process:
    """The `vllm serve` process the worker started (it leads the engine's process group)."""
    [leader] = [p for p in psutil.Process(worker_pid).children() if running(p) and "serve" in p.cmdline()]
    return leader


def kill_engine_group(leader: psutil.Process) -> list[psutil.Process]:
    """kill -9 of the engine's process group, and of any descendant that left it; returns them all."""
    members = [leader, *leader.children(recursive=True)]
    os.killpg(leader.pid, signal.SIGKILL)
    for proc in members:
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    return members


def stop_with_engine(worker: WorkerProcess, timeout: float = 60.0) -> None:
    """Stop the worker (SIGTERM, as the platform does) and kill -9 any engine process it left behind."""
    leftovers = engine_processes(worker.pid) if worker.returncode is None else []
    worker.stop(timeout=timeout)
    for child in leftovers:
        if running(child):
            child.kill()


def running(proc: psutil.Process) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
