"""Every stream whole, on the loops the worker runs on: many streams through handler() from a real
HTTP upstream on 127.0.0.1 that sends tokens as an engine does (a few milliseconds apart, in
bursts and pauses), one at a time and eight at once, on asyncio (the job loop) and uvloop (the local
API). Each stream's events arrive once, in order, ending in `[DONE]`, and none is cut short with a
timeout: the request's budget here is far larger than any stream's length.

Why: the relay paces its posts with a wait that times out by design. Under uvloop it once decided
whether that wait or the request's own timeout had fired by comparing `time.monotonic()` with a
deadline, and libuv's cached clock let the wait end a fraction of a millisecond "early": the job was
answered with REQUEST_TIMEOUT after a second or so (3 streams of 4 through the local API).
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from vllm_worker.serving.handler import close_session, configure, handler
from vllm_worker.serving.state import WorkerState
from vllm_worker.serving.stream_relay import split_events

BOTH_LOOPS = True  # tests/integration/conftest.py: asyncio and uvloop
SERVED = "org/served-model"
LENGTHS = (100, 350, 700, 1200, 2000)


def _event(job: int, n: int) -> str:
    chunk = {"id": f"cmpl-{job}", "object": "text_completion", "choices": [{"index": 0, "text": f" t{n}", "finish_reason": None}]}
    return "data: " + json.dumps(chunk, separators=(",", ":")) + "\n\n"


def _events(job: int, tokens: int) -> list[str]:
    return [_event(job, n) for n in range(tokens)] + ["data: [DONE]\n\n"]


async def _tokens(request: web.Request) -> web.StreamResponse:
    """One token every 0 to 3 ms, with a pause of 50 to 300 ms now and then (a long step, a preemption)."""
    body = await request.json()
    job, tokens = body["prompt"], body["max_tokens"]
    rng = random.Random(job)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for event in _events(job, tokens):
        await response.write(event.encode())
        pause = rng.random()
        await asyncio.sleep(rng.uniform(0.05, 0.3) if pause < 0.004 else pause * 0.003)
    await response.write_eof()
    return response


@pytest.fixture
async def upstream_port() -> AsyncIterator[int]:
    app = web.Application()
    app.router.add_post("/v1/completions", _tokens)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    finally:
        await close_session()
        await runner.cleanup()
        configure(None)  # type: ignore[arg-type]


async def _stream(job: int, tokens: int) -> list[Any]:
    job_input = {"openai_route": "/v1/completions", "openai_input": {"prompt": job, "max_tokens": tokens, "stream": True}}
    return [chunk async for chunk in handler({"id": f"job-{job}", "input": job_input})]


def _check_whole(job: int, tokens: int, chunks: list[Any]) -> None:
    errors = [chunk for chunk in chunks if isinstance(chunk, dict)]
    relayed = sum(len(split_events(chunk)) for chunk in chunks if isinstance(chunk, str))
    assert errors == [], f"job {job} ({tokens} tokens) was cut after {relayed} events"
    assert all(chunk.endswith("\n\n") and "".join(split_events(chunk)) == chunk for chunk in chunks), "an event was split"
    assert "".join(chunks) == "".join(_events(job, tokens))


def _configure(port: int) -> None:
    state = WorkerState(served_model_name=SERVED, port=port, max_concurrency=8, request_timeout=900.0, ready_timeout=5.0)
    state.mark_ready()
    configure(state)


async def test_streams_one_at_a_time_arrive_whole(upstream_port: int) -> None:
    _configure(upstream_port)
    for job, tokens in enumerate(LENGTHS):
        _check_whole(job, tokens, await _stream(job, tokens))


async def test_eight_streams_at_once_arrive_whole(upstream_port: int) -> None:
    _configure(upstream_port)
    jobs = [(100 + n, LENGTHS[n % len(LENGTHS)]) for n in range(8)]
    answers = await asyncio.gather(*(_stream(job, tokens) for job, tokens in jobs))
    for (job, tokens), chunks in zip(jobs, answers):
        _check_whole(job, tokens, chunks)
