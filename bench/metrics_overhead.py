"""Whether reading vLLM's /metrics slows the jobs: the same batch of requests with and without the reads.

The worker reads /metrics every 10 s (serving/engine_load.LoadWatch) and once per status job.
The API server that answers /metrics is the one that relays every token, so its cost lands on
the jobs if anywhere. This boots the real vLLM CPU engine on the tiny model and runs the same
batch of concurrent completions in alternating rounds: no reads, the worker's LoadWatch at its
own interval, and LoadWatch at 0.1 s (100 times as often, the worst case). It prints the median
batch time of each side by side, and the ratios to the no-read rounds.

    .venv/bin/python bench/metrics_overhead.py [--rounds 3] [--requests 32] [--tokens 400]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from tests.support import engine_env  # noqa: E402
from vllm_worker.serving import engine_load  # noqa: E402

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def batch(base: str, model: str, requests: int, tokens: int) -> float:
    """Seconds for `requests` completions of `tokens` tokens each, all at once."""
    body = json.dumps({"model": model, "prompt": "Once upon a time " * 10, "max_tokens": tokens, "ignore_eos": True}).encode()

    def one() -> None:
        request = urllib.request.Request(base + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
        with _OPENER.open(request, timeout=600) as response:
            response.read()

    threads = [threading.Thread(target=one) for _ in range(requests)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=400)
    args = parser.parse_args()
    model = engine_env.make_tiny_model()
    port = engine_env.free_port()
    flags = tuple(flag for flag in engine_env.TINY_FLAGS if flag != "--disable-log-stats")  # /metrics needs the stats
    engine = engine_env.start_ready_engine(engine_env.serve_argv(model, port, flags=flags), port)
    base = f"http://127.0.0.1:{port}"
    sides = {"no reads": None, f"every {engine_load.POLL_S:g} s": engine_load.POLL_S, "every 0.1 s": 0.1}
    times: dict[str, list[float]] = {name: [] for name in sides}
    reads: dict[str, int] = {name: 0 for name in sides}
    try:
        batch(base, str(model), args.requests, 8)  # warm-up
        for _ in range(args.rounds):
            for name, interval in sides.items():
                watch = None
                if interval is not None:
                    watch = engine_load.LoadWatch("127.0.0.1", port, {}, args.requests, interval=interval)
                    counted = watch.observe
                    count = [0]

                    def observe(sample: engine_load.Sample, counted=counted, count=count) -> str | None:
                        count[0] += 1
                        return counted(sample)

                    watch.observe = observe  # type: ignore[method-assign]
                    watch.start()
                times[name].append(batch(base, str(model), args.requests, args.tokens))
                if watch is not None:
                    watch.stop()
                    reads[name] += count[0]
    finally:
        engine.stop(engine_env.STOP_GRACE)
    baseline = statistics.median(times["no reads"])
    print(f"{args.requests} requests x {args.tokens} tokens at once, {args.rounds} alternating rounds, tiny model, vLLM CPU engine")
    for name in sides:
        median = statistics.median(times[name])
        print(f"{name:12s} median {median:6.2f} s  ratio {median / baseline:5.3f}  /metrics reads {reads[name]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
