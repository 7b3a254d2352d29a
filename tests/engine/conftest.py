"""Fixtures for tests that run the real vLLM CPU engine.

Booting the engine costs ~30 s of two shared cores, so tests that only need *a* running
engine share one per session (`tiny_engine`); tests about starting and stopping it boot
their own.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import engine_env
from tests.support.engine_env import STOP_GRACE, start_ready_engine
from vllm_worker.engine.process import Engine


@pytest.fixture(autouse=True)
def _require_engine() -> None:
    engine_env.require_engine()


@pytest.fixture(scope="session")
def vllm_bin() -> Path:
    return engine_env.require_engine()


@pytest.fixture(scope="session")
def tiny_model(vllm_bin: Path) -> Path:
    """The built-in tiny Llama, generated on first use."""
    return engine_env.make_tiny_model()


@pytest.fixture(scope="session")
def tiny_engine(tiny_model: Path) -> Iterator[Engine]:
    """One real engine serving the tiny model (served name: the model's path), for the whole session."""
    port = engine_env.free_port()
    engine = start_ready_engine(engine_env.serve_argv(tiny_model, port), port)
    try:
        yield engine
    finally:
        engine.stop(STOP_GRACE)
