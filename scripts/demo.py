"""`make run`: the worker on the built-in tiny model with the real CPU engine, answering two jobs.

It starts `vllm-worker run --rp_serve_api` (the runpod SDK's local API) with the tiny model
and the engine from `.venv-engine`, sends one chat job and one streaming job the way a
client would, prints both answers, then stops the worker with SIGTERM and checks that it
left no engine process behind.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / ".cache" / "tiny-llama"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def post(url: str, payload: dict, timeout: float = 120) -> dict:
    request = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def wait_for_api(base: str, worker: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if worker.poll() is not None:
            raise SystemExit(f"the worker exited with code {worker.returncode} before it was ready")
        try:
            urllib.request.urlopen(base + "/docs", timeout=1).close()
            return
        except (urllib.error.URLError, OSError):
            time.sleep(0.5)
    raise SystemExit(f"the worker was not ready after {timeout:.0f} s")


def main() -> int:
    if not MODEL.joinpath("config.json").exists():
        raise SystemExit("the tiny model is missing: run `bash scripts/setup.sh` first (make run does)")
    api_port, engine_port = free_port(), free_port()
    env = {
        **os.environ,
        "MODEL_NAME": str(MODEL),
        "SERVED_MODEL_NAME": "tiny-llama",
        "VLLM_COMMAND": f"{ROOT / '.venv-engine' / 'bin' / 'vllm'} serve",
        "VLLM_PORT": str(engine_port),
        "MAX_MODEL_LEN": "512",
        "ENFORCE_EAGER": "true",
        "KV_CACHE_MEMORY_BYTES": str(64 * 1024 * 1024),
        "MAX_CONCURRENCY": "8",
        "DTYPE": "bfloat16",
        "HF_HUB_OFFLINE": "1",
        # vLLM's CPU backend pins threads to cores by default and refuses small machines.
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "RUNPOD_LOG_LEVEL": "WARN",
    }
    command = [str(ROOT / ".venv" / "bin" / "vllm-worker"), "run", "--rp_serve_api", "--rp_api_port", str(api_port)]
    print("$", " ".join(command), flush=True)
    worker = subprocess.Popen(command, env=env, cwd=ROOT)
    base = f"http://127.0.0.1:{api_port}"
    try:
        wait_for_api(base, worker, timeout=600)
        chat = post(
            base + "/runsync",
            {"input": {"messages": [{"role": "user", "content": "Say hello."}], "sampling_params": {"max_tokens": 16}}},
        )
        print("\n== chat job ==")
        print(json.dumps(chat, indent=2))
        job = post(
            base + "/run",
            {
                "input": {
                    "openai_route": "/v1/chat/completions",
                    "openai_input": {
                        "messages": [{"role": "user", "content": "Count to three."}],
                        "max_tokens": 16,
                        "stream": True,
                    },
                }
            },
        )
        stream = post(f"{base}/stream/{job['id']}", {})
        print("\n== streaming job (SSE events) ==")
        for item in stream.get("stream", []):
            print(item.get("output", item), end="")
        ok = chat.get("status") == "COMPLETED" and stream.get("status") == "COMPLETED"
    finally:
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=60)
    leftover = subprocess.run(["pgrep", "-f", "vllm serve " + str(MODEL)], capture_output=True, text=True).stdout
    print(f"\nworker stopped (exit {code}); engine processes left: {leftover.split() or 'none'}")
    return 0 if ok and not leftover else 1


if __name__ == "__main__":
    sys.exit(main())
