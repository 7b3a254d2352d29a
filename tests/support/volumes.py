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
import sys
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


def _can(argv: list[str]) -> bool:
    try:
        return subprocess.run(argv, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@contextlib.contextmanager
def network_volume(folder: Path, size: str = "8g") -> Iterator[Path]:
    """A filesystem of its own mounted at `folder`, as a network volume is: `os.path.ismount` is true
    there (a folder bound onto itself on the same filesystem is not a mount point to it). Workers
    share it by binding it at their BASE_PATH inside their own mount namespaces (`in_mount_namespace`)."""
    folder.mkdir(parents=True, exist_ok=True)
    if not _mount(folder, f"size={size}"):
        _unavailable("cannot mount a tmpfs here to stand for a network volume (needs root with CAP_SYS_ADMIN)")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def loopback_up() -> None:
    """Bring up `lo` in the calling thread's network namespace (SIOCSIFFLAGS, what `ip link set lo up`
    does): a machine without iproute2 (the lent GPU machine has none) can still make a network of its own."""
    import fcntl
    import socket
    import struct

    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, siocgifflags, request))[1]
        fcntl.ioctl(sock, siocsifflags, struct.pack("16sH14x", b"lo", flags | iff_up))


_LOOPBACK_UP = "import sys; sys.path.insert(0, sys.argv[1]); from tests.support.volumes import loopback_up; loopback_up()"


def require_namespaces() -> None:
    """Skip (fail under CI=true) where the test cannot make network and mount namespaces of its own."""
    repo = str(Path(__file__).resolve().parents[2])
    if not _can(["unshare", "-n", "-m", "--propagation", "private", sys.executable, "-c", _LOOPBACK_UP, repo]):
        _unavailable("cannot make network and mount namespaces here (unshare -n -m needs root)")


@contextlib.contextmanager
def private_network() -> Iterator[None]:
    """The calling thread (and every process it starts) in a network namespace with only loopback, up:
    servers it starts on 127.0.0.1 are reachable from its children, a connect to a public address
    fails at once ("Network is unreachable") and no packet leaves the machine. Restored on exit;
    sockets made inside keep working."""
    import ctypes

    require_namespaces()
    libc = ctypes.CDLL(None, use_errno=True)
    clone_newnet = 0x40000000
    saved = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        if libc.unshare(clone_newnet) != 0:
            _unavailable(f"unshare(CLONE_NEWNET) failed: errno {ctypes.get_errno()}")
        loopback_up()
        yield
    finally:
        if libc.setns(saved, clone_newnet) != 0:
            raise OSError(ctypes.get_errno(), "could not return to the test's network namespace")
        os.close(saved)


def in_mount_namespace(command: list[str], volume: tuple[Path, Path] | None = None, also: list[str] | None = None) -> list[str]:
    """`command` in a mount namespace of its own (`unshare -m --propagation private`), as a container
    on the platform sees its filesystems: `volume` = (shared folder, mount point) binds the shared
    folder at the mount point, as the platform mounts a network volume; no other process, the
    test's included, sees the mount, and it goes with the namespace. `also`: more shell lines run
    inside before the command (e.g. a small tmpfs over a folder). The network namespace is the
    caller's (tests/platform/conftest.py gives the test one with only loopback).
    """
    lines = ["set -e"]
    if volume is not None:
        shared, mount_point = volume
        lines += [f"mkdir -p '{mount_point}'", f"mount --bind '{shared}' '{mount_point}'"]
    lines += list(also or [])
    lines.append('exec "$@"')
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", "; ".join(lines), "sh", *command]
