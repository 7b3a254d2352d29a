"""Engine supervising the real `vllm serve` (CPU, tiny model): ready, its words, a clean stop, a fast failure."""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path

import psutil
import pytest

from tests.support import engine_env
from tests.support.engine_env import BOOT_TIMEOUT, STOP_GRACE, start_ready_engine
from vllm_worker.engine.process import Engine

pytestmark = pytest.mark.engine


def group_members(pgid: int) -> list[psutil.Process]:
    members = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid:
                members.append(proc)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass
    return members


def test_ready_engine_answers_and_its_startup_lines_are_kept(tiny_engine: Engine, tiny_model: Path) -> None:
    assert tiny_engine.alive()
    assert tiny_engine.healthy()
    tail = tiny_engine.tail()
    assert "Resolved architecture: LlamaForCausalLM" in tail
    assert f"Starting vLLM server on http://127.0.0.1:{tiny_engine.port}" in tail

    request = urllib.request.Request(
        f"http://127.0.0.1:{tiny_engine.port}/v1/completions",
        data=json.dumps({"model": str(tiny_model), "prompt": "Hello", "max_tokens": 4}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        body = json.load(response)
    assert body["usage"]["completion_tokens"] == 4


def test_stop_takes_down_every_process_vllm_started(tiny_model: Path) -> None:
    port = engine_env.free_port()
    engine = start_ready_engine(engine_env.serve_argv(tiny_model, port), port)
    pgid = engine.pid
    assert pgid is not None
    members = group_members(pgid)
    # The API server, the engine core and its worker: vLLM's processes share the engine's group.
    assert len(members) >= 3, [p.cmdline() for p in members]

    code = engine.stop(STOP_GRACE)

    assert code == 0  # vLLM shuts down cleanly on SIGTERM, without the SIGKILL fallback
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)
    for proc in members:
        assert not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    assert engine.stop(STOP_GRACE) == code


def test_bad_flag_exits_fast_with_argparse_message(tiny_model: Path) -> None:
    port = engine_env.free_port()
    engine = Engine(
        engine_env.serve_argv(tiny_model, port, "--no-such-flag"),
        engine_env.engine_env(),
        "127.0.0.1",
        port,
    )
    engine.start()
    try:
        # The deadline is the full boot allowance: "exited" proves the exit was noticed, not waited out.
        assert engine.wait_ready(BOOT_TIMEOUT) == "exited"
        assert engine.returncode == 2
        assert "vllm: error: unrecognized arguments: --no-such-flag" in engine.tail()
    finally:
        engine.stop(STOP_GRACE)
