"""How many jobs the worker takes now (serving.intake): the pure decision, and the holder the job loop reads."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_worker.serving import engine_load, intake
from vllm_worker.serving.intake import Bounds, EngineNow, Limit

BOUNDS = Bounds(max_concurrency=30, kv_tokens=4096, max_model_len=2048)

reads = st.builds(
    EngineNow,
    running=st.integers(0, 40),
    waiting=st.integers(0, 40),
    kv_cache_usage=st.floats(0.0, 1.0),
    preempted=st.integers(0, 3),
    request_tokens=st.one_of(st.none(), st.floats(1.0, 5000.0)),
)
bounds = st.builds(
    Bounds,
    max_concurrency=st.integers(1, 64),
    kv_tokens=st.one_of(st.none(), st.integers(1, 1_000_000)),
    max_model_len=st.one_of(st.none(), st.integers(1, 32768)),
)
steps = st.lists(st.tuples(st.one_of(st.none(), reads), st.integers(0, 64), st.floats(0.1, 10.0)), max_size=40)
# An engine that always gives figures (None is DISABLE_LOG_STATS: MAX_CONCURRENCY, tested on its own).
figured = st.lists(st.tuples(reads, st.integers(0, 64), st.floats(0.1, 10.0)), max_size=40)


def run(start: Limit, sequence: list, b: Bounds) -> list[tuple[Limit, EngineNow | None, int, float]]:
    """Every decision over a sequence of (read, held, seconds since the previous read)."""
    at, limit, out = 0.0, start, []
    for now, held, dt in sequence:
        at += dt
        limit = intake.decide(limit, now, held, b, at)
        out.append((limit, now, held, at))
    return out


@given(bounds, steps)
def test_the_limit_stays_between_one_and_max_concurrency(b: Bounds, sequence: list) -> None:
    start = intake.first(b)
    assert 1 <= start.value <= max(1, b.max_concurrency)
    for limit, _, _, _ in run(start, sequence, b):
        assert 1 <= limit.value <= max(1, b.max_concurrency)


@given(bounds, figured)
def test_a_full_engine_never_raises_the_limit(b: Bounds, sequence: list) -> None:
    previous = intake.first(b)
    waited = False
    for limit, now, _, _ in run(previous, sequence, b):
        full = now is not None and (now.preempted > 0 or now.waiting > 0)
        if full:
            assert limit.value <= previous.value
            if now.preempted > 0:
                # At once at least one fewer, at most the preempted count fewer, never below what runs.
                assert limit.value <= max(1, previous.value - 1)
                assert previous.value - limit.value <= max(1, now.preempted)
                assert limit.value >= min(previous.value - 1, now.running)
            elif waited:
                # At once down to what the engine runs +1, unless it was already lower.
                assert limit.value == previous.value or limit.value <= max(1, now.running + 1)
        waited = now is not None and now.waiting > 0
        previous = limit


@given(bounds, figured)
def test_the_limit_grows_at_most_every_grow_every_s_and_never_soon_after_a_drop(b: Bounds, sequence: list) -> None:
    start = intake.first(b)
    last_change: float | None = None
    last_drop: float | None = None
    value = start.value
    for limit, now, held, at in run(start, sequence, b):
        if limit.value > value:
            assert now is not None and now.waiting == 0 and now.preempted == 0
            assert held >= value  # only a worker using its whole limit asks for more
            assert last_change is None or at - last_change >= intake.GROW_EVERY_S
            assert last_drop is None or at - last_drop >= intake.HOLD_S
            assert limit.value <= 2 * value  # at most doubling
        if limit.value != value:
            last_change = at
        if limit.value < value:
            last_drop = at
        value = limit.value


def test_one_read_with_a_request_waiting_is_not_a_full_engine() -> None:
    start = Limit(8, "x")
    blip = EngineNow(running=7, waiting=1, kv_cache_usage=0.3)
    once = intake.decide(start, blip, 8, BOUNDS, 10.0)
    assert once.value == 8
    twice = intake.decide(once, blip, 8, BOUNDS, 11.0)
    assert twice.value == 8 and "wait inside the engine" in twice.reason
    crowded = EngineNow(running=4, waiting=4, kv_cache_usage=0.97)
    assert intake.decide(twice, crowded, 8, BOUNDS, 12.0).value == 5


def test_a_preemption_lowers_the_limit_by_the_preempted_count_never_below_what_runs() -> None:
    now = EngineNow(running=5, waiting=3, kv_cache_usage=0.99, preempted=2)
    limit = intake.decide(Limit(8, "x"), now, 8, BOUNDS, 3.0)
    assert limit.value == 6
    assert "preempted 2" in limit.reason and "5 running, 3 waiting, KV cache 99% used" in limit.reason
    assert limit.reason.endswith(": 2 fewer")
    assert intake.decide(Limit(8, "x"), EngineNow(running=6, waiting=4, kv_cache_usage=1.0, preempted=4), 8, BOUNDS, 3.0).value == 6


def test_a_preemption_read_just_after_a_batch_ended_does_not_empty_the_engine() -> None:
    # Measured: seven started together, one preempted, and the read came as five of them had ended.
    # Cut to what ran at that read (2), the engine ran 1 to 4 for 15 s with 24 jobs queued.
    now = EngineNow(running=2, waiting=0, kv_cache_usage=0.16, preempted=1)
    limit = intake.decide(Limit(7, "x"), now, 7, BOUNDS, 3.0)
    assert limit.value == 6 and limit.ceiling == 6


def test_an_idle_or_part_used_worker_does_not_ask_for_more() -> None:
    roomy = EngineNow(running=2, waiting=0, kv_cache_usage=0.1, request_tokens=100.0)
    assert intake.decide(Limit(4, "x"), roomy, 2, BOUNDS, 100.0).value == 4


def test_growth_is_by_the_requests_the_kv_cache_holds_to_their_end() -> None:
    # 4096 tokens; 3 running requests of 400 tokens will need 1200: room for 7 more.
    now = EngineNow(running=3, waiting=0, kv_cache_usage=0.1, request_tokens=400.0)
    assert intake.decide(Limit(3, "x"), now, 3, BOUNDS, 100.0).value == 6  # at most doubling
    assert intake.decide(Limit(8, "x"), now, 8, BOUNDS, 100.0).value == 10  # 5 taken, not yet running: room for 2
    # Past what the engine ran when it was last full (+1): one at a time.
    assert intake.decide(Limit(3, "x", ceiling=3), now, 3, BOUNDS, 100.0).value == 4
    assert intake.decide(Limit(3, "x", ceiling=4), now, 3, BOUNDS, 100.0).value == 5
    # What they hold now counts when it is more than their length: 60 % used leaves room for 4.
    assert intake.decide(Limit(3, "x"), replace(now, kv_cache_usage=0.6), 3, BOUNDS, 100.0).value == 6
    # No room to their end: one more every PROBE_EVERY_S while the engine copes.
    full = Limit(10, "x", changed_at=95.0)
    assert intake.decide(full, now, 10, BOUNDS, 100.0).value == 10
    assert intake.decide(full, now, 10, BOUNDS, 95.0 + intake.PROBE_EVERY_S).value == 11
    # Before any request finished the length is MAX_MODEL_LEN: 3 of 2048 tokens do not fit in 4096.
    early = EngineNow(running=3, waiting=0, kv_cache_usage=0.3)
    assert intake.decide(Limit(3, "x", changed_at=99.0), early, 3, BOUNDS, 100.0).value == 3
    # No KV cache size: one more at a time.
    assert intake.decide(Limit(3, "x"), early, 3, Bounds(30), 100.0).value == 4


def test_the_first_limit_is_what_the_kv_cache_holds_at_max_model_len() -> None:
    assert intake.first(BOUNDS).value == 3
    assert intake.first(Bounds(30, kv_tokens=10_000_000, max_model_len=4096)).value == 30
    assert intake.first(Bounds(30)).value == 30
    assert intake.first(Bounds(30, kv_tokens=100, max_model_len=2048)).value == 1


def test_without_figures_the_worker_takes_up_to_max_concurrency() -> None:
    limit = intake.decide(Limit(3, "x"), None, 3, BOUNDS, 1.0)
    assert limit.value == 30 and limit.reason == intake.NO_FIGURES_REASON


class Engine:
    """A toy engine: runs `runs` requests at once, the rest wait; each running one holds `kv_per_running`
    tokens (`length` is a whole request's)."""

    def __init__(self, runs: int, length: float, kv_per_running: float) -> None:
        self.runs, self.length, self.kv_per_running = runs, length, kv_per_running

    def read(self, held: int) -> EngineNow:
        running = min(held, self.runs)
        usage = min(1.0, running * self.kv_per_running / 4096)
        return EngineNow(running, held - running, usage, 0, request_tokens=self.length)


def settle(engine: Engine, top: int) -> tuple[list[int], Limit]:
    """400 reads a second apart with a platform queue that never empties; the taken-not-running counts
    of the last 100, and the last limit."""
    b = Bounds(top, kv_tokens=4096, max_model_len=2048)
    limit, held, spare = intake.first(b), 0, []
    for second in range(400):
        held = max(held, limit.value)  # the worker fills its limit
        now = engine.read(held)
        limit = intake.decide(limit, now, held, b, float(second))
        held = min(held, max(limit.value, now.running))  # jobs finish; the worker takes no more than its limit
        if second >= 300:
            spare.append(held - now.running)
    return spare, limit


@settings(max_examples=50)
@given(st.integers(2, 24), st.integers(1, 30))
def test_with_a_backlog_and_figures_that_hold_the_worker_uses_the_engine(runs: int, top: int) -> None:
    # Requests half-way through on average: the engine runs twice what fits at full length.
    spare, limit = settle(Engine(runs, length=2 * 4096 / runs, kv_per_running=4096 / runs), top)
    assert max(spare) <= 2
    assert limit.value >= min(top, runs - 2)


@settings(max_examples=50)
@given(st.integers(1, 12), st.integers(1, 30), st.floats(0.1, 0.9))
def test_with_a_backlog_and_an_engine_fuller_than_it_looks_at_most_two_taken_jobs_wait(
    runs: int, top: int, kv_share: float
) -> None:
    # The KV figures say there is room, but the engine runs no more than `runs`: its waiting queue says so.
    spare, limit = settle(Engine(runs, length=4096 / (4 * runs), kv_per_running=kv_share * 4096 / (4 * runs)), top)
    assert sorted(spare)[94] <= 2  # the 95th of 100
    assert limit.value >= min(top, runs)


def test_the_holder_logs_a_change_at_most_every_log_every_s(caplog: pytest.LogCaptureFixture) -> None:
    gate = intake.Intake(lambda: BOUNDS, held=lambda: 8)
    full = EngineNow(running=2, waiting=6, kv_cache_usage=0.99, preempted=1)
    with caplog.at_level(logging.INFO, logger="vllm_worker"):
        gate.observe(full, 1.0)
        gate.observe(EngineNow(running=1, waiting=6, kv_cache_usage=0.99, preempted=1), 2.0)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and lines[0].startswith("taking up to 2 job(s) at once (was 3): the engine preempted 1")
    assert gate.value == 1
    status = gate.status()
    assert status["limit"] == 1 and status["left_in_platform_queue"] == 29 and status["engine"]["held_by_worker"] == 8


def test_off_the_worker_takes_max_concurrency_whatever_the_engine_says() -> None:
    gate = intake.Intake(lambda: BOUNDS, adaptive=False)
    gate.observe(EngineNow(running=1, waiting=20, kv_cache_usage=1.0, preempted=4), 1.0)
    assert gate.value == 30 and gate.status()["reason"] == intake.OFF_REASON


def test_the_engine_figures_give_preemptions_since_the_last_read_and_the_finished_requests_length() -> None:
    text = (
        'vllm:num_requests_running{engine="0"} 3\nvllm:num_requests_waiting{engine="0"} 1\n'
        'vllm:kv_cache_usage_perc{engine="0"} 0.5\nvllm:num_preemptions_total{engine="0"} 4\n'
        'vllm:request_prompt_tokens_sum{engine="0"} 100\nvllm:request_prompt_tokens_count{engine="0"} 4\n'
        'vllm:request_generation_tokens_sum{engine="0"} 2300\nvllm:request_generation_tokens_count{engine="0"} 4\n'
    )
    before = engine_load.parse(text.replace("total{engine=\"0\"} 4", "total{engine=\"0\"} 1"), at=1.0)
    now = engine_load.engine_now(engine_load.parse(text, at=2.0), before)
    assert now == EngineNow(running=3, waiting=1, kv_cache_usage=0.5, preempted=3, request_tokens=600.0)
    assert engine_load.engine_now(None, before) is None


def test_the_bounds_are_the_capacity_plans_figures_as_the_engine_reported_them() -> None:
    status = {"capacity_plan": {"kv_cache_tokens": 4096, "predicted_kv_cache_tokens": 5000, "max_model_len": 2048}}
    assert intake.bounds_from(status, 30) == Bounds(30, 4096, 2048)
    assert intake.bounds_from({"capacity_plan": {"predicted_kv_cache_tokens": 5000}}, 8) == Bounds(8, 5000, None)
    assert intake.bounds_from({"capacity_plan": None}, 8) == Bounds(8)


def test_the_setting_turns_adaptation_off_and_a_bad_value_is_one_sentence() -> None:
    from vllm_worker.config import settings

    assert settings.load({}).adaptive_concurrency is True
    assert settings.load({"ADAPTIVE_CONCURRENCY": "off"}).adaptive_concurrency is False
    with pytest.raises(settings.SettingsError, match="ADAPTIVE_CONCURRENCY"):
        settings.load({"ADAPTIVE_CONCURRENCY": "sometimes"})


def test_the_status_job_shows_the_limit_why_and_the_slots_left_to_the_platforms_queue() -> None:
    import asyncio
    import threading

    from vllm_worker.config.profile import LaunchProfile
    from vllm_worker.serving import handler
    from vllm_worker.serving.state import WorkerState

    gate = intake.Intake(lambda: BOUNDS, held=lambda: 4)
    gate.observe(EngineNow(running=3, waiting=2, kv_cache_usage=0.98, preempted=1), 1.0)
    state = WorkerState(served_model_name="m", ready=threading.Event())  # not ready: no /metrics read
    state.load_watch = engine_load.LoadWatch("127.0.0.1", 1, lambda: LaunchProfile.parse({}), 30, intake=gate)
    handler.configure(state)

    async def status() -> list:
        return [part async for part in handler.handler({"id": "s", "input": {"route": "/worker/status"}})]

    try:
        [report] = asyncio.run(status())
    finally:
        handler.configure(None)  # type: ignore[arg-type]
    assert report["intake"] == gate.status()
    assert report["intake"]["limit"] == 2 and report["intake"]["left_in_platform_queue"] == 28
    assert "preempted 1" in report["intake"]["reason"] and report["intake"]["engine"]["waiting"] == 2
