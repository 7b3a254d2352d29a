"""Engine's supervision against small real child processes (python -c scripts): cheap, and real.

Each child plays one behaviour of `vllm serve` that the worker must handle: dying at startup
with output, ignoring SIGTERM, leaving a grandchild behind, serving /health.
"""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import threading
import time

import psutil
import pytest

from tests.support.engine_env import free_port
from vllm_worker.engine.process import Engine, health_url

PY = sys.executable
# Functional deadlines, not timings: each is far above what the child needs and is only
# reached when the behaviour under test is broken.
DEADLINE = 60.0


def script(source: str) -> list[str]:
    return [PY, "-c", textwrap.dedent(source)]


def wait_for_line(lines: list[str], text: str, engine: Engine, child_may_exit: bool = False) -> None:
    """Block until `text` was printed (so handlers are installed), or fail."""
    end = time.monotonic() + DEADLINE
    while not any(text in line for line in lines):
        if (not child_may_exit and not engine.alive()) or time.monotonic() > end:
            pytest.fail(f"child never printed {text!r}; output:\n{engine.tail()}")
        time.sleep(0.02)


def group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


HEALTH_SERVER = """
    import http.server, os, sys, time
    port = int(sys.argv[1])
    ready_at = time.monotonic() + float(sys.argv[2])

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            ok = self.path == "/health" and time.monotonic() >= ready_at
            self.send_response(200 if ok else 503)
            self.end_headers()
        def log_message(self, *a):
            pass

    server = http.server.HTTPServer(("127.0.0.1", port), H)
    print("listening", flush=True)
    server.serve_forever()
"""


def test_exit_at_startup_is_reported_at_once_with_its_output(capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[str] = []
    engine = Engine(
        script("""
            import sys
            print("loading model")
            print("ValueError: no good", file=sys.stderr)
            sys.exit(3)
        """),
        os.environ,
        "127.0.0.1",
        free_port(),
        on_line=seen.append,
    )
    engine.start()

    assert engine.wait_ready(DEADLINE) == "exited"
    assert engine.returncode == 3
    assert not engine.alive()
    assert engine.tail() == "loading model\nValueError: no good"
    assert seen == ["loading model", "ValueError: no good"]
    # Every line also reaches the worker's own stdout, which is the user's log.
    assert "loading model\nValueError: no good\n" in capsys.readouterr().out


def test_tail_keeps_only_the_last_lines() -> None:
    engine = Engine(script("for i in range(50): print(f'line {i}')"), os.environ, "127.0.0.1", free_port(), tail_lines=5)
    engine.start()
    assert engine.wait_exit(DEADLINE) == 0
    assert engine.tail().splitlines() == [f"line {i}" for i in range(45, 50)]


def test_undecodable_output_does_not_stop_the_reader() -> None:
    engine = Engine(
        script("import sys; sys.stdout.buffer.write(b'bad \\xff\\xfe bytes\\nafter\\n')"),
        os.environ,
        "127.0.0.1",
        free_port(),
    )
    engine.start()
    assert engine.wait_exit(DEADLINE) == 0
    assert engine.tail() == "bad \ufffd\ufffd bytes\nafter"


def test_child_gets_the_given_env_unbuffered() -> None:
    env = {"PATH": os.environ.get("PATH", ""), "ENGINE_PROBE": "42"}
    engine = Engine(
        script("import os; print(os.environ['ENGINE_PROBE'], os.environ.get('PYTHONUNBUFFERED'), os.environ.get('HOME'))"),
        env,
        "127.0.0.1",
        free_port(),
    )
    engine.start()
    assert engine.wait_exit(DEADLINE) == 0
    assert engine.tail() == "42 1 None"


def test_ready_when_health_answers_200_and_stop_terminates() -> None:
    port = free_port()
    engine = Engine(script(HEALTH_SERVER) + [str(port), "0.5"], os.environ, "127.0.0.1", port)
    engine.start()

    assert engine.wait_ready(DEADLINE) == "ready"
    assert engine.alive()
    assert engine.healthy()

    assert engine.stop(grace=DEADLINE) == -signal.SIGTERM
    assert not engine.alive()
    assert group_gone(engine.pid or 0)


def test_health_check_ignores_proxy_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    # A proxy from the container's environment must not swallow loopback health checks.
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    port = free_port()
    engine = Engine(script(HEALTH_SERVER) + [str(port), "0"], os.environ, "127.0.0.1", port)
    engine.start()
    try:
        assert engine.wait_ready(DEADLINE) == "ready"
    finally:
        engine.stop(grace=DEADLINE)


def test_timeout_while_alive_and_not_healthy() -> None:
    port = free_port()
    engine = Engine(script("import time; print('booting', flush=True); time.sleep(600)"), os.environ, "127.0.0.1", port)
    engine.start()
    try:
        assert engine.wait_ready(0.5) == "timeout"
        assert engine.alive()
    finally:
        engine.stop(grace=DEADLINE)


def test_sigterm_ignored_means_sigkill_after_grace() -> None:
    lines: list[str] = []
    engine = Engine(
        script("""
            import signal, time
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            print("ignoring SIGTERM", flush=True)
            time.sleep(600)
        """),
        os.environ,
        "127.0.0.1",
        free_port(),
        on_line=lines.append,
    )
    engine.start()
    wait_for_line(lines, "ignoring SIGTERM", engine)

    assert engine.stop(grace=0.5) == -signal.SIGKILL
    assert group_gone(engine.pid or 0)


def test_stop_reaches_a_grandchild_that_outlives_the_child() -> None:
    # vLLM's engine core and workers are grandchildren; one stuck in a kernel ignores SIGTERM
    # while the API server exits. The group must still go, or it keeps the GPU memory.
    lines: list[str] = []
    engine = Engine(
        script("""
            import subprocess, sys, time
            grandchild = subprocess.Popen([sys.executable, "-c",
                "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('gc ready', flush=True); time.sleep(600)"])
            print("grandchild", grandchild.pid, flush=True)
            time.sleep(600)
        """),
        os.environ,
        "127.0.0.1",
        free_port(),
        on_line=lines.append,
    )
    engine.start()
    wait_for_line(lines, "gc ready", engine)
    grandchild = int(next(line.split()[1] for line in lines if line.startswith("grandchild")))
    assert os.getpgid(grandchild) == engine.pid

    assert engine.stop(grace=1.0) == -signal.SIGTERM
    assert gone(grandchild)
    assert group_gone(engine.pid or 0)


def test_stop_cleans_up_a_group_whose_leader_already_exited() -> None:
    lines: list[str] = []
    engine = Engine(
        script("""
            import subprocess, sys
            grandchild = subprocess.Popen([sys.executable, "-c", "import time; print('gc ready', flush=True); time.sleep(600)"])
            print("grandchild", grandchild.pid, flush=True)
        """),
        os.environ,
        "127.0.0.1",
        free_port(),
        on_line=lines.append,
    )
    engine.start()
    wait_for_line(lines, "gc ready", engine, child_may_exit=True)
    assert engine.wait_exit(DEADLINE) == 0
    grandchild = int(next(line.split()[1] for line in lines if line.startswith("grandchild")))
    assert not gone(grandchild)

    assert engine.stop(grace=DEADLINE) == 0
    assert gone(grandchild)
    assert group_gone(engine.pid or 0)


def test_stop_is_idempotent_and_safe_before_start() -> None:
    engine = Engine(script("import time; time.sleep(600)"), os.environ, "127.0.0.1", free_port())
    assert engine.stop(grace=1.0) is None
    assert engine.returncode is None and engine.pid is None and not engine.alive()
    engine.start()
    assert engine.stop(grace=DEADLINE) == -signal.SIGTERM
    assert engine.stop(grace=DEADLINE) == -signal.SIGTERM


def test_start_twice_is_refused() -> None:
    engine = Engine(script("pass"), os.environ, "127.0.0.1", free_port())
    engine.start()
    with pytest.raises(RuntimeError):
        engine.start()
    engine.stop(grace=DEADLINE)


def test_watch_reports_an_unexpected_exit_with_the_output_drained() -> None:
    done = threading.Event()
    reported: list[tuple[int, str]] = []
    lines: list[str] = []
    engine = Engine(
        script("""
            import sys, time
            print("serving", flush=True)
            time.sleep(0.2)
            print("RuntimeError: engine core died", flush=True)
            sys.exit(1)
        """),
        os.environ,
        "127.0.0.1",
        free_port(),
        on_line=lines.append,
    )

    def on_exit(code: int) -> None:
        reported.append((code, engine.tail()))
        done.set()

    engine.start()
    engine.watch(on_exit)
    assert done.wait(DEADLINE)
    assert reported == [(1, "serving\nRuntimeError: engine core died")]


def test_watch_is_silent_when_the_exit_was_asked_for() -> None:
    called: list[int] = []
    engine = Engine(script("import time; time.sleep(600)"), os.environ, "127.0.0.1", free_port())
    engine.start()
    watcher = engine.watch(called.append)
    assert engine.stop(grace=DEADLINE) == -signal.SIGTERM
    watcher.join(DEADLINE)
    assert not watcher.is_alive()
    assert called == []


@pytest.mark.parametrize(
    ("host", "url"),
    [
        ("127.0.0.1", "http://127.0.0.1:8000/health"),
        ("0.0.0.0", "http://127.0.0.1:8000/health"),
        ("", "http://127.0.0.1:8000/health"),
        ("::", "http://[::1]:8000/health"),
        ("::1", "http://[::1]:8000/health"),
        ("localhost", "http://localhost:8000/health"),
    ],
)
def test_health_url_reaches_a_wildcard_bind_on_loopback(host: str, url: str) -> None:
    assert health_url(host, 8000) == url
