"""When the worker asks for a fresh worker, and the bound its endpoint's workers share (pure, and the ledger file)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_worker.serving import fresh_machine

CAUSE = "vLLM failed to start because of a fault in the GPU driver or CUDA setup of this machine, not in the settings: x."


# Written out, not read from FRESH_MACHINE_KINDS: a kind dropped from the set must fail here.
@pytest.mark.parametrize("kind", ["host_fault", "memory_held", "profiling_race", "gpu_check"])
def test_a_fault_of_the_machine_asks_for_a_fresh_worker_below_the_bound(kind: str) -> None:
    decision = fresh_machine.decide(CAUSE, kind, recent=1, limit=3, base_path="/v")
    assert decision.refresh is True
    assert decision.sentence.startswith(CAUSE + " The worker has asked the platform for a fresh worker")
    assert "2 of at most 3 within an hour" in decision.sentence


@pytest.mark.parametrize("kind", ["max_model_len_too_large", "memory_shortfall", "unknown", "engine_hung", None])
def test_a_cause_in_the_configuration_or_an_unknown_one_never_asks(kind: str | None) -> None:
    assert fresh_machine.decide(CAUSE, kind, recent=0, limit=3, base_path="/v") == fresh_machine.Decision(False, CAUSE)


def test_at_the_bound_the_answer_says_fresh_machines_did_not_help() -> None:
    decision = fresh_machine.decide(CAUSE, "host_fault", recent=3, limit=3, base_path="/v")
    assert decision.refresh is False
    assert "Fresh machines did not help" in decision.sentence and "WORKER_REFRESH_LIMIT=3" in decision.sentence


def test_nothing_to_count_on_means_no_fresh_worker_and_says_why() -> None:
    decision = fresh_machine.decide(CAUSE, "host_fault", None, 3, "/runpod-volume", "No such file or directory")
    assert decision.refresh is False
    assert "BASE_PATH=/runpod-volume" in decision.sentence
    assert "No such file or directory" in decision.sentence and "network volume" in decision.sentence


def test_limit_zero_turns_it_off_without_a_word() -> None:
    assert fresh_machine.decide(CAUSE, "host_fault", 0, 0, "/v") == fresh_machine.Decision(False, CAUSE)


def test_the_ledger_counts_the_last_hour_across_workers_and_stops_at_the_limit(tmp_path: Path) -> None:
    now = [10_000.0]
    ledger = fresh_machine.Ledger(str(tmp_path), clock=lambda: now[0])
    ledger.dir.mkdir()
    (ledger.path).write_text(json.dumps({"fresh_workers": [{"at": now[0] - 4000, "cause": "host_fault"}]}))

    assert ledger.record_if_below(2, "host_fault") == (0, True, "")  # the old one is past the hour
    now[0] += 60
    assert ledger.record_if_below(2, "memory_held") == (1, True, "")
    assert ledger.record_if_below(2, "host_fault") == (2, False, "")
    assert [e["cause"] for e in json.loads(ledger.path.read_text())["fresh_workers"]] == ["host_fault", "memory_held"]


def test_the_ledger_never_creates_the_volumes_mount_point(tmp_path: Path) -> None:
    ledger = fresh_machine.Ledger(str(tmp_path / "runpod-volume"))
    recent, recorded, problem = ledger.record_if_below(3, "host_fault")
    assert (recent, recorded) == (None, False) and problem
    assert not (tmp_path / "runpod-volume").exists()


def test_answer_asks_the_platform_only_when_it_recorded_a_fresh_worker(tmp_path: Path) -> None:
    asked: list[bool] = []
    volume = lambda path: path == str(tmp_path)  # noqa: E731 - BASE_PATH is a mount point
    first = fresh_machine.answer(CAUSE, "host_fault", 1, str(tmp_path), lambda: asked.append(True), volume)
    second = fresh_machine.answer(CAUSE, "host_fault", 1, str(tmp_path), lambda: asked.append(True), volume)
    config = fresh_machine.answer(CAUSE, "bad_arguments", 1, str(tmp_path), lambda: asked.append(True), volume)
    assert (first.refresh, second.refresh, config.refresh) == (True, False, False)
    assert asked == [True]


def test_a_folder_at_base_path_that_is_not_a_mount_is_no_volume_and_nothing_is_counted_there(tmp_path: Path) -> None:
    """The image's HF_HOME lies under BASE_PATH: a download creates the folder on the container's disk."""
    asked: list[bool] = []
    decision = fresh_machine.answer(CAUSE, "host_fault", 3, str(tmp_path), lambda: asked.append(True))
    assert decision.refresh is False and asked == []
    assert f"BASE_PATH={tmp_path}" in decision.sentence and "not a mounted volume" in decision.sentence
    assert not (tmp_path / fresh_machine.STATE_FOLDER).exists()


def test_two_workers_recording_at_once_count_each_other(tmp_path: Path) -> None:
    """The ledger's lock: read and write under one flock, so concurrent writers never lose a stamp."""
    import multiprocessing

    ledger = fresh_machine.Ledger(str(tmp_path))
    ledger.dir.mkdir()
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_record_many, args=(str(tmp_path), 25)) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert len(json.loads(ledger.path.read_text())["fresh_workers"]) == 100


def _record_many(base_path: str, times: int) -> None:
    ledger = fresh_machine.Ledger(base_path)
    for _ in range(times):
        ledger.record_if_below(1000, "host_fault")


def test_a_stamp_exactly_an_hour_old_is_out_of_the_window_and_one_a_moment_younger_is_in(tmp_path: Path) -> None:
    now = 100_000.0
    assert fresh_machine.recent_count([now - 3600.0, now - 3599.5, now + 1], now) == 1
    ledger = fresh_machine.Ledger(str(tmp_path), clock=lambda: now)
    ledger.dir.mkdir()
    ledger.path.write_text(json.dumps({"fresh_workers": [{"at": now - 3600.0}, {"at": now - 3599.5}]}))
    assert ledger.record_if_below(2, "host_fault") == (1, True, "")
    assert [e["at"] for e in json.loads(ledger.path.read_text())["fresh_workers"]] == [now - 3599.5, now]


def test_each_stamp_says_which_worker_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = fresh_machine.Ledger(str(tmp_path), clock=lambda: 5.0)
    ledger.dir.mkdir()
    monkeypatch.setenv("RUNPOD_POD_ID", "pod-7")
    ledger.record_if_below(3, "gpu_check")
    monkeypatch.delenv("RUNPOD_POD_ID")
    ledger.record_if_below(3, "host_fault")
    assert json.loads(ledger.path.read_text()) == {
        "fresh_workers": [{"at": 5.0, "cause": "gpu_check", "worker": "pod-7"}, {"at": 5.0, "cause": "host_fault", "worker": ""}]
    }
    assert oct(ledger.path.stat().st_mode & 0o777) == oct(0o644 & ~_umask())


def _umask() -> int:
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize(
    "text",
    ["", "   ", "not json", "[1, 2]", '{"fresh_workers": null}', '{"fresh_workers": [1, {"at": "x"}, {"cause": "y"}]}'],
)
def test_a_torn_or_foreign_ledger_counts_as_empty_and_is_rewritten(tmp_path: Path, text: str) -> None:
    ledger = fresh_machine.Ledger(str(tmp_path), clock=lambda: 9.0)
    ledger.dir.mkdir()
    ledger.path.write_text(text)
    assert ledger.record_if_below(1, "host_fault") == (0, True, "")
    assert json.loads(ledger.path.read_text())["fresh_workers"] == [{"at": 9.0, "cause": "host_fault", "worker": ""}]


def test_a_ledger_that_cannot_be_written_says_why_and_records_nothing(tmp_path: Path) -> None:
    ledger = fresh_machine.Ledger(str(tmp_path))
    ledger.dir.mkdir()
    ledger.path.mkdir()  # a folder where the file should be: the open fails
    recent, recorded, problem = ledger.record_if_below(3, "host_fault")
    assert (recent, recorded) == (None, False) and problem == "Is a directory"


def test_the_reason_names_a_folder_or_nothing_mounted(tmp_path: Path) -> None:
    assert fresh_machine.not_a_volume(str(tmp_path)) == "it is a folder of the container's disk, not a mounted volume"
    assert fresh_machine.not_a_volume(str(tmp_path / "none")) == "nothing is mounted there"


def test_answer_passes_the_cause_through_and_asks_only_for_a_fault_of_the_machine(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    asked: list[bool] = []
    mounted = lambda path: True  # noqa: E731
    with caplog.at_level(logging.WARNING, logger="vllm_worker"):
        off = fresh_machine.answer(CAUSE, "host_fault", 0, str(tmp_path), lambda: asked.append(True), mounted)
        config = fresh_machine.answer(CAUSE, "max_model_len_too_large", 3, str(tmp_path), lambda: asked.append(True), mounted)
        assert caplog.records == []
        first = fresh_machine.answer(CAUSE, "gpu_check", 3, str(tmp_path), lambda: asked.append(True), mounted)
    assert off == config == fresh_machine.Decision(False, CAUSE)
    assert first == fresh_machine.decide(CAUSE, "gpu_check", 0, 3, str(tmp_path))
    assert asked == [True]
    assert [r.getMessage() for r in caplog.records] == [
        "a fault of the machine (gpu_check): asking the platform for a fresh worker after the next job"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vllm_worker"):
        unmounted = fresh_machine.answer(CAUSE, "host_fault", 3, str(tmp_path), lambda: asked.append(True), lambda p: False)
    assert unmounted == fresh_machine.decide(
        CAUSE, "host_fault", None, 3, str(tmp_path), "it is a folder of the container's disk, not a mounted volume"
    )
    assert [r.getMessage() for r in caplog.records] == [
        f"a fault of the machine (host_fault), and no fresh worker is asked for: {unmounted.sentence}"
    ]
    assert asked == [True]


def test_the_sentences_in_full() -> None:
    assert fresh_machine.decide("C.", "host_fault", 0, 3, "/v").sentence == (
        "C. The worker has asked the platform for a fresh worker, usually on another machine "
        "(1 of at most 3 within an hour, WORKER_REFRESH_LIMIT), so nothing needs terminating by hand; send the job again."
    )
    assert fresh_machine.decide("C.", "host_fault", None, 3, "/v", "why").sentence == (
        "C. The worker did not ask the platform for a fresh worker itself: it counts the fresh workers it asks for "
        "on the network volume, and no writable volume is mounted at BASE_PATH=/v (why); attach a network volume so it can."
    )
    assert fresh_machine.decide("C.", "host_fault", 4, 3, "/v").sentence.startswith(
        "C. Fresh machines did not help: the endpoint's workers already asked for 4 fresh workers after a fault of the "
        "machine within the last hour (WORKER_REFRESH_LIMIT=3)"
    )


def test_answer_records_the_kind_of_fault_in_the_ledger(tmp_path: Path) -> None:
    (tmp_path / fresh_machine.STATE_FOLDER).mkdir()
    fresh_machine.answer(CAUSE, "profiling_race", 3, str(tmp_path), lambda: None, lambda path: True)
    ledger = json.loads((tmp_path / fresh_machine.STATE_FOLDER / fresh_machine.LEDGER_FILE).read_text())
    assert [e["cause"] for e in ledger["fresh_workers"]] == ["profiling_race"]
