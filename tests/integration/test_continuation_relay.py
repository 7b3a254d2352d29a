"""The handler continues a stream cut by an engine death, in process, against an aiohttp engine stand-in.

The stand-in writes events the way vLLM 0.32 does with `return_token_ids` (ids in each chunk, the
prompt's ids in the first), then drops the connection; main's death record arrives; the same
port then answers /v1/completions with the rest. What the client of the job sees is one stream:
the events before the cut once, the continuation's after it with the first request's id, usage
adding up; the continuation's body asked for the prompt's ids and the sent ids.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
from aiohttp import web

from tests.integration.test_engine_death import DEATH, on_death_wait, run_handler, serve
from vllm_worker.serving import continuation
from vllm_worker.serving.state import Death, WorkerState

PROMPT_IDS = [1, 2, 3]


def sse(payload: dict[str, Any]) -> bytes:
    return ("data: " + json.dumps(payload, separators=(",", ":")) + "\n\n").encode()


def chunk(text: str, ids: list[int], first: bool = False, finish: str | None = None, cid: str = "cmpl-a") -> dict[str, Any]:
    return {
        "id": cid, "object": "text_completion", "created": 11, "model": "m",
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None,
                     "prompt_token_ids": PROMPT_IDS if first else None, "token_ids": ids}],
    }  # fmt: skip


def routes(bodies: list[dict[str, Any]], before_cut: int = 2) -> web.RouteTableDef:
    """The first request is sent `before_cut` events (at most 2) before the engine dies; the next, the rest."""
    table = web.RouteTableDef()

    @table.post("/v1/completions")
    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        bodies.append(body)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if len(bodies) == 1:
            sent = [sse(chunk(" a", [10], first=True)), sse(chunk(" b", [11]))][:before_cut]
            if sent:
                await response.write(b"".join(sent))
            await asyncio.sleep(0.2)
            assert request.transport is not None
            request.transport.abort()  # the engine died mid-stream
            return response
        await response.write(sse(chunk(" c", [12], first=True, cid="cmpl-b")) + sse(chunk(" d", [13], finish="length", cid="cmpl-b")))
        usage = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
        await response.write(sse({"id": "cmpl-b", "object": "text_completion", "created": 99, "model": "m", "choices": [], "usage": usage}))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    return table


async def cut_and_relaunched(
    monkeypatch: Any, job: dict[str, Any], before_cut: int
) -> tuple[list[Any], list[dict[str, Any]], WorkerState]:
    """The job's parts, the bodies the engine stand-in was sent, and the state: the engine dies after
    `before_cut` events, main records the death and marks the relaunched engine ready 0.3 s later."""
    bodies: list[dict[str, Any]] = []
    runner, port = await serve(routes(bodies, before_cut))
    state = WorkerState(served_model_name="m", port=port)
    state.mark_ready()
    entered = on_death_wait(monkeypatch)

    async def main_notices_and_relaunches() -> None:
        await entered.wait()
        state.record_death(Death(DEATH, "engine_died"))
        await asyncio.sleep(0.3)
        state.mark_ready()

    try:
        parts, _ = await asyncio.gather(run_handler(state, job), main_notices_and_relaunches())
    finally:
        await runner.cleanup()
    return parts, bodies, state


async def test_a_stream_cut_by_a_death_is_continued_in_one_stream(monkeypatch: Any) -> None:
    job = {
        "openai_route": "/v1/completions",
        "openai_input": {"prompt": "x", "max_tokens": 4, "min_tokens": 4, "temperature": 0, "stream": True,
                         "stream_options": {"include_usage": True}},
    }  # fmt: skip
    parts, bodies, state = await cut_and_relaunched(monkeypatch, job, before_cut=2)

    text = "".join(p for p in parts if isinstance(p, str))
    data = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    assert [c["choices"][0]["text"] for c in data if c["choices"]] == [" a", " b", " c", " d"]
    assert {c["id"] for c in data} == {"cmpl-a"} and {c["created"] for c in data} == {11}
    assert all(ch["token_ids"] is None and ch["prompt_token_ids"] is None for c in data for ch in c["choices"])
    assert data[-1]["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    assert text.count("data: [DONE]") == 1 and text.endswith("data: [DONE]\n\n")
    [comment] = [line for line in text.splitlines() if line.startswith(": worker ")]
    assert json.loads(comment[len(": worker "):])["continued"]["tokens_kept"] == 2

    first, rest = bodies
    assert first["return_token_ids"] is True
    assert (rest["prompt"], rest["max_tokens"], rest["min_tokens"]) == (PROMPT_IDS + [10, 11], 2, 2)
    assert state.continuations() == {"continued": 1, "answered": {}}
    assert not any(isinstance(p, dict) and "error" in p for p in parts)


async def test_a_stream_cut_before_its_first_event_is_sent_again_whole_and_says_so(monkeypatch: Any) -> None:
    job = {"openai_route": "/v1/completions", "openai_input": {"prompt": "x", "max_tokens": 2, "stream": True}}
    parts, bodies, state = await cut_and_relaunched(monkeypatch, job, before_cut=0)

    text = "".join(p for p in parts if isinstance(p, str))
    # The client had been sent nothing: the whole stream is the relaunched engine's, named as a continuation.
    [comment] = [line for line in text.splitlines() if line.startswith(": worker ")]
    assert text.startswith(comment + "\n\n")
    assert json.loads(comment[len(": worker "):])["continued"] == {"tokens_kept": 0, "after": "engine_died"}
    data = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    assert [c["choices"][0]["text"] for c in data if c["choices"]] == [" c", " d"]
    assert text.count("data: [DONE]") == 1
    first, again = bodies
    assert again == first and again["prompt"] == "x"
    assert state.continuations() == {"continued": 1, "answered": {}}
    assert not any(isinstance(p, dict) and "error" in p for p in parts)


async def test_a_seeded_stream_cut_by_a_death_is_answered_with_why(monkeypatch: Any) -> None:
    bodies: list[dict[str, Any]] = []
    runner, port = await serve(routes(bodies))
    state = WorkerState(served_model_name="m", port=port)
    state.mark_ready()
    entered = on_death_wait(monkeypatch)

    async def main_notices() -> None:
        await entered.wait()
        state.record_death(Death(DEATH, "engine_died"))

    job = {"openai_route": "/v1/completions", "openai_input": {"prompt": "x", "max_tokens": 4, "seed": 3, "stream": True}}
    try:
        parts, _ = await asyncio.gather(run_handler(state, job), main_notices())
    finally:
        await runner.cleanup()

    assert parts[-1] == {"error": continuation.not_continued_sentence(DEATH, "seed")}
    assert len(bodies) == 1 and "return_token_ids" not in bodies[0]
    assert state.continuations() == {"continued": 0, "answered": {"seed": 1}}


async def test_a_job_cancelled_while_it_waits_for_the_relaunch_stays_cancelled(monkeypatch: Any) -> None:
    bodies: list[dict[str, Any]] = []
    runner, port = await serve(routes(bodies))
    state = WorkerState(served_model_name="m", port=port)
    state.mark_ready()
    entered = on_death_wait(monkeypatch)
    job = {"openai_route": "/v1/completions", "openai_input": {"prompt": "x", "max_tokens": 4, "stream": True}}
    task = asyncio.create_task(run_handler(state, job))
    try:
        await entered.wait()
        state.record_death(Death(DEATH, "engine_died"))
        while state.continuations()["continued"] == 0:  # held for the relaunch
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        state.mark_ready()
        await asyncio.sleep(0.3)
    finally:
        await runner.cleanup()
    assert task.cancelled()
    assert len(bodies) == 1  # nothing was sent to the relaunched engine


async def test_a_cancel_while_the_sdk_posts_a_chunk_closes_the_engine_request() -> None:
    """The SDK cancels its job task while it posts a chunk: the handler's generator waits at a `yield`
    and never sees the cancel, yet the engine's request must end (issue 22)."""
    closed = asyncio.Event()
    table = web.RouteTableDef()

    @table.post("/v1/completions")
    async def endless(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            while True:
                await response.write(sse(chunk(" a", [10])))
                await asyncio.sleep(0.01)
        except (ConnectionResetError, asyncio.CancelledError):
            closed.set()
            raise

    runner, port = await serve(table)
    state = WorkerState(served_model_name="m", port=port)
    state.mark_ready()
    from vllm_worker.serving import handler as handler_module

    handler_module.configure(state)
    posting = asyncio.Event()
    kept: list[Any] = []  # the SDK keeps its generator referenced, so no garbage collection closes it

    async def sdk_job() -> None:
        generator = handler_module.handler({"id": "j", "input": {"openai_route": "/v1/completions", "openai_input": {"prompt": "x", "stream": True, "max_tokens": 10}}})
        kept.append(generator)
        async for _part in generator:
            posting.set()
            await asyncio.sleep(3600)  # posting the chunk to the platform, slowly

    task = asyncio.create_task(sdk_job())
    try:
        await posting.wait()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.wait_for(closed.wait(), timeout=30)
    finally:
        await handler_module.close_session()
        await runner.cleanup()
    assert closed.is_set()


# --------------------------------------------------------------------------- the job's record of its sends


def relayed(max_tokens: int | None) -> Any:
    """A streamed completion whose client was sent two tokens (ids 10 and 11) before the engine died."""
    from vllm_worker.serving.job_input import EngineRequest
    from vllm_worker.serving.relayed_job import RelayedJob

    body: dict[str, Any] = {"model": "m", "prompt": "p", "stream": True}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    job = RelayedJob(EngineRequest("POST", "/v1/completions", body, True), {"id": "job-7"})
    assert job.ledger is not None
    job.ledger.first((sse(chunk(" a", [10], first=True)) + sse(chunk(" b", [11]))).decode())
    return job


def test_a_relayed_job_counts_its_retry_and_its_continuation_and_logs_what_it_kept(caplog: Any) -> None:
    from vllm_worker.serving import after_death

    job = relayed(max_tokens=5)
    job.take(after_death.Retry())
    assert (job.facts().retried, job.facts().resent) == (True, 0)  # a retry is not a continuation
    with caplog.at_level("WARNING", logger="vllm_worker.serving.relayed_job"):
        job.take(after_death.Continue())
    assert job.facts().resent == 1
    assert job.ledger.continued and job.ledger.kept == 2 and job.path == continuation.COMPLETIONS
    assert caplog.messages == ["job job-7 continued on the restarted engine: 2 tokens kept, 3 to go"]
    caplog.clear()
    unbounded = relayed(max_tokens=None)
    with caplog.at_level("WARNING", logger="vllm_worker.serving.relayed_job"):
        unbounded.take(after_death.Continue())
        whole = relayed(max_tokens=5)
        whole.take(after_death.SendWhole())
    assert whole.facts().resent == 1 and not whole.ledger.continued
    assert caplog.messages == [
        "job job-7 continued on the restarted engine: 2 tokens kept, the rest to go",
        "job job-7 sent again whole to the restarted engine (it had received nothing yet)",
    ]


def test_a_stream_finished_before_the_death_is_closed_with_the_notice_of_the_deaths_cause() -> None:
    job = relayed(max_tokens=2)
    state = WorkerState(served_model_name="m")
    state.record_death(Death(DEATH, "oom"))
    state.profile = {"name": "eager", "reason": "out of memory", "overrides": {"ENFORCE_EAGER": "1"}}
    closing = job.finish(state)
    assert closing.startswith(continuation.notice_comment(2, "oom", state.profile)) and '"degraded": true' in closing
    assert closing.endswith(job.ledger.closing(job.effective)) and job.facts().resent == 1
    assert job.ledger.continued and job.ledger.kept == 2
    state.death = None  # no death on record: the notice names the engine's death
    assert relayed(max_tokens=2).finish(state).startswith(continuation.notice_comment(2, "engine_died", state.profile))


def test_a_plain_answer_sent_again_carries_the_notice_and_a_body_that_is_not_json_is_its_text() -> None:
    from vllm_worker.serving import after_death

    job = relayed(max_tokens=5)
    state = WorkerState(served_model_name="m")
    state.record_death(Death(DEATH, "oom"))
    state.profile = {"name": "eager", "reason": "out of memory", "overrides": {"ENFORCE_EAGER": "1"}}
    job.take(after_death.SendWhole())
    worker = {"continued": {"tokens_kept": 0, "after": "oom"}, "degraded": True, "profile": state.profile}
    assert job.plain_answer(b'{"id": "cmpl-c", "choices": []}', state) == {"id": "cmpl-c", "choices": [], "worker": worker}
    assert job.plain_answer(b"Internal Server Error \xff", state) == "Internal Server Error \ufffd"
    assert job.plain_answer(b" \n", state) == {"worker": worker}  # an empty body is an empty object


def test_the_context_length_is_the_first_positive_max_model_len_listed_and_a_missing_one_is_logged(caplog: Any) -> None:
    from vllm_worker.serving.relayed_job import _max_model_len, context_length

    listing = {"data": ["not an entry", {"max_model_len": 0}, {"max_model_len": True}, {"max_model_len": 1}, {"max_model_len": 9}]}
    assert _max_model_len(listing) == 1

    class NoModels:  # a session whose /v1/models cannot be read
        def get(self, url: str, timeout: Any) -> Any:
            raise aiohttp.ClientConnectionError("reset")

    state = WorkerState(served_model_name="m")
    with caplog.at_level("WARNING", logger="vllm_worker.serving.relayed_job"):
        assert asyncio.run(context_length(state, NoModels())) is None  # type: ignore[arg-type]
    assert caplog.messages == ["the engine's /v1/models gave no max_model_len; a job without max_tokens gets the engine's default"]


async def test_a_v1_models_that_does_not_answer_is_given_up_within_request_timeout() -> None:
    from vllm_worker.serving.relayed_job import context_length

    table = web.RouteTableDef()

    @table.get("/v1/models")
    async def models(request: web.Request) -> web.Response:
        await asyncio.sleep(30)
        return web.json_response({"data": [{"max_model_len": 8}]})

    runner, port = await serve(table)
    state = WorkerState(served_model_name="m", port=port, request_timeout=0.3)
    try:
        async with aiohttp.ClientSession() as session:
            assert await asyncio.wait_for(context_length(state, session), 5) is None
    finally:
        await runner.cleanup()


def test_an_engine_error_answer_is_a_death_only_when_it_names_the_dead_engine_and_it_reached_the_engine() -> None:
    from vllm_worker.diagnosis.runtime import ENGINE_DEAD_TEXT
    from vllm_worker.serving.after_death import Failed
    from vllm_worker.serving.exchange import Outcome

    dead, refused = Outcome(), Outcome()
    dead.engine_said(f"The engine answered with an error: {ENGINE_DEAD_TEXT}")
    refused.engine_said("The engine refused the request (HTTP 400): max_tokens is too large.")
    assert dead.failed == Failed(f"The engine answered with an error: {ENGINE_DEAD_TEXT}", dying=True, connected=True)
    assert refused.failed == Failed("The engine refused the request (HTTP 400): max_tokens is too large.", dying=False, connected=True)
