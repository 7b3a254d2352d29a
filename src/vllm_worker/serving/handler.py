"""The Runpod job handler: turns one job into requests to the supervised engine, and their answers into the job's.

Why it is shaped this way:

- Users read nothing but the job's response. The runpod 1.12 SDK turns a yielded dict with a
  truthy "error" into the job result ``{"error": str(value)}`` and turns an escaped exception into
  "handler: ... traceback ...", so every expected failure is yielded as ``{"error": "<one
  sentence>"}`` (serving.answers) and never raised.
- vLLM already speaks OpenAI over HTTP: job_input turns the job into a route and a body,
  serving.exchange sends it once and relays the answer (a stream as whole SSE events, a few posts
  a second), and says how it ended.
- When a request fails, serving.after_death decides what the job does next (answer, send again,
  continue on the restarted engine from the tokens its client was sent, finish), a pure decision
  over typed facts; serving.relayed_job holds what the job sends and has sent. This loop only
  carries out the step.
- One aiohttp session per process, with a pool sized for MAX_CONCURRENCY: a session per request
  would open a new TCP connection for every job.
- ``main`` owns the engine's lifecycle and tells the handler about it through one module-level
  ``WorkerState`` (fatal error, readiness gate, degraded profile, the last death as a typed
  record), set with ``configure``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, AsyncGenerator, Mapping

import aiohttp

from vllm_worker.serving import after_death, engine_load
from vllm_worker.serving.answers import NOT_CONFIGURED, not_ready_sentence
from vllm_worker.serving.exchange import Outcome, client_timeout, exchange
from vllm_worker.serving.job_input import InputError, is_status_request, normalize_input
from vllm_worker.serving.relayed_job import RelayedJob
from vllm_worker.serving.state import STOPPED, Death, WorkerState

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- state


def interrupt_running(state: WorkerState, sentence: str) -> int:
    """End every job still running on the engine with `sentence`, at once; returns the connections cut.

    Runs in the job loop's thread. The jobs' requests to the engine are cut (vLLM aborts a request
    whose client went away), and a request that fails that way reads `sentence` from the state's
    death record (no engine died: nothing is continued). The connections in use are the
    connector's; aiohttp has no public list.
    """
    state.record_death(Death(sentence, STOPPED, restarted=False))
    session = _session
    connector = session.connector if session is not None else None
    cut = 0
    for protocol in list(getattr(connector, "_acquired", ())):
        transport = getattr(protocol, "transport", None)
        if transport is not None:
            transport.abort()
            cut += 1
    return cut


_state: WorkerState | None = None


def configure(state: WorkerState) -> None:
    """Install the state every later job reads (main calls this; calling again replaces it)."""
    global _state
    _state = state


def startup_phases(status: Mapping[str, Any]) -> dict[str, Any] | None:
    """Where the start's time went: the worker's steps once, then each launch's (memory wait and the
    engine's phases read from its lines: engine.startup_phases). A phase not reported is absent;
    None before anything was timed."""
    records = status.get("launches")
    launches = [
        {"launch": record.get("launch"), **record["phases"]}
        for record in (records if isinstance(records, list) else [])
        if isinstance(record, Mapping) and isinstance(record.get("phases"), Mapping)
    ]
    if not launches and "worker_phases" not in status:
        return None
    return {"worker": dict(status.get("worker_phases") or {}), "launches": launches}


def status_report(state: WorkerState) -> dict[str, Any]:
    """What a status job answers: main's status dict, plus the live model, profile, readiness and fatal error.

    Never has an "error" key: the SDK would turn the answer into a job error.
    """
    report = dict(state.status)
    report.pop("error", None)
    phases = startup_phases(report)
    if phases is not None:
        report["startup_phases"] = phases
    report["served_model_name"] = state.served_model_name
    if state.profile is not None or "profile" not in report:
        report["profile"] = state.profile
    report["ready"] = state.ready.is_set()
    report["fatal"] = state.fatal
    report["continuations"] = state.continuations()
    return report


async def _status_answer(state: WorkerState) -> dict[str, Any]:
    report = status_report(state)
    if state.load_watch is not None:
        report["load"] = state.load_watch.status(*await _read_load(state)) if state.ready.is_set() else None
        # How many jobs the worker takes now and why (serving.intake).
        report["intake"] = state.load_watch.intake.status() if state.load_watch.intake is not None else None
    return report


# --------------------------------------------------------------------------- HTTP session


_session: aiohttp.ClientSession | None = None
_session_loop: asyncio.AbstractEventLoop | None = None
_session_limit = 0
_SPARE_CONNECTIONS = 4  # status/health probes beside MAX_CONCURRENCY jobs
# vLLM's API server closes a connection idle for VLLM_HTTP_TIMEOUT_KEEP_ALIVE (5 s by default); one the
# pool reuses just as the server closes it fails before any answer (aiohttp's ServerDisconnectedError,
# answered as an engine that closed the connection). The pool drops its own idle connections sooner.
_KEEPALIVE_S = 3.0


def _get_session(state: WorkerState) -> aiohttp.ClientSession:
    """The process's one session, created inside the running loop (runpod runs its own)."""
    global _session, _session_loop, _session_limit
    loop = asyncio.get_running_loop()
    limit = state.max_concurrency + _SPARE_CONNECTIONS
    session = _session
    if session is not None and _session_loop is loop and _session_limit == limit and not session.closed:
        return session
    if session is not None and not session.closed and _session_loop is loop:
        loop.create_task(session.close())  # MAX_CONCURRENCY changed: requests still on it may finish
    connector = aiohttp.TCPConnector(limit=limit, limit_per_host=0, keepalive_timeout=_KEEPALIVE_S)
    _session = aiohttp.ClientSession(connector=connector, raise_for_status=False)
    _session_loop = loop
    _session_limit = limit
    return _session


async def close_session() -> None:
    """Close the shared session (main's shutdown; tests between event loops)."""
    global _session, _session_loop
    session, _session, _session_loop = _session, None, None
    if session is not None and not session.closed:
        try:
            await session.close()
        except RuntimeError:  # created in a loop that is already closed
            pass


# --------------------------------------------------------------------------- handler


_READY_POLL_S = 0.05


async def _wait_ready(state: WorkerState) -> str | None:
    """None once the engine is ready; an error sentence if it is fatal or not ready in time."""
    deadline = time.monotonic() + state.ready_timeout
    while not state.ready.is_set():
        if state.fatal:
            return state.fatal
        if state.stopping:
            return state.stopping
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return not_ready_sentence(state.ready_timeout)
        await asyncio.sleep(min(_READY_POLL_S, remaining))
    return state.fatal


async def _death_since(state: WorkerState, deaths_seen: int, answers_seen: int) -> Death | None:
    """The death main records after a request failed the way a dying engine fails; None once the engine has
    answered /health on a check begun after the failure, the worker stops, or the monitor's longest time to a
    verdict has passed.

    Why the monitor's answer and not a clock: a dead engine core under a live API server is a 503 at the
    monitor's next check, and on a loaded machine that came after the 3 s this wait once was (a clean-clone
    CI run, 2026-12-07, answered such a job with vLLM's "EngineCore encountered an issue"). Two answers
    counted since the failure: the first may come from a check begun before it."""
    deadline = time.monotonic() + state.verdict_within
    while state.deaths == deaths_seen:
        if state.health_answers >= answers_seen + 2 or state.stopping or time.monotonic() >= deadline:
            return None
        await asyncio.sleep(_READY_POLL_S)
    return state.death


async def _read_load(state: WorkerState) -> tuple[engine_load.Sample | None, bool]:
    """A fresh read of vLLM's /metrics for the status job: (None when it gives no figures, whether it answered)."""
    try:
        url = engine_load.metrics_url(state.host, state.port)
        async with _get_session(state).get(url, timeout=client_timeout(engine_load.STATUS_READ_TIMEOUT_S)) as response:
            text = await response.text() if response.status == 200 else ""
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None, False
    return engine_load.parse(text, time.monotonic()), True


def _worker(state: WorkerState) -> after_death.Worker:
    return after_death.Worker(state.ready.is_set(), state.stopping is not None, bool(state.fatal), state.request_timeout)


async def handler(job: dict[str, Any]) -> AsyncGenerator[Any, None]:
    """Runpod entry point: relay one job to the engine, yielding its answer or {"error": sentence}."""
    state = _state
    if state is None:
        yield {"error": NOT_CONFIGURED}
        return
    job_input = job.get("input") if isinstance(job, dict) else None
    if is_status_request(job_input):
        yield await _status_answer(state)
        return
    if state.fatal or state.stopping:
        yield {"error": state.fatal or state.stopping}
        return
    try:
        relayed = RelayedJob(normalize_input(job_input, state.served_model_name, state.default_max_tokens), job)
    except InputError as error:
        yield {"error": str(error)}
        return
    while True:
        problem = await _wait_ready(state) if not state.ready.is_set() else None
        if problem:
            yield {"error": problem}
            return
        deaths_seen = state.deaths
        session = _get_session(state)
        outcome = Outcome()
        # The relay's posts come a few a second (serving.stream_relay), so its generator layers cost next to nothing.
        async for post in exchange(session, await relayed.next_send(state, session), relayed.relay(state), outcome):
            yield post
        if outcome.failed is None:
            break
        answers_seen = state.health_answers
        step = after_death.decide(outcome.failed, relayed.facts(), _worker(state))
        if isinstance(step, after_death.Confirm):
            death = await _death_since(state, deaths_seen, answers_seen)
            step = after_death.decide(outcome.failed, relayed.facts(), _worker(state), death, confirmed=True)
            assert not isinstance(step, after_death.Confirm)  # a confirmed decision never asks again
        if isinstance(step, after_death.Answer):
            if step.not_continued is not None:
                state.count_continuation(step.not_continued)
            yield {"error": step.sentence}
            return
        if not isinstance(step, after_death.Retry):
            state.count_continuation(None)
        if isinstance(step, after_death.Finish):
            yield relayed.finish(state)
            return
        relayed.take(step)
    if outcome.raw is not None:
        yield relayed.plain_answer(outcome.raw, state)
