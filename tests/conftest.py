"""Suite-wide rule: under CI (CI=true) a skipped test is a failure, never a pass.

Engine tests skip on a developer's machine without `.venv-engine`; in CI that
environment is built by `make test`, so a skip there means something is broken.
The GPU tier (tests/gpu) is not collected where the worker lists no NVIDIA GPU (NVML, else nvidia-smi).
A skip at collection (a module-level `pytest.importorskip` or `pytest.skip(...,
allow_module_level=True)`) would drop a whole file without a test report, so it is a
failure too (tests/unit/test_ci_hook.py runs both cases in a child pytest).

The order: `make test` hands whole files to two processes in collection order (`--dist loadfile
--no-loadscope-reorder`), the files that take minutes (the image tier, then the engine tier's slowest) first and
the many quick files at the end, in place of xdist's own order (most tests first). It did not shorten the run
(3,028 s of tests against 3,050 s, 2026-12-07: both processes were busy to the end either way); what it keeps is
the intake file away from the image build (below).
"""

from __future__ import annotations

import os

import pytest

from vllm_worker.engine.gpu_memory import list_gpus

IN_CI = os.environ.get("CI", "").lower() == "true"


# The GPU tier needs a card; where there is none (CI, every developer's machine) it is not collected,
# rather than skipped, so CI=true's rule below stays whole.
collect_ignore = [] if list_gpus() else ["gpu"]

# Collected first, in this order (the slowest files of a clean-clone run, 2026-12-07); then the rest of each tier.
# The intake file comes after two long files that need no steady machine: its bounds count jobs a stalled worker
# has not posted yet, and the image tier's build (its first test's setup) is the heaviest load of the run.
SLOW_FIRST = (
    "tests/image/",
    "tests/engine/test_cold_start.py",
    "tests/engine/test_self_healing.py",
    "tests/engine/test_intake_real_engine.py",
    "tests/engine/test_real_failures.py",
    "tests/engine/test_misconfiguration_table.py",
    "tests/engine/test_streams_whole.py",
    "tests/engine/test_engine_hang.py",
    "tests/engine/test_continuation_real_engine.py",
    "tests/engine/test_platform_life.py",
    "tests/engine/",
    "tests/platform/",
    "tests/integration/",
)


def _rank(nodeid: str) -> int:
    return next((i for i, prefix in enumerate(SLOW_FIRST) if nodeid.startswith(prefix)), len(SLOW_FIRST))


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """The slowest files first (a stable sort: within a file, and among the rest, the collection's order)."""
    items.sort(key=lambda item: _rank(item.nodeid))


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
