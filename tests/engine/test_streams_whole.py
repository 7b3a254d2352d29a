"""Every stream whole on the real CPU engine, through both ways a job reaches the worker.

The SDK's job loop against the control-plane stand-in (plain asyncio) and the local API
(`vllm-worker run --rp_serve_api`: uvicorn on uvloop, the realtime path on the platform) each
stream completions of 100 to 1,000 tokens one at a time, and eight of 100 to 1,200 at once: every event arrives
once, in order (vLLM's continuous usage counts 1..N), ending in `[DONE]`, and no job is answered
with a timeout. Before the relay told its own pause from the request's timeout by what timed out,
the local API cut 3 streams of 4 after about a second with "REQUEST_TIMEOUT=900" (12 of 12 of these
tests' streams, 2026-12-07), so a thousand tokens is long enough to show a cut. bench/streams.py runs the
issue's full count (20 each way, up to 2,000 tokens) with the same code.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import engine_env, streams
from tests.support.control_plane import ControlPlane
from tests.support.worker_proc import WorkerProcess, stop_with_engine

pytestmark = pytest.mark.engine

AT_ONCE = 8
# One at a time costs the sum of the lengths, at once about the longest (a clean-clone CI run's budget).
LENGTHS = {1: streams.lengths(4, high=1000), AT_ONCE: streams.lengths(AT_ONCE, high=1200)}
SETTINGS = {"MAX_CONCURRENCY": str(AT_ONCE), "ADAPTIVE_CONCURRENCY": "false", "MAX_MODEL_LEN": "2048", "REQUEST_TIMEOUT": "900"}


@pytest.fixture(scope="module")
def job_loop(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with ControlPlane() as cp:
        env = engine_env.tiny_worker_env(tiny_model, **SETTINGS)
        proc = WorkerProcess(env, control_plane=cp, workdir=tmp_path_factory.mktemp("streams-jobs")).start()
        try:
            proc.wait_for_log(r"engine ready; taking jobs", timeout=engine_env.BOOT_TIMEOUT)
            yield cp
        finally:
            stop_with_engine(proc)


@pytest.fixture(scope="module")
def local_api(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    port = engine_env.free_port()
    env = engine_env.tiny_worker_env(tiny_model, **SETTINGS)
    args = ("run", "--rp_serve_api", "--rp_api_host", "127.0.0.1", "--rp_api_port", str(port))
    proc = WorkerProcess(env, args=args, workdir=tmp_path_factory.mktemp("streams-api")).start()
    try:
        proc.wait_for_log(r"engine ready; taking jobs", timeout=engine_env.BOOT_TIMEOUT)
        proc.wait_for_log(r"Uvicorn running on", timeout=60)
        yield port
    finally:
        stop_with_engine(proc)


def _whole(results: list[streams.Checked]) -> None:
    cut = [r for r in results if r.problem is not None]
    assert cut == [], f"{len(cut)} of {len(results)} streams not whole: {cut}"


@pytest.mark.parametrize("at_once", [1, AT_ONCE])
def test_streams_through_the_job_loop_arrive_whole(job_loop: ControlPlane, at_once: int) -> None:
    _whole(streams.run(streams.via_job_loop(job_loop, engine_env.BOOT_TIMEOUT), LENGTHS[at_once], at_once))


@pytest.mark.parametrize("at_once", [1, AT_ONCE])
def test_streams_through_the_local_api_arrive_whole(local_api: int, at_once: int) -> None:
    _whole(streams.run(streams.via_local_api(local_api, engine_env.BOOT_TIMEOUT), LENGTHS[at_once], at_once))
