"""The control-plane stand-in, driven by the real runpod SDK job loop.

Before the worker's own integration tests can be trusted, the harness must show it
delivers what the platform delivers. A tiny SDK worker (an async generator handler, as
the vLLM worker's is) runs as a process against `ControlPlane`; these tests pin what the
SDK really posts: the aggregated output list, an error string, the stream parts, a
batch take when concurrency is above one, authenticated pings, and a clean SIGTERM.
"""

from __future__ import annotations

import json
import socket
import struct
import sys
import textwrap
import time
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.control_plane import ControlPlane
from tests.support.worker_proc import WorkerProcess

pytestmark = pytest.mark.integration

HANDLER = textwrap.dedent(
    """
    import asyncio
    import os
    import runpod

    async def handler(job):
        spec = job["input"]
        if "raise" in spec:
            raise RuntimeError(spec["raise"])
        for item in spec["yield"]:
            yield item
            await asyncio.sleep(spec.get("pause", 0))

    config = {"handler": handler, "return_aggregate_stream": True}
    if os.environ.get("HARNESS_CONCURRENCY"):
        n = int(os.environ["HARNESS_CONCURRENCY"])
        config["concurrency_modifier"] = lambda current: n
    runpod.serverless.start(config)
    """
)


def sdk_worker(tmp_path: Path, cp: ControlPlane, env: dict[str, str] | None = None) -> WorkerProcess:
    script = tmp_path / "handler.py"
    script.write_text(HANDLER)
    return WorkerProcess(env or {}, args=(), control_plane=cp, command=[sys.executable, str(script)], workdir=tmp_path)


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ControlPlane, WorkerProcess]]:
    with ControlPlane() as cp, sdk_worker(tmp_path_factory.mktemp("sdk-worker"), cp) as worker:
        yield cp, worker


def test_generator_output_is_aggregated_into_a_list_and_streamed_part_by_part(running) -> None:
    cp, worker = running
    parts = [{"object": "chat.completion", "n": 1}, "data: {\"x\": 1}\n\n", "data: [DONE]\n\n"]
    job = cp.submit({"yield": parts})

    assert cp.result(job, timeout=60) == {"output": parts}
    assert cp.stream_chunks(job) == [{"output": p} for p in parts]
    assert cp.done_query(job)["isStream"] == "true"
    assert len(cp.taken(job)) == 1


def test_an_error_dict_yielded_by_the_handler_becomes_the_whole_result(running) -> None:
    cp, worker = running
    sentence = "MODEL_NAME is not set: set it to a Hugging Face repository such as 'owner/name'."
    job = cp.submit({"yield": [{"partial": True}, {"error": sentence}, {"never": "sent"}]})

    assert cp.result(job, timeout=60) == {"error": sentence}
    # Parts before the error were already streamed; nothing after it is.
    assert cp.stream_chunks(job) == [{"output": {"partial": True}}]


def test_an_error_as_the_first_yield_gives_only_the_error(running) -> None:
    cp, worker = running
    job = cp.submit({"yield": [{"error": "first and only"}]})

    assert cp.result(job, timeout=60) == {"error": "first and only"}
    assert cp.stream_chunks(job) == []


def test_an_exception_in_the_handler_reaches_the_client_with_its_traceback(running) -> None:
    # Why the worker must turn every failure into a sentence itself: the SDK would
    # hand the client the exception text and a Python traceback.
    cp, worker = running
    job = cp.submit({"raise": "boom"})

    error = cp.result(job, timeout=60)["error"]
    assert error.startswith("handler: boom")
    assert "Traceback (most recent call last)" in error


def test_the_worker_takes_jobs_authenticated_with_its_id_and_pings(running) -> None:
    cp, worker = running
    for route in ("ping", "take", "stop"):
        cp.wait_for_request(route, timeout=30)

    takes = cp.requests("take")
    assert takes, "the SDK never called job-take"
    assert {r.query["job_in_progress"] for r in takes} <= {"0", "1"}
    assert all(r.path.endswith(f"/job-take/{cp.worker_id}") for r in takes)
    assert cp.requests("unknown") == []
    assert cp.unauthorized() == []
    # The SDK derives its per-job stop channel from the job-take URL.
    assert all(r.path.endswith(f"/job-stop/{cp.worker_id}") for r in cp.requests("stop"))


def test_a_stopped_job_gets_no_result_and_the_worker_goes_on(running) -> None:
    # /cancel reaches the worker through the stop channel: the SDK cancels the job's
    # task and posts nothing for it, then takes the next job.
    cp, worker = running
    stopped = cp.submit({"yield": [{"first": 1}, {"second": 2}], "pause": 600})
    cp.wait_for_stream_chunks(stopped, 1, timeout=60)
    cp.stop(stopped)
    after = cp.submit({"yield": [{"after": True}]})

    assert cp.result(after, timeout=60) == {"output": [{"after": True}]}
    assert cp.results_posted(stopped) == []
    assert cp.stream_chunks(stopped) == [{"output": {"first": 1}}]


def test_concurrency_above_one_takes_jobs_in_batches(tmp_path: Path) -> None:
    with ControlPlane() as cp:
        jobs = [cp.submit({"yield": [{"job": i}]}) for i in range(3)]
        with sdk_worker(tmp_path, cp, {"HARNESS_CONCURRENCY": "3"}):
            results = [cp.result(job, timeout=60) for job in jobs]

        assert results == [{"output": [{"job": i}]} for i in range(3)]
        batch = cp.requests("take-batch")
        assert batch and batch[0].query["batch_size"] == "3"
        assert cp.requests("take") == []


def test_sigterm_ends_the_sdk_loop_cleanly(tmp_path: Path) -> None:
    with ControlPlane() as cp:
        worker = sdk_worker(tmp_path, cp).start()
        try:
            worker.wait_for_log(r"--- Starting Serverless Worker \| +Version 1\.12\.", timeout=60)
            cp.wait_for_request("take", timeout=60)
        finally:
            code = worker.stop(timeout=30)

        assert (code, worker.killed) == (0, False)


def test_results_are_sent_as_json_text_the_platform_parses(running) -> None:
    # The SDK posts json.dumps(ensure_ascii=False) as form-encoded text; non-ASCII
    # must come through unchanged.
    cp, worker = running
    job = cp.submit({"yield": [{"text": "héllo – 世界"}]})

    assert json.dumps(cp.result(job, timeout=60), ensure_ascii=False) == '{"output": [{"text": "héllo – 世界"}]}'


def _raw_request(cp: ControlPlane, lines: list[str]) -> socket.socket:
    host, port = cp.base_url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall(("\r\n".join([*lines, f"Authorization: {cp.api_key}", "", ""])).encode())
    return sock


def test_a_worker_that_hangs_up_mid_poll_leaves_no_traceback_and_a_real_fault_still_prints_one(
    capfd: pytest.CaptureFixture[str],
) -> None:
    # A stopped worker hangs up its open long-poll: the stand-in's late reply meets a reset connection.
    with ControlPlane(poll_wait=1.0) as cp:
        take = f"GET /v2/{cp.endpoint_id}/job-take/{cp.worker_id}?job_in_progress=0 HTTP/1.1"
        sock = _raw_request(cp, [take, "Host: stand-in"])
        deadline = time.monotonic() + 5
        while not cp.requests("take") and time.monotonic() < deadline:
            time.sleep(0.01)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset
        sock.close()
        while cp.hung_up == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert cp.hung_up == 1
        assert "Traceback" not in capfd.readouterr().err
        # A fault of the stand-in's own (here a request it cannot read) still shows its traceback.
        post = f"POST /v2/{cp.endpoint_id}/job-done/{cp.worker_id}/j HTTP/1.1"
        with _raw_request(cp, [post, "Host: stand-in", "Content-Length: many"]) as bad:
            bad.settimeout(5)
            assert bad.recv(1024) == b""  # the handler died: no reply, the connection closed
    err = capfd.readouterr().err
    assert "Traceback" in err and "ValueError" in err
