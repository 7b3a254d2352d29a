"""Watching the serving engine: a death or a hang ends the running jobs and restarts it in place.

Once serving, three things can go wrong with the engine: its process exits, its engine core
dies under a live API server (vLLM's /health turns 503), or it hangs (a stuck kernel, a
deadlocked collective, a stopped process: nothing answers, not even /health). A hang is
invisible to a job, which would wait REQUEST_TIMEOUT; so the monitor calls the engine hung
when /health has given no answer for ENGINE_HANG_TIMEOUT seconds. A busy engine still answers
/health (its API server is not the engine core), later under load; bench/health_under_load.py
measures how much later, and the default stays far above it.

On any of the three, running jobs end at once with the cause (`WorkerState.record_death`), the
engine's process group is stopped (killed outright when hung: a stopped process never handles
SIGTERM), and the engine is relaunched in place through `launcher.Launcher`, the same launch
path as startup, while new jobs wait. An out-of-memory death walks the startup ladder (fewer
sequences with CUDA graphs kept, then eager) instead of relaunching the footprint that died.
Restarts are bounded (`ladder.restart_allowed`): a configuration that keeps killing its
engine ends in an answer naming the cause.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Callable, Mapping, Sequence

from vllm_worker.diagnosis import runtime
from vllm_worker.diagnosis.runtime import RESTARTING, hang_diagnosis
from vllm_worker.diagnosis.verdict import Diagnosis, Failure
from vllm_worker.serving import handler

from vllm_worker.engine import ladder

from vllm_worker.config import settings as settings_mod
from vllm_worker.engine.process import Engine, health_url
from vllm_worker.engine.launcher import Launcher, MemoryWait, Supervisor, profile_notice
from vllm_worker.config.profile import LaunchProfile, apply_overrides

log = logging.getLogger("vllm_worker")

HEALTH_POLL_S = 1.0
# Only a 503 means dead; a /health slower than this is one unanswered probe, counted towards a hang.
HEALTH_TIMEOUT_S = 2.0
LOGGED_TAIL_LINES = 60

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
    minutes = ladder.RESTART_WINDOW_S / 60
    return (
        f"{message} The engine has stopped {deaths_in_window} times within {minutes:g} minutes while serving, "
        f"more than the worker's budget of {ladder.restart_budget_phrase()}, so it is not restarted again; "
        f"after fixing the cause, or to try another machine, terminate this worker so the platform starts a fresh one."
    )


class EngineMonitor:
    """Watches the serving engine; when it dies or hangs, ends the running jobs and relaunches it in place.

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
        wait_for_memory: MemoryWait | None,
        clock: Callable[[], float] = time.monotonic,
        base_env: Mapping[str, str] | None = None,
        launcher: Launcher | None = None,
        device_total_bytes: int | None = None,
    ) -> None:
        self.supervisor = supervisor
        self.settings = settings
        self.state = state
        self.launch_env = dict(launch_env)
        self.base_env = dict(base_env if base_env is not None else launch_env)
        self.launches = [dict(record) for record in launches]
        self.clock = clock
        self.launcher = launcher or Launcher(settings, supervisor, wait_for_memory, clock=clock)
        self.launcher.count = max(self.launcher.count, len(self.launches))
        self.device_total_bytes = device_total_bytes
        self.restarts: list[float] = []
        self.causes: list[str] = list(state.status.get("causes", []))
        serving = self.launches[-1] if self.launches else {}
        self._profile = serving.get("profile", "as configured")
        self._overrides = dict(serving.get("overrides", {}))
        self._tried: list[str] = list((state.profile or {}).get("tried", []))
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
        """Block until the engine dies ("exited"; "dead": alive with /health 503) or hangs ("hung": no
        answer at all for ENGINE_HANG_TIMEOUT); None when it is stopped on purpose."""
        exited = threading.Event()
        engine.watch(lambda code: exited.set())
        url = health_url(engine.host, engine.port)
        last_answer = self.clock()
        while not self.supervisor.stopping:
            if exited.wait(HEALTH_POLL_S):
                return "exited"
            if self.supervisor.stopping or engine.stopping:
                return None
            status = health_status(url, HEALTH_TIMEOUT_S)
            now = self.clock()
            if status is not None:
                last_answer = now
                if status == 503 and engine.alive() and not self.supervisor.stopping:
                    return "dead"
            elif now - last_answer >= self.settings.hang_timeout and engine.alive() and not self.supervisor.stopping:
                return "hung"
        return None

    def _recover(self, engine: Engine, how: str) -> Engine | None:
        code = engine.returncode if how == "exited" else None
        tail = engine.tail()
        if how == "hung":
            diagnosis = hang_diagnosis(self.settings.hang_timeout)
        else:
            diagnosis = runtime.runtime_failure(Failure(tail, LaunchProfile.parse(self.launch_env), code))
        now = self.clock()
        recent = [at for at in self.restarts if now - at < ladder.RESTART_WINDOW_S]
        allowed = ladder.restart_allowed(self.restarts, now)
        step = self._next_step(diagnosis) if allowed else None
        restarting = RESTARTING if step is None else f"The worker is restarting the engine with {step.tried_phrase.removeprefix('relaunched with ')}; retry the request."
        sentence = f"{diagnosis.message} {restarting}" if allowed else budget_sentence(diagnosis.message, len(recent) + 1)
        log.error("the engine stopped while serving: %s", diagnosis.message)
        record = self.launches[-1] if self.launches else {}
        record.update(outcome="hung" if how == "hung" else "died", cause=diagnosis.kind, exit_code=code, message=diagnosis.message)
        self.causes.append(diagnosis.kind)
        if not allowed:
            self.state.fatal = sentence  # before the death: jobs waiting for readiness read it
        self.state.record_death(sentence)
        # A 503 engine still holds its connections and memory; a crashed one may have left processes
        # behind; a hung one never handles SIGTERM.
        if how == "hung":
            engine.kill()
        else:
            engine.stop(self.settings.stop_grace)
        if not allowed:
            self._give_up(sentence, tail)
            return None
        self.restarts.append(now)
        if step is not None:
            self._take(step)
        self._publish()
        return self._relaunch(diagnosis.kind)

    def _next_step(self, diagnosis: Diagnosis) -> ladder.Relaunch | None:
        """After an out-of-memory death, the ladder's next footprint; None: relaunch the same one."""
        if diagnosis.kind != "runtime_oom" or diagnosis.facts.get("device") == "CPU":
            return None
        return ladder.next_after_death(
            self.base_env, self.launch_env, self.settings.max_concurrency, device_total_bytes=self.device_total_bytes
        )

    def _take(self, step: ladder.Relaunch) -> None:
        for warning in step.warnings:
            log.warning(warning)
        log.warning("relaunching (%s): %s", step.profile, step.reason)
        self._tried.append(step.tried_phrase)
        self.launch_env = apply_overrides(self.base_env, step.overrides)
        self._profile, self._overrides = step.profile, dict(step.overrides)
        # Every response names the slower profile from now on.
        self.state.profile = profile_notice(step, self._tried)

    def _relaunch(self, after: str) -> Engine | None:
        while True:
            log.warning(
                "restarting the engine (%s; restart %d; at most %s)",
                self._profile,
                len(self.restarts),
                ladder.restart_budget_phrase(),
            )
            profile = LaunchProfile.parse(self.launch_env, self._profile, self._overrides)
            result = self.launcher.attempt(profile, {"restart": len(self.restarts), "after": after})
            if result.outcome == "fatal":
                self._give_up(result.message or "The engine could not be started again.", None)
                return None
            self.launches.append(result.record)
            if result.outcome == "ready":
                self._publish()
                self.state.mark_ready()
                log.info("engine ready again after restart %d; taking jobs", len(self.restarts))
                return result.engine
            if result.outcome == "stopped":
                return None
            if result.outcome == "timeout":
                kind, message = "timeout", result.message or ""
            else:
                assert result.diagnosis is not None
                kind, message = result.diagnosis.kind, result.diagnosis.message
            result.record["cause"] = kind
            self.causes.append(kind)
            log.error("launch %d failed: %s", result.record["launch"], message)
            now = self.clock()
            if not ladder.restart_allowed(self.restarts, now):
                tail = self.supervisor.engine.tail() if self.supervisor.engine is not None else None
                self._give_up(f"The engine stopped while serving and could not be started again: {message}", tail)
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
        status["profile"] = self._profile
        self.state.status = status
