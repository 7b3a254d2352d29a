"""A cold start paid once: the worker started twice on one network volume folder, torch.compile on.

The real CPU engine and the built-in tiny model, through `vllm-worker run` (local API mode),
ENFORCE_EAGER off. The first start finds an empty volume folder (BASE_PATH), the second the
folder the first left. Each start gets a fresh HOME and TMPDIR, as a fresh container would, so
whatever the second finds warm it found on the volume. Prints both starts' phases (the worker's
"startup phases" line) and the ratios of the ready and engine-init times. Targets on the 2-core
development machine: warm ready <= 0.75 of cold, warm engine init <= 0.55 of cold.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / ".cache" / "tiny-llama"
VLLM = ROOT / ".venv-engine" / "bin" / "vllm"
WORKER = ROOT / ".venv" / "bin" / "vllm-worker"
FLAGS = {
    "MAX_MODEL_LEN": "512",
    "ENFORCE_EAGER": "false",
    "KV_CACHE_MEMORY_BYTES": str(64 * 1024 * 1024),
    "MAX_NUM_SEQS": "32",
    "DTYPE": "bfloat16",
}
CPU_ENV = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "PYTHONUNBUFFERED": "1"}
READY_LINE = "engine ready; taking jobs"
PHASES_LINE = re.compile(r"startup phases, launch 1: (.*?)(?:; compile caches (\S+).*)?$")
TIMEOUT = 900.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(volume: Path, scratch: Path) -> tuple[float, dict[str, float], str | None]:
    """One worker start: seconds to its ready line, its phases, the caches' state it reported."""
    home, tmp = scratch / "home", scratch / "tmp"
    home.mkdir(parents=True)
    tmp.mkdir()
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("VLLM_", "TORCHINDUCTOR_", "TRITON_", "RUNPOD_")) and key != "XDG_CACHE_HOME"
    }
    env.update(FLAGS)
    env.update(CPU_ENV)
    env.update(
        HOME=str(home),
        TMPDIR=str(tmp),
        BASE_PATH=str(volume),
        MODEL_NAME=str(MODEL),
        VLLM_COMMAND=f"{VLLM} serve",
        VLLM_PORT=str(free_port()),
        VLLM_STARTUP_TIMEOUT=str(int(TIMEOUT)),
    )
    argv = [str(WORKER), "run", "--rp_serve_api", "--rp_api_port", str(free_port())]
    began = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    phases: dict[str, float] = {}
    cache: str | None = None
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            match = PHASES_LINE.search(line.rstrip())
            if match:
                for part in match.group(1).split(", "):
                    name, _, seconds = part.rpartition(" ")
                    phases[name] = float(seconds.rstrip("s"))
                cache = match.group(2)
            if READY_LINE in line:
                return time.perf_counter() - began, phases, cache
            if time.perf_counter() - began > TIMEOUT:
                break
        raise SystemExit(f"the worker was not ready (exit {proc.poll()})")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def table(cold: dict[str, float], warm: dict[str, float]) -> str:
    rows = ["| phase | cold (empty volume) | warm (same volume) |", "| --- | --- | --- |"]
    for name in dict.fromkeys([*cold, *warm]):
        a = f"{cold[name]:.1f} s" if name in cold else "-"
        b = f"{warm[name]:.1f} s" if name in warm else "-"
        rows.append(f"| {name} | {a} | {b} |")
    return "\n".join(rows)


def main() -> int:
    if not (MODEL / "config.json").exists() or not VLLM.exists() or not WORKER.exists():
        raise SystemExit("run `bash scripts/setup.sh` first")
    base = Path(tempfile.mkdtemp(prefix="cold-start-"))
    try:
        volume = base / "volume"
        volume.mkdir()
        cold_s, cold, cold_cache = start(volume, base / "first")
        print(f"cold start: ready line after {cold_s:.1f} s, compile caches {cold_cache}", flush=True)
        warm_s, warm, warm_cache = start(volume, base / "second")
        print(f"warm start: ready line after {warm_s:.1f} s, compile caches {warm_cache}", flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(table(cold, warm))
    ready = warm_s / cold_s
    init = warm["engine_init"] / cold["engine_init"] if "engine_init" in cold and "engine_init" in warm else None
    print(f"ready: warm/cold = {warm_s:.1f}/{cold_s:.1f} s = {ready:.2f} (target <= 0.75)")
    if init is not None:
        print(f"engine init: warm/cold = {warm['engine_init']:.1f}/{cold['engine_init']:.1f} s = {init:.2f} (target <= 0.55)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
