"""Entry point: pre-flight, launch `vllm serve` with a bounded relaunch ladder, then serve jobs.

Whatever happens at startup, the worker ends up in Runpod's job loop: either with a
ready engine, or with one sentence that every job is answered with. A container that
exits on a startup failure is restarted by the platform into the same failure, which
is a crash loop the user cannot see; an answered job is something they can read. That
holds for failures no rule knows too: they are answered with vLLM's own root error, and
a fault that may be the host's gets one relaunch, then the answer says how to get a
fresh machine.

Once serving, the engine is watched (its exit, and vLLM's /health turning 503 when the
engine core died under a live API server). A death ends the jobs that were running at once,
with the cause, instead of letting them hang until REQUEST_TIMEOUT; the worker waits for the
memory the dead engine held and relaunches the configuration that was serving, in place, while
new jobs wait for it. A platform restart of the whole container would take longer and, on a
GPU, meet the memory the old engine has not released yet. Restarts are bounded: a
configuration that keeps killing its engine ends in an answer naming the cause.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, cast

from vllm_worker import args_builder, capacity, gpu_memory, handler, model_cache, recovery, runpod_glue, startup_errors
from vllm_worker import settings as settings_mod
from vllm_worker.engine import Engine, command_problem, health_url

log = logging.getLogger("vllm_worker")


@dataclass
class StartupOutcome:
    """What startup produced: a ready engine, or the sentence every job is answered with."""

    engine: Engine | None = None
    fatal: str | None = None
    served_model_name: str = ""
    profile: dict[str, Any] | None = None
    launches: list[dict[str, Any]] = field(default_factory=list)
    capacity: str | None = None
    capacity_plan: dict[str, Any] = field(default_factory=dict)
    launch_env: dict[str, str] = field(default_factory=dict)  # the configuration that became ready
    model_cache: dict[str, str] | None = None  # the on-disk snapshot served, when one was
    warnings: list[str] = field(default_factory=list)  # the launch configuration's warnings, for the status job


class Supervisor:
    """Owns the engine across launches, so a signal at any moment can stop it."""

    def __init__(self, settings: settings_mod.Settings) -> None:
        self.settings = settings
        self.engine: Engine | None = None
        self._lock = threading.Lock()
        self._stopping = False

    def launch(self, argv: list[str], env: Mapping[str, str], log_argv: str) -> Engine:
        with self._lock:
            if self._stopping:
                raise SystemExit(143)
            self.engine = Engine(
                argv,
                env,
                host=self.settings.vllm_host,
                port=self.settings.vllm_port,
                tail_lines=self.settings.log_tail_lines,
                log_argv=log_argv,
            )
            self.engine.start()
            return self.engine

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            engine = self.engine
        if engine is not None:
            engine.stop(self.settings.stop_grace)

    @property
    def stopping(self) -> bool:
        return self._stopping


def _capacity_line(tail: str) -> str | None:
    for line in reversed(tail.splitlines()):
        if "Maximum concurrency for" in line or "KV cache size:" in line or "GPU KV cache size" in line:
            return line.split("] ", 1)[-1].strip()
    return None


def _startup_timeout_message(settings: settings_mod.Settings) -> str:
    return (
        f"vLLM did not become ready within VLLM_STARTUP_TIMEOUT={settings.startup_timeout:g} seconds "
        "and was stopped; if the model is large and still downloading, raise VLLM_STARTUP_TIMEOUT "
        "or bake the model into the image."
    )


def launch_failure(
    engine: Engine, launch_env: Mapping[str, str], settings: settings_mod.Settings, tried: Sequence[str] = (),
    weights_bytes: int | None = None,
) -> startup_errors.Diagnosis:
    """Why a launch ended before it was ready; always an answer, never an exit."""
    if engine.spawn_error is not None:
        return startup_errors.engine_command_failure(
            settings.vllm_command, engine.spawn_error, configured=bool(launch_env.get("VLLM_COMMAND"))
        )
    return startup_errors.explain(
        engine.tail(),
        launch_env.get("MODEL_NAME"),
        revision=launch_env.get("MODEL_REVISION"),
        exit_code=engine.returncode,
        env=launch_env,
        tried=tried,
        weights_bytes=weights_bytes,
    )


def start_engine(
    env: Mapping[str, str],
    settings: settings_mod.Settings,
    supervisor: Supervisor,
    wait_for_memory: Callable[[Mapping[str, str]], str | None] | None = None,
    startup_plan: capacity.StartupPlan | None = None,
    device_total_bytes: int | None = None,
) -> StartupOutcome:
    """Launch the engine, relaunching per the recovery ladder, until ready or out of options.

    A capacity plan that predicts the configuration cannot fit starts the first launch on
    the ladder profile it predicts will (`startup_plan.relaunch`), so the ladder's later
    steps stay available as the safety net.
    """
    outcome = StartupOutcome()
    attempts: list[recovery.Attempt] = []
    tried: list[str] = []
    launch_env: dict[str, str] = dict(env)
    pending: recovery.Relaunch | None = None
    if startup_plan is not None and startup_plan.relaunch is not None:
        pending = startup_plan.relaunch
        _apply(launch_env, pending.overrides)
    while True:
        try:
            built = args_builder.build_args(launch_env, settings)
        except args_builder.ArgsError as exc:
            outcome.fatal = str(exc)
            return outcome
        outcome.served_model_name = built.served_model_name
        for warning in built.warnings:
            log.warning(warning)
            if warning not in outcome.warnings:
                outcome.warnings.append(warning)
        unstartable = command_problem(built.argv, built.engine_env)
        if unstartable is not None:
            configured = bool(launch_env.get("VLLM_COMMAND"))
            outcome.fatal = startup_errors.engine_command_failure(settings.vllm_command, unstartable, configured).message
            return outcome
        if wait_for_memory is not None:
            problem = wait_for_memory(launch_env)
            if problem:
                outcome.fatal = problem
                return outcome
        masked = args_builder.mask(built.argv)
        log.info("launch %d: %s", len(attempts) + 1, masked)
        started = time.monotonic()
        engine = supervisor.launch(built.argv, built.engine_env, masked)
        state = engine.wait_ready(settings.startup_timeout)
        record: dict[str, Any] = {
            "launch": len(attempts) + 1,
            "profile": pending.profile if pending else "as configured",
            "overrides": dict(pending.overrides) if pending else {},
            "seconds": round(time.monotonic() - started, 1),
        }
        if state == "ready":
            record["outcome"] = "ready"
            outcome.launches.append(record)
            outcome.engine = engine
            outcome.launch_env = dict(launch_env)
            outcome.capacity = _capacity_line(engine.tail())
            if startup_plan is not None:
                outcome.capacity_plan = _capacity_status(startup_plan, launch_env, engine.tail(), settings)
            if pending is not None:
                outcome.profile = {
                    "name": pending.profile,
                    "reason": pending.reason,
                    "overrides": {k: v for k, v in pending.overrides.items()},
                    "tried": list(tried),
                }
            return outcome

        engine.stop(settings.stop_grace)
        if state == "timeout":
            record["outcome"] = "timeout"
            outcome.launches.append(record)
            outcome.fatal = _startup_timeout_message(settings)
            return outcome

        weights = startup_plan.predicted.weights_bytes if startup_plan and startup_plan.predicted else None
        diagnosis = launch_failure(engine, launch_env, settings, tried, weights)
        record["outcome"] = "failed"
        record["exit_code"] = engine.returncode
        record["cause"] = diagnosis.kind
        outcome.launches.append(record)
        attempts.append(recovery.Attempt(env=dict(launch_env), diagnosis=diagnosis))
        log.error("launch %d failed: %s", len(attempts), diagnosis.message)

        step = recovery.next_launch(env, attempts, settings.max_concurrency, device_total_bytes=device_total_bytes)
        if isinstance(step, recovery.Stop):
            outcome.fatal = diagnosis.message
            return outcome
        for warning in step.warnings:
            log.warning(warning)
        log.warning("relaunching (%s): %s", step.profile, step.reason)
        if step.wait_for_memory and wait_for_memory is None:
            tried.append("relaunched with the same settings, without waiting for memory (GPU_MEMORY_WAIT=false)")
        else:
            tried.append(step.tried_phrase)
        _apply(launch_env, step.overrides)
        pending = step if step.profile != "same" else pending


def _apply(launch_env: dict[str, str], overrides: Mapping[str, str | None]) -> None:
    """Env overrides of a ladder profile: a value sets the variable, None removes it."""
    for key, value in overrides.items():
        if value is None:
            launch_env.pop(key, None)
        else:
            launch_env[key] = value


def _capacity_status(
    startup_plan: capacity.StartupPlan, launch_env: Mapping[str, str], tail: str, settings: settings_mod.Settings
) -> dict[str, Any]:
    """Predicted against actual capacity, logged once and kept for the status job."""
    predicted = startup_plan.predict_for(launch_env)
    report = capacity.capacity_report(predicted, capacity.parse_engine_capacity(tail), settings.max_concurrency)
    log.info("%s", report.log_line)
    for warning in report.warnings:
        log.warning("%s", warning)
    return {**startup_plan.status_fields(), **report.status}


# --------------------------------------------------------------------------- serving: death and restart

HEALTH_POLL_S = 1.0
# Only a 503 means dead; a /health slower than this (a busy CPU engine) is just skipped.
HEALTH_TIMEOUT_S = 2.0
LOGGED_TAIL_LINES = 60
RESTARTING = "The worker is restarting the engine with the same settings; retry the request."

# Loopback checks must never go through an HTTP(S)_PROXY from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def health_status(url: str, timeout: float) -> int | None:
    """The status vLLM's /health answers with (200, or 503 once its engine core is dead); None if none."""
    try:
        with _OPENER.open(url, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        error.close()
        return int(error.code)
    except (urllib.error.URLError, OSError, ValueError):
        return None


def budget_sentence(message: str, deaths_in_window: int) -> str:
    """What every job is answered with once the engine died more often than the restart budget allows."""
    minutes = recovery.RESTART_WINDOW_S / 60
    return (
        f"{message} The engine has stopped {deaths_in_window} times within {minutes:g} minutes while serving, "
        f"more than the worker's budget of {recovery.restart_budget_phrase()}, so it is not restarted again; "
        f"after fixing the cause, or to try another machine, terminate this worker so the platform starts a fresh one."
    )


class EngineMonitor:
    """Watches the serving engine; when it dies, ends the running jobs and relaunches the same configuration.

    Runs in its own thread beside the runpod job loop and talks to the handler only through
    `WorkerState`: `record_death` (running jobs end, new ones wait), `mark_ready`, `fatal`, `status`.
    """

    def __init__(
        self,
        supervisor: Supervisor,
        settings: settings_mod.Settings,
        state: handler.WorkerState,
        launch_env: Mapping[str, str],
        launches: Sequence[dict[str, Any]],
        wait_for_memory: Callable[[Mapping[str, str]], str | None] | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.supervisor = supervisor
        self.settings = settings
        self.state = state
        self.launch_env = dict(launch_env)
        self.launches = [dict(record) for record in launches]
        self.wait_for_memory = wait_for_memory
        self.clock = clock
        self.restarts: list[float] = []
        self.causes: list[str] = list(state.status.get("causes", []))
        serving = self.launches[-1] if self.launches else {}
        self._profile = serving.get("profile", "as configured")
        self._overrides = dict(serving.get("overrides", {}))
        self.thread: threading.Thread | None = None

    def start(self, engine: Engine) -> threading.Thread:
        self._publish()
        self.thread = threading.Thread(target=self._run, args=(engine,), name="engine-monitor", daemon=True)
        self.thread.start()
        return self.thread

    def _run(self, engine: Engine) -> None:
        current: Engine | None = engine
        try:
            while current is not None:
                how = self._watch(current)
                if how is None:
                    return
                current = self._recover(current, how)
        except SystemExit:  # Supervisor.launch: the worker is shutting down
            return
        except Exception as error:
            log.exception("engine monitor failed")
            if not self.supervisor.stopping:
                self.state.fatal = (
                    f"The worker failed while supervising the engine ({type(error).__name__}: {error}); "
                    f"terminate this worker so the platform starts a fresh one."
                )
                self._publish()

    def _watch(self, engine: Engine) -> str | None:
        """Block until the engine dies ("exited", or "dead": alive with /health 503); None when stopped on purpose."""
        exited = threading.Event()
        engine.watch(lambda code: exited.set())
        url = health_url(engine.host, engine.port)
        while not self.supervisor.stopping:
            if exited.wait(HEALTH_POLL_S):
                return "exited"
            if self.supervisor.stopping or engine.stopping:
                return None
            if health_status(url, HEALTH_TIMEOUT_S) == 503 and engine.alive() and not self.supervisor.stopping:
                return "dead"
        return None

    def _recover(self, engine: Engine, how: str) -> Engine | None:
        code = engine.returncode if how == "exited" else None
        tail = engine.tail()
        diagnosis = startup_errors.runtime_failure(tail, self.launch_env, exit_code=code)
        now = self.clock()
        recent = [at for at in self.restarts if now - at < recovery.RESTART_WINDOW_S]
        allowed = recovery.restart_allowed(self.restarts, now)
        sentence = f"{diagnosis.message} {RESTARTING}" if allowed else budget_sentence(diagnosis.message, len(recent) + 1)
        log.error("the engine stopped while serving: %s", diagnosis.message)
        record = self.launches[-1] if self.launches else {}
        record.update(outcome="died", cause=diagnosis.kind, exit_code=code, message=diagnosis.message)
        self.causes.append(diagnosis.kind)
        if not allowed:
            self.state.fatal = sentence  # before the death: jobs waiting for readiness read it
        self.state.record_death(sentence)
        # A 503 engine still holds its connections and memory; a crashed one may have left processes behind.
        engine.stop(self.settings.stop_grace)
        if not allowed:
            self._give_up(sentence, tail)
            return None
        self.restarts.append(now)
        self._publish()
        return self._relaunch(diagnosis.kind)

    def _relaunch(self, after: str) -> Engine | None:
        while True:
            log.warning(
                "restarting the engine with the same configuration (restart %d; at most %s)",
                len(self.restarts),
                recovery.restart_budget_phrase(),
            )
            if self.wait_for_memory is not None:
                problem = self.wait_for_memory(self.launch_env)
                if problem:
                    self._give_up(problem, None)
                    return None
            built = args_builder.build_args(self.launch_env, self.settings)  # it built before, unchanged
            masked = args_builder.mask(built.argv)
            number = len(self.launches) + 1
            log.info("launch %d: %s", number, masked)
            started = self.clock()
            engine = self.supervisor.launch(built.argv, built.engine_env, masked)
            ready = engine.wait_ready(self.settings.startup_timeout)
            record: dict[str, Any] = {
                "launch": number,
                "profile": self._profile,
                "overrides": dict(self._overrides),
                "restart": len(self.restarts),
                "after": after,
                "seconds": round(self.clock() - started, 1),
            }
            self.launches.append(record)
            if ready == "ready":
                record["outcome"] = "ready"
                self._publish()
                self.state.mark_ready()
                log.info("engine ready again after restart %d; taking jobs", len(self.restarts))
                return engine
            if self.supervisor.stopping:
                return None
            tail = engine.tail()
            engine.stop(self.settings.stop_grace)
            if ready == "timeout":
                record["outcome"] = "timeout"
                kind, message = "timeout", _startup_timeout_message(self.settings)
            else:
                diagnosis = launch_failure(engine, self.launch_env, self.settings)
                kind, message = diagnosis.kind, diagnosis.message
                record.update(outcome="failed", exit_code=engine.returncode)
            record["cause"] = kind
            self.causes.append(kind)
            log.error("launch %d failed: %s", number, message)
            now = self.clock()
            if not recovery.restart_allowed(self.restarts, now):
                self._give_up(
                    f"The engine stopped while serving and could not be started again: {message}", tail
                )
                return None
            self.restarts.append(now)
            after = kind

    def _give_up(self, sentence: str, tail: str | None) -> None:
        self.state.fatal = sentence
        self._publish()
        if tail:
            lines = tail.splitlines()[-LOGGED_TAIL_LINES:]
            log.error("the engine's last %d lines of output:\n%s", len(lines), "\n".join(lines))
        log.error("%s Answering every job with this.", sentence)

    def _publish(self) -> None:
        # A new dict each time: the handler may be serialising the old one for a status job.
        status = dict(self.state.status)
        status["launches"] = [dict(record) for record in self.launches]
        status["restarts"] = len(self.restarts)
        status["causes"] = list(self.causes)
        status["fatal"] = self.state.fatal
        self.state.status = status


def _serve(state: handler.WorkerState, settings: settings_mod.Settings | None, supervisor: Supervisor | None) -> int:
    """Answer jobs: the SDK's job loop (or local API), or one local test job; returns the exit code."""
    import runpod

    handler.configure(state)
    try:
        job = runpod_glue.local_test_input(sys.argv[1:], os.environ, Path.cwd())
    except runpod_glue.LocalTestError as error:
        log.error("%s", error)
        return 2
    if job is not None:
        return runpod_glue.local_test(handler.handler, job, handler.close_session)
    local_api = any(arg.startswith("--rp_serve_api") for arg in sys.argv[1:]) or bool(os.environ.get("RUNPOD_REALTIME_PORT"))
    runpod_glue.patch_job_loop(supervisor.stop if supervisor is not None else None, handler.close_session, local_api)
    concurrency = settings.max_concurrency if settings else 1
    runpod.serverless.start(
        {
            "handler": handler.handler,
            "concurrency_modifier": lambda current: concurrency,
            "return_aggregate_stream": True,
        }
    )
    return 0


def run(env: Mapping[str, str] | None = None) -> int:
    """Start the worker; returns the process exit code."""
    env = dict(os.environ if env is None else env)
    _prepare_worker_process()
    # Importing the runpod SDK takes a while; do it while the worker starts and the engine boots.
    sdk_import = threading.Thread(target=importlib.import_module, args=("runpod",), daemon=True)
    sdk_import.start()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s vllm_worker: %(message)s", stream=sys.stdout)

    try:
        settings = settings_mod.load(env)
    except settings_mod.SettingsError as exc:
        log.error("%s Answering every job with this.", exc)
        sdk_import.join()
        return _serve(handler.WorkerState(fatal=str(exc)), None, None)

    supervisor = Supervisor(settings)
    owner = os.getpid()
    serving = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        if os.getpid() != owner:
            # A child forked by the SDK (its heartbeat) inherits this handler; the engine is not its to stop.
            os._exit(128 + signum)
        if serving.is_set():
            # The local API's uvicorn re-raises the signal it handled once it has shut down: a requested stop.
            log.info("signal %d: stopping the engine", signum)
            supervisor.stop()
            raise SystemExit(0)
        log.info("signal %d during startup: stopping the engine", signum)
        supervisor.stop()
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    try:
        try:
            outcome = _startup(env, settings, supervisor)
        except Exception as error:  # noqa: BLE001 - whatever broke, the jobs must say so rather than crash-loop
            log.exception("the worker failed while starting the engine")
            supervisor.stop()
            outcome = StartupOutcome(
                fatal=(
                    f"The worker failed while starting the engine ({type(error).__name__}: {error}); "
                    f"terminate this worker so the platform starts a fresh one, and please report this."
                )
            )
        state = handler.WorkerState(
            fatal=outcome.fatal,
            served_model_name=outcome.served_model_name,
            port=settings.vllm_port,
            max_concurrency=settings.max_concurrency,
            request_timeout=settings.request_timeout,
            ready_timeout=settings.ready_timeout,
            default_max_tokens=settings.default_max_tokens,
            profile=outcome.profile,
            status={
                "launches": outcome.launches,
                "profile": outcome.profile["name"] if outcome.profile else "as configured",
                "causes": [r["cause"] for r in outcome.launches if r.get("cause")],
                "capacity": outcome.capacity,
                "capacity_plan": outcome.capacity_plan,
                "restarts": 0,
                "fatal": outcome.fatal,
                "model_cache": outcome.model_cache,
                "warnings": outcome.warnings,
            },
        )
        if outcome.fatal:
            log.error("startup failed: %s Answering every job with this.", outcome.fatal)
        else:
            state.mark_ready()
            log.info("engine ready; taking jobs (up to %d at once)", settings.max_concurrency)
        if outcome.engine is not None and not outcome.fatal:
            EngineMonitor(
                supervisor, settings, state, outcome.launch_env, outcome.launches, memory_waiter(settings)
            ).start(outcome.engine)
        sdk_import.join()
        serving.set()
        return _serve(state, settings, supervisor)
    finally:
        supervisor.stop()


def _prepare_worker_process() -> None:
    """Process-wide settings of the worker itself (not the engine's environment), before imports.

    - The runpod SDK reads its log level at import and defaults to DEBUG, which would log every
      job's output, users' completions included.
    - huggingface_hub's user-agent telemetry fetches a registry from the Hub before the first
      call, one more round trip (up to 3 s against a hanging Hub) in front of the pre-flight.
    - The SDK's debugger module asks py-cpuinfo for the CPU's name at import, which spawns a
      Python subprocess and costs about a second of every cold start for a debug string.
    """
    if not os.environ.get("RUNPOD_LOG_LEVEL") and not os.environ.get("RUNPOD_DEBUG_LEVEL"):
        os.environ["RUNPOD_LOG_LEVEL"] = "INFO"
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    try:
        import cpuinfo
    except ImportError:
        return
    cpuinfo.get_cpu_info = _cpu_brand


def _cpu_brand() -> dict[str, str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return {"brand_raw": line.split(":", 1)[1].strip()}
    except OSError:
        pass
    return {"brand_raw": "unknown"}


def _startup(env: dict[str, str], settings: settings_mod.Settings, supervisor: Supervisor) -> StartupOutcome:
    from vllm_worker import preflight

    # Every flag value the table can judge is answered now, before any Hub call or launch.
    try:
        args_builder.build_args(env, settings)
    except args_builder.ArgsError as exc:
        return StartupOutcome(fatal=str(exc))
    cached = model_cache.lookup(env)
    facts: capacity.ModelFacts | None = None
    if cached is not None:
        log.info("%s", cached.log_line())
        env = model_cache.offline_env(env, cached)
        try:
            facts = capacity.facts_from_folder(cached.snapshot)
        except capacity.CapacityError as error:
            log.info("capacity plan: the cached snapshot's config could not be read (%s)", error)
    # The safetensors counts ride on the one metadata call, for the capacity plan.
    result = preflight.run(env, expand=["safetensors"])  # it logs its own transient warnings
    if result.skipped_reason:
        log.info("pre-flight skipped: %s", result.skipped_reason)
    if not result.ok:
        log.error("pre-flight: %s", result.message)
        return StartupOutcome(fatal=result.message, model_cache=cached.status() if cached else None)

    devices = gpu_memory.probe(env, cast(gpu_memory.Platform, settings.engine_device))
    on_cpu = bool(devices) and devices[0].kind == "cpu"
    total = min(d.total for d in devices) if devices and not on_cpu else None
    plan = capacity.startup_plan(
        env,
        total,
        settings.max_concurrency,
        device_name=devices[0].name if devices else None,
        platform="cpu" if on_cpu else "cuda",
        safetensors_parameters=result.model_info_summary.safetensors_parameters if result.model_info_summary else None,
        facts=facts,
    )
    log.info("%s", plan.log_line)
    for warning in plan.warnings:
        log.warning("%s", warning)
    if plan.fatal_message:
        return StartupOutcome(fatal=plan.fatal_message, model_cache=cached.status() if cached else None)

    waiter = memory_waiter(settings)
    if waiter is None:
        log.info("GPU_MEMORY_WAIT=false: every launch starts without waiting for memory")
    outcome = start_engine(env, settings, supervisor, waiter, plan, total)
    outcome.model_cache = cached.status() if cached else None
    return outcome


def memory_waiter(settings: settings_mod.Settings) -> Callable[[Mapping[str, str]], str | None] | None:
    """What runs before every launch: wait for the memory vLLM checks; None when GPU_MEMORY_WAIT is off."""
    if not settings.gpu_memory_wait:
        return None
    platform = cast(gpu_memory.Platform, settings.engine_device)

    def wait_for_memory(launch_env: Mapping[str, str]) -> str | None:
        waited = gpu_memory.wait_for_memory(
            launch_env,
            timeout=settings.gpu_memory_wait_timeout,
            platform=platform,
            log=lambda line: log.info("%s", line),
        )
        return None if waited.ok else waited.message

    return wait_for_memory


def cli(argv: Sequence[str] | None = None) -> int:
    """`vllm-worker [run] [runpod flags...]`; `python -m vllm_worker` is the same."""
    args = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="vllm-worker",
        description="Runpod Serverless worker that serves a Hugging Face model through `vllm serve`.",
        epilog="Configure with environment variables (MODEL_NAME, MAX_MODEL_LEN, ...); see the README.",
    )
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("run", help="start the worker (default); runpod flags such as --rp_serve_api pass through")
    sub.add_parser("plan", help="predict whether a model fits a GPU, before any download (`vllm-worker plan --help`)", add_help=False)
    if not args or args[0].startswith("--rp_") or args[0].startswith("--test_input"):
        args = ["run", *args]
    if args[0] == "plan":
        return capacity.plan_cli(args[1:])
    known, rest = parser.parse_known_args(args)
    if known.command == "run":
        # The runpod SDK reads its own flags from sys.argv.
        sys.argv = [sys.argv[0], *rest]
        return run()
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(cli())
