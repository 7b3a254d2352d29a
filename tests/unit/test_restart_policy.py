"""An engine that died while serving: the restart budget, and the sentence that names why it died.

`restart_allowed` is the pure budget (three restarts in thirty minutes); `runtime_failure`
reads the tail of an engine that had started and served, on real-shaped vLLM 0.32 output:
a memory failure after a good start is its own cause with the limits that bound one step's
memory, anything else names how the process stopped and vLLM's last exception line.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

import pytest

from tests.support import vllm_texts as t
from tests.support.vllm_texts import vllm_log
from tests.support.dead_engine import DeadEngine
from vllm_worker.engine import monitor
from vllm_worker.diagnosis.verdict import Failure
from vllm_worker.config import settings as settings_mod
from vllm_worker.engine.launcher import Attempt
from vllm_worker.engine.monitor import HEALTH_POLL_S, EngineMonitor, verdict_within
from vllm_worker.engine.process import HEALTH_REQUEST_TIMEOUT
from vllm_worker.engine.ladder import Ladder
from vllm_worker.config.profile import LaunchProfile
from vllm_worker.serving.state import Death, WorkerState
from vllm_worker.engine.ladder import MAX_RESTARTS, RESTART_WINDOW_S, restart_allowed, restart_budget_phrase
from vllm_worker.diagnosis.runtime import ENGINE_DEAD_TEXT, RUNTIME_KINDS, SERVING_MARKER, runtime_failure

# --- the budget ------------------------------------------------------------------------


def test_the_budget_is_three_restarts_in_thirty_minutes() -> None:
    assert (MAX_RESTARTS, RESTART_WINDOW_S) == (3, 1800.0)
    assert restart_budget_phrase() == "3 restarts within 30 minutes"


@pytest.mark.parametrize(
    ("restarts", "allowed"),
    [
        ([], True),
        ([100.0], True),
        ([100.0, 900.0], True),
        ([100.0, 900.0, 1500.0], False),
        # A restart ages out of the window: a worker that dies once in a while always restarts.
        ([0.0, 900.0, 1500.0], True),
        ([-5000.0, -4000.0, -3000.0, 1500.0], True),
    ],
)
def test_restarts_counted_within_the_window(restarts: list[float], allowed: bool) -> None:
    assert restart_allowed(restarts, now=1800.0) is allowed


def test_a_restart_exactly_one_window_old_no_longer_counts() -> None:
    assert restart_allowed([0.0, 1.0, 2.0], now=1800.0) is True
    assert restart_allowed([0.0, 1.0, 2.0], now=1799.0) is False


def test_another_budget() -> None:
    assert restart_allowed([10.0], now=20.0, max_restarts=1, window_s=60.0) is False
    assert restart_allowed([10.0], now=80.0, max_restarts=1, window_s=60.0) is True
    assert restart_budget_phrase(1, 300.0) == "1 restart within 5 minutes"


def test_past_the_budget_the_answer_keeps_the_cause_and_names_the_budget() -> None:
    cause = runtime_failure(Failure.of("x", env={}, exit_code=-9)).message
    sentence = monitor.budget_sentence(cause, 4)
    assert sentence.startswith(cause + " ")
    assert "4 times within 30 minutes" in sentence and "3 restarts within 30 minutes" in sentence
    assert "not restarted again" in sentence and "terminate this worker" in sentence
    assert "\n" not in sentence and "GPU_MEMORY_UTILIZATION" not in sentence


# --- why a serving engine died ------------------------------------------------------------

API = "APIServer pid=1"
STARTED = "\n".join(
    [
        t.SUCCESS_GPU,
        vllm_log("Chunked prefill is enabled with max_num_batched_tokens=8192.", where="scheduler.py:308", proc=API),
        vllm_log("Using max model len 32768", where="model.py:2152", proc=API),
        vllm_log(f"{SERVING_MARKER} http://127.0.0.1:8000", where="api_server.py:2150", proc=API),
        "INFO:     Application startup complete.",
        vllm_log('127.0.0.1:51234 - "POST /v1/chat/completions HTTP/1.1" 200', proc=API),
    ]
)


def died_serving(exception_lines: str) -> str:
    """A busy-loop failure after a good start (vllm/v1/engine/core.py:1512, async_llm.py:906)."""
    core = (
        "EngineCore encountered a fatal error.\n"
        "Traceback (most recent call last):\n"
        f'  File "{t.SP}/vllm/v1/engine/core.py", line 1496, in run_engine_core\n'
        "    engine_core.run_busy_loop()\n"
        f"{exception_lines}"
    )
    api = (
        "AsyncLLM output_handler failed.\n"
        "Traceback (most recent call last):\n"
        f'  File "{t.SP}/vllm/v1/engine/async_llm.py", line 860, in output_handler\n'
        "    outputs = await engine_core.get_output_async()\n"
        f"vllm.v1.engine.exceptions.EngineDeadError: {ENGINE_DEAD_TEXT}. See stack trace (above) for the root cause."
    )
    return "\n".join([STARTED, vllm_log(core, level="ERROR"), vllm_log(api, level="ERROR", where="async_llm.py:906", proc=API)])


GPU_OOM_SERVING = died_serving(
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB. GPU 0 has a total capacity of "
    "79.19 GiB of which 1.02 GiB is free."
)
CPU_OOM_SERVING = died_serving(
    "RuntimeError: [enforce fail at alloc_cpu.cpp:121] data. DefaultCPUAllocator: can't allocate memory: "
    "you tried to allocate 6442450944 bytes. Error code 12 (Cannot allocate memory)"
)


def test_runtime_kinds_are_not_startup_kinds() -> None:
    from vllm_worker.diagnosis.startup_errors import KINDS

    assert set(RUNTIME_KINDS) == {"runtime_oom", "engine_died", "engine_hung"}
    assert not set(RUNTIME_KINDS) & set(KINDS)


def test_gpu_out_of_memory_while_serving_is_its_own_cause_with_the_limits_that_help() -> None:
    env = {"MODEL_NAME": "acme/m", "MAX_CONCURRENCY": "16", "MAX_NUM_SEQS": "128"}
    d = runtime_failure(Failure.of(GPU_OOM_SERVING, env=env, exit_code=1))
    assert d.kind == "runtime_oom" and d.facts == {"device": "GPU", "exit_code": "1"}
    assert d.evidence.startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB")
    assert d.message == (
        "The engine ran out of GPU memory while serving requests (one allocation of 3.50 GiB failed) and stopped. "
        "It had started and served with these settings, so the KV cache is not the problem: one step needed more "
        "memory than was left outside it, typically for a very long prompt or many prompts prefilled at once. "
        "To fix: lower MAX_NUM_BATCHED_TOKENS (now 8192, vLLM's choice), e.g. to 4096, to cap the prompt tokens "
        "processed in one step; or cap the prompt length your clients send, well below the 32768-token context "
        "the engine accepts; or lower MAX_NUM_SEQS (now 128) so fewer sequences share one step."
    )
    # The utilization is not what ran out: the KV cache it sizes was fine.
    assert "GPU_MEMORY_UTILIZATION" not in d.message and "utilization" not in d.message


def test_set_limits_are_quoted_as_set() -> None:
    env = {"MAX_NUM_BATCHED_TOKENS": "16384", "MAX_MODEL_LEN": "65536", "MAX_CONCURRENCY": "30"}
    d = runtime_failure(Failure.of(GPU_OOM_SERVING, env=env, exit_code=1))
    assert "lower MAX_NUM_BATCHED_TOKENS (now 16384, set), e.g. to 8192," in d.message
    assert "well below the 65536-token context" in d.message
    assert "lower MAX_NUM_SEQS (now 32)" in d.message  # the worker's default for MAX_CONCURRENCY=30


def test_limits_unknown_from_the_tail_get_a_starting_value() -> None:
    tail = "\n".join([vllm_log(f"{SERVING_MARKER} http://127.0.0.1:8000", proc=API), t.CUDA_ERROR_OOM])
    d = runtime_failure(Failure.of(tail, env={}, exit_code=1))
    assert d.kind == "runtime_oom"
    assert "set MAX_NUM_BATCHED_TOKENS (e.g. 2048)" in d.message
    assert "well below the context the engine accepts" in d.message


def test_cpu_out_of_memory_while_serving() -> None:
    d = runtime_failure(Failure.of(CPU_OOM_SERVING, env={}, exit_code=1))
    assert d.kind == "runtime_oom" and d.facts["device"] == "CPU"
    assert d.message.startswith(
        "The engine ran out of CPU memory while serving requests (one allocation of 6.0 GiB failed) and stopped."
    )


def test_startup_lines_that_mention_memory_do_not_make_a_kill_an_oom() -> None:
    # SUCCESS_GPU mentions OOM-ish wordings ("--gpu-memory-utilization", "Free memory on device"); they came before serving.
    d = runtime_failure(Failure.of(STARTED, env={}, exit_code=-9))
    assert d.kind == "engine_died"
    assert d.message == "The engine was killed by signal 9 (SIGKILL) while serving requests."
    assert d.facts == {"exit_code": "-9"}


def test_an_out_of_memory_during_startup_above_the_marker_is_not_a_runtime_oom() -> None:
    tail = "\n".join([t.TORCH_OOM, vllm_log(f"{SERVING_MARKER} http://127.0.0.1:8000", proc=API)])
    assert runtime_failure(Failure.of(tail, env={}, exit_code=-15)).kind == "engine_died"


def test_another_failure_names_the_exit_and_vllms_root_line_not_the_dead_engine_text() -> None:
    d = runtime_failure(Failure.of(died_serving("AssertionError: block table out of range"), env={}, exit_code=1))
    assert d.kind == "engine_died"
    assert d.message == (
        "The engine exited with code 1 while serving requests; "
        "its last error was: AssertionError: block table out of range."
    )


def test_alive_but_dead_is_named_by_its_health_answer() -> None:
    d = runtime_failure(Failure.of(died_serving("RuntimeError: NCCL communicator was aborted"), env={}, exit_code=None))
    # NCCL's words name a fault of the machine, as at start (issue 22: it was "engine_died").
    assert (d.kind, d.detail) == ("host_fault", "nccl")
    assert d.message == (
        "The engine reported itself dead (its /health answered 503, EngineDeadError) while serving requests "
        "because of a fault in the GPUs' communication library (NCCL), not in the settings: "
        "RuntimeError: NCCL communicator was aborted."
    )
    assert "exit_code" not in d.facts


def test_an_unknown_signal_number_is_still_named() -> None:
    assert runtime_failure(Failure.of("", env={}, exit_code=-99)).message == "The engine was killed by signal 99 while serving requests."


def test_a_secret_in_the_engines_last_words_is_masked() -> None:
    token = "hf_abcdefghijklmnop"
    tail = died_serving(f"ValueError: bad header Authorization: Bearer {token}")
    d = runtime_failure(Failure.of(tail, env={"HF_TOKEN": token}, exit_code=1))
    assert token not in d.message and token not in d.evidence
    assert "Bearer ***" in d.message


class _Launcher:
    """Records what the monitor relaunches; the worker is shutting down by then, so the attempt stops."""

    count = 1

    def __init__(self) -> None:
        self.profiles: list[object] = []

    def attempt(self, profile, record=None, tried=()):  # type: ignore[no-untyped-def]
        self.profiles.append(profile)
        return Attempt("stopped", {"launch": 2, **(record or {})})


def _death_told_by_the_monitor(tail: str, code: int, env: dict[str, str]) -> tuple[WorkerState, _Launcher]:
    """The monitor's own watch-and-recover loop over an engine that died while serving."""
    state = WorkerState(served_model_name="m")
    state.mark_ready()
    launcher = _Launcher()
    supervisor = type("Supervisor", (), {"stopping": False, "engine": None})()
    settings = settings_mod.load(env)
    profile = LaunchProfile.parse(env)
    climb = Ladder(profile, device_total_bytes=80 * 2**30)
    watcher = EngineMonitor(
        supervisor,  # type: ignore[arg-type]
        settings,
        state,
        climb,
        [{"launch": 1, "outcome": "ready", "profile": "as configured"}],
        None,
        launcher=launcher,  # type: ignore[arg-type]
    )
    engine = DeadEngine(tail, code)
    watcher._run(engine)  # type: ignore[arg-type]  # the thread's target, run here to its end
    assert engine.stopped
    return state, launcher


def test_in_flight_jobs_are_told_the_cause_and_that_the_engine_restarts() -> None:
    env = {"MODEL_NAME": "acme/m", "MAX_CONCURRENCY": "30"}
    state, launcher = _death_told_by_the_monitor(died_serving("ValueError: boom"), -9, env)
    # Running jobs read `death` once `deaths` moves; new ones wait for `ready`.
    assert state.deaths == 1 and not state.ready.is_set()
    assert state.death == Death(
        "The engine was killed by signal 9 (SIGKILL) while serving requests; its last error was: ValueError: boom. "
        "The worker is restarting the engine with the same settings; retry the request.",
        "engine_died",
        restarted=True,
    )
    assert len(launcher.profiles) == 1 and state.status["causes"] == ["engine_died"]


def test_after_an_out_of_memory_death_in_flight_jobs_are_told_the_ladders_next_step() -> None:
    env = {"MODEL_NAME": "acme/m", "MAX_CONCURRENCY": "30", "MAX_NUM_SEQS": "128"}
    state, launcher = _death_told_by_the_monitor(GPU_OOM_SERVING, 1, env)
    assert state.deaths == 1 and state.death is not None
    cause = runtime_failure(Failure.of(GPU_OOM_SERVING, env=env, exit_code=1)).message
    assert state.death == Death(f"{cause} The worker is restarting the engine with MAX_NUM_SEQS=32; retry the request.", "runtime_oom")
    assert "same settings" not in state.death.sentence and "\n" not in state.death.sentence
    assert state.status["causes"] == ["runtime_oom"] and state.status["profile"] != "as configured"


class _LiveEngine:
    """An engine process that stays alive; its /health is `port` on 127.0.0.1."""

    host, stopping, returncode = "127.0.0.1", False, None

    def __init__(self, port: int) -> None:
        self.port, self.stopped = port, False

    def watch(self, on_exit: Callable[[int], None]) -> None:
        pass

    def alive(self) -> bool:
        return True

    def tail(self) -> str:
        return died_serving("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.")

    def stop(self, grace: float) -> None:
        self.stopped = True

    def kill(self) -> None:
        self.stopped = True


def test_the_monitor_counts_each_alive_answer_of_health_and_not_the_death() -> None:
    """A job whose request failed waits for a death or for alive answers the monitor counts (serving.handler):
    each 200 of /health is one, the 503 of a dead engine core is none."""
    answers = iter([200, 200, 503])

    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(next(answers, 503))
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        state = WorkerState(served_model_name="m")
        state.mark_ready()
        env = {"MODEL_NAME": "acme/m"}
        watcher = EngineMonitor(
            type("Supervisor", (), {"stopping": False, "engine": None})(),  # type: ignore[arg-type]
            settings_mod.load(env),
            state,
            Ladder(LaunchProfile.parse(env), device_total_bytes=80 * 2**30),
            [{"launch": 1, "outcome": "ready", "profile": "as configured"}],
            None,
            launcher=_Launcher(),  # type: ignore[arg-type]
        )
        how = watcher._watch(_LiveEngine(server.server_address[1]))  # type: ignore[arg-type]
    finally:
        server.shutdown()
        server.server_close()
    assert (how, state.health_answers) == ("dead", 2)


def test_the_wait_for_a_verdict_is_the_hang_timeout_and_a_poll_with_its_checks() -> None:
    assert verdict_within(60.0) == 60.0 + HEALTH_POLL_S + 2 * HEALTH_REQUEST_TIMEOUT
