"""The local test a user runs first, over the REAL vLLM CPU engine: `python handler.py --test_input`.

tests/integration/test_local_test.py covers its cases over the scripted engine (a failed job
exits 1, test_input.json read from the working directory). Here the one path a user takes with
the image's own files runs end to end: the repository's handler.py, given the repository's
test_input.json as `--test_input`, starts the real engine on the tiny model, prints what the
platform would return as its last line, exits 0, and leaves no engine process behind.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.support import engine_env
from tests.support.worker_proc import REPO_ROOT, base_env

pytestmark = pytest.mark.engine


def engines_on(port: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if "serve" in cmdline and "--port" in cmdline and port in cmdline:
            try:
                if proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc)
            except psutil.NoSuchProcess:
                pass
    return found


def test_handler_py_with_the_repositorys_test_input_serves_it_on_the_real_engine(tiny_model: Path, tmp_path: Path) -> None:
    job = (REPO_ROOT / "test_input.json").read_text()
    env = {**base_env(tmp_path), **engine_env.tiny_worker_env(tiny_model)}
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "handler.py"), "--test_input", job],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=engine_env.BOOT_TIMEOUT + 120,
    )
    log = done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0, log[-3000:]
    result = json.loads(lines[-1])
    assert set(result) == {"output"}, result
    [completion] = result["output"]
    assert completion["object"] == "chat.completion"
    assert completion["choices"][0]["message"]["role"] == "assistant"
    # test_input.json's top-level max_tokens reached the engine.
    assert 1 <= completion["usage"]["completion_tokens"] <= json.loads(job)["input"]["max_tokens"]
    assert "async_generator" not in log and "Unclosed client session" not in log
    assert engines_on(env["VLLM_PORT"]) == [], "the engine outlived the local test"
