"""Network-volume folders that cannot take the engine's caches: read-only, or full.

A real filesystem says no, as a volume would: a tmpfs mounted read-only, or one too small
for the caches. Mounting needs root with CAP_SYS_ADMIN (a CI container has it); without it a
read-only folder is made by permissions, which bind any user but root. Where neither works
the test is skipped, and CI=true turns that skip into a failure.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def _mount(folder: Path, options: str) -> bool:
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True)
    return done.returncode == 0


def _unavailable(why: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{why} (CI=true: this test must run)", pytrace=False)
    pytest.skip(why)


@contextlib.contextmanager
def read_only_volume(folder: Path) -> Iterator[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    if _mount(folder, "ro,size=1m"):
        try:
            yield folder
        finally:
            subprocess.run(["umount", "-l", str(folder)], capture_output=True)
        return
    if os.geteuid() != 0:
        folder.chmod(0o555)
        try:
            yield folder
        finally:
            folder.chmod(0o755)
        return
    _unavailable("cannot mount a read-only tmpfs here, and root ignores folder permissions")


@contextlib.contextmanager
def full_volume(folder: Path) -> Iterator[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    if not _mount(folder, "size=1m"):
        _unavailable("cannot mount a small tmpfs here to stand for a full volume")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)
