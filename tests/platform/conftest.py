"""The platform tier: the worker run the way Runpod runs it, on the paths the integration tier stands in for.

- The SDK's production start with its fitness checks on (no RUNPOD_SKIP_*; `ControlPlane.env(sdk_checks=True)`).
- A network of the test's own (`unshare -n`, loopback up; tests.support.volumes.private_network): every
  test here runs in one, with the control-plane and Hub stand-ins inside it, so the SDK's connect to
  8.8.8.8 fails at once and no packet leaves the machine.
- The image's environment: HF_HOME under BASE_PATH, as the Dockerfile sets it
  (tests/support/dockerfile.py reads it from the Dockerfile).
- A network volume as the platform mounts one: a filesystem of its own, bound at each worker's BASE_PATH
  in that worker's mount namespace (`unshare -m --propagation private`), several workers sharing it.

The engine is the scripted stand-in (tests/support/fake_vllm.py): what is under test is the worker on
the platform's paths, not vLLM. Needs root; skipped without (a failure under CI=true).
"""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.support.volumes import private_network


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/platform/" in str(item.fspath):
            item.add_marker(pytest.mark.platform)


@pytest.fixture(autouse=True)
def network_of_its_own() -> Iterator[None]:
    with private_network():
        yield
