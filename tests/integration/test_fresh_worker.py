"""A fault of the machine asks the platform for a fresh worker, through the runpod SDK's own job loop.

A fault of the GPU, its driver or NCCL only happens on a GPU, so the engine here is the scripted
stand-in printing such a text (tests/support/fake_vllm.py); everything else is real: the worker as
a process, the SDK's job loop against the control-plane stand-in, and what the SDK posts. The SDK
asks the platform for a fresh worker by `"stopPod": true` in the job's result, then ends its loop.
The count of fresh workers lives on the network volume (BASE_PATH), here a tmpfs the
test mounts (tests/support/volumes.py: a mount point, as a network volume is). A configuration cause never asks; at the bound the answer says fresh machines did
not help.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.support import vllm_texts
from tests.support.control_plane import ControlPlane
from tests.support.fake_engine import FakeEngine, alive
from tests.support.volumes import network_volume
from tests.support.worker_proc import WorkerProcess
from vllm_worker.diagnosis import startup_errors
from vllm_worker.diagnosis.verdict import Failure
from vllm_worker.serving import fresh_machine

pytestmark = pytest.mark.integration

MODEL = "acme/tiny-chat"
JOB = {"messages": [{"role": "user", "content": "Hi"}], "sampling_params": {"max_tokens": 2}}
# An NCCL error at start: vLLM's engine-core crash around torch.distributed's words.
HOST_FAULT = vllm_texts.UNKNOWN_FAILURE
CONFIG_FAULT = vllm_texts.MAX_MODEL_LEN_TOO_LARGE


@pytest.fixture
def volume(tmp_path: Path) -> Iterator[Path]:
    with network_volume(tmp_path / "volume") as mounted:
        yield mounted


@pytest.fixture
def cp() -> Iterator[ControlPlane]:
    with ControlPlane() as plane:
        yield plane


def start(cp: ControlPlane, root: Path, text: str, volume: Path, **extra: str) -> tuple[WorkerProcess, FakeEngine]:
    engine = FakeEngine(root, [{"output": text, "exit_code": 1}])
    env = {"HF_HUB_OFFLINE": "1", "MODEL_NAME": MODEL, **engine.env(), "BASE_PATH": str(volume), **extra}
    return WorkerProcess(env, control_plane=cp, workdir=root).start(), engine


def ledger(volume: Path) -> list[dict[str, Any]]:
    path = volume / fresh_machine.STATE_FOLDER / fresh_machine.LEDGER_FILE
    return json.loads(path.read_text())["fresh_workers"] if path.exists() else []


def stop(worker: WorkerProcess, engine: FakeEngine) -> None:
    worker.stop(timeout=30)
    engine.kill_leftovers()


def test_the_scripted_texts_are_a_machine_fault_and_a_configuration_cause() -> None:
    host = startup_errors.diagnose(Failure.of(HOST_FAULT, MODEL, exit_code=1))
    assert host is not None and host.kind == "host_fault"
    config = startup_errors.diagnose(Failure.of(CONFIG_FAULT, MODEL, exit_code=1))
    assert config is not None and config.kind == "max_model_len_too_large"


def test_a_host_fault_after_its_relaunch_is_answered_and_the_sdk_asks_for_a_fresh_worker(
    cp: ControlPlane, tmp_path: Path, volume: Path
) -> None:
    worker, engine = start(cp, tmp_path, HOST_FAULT, volume)
    try:
        result = cp.result(cp.submit(JOB), timeout=120)
        # The SDK ends its loop after the job it asked a fresh worker for: the worker exits by itself.
        code = worker.wait(timeout=60)
    finally:
        stop(worker, engine)

    assert len(engine.launches()) == 2  # the one relaunch a fault of the machine gets
    assert result["stopPod"] is True
    assert "NCCL" in result["error"] and "asked the platform for a fresh worker" in result["error"]
    assert code == 0
    assert [entry["cause"] for entry in ledger(volume)] == ["host_fault"]
    assert all(not alive(launch["pid"]) for launch in engine.launches())


def test_at_the_bound_the_answer_says_fresh_machines_did_not_help_and_no_fresh_worker_is_asked(
    cp: ControlPlane, tmp_path: Path, volume: Path
) -> None:
    (volume / fresh_machine.STATE_FOLDER).mkdir(parents=True)
    now = time.time()
    seeded = [{"at": now - 60 * i, "cause": "host_fault", "worker": f"w{i}"} for i in range(2)]
    (volume / fresh_machine.STATE_FOLDER / fresh_machine.LEDGER_FILE).write_text(json.dumps({"fresh_workers": seeded}))
    worker, engine = start(cp, tmp_path, HOST_FAULT, volume, WORKER_REFRESH_LIMIT="2")
    try:
        first = cp.result(cp.submit(JOB), timeout=120)
        second = cp.result(cp.submit(JOB), timeout=60)  # the worker goes on answering
    finally:
        stop(worker, engine)

    assert "stopPod" not in first and first == second
    assert "Fresh machines did not help" in first["error"] and "WORKER_REFRESH_LIMIT=2" in first["error"]
    assert ledger(volume) == seeded


def test_a_configuration_cause_never_asks_for_a_fresh_worker(cp: ControlPlane, tmp_path: Path, volume: Path) -> None:
    worker, engine = start(cp, tmp_path, CONFIG_FAULT, volume)
    try:
        result = cp.result(cp.submit(JOB), timeout=120)
    finally:
        stop(worker, engine)

    assert "stopPod" not in result and "fresh worker" not in result["error"]
    assert ledger(volume) == []


def test_without_a_place_to_count_no_fresh_worker_is_asked_and_the_answer_says_why(cp: ControlPlane, tmp_path: Path) -> None:
    missing = tmp_path / "no-volume-mounted"  # nothing mounted at BASE_PATH
    worker, engine = start(cp, tmp_path, HOST_FAULT, missing)
    try:
        result = cp.result(cp.submit(JOB), timeout=120)
    finally:
        stop(worker, engine)

    assert "stopPod" not in result
    assert f"BASE_PATH={missing}" in result["error"] and "network volume" in result["error"]


def test_an_idle_worker_stops_at_once_on_sigterm_and_leaves_no_engine(cp: ControlPlane, tmp_path: Path) -> None:
    engine = FakeEngine(tmp_path, [{"serve": True}])
    env = {"HF_HUB_OFFLINE": "1", "MODEL_NAME": MODEL, **engine.env(), "DRAIN_TIMEOUT": "60"}
    worker = WorkerProcess(env, control_plane=cp, workdir=tmp_path).start()
    try:
        worker.wait_for_log(r"engine ready; taking jobs", timeout=120)
        cp.wait_for_request("take-batch", timeout=60)  # MAX_CONCURRENCY=30: the SDK takes in batches
        os.kill(worker.pid, 15)
        # No job runs, so the drain time does not apply: the worker has exited when first looked at.
        code = worker.wait(timeout=10)
    finally:
        stop(worker, engine)

    assert code == 0
    assert all(not alive(launch["pid"]) for launch in engine.launches())
    assert "0 running may finish" in worker.log()
