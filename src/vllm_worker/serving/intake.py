"""How many jobs the worker asks the platform for now: what the engine can start, up to MAX_CONCURRENCY.

Why: Runpod's Queue Delay scaler adds workers when jobs wait in the endpoint's queue; it sees only
jobs no worker has taken. A worker that takes MAX_CONCURRENCY jobs whatever its engine can run
hides the overflow in vLLM's own waiting queue (worker-vllm #36: "Queued amount is always 0"), so no
worker is added. Here what the worker takes follows the engine, read from vLLM's /metrics every POLL_S,
and the clock at each take:

- Room: the requests the KV cache holds to their end beside what runs are taken at once (each as long
  as the recent requests, their prompt plus generated tokens in whole KV cache blocks, MAX_MODEL_LEN
  before any has finished; each running one counted at that length too, or at what the cache holds
  now if more). A light load never waits.
- Full use, paced: past that room the cache holds more, since requests started at different times are
  at different lengths. Started a pace apart, requests like the recent ones hold on average what one
  holds over its life (its prompt, half its generated tokens, half a block), and at their peaks, just
  before the oldest ends, about half a request's generated tokens more: the target is what the cache
  holds at the peaks, to the nearest request (`paced_target` says why not more). Up to it the worker takes one more job
  at a time, a pace apart, and none while requests wait inside vLLM (what waits there was preempted,
  or cannot start) unless more jobs have ended since that read than waited (each one's blocks let one
  that waited start; the one more leaves room for a new job). The pace is kept in the engine's tokens
  (a recent request's generated tokens over what the cache holds on average) and timed by the engine's
  step now (`token_seconds`), so a slower engine spaces its starts as many tokens apart. A worker that
  held all it was allowed (its target, or its room before any request finished) within a request's
  time refills a drained room paced too. Why paced: requests started together end together, so an
  engine refilled in one go runs in lockstep, its cache about half empty between batches (measured on
  vLLM's CPU engine: 6.5 requests running where a worker that gives vLLM every job keeps 10.1, and
  0.70 of its tokens a second); started a pace apart, their ends spread and the cache stays nearly as
  full as vLLM keeps it with a queue, without the queue.
- Nothing known of the KV cache's size: up to MAX_CONCURRENCY.
- Never past MAX_NUM_SEQS and one more, where that is below MAX_CONCURRENCY: vLLM runs no more requests
  at once whatever its cache holds (each step schedules at most that many), so a job past them would
  only wait inside vLLM, as every job past the KV cache's room does. The one more waits there to start at
  the step a request ends (tests/unit/test_intake.py: without it, jobs of 200 tokens completed 0.88 of a
  fixed worker's in the model, their slots empty while the next job was taken).

- Within what the engine has shown room for (`bounded`): what it runs, the requests of MAX_MODEL_LEN its
  free cache holds to their end, and one more a read while it shows room; none more while requests wait
  inside it or it preempts. The room and the pace follow the recent requests, and a change of the jobs
  makes them wrong at once (after short chat turns, a burst of long generations was taken 20 at one take
  where the cache held about five: issue 43); no take asks for more than the engine has shown room for.
  Running requests that already hold more of the cache than the recent ones did to their end mean the
  jobs have changed: what the recent ones said is forgotten until the new ones end.
- A buffer where the engine refills (`buffer_for`, INTAKE_BUFFER): one or two jobs more than the room, so
  a request that ends is refilled by vLLM at its next step while the worker's next take is under way;
  never past what the cache holds at the requests' peaks, none while vLLM preempts.

Recent requests: means over those finished so far, each earlier one weighing KEEP as much per request
finished after it, so they follow a change of the jobs within tens of requests. `decide` (each read)
and `allowed` (each take) are pure; `Intake` keeps the latest decision for the job loop
(serving.platform asks `allowed_now` before every take) and the status job, and logs a change at most
once every LOG_EVERY_S.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

log = logging.getLogger("vllm_worker")

POLL_S = 1.0
KEEP = 0.9
STALL_GROWTH = 2.0  # one read's step counts for at most this many times the step before it (`token_seconds`)
LOG_EVERY_S = 30.0
OFF_REASON = "adaptation is off (ADAPTIVE_CONCURRENCY=false): the worker takes up to MAX_CONCURRENCY jobs"
UP_TO_MAX_CONCURRENCY = "up to MAX_CONCURRENCY"
NO_FIGURES_REASON = "the engine gives no load figures (vLLM keeps none with DISABLE_LOG_STATS=true): " + UP_TO_MAX_CONCURRENCY
NO_KV_REASON = "the KV cache's size is unknown (neither the capacity plan nor vLLM gives it): " + UP_TO_MAX_CONCURRENCY


@dataclass(frozen=True)
class Bounds:
    """What the limit is bounded by: MAX_CONCURRENCY, and the capacity plan's figures (None: unknown)."""

    max_concurrency: int
    kv_tokens: int | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None  # the requests vLLM runs at once (None: unknown, a vLLM config file's)
    buffer: int | None = None  # jobs kept waiting inside vLLM past what it runs (None: `buffer_for` the completions)

    @property
    def top(self) -> int:
        """The most jobs worth holding: MAX_CONCURRENCY, or MAX_NUM_SEQS and one more where that is lower (the
        one waits inside vLLM to start at the step a running request ends, where a job taken then would
        reach the engine a take later: a slot empty for that long every request)."""
        seqs = self.max_num_seqs if self.max_num_seqs is not None and self.max_num_seqs > 0 else None
        return max(1, self.max_concurrency if seqs is None else min(self.max_concurrency, seqs + 1))

    @property
    def seqs_bound(self) -> bool:
        """MAX_NUM_SEQS, not MAX_CONCURRENCY, is the most jobs worth holding."""
        return self.top < max(1, self.max_concurrency)

    def up_to(self, reason: str = UP_TO_MAX_CONCURRENCY) -> str:
        """`reason` (which ends "up to MAX_CONCURRENCY") with MAX_NUM_SEQS in its place where that is lower."""
        if not self.seqs_bound:
            return reason
        return (
            reason.removesuffix(UP_TO_MAX_CONCURRENCY)
            + f"up to {self.top}: MAX_NUM_SEQS={self.max_num_seqs}, the requests vLLM runs at once, and one to start "
            f"the moment one ends (below MAX_CONCURRENCY={self.max_concurrency})"
        )


@dataclass(frozen=True)
class EngineNow:
    """One read of the engine's /metrics, as the decision needs it."""

    running: int
    waiting: int
    kv_cache_usage: float  # a fraction
    preempted: int = 0  # since the previous read
    finished: int = 0  # requests finished since the previous read
    prompt_tokens: float = 0.0  # their prompt tokens, summed
    generated_tokens: float = 0.0  # their generated tokens, summed
    engine_seconds: float = 0.0  # their time in the engine, summed (vLLM's inference time: first scheduled to last token)
    kv_tokens: int | None = None  # the KV cache's size as vLLM's cache_config_info gives it (when the plan has none)
    block_size: int | None = None  # the tokens of one KV cache block, from the same labels
    generated_now: float = 0.0  # tokens generated since the previous read, by every request
    seconds: float = 0.0  # since the previous read (0: no earlier read of this engine)
    running_before: int | None = None  # requests running at the previous read


@dataclass(frozen=True)
class Recent:
    """Means of the requests finished so far, the later ones weighing more (KEEP)."""

    prompt: float
    generated: float
    engine_seconds: float

    @property
    def length(self) -> float:
        return self.prompt + self.generated


def recent(before: Recent | None, now: EngineNow) -> Recent | None:
    """`before` with the requests `now` says finished since."""
    if now.finished <= 0:
        return before
    n = now.finished
    means = Recent(now.prompt_tokens / n, now.generated_tokens / n, now.engine_seconds / n)
    if before is None:
        return means
    keep = KEEP**n
    return Recent(*(keep * old + (1 - keep) * new for old, new in zip(
        (before.prompt, before.generated, before.engine_seconds), (means.prompt, means.generated, means.engine_seconds)
    )))


# A take's round trip: the job loop's ask, the platform's answer, the job to the engine (serving.platform asks
# every ROOM_POLL_S while full; a job then reaches vLLM within about this).
ROUND_TRIP_S = 1.0
OUTGROWN = 1.0  # `outgrown`: the running requests hold more than this many times what the recent ones did
MAX_BUFFER = 2  # at most this many derived: the acceptance of issue 43 allows 3 taken and not running (p95)


def buffer_for(bounds: Bounds, finished: int, seconds: float, preempted: int) -> int:
    """Jobs kept waiting inside vLLM past what it runs, so a request that ends is refilled by vLLM at its next
    step while the worker's next take is under way: what ends in a take's round trip (ROUND_TRIP_S at the
    completion rate of the last read), one at least, MAX_BUFFER at most; Bounds.buffer where set. None while
    vLLM preempts: its cache is overfilled, and a request waiting there would only wait longer."""
    if preempted > 0:
        return 0
    if bounds.buffer is not None:
        return max(0, bounds.buffer)
    rate = finished / seconds if seconds > 0 else 0.0
    return max(1, min(MAX_BUFFER, math.ceil(rate * ROUND_TRIP_S - 1e-9)))


def outgrown(now: EngineNow, kv_tokens: int, length: float, block: int) -> bool:
    """The requests running now hold on average more than what the recent ones held to their end (OUTGROWN times,
    in whole blocks): the jobs have changed (short ones, then long ones), and what the recent requests say is wrong
    until the new ones end. In a steady mix of lengths the long ones run longer, so the running ones can hold more
    than the mean of those that ended, and the intake forgets: it then takes as for MAX_MODEL_LEN, a cost in
    throughput, not in jobs held back from other workers. At 1.5 times, a burst of long jobs after short ones on a
    loaded engine grew to 13 held before the change was read (a clean-clone CI run, 2026-12-07), and in
    tests/support/kv_model.py an engine 8 times slower held 17 (p95); at once, 7."""
    if now.running <= 0:
        return False
    return now.kv_cache_usage * kv_tokens / now.running > OUTGROWN * _blocks(length, block) + 1e-9


def shown_room(now: EngineNow, kv_tokens: int, max_model_len: int | None, grow: bool = True) -> int:
    """The most jobs the engine has shown room for, whatever the past requests' sizes: those it runs, and beside
    them the requests of MAX_MODEL_LEN its free cache holds to their end (what an idle cache holds whatever
    comes), or one more where that is fewer: growth by one a read while it shows room; none while requests
    wait inside it or it preempts (they show the cache is full: what it runs, so what waits starts before a new
    job is taken), or while `grow` is off (the jobs changed).

    Why: the room and the pace follow the recent requests, and a change of the jobs makes them wrong at once
    (after short chat turns a burst of long generations: 26 taken at one take where the cache held 5, in
    tests/support/kv_model.py; 20 in one batch on the real engine, issue 43). Growing by one for each request
    that ended instead (tried 2026-12-07) left long jobs' engines short: 0.69 of the fixed worker's jobs in the
    model where this reads 0.85 to 1.02."""
    full = room(now, kv_tokens, max_model_len) if max_model_len else 0
    if now.waiting > 0 or now.preempted > 0 or not grow:
        return max(1, now.running + full)
    return max(1, now.running + max(1, full))


@dataclass(frozen=True)
class Limit:
    """One decision: the jobs the engine can start now, how far and how fast past that, and why."""

    value: int  # jobs held at once that the engine can start at once (the room)
    reason: str
    target: int | None = None  # jobs held at once that the KV cache holds at full use: paced up to
    pace_s: float | None = None  # seconds between two paced takes (past the room, or any when kept full)
    waiting: int = 0  # requests waiting inside the engine at this read: no paced take until more jobs have ended
    recent: Recent | None = None
    token_s: float | None = None  # the engine's seconds a token of one running request, lately

    @property
    def life_s(self) -> float | None:
        """A recent request's time in the engine at its speed now (its generated tokens at `token_s`)."""
        if self.recent is None:
            return None
        return self.recent.generated * self.token_s if self.token_s is not None else self.recent.engine_seconds


def _blocks(tokens: float, block: int) -> int:
    """`tokens` in whole KV cache blocks, one at least (vLLM gives the cache out in blocks of `block` tokens:
    16 on a GPU, 128 on its CPU backend, where a request of 642 tokens holds 768)."""
    return max(1, math.ceil(tokens / block - 1e-9)) * block


def room(now: EngineNow, kv_tokens: int, length: float) -> int:
    """Requests of `length` tokens the KV cache holds to their end beside the running ones (each of which will
    need `length` too, or what the cache holds now if more)."""
    need = _blocks(length, now.block_size or 1)
    free = kv_tokens - max(kv_tokens * now.kv_cache_usage, now.running * need)
    return max(0, math.floor(free / need + 1e-9))


def _held_over_a_life(recent: Recent, block: int) -> float:
    """KV tokens a request like the recent ones holds on average over its life: its prompt, half its
    generated tokens, and half a block more for the last one it fills."""
    return recent.prompt + recent.generated / 2 + block / 2


def held_on_average(kv_tokens: int, recent: Recent, block: int) -> float:
    """Requests like the recent ones the KV cache holds on average at full use."""
    return kv_tokens / _held_over_a_life(recent, block)


def held_at_peaks(kv_tokens: int, recent: Recent, block: int) -> float:
    """Requests like the recent ones, started a pace apart, whose peak the KV cache holds: beside N of them at
    their average, the peak (just before the oldest ends) is about half a request's generated tokens and
    half a block more."""
    return (kv_tokens - recent.generated / 2 - block / 2) / _held_over_a_life(recent, block)


def paced_target(kv_tokens: int, recent: Recent, block: int) -> int:
    """Requests to keep, paced: what the KV cache holds at their peaks, to the nearest request.

    Held that many, the requests end a steady number of tokens apart (as many as they are, over a
    request's generated tokens) and the cache holds them at the moment before the oldest ends, so vLLM
    preempts only where the nearest request is above the peaks' figure, and what the worker holds runs.
    Why not more: requests past the peaks overfill the cache before each end, vLLM preempts the newest,
    and the preempted ones wait inside vLLM behind the running ones, where a second worker could have run
    them (docs/benchmarks.md has the measurements). The cost is throughput where the cache's blocks are
    large against a request (vLLM's CPU backend: 128 tokens)."""
    return max(0, math.floor(held_at_peaks(kv_tokens, recent, block) + 0.5))


def token_seconds(before: float | None, now: EngineNow, recent: Recent | None) -> float | None:
    """Seconds the engine takes now for one token of a running request: a step, as the reads see it (the time
    since the previous read times the requests running meanwhile, the mean of the two reads, over the tokens
    made), each read weighing half; before any step was seen, what the recent requests took a token over
    their lives.

    The pace is kept in the engine's tokens and timed with this, not with the recent requests' time: a step
    slows as the batch grows and whenever the machine is busy, so a pace in seconds measured on the first few
    requests, or before another process took a core, starts requests fewer tokens apart than the cache holds
    them (on two cores with another engine test beside it, a burst then held 3 preempted requests waiting in
    vLLM for seconds: tests/engine/test_intake_real_engine.py, 2026-12-06).

    One read counts for at most STALL_GROWTH times the step before it: a read across a stall (on two busy
    cores the engine made 63 tokens a second with 9 running for 1 to 4 s at a time, every read and take of a
    feed logged on 2026-12-06) reads a step ten times the true one, and the pace it gave (up to 7 s) held
    takes back for the next few reads, 13% of them, while the engine ran out of requests (bench/intake.py,
    samples with 6 or fewer jobs held where 9 were allowed: 27% of a feed's second half; 16% and 10% in two
    feeds with the bound). A slower machine is still followed: the step may double at every read."""
    running = now.running if now.running_before is None else (now.running + now.running_before) / 2
    if running > 0 and now.generated_now > 0 and now.seconds > 0:
        step = now.seconds * running / now.generated_now
        return step if before is None else (before + min(step, STALL_GROWTH * before)) / 2
    if before is not None:
        return before
    if recent is not None and recent.generated > 0 and recent.engine_seconds > 0:
        return recent.engine_seconds / recent.generated
    return None


def first(bounds: Bounds) -> Limit:
    """The limit before the engine has said anything: what the KV cache holds of full-length requests, +1."""
    if not bounds.kv_tokens or not bounds.max_model_len:
        return Limit(bounds.top, bounds.up_to(f"the capacity plan gives no KV cache size: {UP_TO_MAX_CONCURRENCY}"))
    fit = bounds.kv_tokens // bounds.max_model_len
    value = max(1, min(bounds.top, fit + 1))
    return Limit(
        value,
        f"start: the KV cache holds {bounds.kv_tokens:,} tokens, {fit} request(s) of MAX_MODEL_LEN="
        f"{bounds.max_model_len:,} tokens (+1 spare)" + _capped(bounds, fit + 1),
    )


def _capped(bounds: Bounds, wanted: int) -> str:
    """The reason's end where MAX_NUM_SEQS, not the KV cache, bounds what is taken."""
    if wanted > bounds.top and bounds.seqs_bound:
        return f"; {bounds.up_to()}"
    return ""


def _figures(now: EngineNow) -> str:
    return f"{now.running} running, {now.waiting} waiting, KV cache {now.kv_cache_usage:.0%} used"


def decide(current: Limit, now: EngineNow | None, bounds: Bounds) -> Limit:
    """The limit after one read of the engine: the room and the pace the recent requests give (`room_and_pace`),
    within what the engine has shown room for, with a few jobs to wait inside it (`bounded`)."""
    return bounded(room_and_pace(current, now, bounds), now, bounds)


def room_and_pace(current: Limit, now: EngineNow | None, bounds: Bounds) -> Limit:
    """What the recent requests say: the requests the KV cache holds to their end beside what runs (the room),
    and past it, paced, what it holds at their peaks (the target)."""
    top = bounds.top
    if now is None:
        return Limit(top, bounds.up_to(NO_FIGURES_REASON), recent=current.recent, token_s=current.token_s)
    lately = recent(current.recent, now)
    step = token_seconds(current.token_s, now, lately)
    kv = bounds.kv_tokens or now.kv_tokens
    length = lately.length if lately is not None else bounds.max_model_len
    if not kv or not length or length <= 0:
        return Limit(top, bounds.up_to(NO_KV_REASON), waiting=now.waiting, recent=lately, token_s=step)
    block = now.block_size or 1
    stale = lately is not None and outgrown(now, kv, lately.length, block) and bool(bounds.max_model_len)
    if stale:
        # The jobs have changed: what the recent requests said is forgotten, and until the new ones end the room
        # is for the longest, with neither growth nor a buffer (either would be admitted by vLLM now, and
        # preempted when the requests grow).
        assert bounds.max_model_len is not None
        length, lately = bounds.max_model_len, None
    fits = room(now, kv, length)
    value = max(1, min(top, now.running + fits))
    # MAX_NUM_SEQS running and the cache not the bound: what waits in vLLM waits for a slot (the one more taken
    # on purpose), so nothing is held back for it, and a job taken now starts only when a request ends, at
    # their own spread: not paced either (paced, the one more came a pace after the last end, too late).
    at_seqs = bounds.seqs_bound and bounds.max_num_seqs is not None and now.running >= bounds.max_num_seqs and value >= top
    reason = f"{_figures(now)}: the KV cache holds {fits} more request(s) of {length:,.0f} tokens to their end"
    if stale:
        reason += " (the running requests already hold more than the recent ones held to their end)"
    target = pace = None
    wanted = now.running + fits
    average = held_on_average(kv, lately, block) if lately is not None else 0.0
    if not at_seqs and lately is not None and step is not None and average > 0 and lately.generated / average * step > 0:
        peaks = paced_target(kv, lately, block)
        wanted = max(wanted, peaks)
        target = max(value, min(top, peaks))
        # Running at once on average: what the cache holds, or fewer where vLLM runs no more (MAX_NUM_SEQS).
        spread = min(average, bounds.max_num_seqs) if bounds.seqs_bound and bounds.max_num_seqs else average
        apart = lately.generated / spread
        pace = apart * step
        if target > value:
            over = f"the {average:.1f} the cache holds on average" if spread == average else f"the {spread} run at most"
            reason += (
                f"; paced: one more every {pace:.2f} s ({apart:.0f} tokens of a running request apart: a recent "
                f"request's {lately.generated:.0f} generated tokens over {over}, "
                f"at {step * 1000:.1f} ms a token now) up to {target}, what it holds at their peaks"
                + (f", once more jobs have ended than the {now.waiting} request(s) waiting inside the engine" if now.waiting else "")
            )
    reason += _capped(bounds, wanted)
    if now.preempted > 0:
        reason += f" ({now.preempted} preempted since the last read)"
    waiting = 0 if at_seqs else now.waiting
    return Limit(value, reason, target, pace, waiting, lately, step)


def bounded(rule: Limit, now: EngineNow | None, bounds: Bounds) -> Limit:
    """`rule` within what the engine has shown room for (`shown_room`), and `buffer_for` jobs more to wait inside it.

    Before any request has ended, or since the jobs changed (`rule.recent` forgotten), nothing is known of their
    lengths: the room for the longest is all the engine has shown, and nothing waits inside it on purpose."""
    kv = (bounds.kv_tokens or now.kv_tokens) if now is not None else None
    if now is None or not kv:
        return rule
    top = bounds.top
    known = rule.recent is not None
    # Jobs wait inside vLLM only where it has no room for them: where the rule sees room, vLLM would start them
    # at once, and the "buffer" would be growth without evidence.
    full = rule.value <= max(1, now.running)
    kept = buffer_for(bounds, now.finished, now.seconds, now.preempted) if known and full else 0
    shown = shown_room(now, kv, bounds.max_model_len, grow=known) + kept
    # Nor past the paced target on the room's side (the rule's target is never below its room): requests running at
    # or past what the cache holds at their peaks leave none for one more to wait.
    ceiling = top if rule.target is None else rule.target
    wanted = min(top, rule.value + kept if rule.target is None else rule.target)
    value = max(1, min(top, rule.value + kept, ceiling, shown))
    # The buffer is on the room, not on the paced target: that is what the cache holds at the requests' peaks, and a
    # request kept waiting past it is admitted by vLLM between the peaks and preempted at the next one.
    target = None if rule.target is None else max(value, min(top, rule.target, shown))
    reason = rule.reason
    if shown < wanted:
        reason += f"; at most {shown} held: the engine has shown room for {shown - kept}" + (f", and {kept} to wait in it" if kept else "")
    elif kept:
        reason += f"; {kept} more to wait inside the engine, refilled by it as a request ends"
    return replace(rule, value=value, reason=reason, target=target, waiting=max(0, rule.waiting - kept))


def allowed(
    limit: Limit, held: int, last_take: float | None, at: float, full_at: float | None = None, ended_since_read: int = 0
) -> int:
    """Jobs the worker may hold at `at`, having `held`, having last been allowed more at `last_take` and last
    held all it was allowed at `full_at`.

    Past the room, one more at a time, a pace apart, and none while the last read saw requests waiting in
    vLLM, unless more jobs have `ended_since_read` than waited then: each ended job's blocks let vLLM start
    one that waited at its next step (a preempted request needs no more than a whole one held), the one
    more leaves room for a new job, and the next read is up to POLL_S away (in tests/support/kv_model.py a
    worker that waited for it held 11 jobs for seconds at a time where its target was 13). Any one end
    was not enough: on the real CPU engine a burst of 40 then held 4 to 7 taken jobs that vLLM was not
    running (p95; tests/engine/test_intake_real_engine.py), behind the preempted ones. Within the room,
    all at once, unless the worker held all it was allowed less than a request's time in the engine ago:
    a worker that is kept full refills paced too, or the requests a drained engine takes back together
    would end together again.
    Never fewer than it holds: runpod 1.12's job loop starts a job it has taken only while it runs fewer
    than this figure, so a figure below `held` would leave a taken job unstarted in the worker."""
    target, pace = limit.target, limit.pace_s
    if target is None or pace is None:
        return max(held, limit.value)
    life = limit.life_s
    busy = full_at is not None and life is not None and at - full_at < life
    if held < limit.value and not busy:
        return limit.value
    due = last_take is None or at - last_take >= pace
    waiting = limit.waiting > 0 and ended_since_read <= limit.waiting
    return held + 1 if due and held < target and not waiting else held


def bounds_from(
    plan: Mapping[str, Any] | None, max_concurrency: int, max_num_seqs: int | None = None, buffer: int | None = None
) -> Bounds:
    """The bounds from the capacity plan's report of the ready engine (capacity.ready_engine_report): its KV
    tokens and max_model_len as the engine reported them, else the plan's prediction; `max_num_seqs` as the
    engine was launched with it (None: unknown)."""
    plan = plan if isinstance(plan, Mapping) else {}

    def whole(name: str) -> int | None:
        value = plan.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

    return Bounds(
        max_concurrency, whole("kv_cache_tokens") or whole("predicted_kv_cache_tokens"), whole("max_model_len"), max_num_seqs, buffer
    )


def _shown(limit: Limit) -> tuple[int, int | None]:
    """What a log line says of a limit: the jobs taken at once, and the paced target where it is above them."""
    return limit.value, limit.target if limit.target is not None and limit.target > limit.value else None


class Intake:
    """The worker's current limit: decided in the load watch's thread at each read, asked by the job loop
    before each take (`allowed_now`) and by the status job.

    adaptive=False: MAX_CONCURRENCY always, as before this existed.
    """

    def __init__(
        self,
        bounds: Callable[[], Bounds],
        adaptive: bool = True,
        held: Callable[[], int] = lambda: 0,
        clock: Callable[[], float] | None = None,
        finished: Callable[[], int] = lambda: 0,
    ) -> None:
        self.bounds = bounds
        self.adaptive = adaptive
        self.held = held  # set by serving.platform once the job loop runs
        # Of those, the jobs whose request the engine has finished (answers being posted): set by serving.platform.
        self.finished = finished
        self.clock = clock or time.monotonic
        self._lock = threading.Lock()
        start = bounds()
        self._limit = first(start) if adaptive else Limit(max(1, start.max_concurrency), OFF_REASON)
        self._last_take: float | None = None
        self._full_at: float | None = None
        self._seen_held = 0  # held at the last take's question
        self._ended_since_read = 0  # jobs that ended after the last read: as many of what waited then have likely started
        self._engine: dict[str, Any] | None = None
        self._logged_at: float | None = None
        self._logged = _shown(self._limit)
        self._changes = 0

    @property
    def value(self) -> int:
        return self._limit.value

    def observe(self, now: EngineNow | None, at: float) -> Limit:
        """One read of the engine; returns the limit after it."""
        if not self.adaptive:
            return self._limit
        held = self.held()
        with self._lock:
            before = self._limit
            self._limit = decide(before, now, self.bounds())
            self._engine = None if now is None else {
                "running": now.running,
                "waiting": now.waiting,
                "kv_cache_usage": round(now.kv_cache_usage, 4),
                "preempted_since_last_read": now.preempted,
                "held_by_worker": held,
            }
            after = self._limit
            self._ended_since_read = 0
        if _shown(after) != _shown(before):
            self._changes += 1
        if _shown(after) != self._logged and (self._logged_at is None or at - self._logged_at >= LOG_EVERY_S):
            since = f"; {self._changes} changes since the last line" if self._changes > 1 else ""
            paced = f", then one at a time up to {after.target}" if after.target is not None and after.target > after.value else ""
            log.info("taking up to %d job(s) at once%s (was %d%s): %s", after.value, paced, self._logged[0], since, after.reason)
            self._logged_at, self._logged, self._changes = at, _shown(after), 0
        return after

    def allowed_now(self) -> int:
        """What the job loop may hold now (asked before every take): a paced take counts from when it was allowed.

        The decision counts the jobs in the engine: a job the engine has finished holds no KV cache while its
        answer is posted (on two busy cores, seconds: runpod 1.12 awaits a post per part), so its slot goes to
        the next job at once, and the figure given to the SDK adds the finished ones back."""
        if not self.adaptive:
            return self._limit.value
        at, all_held = self.clock(), self.held()
        answering = min(all_held, max(0, self.finished()))
        held = all_held - answering
        with self._lock:
            limit = self._limit
            if held < self._seen_held:  # a take and an end between two questions show as neither: counted short
                self._ended_since_read += self._seen_held - held
            self._seen_held = held
            if held >= (limit.value if limit.target is None else limit.target):
                self._full_at = at
            value = allowed(limit, held, self._last_take, at, self._full_at, self._ended_since_read)
            if value > held:
                self._last_take = at
        return value + answering

    def status(self) -> dict[str, Any]:
        """The status job's view: the limit, why, the figures behind it, the slots left to the platform's queue."""
        with self._lock:
            limit, engine = self._limit, self._engine
        bounds = self.bounds()
        top = max(1, bounds.max_concurrency)
        lately = limit.recent
        return {
            "adaptive": self.adaptive,
            "limit": limit.value,
            "paced_up_to": limit.target,
            "pace_seconds": None if limit.pace_s is None else round(limit.pace_s, 3),
            "max_concurrency": top,
            "max_num_seqs": bounds.max_num_seqs,
            "reason": limit.reason,
            "engine": engine,
            "recent_requests": None if lately is None else {
                "prompt_tokens": round(lately.prompt, 1),
                "generated_tokens": round(lately.generated, 1),
                "engine_seconds": round(lately.engine_seconds, 3),
            },
            # Jobs a fixed worker would have taken: they stay in the platform's queue, where its scaler sees them.
            "left_in_platform_queue": max(0, top - max(limit.value, limit.target or 0)),
        }
