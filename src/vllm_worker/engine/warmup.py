"""One small request of the worker's own to a ready engine, before any job: the first user does not pay the warm-up.

The first request after a start pays costs the engine defers to it: kernels and compiled shapes first used
at decode, the tokenizer's and the sampler's first calls, allocator growth (vLLM issue #19824 quotes 30-60 s
for the very first request after start on some setups). The launcher sends this one after every ready
launch (startup and relaunch alike) and before the worker takes jobs. It never fails a start: a model
that serves no completions (an embedding model), or an engine that asks for an API key, answers with an
error, which is logged and the start goes on.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

PROMPT = "Hello"
TOKENS = 8
TIMEOUT_S = 120.0
# vLLM takes a request's id from this header: the warm-up is named in the engine's own log lines.
REQUEST_ID = "vllm-worker-warmup"

# Loopback: never through an HTTP(S)_PROXY from the environment (as engine.process's health checks).
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class WarmUp:
    """How the warm-up request went."""

    seconds: float
    problem: str | None  # None: answered

    def line(self) -> str:
        if self.problem is None:
            return f"warm-up request: {TOKENS} tokens answered in {self.seconds:.2f} s, before the first job"
        return f"warm-up request not answered ({self.problem}, after {self.seconds:.2f} s); taking jobs anyway"


def warm_up(host: str, port: int, model: str, timeout: float = TIMEOUT_S) -> WarmUp:
    """POST one completion of TOKENS tokens to the engine at host:port and wait for its answer."""
    body = json.dumps({"model": model, "prompt": PROMPT, "max_tokens": TOKENS, "temperature": 0}).encode()
    headers = {"Content-Type": "application/json", "X-Request-Id": REQUEST_ID}
    request = urllib.request.Request(f"http://{host}:{port}/v1/completions", data=body, headers=headers, method="POST")
    started = time.monotonic()
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            response.read()
        problem = None
    except urllib.error.HTTPError as error:
        error.close()
        problem = f"HTTP {error.code}"
    except (urllib.error.URLError, OSError, ValueError) as error:
        problem = type(error).__name__ if not str(error) else f"{type(error).__name__}: {error}"
    return WarmUp(time.monotonic() - started, problem)
