"""A job outlives its engine (issue 24), over the REAL vLLM CPU engine and the runpod SDK's job loop.

Four jobs at temperature 0 (a completion and a chat completion, each streamed and plain, 1,500
tokens) run undisturbed once, then again with the engine's whole process group SIGKILLed at least an
eighth of the way through (frozen first, and only while no job has been answered), then again
through a hang (SIGSTOP of the group, a short ENGINE_HANG_TIMEOUT). Each time all four complete
whole: every token asked for, one stream per streamed job with no event twice (the completion's
client asks for token ids: the worker kept at least what the client held when the engine froze, and
the stream holds every token asked for once) and usage adding up, each response naming the
continuation. How many texts are identical to the undisturbed run's is printed, not required:
vLLM's CPU kernels are not batch-invariant, and the steps' batches differ from run to run with the
moments the jobs join, so even the tokens streamed before the kill can differ from the undisturbed
run's (two clean-clone CI runs, 2026-12-06: token 427 of 785 and of 1,374 kept, both before the
kill). A streamed job with a fixed seed, in flight at the kill, is answered with the death and why
it was not continued.

One worker serves all three rounds (one boot, two relaunches).
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support import engine_env
from tests.support.control_plane import ControlPlane
from tests.support.worker_proc import WorkerProcess, engine_leader, kill_engine_group

pytestmark = pytest.mark.engine

TOKENS = 1500  # long enough that a loaded machine's slow reactions (seconds) still freeze them in flight
HANG_TIMEOUT = 10  # as tests/engine/test_engine_hang.py: far above a busy engine's slowest /health here
SETTLE_S = 3.0  # a frozen engine's jobs checked for answers after this: well inside HANG_TIMEOUT
PROMPT = "Once upon a time, in a land far away,"
MESSAGES = [{"role": "user", "content": "Tell me a long story about a dragon."}]
SAMPLING = {"max_tokens": TOKENS, "min_tokens": TOKENS, "temperature": 0}
JOBS: dict[str, Any] = {
    "completion-streamed": {
        "openai_route": "/v1/completions",
        "openai_input": {"prompt": PROMPT, **SAMPLING, "stream": True, "return_token_ids": True,
                         "stream_options": {"include_usage": True}},
    },
    "completion-plain": {"prompt": PROMPT, "sampling_params": SAMPLING},
    "chat-streamed": {
        "openai_route": "/v1/chat/completions",
        "openai_input": {"messages": MESSAGES, **SAMPLING, "stream": True, "stream_options": {"include_usage": True}},
    },
    "chat-plain": {"messages": MESSAGES, "sampling_params": SAMPLING},
}  # fmt: skip
SEEDED = {
    "openai_route": "/v1/completions",
    "openai_input": {"prompt": PROMPT, **SAMPLING, "seed": 7, "stream": True},
}


def streamed_text(cp: ControlPlane, job: str) -> str:
    """What the streamed job's client has read so far."""
    return "".join(part for part in cp.stream_outputs(job) if isinstance(part, str))


def events(cp: ControlPlane, job: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The streamed job's data events (parsed) and its `: worker` comments, as its client reads them."""
    text = streamed_text(cp, job)
    data = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert data and data[-1] == "[DONE]" and data.count("[DONE]") == 1, data[-3:]
    comments = [line for line in text.splitlines() if line.startswith(": worker ")]
    return [json.loads(d) for d in data[:-1]], comments


def outcome(cp: ControlPlane, name: str, job: str) -> dict[str, Any]:
    """Text, token ids (where the client asked), usage and the worker's notice of one finished job."""
    result = cp.result(job, timeout=engine_env.BOOT_TIMEOUT)
    assert "error" not in result, f"{name}: {str(result)[:400]}"
    if name.endswith("plain"):
        [body] = result["output"]
        choice = body["choices"][0]
        text = choice["message"]["content"] if name.startswith("chat") else choice["text"]
        return {"text": text, "usage": body["usage"], "worker": body.get("worker"), "ids": None}
    chunks, comments = events(cp, job)
    assert len({c["id"] for c in chunks}) == 1, f"{name}: one stream has one id"
    usage = [c["usage"] for c in chunks if c.get("usage")]
    assert len(usage) == 1, f"{name}: one usage event"
    finishes = [c for c in chunks for ch in c["choices"] if ch.get("finish_reason")]
    assert len(finishes) == 1, f"{name}: one final event"
    if name.startswith("chat"):
        text = "".join(ch["delta"].get("content") or "" for c in chunks for ch in c["choices"])
        ids = None
    else:
        text = "".join(ch["text"] for c in chunks for ch in c["choices"])
        ids = [i for c in chunks for ch in c["choices"] for i in ch.get("token_ids") or ()]
    worker = [json.loads(line[len(": worker "):]) for line in comments]
    return {"text": text, "usage": usage[0], "worker": worker[-1] if worker else None, "ids": ids}


def streamed_ids(cp: ControlPlane, job: str) -> int:
    """Token ids the streamed completion's client has received so far (whole events only)."""
    events = [line for line in streamed_text(cp, job).splitlines(keepends=True) if line.startswith("data: {") and line.endswith("\n")]
    return sum(len(choice.get("token_ids") or ()) for line in events for choice in json.loads(line[6:])["choices"])


def run_round(
    cp: ControlPlane,
    freeze: Callable[[dict[str, str]], bool] | None = None,
    tries: int = 3,
) -> dict[str, Any]:
    """The four jobs and the seeded one at once (every round, the undisturbed one too, so the texts printed as
    identical come from the same jobs); `freeze` runs once the streamed completion's client
    holds an eighth of its tokens, the chat stream's client an event, and the worker every job.

    What the client holds trails what vLLM made, read in this process at once: unloaded by little, with
    both cores busy by up to two thirds of the job (a third then froze the engine after a plain job had
    ended, three rounds running). vLLM's /metrics did not serve: on a loaded machine a read waited about
    as long as the whole round, and a clean-clone CI run killed the engine once its jobs had ended.
    `freeze` stops the engine and returns False when a job had been answered by then: the round is let
    go on and run again."""
    for _ in range(tries):
        jobs = {name: cp.submit(job) for name, job in {**JOBS, "seeded": SEEDED}.items()}
        late = False
        if freeze is not None:
            deadline = time.monotonic() + engine_env.BOOT_TIMEOUT
            # Every job taken by the worker too: one still in the platform's queue at the freeze is not in flight. And
            # the chat stream's client holds an event: one that holds none is sent again whole, not continued (a
            # clean-clone CI run killed the engine before the chat stream's first event, 2026-12-06).
            while (
                streamed_ids(cp, jobs["completion-streamed"]) < TOKENS / 8
                or not all(cp.taken(job) for job in jobs.values())
                or "data: {" not in streamed_text(cp, jobs["chat-streamed"])
            ):
                assert time.monotonic() < deadline, not_in_flight(cp, jobs)
                # Not a tighter loop: each look parses the whole stream, and the control plane serving the worker's
                # posts runs in this process (a clean-clone CI run, 2026-12-07, waited out BOOT_TIMEOUT here).
                time.sleep(0.1)
            late = not freeze(jobs)
            held = streamed_ids(cp, jobs["completion-streamed"])  # the engine is frozen: what its client holds now
        results: dict[str, Any] = {}
        for name, job in jobs.items():
            results[name] = cp.result(job, timeout=engine_env.BOOT_TIMEOUT) if name not in JOBS else outcome(cp, name, job)
        if freeze is not None:
            results["completion-streamed"]["held_at_freeze"] = held
        if not late:
            return results
        print("a job was answered before the engine was frozen: the round runs again")
    raise AssertionError(f"in {tries} rounds a job was always answered before the engine was frozen")


def not_in_flight(cp: ControlPlane, jobs: dict[str, str]) -> str:
    """Why the round never reached its freeze, for the failure's reader: each job's state at the control plane."""
    states = {
        name: {"taken": cp.taken(job), "answered": bool(cp.results_posted(job)), "streamed": len(streamed_text(cp, job))}
        for name, job in jobs.items()
    }
    return (
        f"no eighth of the streamed completion's tokens held ({streamed_ids(cp, jobs['completion-streamed'])} ids), a job "
        f"not taken, or no chat event: {states}"
    )


def frozen_in_flight(cp: ControlPlane, worker: WorkerProcess, jobs: dict[str, str]) -> psutil.Process | None:
    """SIGSTOP of the engine's process group; its leader when no job has been answered SETTLE_S later (a
    job vLLM ended just before the freeze is answered by then), else SIGCONT and None."""
    leader = engine_leader(worker.pid)
    os.killpg(leader.pid, signal.SIGSTOP)
    time.sleep(SETTLE_S)
    if any(cp.results_posted(job) for job in jobs.values()):
        os.killpg(leader.pid, signal.SIGCONT)
        return None
    return leader


@dataclass
class Serving:
    cp: ControlPlane
    worker: WorkerProcess
    base: dict[str, Any]  # the undisturbed round's outcomes (the four jobs and the seeded one)


@pytest.fixture(scope="module")
def serving(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serving]:
    env = engine_env.tiny_worker_env(
        tiny_model,
        MAX_MODEL_LEN="2048",
        MAX_CONCURRENCY="8",
        ENGINE_HANG_TIMEOUT=str(HANG_TIMEOUT),
        VLLM_STOP_GRACE="5",
        REQUEST_TIMEOUT="3600",
        WORKER_READY_TIMEOUT=str(int(engine_env.BOOT_TIMEOUT)),
    )
    with ControlPlane() as cp:
        worker = WorkerProcess(env, control_plane=cp, workdir=tmp_path_factory.mktemp("continuation")).start()
        try:
            worker.wait_for_log(r"engine ready; taking jobs", timeout=engine_env.BOOT_TIMEOUT)
            yield Serving(cp, worker, run_round(cp))
        finally:
            worker.stop(timeout=120)


def check_whole(name: str, got: dict[str, Any], base: dict[str, Any]) -> bool:
    """Every token asked for, usage adding up, the continuation named; True when the text is identical."""
    usage = got["usage"]
    assert usage["completion_tokens"] == TOKENS, f"{name}: {usage}"
    assert usage["prompt_tokens"] == base["usage"]["prompt_tokens"], f"{name}: {usage}"
    assert usage["total_tokens"] == usage["prompt_tokens"] + TOKENS
    assert got["worker"] is not None and "continued" in got["worker"], f"{name}: the response names no continuation"
    if got["ids"] is not None:
        assert len(got["ids"]) == TOKENS, f"{name}: {len(got['ids'])} token ids streamed"
        held, kept = got["held_at_freeze"], got["worker"]["continued"]["tokens_kept"]
        # The worker kept at least what the client held when the engine froze, so no token the client had read is
        # sent again; with the count above, none is missing or sent twice after the cut.
        assert TOKENS / 8 <= held <= kept, f"{name}: {held} token ids held at the freeze, {kept} kept"
    return got["text"] == base["text"]


def report(label: str, results: dict[str, Any], base: dict[str, Any], worker: WorkerProcess) -> int:
    try:
        same = [name for name in JOBS if check_whole(name, results[name], base[name])]
    except AssertionError as error:
        # What the worker did with each job at the death (continued, sent again whole), for a failure's reader.
        lines = [line for line in worker.log().splitlines() if re.search(r"continued on the restarted|sent again whole|stopped", line)]
        raise AssertionError(f"{error}\nthe worker's log at the deaths:\n" + "\n".join(lines[-12:])) from error
    kept = {name: (results[name]["worker"] or {}).get("continued", {}).get("tokens_kept") for name in JOBS}
    print(
        f"{label}: 4/4 complete; identical to the undisturbed run: {len(same)}/4 {same}; tokens kept {kept}; "
        f"the streamed completion's client held {results['completion-streamed']['held_at_freeze']} at the freeze"
    )
    return len(same)


def test_four_jobs_in_flight_when_the_engine_is_killed_complete_whole(serving: Serving) -> None:
    cp, worker, base = serving.cp, serving.worker, serving.base

    def kill(jobs: dict[str, str]) -> bool:
        leader = frozen_in_flight(cp, worker, jobs)
        if leader is not None:
            kill_engine_group(leader)
        return leader is not None

    results = run_round(cp, kill)
    report("SIGKILL of the engine's process group", results, base, worker)

    seeded = results["seeded"]
    assert set(seeded) == {"error"}, str(seeded)[:300]
    assert seeded["error"].startswith("The engine was killed by signal 9 (SIGKILL) while serving requests")
    assert seeded["error"].endswith("It was not continued on the restarted engine: it fixes a seed, and a continuation would draw from another random stream than the undisturbed run.")
    [status] = cp.result(cp.submit({"route": "/worker/status"}), timeout=60)["output"]
    assert status["continuations"]["continued"] >= 4 and status["continuations"]["answered"].get("seed") == 1
    assert len(re.findall(r"continued on the restarted engine: \d+ tokens kept", worker.log())) >= 2


def test_four_jobs_in_flight_when_the_engine_hangs_complete_whole(serving: Serving) -> None:
    cp, worker, base = serving.cp, serving.worker, serving.base

    def hang(jobs: dict[str, str]) -> bool:
        return frozen_in_flight(cp, worker, jobs) is not None

    results = run_round(cp, hang)
    assert set(results["seeded"]) == {"error"}, str(results["seeded"])[:300]
    report(f"a hang (SIGSTOP, ENGINE_HANG_TIMEOUT={HANG_TIMEOUT})", results, base, worker)
    assert "The engine stopped answering while serving" in worker.log()
