"""A cold download that shows its progress: bytes on disk against the expected total, rate, time left.

vLLM prints nothing while it fetches weights (vllm-project/vllm#20354): a first start on a
large model is minutes of silence in the log. The worker knows what is coming (the
pre-flight's safetensors counts give the weights' size) and where it lands (the Hugging Face
cache the engine writes to, files growing under `blobs/` as `*.incomplete`), so while the
engine downloads it reads the folder every ~10 s and logs one line, and keeps the last
reading for the status job. Nothing is watched when the model is on disk already (a cached
snapshot, a baked or local model, offline mode): the pre-flight's own rule says when vLLM
will fetch from the Hub.

The sentences and the arithmetic are pure functions; `DownloadWatch` is the thin thread.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping

log = logging.getLogger("vllm_worker")

INTERVAL = 10.0

# safetensors dtype names (the Hub's `safetensors.parameters` keys) -> bytes per parameter
_DTYPE_BYTES = {
    "F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
    "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I8": 1, "U8": 1, "BOOL": 1,
}
# The engine has stopped downloading once it loads (or reports the download's time).
_DOWNLOAD_OVER = ("time spent downloading weights", "loading weights took", "loading safetensors checkpoint shards")


def expected_bytes(safetensors_parameters: Mapping[str, int] | None) -> int | None:
    """The weights' size from the Hub's parameter counts per dtype; None when unknown.

    Packed dtypes (F4, I4 in U8 containers) are counted by their container, as stored.
    """
    if not safetensors_parameters:
        return None
    total = 0
    for dtype, count in safetensors_parameters.items():
        size = _DTYPE_BYTES.get(dtype.upper())
        if size is None:
            return None
        total += size * count
    return total or None


def repo_folder(hub_cache: Path, repo: str) -> Path:
    """Where huggingface_hub keeps `repo` inside a hub cache (its `models--org--name` layout)."""
    return hub_cache / ("models--" + repo.replace("/", "--"))


def bytes_on_disk(folder: Path) -> int:
    """Bytes under `folder`'s blobs (finished files and the `*.incomplete` ones growing)."""
    total = 0
    for root, _dirs, files in os.walk(folder / "blobs"):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


@dataclass(frozen=True)
class Reading:
    """One look at the download."""

    done: int
    total: int | None
    seconds: float
    rate: float | None  # bytes per second over the last interval

    @property
    def seconds_left(self) -> float | None:
        if self.total is None or not self.rate or self.done >= self.total:
            return None
        return (self.total - self.done) / self.rate

    def status(self) -> dict[str, Any]:
        """The status job's `download` object."""
        left = self.seconds_left
        return {
            "bytes": self.done,
            "expected_bytes": self.total,
            "seconds": round(self.seconds, 1),
            "bytes_per_second": round(self.rate) if self.rate is not None else None,
            "seconds_left": round(left) if left is not None else None,
        }


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def progress_line(repo: str, reading: Reading) -> str:
    """`downloading org/model: 1.2 GB of about 2.5 GB (48 %), 35.0 MB/s, about 37 s left`."""
    text = f"downloading {repo}: {_size(reading.done)}"
    if reading.total:
        percent = min(100, int(100 * reading.done / reading.total))
        text += f" of about {_size(reading.total)} ({percent} %)"
    if reading.rate is not None:
        text += f", {_size(reading.rate)}/s"
    left = reading.seconds_left
    if left is not None:
        text += f", about {_duration(left)} left"
    return text + f" ({_duration(reading.seconds)} so far)"


def next_reading(previous: Reading | None, done: int, total: int | None, now: float, started: float) -> Reading:
    """The reading at `now`, its rate from the previous one (none for the first)."""
    rate = None
    if previous is not None and now > started + previous.seconds:
        rate = max(0.0, (done - previous.done) / (now - started - previous.seconds))
    return Reading(done=done, total=total, seconds=now - started, rate=rate)


# The weights are under way once this much has landed (config and tokenizer files come first, then the engine
# core imports for seconds before it fetches a weight), and their rate is read over RATE_WINDOW_S from then:
# huggingface_hub writes a download in chunks of up to 10 MiB, so one interval of a slow link sees one or two.
WEIGHTS_UNDER_WAY = 4 << 20
RATE_WINDOW_S = 20.0


def window_rate(start: Reading, now: Reading, window: float = RATE_WINDOW_S) -> float | None:
    """Bytes a second from `start` (the weights under way) to `now`, once `window` seconds have passed (or the
    download is done) and bytes came in; None before."""
    seconds = now.seconds - start.seconds
    finished = now.total is not None and now.done >= now.total
    if seconds <= 0 or now.done <= start.done or (seconds < window and not finished):
        return None
    return (now.done - start.done) / seconds


def download_over(line: str) -> bool:
    """Whether an engine line says the download is behind it."""
    lowered = line.lower()
    return any(marker in lowered for marker in _DOWNLOAD_OVER)


class DownloadWatch:
    """Logs a progress line every `interval` seconds while the engine downloads `repo`."""

    def __init__(
        self,
        repo: str,
        folder: Path,
        total: int | None,
        interval: float = INTERVAL,
        clock: Callable[[], float] = time.monotonic,
        on_rate: Callable[[Reading], None] | None = None,
        rate_window: float = RATE_WINDOW_S,
    ) -> None:
        self.repo = repo
        self.rate_window = rate_window
        # Called once, with a reading whose rate is the weights' over RATE_WINDOW_S (`window_rate`): the link's.
        self.on_rate = on_rate
        self.folder = folder
        self.total = total
        self.interval = interval
        self.clock = clock
        self.last: Reading | None = None
        self._started = clock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="download-progress", daemon=True)

    def start(self) -> "DownloadWatch":
        self._thread.start()
        return self

    def on_line(self, line: str) -> None:
        if download_over(line):
            self._stop.set()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(self.interval + 1)

    def status(self) -> dict[str, Any] | None:
        return self.last.status() if self.last is not None else None

    def _run(self) -> None:
        # What is on disk already (a relaunch, a download cut short) is not progress: a line is logged
        # only when the folder grows, so a launch whose model is all there says nothing.
        shown = bytes_on_disk(self.folder)
        if self.total is not None and shown >= self.total:
            return
        initial, rated, weights = shown, self.on_rate is None, None
        while not self._stop.wait(self.interval):
            done = bytes_on_disk(self.folder)
            self.last = next_reading(self.last, done, self.total, self.clock(), self._started)
            if done > shown:
                log.info("%s", progress_line(self.repo, self.last))
                shown = done
            if weights is None and done >= initial + WEIGHTS_UNDER_WAY:
                weights = self.last
            rate = None if rated or weights is None else window_rate(weights, self.last, self.rate_window)
            if rate is not None:
                rated = True
                assert self.on_rate is not None
                self.on_rate(replace(self.last, rate=rate))
            if self.total is not None and done >= self.total:
                return


@dataclass(frozen=True)
class DownloadPlan:
    """What a launch will download: decided once by main (the pre-flight will ask the Hub, no
    snapshot is on disk), watched by each launch."""

    repo: str
    folder: Path
    total: int | None

    def watch(self, interval: float = INTERVAL, on_rate: Callable[[Reading], None] | None = None) -> DownloadWatch:
        return DownloadWatch(self.repo, self.folder, self.total, interval, on_rate=on_rate)
