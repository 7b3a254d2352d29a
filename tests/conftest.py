"""Suite-wide rule: under CI (CI=true) a skipped test is a failure, never a pass.

Engine tests skip on a developer's machine without `.venv-engine`; in CI that
environment is built by `make test`, so a skip there means something is broken.
The GPU tier (tests/gpu) is not collected where the worker lists no NVIDIA GPU (NVML, else nvidia-smi).
A skip at collection (a module-level `pytest.importorskip` or `pytest.skip(...,
allow_module_level=True)`) would drop a whole file without a test report, so it is a
failure too (tests/unit/test_ci_hook.py runs both cases in a child pytest).
"""

from __future__ import annotations

import os

import pytest

from vllm_worker.engine.gpu_memory import list_gpus

IN_CI = os.environ.get("CI", "").lower() == "true"


# The GPU tier needs a card; where there is none (CI, every developer's machine) it is not collected,
# rather than skipped, so CI=true's rule below stays whole.
collect_ignore = [] if list_gpus() else ["gpu"]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_logreport(report: pytest.TestReport):  # type: ignore[no-untyped-def]
    if IN_CI and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, which counts as a failure: {report.longrepr}"
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if IN_CI and report.skipped:
        report.outcome = "failed"
        report.longrepr = f"skipped at collection under CI=true, which counts as a failure: {report.longrepr}"
