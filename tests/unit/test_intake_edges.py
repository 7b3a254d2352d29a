"""serving.intake at its edges: each boundary, each remembered field and each sentence the decision writes.

test_intake.py has the rules and their properties; this file pins what a mutation tester found them
leaving open (mutmut 3.8.1 over serving/intake.py): a boundary off by one, a time not kept, a reason
a user reads in the status job.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from vllm_worker.serving import intake
from vllm_worker.serving.intake import Bounds, EngineNow, Limit

BOUNDS = Bounds(max_concurrency=30, kv_tokens=4096, max_model_len=2048)
# 3 running requests of 400 tokens in 4096: room for 7 more to their end.
ROOMY = EngineNow(running=3, waiting=0, kv_cache_usage=0.1, request_tokens=400.0)


def test_a_request_of_one_token_is_a_length() -> None:
    assert intake.first(Bounds(30, kv_tokens=4, max_model_len=1)).value == 5  # 4 of 1 token, +1
    # A length of one token gives a room: 3 running hold 3 of 8 tokens, 5 more fit.
    one = EngineNow(running=3, waiting=0, kv_cache_usage=0.0, request_tokens=1.0)
    grown = intake.decide(Limit(3, "x"), one, 3, Bounds(30, kv_tokens=8, max_model_len=1), 10.0)
    assert grown.value == 6 and "holds about 5 more request(s) of 1 tokens" in grown.reason


def test_a_room_of_exactly_n_requests_is_n() -> None:
    # 3 running of 1024 tokens need 3072 of 4096 at their end: exactly one more (no float shortfall).
    exact = EngineNow(running=3, waiting=0, kv_cache_usage=0.0, request_tokens=1024.0)
    grown = intake.decide(Limit(3, "x"), exact, 3, BOUNDS, 10.0)
    assert grown.value == 4 and "holds about 1 more request(s) of 1,024 tokens to their end" in grown.reason


def test_the_start_and_no_kv_cache_reasons_are_whole_sentences() -> None:
    assert intake.first(Bounds(30)).reason == "the capacity plan gives no KV cache size: up to MAX_CONCURRENCY"
    assert intake.first(BOUNDS).reason == (
        "start: the KV cache holds 4,096 tokens, 2 request(s) of MAX_MODEL_LEN=2,048 tokens (+1 spare)"
    )
    grown = intake.decide(Limit(3, "x"), EngineNow(running=3, waiting=0, kv_cache_usage=0.3), 3, Bounds(30), 10.0)
    assert grown.value == 4 and grown.reason == "the engine has room (3 running, 0 waiting, KV cache 30% used)"
    # Either figure missing alone is no room to count either: one more.
    no_kv = intake.decide(Limit(3, "x"), EngineNow(3, 0, 0.3, request_tokens=400.0), 3, Bounds(30, max_model_len=2048), 10.0)
    no_length = intake.decide(Limit(3, "x"), EngineNow(3, 0, 0.3), 3, Bounds(30, kv_tokens=4096), 10.0)
    assert no_kv == grown and no_length == grown


def test_max_concurrency_one_is_a_limit_of_one() -> None:
    one = Bounds(max_concurrency=1, kv_tokens=4096, max_model_len=2048)
    assert intake.decide(Limit(1, "x"), None, 1, one, 1.0).value == 1
    assert intake.decide(Limit(1, "x"), ROOMY, 1, one, 1.0).value == 1
    assert intake.Intake(lambda: one, adaptive=False).value == 1
    gate = intake.Intake(lambda: one)
    assert gate.status()["left_in_platform_queue"] == 0 and gate.status()["max_concurrency"] == 1


def test_no_figures_is_a_change_at_that_time_and_forgets_a_waiting_read() -> None:
    waited = Limit(3, "x", waited_before=True)
    limit = intake.decide(waited, None, 3, BOUNDS, 7.0)
    assert limit.changed_at == 7.0 and limit.waited_before is False and limit.dropped_at is None


def test_a_preemption_never_leaves_the_limit_over_max_concurrency() -> None:
    # A restart's bounds may be lower than the limit the old engine reached.
    now = EngineNow(running=35, waiting=0, kv_cache_usage=0.99, preempted=1)
    limit = intake.decide(Limit(40, "x"), now, 40, BOUNDS, 5.0)
    assert limit.value == 30 and limit.ceiling == 30


def test_a_drop_keeps_its_time_and_the_waiting_read() -> None:
    now = EngineNow(running=5, waiting=3, kv_cache_usage=0.99, preempted=2)
    limit = intake.decide(Limit(8, "x"), now, 8, BOUNDS, 3.0)
    assert (limit.value, limit.changed_at, limit.dropped_at, limit.waited_before) == (6, 3.0, 3.0, True)
    # The same read again with the limit already there: holding, the time of the drop unchanged.
    again = intake.decide(Limit(6, "x", changed_at=1.0, dropped_at=1.0), now, 6, BOUNDS, 4.0)
    assert again.value == 5 and again.dropped_at == 4.0
    # At a limit of one: holding, the times of the last change and drop unchanged.
    held = intake.decide(Limit(1, "x", changed_at=1.0, dropped_at=1.0), now, 1, BOUNDS, 4.0)
    assert (held.value, held.changed_at, held.dropped_at, held.waited_before) == (1, 1.0, 1.0, True)
    assert held.reason.endswith(": holding") and held.ceiling == 1


def test_requests_waiting_in_two_reads_lower_to_what_runs_plus_one() -> None:
    # A request waiting at the previous read only: not two in a row.
    quiet = intake.decide(Limit(8, "x", waited_before=True), ROOMY, 8, BOUNDS, 10.0)
    assert quiet.value == 10 and quiet.waited_before is False  # it grows: room for 7, 5 of them taken already
    crowded = EngineNow(running=0, waiting=4, kv_cache_usage=0.97)
    limit = intake.decide(Limit(8, "x", waited_before=True), crowded, 8, BOUNDS, 10.0)
    assert (limit.value, limit.ceiling, limit.changed_at, limit.dropped_at, limit.waited_before) == (1, 0, 10.0, 10.0, True)
    assert limit.reason == (
        "requests wait inside the engine (0 running, 4 waiting, KV cache 97% used): taking what it runs +1"
    )
    holding = intake.decide(Limit(1, "x", waited_before=True), crowded, 1, BOUNDS, 11.0)
    assert holding.reason.endswith("97% used): holding") and holding.changed_at is None


def test_growth_stops_at_kv_high_and_at_max_concurrency_with_the_reason_kept() -> None:
    assert intake.decide(Limit(3, "x"), EngineNow(3, 0, intake.KV_HIGH, request_tokens=400.0), 3, BOUNDS, 10.0).value == 3
    assert intake.decide(Limit(3, "x"), EngineNow(3, 0, intake.KV_HIGH - 0.01, request_tokens=400.0), 3, BOUNDS, 10.0).value == 4
    top = intake.decide(Limit(30, "kept"), EngineNow(30, 0, 0.1, request_tokens=10.0), 30, BOUNDS, 10.0)
    assert top.value == 30 and top.reason == "kept" and top.changed_at is None


@pytest.mark.parametrize("since", [intake.GROW_EVERY_S - 0.5, intake.GROW_EVERY_S])
def test_growth_waits_grow_every_s_after_a_change(since: float) -> None:
    limit = intake.decide(Limit(3, "x", changed_at=100.0, waited_before=True), ROOMY, 3, BOUNDS, 100.0 + since)
    assert limit.value == (6 if since >= intake.GROW_EVERY_S else 3)
    assert limit.waited_before is False


@pytest.mark.parametrize("since", [intake.GROW_EVERY_S, intake.HOLD_S - 0.5, intake.HOLD_S])
def test_growth_waits_hold_s_after_a_drop(since: float) -> None:
    dropped = Limit(3, "x", changed_at=100.0, dropped_at=100.0, waited_before=True)
    limit = intake.decide(dropped, ROOMY, 3, BOUNDS, 100.0 + since)
    assert limit.value == (6 if since >= intake.HOLD_S else 3)
    assert limit.waited_before is False


def test_a_grown_limit_keeps_its_time_its_reason_and_the_drop_before_it() -> None:
    limit = intake.decide(Limit(3, "x", dropped_at=1.0, waited_before=True), ROOMY, 3, BOUNDS, 100.0)
    assert (limit.value, limit.changed_at, limit.dropped_at, limit.waited_before) == (6, 100.0, 1.0, False)
    assert limit.reason == (
        "the KV cache holds about 7 more request(s) of 400 tokens to their end (3 running, 0 waiting, KV cache 10% used)"
    )


def test_the_probe_waits_probe_every_s_and_says_so() -> None:
    full = EngineNow(running=10, waiting=0, kv_cache_usage=0.5, request_tokens=400.0)  # no room to the end
    never = intake.decide(Limit(10, "x"), full, 10, BOUNDS, 100.0)
    assert never.value == 11 and never.reason.startswith("the engine copes with what it runs: one more (10 running")
    soon = intake.decide(Limit(10, "x", changed_at=90.0, waited_before=True), full, 10, BOUNDS, 100.0)
    assert soon.value == 10 and soon.waited_before is False


def test_past_the_last_full_engine_growth_is_one_at_a_time_from_the_limit() -> None:
    # The limit already past the ceiling (it grew one at a time since): the next step is +1, not back down.
    wide = EngineNow(running=8, waiting=0, kv_cache_usage=0.1, request_tokens=100.0)
    assert intake.decide(Limit(8, "x", ceiling=5), wide, 8, BOUNDS, 100.0).value == 9


def test_bounds_take_whole_positive_figures_only() -> None:
    plan = {"capacity_plan": {"kv_cache_tokens": 1, "max_model_len": 0}}
    assert intake.bounds_from(plan, 30) == Bounds(30, 1, None)
    assert intake.bounds_from({"capacity_plan": {"kv_cache_tokens": "4096", "max_model_len": True}}, 30) == Bounds(30)


def test_the_holder_before_any_read_and_after_one() -> None:
    held = [3]
    gate = intake.Intake(lambda: BOUNDS, held=lambda: held[0])
    assert gate.status()["engine"] is None
    now = EngineNow(running=3, waiting=0, kv_cache_usage=0.12346, preempted=0, request_tokens=400.46)
    after = gate.observe(now, 100.0)
    assert after.value == 6 and after.changed_at == 100.0  # the held count and the time reach the decision
    assert gate.status() == {
        "adaptive": True,
        "limit": 6,
        "max_concurrency": 30,
        "reason": after.reason,
        "engine": {
            "running": 3,
            "waiting": 0,
            "kv_cache_usage": 0.1235,
            "preempted_since_last_read": 0,
            "request_tokens": 400.5,
            "held_by_worker": 3,
        },
        "left_in_platform_queue": 24,
    }
    held[0] = 2  # fewer held than the limit: no growth
    gate.observe(EngineNow(running=2, waiting=0, kv_cache_usage=0.1), 200.0)
    assert gate.value == 6 and gate.status()["engine"]["request_tokens"] is None
    gate.observe(None, 300.0)  # no figures (DISABLE_LOG_STATS): none shown
    assert gate.status()["engine"] is None and gate.value == 30


def test_the_log_line_counts_the_changes_since_the_last_one(caplog: pytest.LogCaptureFixture) -> None:
    gate = intake.Intake(lambda: BOUNDS, held=lambda: 3)
    preempt = EngineNow(running=20, waiting=0, kv_cache_usage=0.99, preempted=1)
    with caplog.at_level(logging.INFO, logger="vllm_worker"):
        gate.observe(ROOMY, 100.0)  # 3 -> 6: logged
        gate.observe(preempt, 110.0)  # 6 -> 5, within LOG_EVERY_S of the last line
        gate.observe(preempt, 130.0)  # 5 -> 4, LOG_EVERY_S after it: logged with 2 changes
        gate.observe(preempt, 160.0)  # 4 -> 3: logged alone
    lines = [r.getMessage() for r in caplog.records]
    assert [line.split(":")[0] for line in lines] == [
        "taking up to 6 job(s) at once (was 3)",
        "taking up to 4 job(s) at once (was 6; 2 changes since the last line)",
        "taking up to 3 job(s) at once (was 4)",
    ]


def test_a_request_holds_whole_kv_cache_blocks() -> None:
    # vLLM's CPU backend: 4,096 tokens are 32 blocks of 128; a request of 642 tokens holds 6 (768).
    # 3 running will hold 18 blocks at their end: 14 left hold 2 more such requests, not the 3 that
    # 4,096 - 3 x 642 tokens would give.
    cpu = EngineNow(running=3, waiting=0, kv_cache_usage=0.1, request_tokens=642.0, block_size=128)
    assert intake.decide(Limit(3, "x"), cpu, 3, BOUNDS, 10.0).value == 5
    assert intake.decide(Limit(3, "x"), replace(cpu, block_size=None), 3, BOUNDS, 10.0).value == 6
    # 5 running of 768 need 30 of 32 blocks: no room to their end (one more only as a probe, later).
    five = replace(cpu, running=5)
    assert intake.decide(Limit(5, "x", changed_at=9.0), five, 5, BOUNDS, 12.0).value == 5
    # A length of whole blocks needs no more than itself: 1,024 tokens are 8 blocks of 128.
    exact = EngineNow(running=3, waiting=0, kv_cache_usage=0.0, request_tokens=1024.0, block_size=128)
    assert intake.decide(Limit(3, "x"), exact, 3, BOUNDS, 10.0).value == 4
