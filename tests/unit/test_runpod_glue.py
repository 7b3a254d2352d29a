"""The runpod SDK (1.12) behaviour `serving.platform` relies on, pinned, and the local test built on it.

`run_like_the_platform` must give the result the SDK's own job loop sends for the same handler
and job; the test runs both on the same handlers (the SDK's `handle_job` with its network
calls captured) so an SDK upgrade that changes the rules fails here, not in a user's console.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, AsyncGenerator

import pytest
from runpod.serverless.modules import rp_job, rp_scale

from vllm_worker.serving import platform as runpod_glue

JOB = {"input": {"prompt": "Hi"}}


async def fine(job: dict[str, Any]) -> AsyncGenerator[Any, None]:
    yield {"choices": [{"text": "Par"}]}
    yield {"choices": [{"text": "is"}]}


async def answered_error(job: dict[str, Any]) -> AsyncGenerator[Any, None]:
    yield {"error": "MAX_CONCURRENCY='abc' is not a whole number"}
    yield {"never": "sent"}


async def raising(job: dict[str, Any]) -> AsyncGenerator[Any, None]:
    raise RuntimeError("boom")
    yield  # pragma: no cover - makes this an async generator


def sdk_result(handler: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What runpod's job loop sends to the platform for one job of `handler`."""
    sent: list[dict[str, Any]] = []

    async def send_result(session: Any, job_result: dict[str, Any], job: dict[str, Any], is_stream: bool = False) -> None:
        sent.append(job_result)

    async def stream_result(session: Any, stream_output: Any, job: dict[str, Any]) -> None:
        return None

    monkeypatch.setattr(rp_job, "send_result", send_result)
    monkeypatch.setattr(rp_job, "stream_result", stream_result)
    config = {"handler": handler, "return_aggregate_stream": True, "rp_args": {}}
    asyncio.run(rp_job.handle_job(None, config, {"id": "j", **JOB}))  # type: ignore[arg-type]
    assert len(sent) == 1
    return sent[0]


@pytest.mark.parametrize("handler", [fine, answered_error, raising])
def test_the_local_result_is_what_the_sdks_job_loop_sends(handler: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    ours = asyncio.run(runpod_glue.run_like_the_platform(handler, {"id": "j", **JOB}))
    theirs = sdk_result(handler, monkeypatch)
    if handler is raising:
        # The SDK's traceback text differs between two runs only in line addresses: compare the sentence.
        assert ours["error"].split("\n")[0] == theirs["error"].split("\n")[0] == "handler: boom "
    else:
        assert ours == theirs


def last_json(out: str) -> Any:
    return json.loads(out.strip().splitlines()[-1])


def test_a_local_test_prints_the_result_and_fails_on_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    closed: list[bool] = []

    async def close() -> None:
        closed.append(True)

    assert runpod_glue.local_test(fine, {"id": "local_test", **JOB}, close) == 0
    assert last_json(capsys.readouterr().out) == {"output": [{"choices": [{"text": "Par"}]}, {"choices": [{"text": "is"}]}]}
    assert runpod_glue.local_test(answered_error, {"id": "local_test", **JOB}, close) == 1
    assert last_json(capsys.readouterr().out) == {"error": "MAX_CONCURRENCY='abc' is not a whole number"}
    assert closed == [True, True]


def test_the_local_test_input_is_picked_as_the_sdk_picks_it(tmp_path: Path) -> None:
    given = json.dumps(JOB)
    assert runpod_glue.local_test_input(["--test_input", given], {}, tmp_path) == {"id": "local_test", **JOB}
    assert runpod_glue.local_test_input([f"--test_input={given}"], {}, tmp_path) == {"id": "local_test", **JOB}
    # No flag: test_input.json, unless a job endpoint or the local API is configured.
    assert runpod_glue.local_test_input([], {}, tmp_path) is None
    (tmp_path / "test_input.json").write_text(json.dumps({"id": "mine", **JOB}))
    assert runpod_glue.local_test_input([], {}, tmp_path) == {"id": "mine", **JOB}
    assert runpod_glue.local_test_input([], {"RUNPOD_WEBHOOK_GET_JOB": "http://x"}, tmp_path) is None
    assert runpod_glue.local_test_input(["--rp_serve_api"], {}, tmp_path) is None


@pytest.mark.parametrize("given", ["{not json", '{"prompt": "no input key"}', "[1]"])
def test_a_bad_local_test_input_is_one_sentence(given: str, tmp_path: Path) -> None:
    with pytest.raises(runpod_glue.LocalTestError):
        runpod_glue.local_test_input(["--test_input", given], {}, tmp_path)


def test_the_job_loop_hooks_exist_and_both_signals_reach_the_one_handler(monkeypatch: pytest.MonkeyPatch) -> None:
    import runpod.serverless

    # The SDK's JobScaler still has the methods the worker replaces, and its loop the three loops
    # and the shutdown flag the drain drives.
    monkeypatch.setattr(rp_scale.JobScaler, "run", rp_scale.JobScaler.run)
    monkeypatch.setattr(rp_scale.JobScaler, "handle_shutdown", rp_scale.JobScaler.handle_shutdown)
    monkeypatch.setattr(runpod.serverless, "_signal_handler", runpod.serverless._signal_handler)
    for name in ("get_jobs", "run_jobs", "monitor_stop_signals", "kill_worker"):
        assert callable(getattr(rp_scale.JobScaler, name))
    assert isinstance(rp_scale.JobScaler({"handler": fine})._shutdown_event, asyncio.Event)

    async def close() -> None:
        return None

    shutdown = runpod_glue.Shutdown()
    runpod_glue.patch_job_loop(shutdown, close)
    assert getattr(rp_scale.JobScaler.run, "_vllm_worker") and getattr(rp_scale.JobScaler.handle_shutdown, "_vllm_worker")
    # SIGINT as runpod.serverless.start installs it, and SIGTERM/SIGINT as JobScaler.start does.
    assert runpod.serverless._signal_handler == shutdown.on_signal


def test_the_local_api_closes_the_session_when_its_app_shuts_down(monkeypatch: pytest.MonkeyPatch) -> None:
    from runpod.serverless.modules import rp_fastapi

    monkeypatch.setattr(rp_fastapi.WorkerAPI, "__init__", rp_fastapi.WorkerAPI.__init__)
    monkeypatch.setattr(rp_scale.JobScaler, "run", rp_scale.JobScaler.run)

    async def close() -> None:
        return None

    runpod_glue.patch_job_loop(None, close, local_api=True)
    api = rp_fastapi.WorkerAPI({"handler": fine, "rp_args": {}})
    # The SDK still builds a FastAPI app whose shutdown hooks run in uvicorn's loop.
    assert close in api.rp_app.router.on_shutdown
