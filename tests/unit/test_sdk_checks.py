"""The runpod SDK's fitness checks never run in this worker, and what runs instead (serving.platform).

runpod 1.12's `worker.run_worker` awaits `run_fitness_checks` (imported by name from rp_fitness)
before its job loop; a failing check there is `os._exit(1)`. Pinned: the name the SDK awaits, that
the worker replaces it, and that the replacement exits nothing and says what the worker's own checks
found. tests/platform runs the SDK's production start with the checks on.
"""

from __future__ import annotations

import asyncio
import inspect
import logging

import pytest
from runpod.serverless import worker as sdk_worker
from runpod.serverless.modules import rp_fitness

from vllm_worker.serving import platform


def test_the_sdk_awaits_the_name_the_worker_replaces_before_its_job_loop() -> None:
    source = inspect.getsource(sdk_worker.run_worker)
    assert "run_fitness_checks()" in source
    assert source.index("run_fitness_checks()") < source.index("JobScaler(")
    assert sdk_worker.run_fitness_checks is rp_fitness.run_fitness_checks or getattr(
        sdk_worker.run_fitness_checks, "_vllm_worker", False
    )


def test_after_the_patch_the_sdks_checks_do_not_run_and_the_worker_says_what_its_own_found(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sdk_worker, "run_fitness_checks", rp_fitness.run_fitness_checks)
    ran: list[str] = []

    def failing_check() -> None:
        ran.append("sdk")
        raise RuntimeError("Insufficient disk space")

    monkeypatch.setattr(rp_fitness, "_fitness_checks", [failing_check])
    monkeypatch.setattr(rp_fitness, "_terminate_unhealthy", lambda code=1: ran.append(f"exit {code}"))
    platform.record_machine_checks(["memory: ok", "gpus: ok", "disk: ok", "internet: ok"])
    platform.keep_sdk_checks_off()
    platform.keep_sdk_checks_off()  # twice: still one replacement
    with caplog.at_level(logging.INFO, logger="vllm_worker"):
        asyncio.run(sdk_worker.run_fitness_checks())

    assert ran == []
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "fitness checks are not run" in lines[0]
    assert "memory: ok; gpus: ok; disk: ok; internet: ok" in lines[0]


def test_without_the_patch_the_same_check_would_exit_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the patch guards against, through the SDK's own runner (its exit captured)."""
    exits: list[int] = []
    monkeypatch.setattr(rp_fitness, "_fitness_checks", [lambda: (_ for _ in ()).throw(RuntimeError("no"))])
    monkeypatch.setattr(rp_fitness, "_terminate_unhealthy", lambda code=1: exits.append(code))
    monkeypatch.setattr(rp_fitness, "_report_unhealthy", lambda check, reason: None)
    monkeypatch.setitem(rp_fitness._registration_state, "gpu_check", True)
    monkeypatch.setitem(rp_fitness._registration_state, "system_checks", True)
    asyncio.run(rp_fitness.run_fitness_checks())
    assert exits == [1]
