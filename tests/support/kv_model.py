"""A model of vLLM 0.32's KV cache admission, for property tests of the intake's decision over time.

What it keeps of vLLM's v1 scheduler (vllm/v1/core/sched/scheduler.py, read in the engine venv):
the cache is given out in whole blocks; every step each running request takes the block its next
token needs, and when none is free the newest running request is preempted (its blocks freed, it goes
back to the front of the waiting queue, its generated tokens kept, to be recomputed); a step that
preempted admits nothing; otherwise waiting requests are admitted in order while the blocks of their
tokens so far are free. Every running request makes one token a step. A step's time grows with the
batch as bench/engine_batch.py measures it on the CPU engine (about 10.5 ms, +0.2 ms a request:
2026-12-03, 94 tokens/s at one request, 425 at 5, 793 at 10, 1,522 at 24; a later run the same day
76, 325, 586 and 1,166, 13.2 ms + 0.3 ms a request: the engine's speed drifts, its shape less); a prompt computed in a
step, a preempted request's recompute too, adds 0.02 ms a token (assumed; bench/engine_batch.py --prompts
measured 0.003 ms on 2026-12-05 beside a 5.4-ms step of one request, so here a fixed worker's preemptions
cost it more than on the engine); `jitter`, when
given, is a factor on each step's time (the real engine's speed drifts). The worker's side: jobs come
from a queue that never empties (or, for a burst, holds `jobs` at the start), reach the engine TAKE_S
after they are taken and leave the worker POST_S after their last token; the job loop asks the intake
every ROOM_POLL_S, as serving.platform's patched set_scale does, and the intake reads the engine every
intake.POLL_S.

Not the engine: tests/engine and bench/intake.py measure the real one. This model lets a property test
run minutes of a busy worker in a second, which the real engine on two cores cannot.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from vllm_worker.serving import intake

TAKE_S = 0.15
POST_S = 0.05
ROOM_POLL_S = 0.05
SAMPLE_S = 0.25


def step_seconds(batch: int, prefill: int = 0) -> float:
    return 0.0105 + 0.0002 * batch + 0.00002 * prefill


@dataclass
class Request:
    taken: float
    prompt: int
    generate: int
    out: int = 0
    blocks: int = 0
    scheduled: float | None = None
    first_token: float | None = None
    done: float | None = None

    @property
    def tokens(self) -> int:
        return self.prompt + self.out


@dataclass
class Engine:
    blocks: int
    block_size: int
    running: list[Request] = field(default_factory=list)
    waiting: list[Request] = field(default_factory=list)
    free: int = 0
    preemptions: int = 0
    finished: list[Request] = field(default_factory=list)
    jitter: Callable[[], float] | None = None  # a factor on each step's time
    max_seqs: int = 1 << 30  # vLLM's max_num_seqs: the requests one step schedules at most

    def __post_init__(self) -> None:
        self.free = self.blocks

    def need(self, r: Request) -> int:
        return math.ceil((r.tokens + 1) / self.block_size) - r.blocks

    def step(self, now: float) -> float:
        preempted = False
        prefill = 0
        scheduled: list[Request] = []
        for r in list(self.running):
            if r not in self.running:
                continue  # preempted for an earlier one
            while self.need(r) > self.free:
                victim = self.running.pop()
                self.free += victim.blocks
                victim.blocks = 0
                self.waiting.insert(0, victim)
                self.preemptions += 1
                preempted = True
                if victim is r:
                    break
            if r in self.running:
                n = self.need(r)
                self.free -= n
                r.blocks += n
                scheduled.append(r)
        if not preempted:
            while self.waiting and len(self.running) < self.max_seqs and self.need(self.waiting[0]) <= self.free:
                r = self.waiting.pop(0)
                n = self.need(r)
                self.free -= n
                r.blocks += n
                r.scheduled = now if r.scheduled is None else r.scheduled
                prefill += r.tokens
                self.running.append(r)
                scheduled.append(r)
        if not scheduled:
            return 0.005
        seconds = step_seconds(len(scheduled), prefill) * (self.jitter() if self.jitter else 1.0)
        for r in scheduled:
            r.out += 1
            r.first_token = now + seconds if r.first_token is None else r.first_token
            if r.out >= r.generate:
                r.done = now + seconds
                self.running.remove(r)
                self.free += r.blocks
                r.blocks = 0
                self.finished.append(r)
        return seconds


@dataclass
class Outcome:
    completed: int  # requests finished in the second half
    running: float  # mean running requests in the second half
    taken_not_running: list[int]  # held - running, every SAMPLE_S in the second half
    first_token_waits: list[float]  # take to first token, jobs taken in the second half
    preemptions: int
    ended: float  # when the last job left the worker (a burst), or `seconds`
    # Every take: (when, jobs asked for, what the engine had shown room for then: `shown(at, engine, held)`).
    takes: list[tuple[float, int, int]] = field(default_factory=list)


def run(
    limit: Callable[[float, int, Engine], int],
    observe: Callable[[float, Engine, list[Request]], None],
    *,
    blocks: int,
    block_size: int,
    prompt: int,
    generate: int,
    seconds: float,
    jobs: int | None = None,
    max_seqs: int = 1 << 30,
    sizes: Callable[[int], tuple[int, int]] | None = None,
    shown: Callable[[float, Engine, int], int] | None = None,
) -> Outcome:
    """A worker whose job loop holds `limit(at, held, engine)` jobs, with a queue that never empties, or
    `jobs` queued at once (then taken_not_running is sampled while the queue still holds some, from the
    start). `observe(at, engine, finished since the last call)` is called every intake.POLL_S. `max_seqs`:
    vLLM's max_num_seqs. `sizes(n)`: the n-th job's (prompt, generate), where the jobs change (else all are
    `prompt`, `generate`); a burst's samples then start once a job of the burst's own size is taken. `shown`:
    recorded beside each take's count (Outcome.takes)."""
    engine = Engine(blocks, block_size, max_seqs=max_seqs)
    held: list[Request] = []
    on_the_way: list[Request] = []
    at = next_room = next_read = next_sample = 0.0
    seen = taken = 0
    takes: list[tuple[float, int, int]] = []
    samples: list[int] = []
    running: list[int] = []
    preemptions_at_half: int | None = None
    left = math.inf if jobs is None else jobs
    while at < seconds and (left or held):
        for r in [r for r in on_the_way if r.taken + TAKE_S <= at]:
            on_the_way.remove(r)
            engine.waiting.append(r)
        for r in [r for r in held if r.done is not None and r.done + POST_S <= at]:
            held.remove(r)
        if at >= next_read:
            observe(at, engine, engine.finished[seen:])
            seen = len(engine.finished)
            next_read += intake.POLL_S
        if at >= next_room:
            asked = int(min(left, max(0, limit(at, len(held), engine) - len(held))))
            if asked:
                takes.append((at, asked, shown(at, engine, len(held)) if shown is not None else asked))
            for _ in range(asked):
                size = sizes(taken) if sizes is not None else (prompt, generate)
                r = Request(at, *size)
                taken += 1
                held.append(r)
                on_the_way.append(r)
                left -= 1
            next_room = at + ROOM_POLL_S
        if jobs is not None and left and at >= next_sample and (sizes is None or taken and sizes(taken - 1) == (prompt, generate)):
            samples.append(len(held) - len(engine.running))
            next_sample = at + SAMPLE_S
        if jobs is None and at >= seconds / 2:
            if preemptions_at_half is None:
                preemptions_at_half = engine.preemptions
            if at >= next_sample:
                samples.append(len(held) - len(engine.running))
                running.append(len(engine.running))
                next_sample = at + SAMPLE_S
        at += engine.step(at)
    half = seconds / 2
    return Outcome(
        completed=sum(1 for r in engine.finished if r.done is not None and r.done >= half),
        running=sum(running) / max(1, len(running)),
        taken_not_running=samples,
        first_token_waits=[(r.first_token or seconds) - r.taken for r in [*engine.finished, *held] if r.taken >= half],
        preemptions=engine.preemptions - (preemptions_at_half or 0),
        ended=min(at, seconds),
        takes=takes,
    )
