"""The real vLLM CPU engine failing for real, and what the worker makes of it.

The classifier's rules are copied from vLLM 0.32's sources; these tests check them against
what vLLM 0.32 actually prints when it fails, captured live:

- through the worker process (control-plane stand-in, real runpod SDK job loop) for a KV
  cache too small for MAX_MODEL_LEN and for MAX_MODEL_LEN above the model's limit: the
  worker does not exit, every job gets the same sentence, and vLLM was launched as many
  times as the relaunch ladder says;
- directly (the argv the worker would build, started with `Engine`, its output given to
  `startup_errors.diagnose`) for the other causes, where only the classification matters.

Failing boots are cheap (~10-40 s) but not free on two shared cores, so every capture is
started at once by module fixtures and read by several tests.

Tests marked `xfail(strict=True)` pin defects of src/ found with the real engine: each
fails loudly (XPASS) once the defect is fixed, and the marker must then go.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support import engine_env
from tests.support.control_plane import ControlPlane
from tests.support.engine_env import BOOT_TIMEOUT, STOP_GRACE
from tests.support.worker_proc import WorkerProcess
from vllm_worker.diagnosis.verdict import Failure
from vllm_worker.config import command
from vllm_worker.config.profile import LaunchProfile
from vllm_worker.engine import ladder
from vllm_worker.diagnosis import startup_errors
from vllm_worker.config import settings as worker_settings
from vllm_worker.engine.process import Engine

pytestmark = pytest.mark.engine

# 256 KiB of KV cache is 256 tokens of the tiny model (1 KiB per token), less one 128-token
# block vLLM holds back: 128 tokens fit, MAX_MODEL_LEN=512 does not.
KV_TOO_SMALL = str(256 * 1024)
# Exactly the held-back block: nothing is left for the cache at all.
KV_ONE_BLOCK = str(128 * 1024)
MAX_CONCURRENCY = "4"  # MAX_NUM_SEQS defaults to 8, so the ladder's first memory step has nothing to lower
MESSAGES = [{"role": "user", "content": "Hi"}]
# Up to three launches of ~30 s each, on shared cores.
WORKER_TIMEOUT = 3 * BOOT_TIMEOUT


def base_env(model: Path | str, **overrides: str | None) -> dict[str, str]:
    """The tiny-engine configuration a user would give the worker, with `overrides` (None removes)."""
    return engine_env.tiny_worker_env(model, **{"DISABLE_LOG_STATS": "true", "MAX_CONCURRENCY": MAX_CONCURRENCY, **overrides})


# ----------------------------------------------------------------------------- direct captures


@dataclass(frozen=True)
class Capture:
    """One real failed start: the worker configuration, vLLM's output tail and exit code."""

    env: dict[str, str]
    output: str
    exit_code: int | None

    def diagnose(self) -> startup_errors.Diagnosis | None:
        return startup_errors.diagnose(Failure.of(self.output, exit_code=self.exit_code, env=self.env))


def capture(env: Mapping[str, str]) -> Capture:
    """Start vLLM with the argv the worker would build for `env`; return how it failed."""
    settings = worker_settings.load(env)
    built = command.build_args(LaunchProfile.parse(env), settings)
    engine = Engine(
        built.argv,
        engine_env.engine_env(built.engine_env),
        settings.vllm_host,
        settings.vllm_port,
        tail_lines=settings.log_tail_lines,  # what the worker keeps for its diagnosis
    )
    engine.start()
    try:
        state = engine.wait_ready(BOOT_TIMEOUT)
    finally:
        engine.stop(STOP_GRACE)
    assert state == "exited", f"expected vLLM to fail, it was {state}:\n{engine.tail()}"
    return Capture(dict(env), engine.tail(), engine.returncode)


def direct_cases(model: Path) -> dict[str, dict[str, str]]:
    return {
        # MAX_MODEL_LEN=auto with no room for one block: vLLM's auto-fit gives up.
        "auto_fit": base_env(model, MAX_MODEL_LEN="auto", KV_CACHE_MEMORY_BYTES=KV_ONE_BLOCK),
        "no_kv_memory": base_env(model, KV_CACHE_MEMORY_BYTES=KV_ONE_BLOCK),
        # Without an explicit size the CPU backend reserves utilization x node memory, minus what it uses.
        "cpu_kv_no_room": base_env(model, KV_CACHE_MEMORY_BYTES=None, GPU_MEMORY_UTILIZATION="0.01"),
        "bad_value": base_env(model, VLLM_EXTRA_ARGS="--max-num-seqs abc"),
        "unknown_flag": base_env(model, VLLM_EXTRA_ARGS="--no-such-flag 1"),
        # A local path (a volume not mounted, a typo): the pre-flight leaves local paths to vLLM.
        "missing_path": base_env("/nonexistent/path"),
        # HF_HUB_OFFLINE=1 (in every env here) skips the pre-flight; the repo is in no cache.
        "offline_unknown_repo": base_env("acme/does-not-exist-xyz"),
    }


@pytest.fixture(scope="module")
def captures(tiny_model: Path, failing_workers: dict[str, "FailingWorker"]) -> Iterator[dict[str, Future[Capture]]]:
    """Every direct capture, started at once (three at a time) while the failing workers boot."""
    with ThreadPoolExecutor(max_workers=3, thread_name_prefix="capture") as pool:
        yield {name: pool.submit(capture, env) for name, env in direct_cases(tiny_model).items()}


def captured(captures: dict[str, Future[Capture]], name: str) -> Capture:
    return captures[name].result(timeout=WORKER_TIMEOUT)


# ----------------------------------------------------------------------------- failing workers


@dataclass
class FailingWorker:
    env: dict[str, str]
    cp: ControlPlane
    worker: WorkerProcess
    jobs: list[str]

    def results(self) -> list[dict[str, Any]]:
        return [self.cp.result(job, timeout=WORKER_TIMEOUT) for job in self.jobs]

    def status(self) -> dict[str, Any]:
        result = self.cp.result(self.cp.submit({"route": "/worker/status"}), timeout=WORKER_TIMEOUT)
        [report] = result["output"]
        return report

    def vllm_starts(self) -> int:
        """How many times vLLM itself started: its API server logs its arguments once per start."""
        return len(re.findall(r"\[api_utils\.py:\d+\] non-default args: ", self.worker.log()))


@pytest.fixture(scope="module")
def failing_workers(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, FailingWorker]]:
    """Two workers whose engine fails for real, started together; each gets two chat jobs at once."""
    envs = {
        "kv_too_small": base_env(tiny_model, KV_CACHE_MEMORY_BYTES=KV_TOO_SMALL),
        "max_model_len": base_env(tiny_model, MAX_MODEL_LEN="999999"),
    }
    started: dict[str, FailingWorker] = {}
    try:
        for name, env in envs.items():
            cp = ControlPlane().start()
            worker = WorkerProcess(env, control_plane=cp, workdir=tmp_path_factory.mktemp(name)).start()
            jobs = [cp.submit({"messages": MESSAGES, "sampling_params": {"max_tokens": 2}}) for _ in range(2)]
            started[name] = FailingWorker(env, cp, worker, jobs)
        yield started
    finally:
        for failing in started.values():
            failing.worker.stop(timeout=60)
            failing.cp.close()


def answered_alike_and_alive(failing: FailingWorker) -> str:
    """Both jobs got the same one-sentence error, and the worker is still running; returns the sentence."""
    first, second = failing.results()
    assert set(first) == {"error"}, first
    assert second == first
    assert failing.worker.returncode is None, "the worker exited instead of answering jobs"
    sentence = first["error"]
    assert "Traceback" not in sentence and "\n" not in sentence
    return sentence


def planned_overrides(env: Mapping[str, str], diagnosis: startup_errors.Diagnosis) -> list[dict[str, str | None]]:
    """The overrides of every launch ladder.next_launch plans when each launch fails the same way."""
    launches: list[dict[str, str | None]] = [{}]
    attempts: list[ladder.Attempt] = []
    while True:
        launch_env = {**env, **{k: v for k, v in launches[-1].items() if v is not None}}
        for name in [k for k, v in launches[-1].items() if v is None]:
            launch_env.pop(name, None)
        attempts.append(ladder.Attempt(env=launch_env, diagnosis=diagnosis))
        step = ladder.next_launch(env, attempts)
        if isinstance(step, ladder.Stop):
            return launches
        launches.append(dict(step.overrides))


# ----------------------------------------------------------------------------- KV cache too small


def test_kv_cache_too_small_is_answered_with_the_shortfall_and_the_worker_stays_up(failing_workers) -> None:
    failing = failing_workers["kv_too_small"]
    sentence = answered_alike_and_alive(failing)

    log = failing.worker.log()
    assert "To serve at least one request with the model's max seq len (512)" in log
    estimate = re.search(r"the estimated maximum model length is (\d+)", log)
    assert estimate, "vLLM printed no estimate"
    assert sentence.startswith(f"MODEL_NAME={failing.env['MODEL_NAME']!r} does not fit in ")
    assert "at MAX_MODEL_LEN=512: one full-length sequence needs" in sentence
    assert f"set MAX_MODEL_LEN <= {estimate.group(1)}" in sentence


def test_kv_cache_too_small_is_launched_as_often_as_the_ladder_says(failing_workers) -> None:
    failing = failing_workers["kv_too_small"]
    failing.results()
    status = failing.status()

    launches = status["launches"]
    assert 1 <= len(launches) <= ladder.MAX_LAUNCHES
    assert all(launch["outcome"] == "failed" and launch["exit_code"] == 1 for launch in launches), launches
    assert status["causes"] == ["memory_shortfall"] * len(launches)
    assert status["fatal"] == failing.results()[0]["error"]
    assert status["ready"] is False
    assert failing.vllm_starts() == len(launches)
    # The worker followed its own ladder for a real "KV cache too small" failure.
    shortfall = startup_errors.Diagnosis(kind="memory_shortfall", message="", evidence="", detail="kv_too_small")
    assert [launch["overrides"] for launch in launches] == planned_overrides(failing.env, shortfall)


def test_kv_cache_too_small_with_an_explicit_kv_size_is_not_relaunched(failing_workers) -> None:
    failing = failing_workers["kv_too_small"]
    failing.results()

    assert len(failing.status()["launches"]) == 1
    assert failing.vllm_starts() == 1


def test_kv_cache_too_small_names_the_cpu_and_the_kv_cache_size_that_caused_it(failing_workers) -> None:
    failing = failing_workers["kv_too_small"]
    sentence = failing.results()[0]["error"]

    assert "GPU" not in sentence and "CPU" in sentence
    assert f"KV_CACHE_MEMORY_BYTES={KV_TOO_SMALL}" in sentence
    assert " 0 GiB" not in sentence


# ----------------------------------------------------------------------------- MAX_MODEL_LEN too large


def test_max_model_len_above_the_models_limit_is_answered_and_launched_once(failing_workers) -> None:
    failing = failing_workers["max_model_len"]
    sentence = answered_alike_and_alive(failing)

    assert sentence.startswith("MAX_MODEL_LEN=999999 is longer than the 2048-token context of ")
    assert "max_position_embeddings" in sentence
    assert "set MAX_MODEL_LEN to 2048 or less" in sentence
    # The worker's answer is the classifier's reading of the very output vLLM printed.
    diagnosis = startup_errors.diagnose(Failure.of(failing.worker.log(), env=failing.env))
    assert diagnosis is not None and diagnosis.kind == "max_model_len_too_large"
    assert diagnosis.message == sentence

    status = failing.status()
    [launch] = status["launches"]
    assert launch["outcome"] == "failed" and launch["cause"] == "max_model_len_too_large"
    assert failing.vllm_starts() == 1


# ----------------------------------------------------------------------------- direct captures


def test_auto_fit_with_no_room_for_one_token_is_a_memory_shortfall(captures) -> None:
    run = captured(captures, "auto_fit")
    assert "Cannot auto-fit max_model_len: not enough GPU memory available" in run.output  # vLLM's words, even on CPU

    diagnosis = run.diagnose()

    assert diagnosis is not None
    assert (diagnosis.kind, diagnosis.detail) == ("memory_shortfall", "auto_fit")
    assert "MAX_MODEL_LEN=auto could not fit even one token" in diagnosis.message


def test_no_memory_left_for_the_kv_cache_is_a_memory_shortfall(captures) -> None:
    run = captured(captures, "no_kv_memory")

    diagnosis = run.diagnose()

    assert diagnosis is not None
    assert (diagnosis.kind, diagnosis.detail) == ("memory_shortfall", "no_kv_memory")


@pytest.mark.parametrize("case", ["auto_fit", "no_kv_memory"])
def test_an_explicit_kv_size_with_no_room_names_it_and_the_cpu(captures, case: str) -> None:
    run = captured(captures, case)
    diagnosis = run.diagnose()

    assert diagnosis is not None
    assert f"KV_CACHE_MEMORY_BYTES={KV_ONE_BLOCK}" in diagnosis.message
    assert "GPU" not in diagnosis.message and "CUDA" not in diagnosis.message


def test_a_cpu_memory_reservation_smaller_than_the_engine_is_a_cpu_shortfall(captures) -> None:
    run = captured(captures, "cpu_kv_no_room")

    diagnosis = run.diagnose()

    assert diagnosis is not None
    assert (diagnosis.kind, diagnosis.detail) == ("memory_shortfall", "cpu_kv_no_room")
    assert "leaves no CPU memory for the KV cache" in diagnosis.message
    assert "raise GPU_MEMORY_UTILIZATION from 0.01" in diagnosis.message


def test_a_bad_flag_value_in_extra_args_is_bad_arguments(captures) -> None:
    run = captured(captures, "bad_value")
    assert run.exit_code == 2

    diagnosis = run.diagnose()

    assert diagnosis is not None and diagnosis.kind == "bad_arguments"
    assert diagnosis.variable == "VLLM_EXTRA_ARGS"
    assert "--max-num-seqs: invalid int value: 'abc'" in diagnosis.message


def test_an_unknown_flag_in_extra_args_is_bad_arguments(captures) -> None:
    run = captured(captures, "unknown_flag")
    assert run.exit_code == 2

    diagnosis = run.diagnose()

    assert diagnosis is not None and diagnosis.kind == "bad_arguments"
    assert diagnosis.message.startswith("vLLM 0.32 does not recognize the argument(s) --no-such-flag 1.")
    assert "VLLM_EXTRA_ARGS" in diagnosis.message


def test_a_missing_local_model_path_is_explained(captures) -> None:
    run = captured(captures, "missing_path")
    assert "Repo id must be in the form 'repo_name' or 'namespace/repo_name': '/nonexistent/path'" in run.output

    diagnosis = run.diagnose()

    assert diagnosis is not None and diagnosis.kind == "model_path_missing"
    assert "MODEL_NAME='/nonexistent/path'" in diagnosis.message


def test_an_uncached_repo_with_the_hub_offline_is_explained(captures) -> None:
    run = captured(captures, "offline_unknown_repo")
    assert "outgoing traffic has been disabled" in run.output

    diagnosis = run.diagnose()

    assert diagnosis is not None and diagnosis.kind == "offline_not_cached"
    assert "MODEL_NAME='acme/does-not-exist-xyz'" in diagnosis.message
    assert "HF_HUB_OFFLINE" in diagnosis.message
