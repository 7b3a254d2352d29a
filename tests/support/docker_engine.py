"""A Docker engine, the worker's image and its containers, for the image tier (tests/image).

The engine is this project's own (scripts/image/engine.sh: Debian's docker.io, installed when
missing; images kept in /var/cache/vllm-worker-image so the base built once is found again), or
the one at DOCKER_HOST when it answers. One this module started is stopped when the tier ends.
The image is built by scripts/image/build.sh, what `make image` runs.

Needs root (the engine, debootstrap, mounts): skipped without, and a failure under CI=true.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import psutil
import pytest

from tests.support.worker_proc import REPO_ROOT

DOCKER = "/usr/bin/docker"  # Debian's client: BuildKit without the buildx plugin
ENGINE_SH = REPO_ROOT / "scripts" / "image" / "engine.sh"
BUILD_SH = REPO_ROOT / "scripts" / "image" / "build.sh"
BUILD_TIMEOUT_S = 1800.0
# Docker's default /dev/shm is 64 MiB; vLLM's CPU engine asks for 160 MiB at start (and says so:
# "Insufficient space in /dev/shm ... Increase /dev/shm (e.g. --shm-size or --ipc=host)").
SHM_SIZE = "1g"


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def unavailable(message: str) -> None:
    if in_ci():
        pytest.fail(f"{message} (CI=true: the image tier must run)", pytrace=False)
    pytest.skip(message)


@dataclass
class Engine:
    host: str  # DOCKER_HOST
    started: bool  # started by this session: stopped at its end

    def env(self) -> dict[str, str]:
        return {**os.environ, "DOCKER_HOST": self.host}

    def run(self, *args: str, timeout: float = 120.0, check: bool = True, input: bytes | None = None) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [DOCKER, *args], env=self.env(), capture_output=True, text=input is None, timeout=timeout, input=input
        )
        if check and done.returncode != 0:
            raise AssertionError(f"docker {' '.join(args[:3])} ... exited {done.returncode}: {done.stdout!s}{done.stderr!s}"[-4000:])
        return done

    def build(self, tag: str, *build_args: str, env: Mapping[str, str] | None = None) -> str:
        """scripts/image/build.sh with IMAGE=tag (and `docker build` options); returns its output."""
        done = subprocess.run(
            ["bash", str(BUILD_SH), *build_args],
            env={**self.env(), **(env or {}), "IMAGE": tag},
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
        )
        output = done.stdout + done.stderr
        if done.returncode != 0:
            raise AssertionError(f"the image build failed ({done.returncode}):\n{output[-6000:]}")
        return output


def start_engine() -> Engine:
    if os.geteuid() != 0:
        unavailable("the image tier needs root (a Docker engine, debootstrap, mounts)")
    done = subprocess.run(["bash", str(ENGINE_SH), "start"], capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        unavailable(f"no Docker engine could be started: {(done.stdout + done.stderr)[-3000:]}")
    host = done.stdout.strip().splitlines()[-1].removeprefix("DOCKER_HOST=")
    return Engine(host=host, started="engine: started" in done.stderr)


def stop_engine(engine: Engine) -> None:
    if engine.started:
        subprocess.run(["bash", str(ENGINE_SH), "stop"], capture_output=True, text=True, timeout=120)


# A reading of the container's process table from inside it, with its own Python.
PS = r"""
import json, os
rows = []
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    try:
        stat = open(f"/proc/{pid}/stat", "rb").read().decode(errors="replace")
        cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        continue
    rest = stat[stat.rfind(")") + 2:].split()
    rows.append({"pid": int(pid), "state": rest[0], "ppid": int(rest[1]), "pgrp": int(rest[2]),
                 "comm": stat[stat.find("(") + 1:stat.rfind(")")], "cmd": cmd})
print(json.dumps(rows))
"""


@dataclass
class Container:
    """One container of the image, run as the platform runs the worker: host network, PID 1, a volume."""

    engine: Engine
    image: str
    env: Mapping[str, str]
    volume: Path | None = None
    args: Sequence[str] = ()
    name: str = field(default_factory=lambda: f"vllm-worker-test-{uuid.uuid4().hex[:8]}")

    def start(self) -> "Container":
        command = ["run", "-d", "--name", self.name, "--network", "host", "--shm-size", SHM_SIZE]
        if self.volume is not None:
            command += ["-v", f"{self.volume}:/runpod-volume"]
        for key, value in self.env.items():
            command += ["-e", f"{key}={value}"]
        self.engine.run(*command, self.image, *self.args)
        return self

    def logs(self) -> str:
        done = self.engine.run("logs", self.name, check=False)
        return str(done.stdout) + str(done.stderr)

    def wait_for_log(self, needle: str, timeout: float, failed: str = "startup failed: ") -> None:
        deadline = time.monotonic() + timeout
        while needle not in (log := self.logs()):
            if failed in log:
                raise AssertionError(f"{failed!r} before {needle!r}:\n{log[-4000:]}")
            if not self.running():
                raise AssertionError(f"the container exited before {needle!r}:\n{self.logs()[-4000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {needle!r} in the container's log within {timeout:g} s:\n{self.logs()[-4000:]}")
            time.sleep(0.5)

    def state(self) -> dict[str, Any]:
        done = self.engine.run("inspect", "--format", "{{json .State}}", self.name)
        return dict(json.loads(done.stdout))

    def running(self) -> bool:
        return bool(self.state()["Running"])

    def exec(self, *command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.engine.run("exec", self.name, *command, check=check)

    def processes(self) -> list[dict[str, Any]]:
        """The container's process table (the reading process itself left out)."""
        rows = json.loads(self.exec("python3", "-c", PS).stdout)
        return [r for r in rows if "import json, os" not in r["cmd"]]

    def host_pid(self, pid: int) -> int:
        """The host's PID of the container's process `pid`: a signal sent from here needs no `docker exec`
        (a second or more on a loaded machine, in which a short job can end)."""
        first = int(self.state()["Pid"])
        for process in [psutil.Process(first), *psutil.Process(first).children(recursive=True)]:
            try:
                status = Path(f"/proc/{process.pid}/status").read_text()
            except OSError:
                continue
            nspid = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
            if nspid and int(nspid[-1]) == pid:
                return process.pid
        raise LookupError(f"no process {pid} in the container {self.name}")

    def stop(self, grace: int) -> subprocess.CompletedProcess[str]:
        """`docker stop -t grace`: SIGTERM to PID 1, SIGKILL after `grace` seconds."""
        return self.engine.run("stop", "-t", str(grace), self.name, timeout=grace + 120)

    def remove(self) -> None:
        self.engine.run("rm", "-f", self.name, check=False)
