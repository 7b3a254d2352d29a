"""The real runpod 1.12 job loop (JobScaler.get_jobs / run_jobs / set_scale) through a change of the job limit.

The SDK's own set_scale waits until no job is in flight before it applies a new concurrency
(runpod-python PR #457 removes that): pinned here, so the day the SDK drops the wait this test says
the patch in serving.platform can go. The patched loop takes more jobs while jobs run, takes none
above a lowered limit, and answers every job.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import runpod
from runpod.serverless.modules import rp_scale
from runpod.serverless.modules.worker_state import JobsProgress

from vllm_worker.serving import intake, platform
from vllm_worker.serving.intake import Bounds
from vllm_worker.serving.state import WorkerState

# A bound on waiting for the loop to do something it must do; never a measured figure.
PATIENCE_S = 10.0


class Loop:
    """One JobScaler with a job source that always has jobs and jobs that end when the test says."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.scaler = rp_scale.JobScaler({"handler": lambda job: None, "concurrency_modifier": lambda current: self.limit})
        self.scaler.jobs_fetcher = self.fetch
        self.scaler.jobs_handler = self.handle
        self.taken: list[str] = []
        self.asked: list[int] = []
        self.running: dict[str, asyncio.Event] = {}
        self.answered: list[str] = []
        self.errors: list[BaseException] = []
        self.changed = asyncio.Event()

    async def fetch(self, session: Any, count: int) -> list[dict[str, Any]]:
        self.asked.append(count)
        jobs = [{"id": f"job-{len(self.taken) + i}", "input": {}} for i in range(count)]
        self.taken += [job["id"] for job in jobs]
        self.changed.set()
        return jobs

    async def handle(self, session: Any, config: dict[str, Any], job: dict[str, Any]) -> None:
        release = self.running[job["id"]] = asyncio.Event()
        self.changed.set()
        await release.wait()
        del self.running[job["id"]]
        self.answered.append(job["id"])
        self.changed.set()

    async def until(self, condition: Any) -> None:
        async def wait() -> None:
            while not condition():
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(wait(), PATIENCE_S)

    def release(self, count: int) -> None:
        for job_id in list(self.running)[:count]:
            self.running[job_id].set()

    def in_flight(self) -> int:
        return JobsProgress().get_job_count()


@pytest.fixture
def sdk_set_scale(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK's own set_scale, restored after the test (the patch replaces it on the class)."""
    monkeypatch.setattr(rp_scale.JobScaler, "set_scale", rp_scale.JobScaler.set_scale)
    JobsProgress().clear()


async def run_loop(loop: Loop, scenario: Any) -> None:
    take = asyncio.create_task(loop.scaler.get_jobs(None))
    work = asyncio.create_task(loop.scaler.run_jobs(None))

    def failed(task: asyncio.Task[Any]) -> None:
        if not task.cancelled() and task.exception() is not None:
            loop.errors.append(task.exception())  # type: ignore[arg-type]

    take.add_done_callback(failed)
    work.add_done_callback(failed)
    try:
        await scenario()
    finally:
        loop.scaler.kill_worker()
        loop.release(len(loop.running))
        take.cancel()
        await asyncio.wait_for(asyncio.gather(take, work, return_exceptions=True), PATIENCE_S)
        JobsProgress().clear()


def test_the_pinned_sdk_is_1_12() -> None:
    assert runpod.__version__.startswith(platform.PATCHED_RUNPOD)


def test_with_the_sdks_own_set_scale_a_limit_change_waits_for_the_worker_to_be_idle(sdk_set_scale: None) -> None:
    loop = Loop(limit=2)

    async def scenario() -> None:
        await loop.until(lambda: len(loop.running) == 2)
        loop.limit = 4
        # The SDK's loop sleeps a second per turn while jobs are in flight: give it three.
        await asyncio.sleep(3.0)
        assert loop.taken == ["job-0", "job-1"]  # drained: nothing taken while two jobs run
        loop.release(2)
        await loop.until(lambda: len(loop.running) == 4)  # applied only once the worker was idle

    asyncio.run(run_loop(loop, scenario))
    assert not loop.errors


def test_with_the_patch_a_limit_change_applies_while_jobs_run_and_every_job_is_answered(sdk_set_scale: None) -> None:
    assert platform.patch_set_scale()
    loop = Loop(limit=2)

    async def scenario() -> None:
        await loop.until(lambda: len(loop.running) == 2)
        loop.limit = 4  # up, with two jobs in flight: two more are taken and run beside them
        await loop.until(lambda: len(loop.running) == 4)
        assert loop.answered == []
        loop.limit = 1  # down, with four in flight: nothing more is taken until fewer than one are held
        loop.release(3)
        await loop.until(lambda: len(loop.answered) == 3)
        assert len(loop.taken) == 4 and loop.in_flight() == 1
        loop.release(1)
        await loop.until(lambda: len(loop.answered) == 4 and len(loop.running) == 1)  # the next one taken
        assert len(loop.taken) == 5
        loop.limit = 3
        await loop.until(lambda: len(loop.running) == 3)
        loop.release(3)
        await loop.until(lambda: len(loop.answered) == 7)

    asyncio.run(run_loop(loop, scenario))
    assert not loop.errors  # no task_done() on a queue the job was not taken from
    assert all(count >= 1 for count in loop.asked)
    assert set(loop.answered) <= set(loop.taken)


class SlowFullSleep:
    """rp_scale's `asyncio`, except that the SDK's one-second sleep of a full worker lasts a minute."""

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    @staticmethod
    async def sleep(delay: float) -> None:
        await asyncio.sleep(60.0 if delay >= 1 else delay)


def test_with_the_patch_a_full_worker_takes_the_next_job_as_soon_as_one_ends(
    sdk_set_scale: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Were the SDK's own sleep of a full worker still the way to the next take, nothing would be
    # taken within PATIENCE_S: the patched set_scale waits for room instead, and takes at once.
    monkeypatch.setattr(rp_scale, "asyncio", SlowFullSleep())
    monkeypatch.setattr(platform, "ROOM_WAIT_S", 60.0)
    assert platform.patch_set_scale()
    loop = Loop(limit=2)

    async def scenario() -> None:
        await loop.until(lambda: len(loop.running) == 2)
        loop.release(1)
        await loop.until(lambda: len(loop.running) == 2 and len(loop.taken) == 3)
        loop.limit = 3  # a limit that rises while the worker is full is taken up at once too
        await loop.until(lambda: len(loop.running) == 3)

    asyncio.run(run_loop(loop, scenario))
    assert not loop.errors


def test_with_the_patch_a_full_worker_that_is_stopping_does_not_wait_for_room(
    sdk_set_scale: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A SIGTERM (kill_worker) while the worker is full: the wait for room ends at once, so the loop
    # sees the stop at its next turn, not when the wait runs out.
    monkeypatch.setattr(platform, "ROOM_WAIT_S", 60.0)
    assert platform.patch_set_scale()
    loop = Loop(limit=2)

    async def scenario() -> None:
        await loop.until(lambda: len(loop.running) == 2)
        loop.scaler.kill_worker()
        await asyncio.wait_for(loop.scaler.set_scale(), PATIENCE_S / 5)

    asyncio.run(run_loop(loop, scenario))
    assert not loop.errors


def test_the_modifier_is_what_the_intake_allows_now_or_the_fixed_limit(sdk_set_scale: None) -> None:
    class Gate:
        adaptive = True
        now = 3
        held: Any = None

        def allowed_now(self) -> int:
            return self.now

    gate = Gate()
    modifier = platform.concurrency_modifier(gate, 30)
    assert modifier(1) == 3
    gate.now = 5  # asked again before every take: the clock and the jobs held count at each ask
    assert modifier(3) == 5 and gate.held is platform.held_jobs and gate.held() == 0
    gate.adaptive = False
    assert platform.concurrency_modifier(gate, 30)(5) == 30
    assert platform.concurrency_modifier(None, 30)(5) == 30


def test_the_jobs_finished_in_the_engine_are_those_the_handler_marked_that_the_sdk_still_holds(sdk_set_scale: None) -> None:
    from runpod.serverless.modules.worker_state import JobsProgress

    progress = JobsProgress()
    progress.clear()
    state = WorkerState()
    assert platform.finished_in_engine(state) == 0  # no set: the intake does not adapt
    state.engine_done = set()
    try:
        progress.add("a")
        progress.add("b")
        state.engine_done.update({"a", "gone"})  # "gone": answered, the SDK removed it
        assert platform.finished_in_engine(state) == 1 and state.engine_done == {"a"}
        progress.remove("a")
        assert platform.finished_in_engine(state) == 0 and state.engine_done == set()

        class Gate:
            adaptive = True
            held: Any = None
            finished: Any = None

            def allowed_now(self) -> int:
                return 1

        gate = Gate()
        fresh = WorkerState()
        platform.concurrency_modifier(gate, 30, fresh)
        assert fresh.engine_done == set()
        fresh.engine_done.add("b")
        assert gate.finished() == 1
        off = Gate()
        off.adaptive = False  # type: ignore[misc]
        platform.concurrency_modifier(off, 30, state := WorkerState())
        assert state.engine_done is None and off.finished is None
    finally:
        progress.clear()


def test_the_intake_decides_on_the_jobs_in_the_engine_and_adds_those_being_answered_back() -> None:
    # 9 held, 3 of them finished in the engine and being posted: the engine holds 6, under its room of 7.
    held, finished = [9], [3]
    gate = intake.Intake(lambda: Bounds(30), held=lambda: held[0], finished=lambda: finished[0], clock=lambda: 0.0)
    gate._limit = intake.Limit(7, "x")
    assert gate.allowed_now() == 10
    finished[0] = 12  # more than it holds (a count read at another moment): all of them, not more
    assert gate.allowed_now() == 9 + 7
    finished[0] = -1
    assert gate.allowed_now() == 9


def test_with_the_patch_a_paced_intake_lets_the_loop_take_one_job_a_pace_apart_and_start_every_job_it_took(
    sdk_set_scale: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The real Intake, its clock the test's: room for 2, then one more every 5 s up to 4. runpod's loop
    # starts a taken job only while it runs fewer than the modifier's figure, so the figure never drops
    # below the jobs held: each job taken is started at once.
    from vllm_worker.serving import intake

    monkeypatch.setattr(rp_scale, "asyncio", SlowFullSleep())
    clock = [0.0]
    gate = intake.Intake(lambda: intake.Bounds(30, 4096, 2048), clock=lambda: clock[0])
    limit = intake.Limit(2, "x", target=4, pace_s=5.0)
    gate._limit = limit
    loop = Loop(limit=0)
    loop.scaler.concurrency_modifier = platform.concurrency_modifier(gate, 30)

    async def scenario() -> None:
        await loop.until(lambda: len(loop.running) == 2)
        assert loop.taken == ["job-0", "job-1"]  # the room, at once, at 0 s
        clock[0] = 4.9
        await asyncio.sleep(0.3)
        assert len(loop.taken) == 2  # a pace counts from the last time more were allowed
        clock[0] = 5.0
        await loop.until(lambda: len(loop.running) == 3)
        clock[0] = 9.0
        await asyncio.sleep(0.3)
        assert len(loop.taken) == 3  # within the pace: nothing
        clock[0] = 10.5
        await loop.until(lambda: len(loop.running) == 4)
        clock[0] = 20.0
        await asyncio.sleep(0.3)
        assert len(loop.taken) == 4 and len(loop.running) == 4  # at the target

    asyncio.run(run_loop(loop, scenario))
    assert not loop.errors
