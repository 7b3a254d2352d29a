"""Where the real vLLM CPU engine and the tiny model are, and how to run them fast on a small box.

Shared by every test that starts `vllm serve` (tests/engine, integration tests that run the
worker over the real engine). The flag set below was found by running the engine by hand on
a 2-core machine; it is the one place to change when vLLM or the machine changes.

A missing engine venv skips on a developer's machine and fails under CI=true, where
`make test` builds it and a skip would hide a broken setup.
"""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path
from typing import Mapping, Sequence

import pytest

from vllm_worker.config.profile import apply_overrides
from vllm_worker.engine.process import Engine

REPO = Path(__file__).resolve().parents[2]
ENGINE_VENV = REPO / ".venv-engine"
ENGINE_PYTHON = ENGINE_VENV / "bin" / "python"
VLLM_BIN = ENGINE_VENV / "bin" / "vllm"
MAKE_TINY_MODEL = REPO / "scripts" / "make_tiny_model.py"
TINY_MODEL = REPO / ".cache" / "tiny-llama"
TINY_DTYPE = "bfloat16"  # what make_tiny_model.py writes by default; vLLM's CPU default too

# 64 MiB of KV cache is 65,536 tokens for the tiny model. An explicit size also makes vLLM skip
# its warm-up pass and the "fraction of the NUMA node" sizing that --gpu-memory-utilization means on CPU.
TINY_KV_CACHE_BYTES = 64 * 1024 * 1024

# Measured on 2 cores: ready in ~22-33 s, almost all of it Python imports in the three processes
# vLLM runs (API server, engine core, worker). --enforce-eager skips torch.compile (minutes on CPU).
TINY_FLAGS: tuple[str, ...] = (
    "--enforce-eager",
    "--max-model-len", "512",
    "--max-num-seqs", "32",
    "--kv-cache-memory-bytes", str(TINY_KV_CACHE_BYTES),
    "--dtype", TINY_DTYPE,
    "--disable-log-stats",
)

# Generous: a boot is ~30 s alone, but other suites share the two cores.
BOOT_TIMEOUT = 600.0
STOP_GRACE = 30.0

# Environment for the engine child, on top of the test process's own.
ENGINE_ENV: dict[str, str] = {
    # Nothing may reach the network: the model is local, and there is no internet here.
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    # The default ("auto") pins the worker to core 0 and reserves the rest; it refuses a 1-core
    # box and fights the other test processes for that core. Unbound threads work everywhere.
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    # One OpenMP thread an engine: the suite runs two tests at once, and two engines with one thread a core
    # each spun against each other's threads: 6 streams of 400 tokens took 90 s each, 11 s with one thread
    # (10 s and 7 s alone; docs/benchmarks.md, "The suite's own time").
    "OMP_NUM_THREADS": "1",
    "PYTHONUNBUFFERED": "1",
}
# Legacy knob that silently overrides --kv-cache-memory-bytes (in GiB) when inherited.
ENGINE_ENV_DROPPED = ("VLLM_CPU_KVCACHE_SPACE",)


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def require_engine() -> Path:
    """Path to `.venv-engine/bin/vllm`; skip (dev) or fail (CI=true) when it is missing."""
    if VLLM_BIN.exists() and ENGINE_PYTHON.exists():
        return VLLM_BIN
    message = f"{VLLM_BIN} is missing: run `bash scripts/setup.sh` to build the engine venv"
    if in_ci():
        pytest.fail(f"{message} (CI=true: the engine tests must run)", pytrace=False)
    pytest.skip(message)


def make_tiny_model(
    out: Path = TINY_MODEL,
    *,
    layers: int | None = None,
    heads: int | None = None,
    kv_heads: int | None = None,
    head_dim: int | None = None,
    hidden_size: int | None = None,
    intermediate_size: int | None = None,
    vocab: int | None = None,
    max_position_embeddings: int | None = None,
    dtype: str | None = None,
) -> Path:
    """Generate a tiny random Llama at `out` (returns at once when it is already there, same shape)."""
    require_engine()
    args = [str(ENGINE_PYTHON), str(MAKE_TINY_MODEL), "--out", str(out)]
    for flag, value in (
        ("--layers", layers),
        ("--heads", heads),
        ("--kv-heads", kv_heads),
        ("--head-dim", head_dim),
        ("--hidden-size", hidden_size),
        ("--intermediate-size", intermediate_size),
        ("--vocab", vocab),
        ("--max-position-embeddings", max_position_embeddings),
        ("--dtype", dtype),
    ):
        if value is not None:
            args += [flag, str(value)]
    done = subprocess.run(args, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(f"make_tiny_model.py failed ({done.returncode}):\n{done.stdout}\n{done.stderr}", pytrace=False)
    return out


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def engine_env(overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """The child's environment: the test process's, minus knobs that skew the engine, plus ENGINE_ENV."""
    env = {k: v for k, v in os.environ.items() if k not in ENGINE_ENV_DROPPED}
    env.update(ENGINE_ENV)
    env.update(overrides or {})
    return env


def serve_argv(
    model: Path | str,
    port: int,
    *extra: str,
    host: str = "127.0.0.1",
    flags: Sequence[str] = TINY_FLAGS,
) -> list[str]:
    """`vllm serve` for a tiny model on CPU: the measured flag set, then `extra` (later flags win)."""
    return [str(VLLM_BIN), "serve", str(model), "--host", host, "--port", str(port), *flags, *extra]


def start_ready_engine(argv: list[str], port: int, timeout: float = BOOT_TIMEOUT, env: Mapping[str, str] | None = None) -> Engine:
    """Start an engine and wait until it is ready; fail the test with its last lines otherwise."""
    engine = Engine(argv, engine_env(env), "127.0.0.1", port, tail_lines=2000)
    engine.start()
    state = engine.wait_ready(timeout)
    if state != "ready":
        engine.stop(STOP_GRACE)
        pytest.fail(
            f"the tiny engine did not become ready ({state}, exit {engine.returncode}):\n{engine.tail()}",
            pytrace=False,
        )
    return engine


def tiny_worker_env(model: Path | str, **overrides: str | None) -> dict[str, str]:
    """The worker's configuration for the tiny model on the real CPU engine, as a user would set it;
    `overrides` set variables (None removes one)."""
    env = {
        **ENGINE_ENV,
        "MODEL_NAME": str(model),
        "VLLM_COMMAND": f"{VLLM_BIN} serve",
        "VLLM_PORT": str(free_port()),
        "ENFORCE_EAGER": "true",
        "MAX_MODEL_LEN": "512",
        "KV_CACHE_MEMORY_BYTES": str(TINY_KV_CACHE_BYTES),
        "DTYPE": TINY_DTYPE,
        "MAX_CONCURRENCY": "4",
        "VLLM_STARTUP_TIMEOUT": str(int(BOOT_TIMEOUT)),
    }
    return apply_overrides(env, overrides)


def parameter_count(safetensors: Path) -> int:
    """The parameters a safetensors file holds (its header's shapes), for a Hub stand-in's safetensors counts."""
    import json
    import math
    import struct

    data = safetensors.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    return sum(math.prod(t["shape"]) for name, t in header.items() if name != "__metadata__")
