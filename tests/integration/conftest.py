"""The event loops the worker really runs its jobs on, for the tests that relay a stream.

runpod 1.12 runs its job loop on plain asyncio, and the local API (`--rp_serve_api`, and the
realtime server on the platform) under uvicorn, which runs uvloop where it is installed (it is, in
the worker's venv). Their clocks differ: uvloop's `loop.time()` is libuv's millisecond-cached time,
not `time.monotonic()`. A test module that sets `BOTH_LOOPS = True` runs each of its async tests on
both loops; every other async test runs on asyncio's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import pytest
import uvloop

ASYNCIO_ONLY: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {"asyncio": asyncio.new_event_loop}
BOTH: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {**ASYNCIO_ONLY, "uvloop": uvloop.new_event_loop}


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    module = getattr(item, "module", None)
    return BOTH if getattr(module, "BOTH_LOOPS", False) else ASYNCIO_ONLY
