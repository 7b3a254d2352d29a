"""Seconds from launch to ready: bare `vllm serve` against the worker, same engine and model, one run.

Bare: start `vllm serve` and poll its /health until 200 (every 50 ms, finer than the
worker's own poll, so the bare figure is the best case). Worker: start `vllm-worker run`
with the same model and flags and take the moment its log says it takes jobs. The target
is that the worker adds less than one second. Runs alternate (bare, worker, bare, worker)
so that a warming page cache favours neither side.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / ".cache" / "tiny-llama"
VLLM = ROOT / ".venv-engine" / "bin" / "vllm"
WORKER = ROOT / ".venv" / "bin" / "vllm-worker"
FLAGS = {
    "MAX_MODEL_LEN": "512",
    "ENFORCE_EAGER": "true",
    "KV_CACHE_MEMORY_BYTES": str(64 * 1024 * 1024),
    "MAX_NUM_SEQS": "8",
    "DTYPE": "bfloat16",
}
CPU_ENV = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "PYTHONUNBUFFERED": "1"}
READY_LINE = "engine ready; taking jobs"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def bare(port: int) -> float:
    argv = [
        str(VLLM), "serve", str(MODEL), "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", FLAGS["MAX_MODEL_LEN"], "--enforce-eager",
        "--kv-cache-memory-bytes", FLAGS["KV_CACHE_MEMORY_BYTES"], "--max-num-seqs", FLAGS["MAX_NUM_SEQS"], "--dtype", FLAGS["DTYPE"],
    ]
    env = {**os.environ, **CPU_ENV}
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"bare vllm serve exited with {proc.returncode}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=0.5) as response:
                    if response.status == 200:
                        return time.perf_counter() - start
            except OSError:
                pass
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


def worker(port: int) -> float:
    env = {
        **os.environ,
        **FLAGS,
        **CPU_ENV,
        "MODEL_NAME": str(MODEL),
        "VLLM_COMMAND": f"{VLLM} serve",
        "VLLM_PORT": str(port),
    }
    # The local API mode keeps the worker off any control plane; readiness is the log line.
    argv = [str(WORKER), "run", "--rp_serve_api", "--rp_api_port", str(free_port())]
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if READY_LINE in line:
                return time.perf_counter() - start
        raise SystemExit(f"the worker exited with {proc.wait()} before it was ready")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    rounds = parser.parse_args().rounds
    if not (MODEL / "config.json").exists() or not VLLM.exists():
        raise SystemExit("run `bash scripts/setup.sh` first")
    bare_s: list[float] = []
    worker_s: list[float] = []
    for i in range(rounds):
        bare_s.append(bare(free_port()))
        worker_s.append(worker(free_port()))
        print(f"round {i + 1}: bare vllm serve {bare_s[-1]:.2f} s, worker {worker_s[-1]:.2f} s", flush=True)
    b, w = statistics.median(bare_s), statistics.median(worker_s)
    print(f"median: bare {b:.2f} s, worker {w:.2f} s, worker adds {w - b:+.2f} s (ratio {w / b:.3f}); target: adds < 1 s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
