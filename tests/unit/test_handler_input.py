"""normalize_input and the error sentences: every job input shape, the route allowlist, model filling."""

from __future__ import annotations

import json

import pytest

from vllm_worker.handler import (
    ALLOWED_ROUTES,
    EngineRequest,
    InputError,
    WorkerState,
    answered_error_sentence,
    error_sentence_from_response,
    is_status_request,
    normalize_input,
    status_report,
    stream_error,
    timeout_sentence,
    unreachable_sentence,
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


# --- route + body (+ method)


def test_route_without_leading_slash_is_normalised() -> None:
    request = normalize_input({"route": "tokenize", "body": {"prompt": "hello"}}, SERVED)
    assert request == EngineRequest(method="POST", path="/tokenize", body={"prompt": "hello", "model": SERVED}, stream=False)


def test_route_trailing_slash_and_spaces_are_normalised() -> None:
    assert normalize_input({"route": " /version/ "}, SERVED).path == "/version"


@pytest.mark.parametrize("path", ["/v1/models", "/version", "/health"])
def test_get_routes(path: str) -> None:
    assert normalize_input({"route": path}, SERVED) == EngineRequest("GET", path, None, False)
    assert normalize_input({"route": path, "method": "get"}, SERVED).method == "GET"


@pytest.mark.parametrize("path", [p for p, m in ALLOWED_ROUTES.items() if m == "POST"])
def test_post_routes_fill_model_and_detect_stream(path: str) -> None:
    request = normalize_input({"route": path, "body": {"input": "x", "stream": True}}, SERVED)
    assert (request.method, request.path, request.body["model"], request.stream) == ("POST", path, SERVED, True)


def test_allowlist_is_exactly_the_public_inference_routes() -> None:
    assert set(ALLOWED_ROUTES) == {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/messages",
        "/v1/embeddings",
        "/v1/models",
        "/tokenize",
        "/detokenize",
        "/version",
        "/health",
    }


@pytest.mark.parametrize(
    "route", ["/metrics", "/shutdown", "/reset_prefix_cache", "/sleep", "/v1/load_lora_adapter", "/v1/models?x=1", "/"]
)
def test_other_engine_routes_are_refused_with_the_allowed_list(route: str) -> None:
    sentence = _refusal({"route": route, "body": {"x": 1}})
    assert f"The route {route!r} is not open to jobs" in sentence
    for allowed in ALLOWED_ROUTES:
        assert allowed in sentence


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
    assert status_report(state) == {"profile": "as configured", "served_model_name": SERVED, "ready": True, "fatal": None}


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


def test_a_200_body_with_an_error_becomes_a_sentence_not_a_repr() -> None:
    failed = {"id": "resp_1", "object": "response", "status": "failed", "error": {"code": "server_error", "message": "Generation failed."}}
    assert answered_error_sentence(failed) == "The engine answered with an error: Generation failed."
    assert answered_error_sentence({"error": {"code": 7}}) == 'The engine answered with an error: {"code": 7}'
