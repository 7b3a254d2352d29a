"""The engine's environment, decided in one place beside its argv.

The engine is given the user's variables less the worker's own and the platform's, plus the
folders of its compile caches when a network volume keeps them. The worker's own must not
reach it: vLLM warns about every VLLM_* name it does not know ("Unknown vLLM environment
variable detected: VLLM_COMMAND"), and VLLM_PORT, the worker's loopback port, is also vLLM's
own variable for the base of its internal ports. The platform's RUNPOD_* variables (its
credentials and job-queue URLs among them) are the worker's business. HF_TOKEN stays: the
engine downloads with it (and it is never logged: secrets.mask).

The caches: vLLM 0.32 keeps its torch.compile artifacts under VLLM_CACHE_ROOT (its AOT
artifact and, per compiled hash, the Inductor and Triton caches it points
TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR at while compiling: compilation/decorators.py,
compiler_interface.py); FlashInfer's autotune results default under it too. Compiles vLLM
does not route there use torch's own variables, whose defaults (/tmp/torchinductor_<user>,
~/.triton/cache) die with the container. A variable the user set is left as it is.
"""

from __future__ import annotations

from typing import Mapping

from vllm_worker.config.env import value
from vllm_worker.config.settings import DOCUMENTED

# Variable -> its folder under the cache root on the volume.
CACHE_FOLDERS: dict[str, str] = {
    "VLLM_CACHE_ROOT": "vllm",
    "TORCHINDUCTOR_CACHE_DIR": "torchinductor",
    "TRITON_CACHE_DIR": "triton",
}

# The worker's own variables that are nobody else's: its settings and the two it reads beside the
# flags. MODEL_NAME, HF_TOKEN and the flag variables stay: harmless or needed.
WORKER_OWN: frozenset[str] = frozenset(DOCUMENTED) | {"VLLM_EXTRA_ARGS", "VLLM_CONFIG_FILE"}
PLATFORM_PREFIX = "RUNPOD_"


def cache_variables(root: str, env: Mapping[str, str]) -> dict[str, str]:
    """The cache variables to give the engine for a cache root; those the user set are left out."""
    return {
        name: f"{root.rstrip('/')}/{folder}"
        for name, folder in CACHE_FOLDERS.items()
        if value(env, name) is None
    }


def vllm_cache_root(root: str, env: Mapping[str, str]) -> str:
    """Where vLLM keeps its compile cache: the user's VLLM_CACHE_ROOT, else its folder under `root`."""
    return value(env, "VLLM_CACHE_ROOT") or f"{root.rstrip('/')}/{CACHE_FOLDERS['VLLM_CACHE_ROOT']}"


def engine_environment(env: Mapping[str, str], caches: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment the engine starts with: the launch configuration less the worker's and the
    platform's variables, plus `caches` (from `cache_variables`)."""
    kept = {
        name: text
        for name, text in env.items()
        if name not in WORKER_OWN and not name.startswith(PLATFORM_PREFIX)
    }
    kept.update(caches or {})
    return kept
