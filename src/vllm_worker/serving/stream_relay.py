"""How the engine's stream becomes the job's stream posts: whole SSE events, a few posts a second.

Why: runpod 1.12 posts each chunk a generator handler yields as one HTTP request, and awaits it before
the next. Yielded as vLLM sends them, a 600-token stream made up to 300 posts, and a loaded worker relayed
tokens vLLM had finished seconds before (bench/intake.py, 2026-12-05: see docs/benchmarks.md). So the
stream is read as it arrives and posted at most every STREAM_POST_EVERY_S, the first piece at once and
the last as soon as the stream ends; an event is never split across two posts.
"""

from __future__ import annotations

import asyncio
import re
from typing import AsyncGenerator, Callable

import aiohttp

STREAM_POST_EVERY_S = 0.25


def _last_boundary(buf: bytes, start: int) -> int:
    """End offset of the last complete SSE event in buf (searching from start), or -1."""
    lf = buf.rfind(b"\n\n", start)
    crlf = buf.rfind(b"\r\n\r\n", start)
    end = -1
    if lf >= 0:
        end = lf + 2
    if crlf >= 0 and crlf + 4 > end:
        end = crlf + 4
    return end


_EVENT = re.compile(r".*?(?:\r\n\r\n|\n\n)", re.S)


def split_events(text: str) -> list[str]:
    """Split text made of complete SSE events into single events, each with its terminator (vLLM ends
    each with a blank line, no CR: that case is a plain split)."""
    if "\r" in text:
        return _EVENT.findall(text)
    parts = text.split("\n\n")
    return [part + "\n\n" for part in parts[:-1]]


class SSEFramer:
    """Cuts a byte stream into whole SSE events, keeping a partial event across reads."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed_batch(self, data: bytes) -> str:
        """All events completed by data, as one string ("" if none is complete yet)."""
        old = len(self._buf)
        buf = self._buf + data if old else data
        # Usual case: the read ends exactly at an event boundary.
        if buf.endswith(b"\n\n") or buf.endswith(b"\r\n\r\n"):
            end = len(buf)
        else:
            end = _last_boundary(buf, old - 3 if old > 3 else 0)
            if end < 0:
                self._buf = buf
                return ""
        self._buf = buf[end:]
        # Boundaries are ASCII, so a complete event never ends inside a UTF-8 sequence.
        return (buf[:end] if end < len(buf) else buf).decode("utf-8", "replace")

    def feed(self, data: bytes) -> list[str]:
        """Complete events made available by data, one string per event."""
        batch = self.feed_batch(data)
        return split_events(batch) if batch else []

    def close(self) -> str:
        """Whatever was left after the last complete event (an unterminated event), and reset."""
        rest, self._buf = self._buf, b""
        return rest.decode("utf-8", "replace")


def event_data(event: str) -> str:
    """The data of one SSE event, its data lines joined."""
    lines = []
    for line in event.splitlines():
        if line.startswith("data:"):
            value = line[5:]
            lines.append(value[1:] if value.startswith(" ") else value)
    return "\n".join(lines)


async def coalesced(
    content: aiohttp.StreamReader, every: float, on_end: Callable[[], None] | None = None
) -> AsyncGenerator[bytes, None]:
    """The engine's stream as it arrives, joined so that each piece follows the one before at least `every`
    seconds later (the first at once). It is read as it comes, so a stream that ends is given at once and
    one that breaks gives what it sent before the error is raised (aiohttp raises it before handing over
    data it still holds). `on_end` is called when the stream has ended, before its last piece is given.

    The pause before a piece is told from the request's own timeout by what timed out, never by a clock:
    while something is pending, the read runs as a task of its own and the pause is a wait on it that
    leaves it running. The wait ending with the read unfinished means the pause is over; the request's
    timeout (aiohttp's, armed around the read) can only come out of the read itself. Times are the loop's
    own clock (`loop.time()`: libuv's millisecond clock under uvloop, which the local API runs on).
    """
    loop = asyncio.get_running_loop()
    pending = b""
    due = 0.0
    read: asyncio.Task[bytes] | None = None
    try:
        while True:
            try:
                if pending:
                    if read is None:
                        read = loop.create_task(content.readany())
                    left = due - loop.time()
                    if left > 0:
                        await asyncio.wait((read,), timeout=left)
                    if not read.done():  # the pause is over and nothing more came: give what is pending
                        due = loop.time() + every
                        piece, pending = pending, b""
                        yield piece
                        continue
                    task, read = read, None
                    data = task.result()
                elif read is not None:
                    task, read = read, None
                    data = await task
                else:
                    data = await content.readany()
            except Exception:
                if pending:
                    yield pending
                raise
            if not data:
                if on_end is not None:
                    on_end()
                if pending:
                    yield pending
                return
            pending += data
    finally:
        if read is not None and not read.done():
            read.cancel()
