"""serving.intake at its edges: each boundary, each remembered time and each sentence the decision writes.

test_intake.py has the rules and their properties; this file pins what a mutation tester (mutmut 3.8.1
over serving/intake.py) found them leaving open: a boundary off by one, a time not kept, a reason a
user reads in the status job.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from vllm_worker.serving import intake
from vllm_worker.serving.intake import Bounds, EngineNow, Limit, Recent

BOUNDS = Bounds(max_concurrency=30, kv_tokens=4096, max_model_len=2048)
BENCH = Recent(prompt=42.0, generated=600.0, engine_seconds=12.0)
# 5 running requests of the bench's 642 tokens on 128-token blocks: no room to the end, 10.1 on average, 9.2 at the peaks:
# paced up to 9.
FIVE = EngineNow(5, 0, 0.5, finished=1, prompt_tokens=42, generated_tokens=600, engine_seconds=12, block_size=128)
PACED = Limit(5, "x", target=10, pace_s=1.2, recent=BENCH)  # a target of 10 from an earlier rule: `allowed` takes it as given


def test_a_request_of_one_token_is_a_length() -> None:
    assert intake.first(Bounds(30, kv_tokens=4, max_model_len=1)).value == 5  # 4 of 1 token, +1
    # 3 running hold 3 of 8 tokens: 5 more fit, the limit is 8.
    one = EngineNow(3, 0, 0.0, finished=1, prompt_tokens=1, engine_seconds=0.0)
    limit = intake.room_and_pace(Limit(3, "x"), one, Bounds(30, kv_tokens=8, max_model_len=1))
    assert limit.value == 8 and "holds 5 more request(s) of 1 tokens to their end" in limit.reason
    assert limit.target is None  # no time in the engine known: nothing paced


def test_a_room_of_exactly_n_requests_is_n() -> None:
    # 3 running of 1024 tokens need 3072 of 4096 at their end: exactly one more (no float shortfall).
    assert intake.room(EngineNow(3, 0, 0.0), 4096, 1024.0) == 1
    assert intake.room(EngineNow(3, 0, 0.0, block_size=128), 4096, 1024.0) == 1
    assert intake.room(EngineNow(3, 0, 0.0, block_size=128), 4096, 1025.0) == 0  # 1,025 tokens are 9 blocks
    assert intake.room(EngineNow(0, 0, 0.0), 4096, 4096.0) == 1
    assert intake.room(EngineNow(0, 0, 0.25), 4096, 1024.0) == 3  # what is held now counts


def test_the_start_and_unknown_size_reasons_are_whole_sentences() -> None:
    assert intake.first(Bounds(30)).reason == "the capacity plan gives no KV cache size: up to MAX_CONCURRENCY"
    assert intake.first(Bounds(30, kv_tokens=4096)).value == 30
    assert intake.first(Bounds(30, max_model_len=2048)).value == 30
    assert intake.first(BOUNDS).reason == (
        "start: the KV cache holds 4,096 tokens, 2 request(s) of MAX_MODEL_LEN=2,048 tokens (+1 spare)"
    )
    assert intake.first(Bounds(2, kv_tokens=40960, max_model_len=2048)).value == 2


def test_max_concurrency_one_is_a_limit_of_one() -> None:
    one = Bounds(max_concurrency=1, kv_tokens=4096, max_model_len=2048)
    assert intake.room_and_pace(Limit(1, "x"), None, one).value == 1
    limit = intake.room_and_pace(Limit(1, "x"), FIVE, one)
    assert (limit.value, limit.target) == (1, 1) and "paced" not in limit.reason
    assert intake.Intake(lambda: one, adaptive=False).value == 1
    gate = intake.Intake(lambda: one)
    assert gate.status()["left_in_platform_queue"] == 0 and gate.status()["max_concurrency"] == 1
    assert intake.room_and_pace(Limit(1, "x"), EngineNow(0, 0, 0.0), Bounds(0, 4096, 2048)).value == 1


def test_no_figures_keeps_the_recent_requests() -> None:
    limit = intake.room_and_pace(Limit(3, "x", target=9, pace_s=1.0, waiting=1, recent=BENCH), None, BOUNDS)
    assert limit == Limit(30, intake.NO_FIGURES_REASON, recent=BENCH)


def test_the_recent_requests_length_replaces_max_model_len() -> None:
    limit = intake.room_and_pace(Limit(3, "x", recent=Recent(100.0, 300.0, 0.0)), EngineNow(3, 0, 0.1), BOUNDS)
    assert limit.value == 10 and limit.reason.endswith("holds 7 more request(s) of 400 tokens to their end")
    assert limit.target is None  # engine_seconds 0: no pace


def test_a_length_of_none_or_zero_is_an_unknown_size() -> None:
    zero = intake.room_and_pace(Limit(3, "x", recent=Recent(0.0, 0.0, 1.0)), EngineNow(3, 0, 0.1), BOUNDS)
    assert (zero.value, zero.reason) == (30, intake.NO_KV_REASON)
    assert intake.room_and_pace(Limit(3, "x"), EngineNow(3, 0, 0.1, kv_tokens=4096), Bounds(30)).reason == intake.NO_KV_REASON
    # vLLM's own KV cache size serves where the plan has none.
    own = intake.room_and_pace(Limit(3, "x"), EngineNow(3, 0, 0.1, kv_tokens=4096), Bounds(30, max_model_len=2048))
    assert own.value == 3 and own.reason.startswith("3 running, 0 waiting, KV cache 10% used: the KV cache holds 0 more")


def test_the_paced_reason_says_the_average_the_pace_and_the_target() -> None:
    limit = intake.room_and_pace(Limit(5, "x"), FIVE, BOUNDS)
    assert limit.reason == (
        "5 running, 0 waiting, KV cache 50% used: the KV cache holds 0 more request(s) of 642 tokens to their end; "
        "paced: one more every 1.19 s (59 tokens of a running request apart: a recent request's 600 generated tokens "
        "over the 10.1 the cache holds on average, at 20.0 ms a token now) up to 9, what it holds at their peaks"
    )
    assert limit.recent == BENCH and not limit.waiting


def test_a_target_no_higher_than_the_room_paces_only_a_worker_kept_full() -> None:
    # The room is 29 (1 running); 4,096 / (10 + 5 + 64) holds 51 on average: capped at 30.
    small = EngineNow(1, 0, 0.0, finished=1, prompt_tokens=10, generated_tokens=10, engine_seconds=1, block_size=128)
    limit = intake.room_and_pace(Limit(1, "x"), small, BOUNDS)
    assert (limit.value, limit.target) == (30, 30) and limit.pace_s == pytest.approx(1 / (4096 / 79))
    assert "paced" not in limit.reason
    assert intake.allowed(limit, 3, 0.0, 0.001) == 30  # not kept full: the room at once
    assert intake.allowed(limit, 3, 0.0, 0.001, full_at=0.0) == 3  # kept full a moment ago: a pace apart
    assert intake.allowed(limit, 3, 0.0, 0.02, full_at=0.0) == 4


def test_allowed_at_each_boundary() -> None:
    assert intake.allowed(PACED, 4, None, 0.0) == 5  # under the room: the room
    assert intake.allowed(PACED, 5, None, 0.0) == 6  # at the room, never taken: one more
    assert intake.allowed(PACED, 5, 0.0, 1.2) == 6  # exactly a pace after the last
    assert intake.allowed(PACED, 5, 0.0, 1.19) == 5
    assert intake.allowed(PACED, 9, 0.0, 5.0) == 10
    assert intake.allowed(PACED, 10, 0.0, 5.0) == 10  # the target
    assert intake.allowed(PACED, 12, 0.0, 5.0) == 12  # over it (a lowered target): what it holds
    waiting = Limit(5, "x", target=10, pace_s=1.2, waiting=1, recent=BENCH)
    assert intake.allowed(waiting, 5, None, 5.0) == 5 and intake.allowed(waiting, 3, None, 5.0) == 5
    unpaced = Limit(5, "x")
    assert intake.allowed(unpaced, 3, None, 0.0) == 5 and intake.allowed(unpaced, 7, None, 0.0) == 7
    assert intake.allowed(Limit(5, "x", target=10), 5, None, 0.0) == 5  # a target without a pace
    assert intake.allowed(Limit(5, "x", pace_s=1.0), 5, None, 0.0) == 5  # a pace without a target


def test_a_worker_held_full_less_than_a_requests_time_ago_refills_the_room_paced() -> None:
    # Held its target at 100 s; a request is 12 s in the engine. At 111.9 s a drained engine's room is
    # refilled one a pace apart; at 112 s, all at once again.
    assert intake.allowed(PACED, 2, 111.0, 111.9, full_at=100.0) == 2
    assert intake.allowed(PACED, 2, 110.0, 111.9, full_at=100.0) == 3
    assert intake.allowed(PACED, 2, 111.0, 112.0, full_at=100.0) == 5
    assert intake.allowed(Limit(5, "x", target=10, pace_s=1.2), 2, 111.0, 111.9, full_at=100.0) == 5  # no recent: not busy
    assert intake.allowed(Limit(5, "x", recent=BENCH), 2, 111.0, 111.9, full_at=100.0) == 5  # nothing paced: not busy


def test_the_holder_remembers_when_it_allowed_more_and_when_it_was_full() -> None:
    clock, held = [100.0], [5]
    gate = intake.Intake(lambda: BOUNDS, held=lambda: held[0], clock=lambda: clock[0])
    gate._limit = PACED
    assert gate.allowed_now() == 6 and gate._last_take == 100.0
    clock[0] = 100.5
    assert gate.allowed_now() == 5 and gate._last_take == 100.0  # nothing more allowed: the time kept
    held[0], clock[0] = 10, 101.0
    assert gate.allowed_now() == 10 and gate._full_at == 101.0
    held[0], clock[0] = 2, 102.0
    assert gate.allowed_now() == 3 and gate._full_at == 101.0 and gate._last_take == 102.0
    held[0], clock[0] = 9, 103.0
    assert gate.allowed_now() == 9 and gate._full_at == 101.0  # 9 of 10: not full


def test_the_holder_before_any_read_and_after_one() -> None:
    held = [3]
    gate = intake.Intake(lambda: BOUNDS, held=lambda: held[0])
    assert gate.status()["engine"] is None and gate.status()["recent_requests"] is None
    after = gate.observe(EngineNow(5, 1, 0.12346, preempted=2, finished=3, prompt_tokens=127, generated_tokens=1801,
                                   engine_seconds=36.0004, block_size=128), 100.0)
    assert gate.status() == {
        "adaptive": True,
        "limit": 5,
        "paced_up_to": 5,  # the rule's 9 waits: while one waits in the engine and it preempts, what it runs
        "pace_seconds": round(12.0 / (4096 / (127 / 3 + 1801 / 6 + 64)), 3),
        "max_concurrency": 30,
        "max_num_seqs": None,
        "reason": after.reason,
        "engine": {"running": 5, "waiting": 1, "kv_cache_usage": 0.1235, "preempted_since_last_read": 2, "held_by_worker": 3},
        "recent_requests": {"prompt_tokens": 42.3, "generated_tokens": 600.3, "engine_seconds": 12.0},
        "left_in_platform_queue": 25,
    }
    assert after.reason.endswith(
        "up to 9, what it holds at their peaks, once more jobs have ended than the 1 request(s) waiting inside the engine "
        "(2 preempted since the last read); at most 5 held: the engine has shown room for 5"
    )
    gate.observe(None, 300.0)  # no figures (DISABLE_LOG_STATS): none shown
    assert gate.status()["engine"] is None and gate.value == 30 and gate.status()["left_in_platform_queue"] == 0


def test_the_log_line_names_the_pace_only_when_there_is_one(caplog: pytest.LogCaptureFixture) -> None:
    gate = intake.Intake(lambda: BOUNDS, held=lambda: 3)
    with caplog.at_level(logging.INFO, logger="vllm_worker"):
        gate.observe(EngineNow(3, 0, 0.1), 100.0)  # no room for a request of 2,048 beside 3: still 3, no line
        gate.observe(EngineNow(1, 0, 0.0), 140.0)  # 3 -> 2
        gate.observe(FIVE, 180.0)  # 2 -> 5, paced to 9
        gate.observe(FIVE, 220.0)  # the same: no line
        roomy = EngineNow(0, 0, 0.0, finished=1, prompt_tokens=10, generated_tokens=10, engine_seconds=1, block_size=128)
        # After one short request, the room for 30 of them: taken as the engine shows room, not at once (3 -> 2).
        reason = intake.Intake(lambda: BOUNDS).observe(roomy, 0.0).reason
    lines = [r.getMessage() for r in caplog.records]
    assert [line.split(":")[0] for line in lines] == [
        "taking up to 2 job(s) at once (was 3)",
        "taking up to 6 job(s) at once, then one at a time up to 7 (was 2)",  # the room and one to wait; 5 running + 2
        "taking up to 2 job(s) at once (was 3)",  # no room shown past two of MAX_MODEL_LEN: none to wait in vLLM
    ]
    assert lines[-1].endswith(": " + reason)
    assert reason.endswith("; at most 2 held: the engine has shown room for 2")


def test_bounds_take_whole_positive_figures_only() -> None:
    plan = {"kv_cache_tokens": 1, "max_model_len": 0}
    assert intake.bounds_from(plan, 30) == Bounds(30, 1, None)
    assert intake.bounds_from({"kv_cache_tokens": "4096", "max_model_len": True}, 30) == Bounds(30)


def test_more_jobs_ended_since_the_read_than_waited_lift_its_waiting() -> None:
    # The read saw requests waiting in vLLM (preempted near the peak). Each job the worker answered since
    # then gave its blocks back, and vLLM starts one that waited at its next step: one end more than waited
    # and a paced take need not wait for the next read, up to a second later; as many ends as waited, and
    # a new job would wait behind the last of them.
    waiting = Limit(5, "x", target=10, pace_s=1.2, waiting=2, recent=BENCH)
    assert intake.allowed(waiting, 6, 0.0, 5.0) == 6
    assert intake.allowed(waiting, 6, 0.0, 5.0, ended_since_read=2) == 6
    assert intake.allowed(waiting, 6, 0.0, 5.0, ended_since_read=3) == 7
    assert intake.allowed(waiting, 6, 4.0, 5.0, ended_since_read=3) == 6  # still a pace apart
    assert intake.allowed(PACED, 6, 0.0, 5.0, ended_since_read=0) == 7


def test_the_holder_counts_an_end_from_what_it_holds_and_forgets_it_at_the_next_read() -> None:
    clock, held = [100.0], [7]
    # No request waits inside vLLM on purpose (the one waiting is preempted), and a MAX_MODEL_LEN short enough that
    # the free cache holds one more of it beside what runs: the engine has shown room for 7 while one waits.
    unbuffered = replace(BOUNDS, buffer=0, max_model_len=128)
    gate = intake.Intake(lambda: unbuffered, held=lambda: held[0], clock=lambda: clock[0])
    waits = EngineNow(6, 1, 0.95, finished=1, prompt_tokens=42, generated_tokens=600, engine_seconds=12, block_size=128)
    gate.observe(waits, 100.0)
    # The rule's target of 9, within what the engine holds while one waits in it (6 running, 1 waiting): 7.
    assert gate._limit.waiting and gate._limit.target == 7
    assert gate.allowed_now() == 7  # what waited still waits
    clock[0] = 100.5
    assert gate.allowed_now() == 7 and not gate._ended_since_read  # held the same: nothing ended
    held[0], clock[0] = 8, 101.0  # a take (no end): held rose
    assert gate.allowed_now() == 8 and not gate._ended_since_read
    held[0], clock[0] = 7, 101.5  # one answered: as many ends as waited
    assert gate.allowed_now() == 7 and gate._ended_since_read == 1 and gate._last_take is None
    held[0], clock[0] = 6, 101.6  # another: one more than waited
    assert gate.allowed_now() == 7 and gate._ended_since_read == 2 and gate._last_take == 101.6
    gate.observe(waits, 102.0)  # a new read that still sees one waiting
    held[0], clock[0] = 7, 103.0
    assert not gate._ended_since_read and gate.allowed_now() == 7
    # Three answered between two questions: all counted; the worker held all it was allowed (7) within a request's
    # time, so what ended is refilled paced: one more.
    held[0], clock[0] = 4, 103.5
    assert gate._ended_since_read == 0 and gate.allowed_now() == 5 and gate._ended_since_read == 3


def test_a_time_in_the_engine_too_small_to_divide_paces_nothing() -> None:
    # Hypothesis found it: 5e-324 s over the cache's average is 0.0, a pace of nothing.
    tiny = EngineNow(0, 0, 0.0, finished=1, generated_tokens=1.0, engine_seconds=5e-324)
    limit = intake.room_and_pace(Limit(1, "x"), tiny, Bounds(1, kv_tokens=2))
    assert (limit.target, limit.pace_s) == (None, None)
    assert intake.room_and_pace(Limit(1, "x"), FIVE, BOUNDS).pace_s == pytest.approx(12 / (4096 / 406))


def test_the_status_gives_the_time_in_the_engine_to_the_millisecond() -> None:
    gate = intake.Intake(lambda: BOUNDS, held=lambda: 0)
    gate.observe(EngineNow(0, 0, 0.0, finished=1, prompt_tokens=42, generated_tokens=600, engine_seconds=12.3456), 1.0)
    assert gate.status()["recent_requests"]["engine_seconds"] == 12.346


def test_without_a_kv_cache_size_the_recent_requests_are_still_followed() -> None:
    now = EngineNow(3, 0, 0.3, finished=2, prompt_tokens=20, generated_tokens=40, engine_seconds=4.0)
    limit = intake.room_and_pace(Limit(3, "x"), now, Bounds(30))
    assert limit.reason == intake.NO_KV_REASON and limit.recent == Recent(10.0, 20.0, 2.0)


def test_a_cache_that_holds_less_than_one_request_on_average_still_paces_one_at_a_time() -> None:
    # 256 tokens against a request that holds 406 on average over its life: the room is one, and one is the target.
    now = EngineNow(0, 0, 0.0, finished=1, prompt_tokens=42, generated_tokens=600, engine_seconds=12, block_size=128)
    limit = intake.room_and_pace(Limit(1, "x"), now, Bounds(30, kv_tokens=256, max_model_len=2048))
    assert (limit.value, limit.target) == (1, 1) and limit.pace_s == pytest.approx(12 / (256 / 406))
