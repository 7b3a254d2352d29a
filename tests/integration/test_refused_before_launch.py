"""A utilization no card can satisfy is refused before any launch, like every other refused value.

`GPU_MEMORY_UTILIZATION=1.0` asks vLLM for more memory than any card has free once CUDA has
started, so without the profile's check the memory wait timed out as "memory held by another
process" and the worker asked for fresh machines: a configuration cause replacing workers. The
worker runs as a process through the runpod SDK's job loop, with a network volume folder at
BASE_PATH where fresh workers would be counted; the engine is the scripted stand-in, which records
every launch (there must be none).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.control_plane import ControlPlane
from tests.support.fake_engine import FakeEngine
from tests.support.worker_proc import WorkerProcess
from vllm_worker.config.profile import LaunchProfile
from vllm_worker.serving import fresh_machine

pytestmark = pytest.mark.integration

JOB = {"messages": [{"role": "user", "content": "Hi"}], "sampling_params": {"max_tokens": 2}}


@pytest.fixture
def cp() -> Iterator[ControlPlane]:
    with ControlPlane() as plane:
        yield plane


@pytest.mark.parametrize("value", ["1.0", "0.9995"])
def test_a_utilization_no_card_has_free_is_one_sentence_before_any_launch_and_no_fresh_worker(
    cp: ControlPlane, tmp_path: Path, value: str
) -> None:
    volume = tmp_path / "volume"
    volume.mkdir()
    engine = FakeEngine(tmp_path, [{"serve": True}])
    env = {"HF_HUB_OFFLINE": "1", "MODEL_NAME": "acme/tiny-chat", **engine.env(), "BASE_PATH": str(volume),
           "GPU_MEMORY_UTILIZATION": value, "GPU_MEMORY_WAIT_TIMEOUT": "2"}
    try:
        with WorkerProcess(env, control_plane=cp, workdir=tmp_path) as worker:
            first = cp.result(cp.submit(JOB), timeout=120)
            second = cp.result(cp.submit(JOB), timeout=120)
            assert worker.returncode is None, "the worker exited instead of answering"
    finally:
        engine.kill_leftovers()

    refusal = LaunchProfile.parse(env).refusal
    assert refusal is not None
    assert first == second == {"error": str(refusal)}  # the one sentence, and nothing asks for a fresh worker
    assert str(refusal).startswith(f"GPU_MEMORY_UTILIZATION={value!r} is not valid: ") and "\n" not in str(refusal)
    assert engine.launches() == []
    assert not (volume / fresh_machine.STATE_FOLDER / fresh_machine.LEDGER_FILE).exists() or json.loads(
        (volume / fresh_machine.STATE_FOLDER / fresh_machine.LEDGER_FILE).read_text()
    )["fresh_workers"] == []
