"""The worker's promises on the platform's own paths: it never exits on the SDK's checks, a fresh
worker is counted only on a real volume, and a stop posts every answer before the SIGKILL.

Each worker here is a container as the platform starts one: `python -m vllm_worker run` through the
SDK's production start (a job endpoint set, its fitness checks on), in this test's network
namespace (tests/platform/conftest.py), in a mount namespace of its own, with the image's
HF_HOME under BASE_PATH. See the conftest for what each stand-in stands for.
"""

from __future__ import annotations

import errno
import json
import re
import shutil
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator, Sequence

import pytest

from tests.support import dockerfile, vllm_texts
from tests.support.control_plane import ControlPlane
from tests.support.fake_engine import FakeEngine
from tests.support.hub_stub import HubStub
from tests.support.volumes import in_mount_namespace, network_volume
from tests.support.worker_proc import REPO_ROOT, WorkerProcess
from vllm_worker.config import settings as settings_mod
from vllm_worker.engine import machine_checks
from vllm_worker.serving import fresh_machine, platform

MODEL = "acme/tiny-chat"
JOB = {"messages": [{"role": "user", "content": "Hi"}], "sampling_params": {"max_tokens": 2}}
# A fault of the machine at start, as vLLM prints one (NCCL inside an engine-core crash).
HOST_FAULT = vllm_texts.UNKNOWN_FAILURE
START_S = 120.0


def image_env(base_path: Path) -> dict[str, str]:
    """HF_HOME and HF_HUB_CACHE as the Dockerfile's ENV sets them, under this BASE_PATH."""
    text = " ".join(rest for word, rest in dockerfile.instructions((REPO_ROOT / "Dockerfile").read_text()) if word == "ENV")
    env = {}
    for name in ("HF_HOME", "HF_HUB_CACHE"):
        match = re.search(rf"\b{name}=(\S+)", text)
        assert match is not None, f"the Dockerfile sets no {name}"
        env[name] = match.group(1).replace("${BASE_PATH}", str(base_path))
    assert env["HF_HOME"].startswith(str(base_path))
    return env


class Container:
    """One worker container: its control plane, its scripted engine, its own view of the filesystems."""

    def __init__(
        self,
        root: Path,
        launches: Sequence[dict[str, Any]],
        base_path: Path,
        volume: Path | None = None,
        also: Sequence[str] = (),
        **env: str,
    ) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.cp = ControlPlane(worker_id=f"worker-{root.name}").start()
        self.engine = FakeEngine(root, launches)
        full = {
            **self.cp.env(sdk_checks=True),
            "MODEL_NAME": MODEL,
            "HF_HUB_OFFLINE": "1",
            **self.engine.env(),
            **image_env(base_path),
            "BASE_PATH": str(base_path),
            **env,
        }
        command = in_mount_namespace(
            [sys.executable, "-m", "vllm_worker"], volume=(volume, base_path) if volume else None, also=list(also)
        )
        self.worker = WorkerProcess(full, command=command, workdir=root)
        self.env = full

    def start(self) -> "Container":
        self.worker.start()
        return self

    def answer(self, timeout: float = START_S) -> dict[str, Any]:
        return self.cp.result(self.cp.submit(JOB), timeout=timeout)

    def close(self) -> None:
        try:
            self.worker.stop(timeout=30)
        finally:
            self.engine.kill_leftovers()
            self.cp.close()


@pytest.fixture
def containers() -> Iterator[list[Container]]:
    made: list[Container] = []
    yield made
    for container in made:
        container.close()


def test_the_namespace_has_no_route_to_the_internet() -> None:
    """What the SDK's internet check would meet: a connect to 8.8.8.8 fails at once, nothing leaves."""
    with socket.socket() as probe:
        probe.settimeout(2)
        with pytest.raises(OSError) as failed:
            probe.connect(("8.8.8.8", 53))
    assert failed.value.errno == errno.ENETUNREACH


def test_with_the_sdks_checks_on_a_nearly_full_disk_by_its_measure_and_no_internet_the_worker_serves(
    tmp_path: Path, containers: list[Container]
) -> None:
    """runpod 1.12 exits 1 here (`_disk_check` at 99.9 %, `_network_check` without a route): the worker does not."""
    container = Container(
        tmp_path / "c", [{"serve": True}], tmp_path / "c" / "runpod-volume", RUNPOD_MIN_DISK_PERCENT="99.9"
    )
    containers.append(container.start())
    first = container.answer()
    second = container.answer()
    log = container.worker.log()

    assert "output" in first and "output" in second and "error" not in first
    assert container.worker.returncode is None
    assert "Fitness check failed" not in log and "Worker is unhealthy" not in log
    assert "the runpod SDK's fitness checks are not run" in log
    for name in ("memory", "gpus", "internet"):
        assert re.search(rf"machine check {name}: ok: ", log), name
    assert log.count("is not a network volume") == 1


def test_a_model_larger_than_the_container_disk_is_answered_with_the_fix_and_the_worker_stays(
    tmp_path: Path, containers: list[Container]
) -> None:
    disk = tmp_path / "c" / "container-disk"  # a 64 MiB disk of the container, BASE_PATH a folder on it
    disk.mkdir(parents=True)
    with HubStub() as hub:
        parameters = {"BF16": 2_000_000_000}  # 4 GB of weights, by the pre-flight's safetensors count
        hub.add_repo(MODEL, files={"config.json": "{}"}, safetensors={"parameters": parameters, "total": 2_000_000_000})
        container = Container(
            tmp_path / "c",
            [{"serve": True}],
            disk / "runpod-volume",
            also=[f"mount -t tmpfs -o size=64m tmpfs '{disk}'"],
            HF_HUB_OFFLINE="",
            HF_ENDPOINT=hub.endpoint,
        )
        containers.append(container.start())
        first = container.answer()
        second = container.answer()

    assert first == second and "stopPod" not in first
    assert "raise the endpoint's container disk" in first["error"] and "network volume" in first["error"]
    assert "the container disk" in first["error"]
    assert container.worker.returncode is None and container.engine.launches() == []
    assert "machine check disk: FAILED" in container.worker.log()


def test_too_little_memory_is_answered_with_the_fix_and_the_worker_stays(tmp_path: Path, containers: list[Container]) -> None:
    container = Container(tmp_path / "c", [{"serve": True}], tmp_path / "c" / "runpod-volume", RUNPOD_MIN_MEMORY_GB="100000")
    containers.append(container.start())
    first = container.answer()
    second = container.answer()

    assert first == second and "stopPod" not in first
    assert "choose a GPU type with more system memory" in first["error"]
    assert container.worker.returncode is None and container.engine.launches() == []


FAKE_LIBCUDA = r"""
#include <stddef.h>
typedef int CUresult;
CUresult cuInit(unsigned int f) { return 0; }
CUresult cuDeviceGet(int *d, int i) { *d = i; return 0; }
CUresult cuDevicePrimaryCtxRetain(void **c, int d) { *c = (void *)1; return 0; }
CUresult cuDevicePrimaryCtxRelease_v2(int d) { return 0; }
CUresult cuCtxSetCurrent(void *c) { return 0; }
CUresult cuCtxSynchronize(void) { return 0; }
CUresult cuMemAlloc_v2(unsigned long long *p, size_t n) { return 2; }
CUresult cuMemFree_v2(unsigned long long p) { return 0; }
CUresult cuMemsetD8_v2(unsigned long long p, unsigned char v, size_t n) { return 0; }
CUresult cuGetErrorName(CUresult e, const char **s) { *s = e == 2 ? "CUDA_ERROR_OUT_OF_MEMORY" : "CUDA_ERROR_UNKNOWN"; return 0; }
"""


def broken_gpu(root: Path) -> dict[str, str]:
    """A machine whose one GPU is listed (nvidia-smi) and cannot allocate (the CUDA driver says out of memory)."""
    if shutil.which("gcc") is None:
        pytest.skip("no C compiler to build the scripted CUDA driver")
    bin_dir, lib_dir = root / "bin", root / "lib"
    bin_dir.mkdir(parents=True)
    lib_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA H100 80GB HBM3'\n")
    smi.chmod(0o755)
    source = root / "libcuda.c"
    source.write_text(FAKE_LIBCUDA)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib_dir / "libcuda.so.1"), str(source)], check=True)
    return {"PATH": f"{bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LD_LIBRARY_PATH": str(lib_dir)}


def test_a_gpu_that_cannot_allocate_asks_for_a_fresh_worker_before_any_launch(
    tmp_path: Path, containers: list[Container]
) -> None:
    with network_volume(tmp_path / "shared") as shared:
        container = Container(
            tmp_path / "c", [{"serve": True}], tmp_path / "runpod-volume", volume=shared, **broken_gpu(tmp_path / "gpu")
        )
        containers.append(container.start())
        result = container.answer()
        code = container.worker.wait(timeout=60)  # the SDK ends its loop after the job it asked a fresh worker for
        stamps = json.loads((shared / fresh_machine.STATE_FOLDER / fresh_machine.LEDGER_FILE).read_text())

    assert result["stopPod"] is True and code == 0
    assert "GPU 0 of this machine cannot allocate memory (CUDA_ERROR_OUT_OF_MEMORY (2))" in result["error"]
    assert "asked the platform for a fresh worker" in result["error"]
    assert [entry["cause"] for entry in stamps["fresh_workers"]] == [machine_checks.GPU_FAULT_KIND]
    assert container.engine.launches() == []


def run_four(make: Any) -> list[dict[str, Any]]:
    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(lambda c: c.answer(), [make(i) for i in range(4)]))


def test_four_fresh_containers_without_a_volume_never_ask_for_a_fresh_worker_and_say_why(
    tmp_path: Path, containers: list[Container]
) -> None:
    def make(i: int) -> Container:
        # Each container's BASE_PATH is a folder of its own disk, made by the engine's download into HF_HOME.
        root = tmp_path / f"c{i}"
        Path(image_env(root / "runpod-volume")["HF_HUB_CACHE"]).mkdir(parents=True)
        container = Container(root, [{"output": HOST_FAULT, "exit_code": 1}], root / "runpod-volume")
        containers.append(container.start())
        return container

    results = run_four(make)

    assert all("stopPod" not in r for r in results)
    for result in results:
        assert "NCCL" in result["error"] and "not a mounted volume" in result["error"]
        assert "attach a network volume" in result["error"]


def test_four_containers_sharing_a_mounted_volume_ask_for_exactly_the_limit_of_fresh_workers(
    tmp_path: Path, containers: list[Container]
) -> None:
    limit = settings_mod.load({"MODEL_NAME": MODEL}).refresh_limit
    base_path = tmp_path / "runpod-volume"  # the same mount point in every container, as the platform mounts it

    with network_volume(tmp_path / "shared") as shared:

        def make(i: int) -> Container:
            container = Container(tmp_path / f"c{i}", [{"output": HOST_FAULT, "exit_code": 1}], base_path, volume=shared)
            containers.append(container.start())
            return container

        results = run_four(make)
        stamps = json.loads((shared / fresh_machine.STATE_FOLDER / fresh_machine.LEDGER_FILE).read_text())

    assert not base_path.joinpath(fresh_machine.STATE_FOLDER).exists()  # the mounts were each container's own
    asked = [r for r in results if r.get("stopPod") is True]
    assert len(asked) == limit == len(stamps["fresh_workers"])
    assert all("asked the platform for a fresh worker" in r["error"] for r in asked)
    left = [r for r in results if "stopPod" not in r]
    assert len(left) == 4 - limit and all("Fresh machines did not help" in r["error"] for r in left)


def test_a_stop_posts_the_answers_of_jobs_that_cannot_finish_before_the_platforms_sigkill(
    tmp_path: Path, containers: list[Container]
) -> None:
    container = Container(
        tmp_path / "c", [{"serve": True, "answer_after": 600}], tmp_path / "c" / "runpod-volume", MAX_CONCURRENCY="4"
    )
    containers.append(container.start())
    container.worker.wait_for_log(r"engine ready; taking jobs", timeout=START_S)
    jobs = [container.cp.submit(JOB) for _ in range(3)]
    deadline = time.monotonic() + 60
    while sum(r["method"] == "POST" for r in container.engine.requests()) < 3:
        assert time.monotonic() < deadline, "the jobs never reached the engine"
        time.sleep(0.05)

    # SIGTERM, then SIGKILL of the whole process group KILL_AFTER_S later unless it has exited: the platform's window,
    # made real. Every answer posted and the worker gone before the SIGKILL: an order, no clock compared.
    container.worker.stop(timeout=platform.KILL_AFTER_S)
    drain = settings_mod.load(container.env).drain_timeout

    for job in jobs:
        assert container.cp.results_posted(job) == [{"error": platform.stopped_sentence(drain)}]
    assert not container.worker.killed, "the worker was still up at the platform's SIGKILL"
    [exited] = re.findall(r"the worker exits (\d+\.\d) s after the platform's signal", container.worker.log())
    assert float(exited) < platform.KILL_AFTER_S
    assert platform.post_deadline(0.0, drain) + platform.EXIT_MARGIN_S == platform.KILL_AFTER_S  # the default fits the window
