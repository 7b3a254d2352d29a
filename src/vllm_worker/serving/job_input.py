"""A job's input, turned into the one engine request it stands for; pure, no I/O.

Why it is this strict: vLLM's request models accept and ignore unknown fields, and the
worker reads nothing but what it knows, so a misspelt or misplaced key used to vanish and
the answer came back wrong with no word of why (the best-known case: `max_tokens` beside
`prompt` instead of inside `sampling_params`, and the reply cut at the completions default
of 16 tokens). Here every key of the input is either used or refused with a sentence that
names it, and the closest key the worker knows.

The key sets are the request fields of vLLM 0.32's own models (CompletionRequest,
ChatCompletionRequest), copied as names only: the worker never imports vLLM.
tests/engine/test_open_routes.py checks them, and the route lists below, against the real
engine's /openapi.json.
"""

from __future__ import annotations

import base64
import binascii
import difflib
import json
import re
from typing import Any, NamedTuple


class InputError(ValueError):
    """The job input cannot be turned into an engine request; str() is one sentence for the user."""


class EngineRequest(NamedTuple):
    """The HTTP request one job stands for."""

    method: str
    path: str
    body: dict[str, Any] | None
    stream: bool
    # The handler sets body["max_tokens"] to the engine's context length (or caps it there):
    # a shorthand job that named no max_tokens runs to the end of the context.
    fill_max_tokens: bool = False
    # The body goes as multipart/form-data (vLLM's audio routes), see audio_form_fields.
    form: bool = False


# --------------------------------------------------------------------------- routes

# Every inference route `vllm serve` (vLLM 0.32) serves, with its one method. Which of them
# answer depends on the model (generate, pooling, speech-to-text) and on flags
# (--enable-scale-out, --enable-tokenizer-info-endpoint, VLLM_ENABLE_COHERE_API); a route the
# engine does not serve answers 404, which the handler turns into a sentence.
ALLOWED_ROUTES: dict[str, str] = {
    # generate
    "/v1/chat/completions": "POST",
    "/v1/completions": "POST",
    "/v1/responses": "POST",
    "/v1/responses/{response_id}": "GET",
    "/v1/responses/{response_id}/cancel": "POST",
    "/v1/messages": "POST",
    "/v1/messages/count_tokens": "POST",
    "/v1/chat/completions/batch": "POST",
    "/cohere/v2/chat": "POST",
    "/generative_scoring": "POST",
    "/v1/systemone": "POST",
    # pooling
    "/v1/embeddings": "POST",
    "/v2/embed": "POST",
    "/pooling": "POST",
    "/classify": "POST",
    "/score": "POST",
    "/v1/score": "POST",
    "/rerank": "POST",
    "/v1/rerank": "POST",
    "/v2/rerank": "POST",
    # speech-to-text (multipart: the audio travels base64-encoded in the job)
    "/v1/audio/transcriptions": "POST",
    "/v1/audio/translations": "POST",
    # tokens and prompt rendering
    "/tokenize": "POST",
    "/detokenize": "POST",
    "/tokenizer_info": "GET",
    "/v1/chat/completions/render": "POST",
    "/v1/completions/render": "POST",
    "/v1/messages/render": "POST",
    "/v1/responses/render": "POST",
    "/v1/chat/completions/derender": "POST",
    "/v1/completions/derender": "POST",
    "/inference/v1/generate": "POST",
    # about the engine
    "/v1/models": "GET",
    "/version": "GET",
}

AUDIO_ROUTES = frozenset({"/v1/audio/transcriptions", "/v1/audio/translations"})
# POST routes that read nothing but their path.
BODYLESS_ROUTES = frozenset({"/v1/responses/{response_id}/cancel"})

# What each kind of model serves, for the sentence on a 404 from a route the model lacks.
POOLING_ROUTES = frozenset(
    {"/v1/embeddings", "/v2/embed", "/pooling", "/classify", "/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank"}
)

_PROBE = "reports the engine's health or load to the worker; send {'route': '/worker/status'} for the worker's status"
_ADMIN = "manages the engine that every job shares"
_LORA = "changes the adapters every job shares; serve adapters with ENABLE_LORA and LORA_MODULES instead"

# Routes `vllm serve` has that jobs may not reach, each with why (some only exist with
# VLLM_SERVER_DEV_MODE, VLLM_ALLOW_RUNTIME_LORA_UPDATING or --enable-fault-tolerance). Keys are
# the engine's own route strings, as /openapi.json lists them.
CLOSED_ROUTES: dict[str, str] = {
    "/health": _PROBE,
    "/ping": _PROBE,
    "/load": _PROBE,
    "/metrics": _PROBE,
    "/kv_event_sources": _PROBE,
    "/invocations": "is SageMaker's dispatcher onto the other routes; send the request to its own route",
    "/v1/load_lora_adapter": _LORA,
    "/v1/unload_lora_adapter": _LORA,
    "/adapters": _LORA,
    "/adapters/{adapter_name}": _LORA,
    "/sleep": _ADMIN,
    "/wake_up": _ADMIN,
    "/is_sleeping": _ADMIN,
    "/release_kv_cache_memory": _ADMIN,
    "/reset_prefix_cache": _ADMIN,
    "/reset_mm_cache": _ADMIN,
    "/reset_encoder_cache": _ADMIN,
    "/collective_rpc": _ADMIN,
    "/server_info": _ADMIN,
    "/start_profile": _ADMIN,
    "/stop_profile": _ADMIN,
    "/scale_elastic_ep": _ADMIN,
    "/is_scaling_elastic_ep": _ADMIN,
    "/fault_tolerance/apply": _ADMIN,
    "/fault_tolerance/status": _ADMIN,
    "/abort_requests": _ADMIN,
    "/inference/v1/abort_requests": _ADMIN,
    "/pause": _ADMIN,
    "/resume": _ADMIN,
    "/is_paused": _ADMIN,
    "/init_weight_transfer_engine": _ADMIN,
    "/shutdown_weight_transfer_engine": _ADMIN,
    "/start_weight_update": _ADMIN,
    "/start_draft_weight_update": _ADMIN,
    "/update_weights": _ADMIN,
    "/finish_weight_update": _ADMIN,
    "/update_weight_version": _ADMIN,
    "/weight_info": _ADMIN,
    "/weight_checker": _ADMIN,
    "/get_world_size": _ADMIN,
    "/openapi.json": "is the engine's API description, not a request",
    "/docs": "is the engine's API description, not a request",
    "/docs/oauth2-redirect": "is the engine's API description, not a request",
    "/redoc": "is the engine's API description, not a request",
}

# "/v1/responses/{response_id}" -> a pattern with one plain path segment (an id) for the parameter.
_TEMPLATES: list[tuple[re.Pattern[str], str]] = [
    (re.compile("^" + re.sub(r"\\\{[a-z_]+\\\}", "[A-Za-z0-9_.:-]+", re.escape(route)) + "$"), route)
    for route in ALLOWED_ROUTES
    if "{" in route
]

STATUS_ROUTE = "/worker/status"


def route_template(path: str) -> str | None:
    """The ALLOWED_ROUTES key a concrete path falls under ("/v1/responses/resp_1" -> its template), or None."""
    if path in ALLOWED_ROUTES:
        return None if "{" in path else path
    for pattern, route in _TEMPLATES:
        if pattern.match(path):
            return route
    return None


def _allowed_list() -> str:
    return ", ".join(ALLOWED_ROUTES)


def _normalize_route(route: Any, key: str) -> str:
    if isinstance(route, str) and route in ALLOWED_ROUTES and "{" not in route:
        return route
    if not isinstance(route, str) or not route.strip():
        raise InputError(f"The job's {key!r} must be a route such as '/v1/chat/completions', not {route!r}.")
    path = route.strip()
    if not path.startswith("/"):
        path = "/" + path
    if len(path) > 1:
        path = path.rstrip("/")
    if route_template(path) is None:
        reason = CLOSED_ROUTES.get(path)
        why = f" ({path} {reason})" if reason else ""
        raise InputError(f"The route {path!r} is not open to jobs; the allowed routes are: {_allowed_list()}{why}.")
    return path


def _body_dict(value: Any, key: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InputError(f"The job's {key!r} must be a JSON object, not {type(value).__name__}.")
    return dict(value) if value else None


def _fill_model(body: dict[str, Any], served_model_name: str) -> None:
    model = body.get("model")
    if model is None or (isinstance(model, str) and not model.strip()):
        body["model"] = served_model_name


def _route_request(path: str, body: dict[str, Any] | None, method: str | None, served_model_name: str) -> EngineRequest:
    """method is the one the job named, or None to use the route's own."""
    template = route_template(path)
    assert template is not None
    expected = ALLOWED_ROUTES[template]
    if method is not None and method != expected:
        raise InputError(f"The route {path!r} takes {expected} requests, not {method}.")
    if expected == "POST" and template not in BODYLESS_ROUTES:
        if body is None:
            raise InputError(f"The route {path!r} needs a request body (a JSON object); none was given.")
        _fill_model(body, served_model_name)
    elif body is not None:
        raise InputError(f"The route {path!r} takes no request body; remove the body from the job input.")
    if template in AUDIO_ROUTES:
        assert body is not None
        audio_form_fields(body)  # refuse a bad body here, before the job waits for the engine
        return EngineRequest(expected, path, body, bool(body.get("stream")), form=True)
    stream = bool(body.get("stream")) if body is not None else False
    return EngineRequest(method=expected, path=path, body=body, stream=stream)


def _refuse_extra_keys(job_input: dict[str, Any], used: tuple[str, ...], where: str) -> None:
    for key in job_input:
        if key not in used and key != "worker_status":
            raise InputError(
                f"The job input key {key!r} is not used beside {where!r}; put request parameters "
                f"inside {'openai_input' if where.startswith('openai') else 'body'!r}."
            )


# --------------------------------------------------------------------------- audio


def _form_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value)
    return json.dumps(value)


def audio_form_fields(body: dict[str, Any]) -> list[tuple[str, str | bytes]]:
    """The multipart fields for vLLM's audio routes: `file` (base64 in the job) decoded to bytes, the rest as text.

    A list becomes one field per item, under the name vLLM reads (`timestamp_granularities[]`).
    """
    audio = body.get("file")
    if not isinstance(audio, str) or not audio.strip():
        raise InputError(
            "An audio job's body needs 'file': the audio (wav, mp3, flac, ogg, webm, ...) as a base64 string."
        )
    encoded = audio.strip()
    if encoded.startswith("data:") and "," in encoded:
        encoded = encoded.split(",", 1)[1]
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise InputError("The audio job's 'file' is not valid base64; send the audio file's bytes base64-encoded.") from None
    fields: list[tuple[str, str | bytes]] = [("file", data)]
    for key, value in body.items():
        if key == "file" or value is None:
            continue
        if isinstance(value, list):
            name = "timestamp_granularities[]" if key == "timestamp_granularities" else key
            fields += [(name, _form_value(item)) for item in value]
        else:
            fields.append((key, _form_value(value)))
    return fields


# --------------------------------------------------------------------------- shorthand keys

# Request fields of vLLM 0.32's CompletionRequest and ChatCompletionRequest.
_SHARED_KEYS = frozenset(
    {
        "add_special_tokens", "allowed_token_ids", "bad_words", "cache_salt", "ec_transfer_params", "echo",
        "frequency_penalty", "ignore_eos", "include_stop_str_in_output", "kv_transfer_params", "length_penalty",
        "logit_bias", "logprob_token_ids", "logprobs", "max_tokens", "min_p", "min_tokens", "mm_payload", "model",
        "n", "presence_penalty", "priority", "prompt_logprobs", "repetition_detection", "repetition_penalty",
        "request_id", "response_format", "return_mm_kwargs", "return_token_ids", "return_token_offsets",
        "return_tokens_as_token_ids", "routed_experts_prompt_start", "seed", "session_id", "skip_special_tokens",
        "spaces_between_special_tokens", "stop", "stop_token_ids", "stream", "stream_interval", "stream_options",
        "structured_outputs", "temperature", "thinking_token_budget", "top_k", "top_p", "truncate_prompt_tokens",
        "truncation_side", "use_beam_search", "user", "vllm_xargs", "watermarking",
    }
)  # fmt: skip
COMPLETION_KEYS = _SHARED_KEYS | {"prompt", "prompt_embeds", "suffix"}
CHAT_KEYS = _SHARED_KEYS | {
    "add_generation_prompt", "chat_template", "chat_template_kwargs", "continue_final_message", "documents",
    "include_reasoning", "max_completion_tokens", "media_io_kwargs", "messages", "mm_processor_kwargs",
    "parallel_tool_calls", "reasoning_effort", "return_prompt_text", "tool_choice", "tools", "top_logprobs",
}  # fmt: skip

# Keys of Runpod's official vLLM worker that only shaped its own output (batching of streamed
# tokens, its non-OpenAI answer format). Accepted so that jobs written for it run unchanged;
# they change nothing here: answers are OpenAI objects and streams are relayed as vLLM's events, a few
# times a second (serving.stream_relay).
COMPAT_KEYS = frozenset({"max_batch_size", "min_batch_size", "batch_size_growth_factor", "use_openai_format"})

_SHAPE_KEYS = frozenset({"prompt", "messages", "sampling_params", "apply_chat_template", "worker_status"})

# Names other APIs use for a parameter vLLM spells differently.
_ALIASES = {
    "max_new_tokens": "max_tokens",
    "max_length": "max_tokens",
    "max_output_tokens": "max_tokens",
    "temp": "temperature",
    "stop_sequences": "stop",
    "num_return_sequences": "n",
    "repeat_penalty": "repetition_penalty",
}

_CHAT = "/v1/chat/completions"
_COMPLETIONS = "/v1/completions"


def closest_key(key: str, known: frozenset[str] | set[str]) -> str | None:
    """The known key a misspelt or foreign one most likely meant, or None."""
    alias = _ALIASES.get(key.lower())
    if alias is not None and alias in known:
        return alias
    found = difflib.get_close_matches(key.lower(), sorted(known), n=1, cutoff=0.75)
    return found[0] if found else None


def _unknown_key_sentence(key: str, where: str, path: str, known: frozenset[str]) -> str:
    if path == _COMPLETIONS and key in CHAT_KEYS:
        return (
            f"The {where} key {key!r} applies to chat only; send 'messages' instead of 'prompt', "
            f"or add 'apply_chat_template': true to send the prompt through the chat template."
        )
    if path == _CHAT and key in COMPLETION_KEYS:
        return f"The {where} key {key!r} applies to plain completions only (a 'prompt' job without apply_chat_template); remove it."
    close = closest_key(key, known)
    hint = f"; the closest known key is {close!r}" if close else "; remove it or correct its name"
    return f"The {where} key {key!r} is not a parameter of {path} (vLLM 0.32), so it would be ignored{hint}."


_SHAPES = (
    "send one of: {'openai_route': '/v1/chat/completions', 'openai_input': {...}}, "
    "{'route': '/v1/completions', 'body': {...}}, {'prompt': '...', 'max_tokens': 100}, "
    "or {'messages': [...], 'max_tokens': 100}"
)


def is_status_request(job_input: Any) -> bool:
    """A status job: {"route": "/worker/status"} or {"worker_status": true}."""
    if not isinstance(job_input, dict):
        return False
    if job_input.get("worker_status") is True:
        return True
    route = job_input.get("route")
    return isinstance(route, str) and route.strip().rstrip("/") in (STATUS_ROUTE, STATUS_ROUTE.lstrip("/"))


def normalize_input(job_input: Any, served_model_name: str, default_max_tokens: int | None = None) -> EngineRequest:
    """Turn a job's input into the engine request it stands for, or raise InputError.

    default_max_tokens is DEFAULT_MAX_TOKENS: the budget of a shorthand job that names no
    max_tokens (None: up to the end of the context).
    """
    if not isinstance(job_input, dict):
        raise InputError(f"The job input must be a JSON object; {_SHAPES}.")

    if "openai_route" in job_input or "openai_input" in job_input:
        where = "openai_route" if "openai_route" in job_input else "openai_input"
        _refuse_extra_keys(job_input, ("openai_route", "openai_input"), where)
        body = _body_dict(job_input.get("openai_input"), "openai_input")
        if job_input.get("openai_route") is None:
            return _unrouted_openai_input(body, served_model_name)
        path = _normalize_route(job_input["openai_route"], "openai_route")
        return _route_request(path, body, None, served_model_name)

    if "route" in job_input:
        _refuse_extra_keys(job_input, ("route", "body", "method"), "route")
        path = _normalize_route(job_input["route"], "route")
        body = _body_dict(job_input.get("body"), "body")
        method = job_input.get("method")
        if method is not None:
            if not isinstance(method, str) or method.strip().upper() not in ("GET", "POST"):
                raise InputError(f"The job's 'method' must be GET or POST, not {method!r}.")
            method = method.strip().upper()
        return _route_request(path, body, method, served_model_name)

    return _shorthand(job_input, served_model_name, default_max_tokens)


def _unrouted_openai_input(body: dict[str, Any] | None, served_model_name: str) -> EngineRequest:
    """`openai_input` without `openai_route`: a chat completion, as Runpod's official worker reads it."""
    if body is None:
        raise InputError(f"The job's 'openai_input' is empty and names no 'openai_route'; {_SHAPES}.")
    if "messages" not in body and "prompt" in body:
        raise InputError(
            "The job's 'openai_input' has 'prompt' but no 'openai_route', and openai_input without a route is "
            "a chat completion (as in Runpod's official worker); add 'openai_route': '/v1/completions'."
        )
    return _route_request(_CHAT, body, None, served_model_name)


def _shorthand(job_input: dict[str, Any], served_model_name: str, default_max_tokens: int | None) -> EngineRequest:
    has_prompt = "prompt" in job_input
    has_messages = "messages" in job_input
    if has_prompt and has_messages:
        raise InputError("The job input has both 'prompt' and 'messages'; send one of them.")
    if not has_prompt and not has_messages:
        raise InputError(f"The job input has no request in it; {_SHAPES}.")

    templated = job_input.get("apply_chat_template", None)
    if templated is not None and not isinstance(templated, bool):
        raise InputError(f"The job's 'apply_chat_template' must be true or false, not {templated!r}.")
    if has_messages and templated is False:
        raise InputError(
            "The job has 'messages' with 'apply_chat_template': false, but messages always go through "
            "the chat template; send 'prompt' instead to skip it."
        )

    value: Any  # the prompt (a string or strings) or the messages, as the body's field takes it
    if has_prompt:
        prompt = job_input["prompt"]
        if not (isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt))):
            raise InputError(f"The job's 'prompt' must be a string (or a list of strings), not {type(prompt).__name__}.")
        if templated:
            if not isinstance(prompt, str):
                raise InputError("With 'apply_chat_template': true the job's 'prompt' must be one string (it becomes one user message).")
            path, known, key, value = _CHAT, CHAT_KEYS, "messages", [{"role": "user", "content": prompt}]
        else:
            path, known, key, value = _COMPLETIONS, COMPLETION_KEYS, "prompt", prompt
    else:
        messages = job_input["messages"]
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise InputError(
                "The job's 'messages' must be a non-empty list of objects such as "
                "{'role': 'user', 'content': 'Hello'}."
            )
        path, known, key, value = _CHAT, CHAT_KEYS, "messages", messages

    sampling_params = job_input.get("sampling_params")
    if sampling_params is None:
        sampling_params = {}
    elif not isinstance(sampling_params, dict):
        raise InputError(
            f"The job's 'sampling_params' must be a JSON object such as {{'max_tokens': 100}}, "
            f"not {type(sampling_params).__name__}."
        )
    for name in sampling_params:
        if name in ("prompt", "messages"):
            raise InputError(f"The job's {name!r} belongs at the top level of the input, not inside 'sampling_params'.")
        if name not in known:
            raise InputError(_unknown_key_sentence(name, "'sampling_params'", path, known))

    body: dict[str, Any] = dict(sampling_params)
    for name, given in job_input.items():
        if name in _SHAPE_KEYS or name in COMPAT_KEYS:
            continue
        if name not in known:
            raise InputError(_unknown_key_sentence(name, "job input", path, known))
        # Both places: the same value is fine; two different ones are refused, never one silently dropped.
        if name in sampling_params and sampling_params[name] != given:
            raise InputError(
                f"The job gives {name!r} twice with different values: {given!r} at the top level and "
                f"{sampling_params[name]!r} in 'sampling_params'; keep one."
            )
        body[name] = given

    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise InputError(f"The job's 'stream' must be true or false, not {stream!r}.")
    body[key] = value
    body["stream"] = stream
    _fill_model(body, served_model_name)

    fill = False
    if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        # vLLM's completions default is 16 tokens (an explicit null means 16 too); chat's is the rest of the context.
        body.pop("max_tokens", None)
        if default_max_tokens is not None:
            body["max_tokens"] = default_max_tokens
            fill = True
        elif path == _COMPLETIONS:
            fill = True
    return EngineRequest(method="POST", path=path, body=body, stream=stream, fill_max_tokens=fill)


def with_context_budget(body: dict[str, Any], context_length: int | None) -> dict[str, Any]:
    """The body of a fill_max_tokens request: max_tokens up to the end of the context, never past it.

    vLLM caps max_tokens at what the context has left after the prompt, but refuses one larger
    than the whole context (max_model_len). With the context length unknown the body goes as is.
    """
    if context_length is None:
        return body
    filled = dict(body)
    wanted = filled.get("max_tokens")
    filled["max_tokens"] = context_length if wanted is None else min(wanted, context_length)
    return filled
