"""normalize_input and the error sentences: every job input shape, the route allowlist, model filling."""

from __future__ import annotations

import base64
import json

import pytest

from vllm_worker.serving.answers import answered_error_sentence, error_sentence_from_response, stream_error, timeout_sentence, unreachable_sentence
from vllm_worker.serving.handler import status_report
from vllm_worker.serving.job_input import InputError, is_status_request, normalize_input
from vllm_worker.serving.state import WorkerState
from vllm_worker.serving.job_input import ALLOWED_ROUTES, EngineRequest
from vllm_worker.serving.job_input import (
    AUDIO_ROUTES,
    CHAT_KEYS,
    CLOSED_ROUTES,
    COMPLETION_KEYS,
    audio_form_fields,
    closest_key,
    with_context_budget,
)

SERVED = "org/served-model"


def _refusal(job_input: object) -> str:
    with pytest.raises(InputError) as caught:
        normalize_input(job_input, SERVED)
    sentence = str(caught.value)
    assert sentence.endswith("."), sentence
    assert "\n" not in sentence
    return sentence


# --- openai_route + openai_input (what Runpod's /openai/v1/... sends)


def test_openai_route_with_input_posts_it_and_fills_model() -> None:
    messages = [{"role": "user", "content": "Hi"}]
    request = normalize_input(
        {"openai_route": "/v1/chat/completions", "openai_input": {"messages": messages, "max_tokens": 5}}, SERVED
    )
    assert request == EngineRequest(
        method="POST",
        path="/v1/chat/completions",
        body={"messages": messages, "max_tokens": 5, "model": SERVED},
        stream=False,
    )


def test_openai_route_keeps_the_callers_model() -> None:
    request = normalize_input({"openai_route": "/v1/completions", "openai_input": {"model": "lora-a", "prompt": "x"}}, SERVED)
    assert request.body == {"model": "lora-a", "prompt": "x"}


@pytest.mark.parametrize("model", [None, "", "   "])
def test_an_empty_model_is_filled(model: object) -> None:
    request = normalize_input({"openai_route": "/v1/completions", "openai_input": {"model": model, "prompt": "x"}}, SERVED)
    assert request.body["model"] == SERVED


def test_openai_route_stream_flag_is_detected() -> None:
    request = normalize_input(
        {"openai_route": "/v1/chat/completions", "openai_input": {"messages": [{"role": "user", "content": "x"}], "stream": True}},
        SERVED,
    )
    assert request.stream is True


@pytest.mark.parametrize("openai_input", [None, {}])
def test_openai_route_without_input_is_a_get(openai_input: object) -> None:
    job = {"openai_route": "/v1/models"}
    if openai_input is not None:
        job["openai_input"] = openai_input
    assert normalize_input(job, SERVED) == EngineRequest(method="GET", path="/v1/models", body=None, stream=False)


def test_openai_route_does_not_mutate_the_job_input() -> None:
    body = {"prompt": "x"}
    normalize_input({"openai_route": "/v1/completions", "openai_input": body}, SERVED)
    assert body == {"prompt": "x"}


def test_openai_route_chat_without_a_body_is_refused() -> None:
    sentence = _refusal({"openai_route": "/v1/chat/completions"})
    assert "'/v1/chat/completions' needs a request body" in sentence


def test_openai_input_must_be_an_object() -> None:
    sentence = _refusal({"openai_route": "/v1/completions", "openai_input": "prompt text"})
    assert "'openai_input' must be a JSON object, not str" in sentence


def test_openai_route_gets_the_allowlist_too() -> None:
    sentence = _refusal({"openai_route": "/metrics"})
    assert "'/metrics' is not open to jobs" in sentence


# --- openai_input without openai_route: a chat completion, as Runpod's official worker reads it


@pytest.mark.parametrize("route", ["absent", None])
def test_openai_input_without_a_route_is_a_chat_completion(route: object) -> None:
    messages = [{"role": "user", "content": "hi"}]
    job: dict[str, object] = {"openai_input": {"messages": messages, "stream": True}}
    if route != "absent":
        job["openai_route"] = route
    request = normalize_input(job, SERVED)
    assert request == EngineRequest("POST", "/v1/chat/completions", {"messages": messages, "stream": True, "model": SERVED}, True)


def test_openai_input_with_a_prompt_and_no_route_names_the_route_to_add() -> None:
    sentence = _refusal({"openai_input": {"prompt": "Once", "max_tokens": 5}})
    assert "has 'prompt' but no 'openai_route'" in sentence
    assert "add 'openai_route': '/v1/completions'" in sentence


@pytest.mark.parametrize("empty", [None, {}])
def test_an_empty_openai_input_without_a_route_is_refused(empty: object) -> None:
    assert "'openai_input' is empty and names no 'openai_route'" in _refusal({"openai_input": empty})


def test_keys_beside_an_unrouted_openai_input_are_refused() -> None:
    sentence = _refusal({"openai_input": {"messages": [{"role": "user", "content": "hi"}]}, "max_tokens": 5})
    assert sentence == (
        "The job input key 'max_tokens' is not used beside 'openai_input'; put request parameters inside 'openai_input'."
    )


# --- route + body (+ method)


def test_route_without_leading_slash_is_normalised() -> None:
    request = normalize_input({"route": "tokenize", "body": {"prompt": "hello"}}, SERVED)
    assert request == EngineRequest(method="POST", path="/tokenize", body={"prompt": "hello", "model": SERVED}, stream=False)


def test_route_trailing_slash_and_spaces_are_normalised() -> None:
    assert normalize_input({"route": " /version/ "}, SERVED).path == "/version"


@pytest.mark.parametrize("path", ["/v1/models", "/version", "/tokenizer_info"])
def test_get_routes(path: str) -> None:
    assert normalize_input({"route": path}, SERVED) == EngineRequest("GET", path, None, False)
    assert normalize_input({"route": path, "method": "get"}, SERVED).method == "GET"


JSON_POST_ROUTES = [
    p for p, m in ALLOWED_ROUTES.items() if m == "POST" and "{" not in p and p not in AUDIO_ROUTES
]


@pytest.mark.parametrize("path", JSON_POST_ROUTES)
def test_post_routes_fill_model_and_detect_stream(path: str) -> None:
    request = normalize_input({"route": path, "body": {"input": "x", "stream": True}}, SERVED)
    assert (request.method, request.path, request.body["model"], request.stream) == ("POST", path, SERVED, True)
    assert not request.fill_max_tokens and not request.form


def test_open_and_closed_routes_do_not_overlap_and_admin_routes_are_closed() -> None:
    assert not set(ALLOWED_ROUTES) & set(CLOSED_ROUTES)
    assert set(ALLOWED_ROUTES.values()) == {"GET", "POST"}
    for admin in ("/health", "/metrics", "/load", "/v1/load_lora_adapter", "/sleep", "/wake_up",
                  "/reset_prefix_cache", "/collective_rpc", "/server_info", "/ping", "/invocations"):  # fmt: skip
        assert admin in CLOSED_ROUTES and admin not in ALLOWED_ROUTES
    for inference in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/rerank", "/score",
                      "/pooling", "/classify", "/tokenize", "/detokenize", "/v1/responses",
                      "/v1/audio/transcriptions"):  # fmt: skip
        assert inference in ALLOWED_ROUTES


@pytest.mark.parametrize(
    "route",
    [
        "/metrics", "/shutdown", "/reset_prefix_cache", "/sleep", "/v1/load_lora_adapter", "/v1/models?x=1", "/",
        "/health", "/ping", "/invocations", "/collective_rpc", "/server_info", "/v1/responses/{response_id}",
        "/v1/responses/a/b", "/v1/responses/a%2Fb",
    ],
)  # fmt: skip
def test_other_engine_routes_are_refused_with_the_allowed_list(route: str) -> None:
    sentence = _refusal({"route": route, "body": {"x": 1}})
    assert f"The route {route!r} is not open to jobs; the allowed routes are: /v1/chat/completions" in sentence
    for allowed in ALLOWED_ROUTES:
        assert allowed in sentence


def test_a_closed_route_says_why() -> None:
    assert _refusal({"route": "/health"}).endswith(
        "(/health reports the engine's health or load to the worker; send {'route': '/worker/status'} for the worker's status)."
    )
    assert _refusal({"route": "/v1/load_lora_adapter", "body": {}}).endswith(
        "(/v1/load_lora_adapter changes the adapters every job shares; serve adapters with ENABLE_LORA and LORA_MODULES instead)."
    )
    assert _refusal({"route": "/sleep"}).endswith("(/sleep manages the engine that every job shares).")


def test_routes_with_an_id_in_the_path() -> None:
    assert normalize_input({"route": "/v1/responses/resp_0a1b"}, SERVED) == EngineRequest(
        "GET", "/v1/responses/resp_0a1b", None, False
    )
    assert normalize_input({"route": "/v1/responses/resp_0a1b/cancel"}, SERVED) == EngineRequest(
        "POST", "/v1/responses/resp_0a1b/cancel", None, False
    )
    assert "takes no request body" in _refusal({"route": "/v1/responses/resp_1/cancel", "body": {"a": 1}})


@pytest.mark.parametrize("shape", [{"route": "/v1/completions", "body": {"prompt": "x"}}, {"openai_route": "/v1/completions", "openai_input": {"prompt": "x"}}])
def test_route_shapes_refuse_keys_beside_them(shape: dict) -> None:
    inside = "body" if "route" in shape else "openai_input"
    sentence = _refusal({**shape, "max_tokens": 200})
    assert sentence == (
        f"The job input key 'max_tokens' is not used beside {next(iter(shape))!r}; put request parameters inside {inside!r}."
    )
    assert normalize_input({**shape, "worker_status": False}, SERVED).path == "/v1/completions"


def test_route_wrong_method_is_refused() -> None:
    assert "'/v1/models' takes GET requests, not POST" in _refusal({"route": "/v1/models", "method": "POST"})
    assert "'/v1/completions' takes POST requests, not GET" in _refusal(
        {"route": "/v1/completions", "method": "GET", "body": {"prompt": "x"}}
    )


def test_route_get_with_body_is_refused() -> None:
    assert "takes no request body" in _refusal({"route": "/version", "method": "GET", "body": {"a": 1}})


@pytest.mark.parametrize("method", ["DELETE", 3, ""])
def test_route_bad_method_is_refused(method: object) -> None:
    assert "'method' must be GET or POST" in _refusal({"route": "/v1/completions", "body": {"prompt": "x"}, "method": method})


@pytest.mark.parametrize("route", [None, 5, "", "   "])
def test_route_must_be_a_string(route: object) -> None:
    assert "'route' must be a route such as '/v1/chat/completions'" in _refusal({"route": route})


def test_route_body_must_be_an_object() -> None:
    assert "'body' must be a JSON object, not list" in _refusal({"route": "/v1/completions", "body": [1, 2]})


# --- shorthand


def test_prompt_shorthand_goes_to_completions_with_sampling_params() -> None:
    request = normalize_input(
        {"prompt": "Once", "sampling_params": {"max_tokens": 8, "temperature": 0.2, "top_p": 0.9, "n": 2, "stop": ["\n"], "seed": 1}},
        SERVED,
    )
    assert request == EngineRequest(
        method="POST",
        path="/v1/completions",
        body={
            "max_tokens": 8,
            "temperature": 0.2,
            "top_p": 0.9,
            "n": 2,
            "stop": ["\n"],
            "seed": 1,
            "prompt": "Once",
            "stream": False,
            "model": SERVED,
        },
        stream=False,
    )


def test_messages_shorthand_goes_to_chat_and_streams() -> None:
    messages = [{"role": "user", "content": "Hi"}]
    request = normalize_input({"messages": messages, "stream": True}, SERVED)
    assert request == EngineRequest(
        method="POST",
        path="/v1/chat/completions",
        body={"messages": messages, "stream": True, "model": SERVED},
        stream=True,
    )


def test_shorthand_model_overrides_the_served_name() -> None:
    assert normalize_input({"prompt": "x", "model": "lora-b"}, SERVED).body["model"] == "lora-b"


def test_prompt_list_is_accepted() -> None:
    assert normalize_input({"prompt": ["a", "b"]}, SERVED).body["prompt"] == ["a", "b"]


def test_sampling_params_must_be_an_object() -> None:
    assert "'sampling_params' must be a JSON object such as {'max_tokens': 100}, not list" in _refusal(
        {"prompt": "x", "sampling_params": [1]}
    )


def test_stream_must_be_a_boolean() -> None:
    assert "'stream' must be true or false, not 'yes'" in _refusal({"prompt": "x", "stream": "yes"})


@pytest.mark.parametrize("prompt", [None, 3, [], [1, 2], {"text": "x"}])
def test_prompt_must_be_text(prompt: object) -> None:
    assert "'prompt' must be a string" in _refusal({"prompt": prompt})


@pytest.mark.parametrize("messages", [None, [], "Hi", ["Hi"]])
def test_messages_must_be_a_list_of_objects(messages: object) -> None:
    assert "'messages' must be a non-empty list of objects" in _refusal({"messages": messages})


def test_prompt_and_messages_together_are_refused() -> None:
    assert "both 'prompt' and 'messages'" in _refusal({"prompt": "x", "messages": [{"role": "user", "content": "x"}]})


@pytest.mark.parametrize("job_input", [{}, {"sampling_params": {}}, {"input": "x"}])
def test_no_request_lists_the_accepted_shapes(job_input: dict) -> None:
    sentence = _refusal(job_input)
    assert sentence.startswith("The job input has no request in it")
    for key in ("openai_route", "route", "prompt", "messages"):
        assert key in sentence


@pytest.mark.parametrize("job_input", [None, "hello", [1], 3])
def test_non_object_input_is_refused(job_input: object) -> None:
    assert _refusal(job_input).startswith("The job input must be a JSON object")


# --- shorthand: top-level request keys, no silent drops


def test_top_level_sampling_keys_reach_the_request() -> None:
    job = {
        "prompt": "Once",
        "max_tokens": 200,
        "temperature": 0.2,
        "top_p": 0.9,
        "top_k": 40,
        "min_p": 0.05,
        "stop": ["\n"],
        "seed": 7,
        "n": 2,
        "presence_penalty": 0.1,
        "frequency_penalty": 0.2,
        "repetition_penalty": 1.1,
        "logprobs": 3,
        "response_format": {"type": "json_object"},
        "stream_options": {"include_usage": True},
        "stream": True,
    }
    request = normalize_input(job, SERVED)
    assert request.path == "/v1/completions" and request.stream is True
    assert request.body == {**job, "model": SERVED}
    assert not request.fill_max_tokens


def test_top_level_chat_keys_reach_the_request() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    messages = [{"role": "user", "content": "Hi"}]
    job = {"messages": messages, "max_completion_tokens": 50, "tools": tools, "tool_choice": "auto", "top_logprobs": 2, "logprobs": True}
    request = normalize_input(job, SERVED)
    assert request.body == {**job, "stream": False, "model": SERVED}
    assert not request.fill_max_tokens


def test_top_level_and_sampling_params_are_merged() -> None:
    request = normalize_input({"prompt": "x", "max_tokens": 9, "sampling_params": {"temperature": 0, "max_tokens": 9}}, SERVED)
    assert request.body == {"temperature": 0, "max_tokens": 9, "prompt": "x", "stream": False, "model": SERVED}


def test_the_same_key_twice_with_different_values_is_refused_naming_both() -> None:
    assert _refusal({"prompt": "x", "max_tokens": 200, "sampling_params": {"max_tokens": 16}}) == (
        "The job gives 'max_tokens' twice with different values: 200 at the top level and 16 in 'sampling_params'; keep one."
    )


def test_stream_inside_sampling_params_is_used() -> None:
    request = normalize_input({"prompt": "x", "sampling_params": {"stream": True, "max_tokens": 4}}, SERVED)
    assert request.stream is True and request.body["stream"] is True


@pytest.mark.parametrize(
    "job, sentence",
    [
        (
            {"prompt": "x", "max_token": 200},
            "The job input key 'max_token' is not a parameter of /v1/completions (vLLM 0.32), so it would be ignored; "
            "the closest known key is 'max_tokens'.",
        ),
        (
            {"messages": [{"role": "user", "content": "x"}], "temperatur": 0.5},
            "The job input key 'temperatur' is not a parameter of /v1/chat/completions (vLLM 0.32), so it would be ignored; "
            "the closest known key is 'temperature'.",
        ),
        (
            {"prompt": "x", "sampling_params": {"max_new_tokens": 50}},
            "The 'sampling_params' key 'max_new_tokens' is not a parameter of /v1/completions (vLLM 0.32), "
            "so it would be ignored; the closest known key is 'max_tokens'.",
        ),
        (
            {"prompt": "x", "stop_sequences": ["."]},
            "The job input key 'stop_sequences' is not a parameter of /v1/completions (vLLM 0.32), so it would be ignored; "
            "the closest known key is 'stop'.",
        ),
        (
            {"prompt": "x", "best_of": 3},
            "The job input key 'best_of' is not a parameter of /v1/completions (vLLM 0.32), so it would be ignored; "
            "remove it or correct its name.",
        ),
        (
            {"prompt": "x", "tools": []},
            "The job input key 'tools' applies to chat only; send 'messages' instead of 'prompt', or add "
            "'apply_chat_template': true to send the prompt through the chat template.",
        ),
        (
            {"messages": [{"role": "user", "content": "x"}], "sampling_params": {"suffix": "!"}},
            "The 'sampling_params' key 'suffix' applies to plain completions only (a 'prompt' job without "
            "apply_chat_template); remove it.",
        ),
        (
            {"prompt": "x", "apply_chat_template": True, "suffix": "!"},
            "The job input key 'suffix' applies to plain completions only (a 'prompt' job without "
            "apply_chat_template); remove it.",
        ),
    ],
)
def test_an_unknown_key_is_named_with_the_closest_known_one(job: dict, sentence: str) -> None:
    assert _refusal(job) == sentence


def test_prompt_or_messages_inside_sampling_params_is_refused() -> None:
    assert _refusal({"prompt": "x", "sampling_params": {"prompt": "y"}}) == (
        "The job's 'prompt' belongs at the top level of the input, not inside 'sampling_params'."
    )


@pytest.mark.parametrize("key, expected", [("max_token", "max_tokens"), ("Temperature", "temperature"),
                                           ("max_new_tokens", "max_tokens"), ("temp", "temperature"), ("zzz", None)])  # fmt: skip
def test_closest_key(key: str, expected: str | None) -> None:
    assert closest_key(key, COMPLETION_KEYS) == expected


def test_the_key_sets_are_vllms_request_fields() -> None:
    # Spot checks; tests/engine/test_open_routes.py compares the whole sets with the real engine's schema.
    assert {"max_tokens", "temperature", "top_k", "min_p", "ignore_eos", "min_tokens", "suffix", "echo"} <= COMPLETION_KEYS
    assert {"max_completion_tokens", "tools", "tool_choice", "top_logprobs", "chat_template_kwargs"} <= CHAT_KEYS
    assert "tools" not in COMPLETION_KEYS and "suffix" not in CHAT_KEYS


def test_official_worker_keys_are_accepted_and_change_nothing() -> None:
    plain = normalize_input({"prompt": "x", "max_tokens": 5}, SERVED)
    job = {"prompt": "x", "max_tokens": 5, "max_batch_size": 8, "min_batch_size": 1, "batch_size_growth_factor": 2, "use_openai_format": True}
    assert normalize_input(job, SERVED) == plain


# --- apply_chat_template


def test_apply_chat_template_sends_the_prompt_as_one_user_message() -> None:
    request = normalize_input({"prompt": "Hi there", "apply_chat_template": True, "max_tokens": 30, "tools": []}, SERVED)
    assert request == EngineRequest(
        "POST",
        "/v1/chat/completions",
        {"max_tokens": 30, "tools": [], "messages": [{"role": "user", "content": "Hi there"}], "stream": False, "model": SERVED},
        False,
    )


def test_apply_chat_template_false_is_a_plain_completion() -> None:
    assert normalize_input({"prompt": "x", "apply_chat_template": False, "max_tokens": 3}, SERVED).path == "/v1/completions"


def test_apply_chat_template_refusals() -> None:
    assert "'apply_chat_template' must be true or false, not 'yes'" in _refusal({"prompt": "x", "apply_chat_template": "yes"})
    assert "prompt' must be one string" in _refusal({"prompt": ["a", "b"], "apply_chat_template": True})
    assert "messages always go through the chat template" in _refusal(
        {"messages": [{"role": "user", "content": "x"}], "apply_chat_template": False}
    )
    assert normalize_input({"messages": [{"role": "user", "content": "x"}], "apply_chat_template": True}, SERVED).path == (
        "/v1/chat/completions"
    )


# --- the token budget of a job without max_tokens


@pytest.mark.parametrize("job", [{"prompt": "x"}, {"prompt": "x", "max_tokens": None}, {"prompt": "x", "sampling_params": {"max_tokens": None}}])
def test_a_prompt_job_without_max_tokens_runs_to_the_end_of_the_context(job: dict) -> None:
    request = normalize_input(job, SERVED)
    assert request.fill_max_tokens is True
    assert "max_tokens" not in request.body  # vLLM reads a missing or null max_tokens as 16 on completions
    assert with_context_budget(request.body, 4096)["max_tokens"] == 4096


def test_a_chat_job_without_max_tokens_is_left_to_vllm() -> None:
    request = normalize_input({"messages": [{"role": "user", "content": "x"}]}, SERVED)
    assert not request.fill_max_tokens and "max_tokens" not in request.body
    templated = normalize_input({"prompt": "x", "apply_chat_template": True}, SERVED)
    assert not templated.fill_max_tokens and "max_tokens" not in templated.body


@pytest.mark.parametrize("job", [{"prompt": "x"}, {"messages": [{"role": "user", "content": "x"}]}, {"prompt": "x", "apply_chat_template": True}])
def test_default_max_tokens_applies_to_shorthand_jobs_capped_at_the_context(job: dict) -> None:
    request = normalize_input(job, SERVED, default_max_tokens=256)
    assert request.fill_max_tokens and request.body["max_tokens"] == 256
    assert with_context_budget(request.body, 4096)["max_tokens"] == 256
    assert with_context_budget(request.body, 128)["max_tokens"] == 128
    assert with_context_budget(request.body, None) == request.body


def test_a_given_budget_is_never_replaced() -> None:
    assert not normalize_input({"prompt": "x", "max_tokens": 5}, SERVED, default_max_tokens=256).fill_max_tokens
    assert normalize_input({"prompt": "x", "max_tokens": 5}, SERVED, default_max_tokens=256).body["max_tokens"] == 5
    chat = normalize_input({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 7}, SERVED, default_max_tokens=256)
    assert not chat.fill_max_tokens and "max_tokens" not in chat.body


def test_route_shapes_keep_openai_semantics() -> None:
    request = normalize_input({"route": "/v1/completions", "body": {"prompt": "x"}}, SERVED, default_max_tokens=256)
    assert request.body == {"prompt": "x", "model": SERVED} and not request.fill_max_tokens


# --- audio


def test_audio_jobs_go_as_multipart_with_the_file_decoded() -> None:
    audio = base64.b64encode(b"RIFF....WAVEfmt ").decode()
    body = {"file": audio, "language": "en", "temperature": 0.0, "stream": True, "timestamp_granularities": ["word", "segment"]}
    request = normalize_input({"route": "/v1/audio/transcriptions", "body": body}, SERVED)
    assert request.form and request.stream and request.method == "POST"
    assert audio_form_fields(request.body) == [
        ("file", b"RIFF....WAVEfmt "),
        ("language", "en"),
        ("temperature", "0.0"),
        ("stream", "true"),
        ("timestamp_granularities[]", "word"),
        ("timestamp_granularities[]", "segment"),
        ("model", SERVED),
    ]
    data_url = normalize_input({"route": "/v1/audio/translations", "body": {"file": "data:audio/wav;base64," + audio}}, SERVED)
    assert audio_form_fields(data_url.body)[0] == ("file", b"RIFF....WAVEfmt ")


@pytest.mark.parametrize("body, words", [({"language": "en"}, "needs 'file'"), ({"file": "not base64!"}, "not valid base64")])
def test_audio_job_refusals(body: dict, words: str) -> None:
    assert words in _refusal({"route": "/v1/audio/transcriptions", "body": body})


# --- status jobs


@pytest.mark.parametrize(
    "job_input, expected",
    [
        ({"route": "/worker/status"}, True),
        ({"route": "worker/status"}, True),
        ({"worker_status": True}, True),
        ({"worker_status": "yes"}, False),
        ({"route": "/version"}, False),
        ("status", False),
        (None, False),
    ],
)
def test_status_request(job_input: object, expected: bool) -> None:
    assert is_status_request(job_input) is expected


def test_status_report_never_carries_an_error_key() -> None:
    state = WorkerState(served_model_name=SERVED, status={"launches": 2, "error": "x"}, profile={"name": "eager"})
    report = status_report(state)
    assert "error" not in report
    assert report["launches"] == 2
    assert report["served_model_name"] == SERVED
    assert report["profile"] == {"name": "eager"}
    assert report["ready"] is False
    assert report["fatal"] is None


def test_status_report_keeps_mains_profile_line_when_not_degraded() -> None:
    state = WorkerState(served_model_name=SERVED, status={"profile": "as configured"})
    state.mark_ready()
    assert status_report(state) == {
        "profile": "as configured", "served_model_name": SERVED, "ready": True, "fatal": None,
        "continuations": {"continued": 0, "answered": {}},
    }


# --- error sentences


def test_vllm_error_response_becomes_a_sentence() -> None:
    body = json.dumps(
        {"error": {"message": "This model's maximum context length is 2048 tokens.", "type": "BadRequestError", "param": None, "code": 400}}
    )
    assert error_sentence_from_response(400, body) == (
        "The engine rejected the request (HTTP 400): This model's maximum context length is 2048 tokens."
    )


def test_multi_line_validation_message_is_one_line() -> None:
    body = json.dumps({"error": {"message": "1 validation error:\n  body.messages: Field required", "type": "Bad Request", "code": 400}})
    assert error_sentence_from_response(400, body) == (
        "The engine rejected the request (HTTP 400): 1 validation error: body.messages: Field required"
    )


def test_server_errors_say_the_engine_failed() -> None:
    body = json.dumps({"error": {"message": "EngineCore encountered an issue.", "type": "InternalServerError", "code": 500}})
    assert error_sentence_from_response(500, body).startswith("The engine failed while handling the request (HTTP 500): EngineCore")


def test_anthropic_and_fastapi_shapes_and_plain_text() -> None:
    anthropic = json.dumps({"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens: required"}})
    assert error_sentence_from_response(400, anthropic).endswith(": max_tokens: required")
    assert error_sentence_from_response(405, json.dumps({"detail": "Method Not Allowed"})).endswith(": Method Not Allowed")
    assert error_sentence_from_response(502, "Bad gateway\n") == "The engine failed while handling the request (HTTP 502): Bad gateway"
    assert error_sentence_from_response(500, "") == "The engine failed while handling the request (HTTP 500) and gave no reason."


def test_unserved_route_404_says_which_route() -> None:
    sentence = error_sentence_from_response(404, json.dumps({"detail": "Not Found"}), "/v1/embeddings")
    assert sentence == (
        "The engine does not serve /v1/embeddings for the model it runs (HTTP 404 Not Found); "
        "that route needs an embedding (pooling) model."
    )


def test_long_messages_are_cut() -> None:
    sentence = error_sentence_from_response(400, json.dumps({"error": {"message": "x" * 10000, "code": 400}}))
    assert len(sentence) < 1600 and sentence.endswith("...")


def test_stream_error_splits_before_the_error_event() -> None:
    ok = 'data: {"id": "1", "choices": []}\n\n'
    bad = 'data: {"error": {"message": "boom", "type": "InternalServerError", "code": 500}}\n\n'
    before, sentence = stream_error(ok + bad + "data: [DONE]\n\n")
    assert before == ok
    assert sentence == "The engine stopped the streamed response with an error (HTTP 500): boom"
    text_with_word = 'data: {"choices": [{"delta": {"content": "the \\"error\\" key"}}]}\n\n'
    assert stream_error(text_with_word) == (text_with_word, None)


def test_transport_sentences_name_the_values() -> None:
    assert unreachable_sentence("127.0.0.1", 8123, "connection refused").startswith(
        "The engine is not reachable at 127.0.0.1:8123 (connection refused)"
    )
    assert timeout_sentence(2.5).startswith("The engine did not finish answering within REQUEST_TIMEOUT=2.5 seconds")
    assert timeout_sentence(900.0, 12.345) == (
        "The engine did not finish answering within the 12.3 seconds left of REQUEST_TIMEOUT=900 seconds when it "
        "was continued on the restarted engine; raise REQUEST_TIMEOUT, or ask for fewer tokens (max_tokens)."
    )


def test_a_transport_failure_says_whether_the_engine_was_reached_and_when_it_dropped() -> None:
    import types

    import aiohttp

    from vllm_worker.serving.answers import dropped_sentence, transport_sentence

    key = types.SimpleNamespace(host="127.0.0.1", port=8123, ssl=None)
    refused = aiohttp.ClientConnectorError(key, ConnectionRefusedError(111, "Connection refused"))  # type: ignore[arg-type]
    assert transport_sentence(refused, "127.0.0.1", 8123, False) == unreachable_sentence("127.0.0.1", 8123, "connection refused")
    unreachable = aiohttp.ClientConnectorError(key, OSError(113, "No route to host"))  # type: ignore[arg-type]
    assert transport_sentence(unreachable, "127.0.0.1", 8123, False) == unreachable_sentence("127.0.0.1", 8123, "No route to host")
    bare = aiohttp.ClientConnectorError(key, OSError("no such address"))  # type: ignore[arg-type]
    assert transport_sentence(bare, "h", 1, False) == unreachable_sentence("h", 1, "no such address")
    assert transport_sentence(aiohttp.ClientConnectorError(key, OSError()), "h", 1, False) == unreachable_sentence("h", 1, "OSError")  # type: ignore[arg-type]
    dropped = aiohttp.ServerDisconnectedError()
    assert transport_sentence(dropped, "h", 1, True) == dropped_sentence("h", 1, midway=True)
    assert "in the middle of its response" in transport_sentence(dropped, "h", 1, True)
    assert "closed the connection before answering" in transport_sentence(dropped, "h", 1, False)


def test_a_200_body_with_an_error_becomes_a_sentence_not_a_repr() -> None:
    failed = {"id": "resp_1", "object": "response", "status": "failed", "error": {"code": "server_error", "message": "Generation failed."}}
    assert answered_error_sentence(failed) == "The engine answered with an error: Generation failed."
    assert answered_error_sentence({"error": {"code": 7}}) == 'The engine answered with an error: {"code": 7}'
