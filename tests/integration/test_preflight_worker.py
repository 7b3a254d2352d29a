"""The Hub pre-flight inside the worker process: a wrong model reference never reaches vLLM.

The worker runs as `python -m vllm_worker run` through the real runpod SDK job loop
(control-plane stand-in), with HF_ENDPOINT pointing at the Hub stand-in, so the real
huggingface_hub client makes the metadata calls. VLLM_COMMAND is the scripted
stand-in, which records every launch: a definitive Hub answer (no such repository,
gated without a token, no such revision) must leave that record empty and answer
every job with the sentence the pre-flight module produces, which is the shared one
from startup_errors, the same a crash of vLLM on that cause would give. A transient
Hub failure must not stop the boot.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from tests.support.control_plane import ControlPlane
from tests.support.fake_engine import FakeEngine
from tests.support.hub_stub import HubStub
from tests.support.worker_proc import WorkerProcess
from vllm_worker.config.profile import LaunchProfile
from vllm_worker.diagnosis.hub import gated_repo_message, repo_not_found_message, revision_not_found_message
from vllm_worker.model import preflight
from vllm_worker.diagnosis import startup_errors

pytestmark = pytest.mark.integration

JOB_TIMEOUT = 120.0
PUBLIC = "org/public"
GATED = "org/gated"
JOBS = [
    {"messages": [{"role": "user", "content": "hi"}], "sampling_params": {"max_tokens": 2}},
    {"prompt": "hello", "sampling_params": {"max_tokens": 2}},
]


@pytest.fixture
def hub() -> Iterator[HubStub]:
    with HubStub() as stub:
        stub.add_repo(PUBLIC, files={"config.json": "{}", "model.safetensors": b"\0" * 64}, branches=("main", "v1"))
        stub.add_repo(GATED, files={"config.json": "{}"}, gated="manual", authorized_tokens=["hf_granted0123456789"])
        yield stub


@pytest.fixture
def cp() -> Iterator[ControlPlane]:
    with ControlPlane() as plane:
        yield plane


class Worker:
    """A worker on the Hub stand-in with a scripted engine that serves; what it launched."""

    def __init__(self, root: Path, hub: HubStub, cp: ControlPlane, **env: str) -> None:
        self.engine = FakeEngine(root, [{"serve": True}])
        # What the user configured (plus where the Hub is): also what the test's own pre-flight reads.
        self.user_env = {"HF_ENDPOINT": hub.endpoint, **env}
        self.process = WorkerProcess({**self.user_env, **self.engine.env()}, control_plane=cp, workdir=root)

    def launches(self) -> list[dict[str, Any]]:
        return self.engine.launches()

    def kill_leftovers(self) -> None:
        self.engine.kill_leftovers()

def answers(worker: Worker, cp: ControlPlane) -> list[dict[str, Any]]:
    """Submit JOBS before the worker starts (as the platform queues them), return their job-done bodies."""
    ids = [cp.submit(job) for job in JOBS]
    try:
        with worker.process:
            return [cp.result(job_id, timeout=JOB_TIMEOUT) for job_id in ids]
    finally:
        worker.kill_leftovers()


CASES: dict[str, tuple[dict[str, str], str, Callable[[], str]]] = {
    # name: (user env, the Hub path the worker must have asked, the shared sentence)
    "typo'd model id": (
        {"MODEL_NAME": "org/pubilc"},
        "/api/models/org/pubilc",
        lambda: repo_not_found_message("org/pubilc", "MODEL_NAME"),
    ),
    "gated repo without a token": (
        {"MODEL_NAME": GATED},
        f"/api/models/{GATED}",
        lambda: gated_repo_message(GATED, "MODEL_NAME", token_set=False),
    ),
    "bad MODEL_REVISION": (
        {"MODEL_NAME": PUBLIC, "MODEL_REVISION": "no-such-rev"},
        f"/api/models/{PUBLIC}/revision/no-such-rev",
        lambda: revision_not_found_message(PUBLIC, "no-such-rev", "MODEL_REVISION"),
    ),
    # vLLM's own spelling of the same knob: checked the same way, and the sentence names it.
    "bad REVISION": (
        {"MODEL_NAME": PUBLIC, "REVISION": "no-such-rev"},
        f"/api/models/{PUBLIC}/revision/no-such-rev",
        lambda: revision_not_found_message(PUBLIC, "no-such-rev", "REVISION"),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_definitive_hub_answer_is_every_jobs_answer_and_vllm_is_never_launched(
    case: str, hub: HubStub, cp: ControlPlane, tmp_path: Path
) -> None:
    env, path, shared = CASES[case]
    worker = Worker(tmp_path, hub, cp, **env)
    expected = preflight.run(LaunchProfile.parse(worker.user_env)).message
    # The pre-flight's sentence is the shared one, the same a crash of vLLM on this cause gives.
    assert expected is not None and expected == shared()
    hub.reset_requests()

    results = answers(worker, cp)

    assert results == [{"error": expected}] * len(JOBS)
    assert isinstance(results[0]["error"], str) and "Traceback" not in results[0]["error"]
    assert worker.launches() == []
    # The worker asked the Hub itself (once, no retry): the answer is not a skip or a guess.
    assert [r.path for r in hub.calls("/api/models/")] == [path]
    assert "pre-flight" in worker.process.log()


def test_a_transient_hub_failure_does_not_stop_the_boot(hub: HubStub, cp: ControlPlane, tmp_path: Path) -> None:
    hub.fail(503, times=None)  # the Hub keeps answering 503 Service Unavailable
    worker = Worker(tmp_path, hub, cp, MODEL_NAME=PUBLIC)

    results = answers(worker, cp)

    chat, completion = ([r["output"][0]] for r in results)
    assert chat[0]["choices"][0]["message"]["content"] == "w0 w1"
    assert completion[0]["choices"][0]["text"] == "w0 w1"
    [launch] = worker.launches()
    assert launch["argv"][launch["argv"].index("serve") + 1] == PUBLIC
    assert [(r.path, r.status) for r in hub.calls("/api/models/")] == [(f"/api/models/{PUBLIC}", 503)]
    log = worker.process.log()
    assert "could not check MODEL_NAME='org/public'" in log and "starting vLLM anyway" in log


@pytest.mark.parametrize("offline", ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"])
def test_an_offline_start_asks_the_hub_for_nothing(offline: str, hub: HubStub, cp: ControlPlane, tmp_path: Path) -> None:
    """Either switch turns the Hub off for the whole start: pre-flight, model cache and capacity plan alike."""
    worker = Worker(tmp_path, hub, cp, MODEL_NAME=PUBLIC, **{offline: "1"})
    hub.reset_requests()

    results = answers(worker, cp)

    assert [r["output"][0]["choices"][0]["message"]["content"] for r in results[:1]] == ["w0 w1"]
    assert hub.calls("/") == []
    assert len(worker.launches()) == 1
    log = worker.process.log()
    assert f"Model pre-flight skipped: {offline} is set" in log
    assert log.count("pre-flight skipped") == 1
