"""The GPU tier: the worker's GPU edges on a real NVIDIA card, where CI has none.

Collected only on a machine where NVML or `nvidia-smi` lists a GPU (tests/conftest.py), so CI neither runs nor
skips them; run them where a GPU is lent: `python -m pytest tests/gpu` with the worker's packages on
PYTHONPATH and TORCH_PYTHON naming a Python with torch (tests.support.gpu_holder takes memory through
it, as a previous engine held it). What each test holds against the card is CUDA's own figure
(torch.cuda.mem_get_info, what vLLM compares GPU_MEMORY_UTILIZATION x total with), never a number
written here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.support import gpu_holder
from tests.support.control_plane import ControlPlane
from tests.support.fake_engine import FakeEngine
from tests.support.volumes import private_network
from tests.support.worker_proc import WorkerProcess, base_env
from vllm_worker.capacity.gpus import find_card
from vllm_worker.config.profile import LaunchProfile
from vllm_worker.engine import gpu_memory, machine_checks

GiB = 1 << 30
MiB = 1 << 20

CUDA_FIGURES = r"""
import json, torch
free, total = torch.cuda.mem_get_info(0)
print(json.dumps({"free": free, "total": total, "count": torch.cuda.device_count(), "name": torch.cuda.get_device_name(0)}))
"""


@pytest.fixture(scope="module")
def cuda() -> dict[str, Any]:
    done = subprocess.run(
        [gpu_holder.torch_python(), "-c", CUDA_FIGURES], capture_output=True, text=True, timeout=120, env=gpu_holder.machine_env()
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def holders() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for child in started:
        child.kill()
        child.wait()


def free_now() -> int:
    devices = gpu_memory.probe_nvml([0])
    assert devices is not None, "NVML gave no reading on a machine with a GPU"
    return devices[0].free


def hold_half(hold_s: float) -> subprocess.Popen[str]:
    """A previous engine holding all but half the card: less than GPU_MEMORY_UTILIZATION's 0.92 is free."""
    devices = gpu_memory.probe_nvml([0])
    assert devices is not None
    return gpu_holder.hold(max(devices[0].free - devices[0].total // 2, 1 * GiB), hold_s)


# ---------------------------------------------------------------- the probes against CUDA's figure


def test_nvml_and_nvidia_smi_read_the_total_cuda_reports(cuda: dict[str, Any]) -> None:
    """The wait multiplies the probe's total by the utilization as vLLM multiplies CUDA's: they must agree."""
    nvml = gpu_memory.probe_nvml([0])
    smi = gpu_memory.probe_nvidia_smi([0])
    assert nvml is not None and smi is not None
    assert abs(nvml[0].total - cuda["total"]) <= 1 * MiB, (nvml[0].total, cuda["total"])
    assert abs(smi[0].total - cuda["total"]) <= 1 * MiB, (smi[0].total, cuda["total"])  # nvidia-smi counts in MiB
    assert abs(nvml[0].free - smi[0].free) <= 64 * MiB
    assert nvml[0].name == smi[0].name == cuda["name"]


def test_the_card_table_holds_this_cards_cuda_total(cuda: dict[str, Any]) -> None:
    names = gpu_memory.list_gpus()
    assert names is not None and len(names) == cuda["count"]
    card = find_card(names[0])
    assert abs(card.total_bytes - cuda["total"]) <= 0.05 * GiB, (card, cuda["total"] / GiB)


# ---------------------------------------------------------------- the machine check's allocation


def test_the_allocation_check_passes_on_the_card_and_names_a_device_that_is_not_there(cuda: dict[str, Any]) -> None:
    assert machine_checks.allocate_each([0]) == {0: None}
    missing = cuda["count"]
    result = machine_checks.allocate_each([0, missing])
    assert result[0] is None
    assert result[missing] is not None and "CUDA_ERROR" in result[missing], result


def test_before_the_preflight_the_gpu_check_lists_and_allocates() -> None:
    checks = machine_checks.before_preflight({}, needed_gpus=1, engine_device="auto")
    gpus = next(c for c in checks if c.name == "gpus")
    assert gpus.ok and "a 64 MiB allocation on 1 of 1" in gpus.found, gpus


# ---------------------------------------------------------------- memory another process holds


def test_a_holder_is_seen_with_its_memory(holders: list[subprocess.Popen[str]]) -> None:
    before = free_now()
    holder = gpu_holder.hold(8 * GiB, 600)
    holders.append(holder)
    for devices in (gpu_memory.probe_nvml([0]), gpu_memory.probe_nvidia_smi([0])):
        assert devices is not None
        assert devices[0].free <= before - 8 * GiB
        listed = {h.pid: h.used_bytes for h in devices[0].holders}
        assert holder.pid in listed, (holder.pid, devices[0].holders)
        assert (listed[holder.pid] or 0) >= 8 * GiB


def test_the_wait_launches_once_a_previous_process_lets_go(holders: list[subprocess.Popen[str]]) -> None:
    """A previous engine holds half the card and ends 4 s later: the wait sees it, waits, and launches once it
    has let go. Checked as an order, not a duration: the first probe lists the holder, the probe that launches
    no longer does (its memory was released before the wait returned), and the wait logged that it waited."""
    holder = hold_half(4.0)
    holders.append(holder)
    lines: list[str] = []
    result = gpu_memory.wait_for_memory(LaunchProfile.parse({}), timeout=60, log=lines.append)
    assert result.outcome == "launch", lines
    assert len(result.samples) > 1, lines  # the first probe found too little free: it waited
    first, launched = result.samples[0].devices[0], result.samples[-1].devices[0]
    assert holder.pid in {h.pid for h in first.holders}, (holder.pid, first.holders)
    assert holder.pid not in {h.pid for h in launched.holders}, (holder.pid, launched.holders)
    assert any("is available after" in line for line in lines), lines


def test_memory_that_stays_held_times_out_naming_the_holder(holders: list[subprocess.Popen[str]]) -> None:
    holder = hold_half(600)
    holders.append(holder)
    lines: list[str] = []
    result = gpu_memory.wait_for_memory(LaunchProfile.parse({}), timeout=3, log=lines.append)
    assert result.outcome == "timeout" and result.message is not None
    assert str(holder.pid) in result.message, result.message
    assert "GPU 0" in result.message


# ---------------------------------------------------------------- the worker as a process on the card


def worker_env(tmp_path: Path, engine: FakeEngine, **extra: str) -> dict[str, str]:
    env = base_env(tmp_path)
    # The worker's packages (runpod and the rest) come from where this pytest found them.
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], *sys.path[1:]])
    env.update(HF_HUB_OFFLINE="1", MODEL_NAME="acme/tiny-chat", **engine.env(), **extra)
    return env


JOB = {"input": {"prompt": "Hi", "max_tokens": 3}}


def local_test(tmp_path: Path, engine: FakeEngine) -> tuple[subprocess.CompletedProcess[str], str]:
    """`vllm-worker --test_input JOB` as a user runs it; fails unless the job was answered."""
    done = subprocess.run(
        [sys.executable, "-m", "vllm_worker", "--test_input", json.dumps(JOB)],
        env=worker_env(tmp_path, engine), cwd=tmp_path, capture_output=True, text=True, timeout=180,
    )
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    return done, log


def test_the_worker_checks_the_card_and_answers_a_job(tmp_path: Path) -> None:
    engine = FakeEngine(tmp_path, [{"serve": True}])
    done, log = local_test(tmp_path, engine)
    assert "machine check gpus: ok" in log and "a 64 MiB allocation on 1 of 1" in log, log[-4000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["output"]


def test_the_worker_launches_after_a_previous_engines_memory_is_back(tmp_path: Path, holders: list[subprocess.Popen[str]]) -> None:
    holder = hold_half(12.0)
    holders.append(holder)
    engine = FakeEngine(tmp_path, [{"serve": True}])
    done, log = local_test(tmp_path, engine)
    assert holder.poll() is not None  # it had ended when the job was answered
    assert "is available after" in log, log[-4000:]
    assert len(engine.launches()) == 1  # the first launch found its memory: no failed start, no relaunch


def test_the_sdks_production_start_on_a_gpu_machine_serves(tmp_path: Path) -> None:
    """Fitness checks on (no RUNPOD_SKIP_*), nvidia-smi answering so the SDK would add its GPU check, in a
    network of the test's own (loopback only), as tests/platform runs it."""
    engine = FakeEngine(tmp_path, [{"serve": True}])
    with private_network(), ControlPlane() as plane:
        env = worker_env(tmp_path, engine)
        env.update(plane.env(sdk_checks=True))
        with WorkerProcess(env, workdir=tmp_path / "w") as worker:
            result = plane.result(plane.submit(JOB["input"]), timeout=120)
            assert "error" not in result, (result, worker.log()[-4000:])
            log = worker.log()
            assert "machine check gpus: ok" in log and "a 64 MiB allocation on 1 of 1" in log, log[-4000:]
            assert "the runpod SDK's fitness checks are not run" in log
            assert worker.returncode is None
