"""The worker as a process, over the REAL vLLM CPU engine, seen exactly as a client sees it.

tests/integration drives the worker over a scripted stand-in; here the same path runs
end to end: `python -m vllm_worker run` under the real runpod SDK job loop, against the
control-plane stand-in, supervising a real `vllm serve` of the tiny model. What is
asserted is what the platform hands back to a client: the relayed OpenAI objects, SSE
chunks that parse, the sentence for a refused route, the status job's launch record
and capacity line, ten jobs at once, and a SIGTERM that leaves no engine behind. The
HF_TOKEN given to the worker must reach none of the log, the engine's command lines or
the answers.

One worker (one engine boot) serves the whole module; the SIGTERM tests run last, and the
last one reads the stopped worker's log: the SDK's default level (DEBUG, RUNPOD_LOG_LEVEL is
not set here) must not print users' completions, and the shutdown leaves no unclosed session.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support import engine_env
from tests.support.control_plane import ControlPlane
from tests.support.worker_proc import WorkerProcess, engine_processes, running, stop_with_engine

pytestmark = pytest.mark.engine

SECRET = "hf_fake_secret_value"
MAX_CONCURRENCY = 10
# A boot is ~25 s alone; other suites share the two cores, and the first job waits for it.
JOB_TIMEOUT = engine_env.BOOT_TIMEOUT
MESSAGES = [{"role": "user", "content": "Say hello."}]


@dataclass
class Serving:
    cp: ControlPlane
    worker: WorkerProcess
    model: Path
    port: int
    answers: list[Any]  # every result and stream post seen by the tests, for the secret check
    last_job: str = ""

    def run(self, job_input: Any) -> dict[str, Any]:
        job = self.last_job = self.cp.submit(job_input)
        result = self.cp.result(job, timeout=JOB_TIMEOUT)
        self.answers += [result, self.cp.stream_chunks(job)]
        return result


def worker_env(model: Path, port: int) -> dict[str, str]:
    """The tiny-engine configuration, as a user would give it to the worker."""
    return {
        **engine_env.ENGINE_ENV,
        "MODEL_NAME": str(model),
        "VLLM_COMMAND": f"{engine_env.VLLM_BIN} serve",
        "VLLM_PORT": str(port),
        "ENFORCE_EAGER": "true",
        "MAX_MODEL_LEN": "512",
        "KV_CACHE_MEMORY_BYTES": str(engine_env.TINY_KV_CACHE_BYTES),
        "DTYPE": engine_env.TINY_DTYPE,
        "DISABLE_LOG_STATS": "true",
        "MAX_CONCURRENCY": str(MAX_CONCURRENCY),
        "VLLM_STARTUP_TIMEOUT": str(int(engine_env.BOOT_TIMEOUT)),
        "HF_TOKEN": SECRET,
        # A typo a user makes: not a vLLM option, warned about in the log and the status job.
        "MAX_NUM_SEQ": "16",
    }


def serving_on(port: int) -> list[psutil.Process]:
    """Any `vllm serve` process anywhere that was told to listen on `port`."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if "serve" in cmdline and "--port" in cmdline and str(port) in cmdline and running(proc):
            found.append(proc)
    return found


def sse_data(chunks: list[str]) -> list[str]:
    """The data field of every event in the chunks; each chunk must be whole events."""
    data = []
    for chunk in chunks:
        assert isinstance(chunk, str), chunk
        events = re.findall(r".*?\n\n", chunk, re.S)
        # Nothing outside complete "...\n\n" events: a client can parse each chunk on its own.
        assert "".join(events) == chunk, f"chunk is not whole SSE events: {chunk!r}"
        for event in events:
            lines = [line for line in event.splitlines() if line]
            assert lines and all(line.startswith("data: ") for line in lines), f"not a data event: {event!r}"
            data += [line[len("data: ") :] for line in lines]
    return data


@pytest.fixture(scope="module")
def serving(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serving]:
    root = tmp_path_factory.mktemp("real-engine-worker")
    port = engine_env.free_port()
    with ControlPlane() as cp:
        worker = WorkerProcess(worker_env(tiny_model, port), control_plane=cp, workdir=root).start()
        try:
            worker.wait_for_log(r"engine ready; taking jobs", timeout=engine_env.BOOT_TIMEOUT)
            yield Serving(cp, worker, tiny_model, port, [])
        finally:
            stop_with_engine(worker, timeout=60)


def test_a_chat_job_returns_one_chat_completion(serving: Serving) -> None:
    result = serving.run({"messages": MESSAGES, "sampling_params": {"max_tokens": 6, "temperature": 0}})

    assert set(result) == {"output"}, result
    [completion] = result["output"]
    assert completion["object"] == "chat.completion"
    assert completion["model"] == str(serving.model)
    assert completion["choices"][0]["message"]["role"] == "assistant"
    # The sampling params reached the engine: a random tiny model stops only at max_tokens or EOS.
    assert 1 <= completion["usage"]["completion_tokens"] <= 6


def test_a_prompt_job_returns_one_text_completion(serving: Serving) -> None:
    result = serving.run({"prompt": "Once upon a time", "sampling_params": {"max_tokens": 5, "min_tokens": 5}})

    [completion] = result["output"]
    assert completion["object"] == "text_completion"
    assert isinstance(completion["choices"][0]["text"], str)
    assert completion["usage"]["completion_tokens"] == 5


def test_a_streamed_openai_route_job_is_sse_that_parses_and_ends_with_done(serving: Serving) -> None:
    result = serving.run(
        {
            "openai_route": "/v1/chat/completions",
            "openai_input": {"messages": MESSAGES, "max_tokens": 8, "min_tokens": 8, "stream": True},
        }
    )

    chunks = result["output"]
    assert chunks, result
    data = sse_data(chunks)
    assert data[-1] == "[DONE]"
    assert "[DONE]" not in data[:-1]
    payloads = [json.loads(d) for d in data[:-1]]
    assert payloads and all(p["object"] == "chat.completion.chunk" for p in payloads)
    assert {p["model"] for p in payloads} == {str(serving.model)}
    finish = [c["finish_reason"] for p in payloads for c in p["choices"] if c.get("finish_reason")]
    assert finish == ["length"]
    # A client of /stream receives the same chunks, in order.
    assert serving.cp.stream_outputs(serving.last_job) == chunks


def test_the_models_route_lists_the_served_model(serving: Serving) -> None:
    result = serving.run({"openai_route": "/v1/models"})

    [listing] = result["output"]
    assert listing["object"] == "list"
    assert [m["id"] for m in listing["data"]] == [str(serving.model)]
    assert listing["data"][0]["max_model_len"] == 512


def test_a_route_job_to_a_refused_route_is_answered_with_a_sentence(serving: Serving) -> None:
    result = serving.run({"route": "/metrics"})

    assert set(result) == {"error"}, result
    assert result["error"].startswith("The route '/metrics' is not open to jobs; the allowed routes are: ")
    assert "/v1/chat/completions" in result["error"]


def test_the_status_job_reports_one_launch_as_configured_and_the_engines_capacity(serving: Serving) -> None:
    result = serving.run({"route": "/worker/status"})

    [status] = result["output"]
    assert status["ready"] is True
    assert status["fatal"] is None
    assert status["profile"] == "as configured"
    assert status["served_model_name"] == str(serving.model)
    assert status["causes"] == []
    [launch] = status["launches"]
    assert launch["launch"] == 1 and launch["outcome"] == "ready" and launch["overrides"] == {}
    # vLLM CPU logs "CPU KV cache size: 65,536 tokens, Maximum concurrency for 512 tokens per request: 128.00x"
    # (64 MiB at 1 KiB per token for the tiny model); the worker keeps that line without vLLM's prefix.
    assert re.fullmatch(
        r"CPU KV cache size: [\d,]+ tokens, Maximum concurrency for 512 tokens per request: [\d.]+x",
        status["capacity"] or "",
    ), status["capacity"]
    assert "65,536 tokens" in status["capacity"]
    # The capacity plan made before the launch, from config.json and the safetensors headers,
    # against what the engine reported once ready.
    plan = status["capacity_plan"]
    assert plan["kv_cache_tokens"] == 65536
    assert plan["predicted_kv_cache_tokens"] == plan["kv_cache_tokens"]


def test_ten_jobs_at_once_are_all_answered(serving: Serving) -> None:
    jobs = [
        serving.cp.submit({"messages": [{"role": "user", "content": f"Count to {i}."}], "sampling_params": {"max_tokens": 4}})
        for i in range(MAX_CONCURRENCY)
    ]
    results = [serving.cp.result(job, timeout=JOB_TIMEOUT) for job in jobs]
    serving.answers += results

    for result in results:
        assert set(result) == {"output"}, result
        [completion] = result["output"]
        assert completion["object"] == "chat.completion"
    assert len({r["output"][0]["id"] for r in results}) == MAX_CONCURRENCY


# --- job input as Runpod users send it (issue 10) -------------------------------------------


def test_top_level_max_tokens_is_used_not_dropped(serving: Serving) -> None:
    result = serving.run({"prompt": "Once upon a time", "max_tokens": 40, "ignore_eos": True})

    [completion] = result["output"]
    assert completion["usage"]["completion_tokens"] == 40


def test_a_prompt_job_without_max_tokens_is_not_cut_at_16(serving: Serving) -> None:
    result = serving.run({"prompt": "Once upon a time", "ignore_eos": True})

    [completion] = result["output"]
    # Up to the end of the 512-token context, as chat does: far past vLLM's completions default of 16.
    usage = completion["usage"]
    assert usage["completion_tokens"] > 16
    assert usage["prompt_tokens"] + usage["completion_tokens"] == 512


def test_apply_chat_template_sends_a_prompt_through_the_chat_template(serving: Serving) -> None:
    result = serving.run({"prompt": "Say hello.", "apply_chat_template": True, "max_tokens": 3, "min_tokens": 3})

    [completion] = result["output"]
    assert completion["object"] == "chat.completion"
    assert completion["usage"]["completion_tokens"] == 3


def test_an_unknown_job_key_is_answered_naming_it_and_the_closest(serving: Serving) -> None:
    result = serving.run({"prompt": "Hi", "max_token": 5})

    assert set(result) == {"error"}, result
    assert "max_token" in result["error"] and "max_tokens" in result["error"]


def test_a_look_alike_variable_is_warned_about_in_the_status_job(serving: Serving) -> None:
    result = serving.run({"route": "/worker/status"})

    [status] = result["output"]
    assert any("MAX_NUM_SEQ " in w and "MAX_NUM_SEQS" in w for w in status["warnings"]), status["warnings"]
    assert "did you mean MAX_NUM_SEQS" in serving.worker.log()


def test_hf_token_never_reaches_the_log_a_command_line_or_an_answer(serving: Serving) -> None:
    engines = engine_processes(serving.worker.pid)
    assert engines, "the worker has no engine processes"
    assert any(SECRET == p.environ().get("HF_TOKEN") for p in engines if running(p))  # the engine needs it
    for proc in engines:
        assert SECRET not in " ".join(proc.cmdline())
    assert SECRET not in serving.worker.log()
    assert SECRET not in json.dumps(serving.answers)


def test_sigterm_stops_the_worker_and_leaves_no_engine(serving: Serving) -> None:
    """Last in the module: it ends the shared worker."""
    engines = engine_processes(serving.worker.pid)
    assert len(engines) >= 3, [p.cmdline() for p in engines]  # API server, engine core, its worker
    assert serving_on(serving.port)

    code = serving.worker.stop(timeout=120)

    assert (code, serving.worker.killed) == (0, False)
    left = [p for p in engines if running(p)]
    assert left == [], [p.cmdline() for p in left]
    assert serving_on(serving.port) == []
    assert SECRET not in serving.worker.log()


def test_a_sigterm_while_serving_is_handled_once_by_the_serving_worker(serving: Serving) -> None:
    """Reads the log of the worker the SIGTERM test stopped (or stops it, when run alone)."""
    if serving.worker.returncode is None:
        serving.worker.stop(timeout=120)
    log = serving.worker.log()
    assert "during startup" not in log


def _completion_texts(answers: list[Any]) -> list[str]:
    texts = []
    for answer in answers:
        for completion in answer.get("output", []) if isinstance(answer, dict) else []:
            for choice in completion.get("choices", []) if isinstance(completion, dict) else []:
                text = choice.get("text") or (choice.get("message") or {}).get("content") or ""
                if len(text.strip()) >= 12:  # long enough not to occur in a log by chance
                    texts.append(text)
    return texts


def test_job_output_stays_out_of_the_log_and_the_shutdown_is_clean(serving: Serving) -> None:
    """Reads the log of the stopped worker (runs one job and stops it itself when run alone)."""
    if serving.worker.returncode is None:
        serving.run({"prompt": "Once upon a time", "sampling_params": {"max_tokens": 16, "min_tokens": 16}})
        serving.worker.stop(timeout=120)
    log = serving.worker.log()
    texts = _completion_texts(serving.answers)
    assert texts, "no completion long enough to look for"
    assert [text for text in texts if text in log] == []
    assert "Unclosed client session" not in log and "Unclosed connector" not in log
