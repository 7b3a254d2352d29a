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
