"""The supervised `vllm serve` process: start it, know when it is ready or dead, stop it.

The worker never imports vLLM; it owns the engine the way TGI's launcher owns its
shards: the child runs in its own process group (`start_new_session`), so that
stopping it reaches everything vLLM spawned (API server, engine core, workers),
and a SIGTERM that is ignored for `grace` seconds becomes a SIGKILL to the group.
Nothing the engine started may outlive it holding GPU memory the next launch needs.

Like Ollama with its runner, the worker keeps the last lines of the child's output:
when the engine dies the only diagnosis is in its own words, and `startup_errors`
reads them from `tail()`. Every line is also copied to the worker's stdout, which is
the log a user sees.

Synchronous and thread-based on purpose: `runpod.serverless.start` runs its own
asyncio loop later, and the engine must be supervised before and during it.
"""

from __future__ import annotations

import collections
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Callable, Literal, Mapping

log = logging.getLogger(__name__)

ReadyState = Literal["ready", "exited", "timeout"]

HEALTH_POLL_INTERVAL = 0.2
# Only a 503 means dead; a /health slower than this is one unanswered probe (the monitor counts those
# towards a hang).
HEALTH_REQUEST_TIMEOUT = 2.0
# After the process is gone, how long to let the reader drain what the pipe still holds.
DRAIN_TIMEOUT = 2.0
# After SIGKILL, how long to wait for the kernel to take the group down.
KILL_TIMEOUT = 5.0

# Loopback health checks must never go through an HTTP(S)_PROXY from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


# One line of output is cut at this many bytes: an engine that prints megabytes without a newline
# must not grow the worker's memory or its log without bound.
MAX_LINE_BYTES = 16384


def command_problem(argv: list[str], env: Mapping[str, str]) -> str | None:
    """Why the engine command cannot be started at all (missing, not executable); None when it can.

    Checked before a launch so that a wrong VLLM_COMMAND is answered in milliseconds, in words
    that name it, instead of a FileNotFoundError traceback.
    """
    if not argv:
        return "it is empty"
    program = argv[0]
    if os.sep in program:
        if not os.path.exists(program):
            return f"{program!r} does not exist"
        if os.path.isdir(program) or not os.access(program, os.X_OK):
            return f"{program!r} is not an executable file"
        return None
    if shutil.which(program, path=env.get("PATH", os.defpath)) is None:
        return f"{program!r} was not found on the PATH"
    return None


def health_status(url: str, timeout: float) -> int | None:
    """The status vLLM's /health answers with (200, or 503 once its engine core is dead); None if none.

    The one probe of the engine: `Engine.wait_ready` waits for its 200, the monitor for its 503 or
    its silence.
    """
    try:
        with _OPENER.open(url, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        error.close()
        return int(error.code)
    except (urllib.error.URLError, OSError, ValueError):
        return None


def health_url(host: str, port: int) -> str:
    """URL of vLLM's /health for a server bound to `host` (a wildcard bind is reached on loopback)."""
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/health"


class Engine:
    """One `vllm serve` child process, in its own process group. Not restartable: make a new one."""

    def __init__(
        self,
        argv: list[str],
        env: Mapping[str, str],
        host: str,
        port: int,
        tail_lines: int = 400,
        on_line: Callable[[str], None] | None = None,
        log_argv: str | None = None,
    ) -> None:
        self.argv = list(argv)
        self.env = dict(env)
        # Without it the child's last lines sit in a pipe buffer when it is killed (e.g. OOM).
        self.env.setdefault("PYTHONUNBUFFERED", "1")
        self.host = host
        self.port = port
        self.on_line = on_line
        self.log_argv = log_argv
        self._tail: collections.deque[str] = collections.deque(maxlen=max(1, tail_lines))
        self._tail_lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._stop_lock = threading.Lock()
        self._stopping = False
        self._stopped = False
        # Why the command could not be spawned (OSError); the engine then counts as exited at once.
        self.spawn_error: str | None = None

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        """Spawn the child with stdout+stderr on one pipe, and start copying its output."""
        if self._proc is not None or self.spawn_error is not None:
            raise RuntimeError("Engine.start() called twice; make a new Engine to relaunch")
        try:
            self._proc = subprocess.Popen(
                self.argv,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as error:
            self.spawn_error = f"{self.argv[0] if self.argv else ''!r}: {error.strerror or error}"
            log.error("the engine command could not be started: %s", self.spawn_error)
            return
        if self.log_argv is not None:
            log.info("engine started (pid %d): %s", self._proc.pid, self.log_argv)
        else:
            log.info("engine started (pid %d)", self._proc.pid)
        self._reader = threading.Thread(target=self._read, name=f"engine-output-{self._proc.pid}", daemon=True)
        self._reader.start()

    def wait_ready(self, timeout: float) -> ReadyState:
        """Poll /health until it answers 200 ("ready"), the process exits ("exited"), or `timeout` passes.

        An exit is noticed at once (the poll sleeps in `Popen.wait`), not at the deadline.
        """
        if self.spawn_error is not None:
            return "exited"
        proc = self._require_started()
        url = health_url(self.host, self.port)
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                self._drain()
                return "exited"
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timeout"
            if health_status(url, min(HEALTH_REQUEST_TIMEOUT, remaining)) == 200:
                # A 200 from some other server on our port is not our engine being ready.
                if proc.poll() is not None:
                    self._drain()
                    return "exited"
                return "ready"
            try:
                proc.wait(timeout=max(0.0, min(HEALTH_POLL_INTERVAL, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                pass

    def healthy(self, timeout: float = HEALTH_REQUEST_TIMEOUT) -> bool:
        """One /health probe: True when the server answers 200."""
        return health_status(health_url(self.host, self.port), timeout) == 200

    def stop(self, grace: float) -> int | None:
        """SIGTERM the whole group, SIGKILL it after `grace` seconds, reap. Idempotent.

        Returns the child's exit status (negative: killed by that signal), None if never started.
        """
        with self._stop_lock:
            proc = self._proc
            if proc is None:
                return None
            if self._stopped:
                # Never signal the group id again: once the group is gone the number can be reused.
                return proc.returncode
            self._stopping = True
            pgid = proc.pid  # start_new_session: the child leads its own group
            deadline = time.monotonic() + max(0.0, grace)
            _signal_group(pgid, signal.SIGTERM)
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                gone = _wait_group_gone(pgid, deadline)
            except subprocess.TimeoutExpired:
                gone = False
            if not gone:
                log.warning("engine group %d still alive %.1fs after SIGTERM; sending SIGKILL", pgid, grace)
                _signal_group(pgid, signal.SIGKILL)
                kill_deadline = time.monotonic() + KILL_TIMEOUT
                try:
                    # A process in uninterruptible sleep (a wedged driver call) outlives even SIGKILL.
                    proc.wait(timeout=KILL_TIMEOUT)
                    gone = _wait_group_gone(pgid, kill_deadline)
                except subprocess.TimeoutExpired:
                    gone = False
                if not gone:
                    log.error("engine group %d survived SIGKILL for %.0fs", pgid, KILL_TIMEOUT)
            self._drain()
            self._stopped = True
            return proc.returncode

    def kill(self) -> int | None:
        """SIGKILL the whole group at once and reap it: for an engine that answers nothing (a hung or
        stopped process never handles SIGTERM, so a grace period would only delay the restart)."""
        return self.stop(0.0)

    def wait_exit(self, timeout: float | None = None) -> int | None:
        """Wait for the child to exit; its exit status, or None if it is still running at `timeout`."""
        proc = self._require_started()
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        self._drain()
        return code

    def watch(self, on_exit: Callable[[int], None]) -> threading.Thread:
        """Call `on_exit(returncode)` from a thread if the child exits without `stop()` having been asked.

        The callback runs after the output is drained, so `tail()` holds the child's last words.
        """
        proc = self._require_started()

        def watcher() -> None:
            code = proc.wait()
            self._drain()
            if self._stopping:
                return
            try:
                on_exit(code)
            except Exception:
                log.exception("engine exit callback failed")

        thread = threading.Thread(target=watcher, name=f"engine-watch-{proc.pid}", daemon=True)
        thread.start()
        return thread

    # -- state -----------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def returncode(self) -> int | None:
        if self.spawn_error is not None:
            return 127  # the shell's "command not found"
        return self._proc.poll() if self._proc is not None else None

    @property
    def stopping(self) -> bool:
        """True once `stop()` was called: an exit from then on is expected."""
        return self._stopping

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def tail(self) -> str:
        """The last `tail_lines` lines of the child's output (stdout and stderr interleaved)."""
        with self._tail_lock:
            return "\n".join(self._tail)

    # -- internals -------------------------------------------------------------------

    def _require_started(self) -> subprocess.Popen[bytes]:
        if self._proc is None:
            raise RuntimeError("Engine.start() has not been called")
        return self._proc

    def _read(self) -> None:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        with proc.stdout:
            while True:
                raw = proc.stdout.readline(MAX_LINE_BYTES)
                if not raw:
                    break
                if len(raw) >= MAX_LINE_BYTES and not raw.endswith(b"\n"):
                    raw += b" [cut]"
                    # Skip the rest of that line without keeping it.
                    while True:
                        rest = proc.stdout.readline(MAX_LINE_BYTES)
                        if not rest or rest.endswith(b"\n"):
                            break
                line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                with self._tail_lock:
                    self._tail.append(line)
                # Whatever goes wrong downstream, keep draining: a full pipe would block the child.
                try:
                    sys.stdout.write(line + "\n")
                    sys.stdout.flush()
                except (OSError, ValueError):
                    pass
                if self.on_line is not None:
                    try:
                        self.on_line(line)
                    except Exception:
                        log.exception("engine on_line callback failed")

    def _drain(self) -> None:
        # Processes the engine spawned can hold the pipe open after it exits; don't wait on them forever.
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join(DRAIN_TIMEOUT)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _group_alive(pgid: int) -> bool:
    """Whether any process of the group exists. Call only once the leader is reaped (Popen owns that).

    Members orphaned onto us (when the worker is PID 1 in a container) are our children: they are
    reaped here, or their zombies would keep the group "alive" forever.
    """
    while True:
        try:
            reaped, _ = os.waitpid(-pgid, os.WNOHANG)
        except ChildProcessError:
            break
        if reaped == 0:
            break
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _wait_group_gone(pgid: int, deadline: float) -> bool:
    while _group_alive(pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True
