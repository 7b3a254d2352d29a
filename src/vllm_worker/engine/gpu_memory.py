"""Wait, before every engine launch, until the devices have the memory vLLM checks for at startup.

Why: vLLM 0.32 reads the free memory of each device once, at startup, and exits when it is below
``gpu_memory_utilization x total`` (vllm/v1/worker/utils.py:716-772, ``request_memory``: "Free memory
on device ... on startup is less than desired GPU memory utilization ... Decrease GPU memory
utilization or reduce GPU memory used by other processes."). When the engine is relaunched (the
worker's recovery ladder, or the container restarted in place) the driver may still be reclaiming
the previous engine's memory, ~40 s in the field (seed 002; a single torch process's 100 GiB on an
H200 came back 0.01-0.2 s after it ended, tests/field/gpu_readings), so the relaunch fails once with an error that
blames a correct setting. Probing first and waiting makes the relaunch succeed the first time, and a
memory that never frees is reported as what it is: a wait that ran out, with the figures and the
processes holding the memory, never as advice to lower GPU_MEMORY_UTILIZATION.

Shape: the probes (NVML, then ``nvidia-smi``, or the CPU backend's own figure) are thin edges; what
to do with their readings is the pure ``decide``; ``wait_for_memory`` runs the loop with the probe,
sleep and clock injected, so tests script it without sleeping.

What vLLM 0.32 checks, and so what is waited for:
- CUDA: ``free >= ceil(total x gpu_memory_utilization)`` per device, made in ``Worker.init_device``
  (gpu_worker.py:534-537) for every launch, also when ``--kv-cache-memory-bytes`` is set.
- CPU: ``CPUWorker.__init__`` (cpu_worker.py:72-95) compares ``ceil(total x gpu_memory_utilization)``
  with the "available" memory of one NUMA node, as ``get_memory_node_info`` computes it
  (vllm/utils/cpu_resource_utils.py:189-241), and skips the check when ``kv_cache_memory_bytes`` is
  set (``--kv-cache-memory-bytes`` or ``VLLM_CPU_KVCACHE_SPACE``, platforms/cpu.py:323-327).
- The default utilization is 0.92 (vllm/config/cache.py:102).

With KV_CACHE_MEMORY_BYTES set the engine may take more than the utilization's share, so the worker
also waits for the free figure to stop rising; see ``settled`` for the rule.
"""

from __future__ import annotations

import glob
import importlib
import math
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Literal, Mapping, Sequence

from vllm_worker.config.profile import LaunchProfile

GiB = 1 << 30
MiB = 1 << 20

TIMEOUT_VARIABLE = "GPU_MEMORY_WAIT_TIMEOUT"

Platform = Literal["auto", "cuda", "cpu"]
Selector = int | str  # a CUDA_VISIBLE_DEVICES entry: a device index, or a "GPU-..."/"MIG-..." UUID


@dataclass(frozen=True)
class Holder:
    """A process that holds memory on a device, as NVML or nvidia-smi lists it."""

    pid: int
    used_bytes: int | None
    name: str | None = None


@dataclass(frozen=True)
class DeviceMemory:
    """One device's memory as vLLM will see it at startup.

    ``total`` is the figure vLLM multiplies by the utilization: for a GPU, NVML's total less the
    driver's reserved memory (what ``cudaMemGetInfo`` reports); for the CPU backend, the NUMA node's
    total clamped to the cgroup limit. ``free`` is what vLLM compares with the need.
    """

    index: int
    name: str
    total: int
    free: int
    holders: list[Holder] = field(default_factory=list)
    kind: Literal["gpu", "cpu"] = "gpu"

    @property
    def label(self) -> str:
        return f"GPU {self.index} ({self.name})" if self.kind == "gpu" else f"memory node {self.index}"


@dataclass(frozen=True)
class Sample:
    """One probe of every device; ``at`` is seconds since the wait began."""

    at: float
    devices: list[DeviceMemory]


@dataclass(frozen=True)
class WaitPolicy:
    timeout_s: float = 300.0
    poll_s: float = 1.0
    progress_every_s: float = 5.0
    settle_window_s: float = 5.0
    settle_tolerance_bytes: int = 128 * MiB


@dataclass(frozen=True)
class Launch:
    pass


@dataclass(frozen=True)
class Poll:
    sleep_s: float
    progress: str | None


@dataclass(frozen=True)
class Timeout:
    message: str


Decision = Launch | Poll | Timeout


@dataclass(frozen=True)
class WaitResult:
    """``outcome`` is "launch" (memory is there), "unknown" (no probe works: launch anyway) or "timeout"."""

    ok: bool
    waited_s: float
    message: str | None
    samples: list[Sample]
    outcome: Literal["launch", "unknown", "timeout"]


# ---------------------------------------------------------------- the launch's settings


def utilization(profile: LaunchProfile) -> float:
    """GPU_MEMORY_UTILIZATION, or vLLM's default (the profile's one rule; a bad value is its refusal)."""
    return profile.utilization


def kv_cache_size_set(profile: LaunchProfile, platform: str = "cuda") -> bool:
    """Whether the launch fixes the KV cache size instead of deriving it from the utilization."""
    if profile.kv_cache is not None:
        return True
    # vLLM's CPU platform turns this legacy variable into kv_cache_memory_bytes (platforms/cpu.py:324).
    return platform == "cpu" and profile.kv_cache_cpu is not None


def need_bytes(total: int, profile: LaunchProfile, platform: str = "cuda") -> int | None:
    """The free memory vLLM 0.32 demands at startup, or None where it checks nothing.

    CUDA checks ``ceil(total x utilization)`` on every launch (gpu_worker.py:535 calls
    ``request_memory`` whatever kv_cache_memory_bytes is); the CPU backend skips its check when the
    KV cache size is given (cpu_worker.py:79-81).
    """
    if platform == "cpu" and kv_cache_size_set(profile, "cpu"):
        return None
    return math.ceil(total * utilization(profile))


def devices_for(profile: LaunchProfile) -> list[Selector]:
    """The devices the engine will use: the first DP x TP x PP of those CUDA makes visible.

    vLLM gives local rank r the r-th visible device (data-parallel rank d takes the d-th block of
    TP x PP). NVML numbers devices as the container sees them,
    in PCI order, which is also CUDA's order for identical GPUs (vLLM itself asks for
    CUDA_DEVICE_ORDER=PCI_BUS_ID on mixed ones), so a visible index is an NVML index.
    """
    count = profile.data_parallel_size * profile.tensor_parallel_size * profile.pipeline_parallel_size
    raw = profile.written("CUDA_VISIBLE_DEVICES")
    if raw is None:  # vLLM treats an empty value as unset (platforms/interface.py:304)
        return list(range(count))
    visible: list[Selector] = []
    for part in (p.strip() for p in raw.split(",")):
        if part.isdigit():
            visible.append(int(part))
        elif part.startswith(("GPU-", "MIG-")):
            visible.append(part)
        else:  # CUDA ignores the list from its first invalid entry on (e.g. "-1")
            break
    return visible[:count]


def _choose(selectors: Sequence[Selector], uuids: Mapping[int, str]) -> list[int] | None:
    """Map selectors to device indices; None when one cannot be resolved (or is a MIG instance)."""
    chosen: list[int] = []
    for selector in selectors:
        if isinstance(selector, int):
            if selector not in uuids:
                return None
            chosen.append(selector)
            continue
        if selector.startswith("MIG-"):
            return None  # a MIG instance's memory is not its parent GPU's
        matches = [i for i, uuid in uuids.items() if uuid.startswith(selector)]
        if len(matches) != 1:
            return None
        chosen.append(matches[0])
    return chosen


# ---------------------------------------------------------------- probes (thin edges)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def probe_nvml(selectors: Sequence[Selector], nvml: Any = None) -> list[DeviceMemory] | None:
    """Read the devices through NVML; None when NVML is missing or fails (no driver, no library)."""
    try:
        if nvml is None:
            nvml = importlib.import_module("pynvml")  # nvidia-ml-py
        nvml.nvmlInit()
    except Exception:  # ImportError, or NVMLError for a missing driver/library
        return None
    try:
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        chosen = _choose(selectors, {i: _text(nvml.nvmlDeviceGetUUID(h)) for i, h in enumerate(handles)})
        if chosen is None:
            return None
        devices = []
        for index in chosen:
            handle = handles[index]
            total, free = _nvml_memory(nvml, handle)
            name = _text(nvml.nvmlDeviceGetName(handle))
            devices.append(DeviceMemory(index, name, total, free, _nvml_holders(nvml, handle)))
        return devices
    except Exception:  # any NVMLError mid-way: the caller falls back to nvidia-smi
        return None
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


def _nvml_memory(nvml: Any, handle: Any) -> tuple[int, int]:
    try:
        info = nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2)
        return int(info.total) - int(info.reserved), int(info.free)
    except Exception:  # drivers before the v2 query
        info = nvml.nvmlDeviceGetMemoryInfo(handle)
        return int(info.total), int(info.free)


def _nvml_holders(nvml: Any, handle: Any) -> list[Holder]:
    try:
        processes = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except Exception:
        return []
    holders = []
    for process in processes:
        try:
            name: str | None = _text(nvml.nvmlSystemGetProcessName(process.pid))
        except Exception:
            name = None
        used = process.usedGpuMemory
        holders.append(Holder(int(process.pid), None if used is None else int(used), name))
    return holders


@dataclass(frozen=True)
class SmiRow:
    index: int
    uuid: str
    name: str
    total_mib: int
    reserved_mib: int
    free_mib: int


_SMI_FIELDS = "index,uuid,name,memory.total,memory.reserved,memory.free"
_SMI_FIELDS_OLD = "index,uuid,name,memory.total,memory.free"  # drivers without memory.reserved
_SMI_APPS = "pid,used_memory,gpu_uuid,process_name"


def _mib(value: str) -> int | None:
    try:
        return int(float(value))
    except ValueError:  # "[N/A]", "[Insufficient Permissions]"
        return None


def parse_query_gpu(text: str, with_reserved: bool = True) -> list[SmiRow]:
    """Parse ``nvidia-smi --query-gpu=<_SMI_FIELDS> --format=csv,noheader,nounits``."""
    numbers = 3 if with_reserved else 2
    rows = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3 + numbers or not parts[0].isdigit():
            continue
        figures = [_mib(p) for p in parts[-numbers:]]
        total, free = figures[0], figures[-1]
        if total is None or free is None:
            continue
        reserved = (figures[1] or 0) if with_reserved else 0
        name = ", ".join(parts[2:-numbers])  # a name with a comma was split too
        rows.append(SmiRow(int(parts[0]), parts[1], name, total, reserved, free))
    return rows


def parse_compute_apps(text: str) -> dict[str, list[Holder]]:
    """Parse ``nvidia-smi --query-compute-apps=<_SMI_APPS> --format=csv,noheader,nounits`` by GPU UUID."""
    holders: dict[str, list[Holder]] = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",", 3)]
        if len(parts) < 3 or not parts[0].isdigit():
            continue
        used = _mib(parts[1])
        name = parts[3] if len(parts) > 3 and parts[3] and not parts[3].startswith("[") else None
        holders.setdefault(parts[2], []).append(Holder(int(parts[0]), None if used is None else used * MiB, name))
    return holders


def _run(argv: list[str]) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def probe_nvidia_smi(
    selectors: Sequence[Selector], run: Callable[[list[str]], str | None] = _run
) -> list[DeviceMemory] | None:
    """Read the devices through ``nvidia-smi``; None when it is missing or fails."""
    text = run(["nvidia-smi", f"--query-gpu={_SMI_FIELDS}", "--format=csv,noheader,nounits"])
    rows = parse_query_gpu(text) if text is not None else []
    if not rows:
        text = run(["nvidia-smi", f"--query-gpu={_SMI_FIELDS_OLD}", "--format=csv,noheader,nounits"])
        rows = parse_query_gpu(text, with_reserved=False) if text is not None else []
    if not rows:
        return None
    by_index = {row.index: row for row in rows}
    chosen = _choose(selectors, {row.index: row.uuid for row in rows})
    if chosen is None:
        return None
    apps = run(["nvidia-smi", f"--query-compute-apps={_SMI_APPS}", "--format=csv,noheader,nounits"])
    holders = parse_compute_apps(apps or "")
    devices = []
    for index in chosen:
        row = by_index[index]
        total = (row.total_mib - row.reserved_mib) * MiB
        # Each figure is rounded to a MiB on its own: an idle H200 read free 143156 of 143771 - 616 (tests/field/gpu_readings).
        free = min(row.free_mib * MiB, total)
        devices.append(DeviceMemory(index, row.name, total, free, holders.get(row.uuid, [])))
    return devices


def _read_int_file(path: str) -> int | None:
    try:
        with open(path) as f:
            value = f.read().strip()
        return None if not value or value == "max" else int(value)
    except (OSError, ValueError):
        return None


def _id_list(raw: str) -> list[int]:
    ids: list[int] = []
    for part in raw.split(","):
        if "-" in part:
            start, end = map(int, part.split("-"))
            ids.extend(range(start, end + 1))
        elif part.strip():
            ids.append(int(part))
    return sorted(set(ids))


def _memory_node(profile: LaunchProfile, root: str, allowed_cpus: set[int]) -> int:
    """The NUMA node CPUWorker.__init__ measures (cpu_worker.py:43-72)."""
    mems_allowed: list[int] = []
    with open(os.path.join(root, "proc/self/status")) as f:
        for line in f:
            if line.startswith("Mems_allowed_list:"):
                mems_allowed = _id_list(line.split(":")[1].strip())
    visible = mems_allowed
    nodes = profile.written("CPU_VISIBLE_MEMORY_NODES")
    if "VLLM_CPU_SIM_MULTI_NUMA" not in profile.env and nodes is not None:
        wanted = [int(s) for s in nodes.split(",")]
        visible = [node for node in wanted if node in mems_allowed]
    # vLLM takes the node of the first allowed CPU in lscpu's order; lscpu reads it from sysfs, "-" is 0.
    first_cpu = min(allowed_cpus)
    links = glob.glob(os.path.join(root, f"sys/devices/system/cpu/cpu{first_cpu}/node[0-9]*"))
    cpu_node = int(os.path.basename(links[0])[4:]) if links else 0
    if cpu_node in visible or not visible:
        return cpu_node
    return visible[0]


def _meminfo(path: str, prefix_words: int) -> dict[str, int]:
    values: dict[str, int] = {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) > prefix_words + 1:
                values[parts[prefix_words].rstrip(":")] = int(parts[prefix_words + 1]) * 1024
    return values


def probe_cpu(profile: LaunchProfile, root: str = "/", allowed_cpus: set[int] | None = None) -> list[DeviceMemory]:
    """The memory figure vLLM 0.32's CPU backend checks at startup, computed as it computes it.

    ``get_memory_node_info`` (vllm/utils/cpu_resource_utils.py:189-241): with a per-node meminfo,
    total = MemTotal and available = MemFree + Active(file) + Inactive(file) + SReclaimable, both
    clamped to the cgroup limit when it is lower; without one, psutil's total and available
    (/proc/meminfo MemTotal and MemAvailable).
    """
    allowed = allowed_cpus if allowed_cpus is not None else os.sched_getaffinity(0)
    node = _memory_node(profile, root, allowed)
    node_path = os.path.join(root, f"sys/devices/system/node/node{node}/meminfo")
    if not os.path.exists(node_path):
        info = _meminfo(os.path.join(root, "proc/meminfo"), 0)
        total, available = info["MemTotal"], info["MemAvailable"]
    else:
        info = _meminfo(node_path, 2)  # "Node 0 MemTotal:   97421888 kB"
        total = info["MemTotal"]
        available = info["MemFree"] + info["Active(file)"] + info["Inactive(file)"] + info["SReclaimable"]
        limit, usage = _cgroup_limit_and_usage(root)
        if limit is not None and limit < total:
            total = limit
            available = max(0, min(available, limit - (usage or 0)))
    return [DeviceMemory(node, f"NUMA node {node}", total, available, [], kind="cpu")]


def _cgroup_limit_and_usage(root: str) -> tuple[int | None, int | None]:
    """vLLM's get_cgroup_memory_limit / get_cgroup_memory_usage (cpu_resource_utils.py:69-115)."""
    v2_limit = _read_int_file(os.path.join(root, "sys/fs/cgroup/memory.max"))
    if v2_limit is not None:
        return v2_limit, _read_int_file(os.path.join(root, "sys/fs/cgroup/memory.current"))
    v1_limit = _read_int_file(os.path.join(root, "sys/fs/cgroup/memory/memory.limit_in_bytes"))
    if v1_limit is None or v1_limit >= (1 << 62):  # v1's "unlimited" sentinel
        return None, None
    return v1_limit, _read_int_file(os.path.join(root, "sys/fs/cgroup/memory/memory.usage_in_bytes"))


def list_gpus(nvml: Any = None, run: Callable[[list[str]], str | None] = _run) -> list[str] | None:
    """The names of the NVIDIA GPUs the container has (NVML, else ``nvidia-smi``); None when neither lists one."""
    try:
        if nvml is None:
            nvml = importlib.import_module("pynvml")  # nvidia-ml-py
        nvml.nvmlInit()
        try:
            names = [_text(nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(i))) for i in range(nvml.nvmlDeviceGetCount())]
        finally:
            nvml.nvmlShutdown()
        if names:
            return names
    except Exception:  # ImportError, or NVMLError for a missing driver/library: nvidia-smi may still answer
        pass
    text = run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"])
    names = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return names or None


def probe(profile: LaunchProfile, platform: Platform = "auto") -> list[DeviceMemory] | None:
    """The memory of every device the launch will use; None when it cannot be read."""
    if platform == "cpu":
        return probe_cpu(profile)
    selectors = devices_for(profile)
    if not selectors:
        return None
    devices = probe_nvml(selectors)
    return devices if devices is not None else probe_nvidia_smi(selectors)


_probe_env = probe


# ---------------------------------------------------------------- pure decisions


def gib(n: int) -> str:
    return f"{n / GiB:.2f}"


def _free_on(sample: Sample, index: int) -> int | None:
    return next((d.free for d in sample.devices if d.index == index), None)


def settled(samples: Sequence[Sample], index: int, policy: WaitPolicy) -> bool:
    """Whether device ``index`` has stopped gaining free memory (the KV_CACHE_MEMORY_BYTES rule).

    - On the first probe, a device no process is listed on is settled: nothing suggests a release
      in progress, so a cold start waits for nothing.
    - Otherwise it is settled once the probes span at least ``settle_window_s`` (5 s) and its free
      figure has not risen by more than ``settle_tolerance_bytes`` (128 MiB) at any point since the
      probe that opens that window. A release frees GiBs, so 128 MiB stays above the few MiB that
      free memory jitters by as contexts come and go; five 1-s polls see a stepwise reclaim that
      pauses for less than 5 s as still rising. A release that stalls longer than the window looks
      settled: on CUDA vLLM's own utilization check, waited for too, still guards the launch.
    """
    latest = samples[-1]
    device = next(d for d in latest.devices if d.index == index)
    if len(samples) == 1:
        return not device.holders
    opening = [i for i, s in enumerate(samples) if s.at <= latest.at - policy.settle_window_s]
    if not opening:
        return False
    frees = [f for f in (_free_on(s, index) for s in samples[opening[-1] :]) if f is not None]
    return max(frees) - frees[0] <= policy.settle_tolerance_bytes


@dataclass(frozen=True)
class _Shortfall:
    device: DeviceMemory
    need: int | None
    short: bool
    rising: bool

    def figures(self) -> str:
        word = "free" if self.device.kind == "gpu" else "available"
        text = f"{gib(self.device.free)} of {gib(self.device.total)} GiB {word}"
        if self.short and self.need is not None:
            return f"{text}, {gib(self.need)} GiB needed"
        return f"{text} and still rising"


def _shortfalls(samples: Sequence[Sample], profile: LaunchProfile, policy: WaitPolicy) -> list[_Shortfall]:
    """The devices not ready yet; all must be ready, so the slowest device decides."""
    out = []
    for device in samples[-1].devices:
        platform = "cpu" if device.kind == "cpu" else "cuda"
        need = need_bytes(device.total, profile, platform)
        short = need is not None and device.free < need
        rising = kv_cache_size_set(profile, platform) and not settled(samples, device.index, policy)
        if short or rising:
            out.append(_Shortfall(device, need, short, rising))
    return out


def _what(devices: Sequence[DeviceMemory]) -> str:
    return "GPU memory" if all(d.kind == "gpu" for d in devices) else "memory"


def progress_line(shortfalls: Sequence[_Shortfall], devices: Sequence[DeviceMemory], elapsed: float) -> str:
    if len(devices) == 1:
        figures = shortfalls[0].figures()
    else:
        figures = "; ".join(f"{s.device.label}: {s.figures()}" for s in shortfalls)
    return f"waiting for {_what(devices)} to be released: {figures}, {int(elapsed)} s so far"


def timeout_message(shortfalls: Sequence[_Shortfall], devices: Sequence[DeviceMemory], timeout_s: float) -> str:
    """The job answer when the memory never came: the wait, the figures, the holders, what remains to do."""
    what = _what(devices)
    figures = "; ".join(f"{s.device.label} has {s.figures()}" for s in shortfalls)
    holders = [(s.device, h) for s in shortfalls for h in s.device.holders]
    if holders:
        listed = ", ".join(
            f"pid {h.pid}"
            + (f" ({h.name})" if h.name else "")
            + (f" holds {h.used_bytes // MiB} MiB" if h.used_bytes is not None else "")
            + (f" on GPU {d.index}" if len(shortfalls) > 1 else "")
            for d, h in holders
        )
        held = f"It is held by {listed}."
    elif all(d.kind == "cpu" for d in devices):
        held = "It is held by other processes on this machine."
    else:
        held = "No process holding it is visible from here."
    elsewhere = "another container using the same GPU" if what == "GPU memory" else "another program on this machine"
    return (
        f"The engine was not started: {what} was still in use by another process after waiting "
        f"{TIMEOUT_VARIABLE}={timeout_s:g} seconds ({figures}). {held} This is usually a previous engine "
        f"that is still exiting, or {elsewhere}. Restart the worker later, find and stop the process "
        f"that holds the memory, or raise {TIMEOUT_VARIABLE} if it is released slowly."
    )


def decide(samples: Sequence[Sample], profile: LaunchProfile, policy: WaitPolicy) -> Decision:
    """Launch, poll again (with a progress line every few seconds), or give up; now is the latest probe."""
    latest = samples[-1]
    elapsed = latest.at - samples[0].at
    shortfalls = _shortfalls(samples, profile, policy)
    if not shortfalls:
        return Launch()
    remaining = policy.timeout_s - elapsed
    if remaining <= 0:
        return Timeout(timeout_message(shortfalls, latest.devices, policy.timeout_s))
    previous = samples[-2].at - samples[0].at if len(samples) > 1 else None
    due = previous is None or int(elapsed // policy.progress_every_s) > int(previous // policy.progress_every_s)
    line = progress_line(shortfalls, latest.devices, elapsed) if due else None
    return Poll(min(policy.poll_s, remaining), line)


# ---------------------------------------------------------------- the loop


def wait_for_memory(
    profile: LaunchProfile,
    *,
    timeout: float | None = None,
    platform: Platform = "auto",
    probe: Callable[[], list[DeviceMemory] | None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    log: Callable[[str], None] = print,
    policy: WaitPolicy | None = None,
) -> WaitResult:
    """Probe until every device has the memory vLLM will check for, or the timeout runs out.

    A cold start costs one probe and no sleep. When no probe works, the engine is launched anyway
    (after one log line): vLLM then makes its own check.
    """
    policy = policy or WaitPolicy()
    if timeout is not None:
        policy = replace(policy, timeout_s=timeout)
    read = probe if probe is not None else (lambda: _probe_env(profile, platform))
    start = clock()
    samples: list[Sample] = []
    while True:
        devices = read()
        elapsed = clock() - start
        if not devices:
            if samples:
                log(f"device memory could no longer be read after {int(elapsed)} s: launching the engine")
            else:
                log("device memory cannot be read (no NVML, no nvidia-smi): launching the engine without waiting")
            return WaitResult(True, elapsed, None, samples, "unknown")
        samples.append(Sample(elapsed, devices))
        decision = decide(samples, profile, policy)
        if isinstance(decision, Launch):
            if len(samples) > 1:
                log(f"{_what(devices)} is available after {int(elapsed)} s: launching the engine")
            return WaitResult(True, elapsed, None, samples, "launch")
        if isinstance(decision, Timeout):
            log(decision.message)
            return WaitResult(False, elapsed, decision.message, samples, "timeout")
        if decision.progress is not None:
            log(decision.progress)
        sleep(decision.sleep_s)
