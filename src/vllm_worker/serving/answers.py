"""What a job is told: every sentence of the job path, written once (the handler, the relay, tests).

Why a module of its own: a user reads nothing but the job's response, so each failure is one
sentence naming the cause, the value and the fix; an engine's error body (vLLM's
{"error": {"message": ...}}, FastAPI's {"detail": ...}) becomes that sentence, never a Python repr.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from vllm_worker.serving.job_input import AUDIO_ROUTES, POOLING_ROUTES, route_template
from vllm_worker.serving.stream_relay import event_data, split_events


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


def timeout_sentence(request_timeout: float, left: float | None = None) -> str:
    """The request's own budget ran out: REQUEST_TIMEOUT, or (`left`) what was left of it for the request
    that continued the job on a restarted engine."""
    within = f"REQUEST_TIMEOUT={request_timeout:g} seconds"
    if left is not None:
        within = f"the {left:.3g} seconds left of {within} when it was continued on the restarted engine"
    return f"The engine did not finish answering within {within}; raise REQUEST_TIMEOUT, or ask for fewer tokens (max_tokens)."


def transport_sentence(error: BaseException, host: str, port: int, started: bool) -> str:
    """A request that failed below HTTP (never a timeout: the caller names the budget that ran out)."""
    if isinstance(error, aiohttp.ClientConnectorError):
        os_error = error.os_error
        if isinstance(os_error, ConnectionRefusedError):
            reason = "connection refused"
        else:
            reason = getattr(os_error, "strerror", None) or str(os_error) or type(os_error).__name__
        return unreachable_sentence(host, port, reason)
    return dropped_sentence(host, port, midway=started)


def worker_notice(profile: dict[str, Any]) -> dict[str, Any]:
    """The object added as "worker" to JSON bodies (and sent as an SSE comment) in degraded mode."""
    return {"degraded": True, "profile": profile}


def not_ready_sentence(ready_timeout: float) -> str:
    return (
        f"The engine was not ready within WORKER_READY_TIMEOUT={ready_timeout:g} seconds "
        f"(it is starting or restarting); retry the request later, or raise WORKER_READY_TIMEOUT."
    )


NOT_CONFIGURED = "The worker received a job before it finished starting; retry the request."
