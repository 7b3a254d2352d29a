"""Entry point: pre-flight, launch `vllm serve` with a bounded relaunch ladder, then serve jobs.

Whatever happens at startup, the worker ends up in Runpod's job loop: either with a
ready engine, or with one sentence that every job is answered with. A container that
exits on a startup failure is restarted by the platform into the same failure, which
is a crash loop the user cannot see; an answered job is something they can read. That
holds for failures no rule knows too: they are answered with vLLM's own root error, and
a fault that may be the host's gets one relaunch, then the answer says how to get a
fresh machine.

The steps live in folders named for the questions of a start: `config` (what was asked for),
`model` (is the model there), `capacity` (does it fit), `engine` (one launch path, the ladder,
the monitor), `diagnosis` (why a start failed), `serving` (the jobs, and every contact with the
runpod SDK). docs/architecture.md draws the path.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence, cast

from vllm_worker import capacity
from vllm_worker.config import args_builder, command
from vllm_worker.config import settings as settings_mod
from vllm_worker.config.profile import DEFAULT_MAX_CONCURRENCY, LaunchProfile
from vllm_worker.engine import compile_cache, gpu_memory, machine_checks, start_forecast
from vllm_worker.engine.download_progress import DownloadPlan, bytes_on_disk, expected_bytes, repo_folder
from vllm_worker.engine.launcher import Launcher, MemoryWait, StartupOutcome, Supervisor, start_engine
from vllm_worker.engine.monitor import EngineMonitor, verdict_within
from vllm_worker.engine.start_watch import StartWatch
from vllm_worker.model import cache as model_cache
from vllm_worker.model import hub_rate
from vllm_worker.serving import engine_load, fresh_machine, handler, intake, platform
from vllm_worker.serving.state import WorkerState

if TYPE_CHECKING:
    from vllm_worker.model.preflight import ModelSummary

log = logging.getLogger("vllm_worker")


def run(env: Mapping[str, str] | None = None) -> int:
    """Start the worker; returns the process exit code."""
    env = dict(os.environ if env is None else env)
    _prepare_worker_process()
    # Importing the runpod SDK takes a while; do it while the worker starts and the engine boots.
    sdk_import = threading.Thread(target=importlib.import_module, args=("runpod",), daemon=True)
    sdk_import.start()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s vllm_worker: %(message)s", stream=sys.stdout)

    began = time.monotonic()
    try:
        settings = settings_mod.load(env)
    except settings_mod.SettingsError as exc:
        log.error("%s Answering every job with this.", exc)
        sdk_import.join()
        shutdown = platform.Shutdown()
        shutdown.install()
        return _serve(WorkerState(fatal=str(exc)), 1, shutdown, 0.0)

    supervisor = Supervisor(settings)
    shutdown = platform.Shutdown(supervisor.stop)
    shutdown.install()
    try:
        return _start_and_serve(env, settings, supervisor, shutdown, sdk_import, began)
    except platform.Stopped as stopped:
        return stopped.code
    finally:
        supervisor.stop(shutdown.engine_grace())  # after a platform stop, within what is left of its window
        since = shutdown.since_signal()
        if since is not None:
            # The stop's last line: how much of the platform's window the worker used (SIGKILL at KILL_AFTER_S).
            log.info("engine stopped; the worker exits %.1f s after the platform's signal", since)


def _start_and_serve(
    env: dict[str, str],
    settings: settings_mod.Settings,
    supervisor: Supervisor,
    shutdown: platform.Shutdown,
    sdk_import: threading.Thread,
    began: float,
) -> int:
    """Start the engine (or learn why it cannot start), then answer jobs until the platform stops the worker."""
    most = DEFAULT_MAX_CONCURRENCY  # MAX_CONCURRENCY, read with the launch configuration (a refused value: the default)
    try:
        profile = LaunchProfile.parse(env)
        most = profile.max_concurrency
        outcome = _startup(env, profile, settings, supervisor, {"settings": round(time.monotonic() - began, 2)}, began)
    except Exception as error:  # noqa: BLE001 - whatever broke, the jobs must say so rather than crash-loop
        log.exception("the worker failed while starting the engine")
        supervisor.stop()
        outcome = StartupOutcome(
            fatal=(
                f"The worker failed while starting the engine ({type(error).__name__}: {error}); "
                f"terminate this worker so the platform starts a fresh one, and please report this."
            )
        )

    def fresh_worker(sentence: str, kind: str | None) -> str:
        """The answer to a failure; where another machine is the fix, the platform is asked for one."""
        return fresh_machine.answer(
            sentence, kind, settings.refresh_limit, settings.base_path, platform.ask_for_fresh_worker
        ).sentence

    if outcome.fatal:
        outcome.fatal = fresh_worker(outcome.fatal, outcome.cause)
    state = WorkerState(
        fatal=outcome.fatal,
        served_model_name=outcome.served_model_name,
        port=settings.vllm_port,
        max_concurrency=most,
        request_timeout=settings.request_timeout,
        ready_timeout=settings.ready_timeout,
        verdict_within=verdict_within(settings.hang_timeout),
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
            **_start_fields(outcome),
        },
    )
    if outcome.fatal:
        log.error("startup failed: %s Answering every job with this.", outcome.fatal)
    else:
        state.mark_ready()
        log.info("engine ready; taking jobs (up to %d at once)", most)
    if outcome.engine is not None and not outcome.fatal and outcome.climb is not None:
        climb, plan = outcome.climb, outcome.capacity_plan
        gate = intake.Intake(
            lambda: intake.bounds_from(plan, most, climb.profile.known_max_num_seqs(), settings.intake_buffer),
            settings.adaptive_concurrency,
        )
        state.load_watch = engine_load.LoadWatch(
            settings.vllm_host, settings.vllm_port, lambda: climb.profile, most, intake=gate
        ).start()
        EngineMonitor(
            supervisor,
            settings,
            state,
            climb,
            outcome.launches,
            memory_waiter(settings),
            launcher=outcome.launcher,
            fresh_machine=fresh_worker,
        ).start(outcome.engine)
    sdk_import.join()
    return _serve(state, most, shutdown, settings.drain_timeout)


def _serve(state: WorkerState, concurrency: int, shutdown: platform.Shutdown, drain_timeout: float) -> int:
    handler.configure(state)
    gate = state.load_watch.intake if state.load_watch is not None else None
    return platform.serve(handler.handler, handler.close_session, concurrency, shutdown, state, drain_timeout, gate)


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


def _start_fields(outcome: StartupOutcome) -> dict[str, Any]:
    """The status job's view of where the start's time went: the worker's steps, the compile caches
    (where, expected, found by the ready launch), the download's last reading."""
    launcher = outcome.launcher
    if launcher is None:
        return {}
    ready: dict[str, Any] = next((r for r in reversed(outcome.launches) if r.get("outcome") == "ready"), {})
    return {
        "worker_phases": dict(launcher.worker_phases),
        "compile_caches": {**launcher.caches.status(), "found": ready.get("compile_caches")},
        "download": launcher.download_status,
        "start_forecast": launcher.start.status() if launcher.start is not None else None,
    }


def _startup(
    env: dict[str, str],
    profile: LaunchProfile,
    settings: settings_mod.Settings,
    supervisor: Supervisor,
    phases: dict[str, float],
    began: float,
) -> StartupOutcome:
    """Settings and the launch configuration (`profile`, of `env`) are read; now its flags, where the model is,
    whether it fits."""
    from vllm_worker.model import preflight

    # Every flag value the table can judge is answered now, before any Hub call or launch.
    try:
        built = command.build_args(profile, settings)
    except args_builder.ArgsError as exc:
        return StartupOutcome(fatal=str(exc))
    # The machine's memory and GPUs, while they are still the machine's (the SDK's checks never run).
    needed = profile.data_parallel_size * profile.tensor_parallel_size * profile.pipeline_parallel_size
    checks = machine_checks.before_preflight(env, needed, settings.engine_device)
    failed = _report_checks(checks)
    if failed is not None:
        return failed
    cached = model_cache.lookup(profile)
    volume, caches = _volume_and_caches(env, settings, built.argv, cached)
    step = time.monotonic()
    facts: capacity.ModelFacts | None = None
    if cached is not None:
        log.info("%s", cached.log_line())
        profile = LaunchProfile.parse(model_cache.offline_env(env, cached))
        try:
            facts = capacity.facts_from_folder(cached.snapshot)
        except capacity.CapacityError as error:
            log.info("capacity plan: the cached snapshot's config could not be read (%s)", error)
    # The safetensors counts ride on the one metadata call, for the capacity plan.
    result = preflight.run(profile, expand=["safetensors"])  # it logs whether it ran, and its warnings
    if not result.ok:
        log.error("pre-flight: %s", result.message)
        return StartupOutcome(fatal=result.message, model_cache=cached.status() if cached else None)
    phases["preflight"] = round(time.monotonic() - step, 2)
    summary = result.model_info_summary
    download = _download_plan(profile, summary if result.skipped_reason is None else None)
    if download is not None and cached is None:
        # The disk where the download goes, now that the pre-flight knows the model's size.
        where = "the network volume at BASE_PATH" if volume and _under(download.folder, settings.base_path) else "the container disk"
        checks.append(machine_checks.disk_for_download(download.folder, download.total, where))
        failed = _report_checks(checks, len(checks) - 1)
        if failed is not None:
            return failed
    step = time.monotonic()

    devices = gpu_memory.probe(profile, cast(gpu_memory.Platform, settings.engine_device))
    on_cpu = bool(devices) and devices is not None and devices[0].kind == "cpu"
    total = min(d.total for d in devices) if devices and not on_cpu else None
    plan = capacity.startup_plan(
        profile,
        total,
        device_name=devices[0].name if devices else None,
        platform="cpu" if on_cpu else "cuda",
        safetensors_parameters=result.model_info_summary.safetensors_parameters if result.model_info_summary else None,
        facts=facts,
        compile_cache="warm" if caches.expected == "warm" else "unknown",
    )
    log.info("%s", plan.log_line)
    for warning in plan.warnings:
        log.warning("%s", warning)
    if plan.fatal_message:
        return StartupOutcome(fatal=plan.fatal_message, model_cache=cached.status() if cached else None)

    phases["plan"] = round(time.monotonic() - step, 2)

    start = _start_watch(
        env, profile, summary if download is not None else None, download, caches, plan.predicted.weights_bytes if plan.predicted else None,
        on_cpu or not devices, began, volume,
    )
    waiter = memory_waiter(settings)
    if waiter is None:
        log.info("GPU_MEMORY_WAIT=false: every launch starts without waiting for memory")
    launcher = Launcher(
        settings,
        supervisor,
        waiter,
        plan.predicted.weights_bytes if plan.predicted else None,
        caches=caches,
        download=download,
        worker_phases=phases,
        start=start,
    )
    outcome = start_engine(profile, settings, supervisor, waiter, plan.first_steps, total, launcher=launcher)
    if outcome.engine is not None and outcome.climb is not None:
        outcome.capacity, outcome.capacity_plan = capacity.ready_engine_report(
            plan, outcome.climb.profile, outcome.engine.tail()
        )
    outcome.model_cache = cached.status() if cached else None
    return outcome


def _volume_and_caches(
    env: Mapping[str, str], settings: settings_mod.Settings, argv: Sequence[str], cached: model_cache.CachedModel | None
) -> tuple[bool, compile_cache.CacheSetup]:
    """Whether BASE_PATH is a network volume (said once when it is not), and the engine's compile caches there."""
    volume = os.path.ismount(settings.base_path)
    if not volume:
        log.info(
            "BASE_PATH=%s is not a network volume (%s): the worker asks for no fresh worker, and the engine's "
            "compile caches and the warm mark stay in the container",
            settings.base_path,
            fresh_machine.not_a_volume(settings.base_path),
        )
    caches = compile_cache.prepare(settings.base_path, env, argv, str(cached.snapshot) if cached else None)
    if caches.warning:
        log.warning("%s", caches.warning)
    elif caches.root is not None:
        log.info("compile caches on the volume at %s (%s for this configuration)", caches.root, caches.expected)
    return volume, caches


def _download_plan(profile: LaunchProfile, summary: ModelSummary | None) -> DownloadPlan | None:
    """What the engine will download (None: nothing; the pre-flight skipped the Hub, or it said nothing)."""
    if summary is None:
        return None
    hub_cache = model_cache.cache_roots(profile)[-1][1]
    return DownloadPlan(summary.repo, repo_folder(hub_cache, summary.repo), expected_bytes(summary.safetensors_parameters))


def _start_watch(
    env: Mapping[str, str],
    profile: LaunchProfile,
    summary: ModelSummary | None,
    download: DownloadPlan | None,
    caches: compile_cache.CacheSetup,
    weights_bytes: int | None,
    on_cpu: bool,  # the engine runs on the CPU (ENGINE_DEVICE=cpu, or no GPU could be read)
    began: float,
    volume: bool,
) -> StartWatch:
    """The start's forecast before the launch (engine.start_forecast): the bytes vLLM will fetch (the Hub's listing
    of the revision less what is on disk) at the rate a read of the largest weights file gave, then the engine's
    start after its download (this configuration's last ready start, else the platform's figure)."""
    to_fetch, rate = 0, None
    if download is not None and summary is not None:
        from vllm_worker.model.preflight import hub_endpoint

        endpoint = hub_endpoint(profile)
        revision = summary.sha or summary.revision
        files = hub_rate.fetched_files(hub_rate.list_files(endpoint, summary.repo, revision, profile.hf_token) or {})
        to_fetch = max(0, (sum(files.values()) if files else download.total or 0) - bytes_on_disk(download.folder))
        largest = hub_rate.largest_weights(files)
        if to_fetch > 0 and largest is not None:
            rate = hub_rate.probe_rate(endpoint, summary.repo, revision, largest, profile.hf_token, files[largest])
    before, after, source = start_forecast.engine_start(
        "cpu" if on_cpu else "cuda", caches.expected == "warm", profile.enforce_eager is True, weights_bytes, caches.recorded_start
    )
    forecast = start_forecast.Forecast(
        time.monotonic() - began, to_fetch, rate, "a read of the Hub" if rate else "", after, source,
        start_forecast.platform_limit(env), before,
    )
    return StartWatch(forecast, began, profile.model or (summary.repo if summary else ""), volume)


def _report_checks(checks: list[machine_checks.Check], new: int = 0) -> StartupOutcome | None:
    """Log what the checks from `new` on found (and hand all to the SDK glue); the failure to answer jobs with, if any."""
    for check in checks[new:]:
        (log.info if check.ok else log.error)("%s", check.log_line())
    platform.record_machine_checks([f"{c.name}: {'ok' if c.ok else 'failed'}" for c in checks])
    failed = machine_checks.first_failure(checks[new:])
    if failed is None:
        return None
    kind = machine_checks.GPU_FAULT_KIND if failed.fresh_machine else f"machine_check_{failed.name}"
    return StartupOutcome(fatal=failed.failure, cause=kind)


def _under(folder: Path, base_path: str) -> bool:
    try:
        return folder.resolve().is_relative_to(Path(base_path).resolve())
    except OSError:
        return False


def memory_waiter(settings: settings_mod.Settings) -> MemoryWait | None:
    """What runs before every launch: wait for the memory vLLM checks; None when GPU_MEMORY_WAIT is off."""
    if not settings.gpu_memory_wait:
        return None
    platform = cast(gpu_memory.Platform, settings.engine_device)

    def wait_for_memory(profile: LaunchProfile) -> str | None:
        waited = gpu_memory.wait_for_memory(
            profile,
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
