"""What the job handler costs: the same requests sent straight to an OpenAI-shaped upstream and through `handler()`.

The upstream is a fast aiohttp server in its own process (as the engine is), answering a canned
chat completion or a 20-event SSE stream at once, so the figures are the proxy's own overhead.
For each case (concurrency 1 and 30, streaming or not) short blocks alternate direct / through
many times; the figures are medians over blocks (ratio: median of each adjacent pair's ratio),
so a noisy neighbour on the shared machine favours neither side.
"CPU/req" is this process's CPU time per request (client, plus the handler on the through
side): on a shared machine it is steadier than wall-clock figures.

Targets: through-handler throughput >= 0.9 of direct at concurrency 30; p50 added latency
< 1 ms. Prints figures; asserts nothing (timings belong in benchmarks, not tests).

    .venv/bin/python bench/proxy.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from vllm_worker.serving.handler import close_session, configure, handler  # noqa: E402
from vllm_worker.serving.state import WorkerState  # noqa: E402

MODEL = "bench/model"
CHAT_JSON = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1700000000,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "The quick brown fox jumps over the lazy dog. " * 4},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 40, "total_tokens": 52},
    }
).encode()
SSE_BODY = (
    "".join(
        "data: "
        + json.dumps(
            {
                "id": "chatcmpl-bench",
                "object": "chat.completion.chunk",
                "created": 1700000000,
                "model": MODEL,
                "choices": [{"index": 0, "delta": {"content": f" token{i}"}, "finish_reason": None}],
            }
        )
        + "\n\n"
        for i in range(19)
    )
    + "data: [DONE]\n\n"
).encode()
SSE_PIECES = [SSE_BODY[i : i + 700] for i in range(0, len(SSE_BODY), 700)]
MESSAGES = [{"role": "user", "content": "Say something."}]


def _serve(port: int) -> None:
    from aiohttp import web

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not body.get("stream"):
            return web.Response(body=CHAT_JSON, content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for piece in SSE_PIECES:  # several writes, boundaries mid-event, like a real engine's
            await response.write(piece)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, handle_signals=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def _wait_up(port: int) -> None:
    for _ in range(200):
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            await asyncio.sleep(0.05)
    raise RuntimeError("upstream did not start")


async def _direct_one(session: aiohttp.ClientSession, url: str, stream: bool) -> None:
    body = json.dumps({"model": MODEL, "messages": MESSAGES, "stream": stream}).encode()
    async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as response:
        if stream:
            async for _ in response.content.iter_any():
                pass
        else:
            json.loads(await response.read())


async def _through_one(stream: bool) -> None:
    job = {"id": "bench", "input": {"openai_route": "/v1/chat/completions", "openai_input": {"messages": MESSAGES, "stream": stream}}}
    async for chunk in handler(job):
        if isinstance(chunk, dict) and "error" in chunk:
            raise RuntimeError(chunk["error"])


async def _load(fn: Any, requests: int, concurrency: int) -> tuple[float, list[float], float]:
    """(requests/s, latencies, this process's CPU seconds per request)."""
    latencies: list[float] = []
    remaining = requests

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            started = time.perf_counter()
            await fn()
            latencies.append(time.perf_counter() - started)

    cpu = time.process_time()
    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    return requests / elapsed, latencies, (time.process_time() - cpu) / requests


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main(quick: bool) -> None:
    port = _free_port()
    server = multiprocessing.get_context("spawn").Process(target=_serve, args=(port,), daemon=True)
    server.start()
    try:
        await _wait_up(port)
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        state = WorkerState(served_model_name=MODEL, port=port, max_concurrency=30, request_timeout=60.0)
        state.mark_ready()
        configure(state)
        connector = aiohttp.TCPConnector(limit=34, limit_per_host=0, keepalive_timeout=60.0)
        async with aiohttp.ClientSession(connector=connector) as session:
            cases = [(1, False), (1, True), (30, False), (30, True)]
            pairs = 8 if quick else 20
            print(f"{'case':<16}{'direct req/s':>13}{'through req/s':>14}{'ratio':>7}"
                  f"{'p50 direct':>12}{'p50 added':>11}{'p99 added':>11}{'CPU/req direct':>16}{'CPU added':>11}")
            for concurrency, stream in cases:
                block = 60 if concurrency == 1 else 300
                direct = lambda: _direct_one(session, url, stream)  # noqa: E731
                through = lambda: _through_one(stream)  # noqa: E731
                await _load(direct, 50, concurrency)  # warm both pools
                await _load(through, 50, concurrency)
                rps: dict[str, list[float]] = {"direct": [], "through": []}
                lat: dict[str, list[float]] = {"direct": [], "through": []}
                cpu: dict[str, list[float]] = {"direct": [], "through": []}
                ratios, cpu_added = [], []
                for i in range(pairs):
                    order = (("direct", direct), ("through", through))
                    for name, fn in order if i % 2 == 0 else order[::-1]:
                        r, latencies, c = await _load(fn, block, concurrency)
                        rps[name].append(r)
                        lat[name].extend(latencies)
                        cpu[name].append(c)
                    ratios.append(rps["through"][-1] / rps["direct"][-1])
                    cpu_added.append(cpu["through"][-1] - cpu["direct"][-1])
                d_lat, t_lat = lat["direct"], lat["through"]
                p50_added = (statistics.median(t_lat) - statistics.median(d_lat)) * 1000
                p99_added = (_pct(t_lat, 0.99) - _pct(d_lat, 0.99)) * 1000
                label = f"c={concurrency} {'stream' if stream else 'json'}"
                print(f"{label:<16}{statistics.median(rps['direct']):>13.0f}{statistics.median(rps['through']):>14.0f}"
                      f"{statistics.median(ratios):>7.2f}"
                      f"{statistics.median(d_lat) * 1000:>10.2f}ms{p50_added:>9.2f}ms{p99_added:>9.2f}ms"
                      f"{statistics.median(cpu['direct']) * 1e6:>14.0f}us{statistics.median(cpu_added) * 1e6:>9.0f}us")
        await close_session()
    finally:
        server.terminate()
        server.join(5)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests per case")
    started = time.perf_counter()
    asyncio.run(main(parser.parse_args().quick))
    print(f"total {time.perf_counter() - started:.1f} s")
