"""Every stream whole, counted: the issue's run of streamed completions through both ways a job reaches the worker.

Boots the worker twice on the tiny Llama and the real vLLM CPU engine: once on the SDK's job loop
against the control-plane stand-in (plain asyncio), once on the local API (`--rp_serve_api`:
uvicorn, uvloop). Each streams `--count` completions of 100 to 2,000 tokens one at a time, then the
same `--count` eight at once, and prints per way and mode how many arrived whole (every event once,
in order, ending in `[DONE]`) and how many were answered with a timeout. tests/engine/test_streams_whole.py
runs fewer with the same code.

    .venv/bin/python bench/streams.py [--count 20]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support import engine_env, streams  # noqa: E402
from tests.support.control_plane import ControlPlane  # noqa: E402
from tests.support.worker_proc import WorkerProcess, stop_with_engine  # noqa: E402

AT_ONCE = 8
SETTINGS = {"MAX_CONCURRENCY": str(AT_ONCE), "ADAPTIVE_CONCURRENCY": "false", "MAX_MODEL_LEN": "2048", "REQUEST_TIMEOUT": "900"}


def _report(way: str, mode: str, results: list[streams.Checked], seconds: float) -> None:
    whole = sum(r.problem is None for r in results)
    timeouts = sum(r.problem is not None and "REQUEST_TIMEOUT" in r.problem for r in results)
    print(f"{way:10} {mode:12} whole {whole}/{len(results)}  false timeouts {timeouts}  ({seconds:.0f} s)")
    for r in results:
        if r.problem is not None:
            print(f"    {r.tokens} tokens: {r.problem[:200]}")


def _both_modes(way: str, one: Callable[[int], streams.Checked], lengths: list[int]) -> None:
    for mode, at_once in (("one at once", 1), (f"{AT_ONCE} at once", AT_ONCE)):
        began = time.monotonic()
        results = streams.run(one, lengths, at_once)
        _report(way, mode, results, time.monotonic() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=20, help="streams per way and mode")
    args = parser.parse_args()
    model = engine_env.make_tiny_model()
    lengths = streams.lengths(args.count)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores; {args.count} streams of {lengths[0]} to {lengths[-1]} tokens")
    with tempfile.TemporaryDirectory() as root, ControlPlane() as cp:
        proc = WorkerProcess(engine_env.tiny_worker_env(model, **SETTINGS), control_plane=cp, workdir=Path(root)).start()
        try:
            proc.wait_for_log(r"engine ready; taking jobs", timeout=engine_env.BOOT_TIMEOUT)
            _both_modes("job loop", streams.via_job_loop(cp, engine_env.BOOT_TIMEOUT), lengths)
        finally:
            stop_with_engine(proc)
    with tempfile.TemporaryDirectory() as root:
        port = engine_env.free_port()
        api = ("run", "--rp_serve_api", "--rp_api_host", "127.0.0.1", "--rp_api_port", str(port))
        proc = WorkerProcess(engine_env.tiny_worker_env(model, **SETTINGS), args=api, workdir=Path(root)).start()
        try:
            proc.wait_for_log(r"engine ready; taking jobs", timeout=engine_env.BOOT_TIMEOUT)
            proc.wait_for_log(r"Uvicorn running on", timeout=60)
            _both_modes("local API", streams.via_local_api(port, engine_env.BOOT_TIMEOUT), lengths)
        finally:
            stop_with_engine(proc)


if __name__ == "__main__":
    main()
