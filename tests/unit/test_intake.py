"""How many jobs the worker takes now (serving.intake): the pure decisions, the holder the job loop asks,
and the rule over minutes of a busy worker (tests/support/kv_model.py, a model of vLLM's KV cache
admission; the real engine is in tests/engine/test_intake_real_engine.py and bench/intake.py)."""

from __future__ import annotations

import logging
import math
from typing import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support import kv_model
from vllm_worker.serving import engine_load, intake
from vllm_worker.serving.intake import Bounds, EngineNow, Limit, Recent

BOUNDS = Bounds(max_concurrency=30, kv_tokens=4096, max_model_len=2048)
# The bench's jobs on vLLM's CPU engine: a 42-token prompt, 600 generated, 12 s in the engine.
BENCH = Recent(prompt=42.0, generated=600.0, engine_seconds=12.0)

reads = st.builds(
    EngineNow,
    running=st.integers(0, 40),
    waiting=st.integers(0, 40),
    kv_cache_usage=st.floats(0.0, 1.0),
    preempted=st.integers(0, 3),
    finished=st.integers(0, 5),
    prompt_tokens=st.floats(0.0, 20_000.0),
    generated_tokens=st.floats(0.0, 20_000.0),
    engine_seconds=st.floats(0.0, 600.0),
    kv_tokens=st.one_of(st.none(), st.integers(1, 1_000_000)),
    block_size=st.one_of(st.none(), st.sampled_from([1, 16, 128])),
)
bounds = st.builds(
    Bounds,
    max_concurrency=st.integers(1, 64),
    kv_tokens=st.one_of(st.none(), st.integers(1, 1_000_000)),
    max_model_len=st.one_of(st.none(), st.integers(1, 32768)),
    max_num_seqs=st.one_of(st.none(), st.integers(1, 64)),
)


def decisions(b: Bounds, sequence: list[EngineNow | None]) -> list[Limit]:
    limit, out = intake.first(b), []
    for now in sequence:
        limit = intake.room_and_pace(limit, now, b)
        out.append(limit)
    return out


@given(bounds, st.lists(st.one_of(st.none(), reads), max_size=30))
def test_a_decision_stays_between_one_and_max_concurrency_and_paces_only_past_the_room(b: Bounds, sequence: list) -> None:
    # vLLM runs no more than MAX_NUM_SEQS at once: that and one to start at the next end
    top = max(1, min(b.max_concurrency, b.max_num_seqs + 1 if b.max_num_seqs else b.max_concurrency))
    assert 1 <= intake.first(b).value <= top
    for limit in decisions(b, sequence):
        assert 1 <= limit.value <= top
        if limit.target is not None:
            assert limit.value <= limit.target <= top
        assert (limit.pace_s is None) == (limit.target is None)  # both from the recent requests' time in the engine
        assert limit.pace_s is None or limit.pace_s > 0
        assert ("paced:" in limit.reason) == (limit.target is not None and limit.target > limit.value)


@given(st.integers(1, 64), st.integers(0, 70), st.one_of(st.none(), st.floats(0.0, 1e4)), st.floats(0.0, 1e4))
def test_what_the_job_loop_may_hold_is_never_below_what_it_holds_and_at_most_one_more_past_the_room(
    value: int, held: int, last_take: float | None, at: float
) -> None:
    paced = Limit(value, "x", target=value + 5, pace_s=1.0)
    for limit in (Limit(value, "x"), paced, Limit(value, "x", target=value + 5, pace_s=1.0, waiting=1)):
        may = intake.allowed(limit, held, last_take, at)
        assert may >= held  # runpod's job loop starts a taken job only below this figure
        assert may == limit.value if held < limit.value else may in (held, held + 1)
        if may == held + 1 and held >= limit.value:
            assert limit.target is not None and held < limit.target and not limit.waiting
            assert last_take is None or at - last_take >= (limit.pace_s or 0)


@given(st.lists(st.tuples(st.floats(0.001, 5.0), st.integers(0, 12)), min_size=1, max_size=60))
def test_paced_takes_come_at_least_a_pace_apart(asks: list[tuple[float, int]]) -> None:
    clock, held = [0.0], [0]
    gate = intake.Intake(lambda: BOUNDS, held=lambda: held[0], clock=lambda: clock[0])
    gate.observe(EngineNow(5, 0, 0.9, finished=1, prompt_tokens=42, generated_tokens=600, engine_seconds=12, block_size=128), 0.0)
    limit = gate._limit
    # The rule's room of 5 and target of 9, within what the engine has shown (5 running, one more a read, and one
    # to wait inside it: 7), one of them to wait inside the engine.
    assert (limit.value, limit.target) == (6, 7) and limit.pace_s == pytest.approx(12 / (4096 / 406))
    grants: list[float] = []
    for dt, h in asks:
        clock[0] += dt
        held[0] = h
        if gate.allowed_now() == h + 1 and h >= limit.value:
            grants.append(clock[0])
    assert all(later - earlier >= limit.pace_s for earlier, later in zip(grants, grants[1:]))


def test_the_room_is_what_the_kv_cache_holds_to_the_end_beside_what_runs() -> None:
    # 3 running requests of 400 tokens will need 1200 of 4096: room for 7 more.
    assert intake.room(EngineNow(3, 0, 0.1), 4096, 400.0) == 7
    # What they hold now counts when it is more: 60 % used leaves room for 4.
    assert intake.room(EngineNow(3, 0, 0.6), 4096, 400.0) == 4
    # Whole blocks: vLLM's CPU backend gives 128-token blocks, so a request of 642 tokens holds 768, and
    # 3 running leave room for 2 such requests, not the 3 that 4,096 - 3 x 642 tokens would give.
    assert intake.room(EngineNow(3, 0, 0.1, block_size=128), 4096, 642.0) == 2
    assert intake.room(EngineNow(3, 0, 0.1, block_size=128), 4096, 1024.0) == 1  # 1,024 tokens are 8 blocks exactly
    assert intake.room(EngineNow(9, 0, 0.2), 4096, 642.0) == 0  # never below none


def test_the_cache_holds_on_average_what_a_request_holds_over_its_life_and_at_the_peaks_half_a_request_more() -> None:
    # The bench: 42 + 600 / 2 + 64 = 406 tokens on average in 4,096 (10 requests, where 5 fit to their end);
    # at the peaks 300 + 64 more: 9.
    assert intake.held_on_average(4096, BENCH, 128) == pytest.approx(4096 / 406)
    assert intake.held_on_average(4096, BENCH, 16) == pytest.approx(4096 / 350)
    assert intake.held_at_peaks(4096, BENCH, 128) == pytest.approx((4096 - 364) / 406)
    assert intake.held_at_peaks(4096, BENCH, 16) == pytest.approx((4096 - 308) / 350)
    # The paced target is what the cache holds at the peaks, to the nearest request: 9.19 and 10.8.
    assert intake.paced_target(4096, BENCH, 128) == 9
    assert intake.paced_target(4096, BENCH, 16) == 11
    assert intake.paced_target(400, BENCH, 128) == 0  # not one at its peak: none (the room still takes one)


def test_recent_means_follow_the_requests_finished_the_later_ones_weighing_more() -> None:
    first = intake.recent(None, EngineNow(0, 0, 0.0, finished=2, prompt_tokens=100, generated_tokens=1000, engine_seconds=20))
    assert first == Recent(50.0, 500.0, 10.0) and first.length == 550.0
    assert intake.recent(first, EngineNow(0, 0, 0.0)) is first  # nothing finished since
    later = intake.recent(first, EngineNow(0, 0, 0.0, finished=1, prompt_tokens=150, generated_tokens=100, engine_seconds=2))
    assert later == pytest.approx(Recent(0.9 * 50 + 0.1 * 150, 0.9 * 500 + 0.1 * 100, 0.9 * 10 + 0.1 * 2))
    # Many finished at once weigh as many: ten of the new kind leave 0.9 ** 10 of the old means.
    many = intake.recent(first, EngineNow(0, 0, 0.0, finished=10, prompt_tokens=1500, generated_tokens=1000, engine_seconds=20))
    assert many.prompt == pytest.approx(0.9**10 * 50 + (1 - 0.9**10) * 150)


def test_before_any_request_finished_the_room_counts_max_model_len_and_nothing_is_paced() -> None:
    limit = intake.room_and_pace(intake.first(BOUNDS), EngineNow(1, 0, 0.05), BOUNDS)
    assert (limit.value, limit.target, limit.pace_s) == (2, None, None)  # 1 running + 1 more of 2,048 in 4,096
    assert limit.reason == "1 running, 0 waiting, KV cache 5% used: the KV cache holds 1 more request(s) of 2,048 tokens to their end"


def test_past_the_room_the_worker_is_paced_up_to_what_the_cache_holds_at_the_peaks() -> None:
    # 5 running of the bench's 642 tokens hold 30 of 32 blocks at their end: no room; 10.1 on average, 9.2 at the
    # peaks: 9.
    now = EngineNow(5, 0, 0.5, finished=1, prompt_tokens=42, generated_tokens=600, engine_seconds=12, kv_tokens=4096, block_size=128)
    limit = intake.room_and_pace(intake.first(Bounds(30)), now, Bounds(30))
    assert (limit.value, limit.target) == (5, 9) and limit.pace_s == pytest.approx(12 / (4096 / 406))
    assert limit.reason.endswith(
        "; paced: one more every 1.19 s (59 tokens of a running request apart: a recent request's 600 generated tokens "
        "over the 10.1 the cache holds on average, at 20.0 ms a token now) up to 9, what it holds at their peaks"
    )
    assert intake.allowed(limit, 5, None, 100.0) == 6
    assert intake.allowed(limit, 6, 100.0, 101.0) == 6  # within the pace: what it holds
    assert intake.allowed(limit, 6, 100.0, 101.2) == 7
    assert intake.allowed(limit, 9, 0.0, 100.0) == 9  # at the target: no more
    assert intake.allowed(limit, 3, 100.0, 100.0) == 5  # under the room: the room, at once
    waiting = intake.room_and_pace(limit, EngineNow(5, 1, 0.9, block_size=128, kv_tokens=4096), Bounds(30))
    assert waiting.waiting == 1 and waiting.reason.endswith(
        "up to 9, what it holds at their peaks, "
        "once more jobs have ended than the 1 request(s) waiting inside the engine"
    )
    assert intake.allowed(waiting, 5, None, 200.0) == 5


def test_the_pace_is_kept_in_the_engines_tokens_and_timed_by_its_steps_now() -> None:
    # 600 generated tokens over the 10.1 requests the cache holds on average: starts 59 tokens apart.
    b = Bounds(30, 4096)
    apart = 600 / (4096 / 406)
    # No step seen yet: a token as long as the recent requests' (12 s over 600 tokens).
    finished = EngineNow(5, 0, 0.5, finished=1, prompt_tokens=42, generated_tokens=600, engine_seconds=12, block_size=128)
    before = intake.room_and_pace(intake.first(b), finished, b)
    assert before.token_s == pytest.approx(0.02) and before.pace_s == pytest.approx(apart * 0.02)

    def read(limit: Limit, running: int, tokens: float, seconds: float = 2.0, running_before: int | None = 5) -> Limit:
        now = EngineNow(running, 0, 0.5, block_size=128, generated_now=tokens, seconds=seconds, running_before=running_before)
        return intake.room_and_pace(limit, now, b)

    # 5 running made 500 tokens in 2 s: a step of 20 ms, the same; then 250 in 2 s, a step of 40 ms: the machine
    # slowed, so the starts stay as many tokens apart and more seconds (each read weighs half).
    same = read(before, 5, 500)
    assert same.token_s == pytest.approx(0.02) and same.pace_s == pytest.approx(apart * 0.02)
    slower = read(same, 5, 250)
    assert slower.token_s == pytest.approx(0.03) and slower.pace_s == pytest.approx(apart * 0.03)
    assert "at 30.0 ms a token now" in slower.reason
    # From 5 running to 15, 10 on average, at 10 ms a step: 2,000 tokens in 2 s (the running at the read alone
    # would make it 15 ms): half of it and half of the 30 ms before.
    batch = read(slower, 15, 2000)
    assert batch.token_s == pytest.approx(0.02)
    # No earlier read of the running: the running at this read (10 ms).
    assert read(batch, 10, 2000, running_before=None).token_s == pytest.approx(0.015)
    # Nothing ran since (no tokens, or no time): the last step stands, and a read without figures keeps it.
    idle = read(batch, 0, 0, running_before=0)
    assert idle.token_s == batch.token_s and read(idle, 3, 30, seconds=0.0).token_s == idle.token_s
    assert intake.room_and_pace(idle, None, b).token_s == idle.token_s
    # Tokens made while nothing ran at either read (a request started and ended between them): no step seen.
    assert read(batch, 0, 50, running_before=0).token_s == batch.token_s
    # One request, one token: a step all the same (40 ms here, weighing half beside the 20 before).
    assert read(batch, 1, 1, seconds=0.04, running_before=1).token_s == pytest.approx(0.03)
    # A stall of the host: 9 running made 63 tokens in 3 s (a step of 429 ms where it was 20): it counts as 40 ms,
    # so the pace is 1.5 times what it was, not 11; a machine that stays that slow is followed, doubling a read.
    stalled = read(batch, 9, 63, seconds=3.0, running_before=9)
    assert stalled.token_s == pytest.approx(0.03) and stalled.pace_s == pytest.approx(apart * 0.03)
    assert read(stalled, 9, 63, seconds=3.0, running_before=9).token_s == pytest.approx(0.045)
    # A read without a KV cache size keeps the step for the reads that have one.
    unknown = intake.room_and_pace(batch, EngineNow(5, 0, 0.5, generated_now=500, seconds=2.0, running_before=5), Bounds(30))
    assert unknown.reason == intake.NO_KV_REASON and unknown.token_s == pytest.approx(0.02)
    # Requests of one generated token give a token's time; requests that took no time give none (nothing paced).
    one = EngineNow(5, 0, 0.5, finished=2, prompt_tokens=84, generated_tokens=2, engine_seconds=1.0, block_size=128)
    assert intake.room_and_pace(intake.first(b), one, b).token_s == pytest.approx(0.5)
    instant = EngineNow(5, 0, 0.5, finished=1, prompt_tokens=42, generated_tokens=600, engine_seconds=0.0, block_size=128)
    assert intake.room_and_pace(intake.first(b), instant, b).token_s is None
    # The reason gives the step to a tenth of a millisecond.
    slow = EngineNow(5, 0, 0.5, finished=1, prompt_tokens=42, generated_tokens=600, engine_seconds=59.94, block_size=128)
    assert "at 99.9 ms a token now" in intake.room_and_pace(intake.first(b), slow, b).reason
    # Before any request finished nothing is paced, and a step seen then is kept for later.
    early = intake.room_and_pace(intake.first(BOUNDS), EngineNow(2, 0, 0.1, generated_now=100, seconds=1.0, running_before=2), BOUNDS)
    assert early.pace_s is None and early.token_s == pytest.approx(0.02)


def test_the_target_is_what_the_cache_holds_at_the_peaks_to_the_nearest_request_and_at_most_max_concurrency() -> None:
    def target(kv: int, top: int = 30) -> int | None:
        now = EngineNow(1, 0, 0.0, finished=1, prompt_tokens=42, generated_tokens=600, engine_seconds=12, block_size=128)
        return intake.room_and_pace(Limit(1, "x"), now, Bounds(top, kv, 2048)).target

    assert target(4096) == 9  # 9.19
    assert target(406 * 9 + 203 + 364) == 10  # 9.5: up
    assert target(406 * 9 + 202 + 364) == 9
    assert target(10**6, top=30) == 30
    # Where the room is already the whole target, nothing is paced.
    roomy = intake.room_and_pace(Limit(1, "x"), EngineNow(0, 0, 0.0, finished=1, prompt_tokens=10, generated_tokens=10, engine_seconds=1), BOUNDS)
    assert roomy.value == 30 and roomy.target == 30 and "paced" not in roomy.reason


def test_without_figures_or_a_kv_cache_size_the_worker_takes_up_to_max_concurrency() -> None:
    assert intake.room_and_pace(Limit(3, "x"), None, BOUNDS) == Limit(30, intake.NO_FIGURES_REASON)
    no_kv = intake.room_and_pace(Limit(3, "x"), EngineNow(3, 2, 0.3), Bounds(30, max_model_len=2048))
    assert (no_kv.value, no_kv.reason, no_kv.waiting) == (30, intake.NO_KV_REASON, 2)
    assert intake.room_and_pace(Limit(3, "x"), EngineNow(3, 0, 0.3), Bounds(30, kv_tokens=4096)).value == 30  # no length either


def test_the_first_limit_is_what_the_kv_cache_holds_at_max_model_len() -> None:
    assert intake.first(BOUNDS).value == 3
    assert intake.first(Bounds(30, kv_tokens=10_000_000, max_model_len=4096)).value == 30
    assert intake.first(Bounds(30)).value == 30
    assert intake.first(Bounds(30, kv_tokens=100, max_model_len=2048)).value == 1


def test_the_holder_logs_a_change_at_most_every_log_every_s(caplog: pytest.LogCaptureFixture) -> None:
    gate = intake.Intake(lambda: BOUNDS, held=lambda: 5)
    paced = EngineNow(5, 0, 0.5, finished=1, prompt_tokens=42, generated_tokens=600, engine_seconds=12, block_size=128)
    with caplog.at_level(logging.INFO, logger="vllm_worker"):
        gate.observe(paced, 100.0)  # 3 -> 6, paced to 7 (the room of 5 and one to wait, within 5 running + 2): logged
        gate.observe(EngineNow(4, 0, 0.95, block_size=128), 110.0)  # 6 -> 4, within LOG_EVERY_S of the last line
        gate.observe(EngineNow(3, 0, 0.95, block_size=128), 130.0)  # 4 -> 3, LOG_EVERY_S after it: logged, 2 changes
        assert len(caplog.records) == 2  # at LOG_EVERY_S exactly, not at the next read
        gate.observe(EngineNow(3, 0, 0.95, block_size=128), 170.0)  # no change: nothing
    lines = [r.getMessage() for r in caplog.records]
    assert [line.split(":")[0] for line in lines] == [
        "taking up to 6 job(s) at once, then one at a time up to 7 (was 3)",
        # Running requests that hold 95% of the cache hold more than the recent ones did: the jobs changed, the pace
        # (from the recent ones) is forgotten.
        "taking up to 3 job(s) at once (was 6; 2 changes since the last line)",
    ]


def test_off_the_worker_takes_max_concurrency_whatever_the_engine_says() -> None:
    gate = intake.Intake(lambda: BOUNDS, adaptive=False, held=lambda: 30)
    gate.observe(EngineNow(running=1, waiting=20, kv_cache_usage=1.0, preempted=4), 1.0)
    assert gate.value == 30 and gate.allowed_now() == 30 and gate.status()["reason"] == intake.OFF_REASON


def test_the_engine_figures_give_what_finished_since_the_last_read() -> None:
    text = (
        'vllm:num_requests_running{engine="0"} 3\nvllm:num_requests_waiting{engine="0"} 1\n'
        'vllm:kv_cache_usage_perc{engine="0"} 0.5\nvllm:num_preemptions_total{engine="0"} 4\n'
        'vllm:request_prompt_tokens_sum{engine="0"} 100\nvllm:request_prompt_tokens_count{engine="0"} 4\n'
        'vllm:request_generation_tokens_sum{engine="0"} 2300\nvllm:request_generation_tokens_count{engine="0"} 4\n'
        'vllm:request_inference_time_seconds_sum{engine="0"} 40.5\nvllm:generation_tokens_total{engine="0"} 5150\n'
    )
    before = engine_load.parse(
        text.replace('total{engine="0"} 4', 'total{engine="0"} 1').replace('count{engine="0"} 4', 'count{engine="0"} 1')
        .replace("tokens_sum{engine=\"0\"} 100", "tokens_sum{engine=\"0\"} 20").replace("2300", "500").replace("40.5", "10.25")
        .replace("5150", "4750").replace('running{engine="0"} 3', 'running{engine="0"} 2'),
        at=1.0,
    )
    now = engine_load.engine_now(engine_load.parse(text, at=2.0), before)
    assert now == EngineNow(
        running=3, waiting=1, kv_cache_usage=0.5, preempted=3, finished=3, prompt_tokens=80, generated_tokens=1800,
        engine_seconds=30.25, generated_now=400, seconds=1.0, running_before=2,
    )
    # The first read of an engine: everything since it started, no preemption rate, no step.
    assert engine_load.engine_now(before, None) == EngineNow(
        2, 1, 0.5, preempted=0, finished=1, prompt_tokens=20, generated_tokens=500, engine_seconds=10.25
    )
    assert engine_load.engine_now(None, before) is None


def test_the_bounds_are_the_capacity_plans_figures_as_the_engine_reported_them() -> None:
    status = {"kv_cache_tokens": 4096, "predicted_kv_cache_tokens": 5000, "max_model_len": 2048}
    assert intake.bounds_from(status, 30) == Bounds(30, 4096, 2048)
    assert intake.bounds_from({"predicted_kv_cache_tokens": 5000}, 8) == Bounds(8, 5000, None)
    assert intake.bounds_from(None, 8) == Bounds(8)
    assert intake.bounds_from(status, 30, 8) == Bounds(30, 4096, 2048, max_num_seqs=8)


def test_the_setting_turns_adaptation_off_and_a_bad_value_is_one_sentence() -> None:
    from vllm_worker.config import settings

    assert settings.load({}).adaptive_concurrency is True
    assert settings.load({"ADAPTIVE_CONCURRENCY": "off"}).adaptive_concurrency is False
    with pytest.raises(settings.SettingsError, match="ADAPTIVE_CONCURRENCY"):
        settings.load({"ADAPTIVE_CONCURRENCY": "sometimes"})


def test_the_status_job_shows_the_limit_the_pace_why_and_the_slots_left_to_the_platforms_queue() -> None:
    import asyncio
    import threading

    from vllm_worker.config.profile import LaunchProfile
    from vllm_worker.serving import handler
    from vllm_worker.serving.state import WorkerState

    gate = intake.Intake(lambda: BOUNDS, held=lambda: 6)
    read = EngineNow(5, 1, 0.9, preempted=1, finished=1, prompt_tokens=42, generated_tokens=600, engine_seconds=12, block_size=128)
    gate.observe(read, 1.0)
    state = WorkerState(served_model_name="m", ready=threading.Event())  # not ready: no /metrics read
    state.load_watch = engine_load.LoadWatch("127.0.0.1", 1, lambda: LaunchProfile.parse({}), 30, intake=gate)
    handler.configure(state)

    async def status() -> list:
        return [part async for part in handler.handler({"id": "s", "input": {"route": "/worker/status"}})]

    try:
        [report] = asyncio.run(status())
    finally:
        handler.configure(None)  # type: ignore[arg-type]
    shown = report["intake"]
    assert shown == gate.status()
    # A request waits inside the engine and one was preempted: no more than it runs (the rule's target of 9 waits).
    assert (shown["limit"], shown["paced_up_to"], shown["left_in_platform_queue"]) == (5, 5, 25)
    assert shown["pace_seconds"] == round(12 / (4096 / 406), 3)
    assert "at most 5 held: the engine has shown room for 5" in shown["reason"]
    assert shown["recent_requests"] == {"prompt_tokens": 42.0, "generated_tokens": 600.0, "engine_seconds": 12.0}
    assert "1 preempted since the last read" in shown["reason"] and shown["engine"]["waiting"] == 1
    assert shown["engine"]["held_by_worker"] == 6


def test_the_engines_max_num_seqs_is_the_profiles_or_unknown_where_a_config_file_may_set_it() -> None:
    from vllm_worker.config.profile import LaunchProfile

    assert LaunchProfile.parse({"MAX_NUM_SEQS": "8"}).known_max_num_seqs() == 8
    assert LaunchProfile.parse({"VLLM_EXTRA_ARGS": "--max-num-seqs 6"}).known_max_num_seqs() == 6
    assert LaunchProfile.parse({}).known_max_num_seqs() == 32  # the worker's default: a multiple of 8 >= 30
    assert LaunchProfile.parse({"MAX_CONCURRENCY": "4"}).known_max_num_seqs() == 8  # of the profile's MAX_CONCURRENCY
    assert LaunchProfile.parse({"VLLM_CONFIG_FILE": "/c.yaml"}).known_max_num_seqs() is None
    assert LaunchProfile.parse({"VLLM_CONFIG_FILE": "/c.yaml", "MAX_NUM_SEQS": "4"}).known_max_num_seqs() == 4


def test_below_max_concurrency_max_num_seqs_and_one_more_bound_what_is_taken_and_the_reason_says_so() -> None:
    seqs = Bounds(30, kv_tokens=10_000_000, max_model_len=2048, max_num_seqs=8)
    words = "up to 9: MAX_NUM_SEQS=8, the requests vLLM runs at once, and one to start the moment one ends (below MAX_CONCURRENCY=30)"
    start = intake.first(seqs)
    assert start.value == 9 and start.reason.endswith("; " + words)
    roomy = EngineNow(8, 1, 0.01, finished=1, prompt_tokens=42, generated_tokens=600, engine_seconds=12, block_size=16,
                      generated_now=800, seconds=1.0, running_before=8)
    limit = intake.room_and_pace(start, roomy, seqs)
    assert (limit.value, limit.target, limit.pace_s, limit.waiting) == (9, None, None, 0)  # at MAX_NUM_SEQS: not paced
    assert limit.reason.endswith("; " + words)
    assert intake.allowed(limit, 9, None, 0.0) == 9  # full: nothing more, paced or not
    assert intake.room_and_pace(start, None, seqs) == Limit(9, intake.NO_FIGURES_REASON.removesuffix("up to MAX_CONCURRENCY") + words)
    assert intake.room_and_pace(start, EngineNow(3, 0, 0.1), Bounds(30, max_num_seqs=8)).value == 9  # no KV size: MAX_NUM_SEQS
    # Where the cache, not MAX_NUM_SEQS, bounds the jobs, the reason does not name it; nor where it is not below.
    tight = intake.room_and_pace(start, roomy, Bounds(30, kv_tokens=4096, max_model_len=2048, max_num_seqs=16))
    assert "MAX_NUM_SEQS" not in tight.reason and tight.value == 8
    # MAX_NUM_SEQS running where the cache is the bound too: paced, and held back while requests wait in vLLM.
    full = EngineNow(8, 1, 0.9, finished=1, prompt_tokens=42, generated_tokens=600, engine_seconds=12, block_size=128,
                     generated_now=800, seconds=1.0, running_before=8)
    both = intake.room_and_pace(start, full, Bounds(30, kv_tokens=4096, max_model_len=2048, max_num_seqs=8))
    assert (both.value, both.waiting) == (8, 1) and both.pace_s is not None
    exact = intake.room_and_pace(start, EngineNow(0, 0, 0.0, block_size=16), Bounds(30, 9 * 656, 656, max_num_seqs=8))
    assert exact.value == 9 and "MAX_NUM_SEQS" not in exact.reason  # the cache holds exactly 9: it, not vLLM, bounds
    assert intake.first(Bounds(30, max_num_seqs=32)) == intake.first(Bounds(30))
    assert intake.first(Bounds(30, max_num_seqs=29)) == intake.first(Bounds(30))  # 29 and one more: 30
    assert intake.room_and_pace(start, None, Bounds(30, max_num_seqs=30)).reason == intake.NO_FIGURES_REASON
    # The cache holds 4 of MAX_MODEL_LEN and one more is taken: MAX_NUM_SEQS=4 and one more is the same bound, not named.
    assert "MAX_NUM_SEQS" not in intake.first(Bounds(30, 4 * 2048, 2048, max_num_seqs=4)).reason
    assert intake.first(Bounds(30, 4 * 2048, 2048, max_num_seqs=3)).reason.endswith("(below MAX_CONCURRENCY=30)")


def test_paced_under_max_num_seqs_requests_start_its_share_of_a_request_apart() -> None:
    # A cache that holds 20 of these on average, MAX_NUM_SEQS=4: the ends spread over what runs, 150 tokens apart.
    b = Bounds(30, kv_tokens=20 * 406, max_model_len=2048, max_num_seqs=4)
    read = EngineNow(1, 0, 0.05, finished=1, prompt_tokens=42, generated_tokens=600, engine_seconds=12, block_size=128,
                     generated_now=100, seconds=1.0, running_before=1)
    limit = intake.room_and_pace(intake.first(b), read, b)
    assert limit.pace_s == pytest.approx(600 / 4 * 0.01)  # 10 ms a token: 1 s x 1 running / 100 tokens
    # Past the room (a cache 90% used), the reason says what the spread is.
    # (A cache of 3,572 tokens: 3 running requests of these hold at most 2,304, so it can be past the room while
    # each holds no more than a recent one did to its end.)
    fuller = EngineNow(3, 0, 0.3, finished=1, prompt_tokens=42, generated_tokens=600, engine_seconds=12, block_size=128,
                       generated_now=300, seconds=1.0, running_before=3)
    small = Bounds(30, kv_tokens=3572, max_model_len=2048, max_num_seqs=4)
    paced = intake.room_and_pace(intake.first(small), fuller, small)
    assert (paced.value, paced.target) == (4, 5)
    assert "(150 tokens of a running request apart: a recent request's 600 generated tokens over the 4 run at most" in paced.reason
    unbound = intake.room_and_pace(intake.first(BOUNDS), read, Bounds(30, kv_tokens=20 * 406, max_model_len=2048))
    assert unbound.pace_s == pytest.approx(600 / 20 * 0.01)
    assert "over the 20.0 the cache holds on average" in unbound.reason
    # MAX_NUM_SEQS at or above MAX_CONCURRENCY bounds nothing: the spread is the cache's.
    above = intake.room_and_pace(intake.first(BOUNDS), read, Bounds(4, kv_tokens=20 * 406, max_model_len=2048, max_num_seqs=6))
    assert above.pace_s == pytest.approx(600 / 20 * 0.01)


# --- the rule over minutes of a busy worker (tests/support/kv_model.py) ---


def fixed(top: int) -> Callable[[float, int, kv_model.Engine], int]:
    return lambda at, held, engine: top


def capacity_aware(b: Bounds) -> tuple[Callable[[float, int, kv_model.Engine], int], Callable[..., None], intake.Intake]:
    """The job loop's question and the load watch's read, wired to one Intake as serving.platform and
    serving.engine_load wire them."""
    clock, held = [0.0], [0]
    gate = intake.Intake(lambda: b, held=lambda: held[0], clock=lambda: clock[0])
    preempted = [0]
    made: list[tuple[float, int, int]] = []  # the previous read: when, the tokens generated until then, running

    def observe(at: float, engine: kv_model.Engine, finished: list[kv_model.Request]) -> None:
        total = sum(r.out for r in [*engine.finished, *engine.running, *engine.waiting])
        now = EngineNow(
            running=len(engine.running),
            waiting=len(engine.waiting),
            kv_cache_usage=(engine.blocks - engine.free) / engine.blocks,
            preempted=engine.preemptions - preempted[0],
            finished=len(finished),
            prompt_tokens=sum(r.prompt for r in finished),
            generated_tokens=sum(r.out for r in finished),
            engine_seconds=sum((r.done or at) - (r.scheduled or at) for r in finished),
            kv_tokens=engine.blocks * engine.block_size,
            block_size=engine.block_size,
            generated_now=total - made[-1][1] if made else 0.0,
            seconds=at - made[-1][0] if made else 0.0,
            running_before=made[-1][2] if made else None,
        )
        made[:] = [(at, total, len(engine.running))]
        preempted[0] = engine.preemptions
        gate.observe(now, at)

    def limit(at: float, holding: int, engine: kv_model.Engine) -> int:
        clock[0], held[0] = at, holding
        return gate.allowed_now()

    return limit, observe, gate


def p95(values: list) -> float:
    ordered = sorted(values)
    return ordered[math.ceil(0.95 * len(ordered)) - 1]


# KV caches that hold a few of these jobs to their end, so the fixed worker's 30 wait in vLLM: vLLM's CPU
# backend (128-token blocks) and a GPU's (16), jobs long and short, prompt-heavy and generation-heavy.
BUSY = [
    (32, 128, 42, 600),  # bench/intake.py's engine and jobs
    (48, 128, 200, 400),
    (32, 128, 100, 900),
    (32, 128, 500, 100),
    (256, 16, 42, 600),
    (256, 16, 100, 900),
    (64, 16, 20, 200),
    (400, 16, 200, 400),
]


@pytest.mark.parametrize("blocks, block, prompt, generate", BUSY)
def test_with_a_backlog_the_worker_keeps_the_engine_about_as_busy_as_a_fixed_worker_holding_few_jobs_back(
    blocks: int, block: int, prompt: int, generate: int
) -> None:
    kw = dict(blocks=blocks, block_size=block, prompt=prompt, generate=generate, seconds=120.0)
    given_all = kv_model.run(fixed(30), lambda *a: None, **kw)  # type: ignore[arg-type]
    limit, observe, _ = capacity_aware(Bounds(30, blocks * block, 2048))
    aware = kv_model.run(limit, observe, **kw)  # type: ignore[arg-type]
    assert p95(given_all.taken_not_running) >= 15  # the fixed worker's jobs wait in vLLM
    # The floor is the model's, not a benchmark (the model is deterministic; bench/intake_buffers.py measures the
    # engine). Its lowest cases are the shortest jobs, (64, 16, 20, 200) and (32, 128, 500, 100): 0.85 of the fixed
    # worker's with the derived buffer, 0.842 without one (2026-12-07). A job's take and answer leave its slot empty
    # for a moment and a short job's life is short; a target past the peaks kept 0.90 there by overfilling the cache,
    # so preempting (paced_target says why not). It was 0.80, 0.85, 0.88 and 0.84 as the rule changed; it is 0.84
    # because no buffer (INTAKE_BUFFER=0) is a setting a user may choose, and that reads 0.842 in the lowest case.
    assert aware.completed >= 0.84 * given_all.completed, (aware.completed, given_all.completed)
    assert p95(aware.taken_not_running) <= 2
    assert p95(aware.first_token_waits) <= 1.25


@pytest.mark.parametrize("blocks, block, prompt, generate", BUSY)
def test_a_burst_waits_in_the_platforms_queue_not_in_vllm(blocks: int, block: int, prompt: int, generate: int) -> None:
    # 40 jobs queued at once (bench/intake.py's burst): the first ones are taken before any request has
    # finished; once they end together, the drained room is refilled paced, or those taken back together
    # would peak together and be preempted.
    kw = dict(blocks=blocks, block_size=block, prompt=prompt, generate=generate, seconds=600.0, jobs=40)
    given_all = kv_model.run(fixed(30), lambda *a: None, **kw)  # type: ignore[arg-type]
    limit, observe, _ = capacity_aware(Bounds(30, blocks * block, 2048))
    aware = kv_model.run(limit, observe, **kw)  # type: ignore[arg-type]
    assert p95(given_all.taken_not_running) >= 15
    assert p95(aware.taken_not_running) <= 2, aware.taken_not_running
    assert aware.ended < 600.0 and given_all.ended < 600.0  # all 40 answered


@pytest.mark.parametrize("jobs, seconds", [(None, 120.0), (40, 600.0)])
def test_where_max_num_seqs_bounds_the_engine_not_its_cache_the_rest_waits_in_the_platforms_queue(
    jobs: int | None, seconds: float
) -> None:
    # A GPU's cache that holds 30 of these jobs and more, with MAX_NUM_SEQS=6 under MAX_CONCURRENCY=30: vLLM runs
    # 6 at once whatever its cache holds, so a worker that took by the cache's room alone held 24 in vLLM.
    kw = dict(blocks=4096, block_size=16, prompt=42, generate=200, seconds=seconds, jobs=jobs, max_seqs=6)
    given_all = kv_model.run(fixed(30), lambda *a: None, **kw)  # type: ignore[arg-type]
    limit, observe, gate = capacity_aware(Bounds(30, 4096 * 16, 2048, max_num_seqs=6))
    aware = kv_model.run(limit, observe, **kw)  # type: ignore[arg-type]
    assert p95(given_all.taken_not_running) >= 20
    assert p95(aware.taken_not_running) <= 2, aware.taken_not_running
    assert gate.status()["max_num_seqs"] == 6 and gate.status()["left_in_platform_queue"] == 23
    if jobs is None:
        assert aware.completed >= 0.95 * given_all.completed, (aware.completed, given_all.completed)
    else:
        assert aware.ended < seconds and given_all.ended < seconds


def test_without_pacing_the_engine_runs_in_lockstep_and_half_empty() -> None:
    # The same rule with its room alone (the rule before pacing, in effect): requests taken together end
    # together and the cache refills in one go, so the engine runs about as many as fit to their end.
    kw = dict(blocks=32, block_size=128, prompt=42, generate=600, seconds=120.0)
    given_all = kv_model.run(fixed(30), lambda *a: None, **kw)  # type: ignore[arg-type]
    # No jobs waiting inside vLLM on purpose (buffer 0): the room alone against the room and the pace.
    unbuffered = Bounds(30, 4096, 2048, buffer=0)
    limit, observe, _ = capacity_aware(unbuffered)
    paced = kv_model.run(limit, observe, **kw)  # type: ignore[arg-type]
    _, observe, gate = capacity_aware(unbuffered)
    room_only = kv_model.run(lambda at, held, engine: max(held, gate.value), observe, **kw)  # type: ignore[arg-type]
    assert room_only.running < 0.7 * given_all.running < 0.85 * given_all.running < paced.running


# --- a workload that changes (issue 43): growth by evidence, falls on waiting -------------------------------


def shown_at_take(b: Bounds) -> Callable[[float, kv_model.Engine, int], int]:
    """What the engine has shown room for at a take, by the definition in serving.intake: what it runs, the
    requests of MAX_MODEL_LEN its free cache holds to their end (one at least, growing by one a read), and the
    jobs kept waiting inside it (MAX_BUFFER at most). Less what the worker already holds: a take asks for the
    rest."""

    def shown(at: float, engine: kv_model.Engine, held: int) -> int:
        free = engine.free * engine.block_size
        full = free // (math.ceil(2048 / engine.block_size) * engine.block_size) if b.max_model_len else 0
        # One read's growth (one more) may come on top of what a read saw; the running ones may have ended since.
        return max(1, len(engine.running) + len(engine.waiting) + max(1, full) + 1 + intake.MAX_BUFFER) - held

    return shown


SHIFTS = [
    # (cache blocks, block size, first jobs' generated tokens, then the burst's): short chat turns, then long
    # generations, on the CPU backend's cache and a GPU's; and long, then short.
    (32, 128, 20, 600),
    (256, 16, 20, 600),
    (48, 128, 50, 900),
    (32, 128, 600, 20),
]


@pytest.mark.parametrize("blocks, block, before, after", SHIFTS)
def test_a_burst_of_other_jobs_after_a_run_of_short_or_long_ones_waits_in_the_platforms_queue(
    blocks: int, block: int, before: int, after: int
) -> None:
    # 10 jobs of one size, then 40 of another queued behind them (the case: after short jobs a take of 20,
    # 26 in this model, where the cache held 5). Sampled once a job of the burst has been taken.
    b = Bounds(30, blocks * block, 2048)
    limit, observe, _ = capacity_aware(b)
    out = kv_model.run(
        limit, observe, blocks=blocks, block_size=block, prompt=42, generate=after, seconds=900.0, jobs=50,
        sizes=lambda n: (42, before) if n < 10 else (42, after), shown=shown_at_take(b),
    )  # fmt: skip
    assert out.ended < 900.0  # all 50 answered
    assert out.taken_not_running and p95(out.taken_not_running) <= 3, out.taken_not_running
    # No take asks for more than the engine has shown room for, whatever the recent jobs' sizes.
    assert all(asked <= shown for _, asked, shown in out.takes), [t for t in out.takes if t[1] > t[2]]
    assert max(asked for _, asked, _ in out.takes) <= 1 + intake.MAX_BUFFER + (blocks * block) // 2048


def test_once_the_running_requests_outgrow_the_recent_ones_what_they_said_is_forgotten() -> None:
    short = EngineNow(0, 0, 0.0, finished=10, prompt_tokens=420, generated_tokens=200, engine_seconds=5.0, block_size=128)
    limit = intake.decide(intake.first(BOUNDS), short, BOUNDS)
    assert limit.recent is not None and limit.recent.length == pytest.approx(62.0)
    # The jobs that follow are long: four running hold 60% of 4,096 tokens, 614 each, where the recent ones held a
    # block (128) to their end: more than that is a change.
    grown = EngineNow(4, 0, 0.6, block_size=128)
    assert intake.outgrown(grown, 4096, 62.0, 128) and not intake.outgrown(grown, 4096, 642.0, 128)
    assert not intake.outgrown(EngineNow(4, 0, 0.125, block_size=128), 4096, 62.0, 128)  # 128 each: a block
    assert intake.outgrown(EngineNow(4, 0, 0.13, block_size=128), 4096, 62.0, 128)
    after = intake.decide(limit, grown, BOUNDS)
    assert after.recent is None and after.target is None
    assert after.value == 4  # what runs: no room for one of MAX_MODEL_LEN, no growth, nothing to wait in it
    assert "the running requests already hold more than the recent ones held to their end" in after.reason
    assert not intake.outgrown(EngineNow(0, 0, 0.0), 4096, 62.0, 128)


@given(bounds, st.lists(reads, min_size=1, max_size=30))
def test_a_decision_never_holds_more_than_the_engine_has_shown_room_for(b: Bounds, sequence: list[EngineNow]) -> None:
    limit = intake.first(b)
    for now in sequence:
        limit = intake.decide(limit, now, b)
        kv = b.kv_tokens or now.kv_tokens
        assert 1 <= limit.value <= b.top
        assert limit.target is None or limit.value <= limit.target <= b.top
        if kv and limit.reason not in (intake.NO_KV_REASON,) and "unknown" not in limit.reason:
            kept = intake.buffer_for(b, now.finished, now.seconds, now.preempted) if limit.recent is not None else 0
            shown = intake.shown_room(now, kv, b.max_model_len, grow=limit.recent is not None) + kept
            assert limit.value <= max(1, shown) and (limit.target is None or limit.target <= max(limit.value, shown))
            if now.waiting > 0 or now.preempted > 0:  # no growth: what runs, and the room for the longest
                full = intake.room(now, kv, b.max_model_len) if b.max_model_len else 0
                assert limit.value <= max(1, now.running + full) + kept


def test_the_buffer_is_what_ends_in_a_takes_round_trip_one_at_least_two_at_most() -> None:
    b = Bounds(30, 4096, 2048)
    assert intake.buffer_for(b, 0, 0.0, 0) == 1
    assert intake.buffer_for(b, 1, 1.0, 0) == 1
    assert intake.buffer_for(b, 3, 2.0, 0) == 2  # 1.5 a second: two in a round trip
    assert intake.buffer_for(b, 50, 1.0, 0) == intake.MAX_BUFFER == 2
    assert intake.buffer_for(b, 5, 1.0, 1) == 0  # vLLM preempts: its cache is overfilled
    assert intake.buffer_for(Bounds(30, 4096, 2048, buffer=4), 0, 1.0, 0) == 4
    assert intake.buffer_for(Bounds(30, 4096, 2048, buffer=0), 9, 1.0, 0) == 0


@pytest.mark.parametrize("blocks, block", [(32, 128), (256, 16), (64, 128)])
def test_a_burst_of_mixed_lengths_waits_in_the_platforms_queue(blocks: int, block: int) -> None:
    # Every third job a long generation, the others short chat turns, 40 queued at once.
    b = Bounds(30, blocks * block, 2048)
    limit, observe, _ = capacity_aware(b)
    out = kv_model.run(
        limit, observe, blocks=blocks, block_size=block, prompt=21, generate=600, seconds=900.0, jobs=40,
        sizes=lambda n: (21, 600) if n % 3 == 0 else (21, 24), shown=shown_at_take(b),
    )  # fmt: skip
    assert out.ended < 900.0
    assert p95(out.taken_not_running) <= 3, out.taken_not_running
    assert all(asked <= shown for _, asked, shown in out.takes)
