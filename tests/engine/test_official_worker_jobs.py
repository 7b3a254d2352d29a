"""Coming from Runpod's official vLLM worker: its endpoint, its cache and its clients, on the REAL CPU engine.

One worker (one engine boot) is started as a user moving from runpod-workers/worker-vllm would
start it: the model in Runpod's model cache under a lower-cased folder (`models--acme--tiny-llama`
for MODEL_NAME `Acme/Tiny-Llama`, worker-vllm#310) with the Hub unreachable, and variables of the
official Hub form (OPENAI_RESPONSE_ROLE, which becomes vLLM's --response-role; DEFAULT_BATCH_SIZE,
which does nothing here and must say so). Then every job shape the official handler accepts is
sent through the real runpod SDK job loop, and each must come back as the same OpenAI object
the official worker returns, under the user's MODEL_NAME.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from huggingface_hub import snapshot_download

from tests.support import engine_env
from tests.support.control_plane import ControlPlane
from tests.support.hub_stub import HubStub
from tests.support.worker_proc import WorkerProcess

pytestmark = pytest.mark.engine

MODEL_NAME = "Acme/Tiny-Llama"
STORED_AS = "acme/tiny-llama"  # what Runpod's cache may write: models--acme--tiny-llama
ROLE = "narrator"
MESSAGES = [{"role": "user", "content": "Say hello."}]
SAMPLING = {"max_tokens": 3, "min_tokens": 3}


@dataclass
class Official:
    cp: ControlPlane
    worker: WorkerProcess
    snapshot: Path

    def run(self, job_input: dict[str, Any]) -> dict[str, Any]:
        return self.cp.result(self.cp.submit(job_input), timeout=engine_env.BOOT_TIMEOUT)


@pytest.fixture(scope="module")
def official(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Official]:
    home = tmp_path_factory.mktemp("official-worker")
    root = home / "runpod-volume" / "huggingface-cache" / "hub"
    files = {p.name: p.read_bytes() for p in tiny_model.iterdir() if p.is_file()}
    with HubStub() as hub:
        hub.add_repo(STORED_AS, files=files)
        snapshot = Path(snapshot_download(STORED_AS, cache_dir=root, endpoint=hub.endpoint))
    env = engine_env.tiny_worker_env(
        MODEL_NAME,
        HF_HUB_OFFLINE=None,
        TRANSFORMERS_OFFLINE=None,
        HF_ENDPOINT=f"http://127.0.0.1:{engine_env.free_port()}",  # nothing listens there
        RUNPOD_MODEL_CACHE=str(root),
        HF_HOME=str(home / "hf-home"),
        OPENAI_RESPONSE_ROLE=ROLE,
        DEFAULT_BATCH_SIZE="10",
        RAW_OPENAI_OUTPUT="true",  # the official form's default: asks for what this worker does
        VLLM_USE_DEEP_GEMM="0",
    )
    with ControlPlane() as cp:
        worker = WorkerProcess(env, control_plane=cp, workdir=home).start()
        try:
            worker.wait_for_log(r"engine ready; taking jobs", timeout=engine_env.BOOT_TIMEOUT)
            yield Official(cp, worker, snapshot)
        finally:
            leftovers = psutil.Process(worker.pid).children(recursive=True) if worker.returncode is None else []
            worker.stop(timeout=60)
            for proc in leftovers:
                if proc.is_running():
                    proc.kill()


def sse_payloads(chunks: list[Any]) -> list[Any]:
    """The JSON of every `data:` event of a relayed stream; the last event must be [DONE]."""
    text = "".join(chunks)
    data = [line[len("data: ") :] for line in text.splitlines() if line.startswith("data: ")]
    assert data and data[-1] == "[DONE]", text[-300:]
    return [json.loads(d) for d in data[:-1]]


# Every shape of runpod-workers/worker-vllm's src/handler.py (_normalize_job_input), and what it returns there.
SHAPES: dict[str, tuple[dict[str, Any], str]] = {
    "openai_route+openai_input": (
        {"openai_route": "/v1/chat/completions", "openai_input": {"messages": MESSAGES, **SAMPLING}},
        "chat.completion",
    ),
    "openai_route+openai_input streamed": (
        {"openai_route": "/v1/completions", "openai_input": {"prompt": "Once", **SAMPLING, "stream": True}},
        "text_completion stream",
    ),
    "openai_route alone (GET)": ({"openai_route": "/v1/models"}, "list"),
    "openai_input alone (chat)": ({"openai_input": {"messages": MESSAGES, **SAMPLING}}, "chat.completion"),
    "route+body (POST)": ({"route": "/v1/completions", "body": {"prompt": "Once", **SAMPLING}}, "text_completion"),
    "route alone (GET)": ({"route": "/v1/models"}, "list"),
    "route+body+method": (
        {"route": "/v1/chat/completions", "body": {"messages": MESSAGES, **SAMPLING}, "method": "post"},
        "chat.completion",
    ),
    "prompt+sampling_params": ({"prompt": "Once", "sampling_params": SAMPLING, "stream": False}, "text_completion"),
    "prompt+sampling_params streamed": (
        {"prompt": "Once", "sampling_params": SAMPLING, "stream": True},
        "text_completion stream",
    ),
    "messages+sampling_params": ({"messages": MESSAGES, "sampling_params": SAMPLING}, "chat.completion"),
    "messages+sampling_params streamed": (
        {"messages": MESSAGES, "sampling_params": SAMPLING, "stream": True},
        "chat.completion.chunk stream",
    ),
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_job_shape_of_the_official_worker_is_served(official: Official, shape: str) -> None:
    job_input, expected = SHAPES[shape]
    result = official.run(job_input)

    assert set(result) == {"output"}, result
    output = result["output"]
    if expected == "list":
        [listing] = output
        assert listing["object"] == "list" and [m["id"] for m in listing["data"]] == [MODEL_NAME]
        return
    if expected.endswith(" stream"):
        payloads = sse_payloads(output)
        kind = "chat.completion.chunk" if expected.startswith("chat") else "text_completion"
        assert {p["object"] for p in payloads} == {kind}
        assert {p["model"] for p in payloads} == {MODEL_NAME}
        finish = [c["finish_reason"] for p in payloads for c in p["choices"] if c.get("finish_reason")]
        assert finish == ["length"]
        if kind == "chat.completion.chunk":
            assert {c["delta"]["role"] for p in payloads for c in p["choices"] if "role" in c["delta"]} == {ROLE}
        return
    [answer] = output
    assert answer["object"] == expected and answer["model"] == MODEL_NAME
    assert answer["usage"]["completion_tokens"] == SAMPLING["max_tokens"]
    if expected == "chat.completion":
        # OPENAI_RESPONSE_ROLE took effect as vLLM's --response-role.
        assert answer["choices"][0]["message"]["role"] == ROLE
    else:
        assert isinstance(answer["choices"][0]["text"], str)


def test_the_lower_cased_cache_folder_was_served_offline_under_model_name(official: Official) -> None:
    [status] = official.run({"route": "/worker/status"})["output"]
    log = official.worker.log()

    assert official.snapshot.parent.parent.name == "models--acme--tiny-llama"
    assert status["served_model_name"] == MODEL_NAME
    assert status["model_cache"] == {
        "source": "Runpod model cache",
        "repo": MODEL_NAME,
        "commit": official.snapshot.name,
        "path": str(official.snapshot),
    }
    assert "models--acme--tiny-llama differs from models--Acme--Tiny-Llama only in case" in log
    # Nothing was fetched: the engine read the cache offline.
    assert "Max retries exceeded" not in log and "couldn't connect" not in log.lower()


def test_an_official_variable_that_does_nothing_here_is_answered_in_the_log_and_the_status_job(official: Official) -> None:
    [status] = official.run({"route": "/worker/status"})["output"]
    log = official.worker.log()

    [notice] = [w for w in status["warnings"] if "DEFAULT_BATCH_SIZE" in w]
    assert notice.startswith("DEFAULT_BATCH_SIZE='10' has no effect here: the worker posts a stream's events as vLLM sends them")
    assert notice in log
    # At the form's default it asks for what the worker does, and draws nothing.
    assert not [w for w in status["warnings"] if "RAW_OPENAI_OUTPUT" in w]


def test_engine_environment_variables_of_the_form_reach_the_engine(official: Official) -> None:
    serve = [p for p in psutil.Process(official.worker.pid).children() if "serve" in p.cmdline()]
    assert serve and all(p.environ().get("VLLM_USE_DEEP_GEMM") == "0" for p in serve)
    # And the engine reads it: vLLM 0.32 declares it among its environment variables.
    envs = next(engine_env.ENGINE_VENV.glob("lib/python3*/site-packages/vllm/envs.py")).read_text()
    assert '"VLLM_USE_DEEP_GEMM"' in envs
