"""Streamed completions through a real worker, checked whole: for the engine test and bench/streams.py.

Each job asks vLLM for `continuous_usage_stats` and the token ids, so every event names how many tokens
the stream has produced and which ids it adds (vLLM may put several tokens in one event): in a whole
stream each event's count is the ids of the events so far, they reach N, and it ends in `[DONE]`; a
lost, repeated or reordered event breaks the sum. The two ways a job reaches the worker are both driven: the SDK's job loop against the
control-plane stand-in (plain asyncio) and the local API (`--rp_serve_api`: uvicorn, uvloop), whose
`/stream/{id}` returns every part the job's generator yielded.
"""

from __future__ import annotations

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

from tests.support.control_plane import ControlPlane

PROMPT = "The history of the city begins"


def job_input(tokens: int) -> dict[str, Any]:
    body = {
        "prompt": PROMPT,
        "max_tokens": tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "return_token_ids": True,
    }
    return {"openai_route": "/v1/completions", "openai_input": body}


@dataclass(frozen=True)
class Checked:
    tokens: int
    problem: str | None  # None: whole


def check(tokens: int, parts: list[Any], error: Any = None) -> Checked:
    """Whether the parts a client received make the whole stream of `tokens` tokens, once each, in order."""
    if error:
        return Checked(tokens, f"answered with an error: {error}")
    bad = [part for part in parts if not isinstance(part, str)]
    if bad:
        return Checked(tokens, f"a part that is no event text: {str(bad[0])[:300]}")
    text = "".join(parts)
    if not text.endswith("data: [DONE]\n\n") or text.count("[DONE]") != 1:
        return Checked(tokens, f"does not end in one [DONE] (ends {text[-120:]!r})")
    made = 0  # tokens the events so far account for
    for n, line in enumerate(line for line in text.splitlines() if line.startswith("data: {")):
        event = json.loads(line[6:])
        choices = event.get("choices") or []
        if not choices:
            continue  # the closing usage event
        ids = choices[0].get("token_ids") or []
        made += len(ids)
        count = event["usage"]["completion_tokens"]
        if count != made:
            return Checked(tokens, f"event {n} says {count} tokens made, the events so far carry {made}: one lost or repeated")
    if made != tokens:
        return Checked(tokens, f"the events carry {made} tokens of {tokens}")
    return Checked(tokens, None)


def via_job_loop(cp: ControlPlane, timeout: float) -> Callable[[int], Checked]:
    def one(tokens: int) -> Checked:
        job = cp.submit(job_input(tokens))
        result = cp.result(job, timeout=timeout)
        return check(tokens, cp.stream_outputs(job), result.get("error"))

    return one


def via_local_api(port: int, timeout: float) -> Callable[[int], Checked]:
    def post(path: str, body: Any) -> Any:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())

    def one(tokens: int) -> Checked:
        job = post("/run", {"input": job_input(tokens)})
        answer = post(f"/stream/{job['id']}", {})
        parts = [part.get("output") for part in answer.get("stream", [])]
        errors = [part.get("error") for part in parts if isinstance(part, dict) and part.get("error")]
        events = [part for part in parts if not (isinstance(part, dict) and part.get("error"))]
        return check(tokens, events, errors[0] if errors else answer.get("error"))

    return one


def run(one: Callable[[int], Checked], lengths: list[int], at_once: int) -> list[Checked]:
    """Every length streamed through `one`, `at_once` at a time."""
    with ThreadPoolExecutor(max_workers=at_once) as pool:
        return list(pool.map(one, lengths))


def lengths(count: int, low: int = 100, high: int = 2000) -> list[int]:
    """`count` lengths spread from `low` to `high` tokens."""
    return [low + round(i * (high - low) / max(count - 1, 1)) for i in range(count)]
