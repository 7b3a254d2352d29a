"""The load figures and the KV-cache warning, from vLLM's /metrics text (pure functions).

The text below has the shape vLLM 0.32's CPU engine serves (one series per engine, labels
`engine` and `model_name`, counters with `_total` and `_created`); tests/engine/test_platform_life.py
reads the real one.
"""

from __future__ import annotations

import logging

import pytest

from vllm_worker.config.profile import LaunchProfile
from vllm_worker.serving import engine_load


def metrics(running: float, waiting: float, kv: float, preemptions: float, prompt: float = 0, generated: float = 0,
            queries: float = 0, hits: float = 0, engines: int = 1) -> str:
    lines = ["# HELP vllm:num_requests_running Number of requests in model execution batches.",
             "# TYPE vllm:num_requests_running gauge"]
    for e in range(engines):
        labels = f'{{engine="{e}",model_name="org/model"}}'
        lines += [
            f"vllm:num_requests_running{labels} {running}",
            f"vllm:num_requests_waiting{labels} {waiting}",
            f'vllm:num_requests_waiting_by_reason{{engine="{e}",model_name="org/model",reason="capacity"}} {waiting}',
            f"vllm:kv_cache_usage_perc{labels} {kv}",
            f"vllm:num_preemptions_total{labels} {preemptions}",
            f"vllm:num_preemptions_created{labels} 1.79e+09",
            f"vllm:prompt_tokens_total{labels} {prompt}",
            f"vllm:generation_tokens_total{labels} {generated}",
            f"vllm:prefix_cache_queries_total{labels} {queries}",
            f"vllm:prefix_cache_hits_total{labels} {hits}",
        ]
    return "\n".join(lines) + "\n"


def test_a_read_sums_the_engines_and_keeps_the_fullest_kv_cache() -> None:
    sample = engine_load.parse(metrics(2, 3, 0.5, 4, prompt=100, generated=50, engines=2), at=7.0)
    assert sample == engine_load.Sample(7.0, 0.5, 4, 6, 8, 200, 100, 0, 0)


def test_without_statistics_there_are_no_figures_and_the_status_says_why() -> None:
    assert engine_load.parse("# vLLM with DISABLE_LOG_STATS=true\npython_gc_objects_collected_total 1.0\n", 0) is None
    assert engine_load.figures(None, None) == {"available": False, "reason": engine_load.NO_STATS}


def test_rates_are_over_the_time_since_the_previous_read_of_the_same_engine() -> None:
    before = engine_load.parse(metrics(1, 0, 0.2, 0, prompt=100, generated=1000, queries=100, hits=0), at=10.0)
    now = engine_load.parse(metrics(4, 2, 0.9, 3, prompt=300, generated=3000, queries=300, hits=150), at=20.0)
    report = engine_load.figures(now, before)
    assert report == {
        "available": True,
        "kv_cache_usage": 0.9,
        "running": 4,
        "waiting": 2,
        "preemptions": 3,
        "prefix_cache_hit_rate": 0.5,
        "prompt_tokens_per_s": 20.0,
        "generation_tokens_per_s": 200.0,
        "over_seconds": 10.0,
    }
    # A restarted engine counts from 0 again: no rate across the restart.
    restarted = engine_load.parse(metrics(0, 0, 0.0, 0, prompt=5, generated=5), at=30.0)
    assert engine_load.figures(restarted, now)["generation_tokens_per_s"] is None


ENV = {"MAX_NUM_SEQS": "16", "MAX_MODEL_LEN": "8192", "TENSOR_PARALLEL_SIZE": "2"}


def test_preemptions_are_warned_about_with_the_figures_and_the_settings_that_help() -> None:
    before = engine_load.parse(metrics(4, 0, 0.8, 2), at=0.0)
    now = engine_load.parse(metrics(4, 4, 0.97, 10), at=10.0)
    assert before is not None and now is not None
    warning = engine_load.advice(before, now, LaunchProfile.parse(ENV), 12)
    assert warning is not None
    assert warning.startswith("The engine is short of KV cache: 8 requests were preempted in the last 10 s")
    assert "KV cache 97% used, 4 running, 4 waiting, 10 preemptions since the engine started" in warning
    for piece in ("MAX_NUM_SEQS, now 16", "MAX_CONCURRENCY, now 12", "MAX_MODEL_LEN (now 8192)",
                  "KV_CACHE_DTYPE=fp8 (now auto)", "a larger card", "TENSOR_PARALLEL_SIZE above 2"):
        assert piece in warning


@pytest.mark.parametrize(
    "before, now, warned",
    [
        ((2, 3, 0.96, 0), (2, 3, 0.97, 0), True),  # full twice with requests waiting
        ((2, 0, 0.96, 0), (2, 0, 0.97, 0), False),  # full, nobody waiting: the cache is just well used
        ((2, 3, 0.50, 0), (2, 3, 0.97, 0), False),  # full once is not "stays full"
        ((2, 0, 0.30, 1), (2, 0, 0.30, 1), False),  # old preemptions are not new ones
    ],
)
def test_a_full_kv_cache_is_warned_about_only_when_it_stays_full_with_requests_waiting(
    before: tuple[float, ...], now: tuple[float, ...], warned: bool
) -> None:
    first = engine_load.parse(metrics(*before), at=0.0)
    second = engine_load.parse(metrics(*now), at=10.0)
    assert second is not None
    assert (engine_load.advice(first, second, LaunchProfile.parse({}), 30) is not None) is warned


def test_the_watch_warns_at_most_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    watch = engine_load.LoadWatch("127.0.0.1", 1, lambda: LaunchProfile.parse({}), 30)
    caplog.set_level(logging.WARNING, logger="vllm_worker")
    reads = [engine_load.parse(metrics(4, 4, 0.9, n), at=10.0 * i) for i, n in enumerate([0, 2, 5, 9])]
    later = engine_load.parse(metrics(4, 4, 0.9, 20), at=10.0 + engine_load.WARN_EVERY_S)
    warnings = [watch.observe(sample) for sample in [*reads, later] if sample is not None]
    assert [w is not None for w in warnings] == [False, True, False, False, True]
    # The next warning counts every preemption since the last one.
    assert warnings[-1] is not None and "18 requests were preempted" in warnings[-1]
    assert len(caplog.records) == 2


def test_preemptions_before_the_first_read_of_an_engine_are_counted_since_it_started() -> None:
    first = engine_load.parse(metrics(0, 0, 0.1, 6), at=3.0)
    assert first is not None
    warning = engine_load.advice(None, first, LaunchProfile.parse({}), 30)
    assert warning is not None and "6 requests were preempted since the engine started" in warning
    assert engine_load.advice(None, engine_load.parse(metrics(0, 0, 0.1, 0), at=3.0), LaunchProfile.parse({}), 30) is None


def test_preemptions_after_a_full_cache_warning_are_warned_about_at_once(caplog: pytest.LogCaptureFixture) -> None:
    """CI saw it: the cache stayed full with requests waiting (warned), then requests were preempted
    seconds later; the user must read the worse news without waiting WARN_EVERY_S."""
    watch = engine_load.LoadWatch("127.0.0.1", 1, lambda: LaunchProfile.parse({}), 30)
    caplog.set_level(logging.WARNING, logger="vllm_worker")
    # full, full (warned: stays full), preempted 3 (warned at once), preempted 4 more (within the interval)
    reads = [engine_load.parse(metrics(3, 5, 0.97, n), at=10.0 * i) for i, n in enumerate([0, 0, 3, 7])]
    warnings = [watch.observe(sample) for sample in reads if sample is not None]
    assert [w is not None for w in warnings] == [False, True, True, False]
    assert warnings[1] is not None and "stayed full for 10 s" in warnings[1]
    assert warnings[2] is not None and "3 requests were preempted in the last 10 s" in warnings[2]
    assert len(caplog.records) == 2


def test_an_engine_that_does_not_answer_the_status_job_in_time_gets_the_last_read_said_to_be_that() -> None:
    # CI measured a status job during a burst on two busy cores answered "vLLM keeps no statistics
    # with DISABLE_LOG_STATS=true": its read had only timed out.
    clock = [40.0]
    watch = engine_load.LoadWatch("127.0.0.1", 1, lambda: LaunchProfile.parse({}), 30, clock=lambda: clock[0])
    nothing = watch.status(None, answered=False)
    assert nothing == {"available": False, "reason": engine_load.NO_ANSWER.format(seconds=engine_load.STATUS_READ_TIMEOUT_S)}
    assert "DISABLE_LOG_STATS" not in nothing["reason"] and "did not answer within 10 s" in nothing["reason"]
    watch.last = engine_load.parse(metrics(1, 0, 0.2, 0, generated=100), at=20.0)
    watch.latest = engine_load.parse(metrics(3, 2, 0.9, 1, generated=700), at=32.5)
    stale = watch.status(None, answered=False)
    assert stale["available"] is True and (stale["running"], stale["waiting"], stale["kv_cache_usage"]) == (3, 2, 0.9)
    assert stale["generation_tokens_per_s"] == 48.0 and stale["read_seconds_ago"] == 7.5
    assert stale["stale"].endswith("these are the worker's last read")
    # An answer without figures is still vLLM without statistics.
    assert watch.status(None, answered=True) == {"available": False, "reason": engine_load.NO_STATS}
