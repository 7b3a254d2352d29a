"""The start's forecast (engine.start_forecast) and its carrier through the launch (engine.start_watch): pure values."""

from __future__ import annotations

import logging
import math
import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vllm_worker.config import settings as settings_mod
from vllm_worker.engine import compile_cache, start_forecast
from vllm_worker.engine.download_progress import WEIGHTS_UNDER_WAY, DownloadWatch, Reading, repo_folder, window_rate
from vllm_worker.engine.start_forecast import Forecast, Limit
from vllm_worker.engine.start_watch import StartWatch

DEFAULT = start_forecast.platform_limit({})
GB = 10**9


def forecast(to_fetch: int = 0, rate: float | None = None, after: float = 60.0, elapsed: float = 5.0, limit: Limit = DEFAULT) -> Forecast:
    return Forecast(elapsed, to_fetch, rate, "a read of the Hub" if rate else "", after, "a cold GPU start", limit)


# --- the limit ----------------------------------------------------------------------------------


def test_the_platforms_limit_is_7_minutes_unless_the_endpoint_sets_runpod_init_timeout() -> None:
    assert DEFAULT == Limit(420.0, "Runpod's 7-minute limit on a cold start (RUNPOD_INIT_TIMEOUT is not set)")
    assert not DEFAULT.set_by_endpoint
    set_ = start_forecast.platform_limit({"RUNPOD_INIT_TIMEOUT": "1600"})
    assert set_ == Limit(1600.0, "RUNPOD_INIT_TIMEOUT=1600") and set_.set_by_endpoint


@pytest.mark.parametrize("text", ["", "  ", "0", "-30", "ten", "inf", "nan"])
def test_a_runpod_init_timeout_that_is_not_a_positive_number_leaves_the_platforms_default(text: str) -> None:
    assert start_forecast.platform_limit({"RUNPOD_INIT_TIMEOUT": text}) == DEFAULT


# --- the forecast -------------------------------------------------------------------------------


def test_the_time_to_ready_is_what_was_spent_the_download_at_its_rate_and_the_engines_start_after_it() -> None:
    f = forecast(to_fetch=140 * GB, rate=300e6, after=150.0, elapsed=6.0)
    assert f.download_s == pytest.approx(466.67, abs=0.01)
    assert f.total_s == pytest.approx(6.0 + 466.67 + 150.0, abs=0.01)
    assert f.over  # 140 GB at 300 MB/s: the example, past 7 minutes


def test_nothing_to_fetch_takes_no_download_time_and_bytes_at_an_unknown_rate_leave_the_total_unknown() -> None:
    assert forecast(to_fetch=0).download_s == 0.0 and forecast(to_fetch=0).total_s == 65.0
    unknown = forecast(to_fetch=GB, rate=None)
    assert unknown.download_s is None and unknown.total_s is None and not unknown.over
    assert forecast(to_fetch=GB, rate=0.0).total_s is None


def test_a_measured_rate_replaces_the_probes_and_what_is_left_to_fetch() -> None:
    f = forecast(to_fetch=GB, rate=10e6).with_rate(50e6, GB // 2, "the download's first seconds")
    assert (f.to_fetch, f.rate, f.rate_from) == (GB // 2, 50e6, "the download's first seconds")
    assert forecast(to_fetch=GB, rate=1.0).with_rate(1.0, -5, "x").to_fetch == 0


@given(
    st.integers(0, 10**12), st.floats(1e3, 1e10), st.floats(1e3, 1e10), st.floats(0, 3600), st.floats(0, 600)
)
def test_more_to_fetch_or_a_slower_link_never_predicts_a_shorter_start(to_fetch: int, rate: float, faster: float, after: float, elapsed: float) -> None:
    slow, fast = sorted((rate, faster))
    base = forecast(to_fetch, slow, after, elapsed)
    assert base.total_s is not None
    assert base.total_s >= forecast(to_fetch, fast, after, elapsed).total_s  # type: ignore[operator]
    assert forecast(to_fetch + 10**6, slow, after, elapsed).total_s >= base.total_s  # type: ignore[operator]
    assert base.total_s >= elapsed + after


# --- the cures ----------------------------------------------------------------------------------


@given(st.floats(1, 10**6))
def test_the_timeout_a_cure_names_covers_the_start_by_half_again_in_whole_minutes(total: float) -> None:
    cover = start_forecast.covering_timeout(total)
    assert cover % 60 == 0 and cover >= 60
    assert cover >= total * start_forecast.COVER
    assert cover - 60 < max(60, total * start_forecast.COVER)


@given(st.integers(0, 10**12), st.floats(1e5, 1e10), st.floats(1, 5000))
def test_a_warning_is_given_exactly_when_the_forecast_passes_the_limit(to_fetch: int, rate: float, limit: float) -> None:
    f = forecast(to_fetch, rate, limit=Limit(limit, f"RUNPOD_INIT_TIMEOUT={limit:g}"))
    warning = start_forecast.limit_warning(f, "acme/big", on_volume=False)
    assert f.total_s is not None
    assert (warning is not None) == (f.total_s > limit) == f.over
    if warning is not None:
        assert f"RUNPOD_INIT_TIMEOUT={start_forecast.covering_timeout(f.total_s)}" in warning


def test_the_warning_names_the_value_to_set_then_runpods_cached_model_then_a_volume() -> None:
    f = forecast(to_fetch=140 * GB, rate=300e6, after=150.0, elapsed=6.0)
    warning = start_forecast.limit_warning(f, "acme/big", on_volume=False)
    assert warning == (
        "This start is predicted to take about 10 min 23 s to ready, past Runpod's 7-minute limit on a cold start "
        "(7 min 00 s): the platform marks a worker unhealthy past it and starts another, which downloads again. "
        "To fix: set RUNPOD_INIT_TIMEOUT=960 on the endpoint (its environment variables) so the start is not cut; "
        "or serve MODEL_NAME=acme/big from Runpod's cached models (the endpoint's Model field), which puts it on the "
        "machine before the worker starts; and attach a network volume, so the next worker finds the download on it "
        "and starts warm."
    )
    assert "network volume" not in (start_forecast.limit_warning(f, "acme/big", on_volume=True) or "")


def test_a_start_with_nothing_to_download_is_only_told_the_timeout() -> None:
    f = forecast(to_fetch=0, after=500.0, limit=Limit(300.0, "RUNPOD_INIT_TIMEOUT=300"))
    warning = start_forecast.limit_warning(f, "acme/big", on_volume=False)
    assert warning is not None and "past RUNPOD_INIT_TIMEOUT=300 (5 min 00 s)" in warning
    assert "RUNPOD_INIT_TIMEOUT=780" in warning and "cached models" not in warning and "volume" not in warning
    assert start_forecast.limit_warning(forecast(to_fetch=GB, rate=None), "m", False) is None  # no figure, no claim


# --- the waits that follow the forecast ------------------------------------------------------------


def test_vllms_wait_for_its_engine_core_follows_a_long_forecast_unless_the_user_set_it() -> None:
    long = forecast(to_fetch=140 * GB, rate=300e6, after=150.0, elapsed=6.0)  # 622.7 s
    assert start_forecast.engine_ready_timeout(long, {}) == str(math.ceil(long.total_s * 2))  # type: ignore[operator]
    assert start_forecast.engine_ready_timeout(long, {"VLLM_ENGINE_READY_TIMEOUT_S": "900"}) is None
    assert start_forecast.engine_ready_timeout(forecast(after=100.0), {}) is None  # vLLM's 600 s covers it
    assert start_forecast.engine_ready_timeout(forecast(to_fetch=GB, rate=None), {}) is None
    assert start_forecast.engine_ready_timeout(None, {}) is None


def test_the_workers_wait_is_raised_to_twice_the_forecast_only_where_the_user_left_its_default() -> None:
    long = forecast(to_fetch=1000 * GB, rate=300e6)
    assert long.total_s is not None and long.total_s * 2 > 3600
    assert start_forecast.startup_timeout(3600.0, False, long) == math.ceil(long.total_s * 2)
    assert start_forecast.startup_timeout(3600.0, True, long) == 3600.0
    assert start_forecast.startup_timeout(3600.0, False, forecast()) == 3600.0
    assert start_forecast.startup_timeout(3600.0, False, None) == 3600.0


def test_the_engines_start_is_the_last_recorded_one_else_the_platforms_figures_before_and_after_the_download() -> None:
    recorded = start_forecast.engine_start("cuda", False, False, None, (40.0, 88.0))
    assert recorded == (40.0, 88.0, "the last ready start of this configuration on the volume")
    before, cold, source = start_forecast.engine_start("cuda", False, False, 15 * GB, None)
    _, warm, _ = start_forecast.engine_start("cuda", True, False, 15 * GB, None)
    _, eager, eager_source = start_forecast.engine_start("cuda", True, True, 15 * GB, None)
    assert before == 30.0 and (cold, warm, eager) == (30.0 + 90.0 + 10.0, 30.0 + 20.0 + 10.0, 30.0 + 10.0)
    assert source == "a cold GPU start of this size, none recorded" and eager_source == "an eager GPU start of this size, none recorded"
    assert start_forecast.engine_start("cpu", True, False, None, (5.0, 0.0)) == (35.0, 20.0, "a warm CPU start of this size, none recorded")
    assert start_forecast.engine_start("cpu", False, False, None, None)[:2] == (35.0, 35.0)


def test_the_log_line_says_each_term_and_the_limit() -> None:
    line = start_forecast.forecast_line(forecast(to_fetch=3 * GB, rate=100e6, after=90.0, elapsed=4.0), "before the download")
    assert line == (
        "start forecast (before the download): ready about 2 min 04 s after the worker started; 4 s so far, "
        "3.0 GB to download at 100.0 MB/s (a read of the Hub): 30 s, then about 90 s to load and compile "
        "(a cold GPU start); the limit is 7 min 00 s (Runpod's 7-minute limit on a cold start (RUNPOD_INIT_TIMEOUT is not set))"
    )
    assert "at a rate not known yet" in start_forecast.forecast_line(forecast(to_fetch=GB), "x")
    assert "nothing to download" in start_forecast.forecast_line(forecast(), "x")


# --- the watch: the forecast through the launch ------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_watch_says_the_forecast_once_and_warns_once_when_the_measured_rate_passes_the_limit(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    with caplog.at_level(logging.INFO, logger="vllm_worker"):
        watch = StartWatch(forecast(to_fetch=10 * GB, rate=100e6, after=60.0, elapsed=5.0), 95.0, "acme/big", False, clock)
        assert not watch.warned  # 165 s: inside the limit
        clock.now = 130.0
        watch.on_rate(Reading(done=GB, total=10 * GB, seconds=30.0, rate=10e6))  # a tenth of the probe's rate
        watch.on_rate(Reading(done=GB, total=10 * GB, seconds=30.0, rate=10e6))
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0].startswith("start forecast (before the download): ready about 2 min 45 s")
    assert messages[1].startswith("start forecast (the download's rate measured): ready about 16 min 35 s")
    assert "9.0 GB to download at 10.0 MB/s (the download's first seconds): 15 min 00 s" in messages[1]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "RUNPOD_INIT_TIMEOUT=1500" in warnings[0].getMessage()
    assert watch.current.total_s == pytest.approx(35.0 + 900.0 + 60.0)
    assert watch.status()["predicted"]["seconds_to_ready"] == 165.0
    assert watch.status()["with_download_rate"]["seconds_to_ready"] == 995.0 and watch.status()["over_limit"] is True


def test_the_watch_gives_vllm_and_the_worker_waits_that_cover_the_forecast() -> None:
    long = StartWatch(forecast(to_fetch=400 * GB, rate=300e6, after=150.0), 0.0, "acme/big", True, Clock())
    env = long.engine_env({"A": "1"})
    assert env["A"] == "1" and int(env["VLLM_ENGINE_READY_TIMEOUT_S"]) >= 2 * 1333
    assert long.startup_timeout(settings_mod.Settings()) == 3600.0  # twice the forecast is less than the default
    short = StartWatch(forecast(), 0.0, "acme/m", True, Clock())
    assert short.engine_env({"A": "1"}) == {"A": "1"}


def test_at_ready_the_watch_sets_the_start_against_the_forecast_and_gives_the_engines_start_after_the_download(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    watch = StartWatch(forecast(to_fetch=GB, rate=10e6, after=60.0, elapsed=5.0), 100.0, "acme/m", True, clock)
    clock.now = 300.0
    with caplog.at_level(logging.INFO, logger="vllm_worker"):
        after = watch.at_ready(190.0, {"import_config": 30.0, "download": 120.0, "weights_load": 3.0})
    # A start that downloaded is not recorded: vLLM's download line covers only part of the download.
    assert after is None
    assert watch.actual == {
        "seconds_to_ready": 200.0, "before_launch": 10.0, "before_download": 30.0, "download": 120.0, "after_download": None,
    }  # fmt: skip
    line = caplog.records[-1].getMessage()
    assert "ready 200 s after the worker started; predicted 165 s before the download" in line
    assert line.endswith("; the engine before its download 30 s (predicted 0), the download 120 s (predicted 100)")
    # With the engine's first line with the weights on disk (150 s into the launch), the start is split there and
    # recorded: the download is what lies between the engine's configuration and that line.
    marked = StartWatch(forecast(to_fetch=GB, rate=10e6, after=60.0, elapsed=5.0), 100.0, "acme/m", True, clock)
    with caplog.at_level(logging.INFO, logger="vllm_worker"):
        assert marked.at_ready(190.0, {"import_config": 30.0, "download": 80.0}, downloaded_at=150.0) == (30.0, 40.0)
    assert marked.actual is not None and (marked.actual["download"], marked.actual["after_download"]) == (120.0, 40.0)
    assert caplog.records[-1].getMessage().endswith(
        "the engine before its download 30 s (predicted 0), the download 120 s (predicted 100), the engine after it 40 s "
        "(predicted 60)"
    )
    # A mark outside the launch's span (not this launch's line) is not a split.
    assert StartWatch(forecast(to_fetch=GB, rate=10e6), 0.0, "acme/m", True, clock).at_ready(190.0, {}, 200.0) is None
    cached = StartWatch(forecast(), 0.0, "acme/m", True, clock)
    assert cached.at_ready(42.0, {"import_config": 30.5, "weights_load": 1.0}) == (30.5, 11.5)
    assert cached.at_ready(42.0, {"import_config": 30.5}, downloaded_at=31.0) == (30.5, 11.5)  # nothing fetched: whole
    assert cached.actual is not None and cached.actual["after_download"] == 11.5


def test_a_recorded_start_is_read_back_by_the_next_start_of_the_same_configuration(tmp_path: Path) -> None:
    argv = ["serve", "acme/m", "--port", "8000"]
    setup = compile_cache.prepare(str(tmp_path), {}, argv, mounted=lambda _: True)
    assert setup.recorded_start is None
    compile_cache.record_start(setup, argv, (30.25, 71.25))
    again = compile_cache.prepare(str(tmp_path), {}, ["serve", "acme/m", "--port", "9000"], served_from="/snap", mounted=lambda _: True)
    assert again.recorded_start is not None and again.recorded_start[1] in (71.2, 71.3) and again.recorded_start[0] in (30.2, 30.3)
    other = compile_cache.prepare(str(tmp_path), {}, ["serve", "acme/other"], mounted=lambda _: True)
    assert other.recorded_start is None
    compile_cache.record_start(setup, argv, None)  # nothing known: the record stays
    compile_cache.record_start(compile_cache.CacheSetup(), argv, (1.0, 5.0))  # no volume: nowhere to keep it
    mark = next((tmp_path / compile_cache.CACHE_FOLDER / compile_cache.MARKS_FOLDER).glob("*" + compile_cache.START_SUFFIX))
    for text in ("not json", '{"after_download_s": "5"}', '{"after_download_s": 0}', '{"before_download_s": -1, "after_download_s": 5}', "[]"):
        mark.write_text(text)
        assert compile_cache.prepare(str(tmp_path), {}, argv, mounted=lambda _: True).recorded_start is None, text
    mark.write_text('{"after_download_s": 12}')  # a record without the time before the download: none before it
    assert compile_cache.prepare(str(tmp_path), {}, argv, mounted=lambda _: True).recorded_start == (0.0, 12.0)


def test_the_weights_rate_is_read_over_a_window_from_when_they_are_under_way() -> None:
    start = Reading(done=5 << 20, total=100 << 20, seconds=12.0, rate=None)
    assert window_rate(start, Reading(done=25 << 20, total=100 << 20, seconds=22.0, rate=2e6)) is None  # 10 s: too soon
    at_window = window_rate(start, Reading(done=45 << 20, total=100 << 20, seconds=32.0, rate=2e6))
    assert at_window == pytest.approx((40 << 20) / 20.0)
    assert window_rate(start, Reading(done=100 << 20, total=100 << 20, seconds=20.0, rate=None)) == pytest.approx((95 << 20) / 8.0)
    assert window_rate(start, Reading(done=5 << 20, total=100 << 20, seconds=60.0, rate=0.0)) is None  # nothing came in
    assert window_rate(start, Reading(done=9 << 20, total=None, seconds=13.0, rate=None), window=0.5) == pytest.approx(4 << 20)


def test_the_download_watch_hands_on_the_weights_rate_once_they_are_under_way(tmp_path: Path) -> None:
    folder = repo_folder(tmp_path, "org/model")
    (folder / "blobs").mkdir(parents=True)
    (folder / "blobs" / "config.json").write_bytes(b"{}" * 100)  # the small files come first: no rate from them
    rates: list[Reading] = []
    arrived = threading.Event()

    def on_rate(reading: Reading) -> None:
        rates.append(reading)
        arrived.set()

    watch = DownloadWatch("org/model", folder, total=1 << 30, interval=0.05, on_rate=on_rate, rate_window=0.3).start()
    try:
        for step in range(1, 200):
            (folder / "blobs" / "w.incomplete").write_bytes(b"x" * (256 << 10) * step)  # past WEIGHTS_UNDER_WAY at 16
            if arrived.wait(0.02) and step > 40:
                break
    finally:
        watch.stop()
    assert len(rates) == 1
    [reading] = rates
    assert reading.rate is not None and reading.rate > 0 and reading.done >= WEIGHTS_UNDER_WAY


def test_once_the_download_runs_the_engines_import_is_behind_it() -> None:
    clock = Clock()
    first = Forecast(5.0, 10 * GB, 100e6, "a read of the Hub", 20.0, "x", DEFAULT, before_s=40.0)
    assert first.total_s == 5.0 + 40.0 + 100.0 + 20.0
    watch = StartWatch(first, 95.0, "acme/m", True, clock)
    clock.now = 165.0  # 70 s in: the engine imported (40 s), then downloaded for 25 s
    watch.on_rate(Reading(done=5 * GB, total=10 * GB, seconds=60.0, rate=100e6))
    assert watch.current.before_s == 0.0 and watch.current.total_s == pytest.approx(70.0 + 50.0 + 20.0)
    assert watch.status()["predicted"]["before_download"] == 40.0
