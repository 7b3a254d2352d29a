"""vLLM's own figures, straight from its /metrics: the one reader the engine tests and bench/ share.

A figure is summed over its series (one per engine, model or label set). Reads go to loopback only,
never through an HTTP(S)_PROXY from the environment, and wait up to READ_TIMEOUT_S: a clean-clone CI
run's /metrics read timed out at 5 s, four streams and another engine file on two cores.
"""

from __future__ import annotations

import re
import urllib.request

READ_TIMEOUT_S = 30.0
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def read(port: int, timeout: float = READ_TIMEOUT_S) -> str:
    """The engine's /metrics text."""
    with _OPENER.open(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as response:
        return response.read().decode()


def values(text: str, name: str) -> list[float]:
    """Every series of `name` in a /metrics text (none: it is not there)."""
    return [float(v) for v in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)]


def metric(port: int, name: str, timeout: float = READ_TIMEOUT_S) -> float:
    """One figure of a fresh read, summed over its series; an AssertionError when vLLM has no such figure."""
    found = values(read(port, timeout), name)
    assert found, f"{name} is not in vLLM's /metrics"
    return sum(found)
