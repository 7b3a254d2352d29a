"""How the real CPU engine's speed grows with its batch: the figures tests/support/kv_model.py's step time is
set from.

The worker (its flags, through the runpod SDK's job loop against the control-plane stand-in) on the tiny
Llama with a KV cache large enough that nothing is preempted; N requests of 600 generated tokens sent
to the engine at once, for each N. Prints generated tokens a second and the time of one engine step at
each N, and the ratio of the largest batch's tokens a second to one request's. Then what a prompt token
costs (a preempted request's tokens are computed again as one): single requests of one generated token
after prompts of several lengths, the median of five each; the slope between the shortest and longest.

    flock /tmp/vllm-engine.lock .venv/bin/python bench/engine_batch.py [--batches 1,5,10,24] [--prompts 20,800]

Asserts nothing (a bench, not a test).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from tests.support import engine_env, vllm_metrics  # noqa: E402
from tests.support.control_plane import ControlPlane  # noqa: E402
from tests.support.worker_proc import WorkerProcess, stop_with_engine  # noqa: E402

TOKENS = 600
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def complete(port: int, tokens: int, words: int = 20) -> int:
    """One completion of `tokens` after a prompt of `words` words; returns its prompt tokens."""
    body = {"model": str(engine_env.TINY_MODEL), "prompt": "hello " * words, "max_tokens": tokens, "min_tokens": tokens}
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with _OPENER.open(request, timeout=600) as response:
            return int(json.loads(response.read())["usage"]["prompt_tokens"])
    except urllib.error.HTTPError as error:
        raise SystemExit(f"{words} words: {error.code} {error.read().decode(errors='replace')}") from None


def prompt_cost(port: int, words: list[int]) -> dict[int, float]:
    """Median seconds of a one-token completion after each prompt length, keyed by its prompt tokens."""
    times: dict[int, float] = {}
    for n in words:
        runs = []
        for _ in range(5):
            start = time.monotonic()
            tokens = complete(port, 1, n)
            runs.append(time.monotonic() - start)
        times[tokens] = sorted(runs)[2]
    return times


def generated(port: int) -> float:
    return vllm_metrics.metric(port, "vllm:generation_tokens_total")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", default="1,2,4,5,6,8,10,12,16,20,24")
    # "hello " is two tokens to the tiny model (20 words: 42 with the first), and the prompt with its one
    # generated token must fit MAX_MODEL_LEN=2048: 800 words at most.
    parser.add_argument("--prompts", default="20,200,400,800", help="prompt lengths in words, 'hello ' each")
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    if not engine_env.VLLM_BIN.exists():
        print(f"{engine_env.VLLM_BIN} is missing: run `bash scripts/setup.sh`", file=sys.stderr)
        return 2
    env = engine_env.tiny_worker_env(
        engine_env.TINY_MODEL, MAX_MODEL_LEN="2048", MAX_CONCURRENCY="30", ADAPTIVE_CONCURRENCY="false", DRAIN_TIMEOUT="0"
    )
    port = int(env["VLLM_PORT"])
    with ControlPlane() as cp:
        proc = WorkerProcess(env, control_plane=cp, workdir=Path(tempfile.mkdtemp(prefix="bench-batch-"))).start()
        try:
            proc.wait_for_log(r"engine ready; taking jobs", timeout=engine_env.BOOT_TIMEOUT)
            complete(port, 20)  # a first request warms the engine
            rates: dict[int, float] = {}
            for n in batches:
                before, start = generated(port), time.monotonic()
                threads = [threading.Thread(target=complete, args=(port, TOKENS)) for _ in range(n)]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
                seconds = time.monotonic() - start
                rates[n] = (generated(port) - before) / seconds
                print(f"batch {n:>2}: {rates[n]:7.1f} tokens/s, one step {1000 * n / rates[n]:5.1f} ms", flush=True)
            times = prompt_cost(port, [int(w) for w in args.prompts.split(",")])
            for tokens, seconds in times.items():
                print(f"prompt of {tokens:>4} tokens, one token generated: {1000 * seconds:6.1f} ms", flush=True)
        finally:
            stop_with_engine(proc, timeout=60)
    largest, smallest = max(batches), min(batches)
    print(f"tokens/s at batch {largest} over batch {smallest}: {rates[largest] / rates[smallest]:.2f}")
    short, long = min(times), max(times)
    print(f"a prompt token: {1000 * (times[long] - times[short]) / (long - short):.3f} ms ({short} to {long} tokens)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
