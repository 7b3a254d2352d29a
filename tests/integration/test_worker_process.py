"""The worker as a process, through the real runpod SDK job loop, seen as a client sees it.

Users read nothing but a job's response, so these tests assert exactly what the
control plane receives from `python -m vllm_worker run`: the sentence every job is
answered with when the configuration is wrong, the relayed completion when the
engine serves, the SSE chunks of a streamed job, and that HF_TOKEN never shows up in
the worker's log, its engine's command line, or any response.

The engine here is `tests/support/fake_vllm.py` serving small OpenAI-shaped answers:
these tests are about the worker's process edges, and the real CPU engine is
exercised in tests/engine. HF_HUB_OFFLINE=1 skips the Hub pre-flight (no Hub stand-in).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import pytest

from tests.support import vllm_texts
from tests.support.control_plane import ControlPlane
from tests.support.fake_engine import FakeEngine, alive
from tests.support.worker_proc import WorkerProcess
from vllm_worker.diagnosis.verdict import Failure
from vllm_worker.engine import ladder as recovery
from vllm_worker.diagnosis import startup_errors
from vllm_worker.config import settings as worker_settings
from vllm_worker.config.profile import LaunchProfile

pytestmark = pytest.mark.integration

MODEL = "acme/tiny-chat"
SECRET = "hf_secret123"
JOB_TIMEOUT = 120.0
MESSAGES = [{"role": "user", "content": "Say five words."}]


def settings_error(env: dict[str, str]) -> str:
    """The sentence the worker's one read of env refuses it with (its settings, or the launch profile where
    MAX_CONCURRENCY is read): what every job must be answered with."""
    try:
        worker_settings.load(env)
    except worker_settings.SettingsError as error:
        return str(error)
    refusal = LaunchProfile.parse(env).refusal
    assert refusal is not None, f"nothing in {sorted(env)} is refused"
    return str(refusal)


def wait_until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout}s")
        time.sleep(0.1)


@pytest.fixture
def cp() -> Iterator[ControlPlane]:
    with ControlPlane() as plane:
        yield plane


def worker_env(**extra: str) -> dict[str, str]:
    env = {"HF_HUB_OFFLINE": "1", "MODEL_NAME": MODEL}
    env.update(extra)
    return env


def sse_events(chunks: Sequence[str]) -> list[str]:
    """The data fields of the SSE events in the relayed chunks, in order."""
    text = "".join(chunks)
    return [
        line[len("data: ") :]
        for event in text.split("\n\n")
        for line in event.splitlines()
        if line.startswith("data: ")
    ]


# ----------------------------------------------------------------------------- configuration errors


def test_an_invalid_max_concurrency_is_the_answer_to_every_job(cp: ControlPlane, tmp_path: Path) -> None:
    engine = FakeEngine(tmp_path, [{"serve": True}])
    env = worker_env(MAX_CONCURRENCY="abc", **engine.env())
    expected = settings_error(env)
    assert "MAX_CONCURRENCY" in expected and "'abc'" in expected

    with WorkerProcess(env, control_plane=cp, workdir=tmp_path) as worker:
        jobs = [cp.submit({"messages": MESSAGES, "sampling_params": {"max_tokens": 5}}) for _ in range(2)]
        results = [cp.result(job, timeout=JOB_TIMEOUT) for job in jobs]
        code = worker.stop()

    assert results == [{"error": expected}, {"error": expected}]
    # The job loop ran although the configuration is unusable: the worker did not exit on it.
    assert worker.returncode == code == 0
    # No engine is booted for a configuration the worker cannot run.
    assert engine.launches() == []


def test_the_console_script_the_image_runs_is_the_same_worker(cp: ControlPlane, tmp_path: Path) -> None:
    # The Dockerfile's ENTRYPOINT is `vllm-worker run`, not `python -m vllm_worker`.
    script = Path(sys.executable).with_name("vllm-worker")
    assert script.exists(), f"{script} is missing: install the project (pip install -e .) into this environment"
    env = worker_env(MAX_CONCURRENCY="0")
    expected = settings_error(env)

    with WorkerProcess(env, control_plane=cp, command=[str(script)], workdir=tmp_path):
        job = cp.submit({"prompt": "hi"})
        assert cp.result(job, timeout=JOB_TIMEOUT) == {"error": expected}


def test_a_missing_model_name_is_answered_with_a_sentence_naming_it(cp: ControlPlane, tmp_path: Path) -> None:
    engine = FakeEngine(tmp_path, [{"serve": True}])
    env = worker_env(**engine.env())
    del env["MODEL_NAME"]

    with WorkerProcess(env, control_plane=cp, workdir=tmp_path):
        job = cp.submit({"messages": MESSAGES})
        result = cp.result(job, timeout=JOB_TIMEOUT)

    assert set(result) == {"error"}
    error = result["error"]
    assert "MODEL_NAME" in error
    assert "Traceback" not in error and "\n" not in error
    assert engine.launches() == []


# ----------------------------------------------------------------------------- serving


@pytest.fixture(scope="module")
def serving(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ControlPlane, WorkerProcess, FakeEngine]]:
    root = tmp_path_factory.mktemp("serving-worker")
    engine = FakeEngine(root, [{"serve": True}], record_env=["HF_TOKEN"])
    env = worker_env(HF_TOKEN=SECRET, MAX_CONCURRENCY="4", **engine.env())
    try:
        with ControlPlane() as plane, WorkerProcess(env, control_plane=plane, workdir=root) as worker:
            yield plane, worker, engine
    finally:
        engine.kill_leftovers()


def test_a_chat_job_returns_the_engines_chat_completion(serving) -> None:
    cp, worker, engine = serving
    job = cp.submit({"messages": MESSAGES, "sampling_params": {"max_tokens": 5}})
    result = cp.result(job, timeout=JOB_TIMEOUT)

    assert set(result) == {"output"}
    [completion] = result["output"]
    assert completion["object"] == "chat.completion"
    # The fake answers max_tokens words: five words prove the sampling params were forwarded.
    assert completion["choices"][0]["message"]["content"] == "w0 w1 w2 w3 w4"
    sent = [r for r in engine.requests() if r["path"] == "/v1/chat/completions"]
    assert sent and sent[-1]["body"]["messages"] == MESSAGES
    assert sent[-1]["body"]["max_tokens"] == 5


def test_a_completion_job_with_a_prompt_returns_the_text_completion(serving) -> None:
    cp, worker, engine = serving
    job = cp.submit({"prompt": "Once upon", "sampling_params": {"max_tokens": 3}})
    result = cp.result(job, timeout=JOB_TIMEOUT)

    [completion] = result["output"]
    assert completion["object"] == "text_completion"
    assert completion["choices"][0]["text"] == "w0 w1 w2"


def test_a_streaming_job_returns_sse_chunks_ending_with_done(serving) -> None:
    cp, worker, engine = serving
    job = cp.submit({"messages": MESSAGES, "sampling_params": {"max_tokens": 3}, "stream": True})
    result = cp.result(job, timeout=JOB_TIMEOUT)

    chunks = result["output"]
    assert chunks and all(isinstance(c, str) for c in chunks)
    assert chunks[-1].rstrip("\n").endswith("data: [DONE]")
    # Chunks are whole SSE events: each ends at an event boundary.
    assert all(c.endswith("\n\n") for c in chunks)
    data = sse_events(chunks)
    assert data[-1] == "[DONE]"
    deltas = [json.loads(d)["choices"][0]["delta"].get("content", "") for d in data[:-1] if json.loads(d)["choices"]]
    assert "".join(deltas) == "w0 w1 w2"
    # A /stream client receives the same chunks, in the same order, as they were produced.
    assert cp.stream_outputs(job) == chunks


def test_an_unusable_job_input_is_answered_with_a_sentence(serving) -> None:
    cp, worker, engine = serving
    job = cp.submit({"messages": "hello"})
    result = cp.result(job, timeout=JOB_TIMEOUT)

    assert set(result) == {"error"}
    assert "messages" in result["error"] and "Traceback" not in result["error"]


def test_hf_token_reaches_the_engine_and_nothing_else(serving) -> None:
    cp, worker, engine = serving
    jobs = [
        cp.submit({"messages": MESSAGES, "sampling_params": {"max_tokens": 2}}),
        cp.submit({"messages": MESSAGES, "sampling_params": {"max_tokens": 2}, "stream": True}),
        cp.submit({"messages": 42}),
        cp.submit({"worker_status": True}),
    ]
    answers = [cp.result(job, timeout=JOB_TIMEOUT) for job in jobs] + [cp.stream_chunks(job) for job in jobs]

    [launch] = engine.launches()
    assert launch["env"]["HF_TOKEN"] == SECRET  # the engine needs it to download gated models
    assert SECRET not in json.dumps(launch["argv"])  # a command line is visible to every process
    assert SECRET not in worker.log()
    assert SECRET not in json.dumps(answers)


# ----------------------------------------------------------------------------- shutdown


def test_sigterm_stops_the_worker_and_its_engine(cp: ControlPlane, tmp_path: Path) -> None:
    engine = FakeEngine(tmp_path, [{"serve": True}])
    env = worker_env(**engine.env(exit_with_parent=False))
    worker = WorkerProcess(env, control_plane=cp, workdir=tmp_path).start()
    try:
        job = cp.submit({"messages": MESSAGES, "sampling_params": {"max_tokens": 1}})
        assert "output" in cp.result(job, timeout=JOB_TIMEOUT)
        [launch] = engine.launches()
        assert alive(launch["pid"])

        code = worker.stop(timeout=60)

        assert (code, worker.killed) == (0, False)
        assert not alive(launch["pid"]), "the engine outlived the worker"
    finally:
        worker.stop()
        engine.kill_leftovers()


def test_sigterm_while_the_engine_starts_stops_the_engine_too(cp: ControlPlane, tmp_path: Path) -> None:
    engine = FakeEngine(tmp_path, [{"hang": True}])
    env = worker_env(**engine.env(exit_with_parent=False))
    worker = WorkerProcess(env, control_plane=cp, workdir=tmp_path).start()
    try:
        [launch] = wait_until(engine.launches, JOB_TIMEOUT, "the engine launch")

        worker.stop(timeout=60)

        assert worker.killed is False
        assert not alive(launch["pid"]), "the engine outlived the worker"
    finally:
        worker.stop()
        engine.kill_leftovers()


# ----------------------------------------------------------------------------- GPU-only startup failures


def flag(argv: Sequence[str], name: str) -> str | None:
    """The value after `name` in argv, "" for a bare flag, None when absent."""
    if name not in argv:
        return None
    i = list(argv).index(name)
    nxt = argv[i + 1] if i + 1 < len(argv) else None
    return "" if nxt is None or nxt.startswith("--") else nxt


def test_out_of_memory_at_startup_relaunches_smaller_until_it_fits(cp: ControlPlane, tmp_path: Path) -> None:
    engine = FakeEngine(tmp_path, [{"text": "TORCH_OOM"}, {"text": "CUDA_ERROR_OOM"}, {"serve": True}])
    env = worker_env(MAX_CONCURRENCY="30", MAX_NUM_SEQS="256", **engine.env())
    seqs = str(worker_settings.multiple_of_8_at_least(30))
    try:
        with WorkerProcess(env, control_plane=cp, workdir=tmp_path):
            job = cp.submit({"messages": MESSAGES, "sampling_params": {"max_tokens": 2}})
            result = cp.result(job, timeout=JOB_TIMEOUT)
    finally:
        engine.kill_leftovers()

    [completion] = result["output"]
    assert completion["choices"][0]["message"]["content"] == "w0 w1"
    assert completion["worker"]["degraded"] is True
    first, second, third = (launch["argv"] for launch in engine.launches())
    assert (flag(first, "--max-num-seqs"), flag(first, "--enforce-eager")) == ("256", None)
    # Step 1: fewer sequences, CUDA graphs kept.
    assert (flag(second, "--max-num-seqs"), flag(second, "--enforce-eager")) == (seqs, None)
    # Step 2: eager mode, on top of step 1. MAX_NUM_BATCHED_TOKENS is unset and stays so: vLLM's
    # default is below the 8192 cap on every card under 160 GiB (and this machine has no GPU to
    # say otherwise); a larger value set by the user is capped (tests/integration/test_startup_ladder.py).
    assert (flag(third, "--max-num-seqs"), flag(third, "--enforce-eager")) == (seqs, "")
    assert flag(third, "--max-num-batched-tokens") is None


def test_memory_held_by_another_process_is_retried_once_then_explained(cp: ControlPlane, tmp_path: Path) -> None:
    engine = FakeEngine(tmp_path, [{"text": "FREE_MEMORY_LESS_THAN_DESIRED"}])
    env = worker_env(**engine.env())
    try:
        with WorkerProcess(env, control_plane=cp, workdir=tmp_path) as worker:
            job = cp.submit({"messages": MESSAGES})
            result = cp.result(job, timeout=JOB_TIMEOUT)
    finally:
        engine.kill_leftovers()

    launches = engine.launches()
    # The same configuration again: the model and its settings were never the problem.
    assert [launch["argv"] for launch in launches] == [launches[0]["argv"]] * 2
    # The answer is the diagnosis of the last launch, naming what the worker already tried.
    text, seen = vllm_texts.FREE_MEMORY_LESS_THAN_DESIRED, dict(worker.env)
    first = startup_errors.diagnose(Failure.of(text, MODEL, env=seen, exit_code=1))
    assert first is not None and first.kind == "memory_held"
    relaunch = recovery.next_launch(seen, [recovery.Attempt(env=seen, diagnosis=first)])
    assert isinstance(relaunch, recovery.Relaunch)
    last = startup_errors.diagnose(Failure.of(text, MODEL, env=seen, exit_code=1, tried=[relaunch.tried]))
    # Then why no fresh worker was asked for: this machine has no network volume to count them on
    # (tests/integration/test_fresh_worker.py has the fresh worker).
    assert set(result) == {"error"} and result["error"].startswith(last.message + " ")
    assert "did not ask the platform for a fresh worker" in result["error"]
