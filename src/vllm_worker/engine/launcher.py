"""One launch attempt of the engine, used for startup and for every restart alike.

A launch is always the same steps: build the argv from the launch configuration, check the
engine command can start, wait until the memory vLLM checks at startup is free, start
`vllm serve` in its own process group, wait for /health or the process's end, and on a
failure stop it and diagnose its output. `Launcher.attempt` does exactly that and returns
what happened with the record the status job shows. `start_engine` walks the startup
ladder with it; `monitor.EngineMonitor` restarts a dead or hung engine with it, so a
restart after an out-of-memory death walks the same ladder.

`Supervisor` owns the engine across launches (as TGI's launcher owns its shards), so a
signal at any moment can stop whatever is running.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, Sequence

from vllm_worker.config import args_builder, command, secrets
from vllm_worker.config import settings as settings_mod
from vllm_worker.config.profile import LaunchProfile
from vllm_worker.diagnosis import startup_errors
from vllm_worker.diagnosis.verdict import Diagnosis, Failure, Tried
from vllm_worker.engine import compile_cache, ladder, warmup
from vllm_worker.engine.download_progress import DownloadPlan
from vllm_worker.engine.process import Engine, command_problem
from vllm_worker.engine.start_watch import StartWatch
from vllm_worker.engine.startup_phases import PhaseClock, phases_line

log = logging.getLogger("vllm_worker")

MemoryWait = Callable[[LaunchProfile], "str | None"]


class WorkerStopping(Exception):
    """A launch was asked for after the worker began to stop."""


class Supervisor:
    """Owns the engine across launches, so a signal at any moment can stop it."""

    def __init__(self, settings: settings_mod.Settings) -> None:
        self.settings = settings
        self.engine: Engine | None = None
        self._lock = threading.Lock()
        self._stopping = False

    def launch(
        self, argv: list[str], env: Mapping[str, str], log_argv: str, on_line: Callable[[str], None] | None = None
    ) -> Engine:
        with self._lock:
            if self._stopping:
                raise WorkerStopping("the worker is stopping; no engine is launched")
            self.engine = Engine(
                argv,
                env,
                host=self.settings.vllm_host,
                port=self.settings.vllm_port,
                tail_lines=self.settings.log_tail_lines,
                on_line=on_line,
                log_argv=log_argv,
            )
            self.engine.start()
            return self.engine

    def stop(self, grace: float | None = None) -> None:
        """Stop the engine, whatever its state (starting, serving, stopped by a signal, ignoring SIGTERM),
        SIGKILLing it after VLLM_STOP_GRACE or `grace`, whichever is shorter (a platform stop's window)."""
        with self._lock:
            self._stopping = True
            engine = self.engine
        if engine is not None:
            engine.stop(self.settings.stop_grace if grace is None else min(grace, self.settings.stop_grace))

    @property
    def stopping(self) -> bool:
        return self._stopping


def startup_timeout_message(settings: settings_mod.Settings, waited: float | None = None) -> str:
    """`waited`: the wait the start's forecast raised VLLM_STARTUP_TIMEOUT's default to, where it did."""
    within = f"VLLM_STARTUP_TIMEOUT={settings.startup_timeout:g} seconds"
    if waited is not None and waited > settings.startup_timeout:
        within = f"{waited:g} seconds (twice the start's forecast; VLLM_STARTUP_TIMEOUT is {settings.startup_timeout:g})"
    return (
        f"vLLM did not become ready within {within} and was stopped; if the model is large and still downloading, "
        "raise VLLM_STARTUP_TIMEOUT or bake the model into the image."
    )


def launch_failure(
    engine: Engine,
    profile: LaunchProfile,
    settings: settings_mod.Settings,
    tried: Sequence[Tried] = (),
    weights_bytes: int | None = None,
) -> Diagnosis:
    """Why a launch ended before it was ready; always an answer, never an exit."""
    if engine.spawn_error is not None:
        return startup_errors.engine_command_failure(settings.vllm_command, engine.spawn_error, settings.vllm_command_set)
    return startup_errors.explain(
        Failure(engine.tail(), profile, engine.returncode, tuple(tried), weights_bytes, revision=profile.revision)
    )


@dataclass
class Attempt:
    """What one launch came to.

    outcome: "ready" (engine serving), "failed" (diagnosis says why), "timeout", "fatal" (the
    launch could not even start: message says why), or "stopped" (the worker is shutting down).
    """

    outcome: Literal["ready", "failed", "timeout", "fatal", "stopped"]
    record: dict[str, Any]
    engine: Engine | None = None
    diagnosis: Diagnosis | None = None
    message: str | None = None
    served_model_name: str = ""
    warnings: list[str] = field(default_factory=list)


class Launcher:
    """Performs launch attempts; the only place an engine is started."""

    def __init__(
        self,
        settings: settings_mod.Settings,
        supervisor: Supervisor,
        wait_for_memory: MemoryWait | None,
        weights_bytes: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        caches: compile_cache.CacheSetup | None = None,
        download: DownloadPlan | None = None,
        worker_phases: Mapping[str, float] | None = None,
        start: StartWatch | None = None,
    ) -> None:
        self.settings = settings
        self.supervisor = supervisor
        self.wait_for_memory = wait_for_memory
        self.weights_bytes = weights_bytes
        self.clock = clock
        self.count = 0
        self.caches = caches or compile_cache.CacheSetup()
        self.download = download  # None: nothing to download (cached, baked, local, offline)
        self.download_status: dict[str, Any] | None = None  # the last progress reading, for the status job
        self.worker_phases = dict(worker_phases or {})  # settings, pre-flight, plan: shown with launch 1
        self.start = start  # the start's forecast (None: none was made): the waits follow it

    def attempt(self, profile: LaunchProfile, record: dict[str, Any] | None = None, tried: Sequence[Tried] = ()) -> Attempt:
        """Launch `profile` once; the launch record (profile, overrides, `record`'s extras) comes back with it."""
        self.count += 1
        record = {"launch": self.count, "profile": profile.name, "overrides": dict(profile.overrides), **(record or {})}
        try:
            built = command.build_args(profile, self.settings, self.caches.env)
        except args_builder.ArgsError as exc:
            return Attempt("fatal", record, message=str(exc))
        for warning in built.warnings:
            log.warning(warning)
        unstartable = command_problem(built.argv, built.engine_env)
        if unstartable is not None:
            message = startup_errors.engine_command_failure(
                self.settings.vllm_command, unstartable, self.settings.vllm_command_set
            ).message
            return Attempt("fatal", record, message=message, served_model_name=built.served_model_name)
        phases: dict[str, float] = {}
        if self.wait_for_memory is not None:
            waiting = self.clock()
            problem = self.wait_for_memory(profile)
            phases["memory_wait"] = round(self.clock() - waiting, 2)
            if problem:
                record["cause"] = "memory_held"
                return Attempt("fatal", record, message=problem, served_model_name=built.served_model_name)
        masked = secrets.mask(built.argv)
        log.info("launch %d: %s", self.count, masked)
        started = self.clock()
        phase_clock = PhaseClock()
        watch = None
        if self.download is not None:
            # Only the first launch's download is the start's: a relaunch finds the weights on disk.
            on_rate = self.start.on_rate if self.start is not None and self.count == 1 else None
            watch = self.download.watch(on_rate=on_rate)

        def on_line(line: str) -> None:
            phase_clock.feed(self.clock() - started, line)
            if watch is not None:
                watch.on_line(line)

        engine_env = self.start.engine_env(built.engine_env) if self.start is not None else built.engine_env
        engine = self.supervisor.launch(built.argv, engine_env, masked, on_line)
        if watch is not None:
            watch.start()
        waited = self.start.startup_timeout(self.settings) if self.start is not None else self.settings.startup_timeout
        try:
            state = engine.wait_ready(waited)
        finally:
            if watch is not None:
                watch.stop()
                self.download_status = watch.status() or self.download_status
        record["seconds"] = round(self.clock() - started, 1)
        phases.update(phase_clock.phases(record["seconds"] if state == "ready" else None))
        record["phases"] = phases
        record["compile_caches"] = phase_clock.cache
        result = Attempt("ready", record, served_model_name=built.served_model_name, warnings=list(built.warnings))
        if state == "ready":
            result.engine = engine
            self._ready(engine, built, record, phases, phase_clock)
            return result
        if self.supervisor.stopping:
            record["outcome"] = result.outcome = "stopped"
            return result
        engine.stop(self.settings.stop_grace)
        if state == "timeout":
            record["outcome"] = result.outcome = "timeout"
            result.message = startup_timeout_message(self.settings, waited)
            return result
        result.diagnosis = launch_failure(engine, profile, self.settings, tried, self.weights_bytes)
        record.update(outcome="failed", exit_code=engine.returncode, cause=result.diagnosis.kind)
        result.outcome = "failed"
        return result


    def _ready(
        self, engine: Engine, built: command.BuiltArgs, record: dict[str, Any], phases: dict[str, float], clock: PhaseClock
    ) -> None:
        """A ready launch: its phases said, the engine's warm-up paid by the worker, the caches marked warm, and
        the start's first ready launch set against its forecast and recorded."""
        record["outcome"] = "ready"
        worker = self.worker_phases if self.count == 1 else {}
        cache: str | None = clock.cache
        if cache is not None and clock.corrupt_entry is not None:
            cache += f" (vLLM could not read {clock.corrupt_entry} and compiled it again)"
        log.info("%s", phases_line(self.count, {**worker, **phases}, phases, cache))
        warmed = warmup.warm_up(engine.host, engine.port, built.served_model_name)
        record["warmup_seconds"] = round(warmed.seconds, 2)
        log.info("%s", warmed.line())
        compile_cache.record_ready(self.caches, built.argv, clock.cache)
        if self.start is not None and self.start.actual is None:
            compile_cache.record_start(self.caches, built.argv, self.start.at_ready(record["seconds"], phases, clock.downloaded_at))


@dataclass
class StartupOutcome:
    """What startup produced: a ready engine, or the sentence every job is answered with."""

    engine: Engine | None = None
    fatal: str | None = None
    served_model_name: str = ""
    profile: dict[str, Any] | None = None
    launches: list[dict[str, Any]] = field(default_factory=list)
    capacity: str | None = None  # the engine's capacity line, from the capacity report (main)
    capacity_plan: dict[str, Any] = field(default_factory=dict)  # predicted against actual, the same
    launch_env: dict[str, str] = field(default_factory=dict)  # the configuration that became ready
    model_cache: dict[str, str] | None = None  # the on-disk snapshot served, when one was
    warnings: list[str] = field(default_factory=list)  # the launch configuration's warnings, for the status job
    base_env: dict[str, str] = field(default_factory=dict)  # the user's configuration, before any ladder step
    launcher: Launcher | None = None  # what made the launches; restarts go on through it
    climb: ladder.Ladder | None = None  # where the ladder stands; an out-of-memory death goes on from there
    device_total_bytes: int | None = None
    cause: str | None = None  # the failure's kind when `fatal` came from one (a diagnosis, the memory wait)


def start_engine(
    base: LaunchProfile,
    settings: settings_mod.Settings,
    supervisor: Supervisor,
    wait_for_memory: MemoryWait | None = None,
    first_steps: Sequence[ladder.Relaunch] = (),
    device_total_bytes: int | None = None,
    launcher: Launcher | None = None,
) -> StartupOutcome:
    """Launch the engine, relaunching per the recovery ladder, until ready or out of options.

    A capacity plan that predicts the configuration cannot fit starts the first launch on the
    ladder profile it predicts will (`first_steps`, the plan's `StartupPlan.first_steps`): those
    steps are taken like any other, so the ladder goes on from there and never takes them again.
    The engine's capacity figures against the plan are the capacity report's, which `main` asks
    for once the engine is ready (`capacity.ready_engine_report`).
    """
    if launcher is None:
        launcher = Launcher(settings, supervisor, wait_for_memory)
    climb = ladder.Ladder(base, device_total_bytes=device_total_bytes, memory_wait=wait_for_memory is not None)
    outcome = StartupOutcome(
        base_env=dict(base.env), launcher=launcher, device_total_bytes=device_total_bytes, climb=climb
    )
    profile = climb.start_on(first_steps)
    while True:
        result = launcher.attempt(profile, tried=climb.tried)
        outcome.served_model_name = result.served_model_name or outcome.served_model_name
        outcome.warnings += [w for w in result.warnings if w not in outcome.warnings]
        if result.outcome == "fatal":
            outcome.fatal = result.message
            outcome.cause = result.record.get("cause")
            return outcome
        outcome.launches.append(result.record)
        if result.outcome == "ready":
            assert result.engine is not None
            outcome.engine = result.engine
            outcome.launch_env = dict(profile.env)
            outcome.profile = climb.notice()
            return outcome
        if result.outcome in ("timeout", "stopped"):
            outcome.fatal = result.message or "The worker is shutting down."
            return outcome
        diagnosis = result.diagnosis
        assert diagnosis is not None
        log.error("launch %d failed: %s", result.record["launch"], diagnosis.message)
        step = climb.after_failure(profile, diagnosis)
        if isinstance(step, ladder.Stop):
            outcome.fatal = diagnosis.message
            outcome.cause = diagnosis.kind
            return outcome
        for warning in step.warnings:
            log.warning(warning)
        log.warning("relaunching (%s): %s", step.profile, step.reason)
        profile = climb.profile

