"""One request to the engine and its answer, relayed: a stream as whole SSE events, a plain answer as bytes.

Why a room of its own: the handler decides what to send and what to do when it fails
(serving.after_death); this sends it once and says how it ended, as a typed `Outcome`. What
failed is told by what raised, never by comparing clocks: the request's budget is aiohttp's
timeout around this one request (an `asyncio.TimeoutError` from it is that budget), the relay's
own pauses end without raising (serving.stream_relay).

- A stream is read as it comes and posted at most every STREAM_POST_EVERY_S (each post is an HTTP
  request of the SDK's), the first events at once, an event never split; an error event ends it with
  the engine's sentence; a stream the engine ended without `[DONE]` gets one.
- A cancel closes the request whatever the job's generator is doing: the SDK cancels the task that
  drives it, which may be posting a chunk while the generator waits at a `yield` (and so never sees
  the cancel); a callback on that task closes the response, and vLLM aborts a request whose client
  went away.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp

from vllm_worker.diagnosis.runtime import ENGINE_DEAD_TEXT
from vllm_worker.serving.after_death import Failed
from vllm_worker.serving.answers import error_sentence_from_response, stream_error, timeout_sentence, transport_sentence
from vllm_worker.serving.stream_relay import STREAM_POST_EVERY_S, SSEFramer, coalesced

log = logging.getLogger(__name__)

JSON_HEADERS = {"Content-Type": "application/json"}
DONE = "data: [DONE]\n\n"
_MIN_BUDGET_S = 1.0  # a continuation sent with less left still gets a second to answer


@functools.lru_cache(maxsize=8)
def client_timeout(total: float) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(total=total)


@dataclass(frozen=True)
class Send:
    """One request: where, what, and the budget it runs under (`left`: what was left of REQUEST_TIMEOUT for a
    continuation, None for a job's first request, whose budget is REQUEST_TIMEOUT itself)."""

    method: str
    host: str
    port: int
    path: str
    data: Any
    is_json: bool
    request_timeout: float
    left: float | None = None

    @property
    def budget(self) -> float:
        return max(self.left, _MIN_BUDGET_S) if self.left is not None else self.request_timeout


@dataclass(frozen=True)
class Relay:
    """How a streamed answer reaches the client: the comment it opens with (None: none), each batch of whole
    events as the client sees it, and what to do once the engine has sent everything."""

    opening: str | None
    rewrite: Callable[[str], str]
    on_end: Callable[[], None]


@dataclass
class Outcome:
    """How the request ended: `failed`, or a plain answer's `raw` bytes, or neither (a stream relayed whole)."""

    failed: Failed | None = None
    raw: bytes | None = None

    def engine_said(self, sentence: str) -> None:
        """The engine answered with an error: a dying engine's (vLLM's EngineDeadError) may be continued."""
        self.failed = Failed(sentence, dying=ENGINE_DEAD_TEXT in sentence, connected=True)


async def exchange(session: aiohttp.ClientSession, send: Send, relay: Relay, outcome: Outcome) -> AsyncIterator[str]:
    """Send `send` once; yield a stream's posts as they are due; record how it ended in `outcome`."""
    started = False
    try:
        async with session.request(
            send.method,
            f"http://{send.host}:{send.port}{send.path}",
            data=send.data,
            headers=JSON_HEADERS if send.is_json else None,
            timeout=client_timeout(send.budget),
        ) as response:
            started = True
            with _closed_on_cancel(response):
                if response.status >= 400:
                    text = await response.text(errors="replace")
                    outcome.engine_said(error_sentence_from_response(response.status, text, send.path))
                elif response.headers.get("Content-Type", "").startswith("text/event-stream"):
                    async for post in _stream(response, relay, outcome):
                        yield post
                else:
                    outcome.raw = await response.read()
                    relay.on_end()
    except asyncio.TimeoutError:  # aiohttp's budget for this request: nothing else here raises it
        outcome.failed = Failed(timeout_sentence(send.request_timeout, send.left), dying=False, connected=True)
    except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as error:
        sentence = transport_sentence(error, send.host, send.port, started)
        outcome.failed = Failed(sentence, dying=True, connected=not isinstance(error, aiohttp.ClientConnectorError))
    except Exception as error:  # a bug here must still reach the user as a sentence
        log.exception("handler failed on %s %s", send.method, send.path)
        sentence = f"The worker failed while relaying the request to {send.path} ({type(error).__name__}: {error})."
        outcome.failed = Failed(sentence, dying=False, connected=True)


async def _stream(response: aiohttp.ClientResponse, relay: Relay, outcome: Outcome) -> AsyncIterator[str]:
    if relay.opening is not None:
        yield relay.opening
    last = ""
    pieces = coalesced(response.content, STREAM_POST_EVERY_S, relay.on_end)
    async with contextlib.aclosing(pieces), contextlib.aclosing(_batches(pieces)) as batches:
        async for batch in batches:
            post, failure = _checked(batch, relay)
            if post:
                yield post
                last = post
            if failure is not None:
                outcome.engine_said(failure)
                return
    if not (last.endswith(DONE) or last.rstrip().endswith("[DONE]")):
        yield DONE


async def _batches(pieces: AsyncIterator[bytes]) -> AsyncGenerator[str, None]:
    """The stream's whole events, a batch per post (the pieces are already a few a second), then an event
    the engine did not terminate, closed."""
    framer = SSEFramer()
    async for piece in pieces:
        batch = framer.feed_batch(piece)
        if batch:
            yield batch
    rest = framer.close()
    if rest.strip():
        yield rest.rstrip("\r\n") + "\n\n"


def _checked(batch: str, relay: Relay) -> tuple[str, str | None]:
    """The client's text of a batch of whole events, cut before an engine error event (and its sentence)."""
    failure = None
    if '"error"' in batch:
        batch, failure = stream_error(batch)
    return (relay.rewrite(batch) if batch else batch), failure


@contextlib.contextmanager
def _closed_on_cancel(response: aiohttp.ClientResponse) -> Iterator[None]:
    """While the response is read, the end of the job's task (a cancel above all) closes it."""
    task = asyncio.current_task()

    def close(_task: Any) -> None:
        response.close()

    if task is not None:
        task.add_done_callback(close)
    try:
        yield
    finally:
        if task is not None:
            task.remove_done_callback(close)
