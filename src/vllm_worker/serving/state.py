"""What the job side and the engine's watcher share: one `WorkerState`.

`main` fills it after startup; the handler reads it on every job; `engine.monitor` tells it
about a death, a hang or a relaunch (`record_death` with a typed `Death`, `mark_ready`, `fatal`),
and the platform's stop (`begin_stop`). `status` is what the status job prints, and nothing else
reads it. It is the only thing of `serving` that `engine` may import.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

from vllm_worker.serving import engine_load


@dataclass(frozen=True)
class Death:
    """An engine death (or hang) while serving, as the monitor hands it to the jobs that were running.

    sentence: what such a job is told when it is not continued; cause: the diagnosis kind
    ("engine_died", "oom", "hang", ...), which a continued job's notice names, or STOPPED for the
    drain's cut (no engine died: the worker is stopping, and nothing is continued); restarted: an
    engine comes back after it (False once restarts are spent).
    """

    sentence: str
    cause: str = "engine_died"
    restarted: bool = True


STOPPED = "stopped"  # Death.cause of the drain's cut


class _Flag(Protocol):
    def is_set(self) -> bool: ...

    def set(self) -> None: ...

    def clear(self) -> None: ...


@dataclass
class WorkerState:
    """What main tells the handler about the worker; replaced or mutated by main only (context_length aside)."""

    served_model_name: str = ""
    port: int = 8000
    host: str = "127.0.0.1"
    max_concurrency: int = 30
    request_timeout: float = 600.0
    ready_timeout: float = 300.0
    # DEFAULT_MAX_TOKENS: budget of a shorthand job that names no max_tokens; None: to the end of the context.
    default_max_tokens: int | None = None
    # When set, every job is answered at once with {"error": fatal}.
    fatal: str | None = None
    # Degraded launch profile, e.g. {"name": "eager", "reason": "...", "overrides": {...}}.
    profile: dict[str, Any] | None = None
    # Launches, causes, capacity line: returned as-is by a status job.
    status: dict[str, Any] = field(default_factory=dict)
    # Set by main while the engine answers; jobs wait for it up to ready_timeout.
    ready: _Flag = field(default_factory=threading.Event)
    # Engine deaths while serving, counted by main; `death` is the last, for the jobs that were running then.
    deaths: int = 0
    death: Death | None = None
    # Answers of a live engine's /health (not its death's 503), counted by the monitor. A request that failed the
    # way a dying engine fails waits for a death or for an answer begun after its failure (serving.handler), and
    # for no longer than `verdict_within`: the monitor's longest time to a verdict (main sets it from the hang
    # timeout; the default serves a state without a monitor).
    health_answers: int = 0
    verdict_within: float = 3.0
    # The handler's cache: (deaths when read, the engine's max_model_len from /v1/models).
    context_length: tuple[int, int] | None = None
    # Set when the platform stops the worker: what a job that cannot run any more is told.
    stopping: str | None = None
    # Reads vLLM's /metrics beside the job loop; the status job shows its figures.
    load_watch: engine_load.LoadWatch | None = None
    # Jobs the handler continued on a relaunched engine, and those answered instead, by reason
    # (serving.continuation.REASONS); the status job shows both.
    continued: int = 0
    not_continued: dict[str, int] = field(default_factory=dict)
    # Jobs whose request the engine has finished while their answer is still being posted: their KV cache is
    # free, so serving.intake counts them out of what the engine holds. serving.platform makes the set when the
    # intake adapts (None: nobody counts them) and forgets the ids the SDK no longer holds; the handler adds a
    # job's id when the engine's response ends.
    engine_done: set[str] | None = None

    def mark_ready(self) -> None:
        """The engine answers: jobs go through (thread-safe; main's supervisor may call it)."""
        self.ready.set()

    def record_death(self, death: Death) -> None:
        """The serving engine died: jobs that were running are continued or told why not, new ones wait."""
        self.ready.clear()
        self.death = death
        self.deaths += 1  # after `death`: a job that sees the count change reads the record

    def note_health(self) -> None:
        """The engine answered /health alive (thread-safe: one writer, the monitor)."""
        self.health_answers += 1

    def count_continuation(self, reason: str | None) -> None:
        """One job that was running at a death: continued (reason None) or answered for `reason`."""
        if reason is None:
            self.continued += 1
        else:
            self.not_continued[reason] = self.not_continued.get(reason, 0) + 1

    def continuations(self) -> dict[str, Any]:
        """What the status job shows of the jobs that were running when the engine stopped."""
        return {"continued": self.continued, "answered": dict(self.not_continued)}

    def begin_stop(self, new_jobs: str) -> None:
        """The platform stops the worker: jobs not yet running (or waiting for the engine) end with `new_jobs`."""
        self.stopping = new_jobs
