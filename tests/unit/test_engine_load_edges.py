"""serving.engine_load at its edges: the KV cache's size, odd lines in /metrics, each rounding, each sentence.

test_engine_load.py has the figures and the warning's rules; this file pins what a mutation tester found
them leaving open (mutmut 3.8.1 over serving/engine_load.py): a boundary off by one, a figure rounded to
another place, a label not read, and the parts no unit test reached: `read` and the watch's thread, here
against a real /metrics endpoint on 127.0.0.1 answering vLLM 0.32's text.
"""

from __future__ import annotations

import contextlib
import http.server
import logging
import socket
import threading
from typing import Callable, Iterator

import pytest

from vllm_worker.config.profile import LaunchProfile
from vllm_worker.serving import engine_load, intake
from vllm_worker.serving.intake import Bounds, EngineNow

# vLLM 0.32's cache_config_info labels (CacheConfig.metrics_info()) for a KV cache of 32 blocks of 128 tokens.
CACHE_INFO = (
    'block_size="128",cache_dtype="auto",calculate_kv_scales="False",cpu_offload_gb="0",'
    'enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",is_attention_free="False",'
    'num_cpu_blocks="None",num_gpu_blocks="32",num_gpu_blocks_override="None",'
    'prefix_caching_hash_algo="sha256",sliding_window="None",swap_space="4",swap_space_bytes="4294967296"'
)
DEFAULTS = LaunchProfile.parse({})
# The sentence's tail for a profile of defaults and MAX_CONCURRENCY=30.
HELPS = (
    "What helps: fewer sequences at once (MAX_NUM_SEQS, now the worker's default, and MAX_CONCURRENCY, now 30), "
    "a shorter MAX_MODEL_LEN (now the model's), KV_CACHE_DTYPE=fp8 (now auto), or more memory for the KV cache: "
    "a larger card, or TENSOR_PARALLEL_SIZE above 1."
)


def metrics(running: int = 0, waiting: int = 0, kv: float | None = 0.1, preemptions: int = 0, prompt: int = 0,
            generated: int = 0, queries: int = 0, hits: int = 0, finished: int = 0, finished_prompt: int = 0,
            finished_generated: int = 0, finished_seconds: float = 0.0, cache_info: str | None = CACHE_INFO,
            model: str = "org/model") -> str:
    """/metrics as vLLM 0.32 serves it for one engine (kv=None: without the KV cache gauge)."""
    labels = f'{{engine="0",model_name="{model}"}}'
    lines = []
    if cache_info is not None:
        lines += ["# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
                  "# TYPE vllm:cache_config_info gauge", f"vllm:cache_config_info{{{cache_info}}} 1.0"]
    lines += [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{labels} {float(running)}",
        f"vllm:num_requests_waiting{labels} {float(waiting)}",
    ]
    if kv is not None:
        lines.append(f"vllm:kv_cache_usage_perc{labels} {kv}")
    lines += [
        f"vllm:num_preemptions_total{labels} {float(preemptions)}",
        f"vllm:num_preemptions_created{labels} 1.7900000e+09",
        f"vllm:prompt_tokens_total{labels} {float(prompt)}",
        f"vllm:generation_tokens_total{labels} {float(generated)}",
        f"vllm:prefix_cache_queries_total{labels} {float(queries)}",
        f"vllm:prefix_cache_hits_total{labels} {float(hits)}",
        f'vllm:request_prompt_tokens_bucket{{engine="0",le="+Inf",model_name="{model}"}} {float(finished)}',
        f"vllm:request_prompt_tokens_count{labels} {float(finished)}",
        f"vllm:request_prompt_tokens_sum{labels} {float(finished_prompt)}",
        f"vllm:request_generation_tokens_count{labels} {float(finished)}",
        f"vllm:request_generation_tokens_sum{labels} {float(finished_generated)}",
        f"vllm:request_inference_time_seconds_count{labels} {float(finished)}",
        f"vllm:request_inference_time_seconds_sum{labels} {float(finished_seconds)}",
    ]
    return "\n".join(lines) + "\n"


def sample(at: float, **figures: int | float | str | None) -> engine_load.Sample:
    read = engine_load.parse(metrics(**figures), at)  # type: ignore[arg-type]
    assert read is not None
    return read


class Engine:
    """A /metrics endpoint on 127.0.0.1: `body(n)` answers the n-th request (1, 2, ...)."""

    def __init__(self, body: Callable[[int], bytes]) -> None:
        self.body = body
        self.requests = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                outer.requests += 1
                data = outer.body(outer.requests)
                with contextlib.suppress(ConnectionError):  # a reader that gave up has gone
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's name)
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self.url = engine_load.metrics_url("127.0.0.1", self.port)


@contextlib.contextmanager
def serving(body: Callable[[int], bytes]) -> Iterator[Engine]:
    engine = Engine(body)
    thread = threading.Thread(target=engine.server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    try:
        yield engine
    finally:
        engine.server.shutdown()
        engine.server.server_close()


def ticks(step: float) -> Callable[[], float]:
    """A clock that moves `step` on at each reading (1 step, 2 steps, ...)."""
    count = [0]

    def clock() -> float:
        count[0] += 1
        return count[0] * step

    return clock


# --- parse: the KV cache's size and lines out of the ordinary ---


def test_the_kv_cache_size_is_its_blocks_times_the_block_size() -> None:
    assert sample(1.0).kv_tokens == 32 * 128


@pytest.mark.parametrize("written, tokens", [("5000", 5000), ("", 4096), ("None", 4096)])
def test_a_kv_cache_size_in_tokens_wins_over_the_blocks_when_it_is_given(written: str, tokens: int) -> None:
    info = CACHE_INFO.replace('is_attention_free="False"', f'is_attention_free="False",kv_cache_size_tokens="{written}"')
    assert sample(1.0, cache_info=info).kv_tokens == tokens


def test_a_cache_config_without_a_size_gives_none() -> None:
    # Before the engine has profiled its memory vLLM writes num_gpu_blocks="None".
    assert sample(1.0, cache_info=CACHE_INFO.replace('num_gpu_blocks="32"', 'num_gpu_blocks="None"')).kv_tokens is None
    assert sample(1.0, cache_info=None).kv_tokens is None


def test_a_served_model_name_with_spaces_and_braces_keeps_every_figure() -> None:
    # SERVED_MODEL_NAME is the user's text; Prometheus writes label values as they are.
    read = sample(5.0, running=2, waiting=1, kv=0.25, preemptions=3, prompt=40, generated=9, model="team a/chat {v2}")
    assert read == engine_load.Sample(5.0, 0.25, 2, 1, 3, 40, 9, 0, 0, kv_tokens=4096, block_size=128)


def test_a_series_without_labels_is_read_too() -> None:
    text = "vllm:num_requests_running 3.0\nvllm:num_requests_waiting 1.0\nvllm:kv_cache_usage_perc 0.5\n"
    assert engine_load.parse(text, 1.0) == engine_load.Sample(1.0, 0.5, 3, 1, 0, 0, 0, 0, 0)


def test_a_line_without_a_readable_value_is_skipped_and_the_lines_after_it_are_still_read() -> None:
    text = (
        'vllm:kv_cache_usage_perc{engine="0",model_name="org/model"} NaN\n'
        'vllm:num_requests_waiting{engine="0",model_name="org/model"} \n'
        "vllm:num_requests_waiting\n"
        'vllm:num_requests_running{engine="0",model_name="org/model"} 4.0\n'
        'vllm:num_requests_waiting{engine="1",model_name="org/model"} 2.0\n'
    )
    assert engine_load.parse(text, 1.0) == engine_load.Sample(1.0, 0.0, 4, 2, 0, 0, 0, 0, 0)


def test_a_read_without_the_kv_cache_gauge_is_an_empty_kv_cache() -> None:
    assert sample(1.0, running=1, kv=None).kv_cache_usage == 0.0


# --- figures: the status job's rounding ---


def test_rates_and_time_are_to_a_tenth_and_usage_and_hit_rate_to_four_places() -> None:
    before = sample(10.0, prompt=1000, generated=500, queries=2, hits=0)
    now = sample(13.37, kv=0.0234375, prompt=2000, generated=750, queries=3, hits=1)  # 3 of 128 blocks
    report = engine_load.figures(now, before)
    assert (report["kv_cache_usage"], report["prefix_cache_hit_rate"]) == (0.0234, 0.3333)
    assert (report["prompt_tokens_per_s"], report["generation_tokens_per_s"], report["over_seconds"]) == (296.7, 74.2, 3.4)


def test_one_prefix_cache_query_is_a_hit_rate() -> None:
    assert engine_load.figures(sample(1.0, queries=1, hits=1), None)["prefix_cache_hit_rate"] == 1.0


# --- engine_now: what the intake decision reads ---


def test_the_intake_reads_a_first_read_with_no_preemptions_and_what_finished_since_the_engine_started() -> None:
    first = sample(1.0, running=2, waiting=1, kv=0.5, preemptions=4)
    assert engine_load.engine_now(first, None) == EngineNow(2, 1, 0.5, preempted=0, kv_tokens=4096, block_size=128)
    done = sample(1.0, running=2, finished=2, finished_prompt=84, finished_generated=1200, finished_seconds=24.5)
    assert engine_load.engine_now(done, None) == EngineNow(
        2, 0, 0.1, finished=2, prompt_tokens=84, generated_tokens=1200, engine_seconds=24.5, kv_tokens=4096, block_size=128
    )


def test_the_intake_reads_the_preemptions_and_the_requests_finished_since_the_last_read() -> None:
    before = sample(1.0, running=2, preemptions=4, generated=900, finished=3, finished_prompt=100, finished_generated=50,
                    finished_seconds=1.5)
    now = sample(2.5, running=3, kv=0.9, preemptions=7, generated=1150, finished=4, finished_prompt=400, finished_generated=62,
                 finished_seconds=2.75)
    assert engine_load.engine_now(now, before) == EngineNow(
        3, 0, 0.9, preempted=3, finished=1, prompt_tokens=300, generated_tokens=12, engine_seconds=1.25, kv_tokens=4096,
        block_size=128, generated_now=250, seconds=1.5, running_before=2,
    )
    # The first read of an engine: no step to see (what it generated since it started took an unknown time).
    first = engine_load.engine_now(now, None)
    assert first is not None and (first.generated_now, first.seconds, first.running_before) == (0.0, 0.0, None)
    # Reads half a second apart: half a second (the load watch reads about every second, a status job between).
    soon = engine_load.engine_now(
        sample(1.5, running=2, preemptions=4, generated=1000, finished=3, finished_prompt=100, finished_generated=50,
               finished_seconds=1.5),
        before,
    )
    assert soon is not None and soon.seconds == 0.5 and soon.generated_now == 100
    assert now.finished_engine_seconds == 2.75  # a sum of seconds stays a fraction


def test_the_intake_counts_no_preemptions_across_an_engine_restart() -> None:
    old = sample(1.0, preemptions=5, prompt=1000)
    restarted = sample(2.0, preemptions=2, prompt=10)
    assert engine_load.engine_now(restarted, old).preempted == 0  # type: ignore[union-attr]


# --- advice: the boundaries and the whole sentence ---


def test_a_kv_cache_at_exactly_kv_full_with_one_request_waiting_is_full() -> None:
    before = sample(0.0, running=2, waiting=1, kv=engine_load.KV_FULL)
    now = sample(10.0, running=2, waiting=1, kv=engine_load.KV_FULL)
    assert engine_load.advice(before, now, DEFAULTS, 30) == (
        "The engine is short of KV cache: the KV cache stayed full for 10 s with requests waiting; "
        "KV cache 95% used, 2 running, 1 waiting, 0 preemptions since the engine started. " + HELPS
    )


def test_one_preemption_is_one_request_was_preempted() -> None:
    before = sample(0.0, running=2, kv=0.5, preemptions=2)
    now = sample(10.0, running=2, kv=0.5, preemptions=3)
    warning = engine_load.advice(before, now, DEFAULTS, 30)
    assert warning is not None and warning.startswith(
        "The engine is short of KV cache: 1 request was preempted in the last 10 s (their KV cache freed"
    )


def test_preemptions_after_a_restart_are_counted_since_the_engine_started() -> None:
    old = sample(0.0, preemptions=10, prompt=5000)
    restarted = sample(10.0, preemptions=3, prompt=20)
    warning = engine_load.advice(old, restarted, DEFAULTS, 30)
    assert warning is not None and "3 requests were preempted since the engine started (" in warning


# --- LoadWatch.observe: what is logged, and when ---


def test_the_watch_logs_the_sentence_it_returns(caplog: pytest.LogCaptureFixture) -> None:
    watch = engine_load.LoadWatch("127.0.0.1", 1, lambda: DEFAULTS, 30)
    caplog.set_level(logging.WARNING, logger="vllm_worker")
    warning = watch.observe(sample(3.0, running=1, kv=0.4, preemptions=1))
    assert warning == (
        "The engine is short of KV cache: 1 request was preempted since the engine started (their KV cache freed "
        "for others and their work recomputed later, which slows every reply); KV cache 40% used, 1 running, "
        "0 waiting, 1 preemptions since the engine started. " + HELPS
    )
    assert [record.getMessage() for record in caplog.records] == [warning]


def test_one_preemption_after_a_full_cache_warning_is_warned_about_at_once() -> None:
    watch = engine_load.LoadWatch("127.0.0.1", 1, lambda: DEFAULTS, 30)
    reads = [sample(10.0 * i, running=3, waiting=5, kv=0.97, preemptions=n) for i, n in enumerate([0, 0, 1])]
    warnings = [watch.observe(read) for read in reads]
    assert warnings[0] is None and warnings[1] is not None and "stayed full for 10 s" in warnings[1]
    assert warnings[2] is not None and "1 request was preempted in the last 10 s" in warnings[2]


def test_preemptions_before_a_full_cache_warning_do_not_hide_new_ones_after_it() -> None:
    watch = engine_load.LoadWatch("127.0.0.1", 1, lambda: DEFAULTS, 30)
    later = engine_load.WARN_EVERY_S + 100.0
    warnings = [
        watch.observe(sample(0.0, running=3, waiting=5, kv=0.97, preemptions=2)),  # preempted before the first read
        watch.observe(sample(later, running=3, waiting=5, kv=0.97, preemptions=2)),  # full since, none preempted
        watch.observe(sample(later + 10.0, running=3, waiting=5, kv=0.97, preemptions=5)),  # worse news: at once
    ]
    assert warnings[0] is not None and "2 requests were preempted since the engine started" in warnings[0]
    assert warnings[1] is not None and f"stayed full for {later:.0f} s" in warnings[1]
    assert warnings[2] is not None and "3 requests were preempted in the last 10 s" in warnings[2]


def test_the_watch_warns_at_most_once_per_interval_on_a_clock_far_from_zero() -> None:
    # time.monotonic() is the machine's uptime: thousands of seconds, not 0.
    watch = engine_load.LoadWatch("127.0.0.1", 1, lambda: DEFAULTS, 30)
    start = 86_400.0
    warned = [watch.observe(sample(start + 10.0 * i, running=4, waiting=4, kv=0.9, preemptions=2 * i + 1)) is not None
              for i in range(3)]
    assert warned == [True, False, False]


# --- LoadWatch.status ---


def test_the_status_job_gets_the_fresh_read_with_rates_since_the_watchs_last_read() -> None:
    watch = engine_load.LoadWatch("127.0.0.1", 1, lambda: DEFAULTS, 30)
    watch.last = sample(10.0, prompt=100, generated=1000)
    report = watch.status(sample(20.0, running=2, prompt=300, generated=1500))
    assert (report["available"], report["running"]) == (True, 2)
    assert (report["prompt_tokens_per_s"], report["generation_tokens_per_s"], report["over_seconds"]) == (20.0, 50.0, 10.0)


def test_a_stale_read_says_its_age_to_a_tenth_of_a_second_and_has_no_rates_over_itself() -> None:
    clock = [40.0]
    watch = engine_load.LoadWatch("127.0.0.1", 1, lambda: DEFAULTS, 30, clock=lambda: clock[0])
    watch.last = watch.latest = sample(39.66, running=3, generated=700)
    stale = watch.status(None, answered=False)
    assert (stale["running"], stale["read_seconds_ago"], stale["generation_tokens_per_s"]) == (3, 0.3, None)
    clock[0] = 39.0  # a clock read before the read's own time: no negative age
    assert watch.status(None, answered=False)["read_seconds_ago"] == 0.0


# --- LoadWatch.feed_intake: the intake decision on the watch's reads ---


BOUNDS = Bounds(max_concurrency=30, kv_tokens=4096, max_model_len=2048)  # starts at 3


def test_the_intake_reads_the_requests_finished_between_its_reads() -> None:
    gate: intake.Intake
    gate = intake.Intake(lambda: BOUNDS, held=lambda: 3)
    watch = engine_load.LoadWatch("127.0.0.1", 1, lambda: DEFAULTS, 30, clock=lambda: 0.0, intake=gate)
    # 4 finished before the first read: 75 + 25 tokens, 2 s each. Then one more of 1,075 tokens and 4 s.
    # (Three running at 5 % of 4,096 tokens hold 68 each: no more than the recent ones held to their end.)
    watch.feed_intake(sample(10.0, running=3, kv=0.05, finished=4, finished_prompt=300, finished_generated=100, finished_seconds=8.0))
    assert gate.status()["recent_requests"] == {"prompt_tokens": 75.0, "generated_tokens": 25.0, "engine_seconds": 2.0}
    watch.feed_intake(sample(11.0, running=3, kv=0.05, finished=5, finished_prompt=375, finished_generated=1100, finished_seconds=12.0))
    assert gate.status()["recent_requests"] == {"prompt_tokens": 75.0, "generated_tokens": 122.5, "engine_seconds": 2.2}
    assert gate.status()["engine"] == {
        "running": 3, "waiting": 0, "kv_cache_usage": 0.05, "preempted_since_last_read": 0, "held_by_worker": 3,
    }


def test_the_intake_shows_the_preemptions_since_its_last_read() -> None:
    gate = intake.Intake(lambda: BOUNDS, held=lambda: 3)
    watch = engine_load.LoadWatch("127.0.0.1", 1, lambda: DEFAULTS, 30, intake=gate)
    watch.feed_intake(sample(10.0, running=3, preemptions=1, finished=4, finished_prompt=300, finished_generated=100))
    watch.feed_intake(sample(11.0, running=3, waiting=2, kv=0.97, preemptions=3, finished=4, finished_prompt=300,
                             finished_generated=100))
    status = gate.status()
    assert status["limit"] == 3 and status["engine"]["preempted_since_last_read"] == 2
    assert status["reason"].startswith("3 running, 2 waiting, KV cache 97% used: the KV cache holds 0 more request(s)")
    assert status["reason"].endswith(" (2 preempted since the last read)")


def test_an_answer_without_figures_puts_the_intake_at_max_concurrency() -> None:
    gate = intake.Intake(lambda: BOUNDS)
    watch = engine_load.LoadWatch("127.0.0.1", 1, lambda: DEFAULTS, 30, clock=lambda: 50.0, intake=gate)
    watch.feed_intake(None)
    assert gate.status() == {"adaptive": True, "limit": 30, "paced_up_to": None, "pace_seconds": None,
                             "max_concurrency": 30, "max_num_seqs": None, "reason": intake.NO_FIGURES_REASON, "engine": None,
                             "recent_requests": None, "left_in_platform_queue": 0}


# --- read, against a real endpoint ---


def test_read_gives_the_figures_at_the_clocks_time_and_that_the_engine_answered() -> None:
    with serving(lambda n: metrics(running=2, waiting=1, kv=0.5, preemptions=1).encode()) as engine:
        assert engine_load.read(engine.url, clock=lambda: 42.0) == (
            engine_load.Sample(42.0, 0.5, 2, 1, 1, 0, 0, 0, 0, kv_tokens=4096, block_size=128), True
        )


def test_read_of_an_engine_without_statistics_answered_but_has_no_figures() -> None:
    with serving(lambda n: b"# DISABLE_LOG_STATS=true\npython_gc_objects_collected_total{generation=\"0\"} 1.0\n") as engine:
        assert engine_load.read(engine.url) == (None, True)


def test_read_keeps_the_figures_of_a_body_that_is_not_utf8() -> None:
    body = metrics(running=2, model="caf\xe9").encode("latin-1")
    with serving(lambda n: body) as engine:
        read, answered = engine_load.read(engine.url, clock=lambda: 1.0)
    assert answered and read is not None and read.running == 2


def test_read_of_nothing_listening_did_not_answer() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert engine_load.read(engine_load.metrics_url("127.0.0.1", port), timeout=1.0) == (None, False)


def test_read_gives_up_after_its_timeout_when_the_engine_does_not_answer() -> None:
    answered = threading.Event()

    def body(n: int) -> bytes:
        answered.wait(1.5)  # busy: no answer before the reader has given up
        return b""

    with serving(body) as engine:
        result = engine_load.read(engine.url, timeout=0.2)
        answered.set()
    # Had it waited for the answer, the empty body would read as answered without figures: (None, True).
    assert result == (None, False)


# --- LoadWatch.start and its thread, against a real endpoint ---


def test_start_runs_a_daemon_thread_named_engine_load_that_reads_the_engine() -> None:
    done = threading.Event()
    watch: engine_load.LoadWatch

    def body(n: int) -> bytes:
        watch.stop()
        done.set()
        return metrics(running=1).encode()

    with serving(body) as engine:
        watch = engine_load.LoadWatch("127.0.0.1", engine.port, lambda: DEFAULTS, 30, clock=lambda: 7.0)
        assert watch.url == f"http://127.0.0.1:{engine.port}/metrics" and watch.thread is None
        assert watch.start() is watch
        assert watch.thread is not None and (watch.thread.name, watch.thread.daemon) == ("engine-load", True)
        assert done.wait(2.0)
        watch.thread.join(2.0)
    assert not watch.thread.is_alive() and engine.requests == 1
    assert watch.latest is not None and (watch.latest.at, watch.latest.running) == (7.0, 1)


# One read every STEP on the watch's clock; the watch takes a read for its warning every INTERVAL less half a
# read (4 steps here: exact binary fractions, so the boundary is the boundary).
STEP = 1 / 64
INTERVAL = 4 * STEP + STEP / 2


def watched(reads: int, gate: intake.Intake | None) -> engine_load.LoadWatch:
    """A started watch on a real endpoint that stops it at its `reads`-th read, before answering it."""
    done = threading.Event()
    watch: engine_load.LoadWatch

    def body(n: int) -> bytes:
        if n == reads:
            watch.stop()
            done.set()
        return metrics(running=n).encode()

    with serving(body) as engine:
        watch = engine_load.LoadWatch("127.0.0.1", engine.port, lambda: DEFAULTS, 30, interval=INTERVAL,
                                      clock=ticks(STEP), intake=gate).start()
        assert done.wait(3.0), f"the watch read {engine.requests} time(s), not {reads}"
        assert watch.thread is not None
        watch.thread.join(2.0)
    assert not watch.thread.is_alive() and engine.requests == reads
    return watch


def test_with_an_adaptive_intake_the_watch_reads_every_intake_poll_and_warns_every_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(intake, "POLL_S", STEP)
    gate = intake.Intake(lambda: BOUNDS)
    watch = watched(6, gate)
    assert watch.latest is not None and (watch.latest.at, watch.latest.running) == (6 * STEP, 6)
    # Taken for the warning: reads 1 and 5 (4 steps apart), not 6.
    assert watch.last is not None and (watch.last.at, watch.last.running) == (5 * STEP, 5)
    assert gate.status()["engine"] == {
        "running": 6, "waiting": 0, "kv_cache_usage": 0.1, "preempted_since_last_read": 0, "held_by_worker": 0,
    }


def test_without_adaptation_the_watch_reads_every_interval_and_takes_a_read_half_an_interval_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(intake, "POLL_S", STEP)  # the intake's poll is not the watch's without one
    watch = watched(4, None)
    # Half an interval is 2.25 steps: reads 1 and 4 are taken.
    assert watch.last is not None and (watch.last.at, watch.last.running) == (4 * STEP, 4)


def test_an_answer_without_figures_keeps_the_latest_read_and_the_watch_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(intake, "POLL_S", STEP)
    gate = intake.Intake(lambda: BOUNDS)
    done = threading.Event()
    watch: engine_load.LoadWatch
    seen: list[dict[str, object]] = []

    def body(n: int) -> bytes:
        if n == 3:
            seen.append(gate.status())  # after the read without figures
            watch.stop()
            done.set()
        return b"python_gc_objects_collected_total 1.0\n" if n == 2 else metrics(running=n).encode()

    with serving(body) as engine:
        watch = engine_load.LoadWatch("127.0.0.1", engine.port, lambda: DEFAULTS, 30, interval=INTERVAL,
                                      clock=ticks(STEP), intake=gate).start()
        assert done.wait(3.0) and watch.thread is not None
        watch.thread.join(2.0)
    assert seen[0]["reason"] == intake.NO_FIGURES_REASON and seen[0]["engine"] is None
    assert watch.latest is not None and watch.latest.running == 3
    assert gate.status()["engine"]["running"] == 3  # type: ignore[index]


def test_the_kv_cache_block_is_read_from_cache_config_info() -> None:
    # vLLM's CPU backend gives 128-token blocks: the intake counts a request in whole blocks.
    sample = engine_load.parse(metrics(running=1), 1.0)
    assert sample is not None and sample.block_size == 128
    now = engine_load.engine_now(sample, None)
    assert now is not None and now.block_size == 128
    odd = [None, CACHE_INFO.replace('block_size="128",', ""), *(CACHE_INFO.replace('"128"', v) for v in ('"None"', '"0"', '"-16"'))]
    for info in odd:
        other = engine_load.parse(metrics(running=1, cache_info=info), 1.0)
        assert other is not None and other.block_size is None
    one = engine_load.parse(metrics(running=1, cache_info=CACHE_INFO.replace('block_size="128"', 'block_size="1"')), 1.0)
    assert one is not None and one.block_size == 1
