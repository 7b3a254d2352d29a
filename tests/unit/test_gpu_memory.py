"""The pre-launch memory wait: probes, vLLM's startup figures, and the wait's decisions.

The loop runs on a scripted probe and a fake clock, so nothing sleeps for real. The CPU probe is
read for real on this machine and cross-checked against vLLM's own function when .venv-engine is
there; NVML and nvidia-smi, which need a driver, are tested through injected fakes shaped like the
real module and the real output, plus a check of what the real ones answer here.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from vllm_worker.config.profile import DEFAULT_GPU_MEMORY_UTILIZATION, LaunchProfile
from vllm_worker.engine import gpu_memory as gm
from vllm_worker.engine.gpu_memory import (
    GiB,
    MiB,
    DeviceMemory,
    Holder,
    Launch,
    Poll,
    Sample,
    Timeout,
    WaitPolicy,
    decide,
    devices_for,
    need_bytes,
    parse_compute_apps,
    parse_query_gpu,
    probe_cpu,
    probe_nvidia_smi,
    probe_nvml,
    wait_for_memory,
)

REPO = Path(__file__).resolve().parents[2]
ENGINE_PYTHON = REPO / ".venv-engine" / "bin" / "python"
VLLM_SOURCES = REPO / ".venv-engine" / "lib" / "python3.11" / "site-packages" / "vllm"

SEED_ENV = {"GPU_MEMORY_UTILIZATION": "0.9"}  # the field report: 0.9 of a 20 GiB-class card
PREVIOUS_ENGINE = Holder(pid=4242, used_bytes=12 * GiB, name="python3")


def gpu(free_gib: float, total_gib: float = 20, index: int = 0, holders: list[Holder] | None = None) -> DeviceMemory:
    name = "NVIDIA RTX 4000 Ada Generation"
    return DeviceMemory(index, name, int(total_gib * GiB), int(free_gib * GiB), holders or [])


class Script:
    """A probe that answers from a script (the last answer repeats), and a clock that only sleep moves."""

    def __init__(self, answers: list[list[DeviceMemory] | None]) -> None:
        self.answers = answers
        self.probes = 0
        self.now = 1000.0
        self.sleeps: list[float] = []
        self.lines: list[str] = []

    def probe(self) -> list[DeviceMemory] | None:
        answer = self.answers[min(self.probes, len(self.answers) - 1)]
        self.probes += 1
        return answer

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def clock(self) -> float:
        return self.now

    def run(self, env: dict[str, str], timeout: float = 300) -> gm.WaitResult:
        return wait_for_memory(
            LaunchProfile.parse(env), timeout=timeout, probe=self.probe, sleep=self.sleep, clock=self.clock, log=self.lines.append
        )


# ---------------------------------------------------------------- vLLM's figures


@pytest.mark.skipif(not VLLM_SOURCES.exists(), reason="vLLM 0.32 sources are in .venv-engine")
def test_default_utilization_is_vllms() -> None:
    source = (VLLM_SOURCES / "config" / "cache.py").read_text()
    found = re.search(r"gpu_memory_utilization: float = Field\(default=([0-9.]+)", source)
    assert found is not None
    assert float(found.group(1)) == DEFAULT_GPU_MEMORY_UTILIZATION


def test_need_is_utilization_times_total_rounded_up_as_vllm_does() -> None:
    total = 21_119_434_752  # 19.67 GiB, as cudaMemGetInfo reported it in the field
    assert need_bytes(total, LaunchProfile.parse(SEED_ENV)) == math.ceil(total * 0.9)
    assert need_bytes(total, LaunchProfile.parse({})) == math.ceil(total * 0.92)
    assert need_bytes(total, LaunchProfile.parse({"GPU_MEMORY_UTILIZATION": "nonsense"})) == math.ceil(total * 0.92)
    assert need_bytes(total, LaunchProfile.parse({"GPU_MEMORY_UTILIZATION": "1.5"})) == math.ceil(total * 0.92)


def test_kv_cache_size_keeps_the_cuda_check_but_lifts_the_cpu_one() -> None:
    # vLLM 0.32's Worker.init_device calls request_memory whatever kv_cache_memory_bytes is;
    # CPUWorker skips its check when the size is given, also through VLLM_CPU_KVCACHE_SPACE.
    env = {"KV_CACHE_MEMORY_BYTES": "4G", **SEED_ENV}
    assert need_bytes(20 * GiB, LaunchProfile.parse(env), "cuda") == 18 * GiB
    assert need_bytes(20 * GiB, LaunchProfile.parse(env), "cpu") is None
    assert need_bytes(20 * GiB, LaunchProfile.parse({"VLLM_CPU_KVCACHE_SPACE": "4"}), "cpu") is None
    assert need_bytes(20 * GiB, LaunchProfile.parse({"VLLM_CPU_KVCACHE_SPACE": "4"}), "cuda") == math.ceil(20 * GiB * 0.92)


# ---------------------------------------------------------------- which devices


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, [0]),
        ({"TENSOR_PARALLEL_SIZE": "2", "PIPELINE_PARALLEL_SIZE": "2"}, [0, 1, 2, 3]),
        ({"CUDA_VISIBLE_DEVICES": "2,3,5", "TENSOR_PARALLEL_SIZE": "2"}, [2, 3]),
        ({"CUDA_VISIBLE_DEVICES": "5, 1", "PIPELINE_PARALLEL_SIZE": "2"}, [5, 1]),
        ({"CUDA_VISIBLE_DEVICES": "4,5,6,7", "DATA_PARALLEL_SIZE": "2", "TENSOR_PARALLEL_SIZE": "1"}, [4, 5]),
        ({"CUDA_VISIBLE_DEVICES": "3,-1,4", "TENSOR_PARALLEL_SIZE": "2"}, [3]),
        ({"CUDA_VISIBLE_DEVICES": "GPU-8f1c2d3e,1", "TENSOR_PARALLEL_SIZE": "2"}, ["GPU-8f1c2d3e", 1]),
        ({"CUDA_VISIBLE_DEVICES": ""}, [0]),
        ({"TENSOR_PARALLEL_SIZE": "x"}, [0]),
    ],
)
def test_devices_for(env: dict[str, str], expected: list[int | str]) -> None:
    assert devices_for(LaunchProfile.parse(env)) == expected


# ---------------------------------------------------------------- nvidia-smi


QUERY_GPU = """\
0, GPU-3b1f6c2a-9d4e-4c1b-8a7f-0e2d5c6b7a81, NVIDIA RTX 4000 Ada Generation, 20475, 323, 7833
1, GPU-8f1c2d3e-4b5a-6978-8a9b-0c1d2e3f4a5b, NVIDIA RTX 4000 Ada Generation, 20475, [N/A], 20152
"""
QUERY_APPS = """\
4242, 12288, GPU-3b1f6c2a-9d4e-4c1b-8a7f-0e2d5c6b7a81, /usr/bin/python3 -m vllm.entrypoints.openai.api_server
4300, [N/A], GPU-3b1f6c2a-9d4e-4c1b-8a7f-0e2d5c6b7a81, [Insufficient Permissions]
"""


def test_parse_query_gpu_real_shaped() -> None:
    rows = parse_query_gpu(QUERY_GPU)
    assert [(r.index, r.total_mib, r.reserved_mib, r.free_mib) for r in rows] == [
        (0, 20475, 323, 7833),
        (1, 20475, 0, 20152),
    ]
    assert rows[0].name == "NVIDIA RTX 4000 Ada Generation"
    assert rows[1].uuid == "GPU-8f1c2d3e-4b5a-6978-8a9b-0c1d2e3f4a5b"
    old = parse_query_gpu("0, GPU-aa, Tesla T4, 15360, 14913\n", with_reserved=False)
    assert [(r.index, r.name, r.total_mib, r.free_mib) for r in old] == [(0, "Tesla T4", 15360, 14913)]
    assert parse_query_gpu("No devices were found\n") == []


def test_parse_compute_apps_real_shaped() -> None:
    holders = parse_compute_apps(QUERY_APPS)
    assert holders == {
        "GPU-3b1f6c2a-9d4e-4c1b-8a7f-0e2d5c6b7a81": [
            Holder(4242, 12288 * MiB, "/usr/bin/python3 -m vllm.entrypoints.openai.api_server"),
            Holder(4300, None, None),
        ]
    }
    assert parse_compute_apps("") == {}


def fake_smi(outputs: dict[str, str | None]) -> tuple[list[list[str]], Any]:
    calls: list[list[str]] = []

    def run(argv: list[str]) -> str | None:
        calls.append(argv)
        return next((out for key, out in outputs.items() if key in " ".join(argv)), None)

    return calls, run


def test_nvidia_smi_probe_maps_devices_and_holders() -> None:
    calls, run = fake_smi({"memory.reserved": QUERY_GPU, "query-compute-apps": QUERY_APPS})
    devices = probe_nvidia_smi([1, 0], run=run)
    assert devices is not None
    assert [(d.index, d.total, d.free) for d in devices] == [
        (1, 20475 * MiB, 20152 * MiB),
        (0, (20475 - 323) * MiB, 7833 * MiB),
    ]
    assert devices[0].holders == [] and [h.pid for h in devices[1].holders] == [4242, 4300]
    assert calls[0][1] == "--query-gpu=index,uuid,name,memory.total,memory.reserved,memory.free"
    assert probe_nvidia_smi(["GPU-8f1c"], run=run)[0].index == 1  # type: ignore[index]
    assert probe_nvidia_smi([7], run=run) is None  # not on this machine: vLLM will say so itself


def test_nvidia_smi_probe_falls_back_to_drivers_without_reserved() -> None:
    calls, run = fake_smi({"memory.reserved": None, "memory.free": "0, GPU-aa, Tesla T4, 15360, 14913\n"})
    devices = probe_nvidia_smi([0], run=run)
    assert devices == [DeviceMemory(0, "Tesla T4", 15360 * MiB, 14913 * MiB, [])]
    assert len(calls) == 3  # the reserved query, the old query, the processes


def test_real_nvidia_smi_answers_or_is_absent() -> None:
    devices = probe_nvidia_smi([0])
    if shutil.which("nvidia-smi") is None:
        assert devices is None
    elif devices is not None:
        assert 0 <= devices[0].free <= devices[0].total


# ---------------------------------------------------------------- NVML


class FakeNVMLError(Exception):
    pass


def fake_nvml(devices: list[tuple[str, int, int, int]], processes: dict[int, list[Any]], v2: bool = True) -> Any:
    """A stand-in with pynvml's names; (uuid, total, reserved, free) per device, handle = index."""
    calls: list[str] = []

    def memory(handle: int, version: int | None = None) -> Any:
        uuid, total, reserved, free = devices[handle]
        if version is not None:
            if not v2:
                raise FakeNVMLError("Function Not Found")
            return SimpleNamespace(total=total, reserved=reserved, free=free, used=total - reserved - free)
        return SimpleNamespace(total=total, free=free, used=total - free)

    def process_name(pid: int) -> bytes:
        if pid == 1:
            raise FakeNVMLError("Not Found")
        return b"python3"

    return SimpleNamespace(
        calls=calls,
        nvmlMemory_v2=0x02000028,
        nvmlInit=lambda: calls.append("init"),
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetCount=lambda: len(devices),
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUUID=lambda h: devices[h][0],
        nvmlDeviceGetName=lambda h: b"NVIDIA H100 80GB HBM3",
        nvmlDeviceGetMemoryInfo=memory,
        nvmlDeviceGetComputeRunningProcesses=lambda h: processes.get(h, []),
        nvmlSystemGetProcessName=process_name,
    )


FOUR_GPUS = [(f"GPU-000{i}-aaaa", 80 * GiB, 512 * MiB, (10 + i) * GiB) for i in range(4)]


def test_nvml_probe_reads_the_physical_devices_cuda_visible_devices_names() -> None:
    on_gpu_3 = [SimpleNamespace(pid=77, usedGpuMemory=60 * GiB), SimpleNamespace(pid=1, usedGpuMemory=None)]
    nvml = fake_nvml(FOUR_GPUS, {3: on_gpu_3})
    selectors = devices_for(LaunchProfile.parse({"CUDA_VISIBLE_DEVICES": "2,3,0", "TENSOR_PARALLEL_SIZE": "2"}))
    devices = probe_nvml(selectors, nvml=nvml)
    assert devices is not None
    assert [(d.index, d.free) for d in devices] == [(2, 12 * GiB), (3, 13 * GiB)]
    assert devices[0].total == 80 * GiB - 512 * MiB  # what CUDA reports: NVML's total less the reserved part
    assert devices[0].name == "NVIDIA H100 80GB HBM3"
    assert devices[1].holders == [Holder(77, 60 * GiB, "python3"), Holder(1, None, None)]
    assert nvml.calls == ["init", "shutdown"]
    assert probe_nvml(["GPU-0001"], nvml=nvml)[0].index == 1  # type: ignore[index]
    assert probe_nvml(["MIG-0001-aaaa"], nvml=nvml) is None


def test_nvml_probe_without_the_v2_query_uses_the_v1_total() -> None:
    devices = probe_nvml([0], nvml=fake_nvml(FOUR_GPUS, {}, v2=False))
    assert devices is not None and devices[0].total == 80 * GiB


def test_nvml_probe_is_none_when_nvml_cannot_start() -> None:
    def fail() -> None:
        raise FakeNVMLError("Driver Not Loaded")

    nvml = fake_nvml(FOUR_GPUS, {})
    nvml.nvmlInit = fail
    assert probe_nvml([0], nvml=nvml) is None


def test_real_nvml_answers_or_is_absent() -> None:
    import pynvml

    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        usable = True
    except pynvml.NVMLError:
        usable = False
    devices = probe_nvml([0])
    if not usable:
        assert devices is None
    else:
        assert devices is not None and 0 <= devices[0].free <= devices[0].total


# ---------------------------------------------------------------- the wait


def test_cold_start_launches_on_one_probe_without_sleeping() -> None:
    script = Script([[gpu(19.5)]])
    result = script.run(SEED_ENV)
    assert (result.ok, result.outcome, result.message) == (True, "launch", None)
    assert script.probes == 1 and script.sleeps == [] and script.lines == []


def test_launches_on_the_poll_that_finds_the_memory_with_progress_every_few_seconds() -> None:
    polls = 12
    script = Script([[gpu(8, holders=[PREVIOUS_ENGINE])]] * polls + [[gpu(19.5)]])
    result = script.run(SEED_ENV)
    assert result.outcome == "launch" and result.ok
    assert script.probes == polls + 1
    assert script.sleeps == [1.0] * polls
    assert result.waited_s == polls
    progress = [line for line in script.lines if line.startswith("waiting")]
    assert progress == [
        f"waiting for GPU memory to be released: 8.00 of 20.00 GiB free, 18.00 GiB needed, {t} s so far"
        for t in (0, 5, 10)
    ]
    assert script.lines[-1] == "GPU memory is available after 12 s: launching the engine"


def test_never_frees_times_out_naming_the_wait_the_figures_and_the_holder() -> None:
    script = Script([[gpu(7.65, total_gib=19.67, holders=[PREVIOUS_ENGINE])]])
    result = script.run(SEED_ENV, timeout=300)
    assert (result.ok, result.outcome) == (False, "timeout")
    assert sum(script.sleeps) == 300 and result.waited_s == 300
    message = result.message
    assert message is not None and script.lines[-1] == message
    assert "GPU_MEMORY_WAIT_TIMEOUT=300 seconds" in message
    assert "GPU 0 (NVIDIA RTX 4000 Ada Generation) has 7.65 of 19.67 GiB free, 17.70 GiB needed" in message
    assert "pid 4242 (python3) holds 12288 MiB" in message
    assert "previous engine that is still exiting" in message
    assert "raise GPU_MEMORY_WAIT_TIMEOUT" in message
    assert "utilization" not in message.lower()
    assert "GPU_MEMORY_UTILIZATION" not in message


def test_timeout_without_a_visible_holder_says_so() -> None:
    script = Script([[gpu(7.65)]])
    message = script.run(SEED_ENV, timeout=3).message
    assert message is not None
    assert "No process holding it is visible from here." in message
    assert "GPU_MEMORY_WAIT_TIMEOUT=3 seconds" in message and "utilization" not in message.lower()


def test_several_devices_wait_for_the_slowest() -> None:
    ready, late = gpu(19.5, index=0), gpu(8, index=1, holders=[PREVIOUS_ENGINE])
    script = Script([[ready, late]] * 4 + [[ready, gpu(19.0, index=1)]])
    result = script.run(SEED_ENV)
    assert result.outcome == "launch" and script.probes == 5 and sum(script.sleeps) == 4
    assert script.lines[0] == (
        "waiting for GPU memory to be released: "
        "GPU 1 (NVIDIA RTX 4000 Ada Generation): 8.00 of 20.00 GiB free, 18.00 GiB needed, 0 s so far"
    )
    timed_out = Script([[ready, late]]).run(SEED_ENV, timeout=2)
    assert timed_out.message is not None
    assert "GPU 1 (NVIDIA RTX 4000 Ada Generation) has 8.00" in timed_out.message
    assert "GPU 0" not in timed_out.message


def test_unknown_memory_launches_at_once_with_one_line() -> None:
    script = Script([None])
    result = script.run(SEED_ENV)
    assert (result.ok, result.outcome, script.probes, script.sleeps) == (True, "unknown", 1, [])
    assert len(script.lines) == 1 and "cannot be read" in script.lines[0]


def test_real_probe_without_nvml_or_nvidia_smi_is_unknown() -> None:
    if shutil.which("nvidia-smi") is not None or probe_nvml([0]) is not None:
        assert gm.probe(LaunchProfile.parse({})) is not None
    else:
        lines: list[str] = []
        result = wait_for_memory(LaunchProfile.parse({}), timeout=300, sleep=lambda s: pytest.fail("slept"), log=lines.append)
        assert result.outcome == "unknown" and len(lines) == 1


# ---------------------------------------------------------------- KV_CACHE_MEMORY_BYTES: wait until free stops rising

KV_ENV = {"KV_CACHE_MEMORY_BYTES": "6G", "GPU_MEMORY_UTILIZATION": "0.4"}


def test_kv_mode_cold_start_launches_at_once() -> None:
    script = Script([[gpu(19.5)]])
    assert script.run(KV_ENV).outcome == "launch"
    assert script.probes == 1 and script.sleeps == []


def test_kv_mode_waits_until_free_memory_stops_rising() -> None:
    holder = [PREVIOUS_ENGINE]
    rising = [17.0, 17.5, 18.0, 18.5, 19.0]  # t = 0..4 s: a release in progress
    script = Script([[gpu(f, holders=holder)] for f in rising] + [[gpu(19.0)]])
    result = script.run(KV_ENV)
    assert result.outcome == "launch"
    # flat from t=4; the first 5-s window without a rise opens at t=4 and closes at t=9
    assert result.waited_s == 9 and script.probes == 10
    assert script.lines[0] == (
        "waiting for GPU memory to be released: 17.00 of 20.00 GiB free and still rising, 0 s so far"
    )


def test_kv_mode_jitter_below_the_tolerance_counts_as_settled() -> None:
    jitter = [10.0, 10.01, 9.99, 10.02, 10.0, 10.01]
    script = Script([[gpu(f, holders=[PREVIOUS_ENGINE])] for f in jitter])
    result = script.run(KV_ENV)
    assert result.outcome == "launch" and result.waited_s == 5


def test_kv_mode_on_cuda_still_waits_for_vllms_utilization_check() -> None:
    env = {"KV_CACHE_MEMORY_BYTES": "6G", **SEED_ENV}
    script = Script([[gpu(8)]] * 3 + [[gpu(19.0)]])
    result = script.run(env)
    # need met at t=3 (18 GiB of 20), then the window must show no rise: t=3 -> t=8
    assert result.outcome == "launch" and result.waited_s == 8


def test_kv_mode_timeout_names_the_rise() -> None:
    # 34 MiB more every second: 170 MiB per 5-s window, above the 128 MiB tolerance, for 300 s
    samples = [Sample(float(t), [gpu(10 + t / 30, total_gib=40, holders=[PREVIOUS_ENGINE])]) for t in range(301)]
    decision = decide(samples, LaunchProfile.parse(KV_ENV), WaitPolicy(timeout_s=300))
    assert isinstance(decision, Timeout)
    assert "has 20.00 of 40.00 GiB free and still rising" in decision.message


def test_decide_is_pure_poll_then_launch() -> None:
    policy = WaitPolicy()
    first = [Sample(0.0, [gpu(8)])]
    assert decide(first, LaunchProfile.parse(SEED_ENV), policy) == Poll(
        1.0, "waiting for GPU memory to be released: 8.00 of 20.00 GiB free, 18.00 GiB needed, 0 s so far"
    )
    assert decide(first + [Sample(1.0, [gpu(8)])], LaunchProfile.parse(SEED_ENV), policy) == Poll(1.0, None)
    assert decide(first + [Sample(1.0, [gpu(18)])], LaunchProfile.parse(SEED_ENV), policy) == Launch()
    need = need_bytes(20 * GiB, LaunchProfile.parse(SEED_ENV))
    assert need is not None
    at_need = DeviceMemory(0, "GPU", 20 * GiB, need, [])
    one_short = DeviceMemory(0, "GPU", 20 * GiB, need - 1, [])
    assert decide([Sample(0.0, [at_need])], LaunchProfile.parse(SEED_ENV), policy) == Launch()  # vLLM fails only on free < need
    assert isinstance(decide([Sample(0.0, [one_short])], LaunchProfile.parse(SEED_ENV), policy), Poll)
    near_end = first + [Sample(298.0, [gpu(8)]), Sample(299.5, [gpu(8)])]
    assert decide(near_end, LaunchProfile.parse(SEED_ENV), policy) == Poll(0.5, None)


# ---------------------------------------------------------------- the CPU backend's figure


def test_cpu_probe_reads_this_machine_consistently() -> None:
    (node,) = probe_cpu(LaunchProfile.parse({}))
    assert node.kind == "cpu" and node.label == f"memory node {node.index}"
    assert 0 < node.free <= node.total
    meminfo = Path("/proc/meminfo").read_text()
    mem_total = int(re.search(r"MemTotal:\s+(\d+) kB", meminfo).group(1)) * 1024  # type: ignore[union-attr]
    assert node.total <= mem_total


@pytest.mark.engine
@pytest.mark.skipif(not ENGINE_PYTHON.exists(), reason="needs vLLM in .venv-engine (a skip fails under CI=true)")
def test_cpu_probe_matches_vllms_own_figures_on_this_host() -> None:
    code = (
        "import json\n"
        "from vllm.utils.cpu_resource_utils import get_allowed_cpu_list, get_memory_node_info, get_visible_memory_node\n"
        "nodes = get_visible_memory_node(); core = get_allowed_cpu_list()[0]\n"
        "node = core.numa_node if core.numa_node in nodes else nodes[0]\n"
        "info = get_memory_node_info(node)\n"
        "print(json.dumps([node, info.total_memory, info.available_memory]))\n"
    )
    before = probe_cpu(LaunchProfile.parse(os.environ))[0]
    out = subprocess.run([str(ENGINE_PYTHON), "-c", code], capture_output=True, text=True, timeout=300, check=True)
    after = probe_cpu(LaunchProfile.parse(os.environ))[0]
    node, total, available = json.loads(out.stdout.strip().splitlines()[-1])
    assert (before.index, before.total) == (node, total)
    # available memory moves while vLLM imports; it must lie within what was read around it
    slack = 512 * MiB
    assert min(before.free, after.free) - slack <= available <= max(before.free, after.free) + slack
    assert need_bytes(total, LaunchProfile.parse({}), "cpu") == math.ceil(total * 0.92)


def fake_host(tmp_path: Path, *, node_meminfo: bool = True, cgroup_v1: tuple[int, int] | None = None) -> Path:
    (tmp_path / "proc").mkdir(parents=True)
    (tmp_path / "proc/self").mkdir()
    (tmp_path / "proc/self/status").write_text("Name:\tpython\nMems_allowed_list:\t0-1\n")
    (tmp_path / "proc/meminfo").write_text("MemTotal:       24684084 kB\nMemFree:  100 kB\nMemAvailable:   23584840 kB\n")
    for cpu, node in ((0, 1), (1, 0)):
        (tmp_path / f"sys/devices/system/cpu/cpu{cpu}/node{node}").mkdir(parents=True)
    if node_meminfo:
        for node in (0, 1):
            meminfo = tmp_path / f"sys/devices/system/node/node{node}/meminfo"
            meminfo.parent.mkdir(parents=True)
            meminfo.write_text(
                f"Node {node} MemTotal:        {9136332 + node} kB\n"
                f"Node {node} MemFree:         5880248 kB\n"
                f"Node {node} Active(file):    1533960 kB\n"
                f"Node {node} Inactive(file):  1035364 kB\n"
                f"Node {node} SReclaimable:     192568 kB\n"
            )
    if cgroup_v1 is not None:
        cg = tmp_path / "sys/fs/cgroup/memory"
        cg.mkdir(parents=True)
        (cg / "memory.limit_in_bytes").write_text(f"{cgroup_v1[0]}\n")
        (cg / "memory.usage_in_bytes").write_text(f"{cgroup_v1[1]}\n")
    return tmp_path


def test_cpu_probe_node_formula_and_node_choice(tmp_path: Path) -> None:
    root = fake_host(tmp_path)
    (node,) = probe_cpu(LaunchProfile.parse({}), root=str(root), allowed_cpus={0, 1})
    assert node.index == 1  # the node of the first allowed CPU
    assert node.total == 9136333 * 1024
    assert node.free == (5880248 + 1533960 + 1035364 + 192568) * 1024
    assert probe_cpu(LaunchProfile.parse({"CPU_VISIBLE_MEMORY_NODES": "0"}), root=str(root), allowed_cpus={0, 1})[0].index == 0
    assert probe_cpu(LaunchProfile.parse({}), root=str(root), allowed_cpus={1})[0].index == 0


def test_cpu_probe_clamps_to_a_lower_cgroup_limit(tmp_path: Path) -> None:
    root = fake_host(tmp_path, cgroup_v1=(4 * GiB, 3 * GiB))
    (node,) = probe_cpu(LaunchProfile.parse({}), root=str(root), allowed_cpus={1})
    assert (node.total, node.free) == (4 * GiB, 1 * GiB)
    unlimited = fake_host(tmp_path / "u", cgroup_v1=(9223372036854771712, 3 * GiB))
    assert probe_cpu(LaunchProfile.parse({}), root=str(unlimited), allowed_cpus={1})[0].total == 9136332 * 1024


def test_cpu_probe_without_node_meminfo_uses_memavailable(tmp_path: Path) -> None:
    root = fake_host(tmp_path, node_meminfo=False)
    (node,) = probe_cpu(LaunchProfile.parse({}), root=str(root), allowed_cpus={1})
    assert (node.total, node.free) == (24684084 * 1024, 23584840 * 1024)


def test_cpu_wait_uses_the_cpu_wording() -> None:
    node = DeviceMemory(0, "NUMA node 0", 8 * GiB, 5 * GiB, [], kind="cpu")
    script = Script([[node]])
    result = script.run({}, timeout=2)
    assert script.lines[0] == (
        "waiting for memory to be released: 5.00 of 8.00 GiB available, 7.36 GiB needed, 0 s so far"
    )
    assert result.message is not None and "memory node 0 has 5.00 of 8.00 GiB available" in result.message
    assert "held by other processes on this machine" in result.message
    assert "utilization" not in result.message.lower()
    assert Script([[node]]).run({"VLLM_CPU_KVCACHE_SPACE": "2"}).outcome == "launch"

