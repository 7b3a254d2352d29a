"""When the engine will be ready, predicted before the download, and the platform's limit said before it is crossed.

Runpod marks a worker unhealthy when its cold start passes 7 minutes, unless the endpoint sets
RUNPOD_INIT_TIMEOUT (seconds) higher (runpod/docs: serverless/development/optimization.mdx), and an
endpoint that keeps producing unhealthy workers is scaled down. This worker downloads, loads and
compiles before its job loop starts, so a large model's first start on a fresh machine can cross the
limit in its download alone (140 GB at a few hundred MB/s is eight minutes), be marked unhealthy and
be started again: a crash loop by another door, learnt from the console after the fact.

The start is predicted from what is known before the engine launches: the bytes still to fetch (the
repository's files less what is on disk), the rate a short read of the largest file gave, and the
engine's own start after its download (the last ready start of this configuration on the volume, else a
figure for the platform). Once the download has run an interval, its measured rate replaces the probe's.
Where the prediction passes the limit, the log says so at once with the cures in order. Pure: every
input is a value; main and the launcher feed it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Mapping

from vllm_worker.config.env import value

# Runpod's cold-start limit when the endpoint sets no RUNPOD_INIT_TIMEOUT (runpod/docs, optimization.mdx).
PLATFORM_LIMIT_S = 420.0
# The value a cure names covers the prediction by this much, in whole minutes: a prediction is a prediction.
COVER = 1.5
# vLLM's own wait for its engine core (VLLM_ENGINE_READY_TIMEOUT_S, vllm/envs.py: 600 s): the core downloads
# the weights before it answers, so a download longer than that fails the start (v1/engine/core_client.py:
# "Timed out waiting for engine core processes to start. This is often caused by slow weight loading for
# large models"). The worker gives it this many times the prediction, 600 s at least.
ENGINE_READY_DEFAULT_S = 600
ENGINE_READY_COVER = 2.0

# The engine's start when no start of this configuration was recorded. Before its download (vLLM downloads
# the weights in the engine core, after the API server and the core have imported and resolved the
# configuration): import and configuration. After it: weights read, KV profiling and the rest, and the
# compile (cold, or with warm caches; none eager). GPU figures are vLLM's own logs of 7-8B models on one GPU
# (tests/field/boots); the CPU ones this project's tiny models on two cores (docs/benchmarks.md). Weights
# are read from disk at _DISK_BYTES_S on top.
_BEFORE_S = {"cuda": 30.0, "cpu": 35.0}
_AFTER_S = {"cuda": 30.0, "cpu": 10.0}
_COMPILE_S = {"cuda": {"cold": 90.0, "warm": 20.0}, "cpu": {"cold": 25.0, "warm": 10.0}}
_DISK_BYTES_S = 1.5e9  # weights read from local disk into memory, per second


@dataclass(frozen=True)
class Limit:
    """The platform's cold-start limit for this worker and where it comes from."""

    seconds: float
    source: str  # "RUNPOD_INIT_TIMEOUT=900" or the platform's default

    @property
    def set_by_endpoint(self) -> bool:
        return self.source.startswith("RUNPOD_INIT_TIMEOUT=")


@dataclass(frozen=True)
class Forecast:
    """One prediction of the time from the worker's start to the engine's ready, in seconds."""

    elapsed_s: float  # spent before the engine's launch (the worker's own steps, the pre-flight, the probe)
    to_fetch: int  # bytes the engine still has to download (0: all on disk)
    rate: float | None  # bytes a second of the download (None: not known)
    rate_from: str  # "a read of the Hub", "the download's first seconds", or "" where nothing is fetched
    after_s: float  # the engine's start after its download: weights read, profiling, compile
    after_from: str  # where the engine's two terms come from
    limit: Limit
    before_s: float = 0.0  # the engine's start before its download: import and configuration (0: behind it)

    @property
    def download_s(self) -> float | None:
        """The download's time; None where bytes are to be fetched at a rate not known."""
        if self.to_fetch <= 0:
            return 0.0
        if not self.rate or self.rate <= 0:
            return None
        return self.to_fetch / self.rate

    @property
    def total_s(self) -> float | None:
        """Seconds from the worker's start to ready; None where the download's time is not known."""
        download = self.download_s
        return None if download is None else self.elapsed_s + self.before_s + download + self.after_s

    @property
    def over(self) -> bool:
        total = self.total_s
        return total is not None and total > self.limit.seconds

    def with_rate(self, rate: float, to_fetch: int, rate_from: str) -> Forecast:
        """The same start with the download's rate (and what is left to fetch) measured."""
        return replace(self, rate=rate, to_fetch=max(0, to_fetch), rate_from=rate_from)

    def status(self) -> dict[str, object]:
        """The status job's `start_forecast.predicted`."""
        total, download = self.total_s, self.download_s
        return {
            "seconds_to_ready": None if total is None else round(total, 1),
            "before_launch": round(self.elapsed_s, 1),
            "before_download": round(self.before_s, 1),
            "download": None if download is None else round(download, 1),
            "after_download": round(self.after_s, 1),
            "bytes_to_fetch": self.to_fetch,
            "bytes_per_second": None if self.rate is None else round(self.rate),
            "rate_from": self.rate_from or None,
            "after_download_from": self.after_from,
            "limit_seconds": self.limit.seconds,
            "limit_from": self.limit.source,
        }


def platform_limit(env: Mapping[str, str]) -> Limit:
    """RUNPOD_INIT_TIMEOUT where the endpoint sets a positive number, else the platform's 7 minutes."""
    text = value(env, "RUNPOD_INIT_TIMEOUT")
    try:
        seconds = float(text) if text is not None else None
    except ValueError:
        seconds = None
    if seconds is not None and math.isfinite(seconds) and seconds > 0:
        return Limit(seconds, f"RUNPOD_INIT_TIMEOUT={text}")
    return Limit(PLATFORM_LIMIT_S, "Runpod's 7-minute limit on a cold start (RUNPOD_INIT_TIMEOUT is not set)")


def engine_start(
    platform: str, warm: bool, eager: bool, weights_bytes: int | None, recorded: tuple[float, float] | None
) -> tuple[float, float, str]:
    """The engine's start before its download and after it, and where the figures come from: the last start of
    this configuration (`recorded`, the download taken out), else the platform's figures and the weights read."""
    if recorded is not None and recorded[1] > 0:
        return max(0.0, recorded[0]), recorded[1], "the last ready start of this configuration on the volume"
    device = "cpu" if platform == "cpu" else "cuda"
    compile_s = 0.0 if eager else _COMPILE_S[device]["warm" if warm else "cold"]
    read = (weights_bytes or 0) / _DISK_BYTES_S
    kind = "an eager" if eager else ("a warm" if warm else "a cold")
    source = f"{kind} {'CPU' if device == 'cpu' else 'GPU'} start of this size, none recorded"
    return _BEFORE_S[device], _AFTER_S[device] + compile_s + read, source


def covering_timeout(total_s: float) -> int:
    """The RUNPOD_INIT_TIMEOUT that covers a start of `total_s` with margin: COVER times it, in whole minutes."""
    return max(60, math.ceil(total_s * COVER / 60) * 60)


def engine_ready_timeout(forecast: Forecast | None, env: Mapping[str, str]) -> str | None:
    """The VLLM_ENGINE_READY_TIMEOUT_S to give the engine (None: leave vLLM's own): where the user set none and
    the prediction's download is part of the core's start, twice the prediction, 600 s at least."""
    if value(env, "VLLM_ENGINE_READY_TIMEOUT_S") is not None or forecast is None:
        return None
    total = forecast.total_s
    if total is None:
        return None
    seconds = max(ENGINE_READY_DEFAULT_S, math.ceil(total * ENGINE_READY_COVER))
    return None if seconds <= ENGINE_READY_DEFAULT_S else str(seconds)


def startup_timeout(configured: float, set_by_user: bool, forecast: Forecast | None) -> float:
    """The worker's own wait for the engine (VLLM_STARTUP_TIMEOUT): as set where the user set it, else never
    below twice the prediction, so a healthy slow download is not cut by the default."""
    total = forecast.total_s if forecast is not None else None
    if set_by_user or total is None:
        return configured
    return max(configured, math.ceil(total * ENGINE_READY_COVER))


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 120:
        return f"{seconds} s"
    return f"{seconds // 60} min {seconds % 60:02d} s"


def _size(n: float) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def forecast_line(forecast: Forecast, when: str) -> str:
    """The log line: `start forecast (before the download): ready about 9 min 10 s after the worker started ...`."""
    total, download = forecast.total_s, forecast.download_s
    if download is None:
        fetch = f"{_size(forecast.to_fetch)} to download at a rate not known yet"
    elif forecast.to_fetch > 0:
        assert forecast.rate is not None
        fetch = (
            f"{_size(forecast.to_fetch)} to download at {forecast.rate / 1e6:.1f} MB/s ({forecast.rate_from}): "
            f"{_duration(download)}"
        )
    else:
        fetch = "nothing to download"
    head = f"start forecast ({when}): " + (
        f"ready about {_duration(total)} after the worker started" if total is not None else "time to ready not known yet"
    )
    before = f"about {_duration(forecast.before_s)} to import and configure, " if forecast.before_s > 0 else ""
    return (
        f"{head}; {_duration(forecast.elapsed_s)} so far, {before}{fetch}, then about {_duration(forecast.after_s)} "
        f"to load and compile ({forecast.after_from}); the limit is {_duration(forecast.limit.seconds)} "
        f"({forecast.limit.source})"
    )


def limit_warning(forecast: Forecast, model: str, on_volume: bool) -> str | None:
    """What a start predicted past the platform's limit tells the user at once, the cures in order; None
    where it fits."""
    total = forecast.total_s
    if total is None or total <= forecast.limit.seconds:
        return None
    cover = covering_timeout(total)
    cures = [f"set RUNPOD_INIT_TIMEOUT={cover} on the endpoint (its environment variables) so the start is not cut"]
    if forecast.to_fetch > 0:
        cures.append(
            f"or serve MODEL_NAME={model} from Runpod's cached models (the endpoint's Model field), which puts it on "
            "the machine before the worker starts"
        )
        if not on_volume:
            cures.append("and attach a network volume, so the next worker finds the download on it and starts warm")
    return (
        f"This start is predicted to take about {_duration(total)} to ready, past {forecast.limit.source.split(' (')[0]} "
        f"({_duration(forecast.limit.seconds)}): the platform marks a worker unhealthy past it and starts another, "
        f"which downloads again. To fix: {'; '.join(cures)}."
    )
