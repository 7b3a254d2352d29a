"""One bad variable at a time, through the worker process and the runpod SDK: every row is answered.

Each row starts a real worker (control-plane stand-in, the SDK's job loop) on the tiny model
with the real vLLM CPU engine as VLLM_COMMAND and one variable set wrong. Some rows the worker
answers itself before any launch (settings, the flag table, the engine command, the pre-flight);
in the others vLLM is the one that rejects, and the worker reads its words. Either way the job's
answer names the variable to change, and the worker is still running when it answers: no row
ends in an exit, which on the platform would be a crash loop.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support import engine_env
from tests.support.control_plane import ControlPlane
from tests.support.engine_env import BOOT_TIMEOUT
from tests.support.worker_proc import WorkerProcess

pytestmark = pytest.mark.engine

# variable, bad value, the words the answer must contain (the variable's name first).
ROWS: list[tuple[str, str, tuple[str, ...]]] = [
    ("MAX_CONCURRENCY", "abc", ("MAX_CONCURRENCY", "'abc'")),
    ("MAX_NUM_SEQS", "abc", ("MAX_NUM_SEQS", "abc")),
    ("GPU_MEMORY_UTILIZATION", "1.5", ("GPU_MEMORY_UTILIZATION", "1.5")),
    ("DTYPE", "float13", ("DTYPE", "float13")),
    ("KV_CACHE_DTYPE", "fp7", ("KV_CACHE_DTYPE", "fp7")),
    ("TENSOR_PARALLEL_SIZE", "0", ("TENSOR_PARALLEL_SIZE",)),
    ("ENFORCE_EAGER", "maybe", ("ENFORCE_EAGER", "maybe")),
    ("QUANTIZATION", "no-such-method", ("QUANTIZATION", "no-such-method")),
    ("MAX_MODEL_LEN", "999999", ("MAX_MODEL_LEN=999999",)),
    ("VLLM_EXTRA_ARGS", "--no-such-flag 1", ("VLLM_EXTRA_ARGS", "--no-such-flag")),
    ("MODEL_NAME", "/nonexistent/model/dir", ("MODEL_NAME", "/nonexistent/model/dir")),
    ("VLLM_COMMAND", "no-such-vllm serve", ("VLLM_COMMAND", "no-such-vllm")),
    ("KV_CACHE_MEMORY_BYTES", str(128 * 1024), ("KV_CACHE_MEMORY_BYTES",)),
]
MESSAGES = [{"role": "user", "content": "Hi"}]


@dataclass
class Row:
    variable: str
    value: str
    expected: tuple[str, ...]
    cp: ControlPlane
    worker: WorkerProcess
    job: str
    result: dict[str, Any] | None = None
    alive_at_answer: bool | None = None


def row_env(model: Path, variable: str, value: str) -> dict[str, str]:
    return engine_env.tiny_worker_env(model, **{variable: value})


@pytest.fixture(scope="module")
def rows(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Row]]:
    """Every row's worker started at once (most answer in seconds, a few boot vLLM), each sent one job."""
    started: dict[str, Row] = {}
    try:
        for variable, value, expected in ROWS:
            cp = ControlPlane().start()
            env = row_env(tiny_model, variable, value)
            worker = WorkerProcess(env, control_plane=cp, workdir=tmp_path_factory.mktemp(variable.lower())).start()
            job = cp.submit({"messages": MESSAGES, "sampling_params": {"max_tokens": 2}})
            started[variable] = Row(variable, value, expected, cp, worker, job)
        for row in started.values():
            row.result = row.cp.result(row.job, timeout=3 * BOOT_TIMEOUT)
            row.alive_at_answer = row.worker.returncode is None
        yield started
    finally:
        for row in started.values():
            row.worker.stop(timeout=60)
            row.cp.close()


@pytest.mark.parametrize("variable", [row[0] for row in ROWS])
def test_each_bad_variable_is_answered_naming_it_and_the_worker_stays_up(rows: dict[str, Row], variable: str) -> None:
    row = rows[variable]
    assert row.result is not None and set(row.result) == {"error"}, row.result
    sentence = row.result["error"]
    for words in row.expected:
        assert words in sentence, f"{variable}={row.value!r}: {sentence}"
    assert "Traceback" not in sentence and "\n" not in sentence
    assert row.alive_at_answer, f"the worker exited on {variable}={row.value!r}"
    assert row.worker.stop(timeout=60) == 0
