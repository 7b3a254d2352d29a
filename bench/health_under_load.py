"""How slow vLLM's /health gets under load, beside an idle engine: the basis of ENGINE_HANG_TIMEOUT.

The worker calls an engine hung when /health has not answered for ENGINE_HANG_TIMEOUT seconds.
A busy engine still answers /health (its API server process is not the engine core), but on a
loaded machine it answers later; the default must stay far above the slowest answer seen under
load, long prefills included. This boots the real vLLM CPU engine on the tiny model, polls
/health for a while idle, then again while N long requests run at once (long prompts, so the
prefills are as long as the context allows), and prints the latency of each phase side by side
with the ratio of the loaded maximum to the idle median.

    .venv/bin/python bench/health_under_load.py [--requests 30] [--seconds 30]
"""

from __future__ import annotations

import argparse
import os
import json
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from tests.support import engine_env  # noqa: E402

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def poll(url: str, seconds: float, every: float = 0.2) -> list[float]:
    """Latencies of /health over `seconds` (a timeout of 30 s counts as 30 s)."""
    latencies: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        start = time.monotonic()
        try:
            with _OPENER.open(url, timeout=30) as response:
                response.read()
        except (urllib.error.URLError, OSError):
            pass
        latencies.append(time.monotonic() - start)
        time.sleep(every)
    return latencies


def load(base: str, model: str, requests: int, stop: threading.Event) -> list[threading.Thread]:
    prompt = "Once upon a time " * 20

    def one() -> None:
        body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 300, "ignore_eos": True}).encode()
        while not stop.is_set():
            request = urllib.request.Request(base + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
            try:
                with _OPENER.open(request, timeout=600) as response:
                    response.read()
            except (urllib.error.URLError, OSError):
                time.sleep(0.5)

    threads = [threading.Thread(target=one, daemon=True) for _ in range(requests)]
    for thread in threads:
        thread.start()
    return threads


def row(name: str, values: list[float]) -> str:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return f"{name:8s} n={len(values):4d}  median {statistics.median(values) * 1000:7.1f} ms  p99 {p99 * 1000:7.1f} ms  max {max(values) * 1000:7.1f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    model = engine_env.make_tiny_model()
    port = engine_env.free_port()
    argv = engine_env.serve_argv(model, port)
    engine = engine_env.start_ready_engine(argv, port)
    base = f"http://127.0.0.1:{port}"
    try:
        idle = poll(base + "/health", args.seconds / 2)
        stop = threading.Event()
        load(base, str(model), args.requests, stop)
        time.sleep(2)
        loaded = poll(base + "/health", args.seconds)
        stop.set()
    finally:
        engine.stop(engine_env.STOP_GRACE)
    print(row("idle", idle))
    print(row("loaded", loaded))
    print(f"loaded max / idle median: {max(loaded) / statistics.median(idle):.1f}x "
          f"({args.requests} long requests at once on {os.cpu_count()} cores)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
