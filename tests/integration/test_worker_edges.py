"""The worker's own edges never crash: each is answered on the job, and the worker keeps running.

An exit is a crash loop on the platform, so the worker process is driven through the real
runpod SDK and every case asserts two things: the job's answer names the cause, and the
worker was still running when it was stopped (exit code 0 after SIGTERM). The engines here
are tiny real programs doing what a broken engine does at the OS level (a missing command,
a file that is not executable, an exit with no output, bytes that are not UTF-8, a line of
megabytes, a stdout closed by a live process); the host fault is the scripted engine printing
vLLM's NCCL error.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.control_plane import ControlPlane
from tests.support.fake_engine import FakeEngine
from tests.support.worker_proc import WorkerProcess

pytestmark = pytest.mark.integration

JOB_TIMEOUT = 120.0
JOB = {"messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def cp() -> Iterator[ControlPlane]:
    with ControlPlane() as plane:
        yield plane


def env_with(command: str, **extra: str) -> dict[str, str]:
    return {"HF_HUB_OFFLINE": "1", "MODEL_NAME": "acme/tiny-chat", "VLLM_COMMAND": command, **extra}


def engine_script(tmp_path: Path, body: str) -> str:
    """A Python program standing in for `vllm serve`; returns the VLLM_COMMAND that runs it."""
    script = tmp_path / "engine.py"
    script.write_text("import os, sys, time\n" + body)
    return f"{sys.executable} {script}"


def answer(env: dict[str, str], cp: ControlPlane, tmp_path: Path) -> tuple[str, WorkerProcess]:
    with WorkerProcess(env, control_plane=cp, workdir=tmp_path) as worker:
        result = cp.result(cp.submit(JOB), timeout=JOB_TIMEOUT)
        assert worker.returncode is None, "the worker exited instead of answering"
        code = worker.stop()
    assert code == 0
    assert set(result) == {"error"}, result
    error = result["error"]
    assert "Traceback" not in error
    return error, worker


def test_a_missing_vllm_command_is_answered_naming_it(cp: ControlPlane, tmp_path: Path) -> None:
    error, _ = answer(env_with("no-such-vllm serve"), cp, tmp_path)
    assert error.startswith("The engine command VLLM_COMMAND='no-such-vllm serve' cannot be started: ")
    assert "'no-such-vllm' was not found on the PATH" in error


def test_a_vllm_command_that_is_not_executable_is_answered_naming_it(cp: ControlPlane, tmp_path: Path) -> None:
    program = tmp_path / "vllm"
    program.write_text("#!/bin/sh\nexit 0\n")
    program.chmod(0o644)
    error, _ = answer(env_with(f"{program} serve"), cp, tmp_path)
    assert f"VLLM_COMMAND='{program} serve' cannot be started: '{program}' is not an executable file" in error


def test_an_engine_that_exits_at_once_without_output_is_answered(cp: ControlPlane, tmp_path: Path) -> None:
    error, _ = answer(env_with(engine_script(tmp_path, "sys.exit(3)\n")), cp, tmp_path)
    assert error.startswith("vLLM exited (exit code 3) before printing anything")
    assert "VLLM_COMMAND" in error


def test_output_that_is_not_utf8_is_read_and_the_root_error_answered(cp: ControlPlane, tmp_path: Path) -> None:
    body = (
        "sys.stderr.buffer.write(b'\\xff\\xfe\\x80 binary noise\\n')\n"
        "sys.stderr.buffer.write(b'RuntimeError: the flux capacitor is misaligned \\xe9t\\xe9\\n')\n"
        "sys.stderr.buffer.write(b'RuntimeError: Engine core initialization failed. See root cause above.\\n')\n"
        "sys.exit(1)\n"
    )
    error, _ = answer(env_with(engine_script(tmp_path, body)), cp, tmp_path)
    assert error.startswith("vLLM failed to start: RuntimeError: the flux capacitor is misaligned")
    assert "(exit code 1)" in error and "does not know this failure" in error


def test_a_line_of_megabytes_does_not_stall_the_worker(cp: ControlPlane, tmp_path: Path) -> None:
    body = (
        "sys.stderr.write('x' * (8 * 2**20))\n"
        "sys.stderr.write('\\nRuntimeError: boom after a long line\\n')\n"
        "sys.stderr.flush()\n"
        "sys.exit(1)\n"
    )
    error, worker = answer(env_with(engine_script(tmp_path, body)), cp, tmp_path)
    assert error.startswith("vLLM failed to start: RuntimeError: boom after a long line (exit code 1)")
    # The log holds the line cut, not 8 MiB of it.
    assert len(worker.log()) < 2**20


def test_an_engine_that_closes_its_output_and_hangs_is_answered_at_the_startup_timeout(
    cp: ControlPlane, tmp_path: Path
) -> None:
    body = "os.close(1)\nos.close(2)\ntime.sleep(600)\n"
    env = env_with(engine_script(tmp_path, body), VLLM_STARTUP_TIMEOUT="3", VLLM_STOP_GRACE="1")
    error, _ = answer(env, cp, tmp_path)
    assert error.startswith("vLLM did not become ready within VLLM_STARTUP_TIMEOUT=3 seconds")


def test_a_host_fault_is_relaunched_once_then_answered_with_how_to_get_a_fresh_machine(
    cp: ControlPlane, tmp_path: Path
) -> None:
    # vLLM 0.32's NCCL failure (tests/support/vllm_texts.py UNKNOWN_FAILURE), on every launch.
    engine = FakeEngine(tmp_path, [{"text": "UNKNOWN_FAILURE", "exit_code": 1}])
    env = {"HF_HUB_OFFLINE": "1", "MODEL_NAME": "acme/tiny-chat", **engine.env()}
    error, _ = answer(env, cp, tmp_path)
    assert len(engine.launches()) == 2
    assert error.startswith("vLLM failed to start because of a fault in the GPUs' communication library (NCCL)")
    assert "Already tried: relaunched once with the same settings." in error
    assert "terminate this worker" in error
