"""An engine that dies while serving, seen as a client sees it: the worker as a process, the real SDK.

What is checked is what the control plane receives: the job that was running when the engine
died ends with the cause at once (not after REQUEST_TIMEOUT), the next jobs wait for the
in-place relaunch of the same configuration and are served, the status job lists every launch
with the cause of each death, and a configuration that keeps killing its engine ends, past the
restart budget, in an answer every job gets. A fault of the machine while serving (a real NCCL
watchdog failure) is named as such, restarted in place once, and then a fresh worker is asked for
through the SDK (`stopPod`), counted on a volume really mounted at BASE_PATH.

The engine is `tests/support/fake_vllm.py`: a crash mid-request with a CUDA out-of-memory
traceback cannot be produced on this machine. The last tests run the handler in-process against
an aiohttp server on 127.0.0.1, to pin which sentence a request caught by a death ends with. The real CPU engine's death (kill -9, /health
503) is exercised in tests/engine/test_self_healing.py. The memory wait runs with the real
CPU probe of this machine (ENGINE_DEVICE=cpu), no stand-in.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from aiohttp import web

from tests.support import vllm_texts
from tests.support.control_plane import ControlPlane
from tests.support.engine_env import free_port
from tests.support.fake_engine import FakeEngine
from tests.support.worker_proc import WorkerProcess
from vllm_worker.engine import monitor
from vllm_worker.config.profile import LaunchProfile
from vllm_worker.diagnosis import runtime
from vllm_worker.diagnosis.verdict import Failure
from vllm_worker.engine import gpu_memory
from vllm_worker.engine import ladder
from vllm_worker.diagnosis import startup_errors
from vllm_worker.serving import answers, fresh_machine
from vllm_worker.serving import handler as handler_module
from vllm_worker.serving import continuation
from vllm_worker.serving.state import Death, WorkerState

pytestmark = pytest.mark.integration

MODEL = "acme/tiny-chat"
MESSAGES = [{"role": "user", "content": "Say five words."}]
JOB = {"messages": MESSAGES, "sampling_params": {"max_tokens": 3}}
STATUS = {"route": "/worker/status"}
# Long on purpose: a job that ends with the death's cause did not wait for this.
REQUEST_TIMEOUT = "900"
RESULT_TIMEOUT = 120.0


def worker_env(engine: FakeEngine, **extra: str) -> dict[str, str]:
    env = {"HF_HUB_OFFLINE": "1", "MODEL_NAME": MODEL, "REQUEST_TIMEOUT": REQUEST_TIMEOUT, **engine.env()}
    env.update(extra)
    return env


@pytest.fixture
def cp() -> Iterator[ControlPlane]:
    with ControlPlane() as plane:
        yield plane


def run_job(cp: ControlPlane, job_input: Any) -> tuple[dict[str, Any], float]:
    """Submit a job and wait for its answer; returns it and the seconds it took."""
    started = time.monotonic()
    result = cp.result(cp.submit(job_input), timeout=RESULT_TIMEOUT)
    return result, time.monotonic() - started


def status(cp: ControlPlane) -> dict[str, Any]:
    result, _ = run_job(cp, STATUS)
    [report] = result["output"]
    return report


def content(result: dict[str, Any]) -> str:
    [completion] = result["output"]
    return completion["choices"][0]["message"]["content"]


# ----------------------------------------------------------------------------- a crash while serving


def test_an_oom_while_serving_ends_the_running_job_and_the_next_ladder_step_serves(
    cp: ControlPlane, tmp_path: Path
) -> None:
    engine = FakeEngine(
        tmp_path,
        [
            # Serves one request, then dies on the next with a CUDA out-of-memory traceback.
            {"serve": True, "crash_after_requests": 1, "text": "TORCH_OOM", "exit_code": 1},
            # The relaunch takes a few seconds to answer, so a job sent meanwhile must wait for it.
            {"serve": True, "ready_after": 3},
        ],
    )
    env = worker_env(engine, MAX_NUM_SEQS="64")
    try:
        with WorkerProcess(env, control_plane=cp, workdir=tmp_path) as worker:
            first, _ = run_job(cp, JOB)
            dying, seconds = run_job(cp, JOB)
            print(f"the job running when the engine died was answered after {seconds:.2f} s")
            # Sent right after the death was answered: the relaunch is still starting.
            waiting, _ = run_job(cp, JOB)
            report = status(cp)
            log = worker.log()
            seen = dict(worker.env)
    finally:
        engine.kill_leftovers()

    assert content(first) == "w0 w1 w2"
    # The running job got the cause, not a hang until REQUEST_TIMEOUT nor a bare connection error.
    expected = runtime.runtime_failure(Failure.of(vllm_texts.TORCH_OOM, env=seen, exit_code=1))
    assert expected.kind == "runtime_oom"
    # The footprint that died is not relaunched: the ladder's first step, graphs kept (issue 12).
    # It is sent again whole to the relaunched engine (a plain job has been sent nothing), and says so.
    [answer] = dying["output"]
    assert answer["choices"][0]["message"]["content"] == "w0 w1 w2"
    assert answer["worker"]["continued"] == {"tokens_kept": 0, "after": "runtime_oom"}
    assert answer["worker"]["profile"]["name"] == "max_num_seqs=32"
    assert f"the engine stopped while serving: {expected.message}" in log
    assert "sent again whole to the restarted engine" in log
    assert report["continuations"] == {"continued": 1, "answered": {}}
    assert "MAX_NUM_BATCHED_TOKENS" in expected.message and "MAX_NUM_SEQS (now 64)" in expected.message
    assert "GPU_MEMORY_UTILIZATION" not in expected.message
    assert content(waiting) == "w0 w1 w2"

    launches = engine.launches()
    # Relaunched in place with fewer sequences, everything else as it was.
    first_argv, second_argv = (launch["argv"] for launch in launches)
    assert first_argv[first_argv.index("--max-num-seqs") + 1] == "64"
    assert second_argv == [("32" if i == first_argv.index("--max-num-seqs") + 1 else w) for i, w in enumerate(first_argv)]
    served = engine.requests()
    assert [r["launch"] for r in served if r["method"] == "POST" and not r["warmup"]] == [0, 0, 1, 1]
    assert [r["launch"] for r in served if r["warmup"]] == [0, 1]  # each ready launch answered the worker's own first

    assert report["ready"] is True and report["fatal"] is None
    assert report["restarts"] == 1
    assert report["causes"] == ["runtime_oom"]
    died, relaunched = report["launches"]
    assert (died["launch"], died["outcome"], died["cause"], died["exit_code"]) == (1, "died", "runtime_oom", 1)
    assert (relaunched["launch"], relaunched["outcome"], relaunched["restart"], relaunched["after"]) == (
        2,
        "ready",
        1,
        "runtime_oom",
    )
    assert died["profile"] == "as configured"
    assert (relaunched["profile"], relaunched["overrides"]) == ("max_num_seqs=32", {"MAX_NUM_SEQS": "32"})
    # Every later answer names the slower profile.
    assert report["profile"]["name"] == "max_num_seqs=32"
    assert "the engine stopped while serving" in log and "launch 2:" in log


def test_repeated_ooms_while_serving_walk_the_ladder_then_the_budget_answers(cp: ControlPlane, tmp_path: Path) -> None:
    # Every launch serves, then dies of a CUDA out-of-memory on its first request.
    engine = FakeEngine(tmp_path, [{"serve": True, "crash_after_requests": 0, "text": "TORCH_OOM", "exit_code": 1}])
    env = worker_env(engine, MAX_NUM_SEQS="64")
    try:
        with WorkerProcess(env, control_plane=cp, workdir=tmp_path):
            answers = [run_job(cp, JOB)[0] for _ in range(ladder.MAX_RESTARTS + 2)]
            report = status(cp)
    finally:
        engine.kill_leftovers()

    argvs = [launch["argv"] for launch in engine.launches()]
    assert len(argvs) == ladder.MAX_RESTARTS + 1
    # Step 1 keeps graphs with fewer sequences, step 2 goes eager, then the same footprint again.
    assert argvs[1][argvs[1].index("--max-num-seqs") + 1] == "32" and "--enforce-eager" not in argvs[1]
    assert "--enforce-eager" in argvs[2] and argvs[3] == argvs[2]
    assert [r["profile"] for r in report["launches"]] == ["as configured", "max_num_seqs=32", "eager", "eager"]
    assert report["fatal"] is not None and "not restarted again" in report["fatal"]
    assert answers[-1] == answers[-2] == {"error": report["fatal"]}


def test_a_configuration_that_keeps_killing_its_engine_is_answered_with_the_cause(
    cp: ControlPlane, tmp_path: Path
) -> None:
    # Every launch dies on its first request.
    engine = FakeEngine(
        tmp_path, [{"serve": True, "crash_after_requests": 0, "output": "RuntimeError: boom", "exit_code": 3}]
    )
    env = worker_env(engine)
    try:
        with WorkerProcess(env, control_plane=cp, workdir=tmp_path) as worker:
            answers = [run_job(cp, JOB)[0] for _ in range(ladder.MAX_RESTARTS + 2)]
            report = status(cp)
            log = worker.log()
    finally:
        engine.kill_leftovers()

    cause = runtime.runtime_failure(Failure.of("RuntimeError: boom", env=env, exit_code=3))
    assert cause.message == "The engine exited with code 3 while serving requests; its last error was: RuntimeError: boom."
    # The first job is continued once on the restarted engine, dies with it again and is answered
    # (a request that kills its engine does not loop); the second uses up the budget.
    again = {"error": continuation.not_continued_sentence(f"{cause.message} {runtime.RESTARTING}", "again")}
    final = {"error": monitor.budget_sentence(cause.message, ladder.MAX_RESTARTS + 1)}
    # Each death within the budget is restarted; the one past it is answered, and so is every later job.
    assert ladder.MAX_RESTARTS == 3
    assert answers == [again] + [final] * (ladder.MAX_RESTARTS + 1)
    assert "It was not continued on the restarted engine: it had been continued once already" in again["error"]
    assert report["continuations"] == {"continued": 2, "answered": {"again": 1, "spent": 1}}
    assert "not restarted again" in final["error"] and "terminate this worker" in final["error"]

    assert len(engine.launches()) == ladder.MAX_RESTARTS + 1
    assert report["restarts"] == ladder.MAX_RESTARTS
    assert report["fatal"] == final["error"] and report["ready"] is False
    assert [(r["outcome"], r["cause"], r["exit_code"]) for r in report["launches"]] == [
        ("died", "engine_died", 3)
    ] * (ladder.MAX_RESTARTS + 1)
    # Past the budget the engine's last words are in the log, where the operator looks.
    assert "the engine's last" in log and log.rindex("RuntimeError: boom") > log.index("the engine's last")


# ----------------------------------------------------------------------------- a fault of the machine while serving


@contextlib.contextmanager
def mounted_volume(folder: Path) -> Iterator[Path]:
    """A network volume at BASE_PATH: a filesystem really mounted there (a tmpfs), not a folder."""
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(folder)], capture_output=True)
    if done.returncode != 0:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("cannot mount a tmpfs to stand for the network volume (CI=true: this test must run)")
        pytest.skip("cannot mount a tmpfs to stand for the network volume here")
    try:
        assert os.path.ismount(folder)
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def fresh_workers(volume: Path) -> list[dict[str, Any]]:
    path = volume / fresh_machine.STATE_FOLDER / fresh_machine.LEDGER_FILE
    return json.loads(path.read_text())["fresh_workers"] if path.exists() else []


def test_an_nccl_death_while_serving_restarts_once_then_asks_for_a_fresh_worker(cp: ControlPlane, tmp_path: Path) -> None:
    # Every launch serves, then dies on its first request printing a real NCCL watchdog failure (vllm#9321).
    engine = FakeEngine(
        tmp_path, [{"serve": True, "crash_after_requests": 0, "text": "NCCL_WATCHDOG_WHILE_SERVING", "exit_code": 1}]
    )
    with mounted_volume(tmp_path / "volume") as volume:
        env = worker_env(engine, BASE_PATH=str(volume))
        try:
            with WorkerProcess(env, control_plane=cp, workdir=tmp_path) as worker:
                # The first death restarts the engine in place and the job is sent to it again (issue 24);
                # the second death is the machine's again: the job is answered, a fresh worker asked for.
                replaced, _ = run_job(cp, JOB)
                # The SDK ends its loop after the job it asked a fresh worker for: the worker exits by itself.
                code = worker.wait(timeout=60)
                log = worker.log()
        finally:
            engine.kill_leftovers()
        ledger = fresh_workers(volume)

    cause = runtime.runtime_failure(Failure.of(vllm_texts.NCCL_WATCHDOG_WHILE_SERVING, env=env, exit_code=1))
    assert (cause.kind, cause.detail) == ("host_fault", "nccl")
    assert "communication library (NCCL)" in cause.message
    # The first death: named as the machine's, restarted in place once; no fresh worker yet.
    assert f"the engine stopped while serving: {cause.message}" in log
    assert "restarting the engine (as configured; restart 1;" in log
    assert "sent again whole to the restarted engine" in log
    # The second: not restarted on this machine again; a fresh worker asked for, within the bound.
    final = runtime.machine_fault_answer(cause, ["host_fault"])
    assert final is not None
    assert replaced["stopPod"] is True
    assert replaced["error"] == fresh_machine.decide(final, "host_fault", 0, 3, str(volume)).sentence
    assert "1 of at most 3 within an hour" in replaced["error"]
    assert len(engine.launches()) == 2 and code == 0
    assert [entry["cause"] for entry in ledger] == ["host_fault"]
    assert "asking the platform for a fresh worker" in log


# ----------------------------------------------------------------------------- the memory wait, real probe


def cpu_memory_need_that_never_fits() -> dict[str, str]:
    """A launch configuration whose memory need the real CPU probe can never see free here."""
    env = {"ENGINE_DEVICE": "cpu", "GPU_MEMORY_UTILIZATION": "0.998"}  # 1.0 is refused before any launch
    [node] = gpu_memory.probe_cpu(LaunchProfile.parse({}))
    # A running machine always uses more than 0.2 % of its memory.
    assert node.free < gpu_memory.need_bytes(node.total, LaunchProfile.parse(env), "cpu")
    return env


def test_memory_that_never_frees_ends_in_an_answer_naming_the_wait(cp: ControlPlane, tmp_path: Path) -> None:
    engine = FakeEngine(tmp_path, [{"serve": True}])
    env = worker_env(engine, GPU_MEMORY_WAIT_TIMEOUT="2", **cpu_memory_need_that_never_fits())
    try:
        with WorkerProcess(env, control_plane=cp, workdir=tmp_path) as worker:
            answer, _ = run_job(cp, JOB)
            log = worker.log()
    finally:
        engine.kill_leftovers()

    error = answer["error"]
    assert error.startswith("The engine was not started: memory was still in use by another process after waiting ")
    assert "GPU_MEMORY_WAIT_TIMEOUT=2 seconds" in error and "GiB needed" in error
    # The wait is the problem, not the setting the need came from.
    assert "GPU_MEMORY_UTILIZATION" not in error and "utilization" not in error.lower()
    assert engine.launches() == []
    assert "waiting for memory to be released" in log


def test_with_the_wait_off_the_same_configuration_launches_at_once(cp: ControlPlane, tmp_path: Path) -> None:
    engine = FakeEngine(tmp_path, [{"serve": True}])
    env = worker_env(engine, GPU_MEMORY_WAIT="false", GPU_MEMORY_WAIT_TIMEOUT="2", **cpu_memory_need_that_never_fits())
    try:
        with WorkerProcess(env, control_plane=cp, workdir=tmp_path) as worker:
            answer, _ = run_job(cp, JOB)
            log = worker.log()
    finally:
        engine.kill_leftovers()

    assert content(answer) == "w0 w1 w2"
    assert len(engine.launches()) == 1
    assert "GPU_MEMORY_WAIT=false" in log and "waiting for memory to be released" not in log


# ----------------------------------------------------------------------------- the SDK's own log


def test_job_output_stays_out_of_the_log_and_shutdown_is_clean(cp: ControlPlane, tmp_path: Path) -> None:
    engine = FakeEngine(tmp_path, [{"serve": True}])
    env = worker_env(engine)
    env.pop("RUNPOD_LOG_LEVEL", None)
    try:
        with WorkerProcess(env, control_plane=cp, workdir=tmp_path) as worker:
            answer, _ = run_job(cp, {"prompt": "hi", "sampling_params": {"max_tokens": 7}})
            code = worker.stop(timeout=60)
            log = worker.log()
    finally:
        engine.kill_leftovers()

    [completion] = answer["output"]
    assert completion["choices"][0]["text"] == "w0 w1 w2 w3 w4 w5 w6"
    assert code == 0
    # The SDK's default level is DEBUG, which prints every job's output: users' completions.
    assert "w0 w1 w2 w3 w4 w5 w6" not in log
    assert "Unclosed client session" not in log and "Unclosed connector" not in log


# ----------------------------------------------------------------------------- the handler when a death is recorded
#
# In-process, against an aiohttp server on 127.0.0.1: which sentence a request caught by a death
# ends with, and that a request that never reached the engine is sent again to the restarted one.

DEATH = "The engine was killed by signal 9 (SIGKILL) while serving requests. " + runtime.RESTARTING
# What vLLM 0.32 streams to a request whose engine core died (vllm/v1/engine/exceptions.py:16).
DEAD_EVENT = (
    'data: {"error": {"message": "EngineCore encountered an issue. See stack trace (above) for the root cause.", '
    '"type": "InternalServerError", "param": null, "code": 500}}\n\n'
)


async def serve(routes: web.RouteTableDef, port: int = 0) -> tuple[web.AppRunner, int]:
    app = web.Application()
    app.add_routes(routes)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


def chat_routes(answer: web.Response | None = None, stream_first: str | None = None) -> web.RouteTableDef:
    routes = web.RouteTableDef()

    @routes.post("/v1/chat/completions")
    async def chat(request: web.Request) -> web.StreamResponse:
        if stream_first is None:
            return web.json_response({"object": "chat.completion", "choices": [{"message": {"content": "again"}}]})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(stream_first.encode())
        await response.write(DEAD_EVENT.encode())
        await response.write_eof()
        return response

    return routes


def on_death_wait(monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """An event set when a request starts waiting for main to confirm a death."""
    entered = asyncio.Event()
    original = handler_module._death_since

    async def wrapped(state: WorkerState, deaths_seen: int, answers_seen: int) -> Death | None:
        entered.set()
        return await original(state, deaths_seen, answers_seen)

    monkeypatch.setattr(handler_module, "_death_since", wrapped)
    return entered


async def run_handler(state: WorkerState, job_input: Any) -> list[Any]:
    handler_module.configure(state)
    try:
        return [part async for part in handler_module.handler({"id": "job-1", "input": job_input})]
    finally:
        await handler_module.close_session()


async def test_a_stream_cut_by_a_dead_engine_core_ends_with_the_death_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    first = 'data: {"choices": [{"delta": {"content": "w0"}}]}\n\n'
    runner, port = await serve(chat_routes(stream_first=first))
    state = WorkerState(served_model_name="m", port=port)
    state.mark_ready()
    entered = on_death_wait(monkeypatch)

    async def main_notices() -> None:
        await entered.wait()
        state.record_death(Death(DEATH, "engine_died"))

    try:
        parts, _ = await asyncio.gather(
            run_handler(state, {"messages": MESSAGES, "stream": True}), main_notices()
        )
    finally:
        await runner.cleanup()
    # What was streamed stays; the end is the cause, not vLLM's "see stack trace (above)". An engine
    # that names no token ids cannot be continued, and the answer says so.
    assert parts == [first, {"error": continuation.not_continued_sentence(DEATH, "unknown")}]
    assert state.continuations() == {"continued": 0, "answered": {"unknown": 1}}


async def test_a_request_that_never_reached_the_engine_goes_to_the_restarted_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    port = free_port()  # nothing listens: the engine just died
    state = WorkerState(served_model_name="m", port=port)
    state.mark_ready()
    entered = on_death_wait(monkeypatch)
    runners: list[web.AppRunner] = []

    async def main_restarts() -> None:
        await entered.wait()
        state.record_death(Death(DEATH, "engine_died"))
        runner, _ = await serve(chat_routes(), port)
        runners.append(runner)
        state.mark_ready()

    try:
        parts, _ = await asyncio.gather(run_handler(state, {"messages": MESSAGES}), main_restarts())
    finally:
        for runner in runners:
            await runner.cleanup()
    assert parts == [{"object": "chat.completion", "choices": [{"message": {"content": "again"}}]}]


async def test_a_dropped_connection_without_a_death_keeps_its_own_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    """The monitor's checks answer alive after the failure: no death, the job is told what failed. No clock
    decides it (the wait's bound is an hour here): the second answer counted since the failure does."""
    state = WorkerState(served_model_name="m", port=free_port(), verdict_within=3600.0)
    state.mark_ready()
    entered = on_death_wait(monkeypatch)

    async def monitor_answers() -> None:
        await entered.wait()
        state.note_health()  # a check begun before the failure may be this one
        state.note_health()

    [answer], _ = await asyncio.wait_for(asyncio.gather(run_handler(state, {"messages": MESSAGES}), monitor_answers()), 60)
    assert answer == {"error": answers.unreachable_sentence("127.0.0.1", state.port, "connection refused")}


async def test_a_death_the_monitor_records_after_one_alive_answer_still_reaches_the_job(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One answer since the failure may come from a check begun before it: the job waits on for the verdict,
    however long the monitor takes (a loaded machine's checks come late), and is told the death."""
    first = 'data: {"choices": [{"delta": {"content": "w0"}}]}\n\n'
    runner, port = await serve(chat_routes(stream_first=first))
    state = WorkerState(served_model_name="m", port=port, verdict_within=3600.0)
    state.mark_ready()
    entered = on_death_wait(monkeypatch)

    async def main_notices() -> None:
        await entered.wait()
        state.note_health()
        for _ in range(20):  # the handler polls meanwhile and must not give up
            await asyncio.sleep(0.06)
        state.record_death(Death(DEATH, "engine_died"))

    try:
        parts, _ = await asyncio.wait_for(
            asyncio.gather(run_handler(state, {"messages": MESSAGES, "stream": True}), main_notices()), 60
        )
    finally:
        await runner.cleanup()
    assert parts == [first, {"error": continuation.not_continued_sentence(DEATH, "unknown")}]


async def test_a_stop_ends_the_wait_for_a_death() -> None:
    state = WorkerState(served_model_name="m", port=free_port(), verdict_within=3600.0)
    state.mark_ready()
    state.begin_stop("stopping")
    assert await asyncio.wait_for(handler_module._death_since(state, 0, 0), 60) is None
