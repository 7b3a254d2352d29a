"""What a job can reach on the REAL vLLM 0.32 engine, and that a shorthand job's token budget arrives.

The worker never imports vLLM, so its route lists and request-key sets are written out in
vllm_worker.serving.job_input. Here they are held against the engine's own /openapi.json: every
route the engine serves is either open (with the method the engine takes) or closed with
a reason, the admin routes are closed, and the shorthand keys are exactly the fields of
vLLM's CompletionRequest and ChatCompletionRequest. Two engines are read: the shared
`tiny_engine` (a generate model) and one that serves the tiny model as an embedding model
with vLLM's development, RL and runtime-LoRA routes switched on, so that the pooling routes
and the admin routes appear in its schema too.

Then jobs go through handler() to the real engine: top-level max_tokens is used (the reply
is longer than vLLM's completions default of 16 tokens), a prompt job without max_tokens
runs to the end of the context, DEFAULT_MAX_TOKENS applies, apply_chat_template goes through
the chat template, and every open route the engine serves is reached with its method.
"""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import engine_env
from tests.support.engine_env import STOP_GRACE, start_ready_engine
from vllm_worker.engine.process import Engine
from vllm_worker.serving.handler import close_session, configure, handler
from vllm_worker.serving.state import WorkerState
from vllm_worker.serving.job_input import ALLOWED_ROUTES, BODYLESS_ROUTES, CHAT_KEYS, CLOSED_ROUTES, COMPLETION_KEYS

pytestmark = pytest.mark.engine

# What the brief of this worker names as admin and lifecycle routes; all of them exist in the
# second engine's schema, so the check below cannot pass by their absence.
ADMIN_ROUTES = {
    "/health", "/metrics", "/load", "/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/sleep", "/wake_up",
    "/reset_prefix_cache", "/collective_rpc", "/server_info", "/pause", "/resume", "/update_weights",
}  # fmt: skip
MAX_MODEL_LEN = 512  # engine_env.TINY_FLAGS
PROMPT = "Once upon a time"


def openapi(engine: Engine) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{engine.port}/openapi.json", timeout=60) as response:
        return json.load(response)


def concrete(path: str) -> str:
    """A path the engine routes, with a made-up id for each parameter."""
    return re.sub(r"\{[a-z_]+\}", "resp_0123456789abcdef", path)


@pytest.fixture(scope="module")
def pooling_engine(tiny_model: Path) -> Iterator[Engine]:
    """The tiny model as an embedding model, with the dev, RL, runtime-LoRA and tokenizer-info routes on."""
    port = engine_env.free_port()
    # In bfloat16 the CPU worker died with SIGILL (exit -4) on the first embedding here; float32 runs.
    argv = engine_env.serve_argv(
        tiny_model, port, "--convert", "embed", "--enable-tokenizer-info-endpoint", "--dtype", "float32"
    )
    env = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}
    engine = start_ready_engine(argv, port, env=env)
    try:
        yield engine
    finally:
        engine.stop(STOP_GRACE)


@pytest.fixture(scope="module")
def schemas(tiny_engine: Engine, pooling_engine: Engine) -> dict[str, dict[str, Any]]:
    return {"generate": openapi(tiny_engine), "pooling": openapi(pooling_engine)}


# --- the lists against the engine's schema


def test_every_route_the_engine_serves_is_open_or_closed_with_a_reason(schemas: dict[str, dict[str, Any]]) -> None:
    for kind, schema in schemas.items():
        unknown = sorted(set(schema["paths"]) - set(ALLOWED_ROUTES) - set(CLOSED_ROUTES))
        assert not unknown, f"{kind} engine serves routes job_input does not classify: {unknown}"


def test_admin_routes_are_served_and_closed(schemas: dict[str, dict[str, Any]]) -> None:
    served = set(schemas["pooling"]["paths"])
    assert ADMIN_ROUTES <= served, sorted(ADMIN_ROUTES - served)
    assert not ADMIN_ROUTES & set(ALLOWED_ROUTES)
    assert ADMIN_ROUTES <= set(CLOSED_ROUTES)


def test_the_inference_routes_of_both_kinds_are_open(schemas: dict[str, dict[str, Any]]) -> None:
    open_served = {kind: set(schema["paths"]) & set(ALLOWED_ROUTES) for kind, schema in schemas.items()}
    assert {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages", "/tokenize"} <= open_served["generate"]
    assert {"/v1/embeddings", "/pooling", "/score", "/rerank", "/v2/embed"} <= open_served["pooling"]


def test_open_routes_take_the_method_and_body_the_engine_takes(schemas: dict[str, dict[str, Any]]) -> None:
    for schema in schemas.values():
        for path, operations in schema["paths"].items():
            if path not in ALLOWED_ROUTES:
                continue
            method = ALLOWED_ROUTES[path].lower()
            assert method in operations, f"{path}: job_input says {method}, the engine takes {sorted(operations)}"
            if method == "post":
                takes_body = "requestBody" in operations["post"]
                assert takes_body == (path not in BODYLESS_ROUTES), path


def test_shorthand_keys_are_the_fields_of_vllms_request_models(schemas: dict[str, dict[str, Any]]) -> None:
    models = schemas["generate"]["components"]["schemas"]
    assert COMPLETION_KEYS == set(models["CompletionRequest"]["properties"])
    assert CHAT_KEYS == set(models["ChatCompletionRequest"]["properties"])


# --- jobs through the handler


@pytest.fixture
async def generate_state(tiny_engine: Engine, tiny_model: Path) -> AsyncIterator[WorkerState]:
    state = WorkerState(served_model_name=str(tiny_model), port=tiny_engine.port, request_timeout=300.0, ready_timeout=5.0)
    state.mark_ready()
    configure(state)
    try:
        yield state
    finally:
        await close_session()
        configure(None)  # type: ignore[arg-type]


async def run(job_input: Any) -> Any:
    [answer] = [chunk async for chunk in handler({"id": "job-1", "input": job_input})]
    return answer


async def test_a_top_level_max_tokens_is_used(generate_state: WorkerState) -> None:
    answer = await run({"prompt": PROMPT, "max_tokens": 40, "min_tokens": 40})
    assert answer["object"] == "text_completion", answer
    assert answer["usage"]["completion_tokens"] == 40


async def test_a_prompt_job_without_max_tokens_runs_to_the_end_of_the_context(generate_state: WorkerState) -> None:
    answer = await run({"prompt": PROMPT, "ignore_eos": True})
    usage = answer["usage"]
    assert usage["completion_tokens"] > 16
    assert usage["prompt_tokens"] + usage["completion_tokens"] == MAX_MODEL_LEN
    assert answer["choices"][0]["finish_reason"] == "length"


async def test_default_max_tokens_is_the_budget_of_a_job_without_one(generate_state: WorkerState) -> None:
    generate_state.default_max_tokens = 24
    answer = await run({"prompt": PROMPT, "ignore_eos": True})
    assert answer["usage"]["completion_tokens"] == 24
    chat = await run({"messages": [{"role": "user", "content": "Say hello."}], "ignore_eos": True})
    assert chat["usage"]["completion_tokens"] == 24


async def test_apply_chat_template_sends_the_prompt_through_the_chat_template(generate_state: WorkerState) -> None:
    plain = await run({"prompt": "Say hello.", "max_tokens": 1})
    templated = await run({"prompt": "Say hello.", "apply_chat_template": True, "max_tokens": 20, "min_tokens": 20})
    assert templated["object"] == "chat.completion", templated
    assert templated["usage"]["completion_tokens"] == 20
    # The template wraps the prompt, so the engine counts more prompt tokens than the bare text has.
    assert templated["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"]


async def test_a_misspelt_key_is_answered_not_dropped(generate_state: WorkerState) -> None:
    answer = await run({"prompt": PROMPT, "max_token": 200})
    assert answer == {
        "error": "The job input key 'max_token' is not a parameter of /v1/completions (vLLM 0.32), so it would be "
        "ignored; the closest known key is 'max_tokens'."
    }


def reached(answer: Any) -> bool:
    """The engine routed the request and stayed up (it may still refuse the body): no 404 for the route, no 405, no 500."""
    if not isinstance(answer, dict) or "error" not in answer:
        return True
    error = answer["error"]
    return not any(
        (
            "does not serve" in error,
            "(HTTP 405" in error,
            "(HTTP 500)" in error,
            error.endswith(": Not Found"),
            "not open to jobs" in error,
        )
    )


async def _reach_every_open_route(schema: dict[str, Any]) -> list[str]:
    missed = []
    for path in schema["paths"]:
        if path not in ALLOWED_ROUTES:
            continue
        bodyless = ALLOWED_ROUTES[path] == "GET" or path in BODYLESS_ROUTES
        job = {"route": concrete(path)} if bodyless else {"route": path, "body": {"input": "hello"}}
        answer = await run(job)
        if not reached(answer):
            missed.append(f"{path}: {answer}")
    return missed


async def test_every_open_route_of_the_generate_engine_is_reached(generate_state: WorkerState, schemas: dict[str, dict[str, Any]]) -> None:
    assert await _reach_every_open_route(schemas["generate"]) == []


async def test_every_open_route_of_the_pooling_engine_is_reached(
    pooling_engine: Engine, tiny_model: Path, schemas: dict[str, dict[str, Any]]
) -> None:
    state = WorkerState(served_model_name=str(tiny_model), port=pooling_engine.port, request_timeout=300.0)
    state.mark_ready()
    configure(state)
    try:
        assert await _reach_every_open_route(schemas["pooling"]) == []
        embedding = await run({"route": "/v1/embeddings", "body": {"input": "hello"}})
        assert embedding["object"] == "list" and embedding["data"][0]["object"] == "embedding"
        refused = await run({"route": "/sleep"})
        assert refused["error"].startswith("The route '/sleep' is not open to jobs")
    finally:
        await close_session()
        configure(None)  # type: ignore[arg-type]
