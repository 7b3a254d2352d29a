"""The GPU tier (tests/gpu): collected only where NVML or `nvidia-smi` lists a GPU; see test_real_gpu.py."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/gpu/" in str(item.fspath):
            item.add_marker(pytest.mark.gpu)
