"""The drain's decisions in time (serving/platform.Shutdown), over a job loop shaped like the SDK's.

The loop stands in for runpod's JobScaler only where a test must control time: a job that runs
until told, a job-take poll held open. tests/engine/test_platform_life.py drives the real SDK
loop over the real engine; these pin what happens at each signal.
"""

from __future__ import annotations

import asyncio
import signal
from typing import Any

import pytest

from vllm_worker.serving import handler, platform
from vllm_worker.serving.state import WorkerState


class Loop:
    """What Shutdown drives: the three loops of runpod's JobScaler, the shutdown flag, the job count."""

    def __init__(self, jobs: int) -> None:
        self._shutdown_event = asyncio.Event()
        self.jobs = [asyncio.get_running_loop().create_future() for _ in range(jobs)]
        self.take_cancelled = False

        class Progress:
            def get_job_count(inner) -> int:
                return sum(not job.done() for job in self.jobs)

        self.job_progress = Progress()

    def kill_worker(self) -> None:
        self._shutdown_event.set()

    async def get_jobs(self, session: Any) -> None:
        try:
            await asyncio.Event().wait()  # a job-take long poll the platform holds open
        except asyncio.CancelledError:
            self.take_cancelled = True
            raise

    async def run_jobs(self, session: Any) -> None:
        await self._shutdown_event.wait()
        await asyncio.gather(*self.jobs)

    async def monitor_stop_signals(self, session: Any) -> None:
        await asyncio.Event().wait()


async def closed() -> None:
    return None


def run(loop_jobs: int, drain: float, signals_at: list[float], finish_jobs_at: float | None, monkeypatch: pytest.MonkeyPatch) -> tuple[Loop, list[str], float]:
    cut: list[str] = []
    monkeypatch.setattr(handler, "interrupt_running", lambda state, sentence: (cut.append(sentence), [j.set_result(None) for j in scaler.jobs if not j.done()], 0)[2])
    scaler: Loop

    async def main() -> float:
        nonlocal scaler
        scaler = Loop(loop_jobs)
        shutdown = platform.Shutdown()
        shutdown.serving(WorkerState(), drain, local_api=False)
        shutdown._scaler = scaler
        loop = asyncio.get_running_loop()
        for at in signals_at:
            loop.call_later(at, shutdown.on_signal, signal.SIGTERM, None)
        if finish_jobs_at is not None:
            loop.call_later(finish_jobs_at, lambda: [j.set_result(None) for j in scaler.jobs if not j.done()])
        started = loop.time()
        await shutdown.run_loop(scaler, closed)
        return loop.time() - started

    import runpod.http_client  # the session the SDK's loop opens

    class Session:
        async def __aenter__(self) -> "Session":
            return self

        async def __aexit__(self, *exc: object) -> None:
            return None

    monkeypatch.setattr(runpod.http_client, "AsyncClientSession", Session)
    took = asyncio.run(main())
    return scaler, cut, took


def test_an_idle_worker_ends_its_loop_at_the_signal_and_cancels_the_held_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    # drain=60: were the idle loop to wait for the drain, this test would take a minute (no clock asserted).
    scaler, cut, _ = run(0, drain=60, signals_at=[0.05], finish_jobs_at=None, monkeypatch=monkeypatch)
    assert scaler.take_cancelled and cut == []


def test_running_jobs_that_finish_within_the_drain_are_not_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    scaler, cut, _ = run(2, drain=60, signals_at=[0.05], finish_jobs_at=0.3, monkeypatch=monkeypatch)
    assert cut == [] and all(job.done() for job in scaler.jobs)


def test_jobs_still_running_at_the_drain_time_are_answered_that_the_worker_is_being_stopped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, cut, _ = run(2, drain=0.2, signals_at=[0.05], finish_jobs_at=None, monkeypatch=monkeypatch)
    assert cut == [platform.stopped_sentence(0.2)]
    assert "DRAIN_TIMEOUT=0.2 seconds" in cut[0] and "send it again" in cut[0]


def test_a_second_signal_ends_the_wait_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    _, cut, _ = run(1, drain=60, signals_at=[0.05, 0.1], finish_jobs_at=None, monkeypatch=monkeypatch)
    assert cut == [platform.stopped_sentence(60, at_once=True)]


def test_a_signal_marks_jobs_not_yet_running_as_stopped() -> None:
    state = WorkerState()
    shutdown = platform.Shutdown()
    shutdown.serving(state, 3.0, local_api=False)
    shutdown.on_signal(signal.SIGTERM, None)
    assert state.stopping == platform.new_job_sentence()


def test_a_signal_during_startup_stops_the_engine_and_ends_startup() -> None:
    stopped: list[bool] = []
    shutdown = platform.Shutdown(lambda: stopped.append(True))
    with pytest.raises(platform.Stopped) as ended:
        shutdown.on_signal(signal.SIGTERM, None)
    assert stopped == [True] and ended.value.code == 143


def test_the_answers_of_cut_jobs_are_posted_by_the_platforms_sigkill() -> None:
    """Runpod's 5 s from SIGTERM to SIGKILL: the default drain (3 s) leaves the rest to the posting."""
    assert platform.KILL_AFTER_S == 5.0
    assert platform.post_deadline(100.0, 3.0) == 105.0
    assert platform.post_deadline(100.0, 0.0) == 105.0
    assert platform.post_deadline(100.0, 4.0) == 105.0  # exactly MIN_POST_S after the cut
    # A DRAIN_TIMEOUT past the window declares a longer one: the posting still gets MIN_POST_S.
    assert platform.post_deadline(100.0, 60.0) == 100.0 + 60.0 + platform.MIN_POST_S


def test_the_wait_after_the_cut_ends_at_the_deadline_when_an_answer_cannot_be_posted(monkeypatch: pytest.MonkeyPatch) -> None:
    """A job whose answer never gets posted (its post hangs): the loop ends by the deadline, not after it.

    The deadline is moved to the signal itself, so the wait after the cut is given no time at all
    (the timeouts the drain passes to asyncio.wait are recorded: no clock is read by the test)."""
    monkeypatch.setattr(platform, "post_deadline", lambda signal_at, drain: signal_at)
    monkeypatch.setattr(handler, "interrupt_running", lambda state, sentence: 1)  # cut, but the job never ends
    timeouts: list[float | None] = []
    wait = asyncio.wait

    def recorded(tasks: Any, timeout: float | None = None, **kwargs: Any) -> Any:
        timeouts.append(timeout)
        return wait(tasks, timeout=timeout, **kwargs)

    monkeypatch.setattr(platform.asyncio, "wait", recorded)
    ended = asyncio.run(asyncio.wait_for(_loop_with_a_stuck_job(monkeypatch), timeout=30))
    assert ended == "ended"
    assert timeouts[-1] == 0.0  # the wait for the posting, after the cut
    assert timeouts[-2] is not None and 0.0 <= timeouts[-2] <= 0.1  # the drain: DRAIN_TIMEOUT from the signal


async def _loop_with_a_stuck_job(monkeypatch: pytest.MonkeyPatch) -> str:
    import runpod.http_client

    class Session:
        async def __aenter__(self) -> "Session":
            return self

        async def __aexit__(self, *exc: object) -> None:
            return None

    monkeypatch.setattr(runpod.http_client, "AsyncClientSession", Session)
    scaler = Loop(1)
    shutdown = platform.Shutdown()
    shutdown.serving(WorkerState(), 0.1, local_api=False)
    shutdown._scaler = scaler
    asyncio.get_running_loop().call_later(0.05, shutdown.on_signal, signal.SIGTERM, None)
    await shutdown.run_loop(scaler, closed)
    return "ended"


def test_the_drain_counts_from_the_signal_not_from_when_the_loop_noticed_it() -> None:
    shutdown = platform.Shutdown()
    shutdown.serving(WorkerState(), 3.0, local_api=False)
    shutdown.on_signal(signal.SIGTERM, None)
    first = shutdown.signal_at
    shutdown.on_signal(signal.SIGTERM, None)
    assert first is not None and shutdown.signal_at == first


async def test_a_job_handed_out_while_the_worker_stops_is_answered_so_and_never_reaches_the_engine() -> None:
    """A job the SDK took just before the stop: not run (the engine is going), answered to be sent again."""
    state = WorkerState(port=1)  # port 1: a job that reached for the engine would get a connection error instead
    state.mark_ready()
    state.begin_stop(platform.new_job_sentence())
    handler.configure(state)
    try:
        parts = [part async for part in handler.handler({"id": "j", "input": {"prompt": "Hi"}})]
    finally:
        await handler.close_session()
    assert parts == [{"error": platform.new_job_sentence()}]


def test_the_drain_is_counted_from_the_signal_and_the_cut_names_the_state_and_logs_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A signal that came long before the loop looked (signal_at in the past): no drain time is left."""
    import logging
    import time

    state = WorkerState()
    seen: list[Any] = []

    def interrupt(given: WorkerState, sentence: str) -> int:
        seen.append(given)
        for job in scaler.jobs:
            if not job.done():
                job.set_result(None)
        return 2

    monkeypatch.setattr(handler, "interrupt_running", interrupt)
    timeouts: list[float | None] = []
    wait = asyncio.wait

    def recorded(tasks: Any, timeout: float | None = None, **kwargs: Any) -> Any:
        timeouts.append(timeout)
        return wait(tasks, timeout=timeout, **kwargs)

    monkeypatch.setattr(platform.asyncio, "wait", recorded)
    import runpod.http_client

    class Session:
        async def __aenter__(self) -> "Session":
            return self

        async def __aexit__(self, *exc: object) -> None:
            return None

    monkeypatch.setattr(runpod.http_client, "AsyncClientSession", Session)
    scaler: Loop

    async def main() -> None:
        nonlocal scaler
        scaler = Loop(2)
        shutdown = platform.Shutdown()
        shutdown.serving(state, 3.0, local_api=False)
        shutdown._scaler = scaler
        shutdown.on_signal(signal.SIGTERM, None)
        shutdown.signal_at = time.monotonic() - 60  # the signal, a minute ago
        await shutdown.run_loop(scaler, closed)

    with caplog.at_level(logging.WARNING, logger="vllm_worker"):
        asyncio.run(main())
    assert seen == [state]
    assert timeouts[1] == 0.0  # the drain: nothing left of DRAIN_TIMEOUT
    assert [r.getMessage() for r in caplog.records] == [
        "the worker stops with jobs still running: 2 request(s) to the engine cut, each answered that it can be sent again"
    ]


def test_the_sdks_run_is_the_drain_loop_and_closes_the_session(monkeypatch: pytest.MonkeyPatch) -> None:
    from runpod.serverless.modules import rp_scale
    import runpod.http_client

    class Session:
        async def __aenter__(self) -> "Session":
            return self

        async def __aexit__(self, *exc: object) -> None:
            return None

    monkeypatch.setattr(runpod.http_client, "AsyncClientSession", Session)
    monkeypatch.setattr(rp_scale.JobScaler, "run", rp_scale.JobScaler.run)
    monkeypatch.setattr(rp_scale.JobScaler, "handle_shutdown", rp_scale.JobScaler.handle_shutdown)
    import runpod.serverless

    monkeypatch.setattr(runpod.serverless, "_signal_handler", runpod.serverless._signal_handler)
    closes: list[bool] = []
    sessions: list[Any] = []

    async def close() -> None:
        closes.append(True)

    class Done(Loop):
        async def run_jobs(self, session: Any) -> None:
            sessions.append(session)

    async def main() -> None:
        platform.patch_job_loop(None, close)
        await rp_scale.JobScaler.run(Done(0))  # type: ignore[arg-type]

    asyncio.run(main())
    assert closes == [True] and len(sessions) == 1 and isinstance(sessions[0], Session)


def test_a_signal_with_no_job_loop_yet_frees_the_engine_at_once() -> None:
    import threading

    stopped = threading.Event()
    shutdown = platform.Shutdown(stopped.set)
    shutdown.serving(WorkerState(), 3.0, local_api=False)
    shutdown.on_signal(signal.SIGTERM, None)  # no scaler: nothing can be running
    assert stopped.wait(5)
