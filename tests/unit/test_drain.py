"""The drain's decisions in time (serving/platform.Shutdown), driving runpod 1.12's own job loop in-process.

A real `rp_scale.JobScaler` runs with the worker's patches (`platform.patch_job_loop`: its `run` is the
drain loop, its `handle_shutdown` the worker's); only the SDK's own hooks for the platform's side are
set on it (`jobs_fetcher`, `jobs_handler`, `stop_signals_fetcher`, the attributes its local mode reads
from the config): jobs handed out once and each running until told, then a job-take poll held open as
the platform holds it. A signal is delivered through the scaler's `handle_shutdown`, as the SDK installs
it, once the jobs run. Where a deadline is checked the drain reads the test's own clock
(`Shutdown(clock=...)`) and the timeouts it passes to asyncio.wait are recorded: no clock is measured.
tests/engine/test_platform_life.py drives the same loop over the real engine.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from typing import Any, Callable

import pytest
from runpod.serverless.modules import rp_scale
from runpod.serverless.modules.worker_state import JobsProgress

from vllm_worker.serving import handler, platform
from vllm_worker.serving.state import WorkerState

PATIENCE_S = 30  # a guard against a hang only: every wait below ends on an event


class Platform:
    """The platform's side of the SDK's loop: `jobs` handed out at the first take, each running until told
    (or cut), then the take held open; the stop channel silent."""

    def __init__(self, jobs: int) -> None:
        self.ids = [f"job-{n}" for n in range(jobs)]
        self.handed = False
        self.take_held = asyncio.Event()
        self.take_cancelled = False
        self.running: dict[str, asyncio.Future[None]] = {}
        self.all_running = asyncio.Event()
        self.answered: list[str] = []
        self.sessions: list[Any] = []

    async def take(self, session: Any, wanted: int) -> list[dict[str, Any]]:
        if not self.handed and self.ids:
            self.handed = True
            assert wanted >= len(self.ids)
            return [{"id": job_id, "input": {}} for job_id in self.ids]
        self.take_held.set()
        try:
            await asyncio.Event().wait()  # a job-take long poll the platform holds open
        except asyncio.CancelledError:
            self.take_cancelled = True
            raise
        return []

    async def handle(self, session: Any, config: dict[str, Any], job: dict[str, Any]) -> None:
        self.sessions.append(session)
        running = self.running[job["id"]] = asyncio.get_running_loop().create_future()
        if len(self.running) == len(self.ids):
            self.all_running.set()
        await running
        self.answered.append(job["id"])

    async def stops(self, session: Any) -> list[str]:
        await asyncio.Event().wait()
        return []

    def finish(self) -> None:
        for running in self.running.values():
            if not running.done():
                running.set_result(None)


@pytest.fixture(autouse=True)
def sdk_patched_for_the_test(monkeypatch: pytest.MonkeyPatch) -> Any:
    """patch_job_loop replaces names on the SDK's class and module: restored after each test."""
    import runpod.serverless

    monkeypatch.setattr(rp_scale.JobScaler, "run", rp_scale.JobScaler.run)
    monkeypatch.setattr(rp_scale.JobScaler, "handle_shutdown", rp_scale.JobScaler.handle_shutdown)
    monkeypatch.setattr(runpod.serverless, "_signal_handler", runpod.serverless._signal_handler)
    JobsProgress().clear()
    yield
    JobsProgress().clear()


def sdk_loop(side: Platform, config: dict[str, Any] | None = None) -> rp_scale.JobScaler:
    """runpod 1.12's JobScaler, taking as many jobs as the platform hands out, its hooks on `side`."""
    jobs = max(1, len(side.ids))
    scaler = rp_scale.JobScaler({"handler": None, "concurrency_modifier": lambda current: jobs, **(config or {})})
    scaler.jobs_fetcher = side.take
    scaler.jobs_handler = side.handle
    scaler.stop_signals_fetcher = side.stops
    return scaler


async def closed() -> None:
    return None


def cuts(
    monkeypatch: pytest.MonkeyPatch, side: Platform, end_jobs: bool = True, states: list[WorkerState] | None = None
) -> list[str]:
    """What handler.interrupt_running was told (the sentence each cut job is answered with; the state it was
    given into `states`); the cut ends the jobs, as the real one ends their engine requests (unless `end_jobs`
    is False: a job whose answer hangs)."""
    told: list[str] = []

    def interrupt(state: WorkerState, sentence: str) -> int:
        told.append(sentence)
        if states is not None:
            states.append(state)
        running = sum(not job.done() for job in side.running.values())
        if end_jobs:
            side.finish()
        return running

    monkeypatch.setattr(handler, "interrupt_running", interrupt)
    return told


def drain_timeouts(monkeypatch: pytest.MonkeyPatch) -> list[float | None]:
    """The timeout of each asyncio.wait the drain (serving/platform.py) makes; the SDK's own are not recorded."""
    timeouts: list[float | None] = []
    wait = asyncio.wait

    def recorded(tasks: Any, timeout: float | None = None, **kwargs: Any) -> Any:
        if sys._getframe(1).f_globals.get("__name__") == platform.__name__:
            timeouts.append(timeout)
        return wait(tasks, timeout=timeout, **kwargs)

    monkeypatch.setattr(asyncio, "wait", recorded)
    return timeouts


def serve(
    side: Platform,
    drain: float,
    when: Callable[[Platform], Any],
    then: Callable[[rp_scale.JobScaler], None],
    state: WorkerState | None = None,
    clock: Callable[[], float] | None = None,
    hang: str = "the job loop did not end",
) -> rp_scale.JobScaler:
    """Run the SDK's loop with the worker's drain; once `when(side)` is set, `then(scaler)` (the signals)."""
    shutdown = platform.Shutdown(clock=clock) if clock is not None else platform.Shutdown()
    scaler: rp_scale.JobScaler

    async def main() -> None:
        nonlocal scaler
        platform.patch_job_loop(shutdown, closed)
        shutdown.serving(state if state is not None else WorkerState(), drain, local_api=False)
        scaler = sdk_loop(side)

        async def signals() -> None:
            await when(side).wait()
            then(scaler)

        signaller = asyncio.create_task(signals())
        try:
            await asyncio.wait_for(scaler.run(), PATIENCE_S)
        except asyncio.TimeoutError:
            pytest.fail(hang)
        finally:
            signaller.cancel()

    asyncio.run(main())
    return scaler


def sigterm(scaler: rp_scale.JobScaler) -> None:
    scaler.handle_shutdown(signal.SIGTERM, None)  # the SDK installs it for SIGTERM; the patch routes it to Shutdown


def test_an_idle_worker_ends_its_loop_at_the_signal_and_cancels_the_held_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    side = Platform(0)
    cut = cuts(monkeypatch, side)
    serve(side, drain=3600, when=lambda s: s.take_held, then=sigterm, hang="the idle worker waited for the drain (an hour)")
    assert side.take_cancelled and cut == []


def test_running_jobs_that_finish_within_the_drain_are_not_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    side = Platform(2)
    cut = cuts(monkeypatch, side)

    def signal_then_finish(scaler: rp_scale.JobScaler) -> None:
        sigterm(scaler)
        asyncio.get_running_loop().call_soon(side.finish)

    serve(side, drain=3600, when=lambda s: s.all_running, then=signal_then_finish)
    assert cut == [] and sorted(side.answered) == side.ids


def test_jobs_still_running_at_the_drain_time_are_answered_that_the_worker_is_being_stopped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    side = Platform(2)
    cut = cuts(monkeypatch, side)
    serve(side, drain=0.2, when=lambda s: s.all_running, then=sigterm)
    assert cut == [platform.stopped_sentence(0.2)]
    assert "DRAIN_TIMEOUT=0.2 seconds" in cut[0] and "send it again" in cut[0]
    assert sorted(side.answered) == side.ids  # the cut jobs were answered (the SDK posts them)


def test_a_second_signal_ends_the_wait_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    side = Platform(1)
    cut = cuts(monkeypatch, side)

    def twice(scaler: rp_scale.JobScaler) -> None:
        sigterm(scaler)
        sigterm(scaler)

    serve(side, drain=3600, when=lambda s: s.all_running, then=twice, hang="the second signal did not end the drain (an hour)")
    assert cut == [platform.stopped_sentence(3600, at_once=True)]


def test_a_signal_marks_jobs_not_yet_running_as_stopped() -> None:
    state = WorkerState()
    shutdown = platform.Shutdown()
    shutdown.serving(state, 3.0, local_api=False)
    shutdown.on_signal(signal.SIGTERM, None)
    assert state.stopping == platform.new_job_sentence()


def test_a_signal_during_startup_stops_the_engine_and_ends_startup() -> None:
    stopped: list[bool] = []
    shutdown = platform.Shutdown(lambda grace: stopped.append(True))
    with pytest.raises(platform.Stopped) as ended:
        shutdown.on_signal(signal.SIGTERM, None)
    assert stopped == [True] and ended.value.code == 143


def test_the_answers_of_cut_jobs_are_posted_a_second_before_the_platforms_sigkill() -> None:
    """Runpod's 5 s from SIGTERM to SIGKILL: the default drain (3 s), 1 s for the posting, 1 s for the exit."""
    assert platform.KILL_AFTER_S == 5.0 and platform.EXIT_MARGIN_S == 1.0
    assert platform.post_deadline(100.0, 3.0) == 104.0
    assert platform.post_deadline(100.0, 0.0) == 104.0
    assert platform.post_deadline(100.0, 2.5) == 104.0  # 1.5 s for the posting
    # A DRAIN_TIMEOUT past the window declares a longer one: the posting still gets MIN_POST_S.
    assert platform.post_deadline(100.0, 4.0) == 105.0
    assert platform.post_deadline(100.0, 60.0) == 100.0 + 60.0 + platform.MIN_POST_S


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


def test_a_signal_with_no_job_loop_yet_frees_the_engine_at_once() -> None:
    import threading

    stopped = threading.Event()
    shutdown = platform.Shutdown(lambda grace: stopped.set())
    shutdown.serving(WorkerState(), 3.0, local_api=False)
    shutdown.on_signal(signal.SIGTERM, None)  # no scaler: nothing can be running
    assert stopped.wait(5)


def test_the_wait_after_the_cut_ends_at_the_deadline_when_an_answer_cannot_be_posted(monkeypatch: pytest.MonkeyPatch) -> None:
    """A job whose answer never gets posted (it is cut, but never ends): the loop ends by the deadline, not after it.

    The drain's clock stands still at the signal and the deadline is moved to the signal itself: the drain
    waits exactly DRAIN_TIMEOUT from the signal, then the wait for the posting is given no time at all."""
    monkeypatch.setattr(platform, "post_deadline", lambda signal_at, drain: signal_at)
    side = Platform(1)
    cut = cuts(monkeypatch, side, end_jobs=False)
    timeouts = drain_timeouts(monkeypatch)
    serve(side, drain=0.1, when=lambda s: s.all_running, then=sigterm, clock=lambda: 0.0)
    assert cut == [platform.stopped_sentence(0.1)] and side.answered == []
    assert timeouts == [None, 0.1, 0.0]  # the wait for the signal, the drain, the posting after the cut


def test_the_drain_is_counted_from_the_signal_and_the_cut_names_the_state_and_logs_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A signal a minute before the loop looked (the drain's clock moves on a minute after it): no drain time is
    left, so the running jobs are cut at once, with the worker's state, and one line is logged."""
    state = WorkerState()
    seen: list[WorkerState] = []
    side = Platform(2)
    told = cuts(monkeypatch, side, states=seen)
    timeouts = drain_timeouts(monkeypatch)
    now = [40.0]

    def signal_then_a_minute(scaler: rp_scale.JobScaler) -> None:
        sigterm(scaler)
        now[0] += 60

    with caplog.at_level(logging.WARNING, logger="vllm_worker"):
        serve(side, drain=3.0, when=lambda s: s.all_running, then=signal_then_a_minute, state=state, clock=lambda: now[0])
    assert seen == [state] and told == [platform.stopped_sentence(3.0)]
    assert timeouts[1] == 0.0  # the drain: nothing left of DRAIN_TIMEOUT
    assert [r.getMessage() for r in caplog.records] == [
        "the worker stops with jobs still running: 2 request(s) to the engine cut, each answered that it can be sent again"
    ]


def test_the_sdks_run_is_the_drain_loop_and_closes_the_session() -> None:
    """With no signal the loop ends as the SDK ends it (refresh_worker after a job), its jobs are given the
    SDK's session, and the worker's session is closed inside the loop."""
    import aiohttp

    closes: list[bool] = []

    async def close() -> None:
        closes.append(True)

    side = Platform(1)

    async def main() -> None:
        platform.patch_job_loop(None, close)
        scaler = sdk_loop(side, {"refresh_worker": True})
        assert rp_scale.JobScaler.run.__name__ == "run_with_drain"
        asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(finish_when_running()))
        await asyncio.wait_for(scaler.run(), PATIENCE_S)

    async def finish_when_running() -> None:
        await side.all_running.wait()
        side.finish()

    asyncio.run(main())
    assert closes == [True] and side.answered == ["job-0"]
    assert len(side.sessions) == 1 and isinstance(side.sessions[0], aiohttp.ClientSession)
