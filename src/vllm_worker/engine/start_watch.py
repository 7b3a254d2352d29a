"""The start's forecast carried through the launch: said once before the download, again once its rate is known,
and set against what the start took at ready.

main makes the first forecast (engine.start_forecast) from the pre-flight's files and a read of the Hub;
the launcher asks this for the engine's VLLM_ENGINE_READY_TIMEOUT_S and its own wait (both follow the
forecast, so a healthy slow download is not cut by a fixed number), hands it the download's first rate,
and tells it the phases at ready. Only launch 1 is the platform's cold start; a relaunch keeps the figures.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from typing import Any, Callable, Mapping

from vllm_worker.config import settings as settings_mod
from vllm_worker.engine import start_forecast
from vllm_worker.engine.download_progress import Reading
from vllm_worker.engine.start_forecast import Forecast

log = logging.getLogger("vllm_worker")


class StartWatch:
    """One worker's start forecast: its updates, its warning (once), and the figures for the status job."""

    def __init__(
        self,
        forecast: Forecast,
        began: float,
        model: str,
        on_volume: bool,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.first = forecast
        self.current = forecast
        self.began = began  # the worker's start, on `clock`
        self.model = model
        self.on_volume = on_volume
        self.clock = clock
        self.warned = False
        self.actual: dict[str, float | None] | None = None
        self._lock = threading.Lock()
        self.say("before the download" if forecast.to_fetch > 0 else "nothing to download")

    def say(self, when: str) -> None:
        """Log the current forecast, and the limit's warning the first time the forecast passes it."""
        log.info("%s", start_forecast.forecast_line(self.current, when))
        warning = start_forecast.limit_warning(self.current, self.model, self.on_volume)
        if warning is not None and not self.warned:
            self.warned = True
            log.warning("%s", warning)

    def on_rate(self, reading: Reading) -> None:
        """The download's rate over a whole interval (the DownloadWatch's thread): the forecast again with it."""
        with self._lock:
            left = self.current.to_fetch if reading.total is None else max(0, reading.total - reading.done)
            elapsed = self.clock() - self.began
            # From now: what is spent, the rest of the download at its rate, and the engine's start after it (the
            # download follows the engine's import and configuration: vLLM fetches the weights in its engine core).
            measured = self.current.with_rate(reading.rate or 0.0, left, "the download's first seconds")
            self.current = replace(measured, elapsed_s=elapsed, before_s=0.0)
            self.say("the download's rate measured")

    def engine_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """The engine's environment with VLLM_ENGINE_READY_TIMEOUT_S following the forecast (unless set)."""
        ready = start_forecast.engine_ready_timeout(self.current, env)
        return {**env, "VLLM_ENGINE_READY_TIMEOUT_S": ready} if ready is not None else dict(env)

    def startup_timeout(self, settings: settings_mod.Settings) -> float:
        return start_forecast.startup_timeout(settings.startup_timeout, settings.startup_timeout_set, self.current)

    def at_ready(
        self, launch_seconds: float, phases: Mapping[str, float], downloaded_at: float | None = None
    ) -> tuple[float, float] | None:
        """The first launch is ready `launch_seconds` after it began: log predicted against actual, and return the
        engine's start before its download and after it, what the next start of this configuration is predicted
        with. A start that fetched is split at `downloaded_at` (seconds after the launch: the engine's first line
        with the weights on disk); without that mark it is not recorded, since vLLM's own download line covers only
        part of a download, and a start recorded with the rest in it was forecast at three times its time
        (bench/start_forecast.py, 2026-12-07)."""
        total = self.clock() - self.began
        before = min(launch_seconds, phases.get("import_config", 0.0))
        download = phases.get("download", 0.0)
        after: float | None = launch_seconds - before
        if self.first.to_fetch > 0:
            if downloaded_at is not None and before <= downloaded_at <= launch_seconds:
                download, after = downloaded_at - before, launch_seconds - downloaded_at
            else:
                after = None
        self.actual = {
            "seconds_to_ready": round(total, 1),
            "before_launch": round(total - launch_seconds, 1),
            "before_download": round(before, 1),
            "download": round(download, 1),
            "after_download": None if after is None else round(after, 1),
        }
        predicted, first = self.first.total_s, self.first
        terms = [("the engine before its download", before, first.before_s), ("the download", download, first.download_s)]
        if after is not None:
            terms.append(("the engine after it", after, first.after_s))
        log.info(
            "start forecast against the start: ready %.0f s after the worker started; predicted %s before the "
            "download%s (limit %.0f s, %s); %s",
            total,
            f"{predicted:.0f} s" if predicted is not None else "no figure",
            f", {self.current.total_s:.0f} s once its rate was known" if self.current is not self.first and self.current.total_s else "",
            self.current.limit.seconds,
            self.current.limit.source,
            ", ".join(
                f"{name} {took:.0f} s (predicted {'?' if guess is None else f'{guess:.0f}'})" for name, took, guess in terms
            ),
        )
        return None if after is None else (before, after)

    def status(self) -> dict[str, Any]:
        """The status job's `start_forecast`: predicted (before the download, and with its rate), and actual."""
        return {
            "predicted": self.first.status(),
            "with_download_rate": self.current.status() if self.current is not self.first else None,
            "actual": self.actual,
            "over_limit": self.current.over,
        }
