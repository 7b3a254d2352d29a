"""Watching the serving engine: a death or a hang ends the running jobs and restarts it in place.

Once serving, three things can go wrong with the engine: its process exits, its engine core
dies under a live API server (vLLM's /health turns 503), or it hangs (a stuck kernel, a
deadlocked collective, a stopped process: nothing answers, not even /health). A hang is
invisible to a job, which would wait REQUEST_TIMEOUT; so the monitor calls the engine hung
when /health has given no answer for ENGINE_HANG_TIMEOUT seconds. A busy engine still answers
/health (its API server is not the engine core), later under load; bench/health_under_load.py
measures how much later, and the default stays far above it.

On any of the three, the death is recorded for the running jobs (`WorkerState.record_death`):
each is held by the handler and continued on the relaunched engine where that is the same
request (serving.continuation), else answered at once with the cause. Then the
engine's process group is stopped (killed outright when hung: a stopped process never handles
SIGTERM), and the engine is relaunched in place through `launcher.Launcher`, the same launch
path as startup, while new jobs wait. An out-of-memory death walks the startup ladder (fewer
sequences with CUDA graphs kept, then eager) instead of relaunching the footprint that died.
Restarts are bounded (`ladder.restart_allowed`): a configuration that keeps killing its
engine ends in an answer naming the cause. A fault of the machine (NCCL, the driver, the GPU)
is restarted in place once; the next one asks for a fresh worker (`runtime.fresh_worker_now`).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Sequence

from vllm_worker.config import settings as settings_mod
from vllm_worker.diagnosis import runtime
from vllm_worker.diagnosis.runtime import hang_diagnosis, restarting_sentence
from vllm_worker.diagnosis.verdict import Failure
from vllm_worker.engine import ladder
from vllm_worker.engine.launcher import Launcher, MemoryWait, Supervisor, WorkerStopping
from vllm_worker.engine.process import HEALTH_REQUEST_TIMEOUT, Engine, health_status, health_url
from vllm_worker.serving.state import Death, WorkerState

log = logging.getLogger("vllm_worker")

HEALTH_POLL_S = 1.0


def verdict_within(hang_timeout: float) -> float:
    """The longest the monitor takes to a verdict on an engine that fails: a hang is called after
    `hang_timeout` without an answer, read once a poll; a death or an answer sooner."""
    return hang_timeout + HEALTH_POLL_S + 2 * HEALTH_REQUEST_TIMEOUT
LOGGED_TAIL_LINES = 60


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
    `WorkerState`: `record_death` (a typed `Death`: running jobs end or are continued, new ones wait),
    `mark_ready`, `fatal`, and `status` for the status job to print.
    """

    def __init__(
        self,
        supervisor: Supervisor,
        settings: settings_mod.Settings,
        state: WorkerState,
        climb: ladder.Ladder,
        launches: Sequence[dict[str, Any]],
        wait_for_memory: MemoryWait | None,
        clock: Callable[[], float] = time.monotonic,
        launcher: Launcher | None = None,
        fresh_machine: Callable[[str, str | None], str] | None = None,
    ) -> None:
        """fresh_machine: given the final answer and the failure's kind, asks the platform for a fresh
        worker where another machine is the fix, and returns the answer that says so."""
        self.supervisor = supervisor
        self.fresh_machine = fresh_machine
        self.settings = settings
        self.state = state
        self.climb = climb  # the startup's ladder: a step it took is not taken again after a death
        self.launches = [dict(record) for record in launches]
        self.clock = clock
        self.launcher = launcher or Launcher(settings, supervisor, wait_for_memory, clock=clock)
        self.launcher.count = max(self.launcher.count, len(self.launches))
        self.restarts: list[float] = []
        self.causes: list[str] = [str(record["cause"]) for record in launches if record.get("cause")]
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
        except WorkerStopping:
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
            status = health_status(url, HEALTH_REQUEST_TIMEOUT)
            now = self.clock()
            if status is not None:
                last_answer = now
                if status == 503 and engine.alive() and not self.supervisor.stopping:
                    return "dead"
                if status != 503:
                    self.state.note_health()
            elif now - last_answer >= self.settings.hang_timeout and engine.alive() and not self.supervisor.stopping:
                return "hung"
        return None

    def _recover(self, engine: Engine, how: str) -> Engine | None:
        code = engine.returncode if how == "exited" else None
        tail = engine.tail()
        if how == "hung":
            diagnosis = hang_diagnosis(self.settings.hang_timeout)
        else:
            diagnosis = runtime.runtime_failure(Failure(tail, self.climb.profile, code))
        now = self.clock()
        recent = [at for at in self.restarts if now - at < ladder.RESTART_WINDOW_S]
        machine = runtime.machine_fault_answer(diagnosis, self.causes)
        allowed = machine is None and ladder.restart_allowed(self.restarts, now)
        step = self.climb.after_death(diagnosis) if allowed else None
        sentence = (
            f"{diagnosis.message} {restarting_sentence(step.tried if step else None)}"
            if allowed
            else self._final(machine or budget_sentence(diagnosis.message, len(recent) + 1), diagnosis.kind)
        )
        log.error("the engine stopped while serving: %s", diagnosis.message)
        record = self.launches[-1] if self.launches else {}
        record.update(outcome="hung" if how == "hung" else "died", cause=diagnosis.kind, exit_code=code, message=diagnosis.message)
        self.causes.append(diagnosis.kind)
        if not allowed:
            self.state.fatal = sentence  # before the death: jobs waiting for readiness read it
        self.state.record_death(Death(sentence, diagnosis.kind, restarted=allowed))
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

    def _take(self, step: ladder.Relaunch) -> None:
        for warning in step.warnings:
            log.warning(warning)
        log.warning("relaunching (%s): %s", step.profile, step.reason)
        # Every response names the slower profile from now on.
        self.state.profile = self.climb.notice()

    def _relaunch(self, after: str) -> Engine | None:
        while True:
            log.warning(
                "restarting the engine (%s; restart %d; at most %s)",
                self.climb.profile.name,
                len(self.restarts),
                ladder.restart_budget_phrase(),
            )
            result = self.launcher.attempt(self.climb.profile, {"restart": len(self.restarts), "after": after})
            if result.outcome == "fatal":
                message = result.message or "The engine could not be started again."
                self._give_up(self._final(message, result.record.get("cause")), None)
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
            if not ladder.restart_allowed(self.restarts, now) or runtime.fresh_worker_now(kind, self.causes[:-1]):
                tail = self.supervisor.engine.tail() if self.supervisor.engine is not None else None
                self._give_up(self._final(f"The engine stopped while serving and could not be started again: {message}", kind), tail)
                return None
            self.restarts.append(now)
            after = kind

    def _final(self, sentence: str, kind: str | None) -> str:
        """The answer once restarts are spent: a fault of the machine asks for a fresh worker."""
        return self.fresh_machine(sentence, kind) if self.fresh_machine is not None else sentence

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
        status["profile"] = self.climb.profile.name
        self.state.status = status
