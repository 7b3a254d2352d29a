"""Under CI=true a skip fails the run, whether it happens in a test or while collecting a module.

A child pytest runs small test files with tests/conftest.py loaded as a plugin: once with
CI=true, once without, so the hook is seen to turn exactly the skips into failures.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

MODULE_SKIP = """
import pytest

pytest.importorskip("no_such_module_for_the_ci_hook")


def test_never_collected() -> None:
    pass
"""
TEST_SKIP = """
import pytest


def test_skipped() -> None:
    pytest.skip("not here")


def test_passes() -> None:
    pass
"""


def child_pytest(tmp_path: Path, source: str, ci: bool) -> subprocess.CompletedProcess[str]:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    test_file = tmp_path / "test_child.py"
    test_file.write_text(source)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci:
        env["CI"] = "true"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider", "-c", str(tmp_path / "pytest.ini"),
         "--rootdir", str(tmp_path), str(test_file)],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120,
    )


@pytest.mark.parametrize("ci", [False, True])
def test_a_module_level_skip_fails_the_run_only_under_ci(tmp_path: Path, ci: bool) -> None:
    done = child_pytest(tmp_path, MODULE_SKIP, ci)
    output = done.stdout + done.stderr
    if ci:
        # A collection error: pytest stops before running anything.
        assert done.returncode == pytest.ExitCode.INTERRUPTED, output
        assert "skipped at collection under CI=true, which counts as a failure" in output
    else:
        # Nothing else in the run: "no tests collected", the skip reported as a skip.
        assert done.returncode == pytest.ExitCode.NO_TESTS_COLLECTED, output
        assert "1 skipped" in output


@pytest.mark.parametrize("ci", [False, True])
def test_a_skip_inside_a_test_fails_it_only_under_ci(tmp_path: Path, ci: bool) -> None:
    done = child_pytest(tmp_path, TEST_SKIP, ci)
    output = done.stdout + done.stderr
    if ci:
        assert done.returncode == 1, output
        assert "1 failed, 1 passed" in output and "skipped under CI=true" in output
    else:
        assert done.returncode == 0, output
        assert "1 passed, 1 skipped" in output
