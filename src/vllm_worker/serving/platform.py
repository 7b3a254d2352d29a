"""Every contact with the runpod SDK (1.12): the job loop, its stop, the local API, the local test.

What the SDK does not do the way this worker needs, kept here in one place:

- A stop from the platform (SIGTERM; SIGINT alike) is handled by `Shutdown.on_signal`, for the
  whole life of the worker: during startup it stops the engine and ends startup (`Stopped`); in
  the job loop it drains. The SDK's own handler (`JobScaler.handle_shutdown`) and its SIGINT
  handler are routed there. Draining: no job is taken any more (the held job-take poll is
  cancelled, so an idle worker exits at once and its GPU goes to the next worker); jobs not yet
  started are answered that the worker is being stopped; running jobs get DRAIN_TIMEOUT seconds,
  then are answered with a sentence saying the platform stopped the worker and the job can be
  sent again (never "the engine died"); a second signal does that at once. `main` stops the engine
  after the loop ends. Runpod documents 5 s between SIGTERM and SIGKILL (the spot-instance note of
  its Pods pricing page, https://docs.runpod.io/pods/pricing, runpod/docs until commit 8e5aebdb),
  its serverless pages name no figure, so DRAIN_TIMEOUT defaults to 3 s, counted from the signal; the
  answers of the jobs cut then are posted, and the engine stopped, by 4 s after it (`post_deadline`),
  and the last second of the window (EXIT_MARGIN_S) is the worker's own exit (0.5 s was once too
  little on a loaded machine: the runtime's SIGKILL came first). A DRAIN_TIMEOUT above 3 s declares
  a longer window than the documented one; the posting then gets MIN_POST_S (1 s) after the cut.
- The SDK's fitness checks (`rp_fitness.run_fitness_checks`, which `worker.run_worker` awaits before
  the job loop) `os._exit(1)` the worker on any failure, after the engine holds the machine's memory
  and disk. The worker makes the equivalent checks itself at the start (engine.machine_checks) and
  answers a failure on every job; `keep_sdk_checks_off` replaces the SDK's run with one log line
  naming what the worker's checks found. The SDK's unhealthy report (`_report_unhealthy`, a GET to
  the ping URL with status=unhealthy, check and reason) is a best-effort event sent just before that
  exit, for the platform's records; it neither replaces the worker nor says it still answers jobs,
  and the heartbeat that follows would contradict it, so a machine fault asks with `refresh_worker`.
- A fresh worker (`ask_for_fresh_worker`): for a generator handler the SDK reads `refresh_worker`
  from the config dict given to `runpod.serverless.start` after each job (rp_job.handle_job sets
  `stopPod` in the result, rp_scale.JobScaler.handle_job ends the loop).
- The handler's pooled HTTP session must be closed inside the SDK's event loop, before
  `asyncio.run` closes it, or Python logs "Unclosed client session" at every exit. With the local
  API (`--rp_serve_api`) jobs run in uvicorn's loop instead, so the session is closed by the
  FastAPI app's shutdown, and uvicorn handles the signals itself while it runs.
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
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, AsyncGenerator, Awaitable, Callable, Mapping, Sequence

from vllm_worker.serving import handler as handler_mod
from vllm_worker.serving.state import WorkerState

log = logging.getLogger("vllm_worker")

TEST_INPUT_FILE = "test_input.json"
# The platform's SIGKILL after SIGTERM (the figure Runpod documents): the worker has exited before it.
KILL_AFTER_S = 5.0
# After a platform stop, what the worker keeps of the window for its own exit once the engine is stopped and the
# answers posted: reaping the engine's killed processes and the interpreter's exit, on a machine that may be loaded.
EXIT_MARGIN_S = 1.0
# When DRAIN_TIMEOUT declares a window longer than KILL_AFTER_S, what the posting gets after the cut.
MIN_POST_S = 1.0


def post_deadline(signal_at: float, drain_timeout: float) -> float:
    """When the wait for the cut jobs' answers to be posted ends, and the engine's stop with it (same clock as
    `signal_at`): EXIT_MARGIN_S before the platform's SIGKILL, or MIN_POST_S after a longer declared drain."""
    return signal_at + max(KILL_AFTER_S - EXIT_MARGIN_S, drain_timeout + MIN_POST_S)


def new_job_sentence() -> str:
    return (
        "The worker is being stopped by the platform (a scale-down or a replaced worker) and takes no new jobs; "
        "this job was not run: send it again and another worker will run it."
    )


def stopped_sentence(drain_timeout: float, at_once: bool = False) -> str:
    """What a job still running when the worker stops is answered with."""
    why = (
        "a second stop signal ended the wait for running jobs"
        if at_once
        else f"running jobs had DRAIN_TIMEOUT={drain_timeout:g} seconds to finish and this one needed more"
    )
    return (
        f"The worker was stopped by the platform (a scale-down or a replaced worker) before this job finished: "
        f"{why}. The job was not completed: send it again and another worker will run it."
    )


class Stopped(BaseException):
    """A stop signal arrived while the worker was starting: startup ends, and `main` returns `code`.

    A BaseException, as KeyboardInterrupt is: no `except Exception` on the way may take it for a failure.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum} during startup")
        self.code = 128 + signum


class Shutdown:
    """The one place SIGTERM and SIGINT are handled, from the first line of startup to the last job."""

    def __init__(
        self, stop_engine: Callable[[float | None], None] | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.stop_engine = stop_engine
        self.clock = clock  # what the signal and the drain's deadlines are read from (a test's own clock)
        self.signals = 0
        self.phase = "starting"  # "starting", "jobs" (the SDK's job loop), "local" (uvicorn's own)
        self.state: WorkerState | None = None
        self.drain_timeout = 0.0
        self.signal_at: float | None = None  # self.clock() at the first signal
        self._owner = os.getpid()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._scaler: Any = None
        self._requested: asyncio.Event | None = None
        self._at_once: asyncio.Event | None = None

    def install(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self.on_signal)

    def serving(self, state: WorkerState, drain_timeout: float, local_api: bool) -> None:
        """Startup is over: from now on a signal drains the job loop (or lets uvicorn stop)."""
        self.state = state
        self.drain_timeout = drain_timeout
        self.phase = "local" if local_api else "jobs"

    def on_signal(self, signum: int, frame: Any) -> None:
        if os.getpid() != self._owner:
            # A child forked by the SDK (its heartbeat) inherits this handler; the engine is not its to stop.
            os._exit(128 + signum)
        self.signals += 1
        if self.signal_at is None:
            self.signal_at = self.clock()
        if self.phase == "starting":
            log.info("signal %d during startup: stopping the engine", signum)
            self._stop_engine()
            raise Stopped(signum)
        if self.phase == "local":
            # uvicorn re-raises the signal it handled once it has shut down: the engine goes too.
            log.info("signal %d: the local API has stopped; stopping the engine", signum)
            self._stop_engine()
            return
        if self.signals == 1:
            running = self._scaler.job_progress.get_job_count() if self._scaler is not None else 0
            log.info(
                "signal %d: taking no more jobs; %d running may finish within DRAIN_TIMEOUT=%g s, then the engine stops",
                signum,
                running,
                self.drain_timeout,
            )
            if self.state is not None:
                self.state.begin_stop(new_job_sentence())
            if running == 0:
                # Idle: nothing to wait for, the engine's GPU goes to the next worker now.
                threading.Thread(target=self._stop_engine, name="engine-stop").start()
            self._wake(self._requested)
        else:
            log.info("signal %d again: stopping at once", signum)
            self._wake(self._at_once)

    def engine_grace(self) -> float | None:
        """How long the engine's stop may wait for it before SIGKILL: VLLM_STOP_GRACE (None) before a signal;
        after one, until `post_deadline`, which leaves the worker's own exit EXIT_MARGIN_S of the platform's
        window, so the worker exits before the runtime's SIGKILL (exit code 0) however slowly the engine stops."""
        if self.signal_at is None:
            return None
        return max(0.0, post_deadline(self.signal_at, self.drain_timeout) - self.clock())

    def since_signal(self) -> float | None:
        """Seconds since the platform's first signal; None when there was none."""
        return None if self.signal_at is None else self.clock() - self.signal_at

    def _stop_engine(self) -> None:
        if self.stop_engine is not None:
            self.stop_engine(self.engine_grace())

    def _wake(self, event: asyncio.Event | None) -> None:
        if self._loop is not None and event is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(event.set)
            if self._scaler is not None:
                self._loop.call_soon_threadsafe(self._scaler.kill_worker)

    async def run_loop(self, scaler: Any, close_session: Callable[[], Awaitable[None]]) -> None:
        """The SDK's job loop (its three loops, as `JobScaler.run` starts them), with the drain."""
        from runpod.http_client import AsyncClientSession

        self._loop = asyncio.get_running_loop()
        self._scaler = scaler
        self._requested, self._at_once = asyncio.Event(), asyncio.Event()
        if self.signals:
            self._requested.set()
            scaler.kill_worker()
        try:
            async with AsyncClientSession() as session:
                take = asyncio.create_task(scaler.get_jobs(session))
                work = asyncio.create_task(scaler.run_jobs(session))
                stops = asyncio.create_task(scaler.monitor_stop_signals(session))
                try:
                    await self._drain(scaler, take, work)
                    if self._requested.is_set():
                        # Every job is answered: the engine's GPU goes to the next worker while the loop winds down.
                        threading.Thread(target=self._stop_engine, name="engine-stop").start()
                finally:
                    for task in (take, work, stops):
                        task.cancel()
                    await asyncio.gather(take, work, stops, return_exceptions=True)
        finally:
            await close_session()

    async def _drain(self, scaler: Any, take: "asyncio.Task[Any]", work: "asyncio.Task[Any]") -> None:
        assert self._requested is not None and self._at_once is not None
        ending = asyncio.create_task(scaler._shutdown_event.wait())
        try:
            await asyncio.wait({ending, work}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ending.cancel()
        # A held job-take poll would keep even an idle worker up to the SDK's 90 s timeout.
        take.cancel()
        if not self._requested.is_set():
            await work  # refresh_worker: the SDK ends the loop once its jobs are answered
            return
        signal_at = self.signal_at if self.signal_at is not None else self.clock()
        at_once = asyncio.create_task(self._at_once.wait())
        try:
            left = max(0.0, signal_at + self.drain_timeout - self.clock())
            await asyncio.wait({work, at_once}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        finally:
            at_once.cancel()
        if work.done():
            return
        if self.state is not None:
            cut = handler_mod.interrupt_running(self.state, stopped_sentence(self.drain_timeout, self._at_once.is_set()))
            log.warning(
                "the worker stops with jobs still running: %d request(s) to the engine cut, each answered that it can be sent again",
                cut,
            )
        # The SIGKILL ends the process then anyway: the loop winds down rather than be killed mid-post.
        await asyncio.wait({work}, timeout=max(0.0, post_deadline(signal_at, self.drain_timeout) - self.clock()))


_config: dict[str, Any] | None = None
_fresh_worker_wanted = False


def ask_for_fresh_worker() -> None:
    """Ask the platform to replace this worker after the next job it answers (and every one after)."""
    global _fresh_worker_wanted
    _fresh_worker_wanted = True
    if _config is not None:
        _config["refresh_worker"] = True


def _local_api_init() -> Any:
    from runpod.serverless.modules import rp_fastapi

    return rp_fastapi.WorkerAPI.__init__


def patch_job_loop(
    shutdown: Shutdown | None, close_session: Callable[[], Awaitable[None]], local_api: bool = False
) -> None:
    """Route the SDK's signal handlers to `shutdown`, run its job loop with the drain, and close the HTTP
    session inside the SDK's loop (or the local API's).

    local_api: the local API or realtime server will run (imports FastAPI, so only then).
    """
    import runpod.serverless
    from runpod.serverless.modules import rp_scale

    scaler = rp_scale.JobScaler
    if shutdown is not None:

        def handle_shutdown(self: Any, signum: int, frame: Any) -> None:
            shutdown._scaler = self
            shutdown.on_signal(signum, frame)

        handle_shutdown._vllm_worker = True  # type: ignore[attr-defined]
        scaler.handle_shutdown = handle_shutdown  # type: ignore[method-assign]
        # runpod.serverless.start installs this for SIGINT before anything else runs.
        runpod.serverless._signal_handler = shutdown.on_signal  # type: ignore[attr-defined]

    if local_api and not getattr(_local_api_init(), "_vllm_worker", False):
        from runpod.serverless.modules import rp_fastapi

        original_init = rp_fastapi.WorkerAPI.__init__

        def init_then_close_on_shutdown(self: Any, config: dict[str, Any]) -> None:
            original_init(self, config)
            self.rp_app.router.on_shutdown.append(close_session)  # runs in uvicorn's loop

        init_then_close_on_shutdown._vllm_worker = True  # type: ignore[attr-defined]
        rp_fastapi.WorkerAPI.__init__ = init_then_close_on_shutdown  # type: ignore[method-assign]

    drain = shutdown if shutdown is not None else Shutdown()

    async def run_with_drain(self: Any) -> None:
        await drain.run_loop(self, close_session)

    run_with_drain._vllm_worker = True  # type: ignore[attr-defined]
    scaler.run = run_with_drain  # type: ignore[method-assign]


_checks_found: list[str] = []


def record_machine_checks(lines: Sequence[str]) -> None:
    """What the worker's own machine checks found (one line each), for the line that replaces the SDK's checks."""
    _checks_found[:] = list(lines)


def keep_sdk_checks_off() -> None:
    """The SDK's fitness checks never run in this worker: `worker.run_worker` awaits the name
    `run_fitness_checks` it imported from rp_fitness; that name is replaced by one log line."""
    from runpod.serverless import worker as sdk_worker

    if getattr(sdk_worker.run_fitness_checks, "_vllm_worker", False):
        return

    async def worker_made_its_checks() -> None:
        log.info(
            "the runpod SDK's fitness checks are not run: one failing now would exit a worker that answers jobs; "
            "the worker checked its machine at the start (%s)",
            "; ".join(_checks_found) or "no checks ran",
        )

    worker_made_its_checks._vllm_worker = True  # type: ignore[attr-defined]
    sdk_worker.run_fitness_checks = worker_made_its_checks  # type: ignore[attr-defined]


# ==================================================================================================
# Capacity-aware taking (serving.intake): the SDK's concurrency_modifier, without its drain on change.
#
# runpod 1.12's `JobScaler.set_scale` applies a new concurrency_modifier value only after
# `while self.current_occupancy() > 0: await asyncio.sleep(1)`, and takes no job meanwhile: a limit
# that follows the engine would drain the worker at every change. The wait is there because the new
# value came with a new `asyncio.Queue(maxsize=...)`, and a job taken from the old queue would call
# `task_done()` on the new one. The patch keeps one unbounded queue for the worker's life, made
# while nothing is taken (the loop's first call): how many jobs it holds is bounded by the take
# itself (`get_jobs` asks for the limit less what is held, `run_jobs` starts jobs up to the limit),
# so a new limit applies at once: a lower one takes nothing until enough jobs end, a higher one
# asks for more at the next take. runpod-python PR #457 (open) removes the wait upstream; once the
# pinned SDK has it, `patch_set_scale` and its test (tests/unit/test_intake_sdk.py) go.
PATCHED_RUNPOD = "1.12."
ROOM_WAIT_S = 30.0
ROOM_POLL_S = 0.05


def patch_set_scale() -> bool:
    """Replace runpod 1.12's `JobScaler.set_scale` with one that never drains; False (and a log line)
    on another SDK version, whose set_scale is left as it is."""
    import runpod
    from runpod.serverless.modules import rp_scale

    scaler = rp_scale.JobScaler
    if getattr(scaler.set_scale, "_vllm_worker", False):
        return True
    if not str(getattr(runpod, "__version__", "")).startswith(PATCHED_RUNPOD):
        log.warning(
            "runpod %s is not the pinned %sx: its JobScaler.set_scale is left as it is, so a change of the job "
            "limit may wait for the worker to be idle (runpod-python PR #457)",
            getattr(runpod, "__version__", "?"),
            PATCHED_RUNPOD,
        )
        return False

    def ask(self: Any) -> None:
        self.current_concurrency = max(1, int(self.concurrency_modifier(self.current_concurrency)))

    async def set_scale(self: Any) -> None:
        ask(self)
        idle = self.jobs_queue.qsize() == 0 and self.job_progress.get_job_count() == 0
        if self.jobs_queue.maxsize != 0 and idle:
            self.jobs_queue = asyncio.Queue()  # once: from now on no limit needs a new queue
        # Full, the SDK sleeps a whole second before it asks again; a job that ends, a limit that rises or
        # a paced take that falls due meanwhile would leave the engine a slot short for up to that second.
        # Wait here for room instead, asking every ROOM_POLL_S, so the next take follows at once (ROOM_WAIT_S
        # only bounds one wait: the loop asks again after it; a stop ends it at once).
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ROOM_WAIT_S
        while self.is_alive() and self.current_occupancy() >= self.current_concurrency and loop.time() < deadline:
            await asyncio.sleep(ROOM_POLL_S)
            ask(self)

    set_scale._vllm_worker = True  # type: ignore[attr-defined]
    scaler.set_scale = set_scale  # type: ignore[method-assign]
    return True


def held_jobs() -> int:
    """Jobs the worker has taken and not yet answered (the SDK's JobsProgress: queued and running)."""
    from runpod.serverless.modules.worker_state import JobsProgress

    return JobsProgress().get_job_count()


def finished_in_engine(state: WorkerState) -> int:
    """Jobs the worker holds whose request the engine has finished (their answers still being posted): the ids
    the handler marked, less those the SDK no longer holds (forgotten here)."""
    from runpod.serverless.modules.worker_state import JobsProgress

    if state.engine_done is None:
        return 0
    state.engine_done.intersection_update(job.id for job in list(JobsProgress()))
    return len(state.engine_done)


def concurrency_modifier(intake: Any | None, fixed: int, state: WorkerState | None = None) -> Callable[[int], int]:
    """What the SDK asks before every take: the intake's current limit, or the fixed MAX_CONCURRENCY."""
    if intake is None or not intake.adaptive:
        return lambda current: fixed
    intake.held = held_jobs
    if state is not None:
        state.engine_done = set()
        intake.finished = lambda: finished_in_engine(state)
    patch_set_scale()
    return lambda current: intake.allowed_now()


# ==================================================================================================

def serve(
    handler: Callable[[dict[str, Any]], AsyncGenerator[Any, None]],
    close_session: Callable[[], Awaitable[None]],
    concurrency: int,
    shutdown: Shutdown,
    state: WorkerState,
    drain_timeout: float,
    intake: Any | None = None,
) -> int:
    """Answer jobs: one local test job, or the SDK's job loop (or its local API) until stopped; the exit code."""
    global _config
    try:
        job = local_test_input(sys.argv[1:], os.environ, Path.cwd())
    except LocalTestError as error:
        log.error("%s", error)
        return 2
    if job is not None:
        return local_test(handler, job, close_session, shutdown.stop_engine)
    import runpod

    local_api = any(arg.startswith("--rp_serve_api") for arg in sys.argv[1:]) or bool(os.environ.get("RUNPOD_REALTIME_PORT"))
    patch_job_loop(shutdown, close_session, local_api)
    keep_sdk_checks_off()
    shutdown.serving(state, drain_timeout, local_api)
    _config = {
        "handler": handler,
        "concurrency_modifier": concurrency_modifier(intake, concurrency, state),
        "return_aggregate_stream": True,
        "refresh_worker": _fresh_worker_wanted,
    }
    runpod.serverless.start(_config)
    return 0


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
    stop_engine: Callable[[float | None], None] | None = None,
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
        stop_engine(None)
    # One line, last: the SDK logs to the same stdout, and a script reads the last line.
    print(json.dumps(result, ensure_ascii=False), flush=True)
    return 1 if result.get("error") else 0
