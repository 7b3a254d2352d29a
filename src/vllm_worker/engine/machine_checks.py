"""The worker's own checks of its machine, made while memory and disk are still the machine's.

The runpod SDK (1.12) runs fitness checks of its own before its job loop: memory, disk free on
`/`, a TCP connect to 8.8.8.8:53, on GPUs an allocation test; any failure is `os._exit(1)`. In this
worker that moment comes after the engine is ready, holding the machine's memory and the model's
weights on its disk, and an exit there is the crash loop the worker exists to end. So the worker
makes the checks itself, at the start (serving.platform keeps the SDK's from running later):

- memory: what the kernel says is available (MemAvailable, within the cgroup's limit) against the
  SDK's floor, RUNPOD_MIN_MEMORY_GB (4 GB). Too little is the GPU type's: another GPU type is the fix.
- GPUs, when NVML or nvidia-smi lists any: as many as the launch needs (TP x PP), and on each a
  small allocation through the CUDA driver (`libcuda`), made in a child process so the worker holds
  no CUDA context afterwards. A GPU that cannot allocate is the machine's: a fresh worker is the fix.
  Fewer GPUs than the launch needs is the endpoint's configuration.
- disk, once the pre-flight knows the model's size: the free space where the download goes (the
  Hugging Face cache) against what is left to download. Too little is the endpoint's configuration
  (a larger container disk, or a network volume): a fresh worker would fail the same way.
- the internet: not checked. A worker whose job API answers is reached; the Hub is the pre-flight's.

Each check says what it found in one log line. The readings are thin edges; `judge_*` are pure.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from vllm_worker.engine import gpu_memory

GiB = 1 << 30
MIN_MEMORY_VARIABLE = "RUNPOD_MIN_MEMORY_GB"
DEFAULT_MIN_MEMORY_GB = 4.0
# Beside the weights, the download folder needs room for the tokenizer, configs and vLLM's logs.
DISK_SPARE_BYTES = 1 << 30
ALLOCATION_BYTES = 64 << 20
ALLOCATION_TIMEOUT_S = 60.0
# The fresh-machine kind (serving.fresh_machine) of a GPU that fails its check.
GPU_FAULT_KIND = "gpu_check"


@dataclass(frozen=True)
class Check:
    """One check: what it found, and when it failed, the sentence jobs are answered with."""

    name: str  # "memory", "gpus", "disk", "internet"
    found: str
    failure: str | None = None
    fresh_machine: bool = False  # whether another machine is the fix

    @property
    def ok(self) -> bool:
        return self.failure is None

    def log_line(self) -> str:
        verdict = "ok" if self.ok else "FAILED"
        return f"machine check {self.name}: {verdict}: {self.found}"


def gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB"


# ---------------------------------------------------------------- pure judgements


def min_memory_bytes(env: Mapping[str, str]) -> int:
    """The SDK's memory floor, RUNPOD_MIN_MEMORY_GB (GB as the SDK counts them: GiB); 4 when unset or unreadable."""
    raw = env.get(MIN_MEMORY_VARIABLE, "")
    try:
        value = float(raw) if raw.strip() else DEFAULT_MIN_MEMORY_GB
    except ValueError:
        value = DEFAULT_MIN_MEMORY_GB
    if not math.isfinite(value) or value < 0:
        value = DEFAULT_MIN_MEMORY_GB
    return int(value * GiB)


def judge_memory(available: int | None, floor: int) -> Check:
    if available is None:
        return Check("memory", "the available memory could not be read; not judged")
    found = f"{gib(available)} available, at least {gib(floor)} wanted ({MIN_MEMORY_VARIABLE})"
    if available >= floor:
        return Check("memory", found)
    return Check(
        "memory",
        found,
        f"This machine has {gib(available)} of memory available, less than the {gib(floor)} the worker and "
        f"vLLM need beside the GPU ({MIN_MEMORY_VARIABLE}={floor / GiB:g}): choose a GPU type with more "
        f"system memory for the endpoint.",
    )


def judge_gpus(
    listed: Sequence[str] | None, needed: int, allocations: Mapping[int, str | None] | None
) -> Check:
    """listed: the GPUs' names (None: no NVIDIA GPU visible); needed: the launch's TP x PP;
    allocations: device index -> None when the allocation worked, else the error."""
    if not listed:
        return Check("gpus", "no NVIDIA GPU listed by NVML or nvidia-smi; the GPU checks do not apply")
    names = ", ".join(f"{i}: {name}" for i, name in enumerate(listed))
    if len(listed) < needed:
        return Check(
            "gpus",
            f"{len(listed)} GPU(s) ({names}), the launch needs {needed}",
            f"The launch needs {needed} GPUs (TENSOR_PARALLEL_SIZE x PIPELINE_PARALLEL_SIZE) and this worker has "
            f"{len(listed)}: set the endpoint's GPUs per worker to {needed}, or the parallel sizes to fit {len(listed)}.",
        )
    if not allocations:
        return Check("gpus", f"{len(listed)} GPU(s) ({names}); the allocation test could not run here, not judged")
    failed = {i: error for i, error in allocations.items() if error is not None}
    tried = len(allocations)
    found = f"{len(listed)} GPU(s) ({names}); a {ALLOCATION_BYTES >> 20} MiB allocation on {tried - len(failed)} of {tried}"
    if not failed:
        return Check("gpus", found)
    first, error = min(failed.items())
    return Check(
        "gpus",
        f"{found}; GPU {first}: {error}",
        f"GPU {first} of this machine cannot allocate memory ({error}) before vLLM has started: a fault of the "
        f"machine, not of the settings.",
        fresh_machine=True,
    )


def judge_disk(folder: Path, free: int | None, to_download: int | None, where: str) -> Check:
    """free: bytes free on the folder's filesystem; to_download: the model's bytes not yet in the folder."""
    if to_download is None:
        return Check("disk", f"the model's size is not known (no pre-flight figure); {folder} not judged")
    if free is None:
        return Check("disk", f"the free space at {folder} could not be read; not judged")
    need = to_download + DISK_SPARE_BYTES
    found = f"{gib(free)} free at {folder} ({where}), the model needs {gib(to_download)} more"
    if free >= need:
        return Check("disk", found)
    gb = math.ceil((need - free) / 1e9)
    return Check(
        "disk",
        found,
        f"The model needs {gib(to_download)} more at {folder} ({where}) and that disk has {gib(free)} free: "
        f"raise the endpoint's container disk by at least {gb} GB, or attach a network volume at BASE_PATH "
        f"with the space, so the download does not fill the disk.",
    )


def internet() -> Check:
    return Check(
        "internet",
        "not checked: the job API answering is this worker's link to the platform, and the Hub's "
        "reachability is the pre-flight's (the SDK's connect to 8.8.8.8:53 is not made)",
    )


def first_failure(checks: Sequence[Check]) -> Check | None:
    """The check jobs are answered with: a machine fault first (it asks for a fresh worker), else the first."""
    failed = [c for c in checks if not c.ok]
    return next((c for c in failed if c.fresh_machine), failed[0] if failed else None)


# ---------------------------------------------------------------- readings (thin edges)


def available_memory(root: str = "/") -> int | None:
    """MemAvailable, within the cgroup's limit less its usage when one is set."""
    try:
        available = gpu_memory._meminfo(os.path.join(root, "proc/meminfo"), 0).get("MemAvailable")
    except (OSError, ValueError):
        available = None
    limit, usage = gpu_memory._cgroup_limit_and_usage(root)
    if limit is not None and usage is not None:
        left = max(0, limit - usage)
        available = left if available is None else min(available, left)
    return available


def free_bytes(folder: Path) -> int | None:
    """Free space on the filesystem that holds `folder`, or would hold it once created."""
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return shutil.disk_usage(probe).free
    except OSError:
        return None


def present_bytes(folder: Path) -> int:
    """Bytes already downloaded under `folder` (a partial download on a volume)."""
    total = 0
    for path in folder.rglob("*"):
        try:
            if path.is_file() and not path.is_symlink():
                total += path.stat().st_size
        except OSError:
            continue
    return total


_ALLOCATE = r"""
import ctypes, sys
size = int(sys.argv[1])
try:
    cuda = ctypes.CDLL("libcuda.so.1")
except OSError as error:
    print("all libcuda.so.1 cannot be loaded: " + str(error)); sys.exit(0)
def name(code):
    text = ctypes.c_char_p()
    cuda.cuGetErrorName(code, ctypes.byref(text))
    return (text.value or b"CUDA error").decode() + " (" + str(code) + ")"
try:
    code = cuda.cuInit(0)
    if code:
        print("all cuInit failed: " + name(code)); sys.exit(0)
    for index in map(int, sys.argv[2:]):
        device, context, pointer = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
        code = cuda.cuDeviceGet(ctypes.byref(device), index)
        if not code:
            code = cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device) or cuda.cuCtxSetCurrent(context)
            if not code:
                code = cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(size))
                if not code:
                    code = cuda.cuMemsetD8_v2(pointer, ctypes.c_ubyte(0), ctypes.c_size_t(size)) or cuda.cuCtxSynchronize()
                    cuda.cuMemFree_v2(pointer)
            cuda.cuDevicePrimaryCtxRelease_v2(device)
        print(str(index) + (" ok" if not code else " " + name(code)), flush=True)
except AttributeError as error:  # a driver without these entry points: the test cannot run, nothing is judged
    print("skip " + str(error), flush=True)
"""


def parse_allocations(text: str, indexes: Sequence[int]) -> dict[int, str | None]:
    """The child's lines ("<index> ok", "<index> <error>", "all <error>") per device; a device
    the child never answered for, after one it did, gets the reason that it did not. A child that
    answered for none (it could not run the test: "skip ...", a crash) gives {}: nothing is judged,
    since a wrong machine fault would replace healthy workers."""
    result: dict[int, str | None] = {}
    for line in text.splitlines():
        head, _, rest = line.strip().partition(" ")
        if head == "all":
            return {i: rest or "the CUDA driver failed" for i in indexes}
        if head.isdigit() and int(head) in indexes:
            result[int(head)] = None if rest == "ok" else (rest or "failed")
    if not result:
        return {}
    return {i: result.get(i, "the allocation test ended before this GPU") for i in indexes}


def allocate_each(indexes: Sequence[int], run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run) -> dict[int, str | None]:
    """A small allocation on each device (CUDA device numbers as the container sees them), in a child process."""
    if not indexes:
        return {}
    try:
        done = run(
            [sys.executable, "-c", _ALLOCATE, str(ALLOCATION_BYTES), *map(str, indexes)],
            capture_output=True,
            text=True,
            timeout=ALLOCATION_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return {i: f"the allocation test did not end within {ALLOCATION_TIMEOUT_S:g} s" for i in indexes}
    except OSError as error:
        return {i: f"the allocation test could not run ({error})" for i in indexes}
    return parse_allocations(done.stdout, indexes)


def before_preflight(
    env: Mapping[str, str],
    needed_gpus: int,
    engine_device: str,
    gpus: Callable[[], list[str] | None] = gpu_memory.list_gpus,
    memory: Callable[[], int | None] | None = None,
    allocate: Callable[[Sequence[int]], dict[int, str | None]] = allocate_each,
) -> list[Check]:
    """Memory, the GPUs (unless the engine runs on the CPU) and the internet's line, in that order."""
    checks = [judge_memory((memory or available_memory)(), min_memory_bytes(env))]
    if engine_device == "cpu":
        checks.append(Check("gpus", "ENGINE_DEVICE=cpu: the GPU checks do not apply"))
    else:
        listed = gpus()
        allocations = allocate(list(range(min(needed_gpus, len(listed))))) if listed and len(listed) >= needed_gpus else None
        checks.append(judge_gpus(listed, needed_gpus, allocations))
    checks.append(internet())
    return checks


def disk_for_download(folder: Path, expected: int | None, where: str) -> Check:
    """The disk check once the pre-flight knows the model's size; `folder` is the repo's cache folder."""
    to_download = None if expected is None else max(0, expected - present_bytes(folder))
    return judge_disk(folder, free_bytes(folder), to_download, where)
