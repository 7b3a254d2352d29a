"""Download progress: the expected size from the Hub's counts, the readings and the line a user reads."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from vllm_worker.engine.download_progress import (
    DownloadWatch,
    Reading,
    bytes_on_disk,
    download_over,
    expected_bytes,
    next_reading,
    progress_line,
    repo_folder,
)


def test_expected_bytes_from_the_hubs_parameter_counts() -> None:
    assert expected_bytes({"BF16": 1_000_000, "F32": 10}) == 2_000_040
    assert expected_bytes(None) is None
    assert expected_bytes({}) is None
    assert expected_bytes({"Q4_K": 5}) is None  # a dtype whose size is not known: no total rather than a wrong one


def test_the_line_gives_bytes_total_rate_and_time_left() -> None:
    first = next_reading(None, 0, 2_500_000_000, now=110.0, started=100.0)
    assert first.rate is None
    second = next_reading(first, 350_000_000, 2_500_000_000, now=120.0, started=100.0)
    assert second.rate == 35_000_000
    assert progress_line("org/model", second) == (
        "downloading org/model: 350.0 MB of about 2.5 GB (14 %), 35.0 MB/s, about 1 min 01 s left (20 s so far)"
    )
    assert second.status() == {
        "bytes": 350_000_000,
        "expected_bytes": 2_500_000_000,
        "seconds": 20.0,
        "bytes_per_second": 35_000_000,
        "seconds_left": 61,
    }


def test_without_a_known_total_the_line_says_bytes_and_rate_only() -> None:
    reading = Reading(done=1_200_000, total=None, seconds=10.0, rate=120_000.0)
    assert progress_line("org/model", reading) == "downloading org/model: 1.2 MB, 120.0 KB/s (10 s so far)"
    assert reading.seconds_left is None


def test_bytes_on_disk_counts_finished_and_incomplete_blobs(tmp_path: Path) -> None:
    folder = repo_folder(tmp_path, "org/model")
    assert folder == tmp_path / "models--org--model"
    assert bytes_on_disk(folder) == 0
    (folder / "blobs").mkdir(parents=True)
    (folder / "blobs" / "aaa").write_bytes(b"x" * 100)
    (folder / "blobs" / "bbb.incomplete").write_bytes(b"x" * 50)
    (folder / "snapshots").mkdir()
    (folder / "snapshots" / "ignored").write_bytes(b"x" * 1000)
    assert bytes_on_disk(folder) == 150


def test_the_engines_own_lines_end_the_download() -> None:
    assert download_over("(Worker pid=1) INFO 12-01 21:08:54 [default_loader.py:501] Loading weights took 0.01 seconds")
    assert download_over("Loading safetensors checkpoint shards:   0% Completed | 0/1 [00:00<?, ?it/s]")
    assert not download_over("(Worker pid=1) INFO 12-01 21:08:54 [cpu_model_runner.py:68] Starting to load model org/m...")


def test_a_watch_logs_only_while_the_folder_grows(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder = repo_folder(tmp_path, "org/model")
    (folder / "blobs").mkdir(parents=True)
    (folder / "blobs" / "done").write_bytes(b"x" * 100)
    with caplog.at_level(logging.INFO, logger="vllm_worker"):
        watch = DownloadWatch("org/model", folder, total=None, interval=0.05).start()
        time.sleep(0.2)  # the folder does not grow: nothing to say
        assert not caplog.records
        (folder / "blobs" / "next.incomplete").write_bytes(b"x" * 50)
        deadline = time.monotonic() + 5
        while not caplog.records and time.monotonic() < deadline:
            time.sleep(0.05)
        watch.stop()
    assert caplog.records and caplog.records[0].getMessage().startswith("downloading org/model: 150 B")
    assert watch.status() is not None and watch.status()["bytes"] == 150
