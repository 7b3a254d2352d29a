"""The runpod SDK's fitness checks never run in this worker, and what runs instead (serving.platform).

runpod 1.12's `worker.run_worker` awaits `run_fitness_checks` (imported by name from rp_fitness)
before its job loop; a failing check there is `os._exit(1)`. Pinned: the name the SDK awaits, that
the worker replaces it, and that the replacement exits nothing and says what the worker's own checks
found. tests/platform runs the SDK's production start with the checks on.
"""

from __future__ import annotations

import asyncio
import inspect
import logging

import pytest
from runpod.serverless import worker as sdk_worker
from runpod.serverless.modules import rp_fitness

from vllm_worker.serving import platform


def test_the_sdk_awaits_the_name_the_worker_replaces_before_its_job_loop() -> None:
    source = inspect.getsource(sdk_worker.run_worker)
    assert "run_fitness_checks()" in source
    assert source.index("run_fitness_checks()") < source.index("JobScaler(")
    assert sdk_worker.run_fitness_checks is rp_fitness.run_fitness_checks or getattr(
        sdk_worker.run_fitness_checks, "_vllm_worker", False
    )


def test_after_the_patch_the_sdks_checks_do_not_run_and_the_worker_says_what_its_own_found(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sdk_worker, "run_fitness_checks", rp_fitness.run_fitness_checks)
    ran: list[str] = []

    def failing_check() -> None:
        ran.append("sdk")
        raise RuntimeError("Insufficient disk space")

    monkeypatch.setattr(rp_fitness, "_fitness_checks", [failing_check])
    monkeypatch.setattr(rp_fitness, "_terminate_unhealthy", lambda code=1: ran.append(f"exit {code}"))
    platform.record_machine_checks(["memory: ok", "gpus: ok", "disk: ok", "internet: ok"])
    platform.keep_sdk_checks_off()
    platform.keep_sdk_checks_off()  # twice: still one replacement
    with caplog.at_level(logging.INFO, logger="vllm_worker"):
        asyncio.run(sdk_worker.run_fitness_checks())

    assert ran == []
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "fitness checks are not run" in lines[0]
    assert "memory: ok; gpus: ok; disk: ok; internet: ok" in lines[0]


def test_without_the_patch_the_same_check_would_exit_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the patch guards against, through the SDK's own runner (its exit captured)."""
    exits: list[int] = []
    monkeypatch.setattr(rp_fitness, "_fitness_checks", [lambda: (_ for _ in ()).throw(RuntimeError("no"))])
    monkeypatch.setattr(rp_fitness, "_terminate_unhealthy", lambda code=1: exits.append(code))
    monkeypatch.setattr(rp_fitness, "_report_unhealthy", lambda check, reason: None)
    monkeypatch.setitem(rp_fitness._registration_state, "gpu_check", True)
    monkeypatch.setitem(rp_fitness._registration_state, "system_checks", True)
    asyncio.run(rp_fitness.run_fitness_checks())
    assert exits == [1]


# ---------------------------------------------------------------- the SDK start and the signals (in process)

import signal  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from runpod.serverless.modules import rp_scale  # noqa: E402

from vllm_worker.serving.state import WorkerState  # noqa: E402


async def _handler(job: dict[str, Any]) -> Any:
    yield {"ok": True}


async def _close() -> None:
    return None


@pytest.fixture
def sdk(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """runpod.serverless.start captured; the SDK hooks restored after the test."""
    import runpod.serverless

    started: list[dict[str, Any]] = []
    monkeypatch.setattr(runpod.serverless, "start", lambda config: started.append(config))
    monkeypatch.setattr(rp_scale.JobScaler, "run", rp_scale.JobScaler.run)
    monkeypatch.setattr(rp_scale.JobScaler, "handle_shutdown", rp_scale.JobScaler.handle_shutdown)
    monkeypatch.setattr(runpod.serverless, "_signal_handler", runpod.serverless._signal_handler)
    monkeypatch.setattr(sdk_worker, "run_fitness_checks", rp_fitness.run_fitness_checks)
    monkeypatch.setattr(platform, "_config", None)
    monkeypatch.setattr(platform, "_fresh_worker_wanted", False)
    monkeypatch.setenv("RUNPOD_WEBHOOK_GET_JOB", "http://127.0.0.1:1/job-take/$ID")
    monkeypatch.delenv("RUNPOD_REALTIME_PORT", raising=False)
    return started


def test_serve_starts_the_sdk_with_the_handler_the_aggregate_stream_and_the_checks_off(
    sdk: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "argv", ["vllm-worker"])
    shutdown = platform.Shutdown()
    state = WorkerState()
    assert platform.serve(_handler, _close, 4, shutdown, state, 2.5) == 0
    [config] = sdk
    assert config["handler"] is _handler and config["return_aggregate_stream"] is True
    assert config["refresh_worker"] is False and callable(config["concurrency_modifier"])
    assert getattr(sdk_worker.run_fitness_checks, "_vllm_worker", False)
    assert getattr(rp_scale.JobScaler.run, "_vllm_worker", False)
    assert (shutdown.phase, shutdown.state, shutdown.drain_timeout) == ("jobs", state, 2.5)
    platform.ask_for_fresh_worker()
    assert config["refresh_worker"] is True


def test_a_fresh_worker_asked_for_before_the_sdk_starts_is_in_its_config(
    sdk: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "argv", ["vllm-worker"])
    platform.ask_for_fresh_worker()
    platform.serve(_handler, _close, 1, platform.Shutdown(), WorkerState(), 3.0)
    assert sdk[0]["refresh_worker"] is True


@pytest.mark.parametrize("argv,realtime", [(["w", "--rp_serve_api"], None), (["w", "--rp_serve_api=1"], None), (["w"], "8000")])
def test_the_local_api_is_told_apart_by_its_flag_or_the_realtime_port(
    sdk: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch, argv: list[str], realtime: str | None
) -> None:
    monkeypatch.setattr(sys, "argv", argv)
    if realtime:
        monkeypatch.setenv("RUNPOD_REALTIME_PORT", realtime)
    from runpod.serverless.modules import rp_fastapi

    monkeypatch.setattr(rp_fastapi.WorkerAPI, "__init__", rp_fastapi.WorkerAPI.__init__)
    shutdown = platform.Shutdown()
    platform.serve(_handler, _close, 1, shutdown, WorkerState(), 3.0)
    assert shutdown.phase == "local" and getattr(rp_fastapi.WorkerAPI.__init__, "_vllm_worker", False)


def test_serve_runs_a_local_test_job_instead_of_the_sdk(
    sdk: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(sys, "argv", ["w", "--test_input", '{"input": {"prompt": "Hi"}}'])
    ran: list[tuple[Any, ...]] = []
    monkeypatch.setattr(platform, "local_test", lambda *args: ran.append(args) or 7)
    stop = lambda grace: None  # noqa: E731
    assert platform.serve(_handler, _close, 1, platform.Shutdown(stop), WorkerState(), 3.0) == 7
    assert ran == [(_handler, {"input": {"prompt": "Hi"}, "id": "local_test"}, _close, stop)] and sdk == []


def test_a_bad_local_test_input_is_exit_code_2_with_one_line(
    sdk: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sys, "argv", ["w", "--test_input", "{nope"])
    with caplog.at_level(logging.ERROR, logger="vllm_worker"):
        assert platform.serve(_handler, _close, 1, platform.Shutdown(), WorkerState(), 3.0) == 2
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("--test_input is not JSON: ") and sdk == []


def test_a_signal_during_startup_stops_the_engine_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    stopped: list[bool] = []
    shutdown = platform.Shutdown(lambda grace: stopped.append(True))
    with caplog.at_level(logging.INFO, logger="vllm_worker"), pytest.raises(platform.Stopped) as ended:
        shutdown.on_signal(signal.SIGINT, None)
    assert ended.value.code == 130 and str(ended.value) == "signal 2 during startup"
    assert stopped == [True] and shutdown.signals == 1
    assert [r.getMessage() for r in caplog.records] == ["signal 2 during startup: stopping the engine"]


def test_with_the_local_api_a_signal_stops_the_engine_and_returns(caplog: pytest.LogCaptureFixture) -> None:
    stopped: list[bool] = []
    shutdown = platform.Shutdown(lambda grace: stopped.append(True))
    shutdown.serving(WorkerState(), 3.0, local_api=True)
    with caplog.at_level(logging.INFO, logger="vllm_worker"):
        shutdown.on_signal(signal.SIGTERM, None)
    assert stopped == [True]
    assert [r.getMessage() for r in caplog.records] == ["signal 15: the local API has stopped; stopping the engine"]


class _Progress:
    def __init__(self, count: int) -> None:
        self.count = count

    def get_job_count(self) -> int:
        return self.count


class _Scaler:
    def __init__(self, count: int) -> None:
        self.job_progress = _Progress(count)


@pytest.mark.parametrize("running", [0, 1, 2])
def test_in_the_job_loop_an_idle_worker_frees_its_engine_at_once_and_a_busy_one_waits(
    running: int, caplog: pytest.LogCaptureFixture
) -> None:
    stopped = threading.Event()
    shutdown = platform.Shutdown(lambda grace: stopped.set())
    state = WorkerState()
    shutdown.serving(state, 3.0, local_api=False)
    shutdown._scaler = _Scaler(running)
    with caplog.at_level(logging.INFO, logger="vllm_worker"):
        shutdown.on_signal(signal.SIGTERM, None)
    assert stopped.wait(5) is (running == 0)
    assert state.stopping == platform.new_job_sentence()
    assert [r.getMessage() for r in caplog.records] == [
        f"signal 15: taking no more jobs; {running} running may finish within DRAIN_TIMEOUT=3 s, then the engine stops"
    ]
    names = [t.name for t in threading.enumerate()]
    assert "engine-stop" not in names or running == 0


def test_a_second_signal_is_logged_and_wakes_the_loop_at_once(caplog: pytest.LogCaptureFixture) -> None:
    shutdown = platform.Shutdown()
    shutdown.serving(WorkerState(), 3.0, local_api=False)
    shutdown._scaler = _Scaler(1)
    shutdown.on_signal(signal.SIGTERM, None)
    with caplog.at_level(logging.INFO, logger="vllm_worker"):
        shutdown.on_signal(signal.SIGTERM, None)
    assert shutdown.signals == 2
    assert [r.getMessage() for r in caplog.records] == ["signal 15 again: stopping at once"]


def test_a_child_of_the_worker_exits_with_the_signals_code_and_stops_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    exits: list[int] = []
    stopped: list[bool] = []

    def fake_exit(code: int) -> None:
        exits.append(code)
        raise SystemExit(code)

    monkeypatch.setattr(platform.os, "_exit", fake_exit)
    shutdown = platform.Shutdown(lambda grace: stopped.append(True))
    shutdown._owner = -1
    with pytest.raises(SystemExit):
        shutdown.on_signal(signal.SIGTERM, None)
    assert exits == [143] and stopped == [] and shutdown.signals == 0


def test_install_routes_both_signals_to_the_one_handler(monkeypatch: pytest.MonkeyPatch) -> None:
    installed: dict[int, Any] = {}
    monkeypatch.setattr(platform.signal, "signal", lambda signum, handler: installed.__setitem__(signum, handler))
    shutdown = platform.Shutdown()
    shutdown.install()
    assert installed == {signal.SIGTERM: shutdown.on_signal, signal.SIGINT: shutdown.on_signal}


def test_the_sdks_shutdown_handler_reaches_the_worker_with_its_scaler(
    sdk: list[dict[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    shutdown = platform.Shutdown()
    shutdown.serving(WorkerState(), 3.0, local_api=False)
    platform.patch_job_loop(shutdown, _close)
    scaler = _Scaler(2)
    with caplog.at_level(logging.INFO, logger="vllm_worker"):
        rp_scale.JobScaler.handle_shutdown(scaler, signal.SIGTERM, None)  # type: ignore[arg-type]
    assert shutdown._scaler is scaler and shutdown.signals == 1
    assert [r.getMessage() for r in caplog.records] == [
        "signal 15: taking no more jobs; 2 running may finish within DRAIN_TIMEOUT=3 s, then the engine stops"
    ]


def test_the_local_api_is_patched_once_and_only_when_asked(sdk: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    from runpod.serverless.modules import rp_fastapi

    original = rp_fastapi.WorkerAPI.__init__
    monkeypatch.setattr(rp_fastapi.WorkerAPI, "__init__", original)
    platform.patch_job_loop(None, _close, local_api=False)
    assert rp_fastapi.WorkerAPI.__init__ is original
    platform.patch_job_loop(None, _close, local_api=True)
    patched = rp_fastapi.WorkerAPI.__init__
    platform.patch_job_loop(None, _close, local_api=True)
    assert rp_fastapi.WorkerAPI.__init__ is patched is not original


def test_the_stop_sentences_in_full() -> None:
    assert platform.new_job_sentence() == (
        "The worker is being stopped by the platform (a scale-down or a replaced worker) and takes no new jobs; "
        "this job was not run: send it again and another worker will run it."
    )
    assert platform.stopped_sentence(3.0) == (
        "The worker was stopped by the platform (a scale-down or a replaced worker) before this job finished: "
        "running jobs had DRAIN_TIMEOUT=3 seconds to finish and this one needed more. The job was not completed: "
        "send it again and another worker will run it."
    )
    assert "a second stop signal ended the wait for running jobs. The job" in platform.stopped_sentence(3.0, at_once=True)


def test_the_replacement_line_in_full(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sdk_worker, "run_fitness_checks", rp_fitness.run_fitness_checks)
    platform.record_machine_checks([])
    platform.keep_sdk_checks_off()
    with caplog.at_level(logging.INFO, logger="vllm_worker"):
        asyncio.run(sdk_worker.run_fitness_checks())
    assert [r.getMessage() for r in caplog.records] == [
        "the runpod SDK's fitness checks are not run: one failing now would exit a worker that answers jobs; "
        "the worker checked its machine at the start (no checks ran)"
    ]
    replaced = sdk_worker.run_fitness_checks
    platform.keep_sdk_checks_off()
    assert sdk_worker.run_fitness_checks is replaced


def test_the_local_test_input_edges(tmp_path: Path) -> None:
    on_platform = {"RUNPOD_WEBHOOK_GET_JOB": "http://x"}
    assert platform.local_test_input(["x", "--test_input", '{"input": 1}'], on_platform, tmp_path) == {"input": 1, "id": "local_test"}
    assert platform.local_test_input(["--test_input"], on_platform, tmp_path) is None  # a flag without its value
    assert platform.local_test_input(['--test_input={"input": "a=b"}'], {}, tmp_path) == {"input": "a=b", "id": "local_test"}
    (tmp_path / "test_input.json").write_text('{"input": "from the file"}')
    assert platform.local_test_input([], {}, tmp_path) == {"input": "from the file", "id": "local_test"}
    assert platform.local_test_input(["--rp_serve_api=1"], {}, tmp_path) is None
    assert platform.local_test_input(["--rp_serve_api"], {}, tmp_path) is None
    with pytest.raises(platform.LocalTestError) as refused:
        platform.local_test_input(["--test_input", "[]"], {}, tmp_path)
    assert str(refused.value) == 'the local test job must be a JSON object with an "input", e.g. {"input": {"prompt": "Hi"}}'


def test_the_local_test_prints_the_result_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    async def accented(job: dict[str, Any]) -> Any:
        yield "Paris, capitale de la République"

    assert platform.local_test(accented, {"id": "local_test", "input": {}}, _close) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == '{"output": ["Paris, capitale de la République"]}'


def test_serve_routes_the_signals_and_closes_the_session_through_the_sdks_run(
    sdk: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    import runpod.http_client
    import runpod.serverless

    class Session:
        async def __aenter__(self) -> "Session":
            return self

        async def __aexit__(self, *exc: object) -> None:
            return None

    monkeypatch.setattr(runpod.http_client, "AsyncClientSession", Session)
    monkeypatch.setattr(sys, "argv", ["vllm-worker"])
    closed: list[bool] = []

    async def close() -> None:
        closed.append(True)

    shutdown = platform.Shutdown()
    platform.serve(_handler, close, 1, shutdown, WorkerState(), 3.0)
    assert runpod.serverless._signal_handler == shutdown.on_signal

    class Done:
        def __init__(self) -> None:
            self._shutdown_event = asyncio.Event()

        def kill_worker(self) -> None:
            self._shutdown_event.set()

        async def get_jobs(self, session: Any) -> None:
            await asyncio.Event().wait()

        async def run_jobs(self, session: Any) -> None:
            return None

        async def monitor_stop_signals(self, session: Any) -> None:
            await asyncio.Event().wait()

    asyncio.run(rp_scale.JobScaler.run(Done()))  # type: ignore[arg-type]
    assert closed == [True]


def test_without_a_job_endpoint_serve_runs_test_input_json_from_the_working_folder(
    sdk: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("RUNPOD_WEBHOOK_GET_JOB")
    monkeypatch.setattr(sys, "argv", ["vllm-worker"])
    monkeypatch.chdir(tmp_path)
    (tmp_path / "test_input.json").write_text('{"input": {"prompt": "Hi"}}')
    ran: list[Any] = []
    monkeypatch.setattr(platform, "local_test", lambda handler, job, close, stop: ran.append(job) or 0)
    assert platform.serve(_handler, _close, 1, platform.Shutdown(), WorkerState(), 3.0) == 0
    assert ran == [{"input": {"prompt": "Hi"}, "id": "local_test"}] and sdk == []
