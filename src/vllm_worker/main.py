"""Entry point: pre-flight, launch `vllm serve` with a bounded relaunch ladder, then serve jobs.

Whatever happens at startup, the worker ends up in Runpod's job loop: either with a
ready engine, or with one sentence that every job is answered with. A container that
exits on a configuration error is restarted by the platform into the same error, which
is a crash loop the user cannot see; an answered job is something they can read.
The one exception is a failure nobody could classify: there a restart of the host may
help, so the worker exits non-zero and lets the platform try again.
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
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from vllm_worker import args_builder, gpu_memory, handler, recovery, startup_errors
from vllm_worker import settings as settings_mod
from vllm_worker.engine import Engine

log = logging.getLogger("vllm_worker")


@dataclass
class StartupOutcome:
    """What startup produced: a ready engine, or the sentence every job is answered with."""

    engine: Engine | None = None
    fatal: str | None = None
    exit_code: int | None = None  # set when the worker should exit instead of serving
    served_model_name: str = ""
    profile: dict[str, Any] | None = None
    launches: list[dict[str, Any]] = field(default_factory=list)
    capacity: str | None = None


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


def _capacity_line(tail: str) -> str | None:
    for line in reversed(tail.splitlines()):
        if "Maximum concurrency for" in line or "KV cache size:" in line or "GPU KV cache size" in line:
            return line.split("] ", 1)[-1].strip()
    return None


def _unclassified_message(exit_code: int | None, tail: str) -> str:
    last = [line for line in tail.splitlines() if line.strip()][-5:]
    return (
        f"vLLM exited with code {exit_code} before it was ready, for a reason the worker does not recognise; "
        f"its last lines were: {' | '.join(last) if last else '(no output)'}"
    )


def start_engine(
    env: Mapping[str, str],
    settings: settings_mod.Settings,
    supervisor: Supervisor,
    wait_for_memory: Callable[[Mapping[str, str]], str | None] | None = None,
) -> StartupOutcome:
    """Launch the engine, relaunching per the recovery ladder, until ready or out of options."""
    outcome = StartupOutcome()
    attempts: list[recovery.Attempt] = []
    tried: list[str] = []
    launch_env: dict[str, str] = dict(env)
    pending: recovery.Relaunch | None = None
    while True:
        try:
            built = args_builder.build_args(launch_env, settings)
        except args_builder.ArgsError as exc:
            outcome.fatal = str(exc)
            return outcome
        outcome.served_model_name = built.served_model_name
        for warning in built.warnings:
            log.warning(warning)
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
            outcome.capacity = _capacity_line(engine.tail())
            if pending is not None:
                outcome.profile = {
                    "name": pending.profile,
                    "reason": pending.reason,
                    "overrides": {k: v for k, v in pending.overrides.items()},
                    "tried": list(tried),
                }
            return outcome

        tail = engine.tail()
        engine.stop(settings.stop_grace)
        if state == "timeout":
            record["outcome"] = "timeout"
            outcome.launches.append(record)
            outcome.fatal = (
                f"vLLM did not become ready within VLLM_STARTUP_TIMEOUT={settings.startup_timeout:g} seconds "
                "and was stopped; if the model is large and still downloading, raise VLLM_STARTUP_TIMEOUT "
                "or bake the model into the image."
            )
            return outcome

        diagnosis = startup_errors.diagnose(
            tail,
            launch_env.get("MODEL_NAME"),
            revision=launch_env.get("MODEL_REVISION"),
            exit_code=engine.returncode,
            env=launch_env,
            tried=tried,
        )
        record["outcome"] = "failed"
        record["exit_code"] = engine.returncode
        record["cause"] = diagnosis.kind if diagnosis else None
        outcome.launches.append(record)
        attempts.append(recovery.Attempt(env=dict(launch_env), diagnosis=diagnosis))
        if diagnosis is None:
            log.error(_unclassified_message(engine.returncode, tail))
            outcome.fatal = _unclassified_message(engine.returncode, tail)
            outcome.exit_code = 1
            return outcome
        log.error("launch %d failed: %s", len(attempts), diagnosis.message)

        step = recovery.next_launch(env, attempts, settings.max_concurrency)
        if isinstance(step, recovery.Stop):
            outcome.fatal = diagnosis.message
            return outcome
        for warning in step.warnings:
            log.warning(warning)
        log.warning("relaunching (%s): %s", step.profile, step.reason)
        tried.append(step.tried_phrase)
        for key, value in step.overrides.items():
            if value is None:
                launch_env.pop(key, None)
            else:
                launch_env[key] = value
        pending = step if step.profile != "same" else pending


def _serve(state: handler.WorkerState, settings: settings_mod.Settings | None, supervisor: Supervisor | None) -> None:
    import runpod
    from runpod.serverless.modules import rp_scale

    handler.configure(state)
    if supervisor is not None:
        original = rp_scale.JobScaler.handle_shutdown

        def handle_shutdown(self: Any, signum: int, frame: Any) -> None:
            # Stop the engine at once, in a thread so the job loop can wind down meanwhile.
            threading.Thread(target=supervisor.stop, name="engine-stop").start()
            original(self, signum, frame)

        rp_scale.JobScaler.handle_shutdown = handle_shutdown  # type: ignore[method-assign]

    concurrency = settings.max_concurrency if settings else 1
    runpod.serverless.start(
        {
            "handler": handler.handler,
            "concurrency_modifier": lambda current: concurrency,
            "return_aggregate_stream": True,
        }
    )


def run(env: Mapping[str, str] | None = None) -> int:
    """Start the worker; returns the process exit code."""
    env = dict(os.environ if env is None else env)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s vllm_worker: %(message)s", stream=sys.stdout)

    try:
        settings = settings_mod.load(env)
    except settings_mod.SettingsError as exc:
        log.error("%s Answering every job with this.", exc)
        _serve(handler.WorkerState(fatal=str(exc)), None, None)
        return 0

    supervisor = Supervisor(settings)
    # Importing the runpod SDK takes over a second; do it while the engine boots, not after.
    sdk_import = threading.Thread(target=importlib.import_module, args=("runpod",), daemon=True)
    sdk_import.start()

    def on_signal(signum: int, frame: Any) -> None:
        log.info("signal %d during startup: stopping the engine", signum)
        supervisor.stop()
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    try:
        outcome = _startup(env, settings, supervisor)
        if outcome.exit_code is not None:
            return outcome.exit_code
        state = handler.WorkerState(
            fatal=outcome.fatal,
            served_model_name=outcome.served_model_name,
            port=settings.vllm_port,
            max_concurrency=settings.max_concurrency,
            request_timeout=settings.request_timeout,
            ready_timeout=settings.ready_timeout,
            profile=outcome.profile,
            status={
                "launches": outcome.launches,
                "profile": outcome.profile["name"] if outcome.profile else "as configured",
                "causes": [r["cause"] for r in outcome.launches if r.get("cause")],
                "capacity": outcome.capacity,
                "fatal": outcome.fatal,
            },
        )
        if outcome.fatal:
            log.error("startup failed: %s Answering every job with this.", outcome.fatal)
        else:
            state.mark_ready()
            log.info("engine ready; taking jobs (up to %d at once)", settings.max_concurrency)
        sdk_import.join()
        _serve(state, settings, supervisor)
        return 0
    finally:
        supervisor.stop()


def _startup(env: dict[str, str], settings: settings_mod.Settings, supervisor: Supervisor) -> StartupOutcome:
    from vllm_worker import preflight

    result = preflight.run(env)  # it logs its own transient warnings
    if result.skipped_reason:
        log.info("pre-flight skipped: %s", result.skipped_reason)
    if not result.ok:
        log.error("pre-flight: %s", result.message)
        return StartupOutcome(fatal=result.message)

    def wait_for_memory(launch_env: Mapping[str, str]) -> str | None:
        waited = gpu_memory.wait_for_memory(
            launch_env, timeout=settings.gpu_memory_wait_timeout, log=lambda line: log.info("%s", line)
        )
        return None if waited.ok else waited.message

    return start_engine(env, settings, supervisor, wait_for_memory)


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
    if not args or args[0].startswith("--rp_") or args[0].startswith("--test_input"):
        args = ["run", *args]
    known, rest = parser.parse_known_args(args)
    if known.command == "run":
        # The runpod SDK reads its own flags from sys.argv.
        sys.argv = [sys.argv[0], *rest]
        return run()
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(cli())
