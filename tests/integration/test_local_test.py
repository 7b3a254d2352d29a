"""`vllm-worker --test_input '{...}'` and `python handler.py --test_input` tell the truth.

The runpod SDK's own local test awaited this async-generator handler as a coroutine: it printed
`{'output': <async_generator ...>}` and "completed successfully" even for a job answered with an
error. The worker's local test prints what the platform would return, as its last line, and
exits 1 when the job failed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.fake_engine import FakeEngine
from tests.support.worker_proc import REPO_ROOT, base_env

pytestmark = pytest.mark.integration

JOB = {"input": {"messages": [{"role": "user", "content": "Say three words."}], "sampling_params": {"max_tokens": 3}}}


def run_local(args: list[str], env: dict[str, str], cwd: Path) -> tuple[int, Any, str]:
    done = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=180)
    out = done.stdout.strip().splitlines()
    assert out, done.stderr[-2000:]
    return done.returncode, json.loads(out[-1]), done.stdout + done.stderr


def worker_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = base_env(tmp_path)
    env.update(HF_HUB_OFFLINE="1", MODEL_NAME="acme/tiny-chat", **extra)
    return env


def test_a_served_job_prints_the_output_and_exits_0(tmp_path: Path) -> None:
    engine = FakeEngine(tmp_path, [{"serve": True}])
    env = worker_env(tmp_path, **engine.env())
    code, result, log = run_local([sys.executable, "-m", "vllm_worker", "--test_input", json.dumps(JOB)], env, tmp_path)
    assert code == 0, log[-3000:]
    [answer] = result["output"]
    assert answer["choices"][0]["message"]["content"] == "w0 w1 w2"
    assert "async_generator" not in log
    # The engine was stopped with the worker.
    assert len(engine.launches()) == 1


def test_a_failed_job_prints_the_error_and_exits_1(tmp_path: Path) -> None:
    env = worker_env(tmp_path, MAX_CONCURRENCY="abc")
    code, result, log = run_local([sys.executable, "-m", "vllm_worker", "--test_input", json.dumps(JOB)], env, tmp_path)
    assert code == 1
    assert set(result) == {"error"} and "MAX_CONCURRENCY" in result["error"]
    assert "completed successfully" not in log


def test_handler_py_reads_test_input_json_from_the_working_directory(tmp_path: Path) -> None:
    engine = FakeEngine(tmp_path, [{"serve": True}])
    env = worker_env(tmp_path, **engine.env())
    (tmp_path / "test_input.json").write_text(json.dumps(JOB))
    code, result, log = run_local([sys.executable, str(REPO_ROOT / "handler.py")], env, tmp_path)
    assert code == 0, log[-3000:]
    assert result["output"][0]["choices"][0]["message"]["content"] == "w0 w1 w2"


def test_the_repositorys_test_input_json_is_a_job() -> None:
    job = json.loads((REPO_ROOT / "test_input.json").read_text())
    assert isinstance(job, dict) and isinstance(job["input"], dict)
