"""How many jobs the worker asks the platform for now: as many as the engine can start, up to MAX_CONCURRENCY.

Why: Runpod's Queue Delay scaler adds workers when jobs wait in the endpoint's queue; it sees only
jobs no worker has taken. A worker that takes MAX_CONCURRENCY jobs whatever its engine can run
hides the overflow in vLLM's own waiting queue (worker-vllm #36: "Queued amount is always 0"), so no
worker is added. Here the limit follows the engine, read from vLLM's /metrics every POLL_S:

- A preemption since the last read: the limit let in more than the KV cache holds. It drops by the
  preempted count (at least one, never below what runs, nor 1): not to what runs at that read, which
  just after a batch that started together has ended is a few, and would leave the engine half
  empty for many seconds (measured: running 1 to 4 for 15 s with 24 jobs queued).
- Requests waiting inside vLLM in two reads in a row: the engine is full. The limit drops at once to
  what it runs +1, never below 1. One read with a request waiting is a request that arrived between
  two scheduler steps.
- No request waiting, the KV cache under KV_HIGH, and the worker using its whole limit: the limit
  grows, at most once every GROW_EVERY_S and not within HOLD_S of a drop (so it does not flap), by
  the requests the KV cache holds to their end: the capacity plan's KV tokens, less what the
  running requests will need at their end (each as long as the requests' length: the mean prompt
  plus generated tokens of the requests finished so far, MAX_MODEL_LEN before any has, in whole KV
  cache blocks), against that length, less the jobs taken and not yet in the engine; at most
  doubling, and past what the engine ran when it was last full (+1) one at a time. When that is
  under one request, by one every PROBE_EVERY_S (requests that end at different times need less:
  vLLM's waiting queue and preemptions say when they do not); by 1 when the KV cache size is unknown.
- Otherwise the limit holds.

The first limit is what the KV cache holds of requests as long as MAX_MODEL_LEN (+1), so a worker
that starts with a full platform queue does not take MAX_CONCURRENCY jobs at once.
`decide` is pure; `Intake` keeps the current limit for the job loop (serving.platform) and the
status job, and logs a change at most once every LOG_EVERY_S.
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

log = logging.getLogger("vllm_worker")

POLL_S = 1.0
GROW_EVERY_S = 2.0
PROBE_EVERY_S = 20.0
HOLD_S = 5.0
KV_HIGH = 0.9
LOG_EVERY_S = 30.0
OFF_REASON = "adaptation is off (ADAPTIVE_CONCURRENCY=false): the worker takes up to MAX_CONCURRENCY jobs"
NO_FIGURES_REASON = "the engine gives no load figures (vLLM keeps none with DISABLE_LOG_STATS=true): up to MAX_CONCURRENCY"


@dataclass(frozen=True)
class Bounds:
    """What the limit is bounded by: MAX_CONCURRENCY, and the capacity plan's figures (None: unknown)."""

    max_concurrency: int
    kv_tokens: int | None = None
    max_model_len: int | None = None


@dataclass(frozen=True)
class EngineNow:
    """One read of the engine's /metrics, as the decision needs it."""

    running: int
    waiting: int
    kv_cache_usage: float  # a fraction
    preempted: int = 0  # since the previous read
    request_tokens: float | None = None  # mean prompt + generated tokens of the requests finished so far
    kv_tokens: int | None = None  # the KV cache's size as vLLM's cache_config_info gives it (when the plan has none)
    block_size: int | None = None  # the tokens of one KV cache block, from the same labels


@dataclass(frozen=True)
class Limit:
    """The current limit, why, and what the next decision needs to remember."""

    value: int
    reason: str
    changed_at: float | None = None  # when the value last changed (None: never)
    dropped_at: float | None = None  # when it last went down
    waited_before: bool = False  # requests were waiting at the previous read
    ceiling: int | None = None  # what the engine ran the last time it was full


def _fit(kv_tokens: int | None, request_tokens: float | None) -> int | None:
    if not kv_tokens or not request_tokens or request_tokens <= 0:
        return None
    return max(0, math.floor(kv_tokens / request_tokens))


def _room(now: EngineNow, held: int, kv_tokens: int | None, length: float | None) -> int | None:
    """Requests of `length` tokens the KV cache holds to their end beside the running ones (each of which
    will need `length` too, or what it holds now if more), less the jobs taken and not yet in the engine.
    A request holds whole blocks: vLLM gives the cache out in blocks of `block_size` tokens (16 on a GPU,
    128 on its CPU backend, where a request of 642 tokens holds 768)."""
    if not kv_tokens or not length or length <= 0:
        return None
    block = now.block_size if now.block_size and now.block_size > 0 else 1
    need = math.ceil(length / block - 1e-9) * block
    free = kv_tokens - max(kv_tokens * now.kv_cache_usage, now.running * need)
    return math.floor(free / need + 1e-9) - max(0, held - now.running)


def first(bounds: Bounds) -> Limit:
    """The limit before the engine has said anything: what the KV cache holds of full-length requests, +1."""
    fit = _fit(bounds.kv_tokens, bounds.max_model_len)
    if fit is None:
        return Limit(bounds.max_concurrency, "the capacity plan gives no KV cache size: up to MAX_CONCURRENCY")
    value = max(1, min(bounds.max_concurrency, fit + 1))
    return Limit(
        value,
        f"start: the KV cache holds {bounds.kv_tokens:,} tokens, {fit} request(s) of MAX_MODEL_LEN="
        f"{bounds.max_model_len:,} tokens (+1 spare)",
    )


def _figures(now: EngineNow) -> str:
    return f"{now.running} running, {now.waiting} waiting, KV cache {now.kv_cache_usage:.0%} used"


def decide(current: Limit, now: EngineNow | None, held: int, bounds: Bounds, at: float) -> Limit:
    """The limit after one read of the engine; `held`: jobs the worker has taken and not yet answered."""
    top = max(1, bounds.max_concurrency)
    if now is None:
        return _set(current, top, NO_FIGURES_REASON, at, waited=False)
    waited = now.waiting > 0
    if now.preempted > 0:
        # The limit let in more than the KV cache holds: that many fewer (at least one). Not down to what
        # runs at this read: requests started together end together, and a read just after a batch ended
        # would cut the limit to the few still running and leave the engine half empty for many seconds.
        target = max(1, min(top, current.value - 1, max(now.running, current.value - now.preempted)))
        cause = f"the engine preempted {now.preempted} request(s) ({_figures(now)})"
        return _lower(current, target, target, cause, f"{current.value - target} fewer", at, waited)
    if waited and current.waited_before:
        target = max(1, min(top, now.running + 1))
        cause = f"requests wait inside the engine ({_figures(now)})"
        return _lower(current, target, now.running, cause, "taking what it runs +1", at, waited)
    if waited or now.kv_cache_usage >= KV_HIGH or held < current.value or current.value >= top:
        return replace(current, waited_before=waited)
    if current.changed_at is not None and at - current.changed_at < GROW_EVERY_S:
        return replace(current, waited_before=waited)
    if current.dropped_at is not None and at - current.dropped_at < HOLD_S:
        return replace(current, waited_before=waited)
    length = now.request_tokens or bounds.max_model_len
    room = _room(now, held, bounds.kv_tokens or now.kv_tokens, length)
    if room is None:
        step, why = 1, "the engine has room"
    elif room >= 1:
        step = min(room, current.value)
        why = f"the KV cache holds about {room} more request(s) of {length:,.0f} tokens to their end"
    elif current.changed_at is None or at - current.changed_at >= PROBE_EVERY_S:
        # Requests that end at different times need less than that: one more, slowly, while vLLM copes.
        step, why = 1, "the engine copes with what it runs: one more"
    else:
        return replace(current, waited_before=waited)
    target = min(top, current.value + step)
    if current.ceiling is not None and target > current.ceiling + 1:
        # Past what the engine ran when it was last full: one more at a time.
        target = min(target, max(current.ceiling + 1, current.value + 1))
    return _set(current, target, f"{why} ({_figures(now)})", at, waited)


def _lower(current: Limit, target: int, ceiling: int, cause: str, how: str, at: float, waited: bool) -> Limit:
    """The engine is full: down to `target` (`how`), or holding if the limit is already that low; the
    growth ceiling is `ceiling` from now on."""
    full = replace(current, ceiling=ceiling)
    if target < current.value:
        return _set(full, target, f"{cause}: {how}", at, waited)
    return _set(full, current.value, f"{cause}: holding", at, waited)


def _set(current: Limit, value: int, reason: str, at: float, waited: bool) -> Limit:
    if value == current.value:
        return replace(current, reason=reason, waited_before=waited)
    dropped = at if value < current.value else current.dropped_at
    return replace(current, value=value, reason=reason, changed_at=at, dropped_at=dropped, waited_before=waited)


def bounds_from(status: Mapping[str, Any], max_concurrency: int) -> Bounds:
    """The bounds from the status the worker keeps: the capacity plan's KV tokens and max_model_len as the
    engine reported them at its start (a restart's new figures are read again)."""
    plan = status.get("capacity_plan")
    plan = plan if isinstance(plan, Mapping) else {}

    def whole(name: str) -> int | None:
        value = plan.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

    return Bounds(max_concurrency, whole("kv_cache_tokens") or whole("predicted_kv_cache_tokens"), whole("max_model_len"))


class Intake:
    """The worker's current limit: decided in the load watch's thread, read by the job loop and the status job.

    adaptive=False: MAX_CONCURRENCY always, as before this existed.
    """

    def __init__(self, bounds: Callable[[], Bounds], adaptive: bool = True, held: Callable[[], int] = lambda: 0) -> None:
        self.bounds = bounds
        self.adaptive = adaptive
        self.held = held  # set by serving.platform once the job loop runs
        self._lock = threading.Lock()
        start = bounds()
        self._limit = first(start) if adaptive else Limit(max(1, start.max_concurrency), OFF_REASON)
        self._engine: dict[str, Any] | None = None
        self._logged_at: float | None = None
        self._logged_value = self._limit.value
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
            self._limit = decide(before, now, held, self.bounds(), at)
            self._engine = None if now is None else {
                "running": now.running,
                "waiting": now.waiting,
                "kv_cache_usage": round(now.kv_cache_usage, 4),
                "preempted_since_last_read": now.preempted,
                "request_tokens": None if now.request_tokens is None else round(now.request_tokens, 1),
                "held_by_worker": held,
            }
            after = self._limit
        if after.value != before.value:
            self._changes += 1
        if after.value != self._logged_value and (self._logged_at is None or at - self._logged_at >= LOG_EVERY_S):
            since = f"; {self._changes} changes since the last line" if self._changes > 1 else ""
            log.info("taking up to %d job(s) at once (was %d%s): %s", after.value, self._logged_value, since, after.reason)
            self._logged_at, self._logged_value, self._changes = at, after.value, 0
        return after

    def status(self) -> dict[str, Any]:
        """The status job's view: the limit, why, the figures behind it, the slots left to the platform's queue."""
        with self._lock:
            limit, engine = self._limit, self._engine
        top = max(1, self.bounds().max_concurrency)
        return {
            "adaptive": self.adaptive,
            "limit": limit.value,
            "max_concurrency": top,
            "reason": limit.reason,
            "engine": engine,
            # Jobs a fixed worker would have taken: they stay in the platform's queue, where its scaler sees them.
            "left_in_platform_queue": max(0, top - limit.value),
        }
