"""Read, on a machine with an NVIDIA GPU, what the worker's GPU edges parse, and keep it verbatim.

The worker reads GPUs in three thin edges that no CPU machine can exercise: `nvidia-smi`'s CSV
queries and NVML (engine.gpu_memory: the memory wait, the GPU list), and a small allocation through
the CUDA driver in a child (engine.machine_checks). This script records what a real card answers to
exactly those calls, at the same moments as CUDA's own figure (torch.cuda.mem_get_info, which is
what vLLM compares with GPU_MEMORY_UTILIZATION x total), so tests can hold the parsers and the
card table (capacity.gpus) against a real reading instead of text shaped by hand:

    python scripts/gpu_readings.py OUT_DIR     # TORCH_PYTHON: a Python with torch and pynvml (python3)

It also measures how long a card takes to give back a process's memory after the process ends
(SIGKILL, and a normal exit), the delay the pre-launch memory wait exists for. Output: OUT_DIR/
readings.json (figures) and OUT_DIR/*.txt (each command's stdout, byte for byte).
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO)]
from tests.support import gpu_holder  # noqa: E402
from vllm_worker.engine import gpu_memory, machine_checks  # noqa: E402

GiB = 1 << 30
MiB = 1 << 20

SMI_QUERIES = {
    "query_gpu": ["nvidia-smi", f"--query-gpu={gpu_memory._SMI_FIELDS}", "--format=csv,noheader,nounits"],
    "query_gpu_old": ["nvidia-smi", f"--query-gpu={gpu_memory._SMI_FIELDS_OLD}", "--format=csv,noheader,nounits"],
    "query_names": ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
    "query_apps": ["nvidia-smi", f"--query-compute-apps={gpu_memory._SMI_APPS}", "--format=csv,noheader,nounits"],
    "query_driver": ["nvidia-smi", "--query-gpu=driver_version,pci.bus_id,memory.used", "--format=csv,noheader,nounits"],
}

# CUDA's figures beside NVML's, inside one process: before and after the context, after a cuBLAS matmul.
CONTEXT = r"""
import json, torch, pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
def used():
    return int(pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2).used)
before = used()
torch.cuda.init()
free, total = torch.cuda.mem_get_info(0)
after_context = used()
a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
(a @ a).sum().item()
torch.cuda.synchronize()
after_matmul = used()
print(json.dumps({
    "nvml_used_before": before, "cuda_free": free, "cuda_total": total, "nvml_used_with_context": after_context,
    "nvml_used_after_matmul": after_matmul, "torch_reserved_after_matmul": torch.cuda.memory_reserved(0),
    "torch_version": torch.__version__, "torch_cuda": torch.version.cuda, "device_name": torch.cuda.get_device_name(0),
}))
"""


def run(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as error:
        return f"[not run: {error}]"
    return done.stdout if done.returncode == 0 else f"[exit {done.returncode}] {done.stdout}{done.stderr}"


def nvml_memory() -> dict[str, int]:
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
        v1 = pynvml.nvmlDeviceGetMemoryInfo(handle)
        return {
            "v2_total": int(v2.total), "v2_reserved": int(v2.reserved), "v2_free": int(v2.free), "v2_used": int(v2.used),
            "v1_total": int(v1.total), "v1_free": int(v1.free), "v1_used": int(v1.used),
        }
    finally:
        pynvml.nvmlShutdown()


def nvml_free() -> int:
    devices = gpu_memory.probe_nvml([0])
    assert devices, "NVML gave no reading"
    return devices[0].free


def release_time(gib: float, how: str, baseline_free: int) -> dict[str, Any]:
    """Seconds from a holder's end (SIGKILL, or its own exit) until NVML's free is back near the baseline."""
    child = gpu_holder.hold(int(gib * GiB), 3.0 if how == "exit" else 600.0)
    held_free = nvml_free()
    if how == "kill":
        start = time.monotonic()
        child.send_signal(signal.SIGKILL)
    else:
        child.wait(timeout=60)
        start = time.monotonic()
    reaped = None
    samples = 0
    while True:
        free = nvml_free()
        samples += 1
        if reaped is None and child.poll() is not None:
            reaped = time.monotonic() - start
        if free >= baseline_free - 256 * MiB:
            back = time.monotonic() - start
            break
        if time.monotonic() - start > 120:
            back = None
            break
        time.sleep(0.01)
    child.wait(timeout=30)
    return {"how": how, "gib": gib, "held_free": held_free, "back_after_s": back, "reaped_after_s": reaped, "polls": samples}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--hold-gib", type=float, default=100.0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    readings: dict[str, Any] = {"taken_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

    def save() -> None:
        (args.out / "readings.json").write_text(json.dumps(readings, indent=1) + "\n")

    for name, argv in SMI_QUERIES.items():
        (args.out / f"idle_{name}.txt").write_text(run(argv))
    readings["idle_nvml"] = nvml_memory()
    readings["idle_probe_nvml"] = [asdict(d) for d in gpu_memory.probe_nvml([0]) or []]
    readings["list_gpus"] = gpu_memory.list_gpus()
    save()

    context = subprocess.run(
        [gpu_holder.torch_python(), "-c", CONTEXT], capture_output=True, text=True, timeout=120, env=gpu_holder.machine_env()
    )
    readings["context"] = json.loads(context.stdout.strip().splitlines()[-1]) if context.returncode == 0 else context.stderr[-2000:]
    readings["after_context_nvml"] = nvml_memory()
    save()

    for indexes in ([0], [0, 1]):
        child = subprocess.run(
            [sys.executable, "-c", machine_checks._ALLOCATE, str(machine_checks.ALLOCATION_BYTES), *map(str, indexes)],
            capture_output=True, text=True, timeout=120,
        )
        key = "_".join(map(str, indexes))
        (args.out / f"allocate_{key}.txt").write_text(child.stdout)
        readings[f"allocate_{key}"] = {"exit": child.returncode, "parsed": machine_checks.parse_allocations(child.stdout, indexes)}
    save()

    # The runpod SDK's own GPU check (its gpu_test binary), which the worker keeps from running.
    try:
        from runpod.serverless.modules import rp_gpu_fitness

        binary = rp_gpu_fitness._get_gpu_test_binary_path()
        if binary is not None:
            (args.out / "sdk_gpu_test.txt").write_text(run([str(binary)]))
            readings["sdk_gpu_test_parsed"] = rp_gpu_fitness._parse_gpu_test_output((args.out / "sdk_gpu_test.txt").read_text())
    except Exception as error:  # the SDK is not installed where this runs
        readings["sdk_gpu_test_parsed"] = f"not run: {error!r}"
    save()

    # One holder: what the queries say while a process holds memory, and the wait's own probe.
    baseline = nvml_free()
    holder = gpu_holder.hold(int(args.hold_gib * GiB), 600.0)
    try:
        readings["holder_pid"] = holder.pid
        for name in ("query_gpu", "query_apps"):
            (args.out / f"held_{name}.txt").write_text(run(SMI_QUERIES[name]))
        readings["held_nvml"] = nvml_memory()
        readings["held_probe_nvml"] = [asdict(d) for d in gpu_memory.probe_nvml([0]) or []]
        readings["held_probe_smi"] = [asdict(d) for d in gpu_memory.probe_nvidia_smi([0]) or []]
    finally:
        holder.kill()
        holder.wait()
    save()

    readings["release"] = []
    for how in ("kill", "exit", "kill", "exit"):
        readings["release"].append(release_time(args.hold_gib, how, baseline))
        save()
    print(json.dumps(readings, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
