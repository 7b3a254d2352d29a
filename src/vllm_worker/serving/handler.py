"""The Runpod job handler: turns one job into one HTTP request to the supervised engine.

Why it is shaped this way:

- Users read nothing but the job's response. The runpod 1.12 SDK turns a yielded
  dict with a truthy "error" into the job result ``{"error": str(value)}`` and
  turns an escaped exception into "handler: ... traceback ...", so every expected
  failure (bad input, engine down, timeout, HTTP error) is yielded as
  ``{"error": "<one sentence>"}`` and never raised.
- vLLM already speaks OpenAI over HTTP; job_input turns the job into a route and a
  body, and the handler adds only what needs the engine (the context length a shorthand
  job's max_tokens runs to, read once from /v1/models) and relays the answer. Audio goes
  as multipart form data. Streams are relayed as whole SSE events (an
  event is never split across two yielded chunks) without parsing their JSON (a
  stream that could be continued has its token ids read by a regular expression), so
  the proxy costs next to nothing per token; what vLLM sent is posted at most every
  STREAM_POST_EVERY_S, the first events at once, since every post is an HTTP request.
- One aiohttp session per process, with a pool sized for MAX_CONCURRENCY: a session
  per request would open a new TCP connection for every job.
- ``main`` owns the engine's lifecycle and tells the handler about it through one
  module-level ``WorkerState`` (fatal error, readiness gate, degraded profile,
  status), set with ``configure``.
- When the engine dies under running requests, main records the death in that state. A
  request that failed the way a dying engine fails (dropped connection, vLLM's
  EngineDeadError) waits a moment for that record and ends with its sentence, which names
  the cause, rather than a bare connection error; one that never reached the engine is sent
  again to the restarted engine.
- A streamed or plain completion or chat completion that was running when the engine died or
  hung is continued on the relaunched engine where that is the same request
  (serving.continuation: a stream goes on from the tokens its client was sent, a plain job or
  a stream whose client was sent nothing is sent again whole), once, and its response says so
  (`worker.continued`, a `: worker` comment in a stream); otherwise it ends with the death's
  sentence and why it was not.
- A cancel closes the job's request to the engine whatever the job's generator is doing: the
  SDK cancels the task that drives it, which may be posting a chunk while the generator waits
  at a `yield` (and so never sees the cancel); a callback on that task closes the response.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from typing import Any, AsyncGenerator, Mapping

import aiohttp

from vllm_worker.diagnosis.runtime import ENGINE_DEAD_TEXT
from vllm_worker.serving import continuation, engine_load
from vllm_worker.serving.job_input import (
    AUDIO_ROUTES,
    POOLING_ROUTES,
    InputError,
    audio_form_fields,
    is_status_request,
    normalize_input,
    route_template,
    with_context_budget,
)
from vllm_worker.serving.state import WorkerState
from vllm_worker.serving.stream_relay import STREAM_POST_EVERY_S, SSEFramer, coalesced, event_data, split_events

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- state


def interrupt_running(state: WorkerState, sentence: str) -> int:
    """End every job still running on the engine with `sentence`, at once; returns the connections cut.

    Runs in the job loop's thread. The jobs' requests to the engine are cut (vLLM aborts a request
    whose client went away), and a request that fails that way reads `sentence` from the state,
    as it reads a death's. The connections in use are the connector's; aiohttp has no public list.
    """
    state.stop_cut = sentence
    state.record_death(sentence)
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


def worker_notice(profile: dict[str, Any]) -> dict[str, Any]:
    """The object added as "worker" to JSON bodies (and sent as an SSE comment) in degraded mode."""
    return {"degraded": True, "profile": profile}


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


# --------------------------------------------------------------------------- SSE


def stream_error(batch: str) -> tuple[str, str | None]:
    """Split a batch at the first event carrying an engine error: (events before it, sentence or None)."""
    if '"error"' not in batch:
        return batch, None
    events = split_events(batch)
    for i, event in enumerate(events):
        data = event_data(event)
        if '"error"' not in data:
            continue
        try:
            payload = json.loads(data)
        except ValueError:
            continue
        if isinstance(payload, dict) and payload.get("error"):
            code = _error_code(payload) or 500
            return "".join(events[:i]), error_sentence_from_response(code, data, streaming=True)
    return batch, None


# --------------------------------------------------------------------------- error sentences


_MAX_MESSAGE = 1500


def _clean(message: str) -> str:
    text = " ".join(str(message).split())
    if len(text) > _MAX_MESSAGE:
        text = text[: _MAX_MESSAGE - 3] + "..."
    return text


def _error_code(payload: dict[str, Any]) -> int | None:
    error = payload.get("error")
    code = error.get("code") if isinstance(error, dict) else payload.get("code")
    return code if isinstance(code, int) and 100 <= code <= 599 else None


def _payload_message(payload: Any) -> str | None:
    if isinstance(payload, dict):
        error = payload.get("error")
        if isinstance(error, dict) and error.get("message"):
            return _clean(error["message"])
        if isinstance(error, str) and error:
            return _clean(error)
        for key in ("detail", "message"):
            value = payload.get(key)
            if isinstance(value, str) and value:
                return _clean(value)
            if value:
                return _clean(json.dumps(value))
        if error:
            return _clean(json.dumps(error))
    return None


def _error_message(body_text: str) -> str:
    try:
        payload = json.loads(body_text)
    except ValueError:
        return _clean(body_text)
    message = _payload_message(payload)
    return _clean(body_text) if message is None else message


def answered_error_sentence(payload: dict[str, Any]) -> str:
    """A 200 answer whose body carries an "error" (e.g. a failed /v1/responses object).

    Yielded as-is, the SDK would deliver str(dict), a Python repr; this is the sentence instead.
    """
    return f"The engine answered with an error: {_payload_message(payload)}"


def error_sentence_from_response(status: int, body_text: str, path: str | None = None, *, streaming: bool = False) -> str:
    """One readable sentence for an engine error answer (vLLM's {"error": {"message": ...}} or other)."""
    message = _error_message(body_text)
    if status == 404 and path is not None and message in ("", "Not Found"):
        template = route_template(path)
        if template == "/v1/embeddings":
            kind = "an embedding (pooling) model"
        elif template in POOLING_ROUTES:
            kind = "a pooling model (embedding, classification or scoring)"
        elif template in AUDIO_ROUTES:
            kind = "a speech-to-text model"
        else:
            kind = "a model of another kind"
        return f"The engine does not serve {path} for the model it runs (HTTP 404 Not Found); that route needs {kind}."
    if streaming:
        lead = f"The engine stopped the streamed response with an error (HTTP {status})"
    elif status >= 500:
        lead = f"The engine failed while handling the request (HTTP {status})"
    else:
        lead = f"The engine rejected the request (HTTP {status})"
    if not message:
        return f"{lead} and gave no reason."
    return f"{lead}: {message}"


def unreachable_sentence(host: str, port: int, reason: str) -> str:
    return (
        f"The engine is not reachable at {host}:{port} ({reason}); it has stopped or is restarting, "
        f"so retry the request, and if this persists the worker's log shows why the engine stopped."
    )


def dropped_sentence(host: str, port: int, midway: bool) -> str:
    when = "in the middle of its response" if midway else "before answering"
    return (
        f"The engine at {host}:{port} closed the connection {when}, which usually means the engine "
        f"process died; retry the request, and if this persists the worker's log shows why."
    )


def timeout_sentence(request_timeout: float) -> str:
    return (
        f"The engine did not finish answering within REQUEST_TIMEOUT={request_timeout:g} seconds; "
        f"raise REQUEST_TIMEOUT, or ask for fewer tokens (max_tokens)."
    )


def not_ready_sentence(ready_timeout: float) -> str:
    return (
        f"The engine was not ready within WORKER_READY_TIMEOUT={ready_timeout:g} seconds "
        f"(it is starting or restarting); retry the request later, or raise WORKER_READY_TIMEOUT."
    )


NOT_CONFIGURED = "The worker received a job before it finished starting; retry the request."


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


@functools.lru_cache(maxsize=8)
def _timeout(total: float) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(total=total)


_JSON_HEADERS = {"Content-Type": "application/json"}
_DONE = "data: [DONE]\n\n"
_READY_POLL_S = 0.05
# How long a request that failed the way a dying engine fails waits for main to confirm the death:
# main sees an exit at once and a 503 from /health within its poll interval (about a second).
DEATH_CONFIRM_S = 3.0


def _with_notice(output: Any, state: WorkerState) -> Any:
    if state.profile is not None and isinstance(output, dict):
        output["worker"] = worker_notice(state.profile)
    return output


def _decode_body(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace") if raw.strip() else {}


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


async def _death_since(state: WorkerState, deaths_seen: int) -> str | None:
    """The death sentence if main records an engine death (since `deaths_seen`) within DEATH_CONFIRM_S."""
    deadline = time.monotonic() + DEATH_CONFIRM_S
    while state.deaths == deaths_seen:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        await asyncio.sleep(min(_READY_POLL_S, remaining))
    return state.death


def _transport_sentence(error: BaseException, state: WorkerState, started: bool) -> str:
    if isinstance(error, asyncio.TimeoutError):
        return timeout_sentence(state.request_timeout)
    if isinstance(error, aiohttp.ClientConnectorError):
        os_error = error.os_error
        if isinstance(os_error, ConnectionRefusedError):
            reason = "connection refused"
        else:
            reason = getattr(os_error, "strerror", None) or str(os_error) or type(os_error).__name__
        return unreachable_sentence(state.host, state.port, reason)
    return dropped_sentence(state.host, state.port, midway=started)


_TRANSPORT_ERRORS = (asyncio.TimeoutError, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError)


def _max_model_len(listing: Any) -> int | None:
    data = listing.get("data") if isinstance(listing, dict) else None
    for entry in data if isinstance(data, list) else []:
        length = entry.get("max_model_len") if isinstance(entry, dict) else None
        if isinstance(length, int) and not isinstance(length, bool) and length > 0:
            return length
    return None


async def _context_length(state: WorkerState, session: aiohttp.ClientSession) -> int | None:
    """The engine's max_model_len, read from /v1/models once per engine life (a restarted engine may differ)."""
    cached = state.context_length
    if cached is not None and cached[0] == state.deaths:
        return cached[1]
    deaths = state.deaths
    try:
        async with session.get(
            f"http://{state.host}:{state.port}/v1/models", timeout=_timeout(state.request_timeout)
        ) as response:
            listing = await response.json(content_type=None) if response.status == 200 else None
    except (*_TRANSPORT_ERRORS, ValueError):
        listing = None
    length = _max_model_len(listing)
    if length is None:
        log.warning("the engine's /v1/models gave no max_model_len; a job without max_tokens gets the engine's default")
        return None
    state.context_length = (deaths, length)
    return length


async def _read_load(state: WorkerState) -> tuple[engine_load.Sample | None, bool]:
    """A fresh read of vLLM's /metrics for the status job: (None when it gives no figures, whether it answered)."""
    try:
        async with _get_session(state).get(
            engine_load.metrics_url(state.host, state.port), timeout=_timeout(engine_load.STATUS_READ_TIMEOUT_S)
        ) as response:
            text = await response.text() if response.status == 200 else ""
    except (*_TRANSPORT_ERRORS, ValueError):
        return None, False
    return engine_load.parse(text, time.monotonic()), True


def _form(body: dict[str, Any]) -> aiohttp.FormData:
    """A fresh multipart body (aiohttp sends a FormData only once)."""
    form = aiohttp.FormData()
    for name, value in audio_form_fields(body):
        if isinstance(value, bytes):
            form.add_field(name, value, filename="audio", content_type="application/octet-stream")
        else:
            form.add_field(name, value)
    return form


async def handler(job: dict[str, Any]) -> AsyncGenerator[Any, None]:
    """Runpod entry point: relay one job to the engine, yielding its answer or {"error": sentence}."""
    state = _state
    if state is None:
        yield {"error": NOT_CONFIGURED}
        return
    job_input = job.get("input") if isinstance(job, dict) else None

    if is_status_request(job_input):
        report = status_report(state)
        if state.load_watch is not None:
            report["load"] = state.load_watch.status(*await _read_load(state)) if state.ready.is_set() else None
            # How many jobs the worker takes now and why (serving.intake).
            report["intake"] = state.load_watch.intake.status() if state.load_watch.intake is not None else None
        yield report
        return
    if state.fatal:
        yield {"error": state.fatal}
        return
    if state.stopping:
        yield {"error": state.stopping}
        return
    try:
        request = normalize_input(job_input, state.served_model_name, state.default_max_tokens)
    except InputError as error:
        yield {"error": str(error)}
        return
    # One flat generator on purpose: every extra async-generator layer costs per relayed chunk.
    body = request.body
    is_json = body is not None and not request.form
    # A stream that could be continued asks for token ids, read off its events as they pass.
    continuable = is_json and request.path in continuation.ROUTES
    refused, ledger = continuation.for_stream(request.path, body) if continuable and request.stream else (None, None)
    sent_body = continuation.asking_for_ids(body) if ledger is not None and body is not None else body
    data: Any = json.dumps(sent_body).encode() if is_json and not request.fill_max_tokens else None
    effective = sent_body  # the body as sent, max_tokens filled in
    path = request.path
    retried = False
    resent = 0  # continuations sent (at most one)
    began = time.monotonic()
    task = asyncio.current_task()
    while True:
        deaths_seen = state.deaths
        if not state.ready.is_set():
            problem = await _wait_ready(state)
            if problem:
                yield {"error": problem}
                return
        session = _get_session(state)
        if resent and ledger is not None and ledger.continued:
            pass  # data is the continuation's body
        elif request.fill_max_tokens and sent_body is not None:
            effective = with_context_budget(sent_body, await _context_length(state, session))
            data = json.dumps(effective).encode()
        elif request.form and body is not None:
            data = _form(body)
        started = False
        connected = True
        raw: bytes | None = None
        failure: str | None = None
        left = state.request_timeout - (time.monotonic() - began) if resent else state.request_timeout
        try:
            async with session.request(
                request.method,
                f"http://{state.host}:{state.port}{path}",
                data=data,
                headers=_JSON_HEADERS if is_json else None,
                timeout=_timeout(max(left, 1.0)),
            ) as response:
                started = True
                closer = _closer(response)
                if task is not None:
                    task.add_done_callback(closer)
                try:
                    if response.status >= 400:
                        failure = error_sentence_from_response(
                            response.status, await response.text(errors="replace"), path
                        )
                    elif response.headers.get("Content-Type", "").startswith("text/event-stream"):
                        if resent:  # continued, or sent again whole where its client had been sent nothing (ledger.kept 0)
                            kept = ledger.kept if ledger is not None else 0
                            yield continuation.notice_comment(kept, continuation.last_cause(state.status), state.profile)
                        elif state.profile is not None:
                            yield ": worker " + json.dumps(worker_notice(state.profile)) + "\n\n"
                        framer = SSEFramer()
                        last = ""
                        ended = functools.partial(_engine_done, state, job)
                        async for chunk in coalesced(response.content, STREAM_POST_EVERY_S, ended):
                            batch = framer.feed_batch(chunk)
                            if not batch:
                                continue
                            if '"error"' in batch:
                                batch, failure = stream_error(batch)
                            if batch and ledger is not None:
                                batch = ledger.second(batch) if ledger.continued else ledger.first(batch)
                            if batch:
                                yield batch
                                last = batch
                            if failure is not None:
                                break
                        else:
                            rest = framer.close()
                            if rest.strip():
                                rest, failure = stream_error(rest.rstrip("\r\n") + "\n\n")
                                if rest and ledger is not None:
                                    rest = ledger.second(rest) if ledger.continued else ledger.first(rest)
                                if rest:
                                    yield rest
                                    last = rest
                            if failure is None and not (last.endswith(_DONE) or last.rstrip().endswith("[DONE]")):
                                yield _DONE
                    else:
                        raw = await response.read()
                        _engine_done(state, job)
                finally:
                    if task is not None:
                        task.remove_done_callback(closer)
            dying = failure is not None and ENGINE_DEAD_TEXT in failure
        except _TRANSPORT_ERRORS as error:
            failure = _transport_sentence(error, state, started)
            connected = not isinstance(error, aiohttp.ClientConnectorError)
            dying = not isinstance(error, asyncio.TimeoutError)
        except Exception as error:  # a bug here must still reach the user as a sentence
            log.exception("handler failed on %s %s", request.method, path)
            failure = f"The worker failed while relaying the request to {path} ({type(error).__name__}: {error})."
            dying = False
        if dying:
            # The request never reached the engine: once it is restarting, wait for it and send the request there.
            if not connected and not retried and not state.ready.is_set():
                retried = True
                continue
            death = await _death_since(state, deaths_seen)
            if death is not None:
                if not connected and not retried:
                    retried = True
                    continue
                failure = death
                if continuable and body is not None and death != state.stop_cut:
                    reason = continuation.why_not(
                        state.stopping is not None, bool(state.fatal), resent, time.monotonic() - began,
                        state.request_timeout, request.stream, refused, ledger,
                    )
                    state.count_continuation(reason)
                    if reason is not None:
                        failure = continuation.not_continued_sentence(death, reason)
                    else:
                        resent += 1
                        job_id = job.get("id") if isinstance(job, dict) else None
                        problem = await _wait_ready(state)
                        if problem:
                            yield {"error": problem}
                            return
                        if ledger is not None and ledger.prompt_ids is not None:
                            ledger.continued, ledger.kept = True, len(ledger.ids)
                            assert effective is not None
                            remaining = continuation.remaining_tokens(effective, ledger.kept)
                            log.warning(
                                "job %s continued on the restarted engine: %d tokens kept, %s to go",
                                job_id, ledger.kept, "the rest" if remaining is None else remaining,
                            )
                            if remaining is not None and remaining <= 0:
                                yield continuation.notice_comment(ledger.kept, continuation.last_cause(state.status), state.profile)
                                yield ledger.closing(effective)
                                return
                            path = continuation.COMPLETIONS
                            context = await _context_length(state, _get_session(state))
                            data = json.dumps(continuation.continuation_body(effective, ledger.chat, ledger, context)).encode()
                        else:
                            log.warning("job %s sent again whole to the restarted engine (it had received nothing yet)", job_id)
                        continue
        break
    if failure is not None:
        yield {"error": failure}
    elif raw is not None:
        output = _decode_body(raw)
        if isinstance(output, dict) and output.get("error"):
            yield {"error": answered_error_sentence(output)}
        elif resent and isinstance(output, dict):
            output["worker"] = continuation.notice(0, continuation.last_cause(state.status), state.profile)
            yield output
        else:
            yield _with_notice(output, state)


def _engine_done(state: WorkerState, job: Any) -> None:
    """The engine has sent the job's whole response: its KV cache is free while the answer is posted."""
    job_id = job.get("id") if isinstance(job, dict) else None
    if state.engine_done is not None and isinstance(job_id, str):
        state.engine_done.add(job_id)


def _closer(response: aiohttp.ClientResponse) -> Any:
    """A done callback for the job's task: its end (a cancel above all) closes the request to the engine."""

    def close(_task: Any) -> None:
        response.close()

    return close
