"""After the platform's SIGTERM the engine's stop fits what is left of the platform's window.

Runpod (and `docker stop`) SIGKILL a worker 5 s after SIGTERM. The drain answers the jobs first
(DRAIN_TIMEOUT, 3 s by default); the engine is then stopped with VLLM_STOP_GRACE (10 s) at most,
which on a slow machine let the runtime's SIGKILL end the worker (exit 137) while the engine was
still shutting down. Now the grace is what is left of the window less the worker's own exit.
"""

from __future__ import annotations

from vllm_worker.config import settings as settings_mod
from vllm_worker.engine.launcher import Supervisor
from vllm_worker.serving import platform


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_before_a_signal_the_engine_gets_its_own_grace() -> None:
    assert platform.Shutdown(clock=Clock()).engine_grace() is None
    assert platform.Shutdown(clock=Clock()).since_signal() is None


def test_after_the_drain_the_grace_is_what_is_left_of_the_window() -> None:
    clock = Clock()
    shutdown = platform.Shutdown(clock=clock)
    shutdown.drain_timeout = 3.0
    shutdown.signal_at = clock.now
    clock.now += 3.0  # the drain's 3 s
    assert shutdown.engine_grace() == platform.KILL_AFTER_S - 3.0 - platform.EXIT_MARGIN_S == 1.0
    assert shutdown.since_signal() == 3.0
    clock.now += 10.0  # past the window: SIGKILL at once
    assert shutdown.engine_grace() == 0.0


def test_a_longer_declared_drain_gives_the_engine_the_longer_window() -> None:
    clock = Clock()
    shutdown = platform.Shutdown(clock=clock)
    shutdown.drain_timeout = 10.0
    shutdown.signal_at = clock.now
    clock.now += 10.0
    assert shutdown.engine_grace() == platform.MIN_POST_S == 1.0


def test_the_supervisor_stops_the_engine_within_the_shorter_of_the_two() -> None:
    graces: list[float] = []
    supervisor = Supervisor(settings_mod.load({}))
    supervisor.engine = type("Engine", (), {"stop": lambda self, grace: graces.append(grace)})()  # type: ignore[assignment]
    supervisor.stop()
    supervisor.stop(1.5)
    supervisor.stop(60.0)
    assert graces == [10.0, 1.5, 10.0]
    assert supervisor.stopping
