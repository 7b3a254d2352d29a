"""Where the worker meets the runpod SDK (1.12): the job loop's start, its shutdown, and the local test.

Three things the SDK does not do the way this worker needs, kept here in one place:

- SIGTERM (scale-down) must stop the engine at once, not after the job loop winds down: the
  engine's process group holds the GPU the next worker needs. `JobScaler.handle_shutdown`
  is wrapped to start that stop first.
- The handler's pooled HTTP session must be closed inside the SDK's event loop, before
  `asyncio.run` closes it, or Python logs "Unclosed client session" at every exit.
  `JobScaler.run` is wrapped to close it; with the local API (`--rp_serve_api`) jobs run in
  uvicorn's loop instead, so the session is closed by the FastAPI app's shutdown.
- The SDK's local test (`--test_input`, or test_input.json when no job endpoint is set) awaits
  the handler as a coroutine; this handler is an async generator, so it printed
  `{'output': <async_generator ...>}` and "completed successfully" even for a job answered
  with an error. `local_test` runs the job the way the SDK's job loop does (each partial
  through `run_job_generator`, an "error" in a partial is the job's error, the partials
  aggregated) and prints the result the platform would return, exiting non-zero on an error.

`tests/unit/test_runpod_glue.py` pins the SDK behaviour each of these relies on.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any, Awaitable, Callable, Mapping, Sequence

TEST_INPUT_FILE = "test_input.json"


def _local_api_init() -> Any:
    from runpod.serverless.modules import rp_fastapi

    return rp_fastapi.WorkerAPI.__init__


def patch_job_loop(
    stop_engine: Callable[[], None] | None, close_session: Callable[[], Awaitable[None]], local_api: bool = False
) -> None:
    """Stop the engine first on SIGTERM, and close the HTTP session inside the SDK's loop (or the local API's).

    local_api: the local API or realtime server will run (imports FastAPI, so only then).
    """
    from runpod.serverless.modules import rp_scale

    scaler = rp_scale.JobScaler
    if stop_engine is not None and not getattr(scaler.handle_shutdown, "_vllm_worker", False):
        original_shutdown = scaler.handle_shutdown

        def handle_shutdown(self: Any, signum: int, frame: Any) -> None:
            # In a thread: the job loop winds down meanwhile.
            threading.Thread(target=stop_engine, name="engine-stop").start()
            original_shutdown(self, signum, frame)

        handle_shutdown._vllm_worker = True  # type: ignore[attr-defined]
        scaler.handle_shutdown = handle_shutdown  # type: ignore[method-assign]

    if local_api and not getattr(_local_api_init(), "_vllm_worker", False):
        from runpod.serverless.modules import rp_fastapi

        original_init = rp_fastapi.WorkerAPI.__init__

        def init_then_close_on_shutdown(self: Any, config: dict[str, Any]) -> None:
            original_init(self, config)
            self.rp_app.router.on_shutdown.append(close_session)  # runs in uvicorn's loop

        init_then_close_on_shutdown._vllm_worker = True  # type: ignore[attr-defined]
        rp_fastapi.WorkerAPI.__init__ = init_then_close_on_shutdown  # type: ignore[method-assign]

    if not getattr(scaler.run, "_vllm_worker", False):
        original_run = scaler.run

        async def run_then_close(self: Any) -> None:
            try:
                await original_run(self)
            finally:
                await close_session()

        run_then_close._vllm_worker = True  # type: ignore[attr-defined]
        scaler.run = run_then_close  # type: ignore[method-assign]


class LocalTestError(ValueError):
    """The local test's input cannot be read."""


def local_test_input(argv: Sequence[str], env: Mapping[str, str], cwd: Path) -> dict[str, Any] | None:
    """The job of a local test run, as the SDK would pick it; None when this is not a local test.

    The SDK runs a local test when `--test_input JSON` is given, or when no job endpoint is
    configured (RUNPOD_WEBHOOK_GET_JOB unset) and the local API is not asked for; then it reads
    test_input.json from the working directory.
    """
    given: str | None = None
    for i, word in enumerate(argv):
        if word == "--test_input" and i + 1 < len(argv):
            given = argv[i + 1]
        elif word.startswith("--test_input="):
            given = word.split("=", 1)[1]
    if given is None:
        if env.get("RUNPOD_WEBHOOK_GET_JOB") or "--rp_serve_api" in argv or any(
            w.startswith("--rp_serve_api=") for w in argv
        ):
            return None
        path = cwd / TEST_INPUT_FILE
        if not path.is_file():
            return None
        given = path.read_text(encoding="utf-8")
    try:
        job = json.loads(given)
    except ValueError as error:
        raise LocalTestError(f"--test_input is not JSON: {error}") from None
    if not isinstance(job, dict) or "input" not in job:
        raise LocalTestError('the local test job must be a JSON object with an "input", e.g. {"input": {"prompt": "Hi"}}')
    job.setdefault("id", "local_test")
    return job


async def run_like_the_platform(handler: Callable[..., Any], job: dict[str, Any]) -> dict[str, Any]:
    """The job's result as runpod 1.12's job loop would send it (aggregated stream, or the error)."""
    from runpod.serverless.modules.rp_job import run_job_generator

    result: dict[str, Any] = {"output": []}
    async for partial in run_job_generator(handler, job):
        output = partial.get("output")
        if isinstance(output, dict) and output.get("error"):
            partial = {"error": str(output["error"])}
        if partial.get("error"):
            return {"error": partial["error"]}
        result["output"].append(output)
    return result


def local_test(
    handler: Callable[..., Any],
    job: dict[str, Any],
    close_session: Callable[[], Awaitable[None]],
    stop_engine: Callable[[], None] | None = None,
) -> int:
    """Run one job locally, print what the platform would return, and return the exit code (1 on error).

    `stop_engine` runs before the print: the engine's output is copied to the same stdout, and its
    shutdown lines (vLLM's resource tracker warns as it exits) must not follow the result line.
    """

    async def run() -> dict[str, Any]:
        try:
            return await run_like_the_platform(handler, job)
        finally:
            await close_session()

    result = asyncio.run(run())
    if stop_engine is not None:
        stop_engine()
    # One line, last: the SDK logs to the same stdout, and a script reads the last line.
    print(json.dumps(result, ensure_ascii=False), flush=True)
    return 1 if result.get("error") else 0
