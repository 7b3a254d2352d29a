"""The launch configuration, parsed once: the user's variables as typed values, and a ladder step's overrides.

Every module that decides something about a launch (the messages of `startup_errors` and
`shortfall`, the ladder of `recovery`, the restarts of `monitor`) reads these typed fields;
none of them parses an environment string again, so "0 means unset", "true/1/yes/on" and
"a KV cache size in VLLM_EXTRA_ARGS wins" are decided here once. `args_builder` renders the
same launch configuration (`LaunchProfile.env`) into `vllm serve` flags.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Mapping

from vllm_worker.config.args_builder import ArgsError, parse_bool
from vllm_worker.config.settings import multiple_of_8_at_least

DEFAULT_MAX_CONCURRENCY = 30
EXTRA_ARGS_NAME = "VLLM_EXTRA_ARGS"
CPU_KV_SPACE = "VLLM_CPU_KVCACHE_SPACE"
_OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def env_value(env: Mapping[str, str], name: str) -> str | None:
    """A variable's value, None when unset or blank."""
    value = env.get(name)
    if value is None or value.strip() == "":
        return None
    return value.strip()


def env_bool(env: Mapping[str, str], name: str) -> bool | None:
    """True/False for a boolean variable; None when unset, blank or unreadable."""
    try:
        return parse_bool(name, env.get(name))
    except ArgsError:
        return None


def env_int(env: Mapping[str, str], name: str) -> int | None:
    """A whole-number variable; None when unset, blank, unreadable or 0 (0 means unset)."""
    value = env_value(env, name)
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        return None
    return number if number != 0 else None


_GIB = 2**30
_KV_SIZE_FLAGS = ("--kv-cache-memory-bytes", "--kv-cache-memory")


@dataclass(frozen=True)
class KvCacheSize:
    """A KV cache size the user fixed: vLLM uses it as is, so no batch, graph or utilization
    setting changes how many tokens the cache holds.

    variable: KV_CACHE_MEMORY_BYTES, VLLM_EXTRA_ARGS (its --kv-cache-memory-bytes) or, on the CPU
    engine, VLLM_CPU_KVCACHE_SPACE (GiB; vLLM lets it win over the flag). value: as written;
    None when only vLLM's log said the size was explicit. size_bytes: None when unreadable.
    """

    variable: str
    value: str | None
    size_bytes: int | None

    @property
    def setting(self) -> str:
        if self.value is None:
            return self.variable
        if self.variable == EXTRA_ARGS_NAME:
            return f"{self.value} in {EXTRA_ARGS_NAME}"
        return f"{self.variable}={self.value}"

    @property
    def raise_fix(self) -> str:
        if self.variable == EXTRA_ARGS_NAME:
            return f"raise the {self.value} in {EXTRA_ARGS_NAME}"
        now = f" (now {self.value})" if self.value is not None else ""
        return f"raise {self.variable}{now}"


def parse_human_int(text: str) -> int:
    """vLLM's human_readable_int (utils/argparse_utils.py): '1k' = 1000, '1K' = 1024."""
    value = text.strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if m:
        number, suffix = m.groups()
        if suffix.islower():
            return int(float(number) * 10 ** (3 * ("kmgt".index(suffix) + 1)))
        return int(number) * 2 ** (10 * ("KMGT".index(suffix) + 1))
    return int(value)


def _parse_bytes(text: str) -> int | None:
    try:
        return parse_human_int(text)
    except ValueError:
        return None


def explicit_kv_cache_size(env: Mapping[str, str], cpu: bool = False) -> KvCacheSize | None:
    """The KV cache size the launch fixed, if any (the last one vLLM reads wins)."""
    if cpu:
        space = env_value(env, CPU_KV_SPACE)
        if space is not None:
            return KvCacheSize(CPU_KV_SPACE, space, int(space) * _GIB if space.isdigit() else None)
    extra = env_value(env, EXTRA_ARGS_NAME)
    if extra is not None:
        try:
            words = shlex.split(extra)
        except ValueError:
            words = extra.split()
        found: tuple[str, str] | None = None
        for i, word in enumerate(words):
            flag, eq, value = word.partition("=")
            if flag.replace("_", "-") in _KV_SIZE_FLAGS:
                if not eq:
                    value = words[i + 1] if i + 1 < len(words) else ""
                found = (flag, value)
        if found is not None:
            return KvCacheSize(EXTRA_ARGS_NAME, f"{found[0]} {found[1]}", _parse_bytes(found[1]))
    value = env_value(env, "KV_CACHE_MEMORY_BYTES")
    if value is not None:
        return KvCacheSize("KV_CACHE_MEMORY_BYTES", value, _parse_bytes(value))
    return None


def max_concurrency_of(env: Mapping[str, str]) -> int:
    """MAX_CONCURRENCY as the worker reads it (settings validated it before any launch)."""
    value = env_int(env, "MAX_CONCURRENCY")
    return value if value is not None and value > 0 else DEFAULT_MAX_CONCURRENCY


def effective_max_num_seqs(env: Mapping[str, str], max_concurrency: int) -> int:
    """MAX_NUM_SEQS the engine ran with: the variable, else the worker's default."""
    value = env_int(env, "MAX_NUM_SEQS")
    return value if value is not None else multiple_of_8_at_least(max_concurrency)


def apply_overrides(env: Mapping[str, str], overrides: Mapping[str, str | None]) -> dict[str, str]:
    """The launch configuration of a ladder profile: a value sets the variable, None removes it."""
    launch_env = dict(env)
    for key, value in overrides.items():
        if value is None:
            launch_env.pop(key, None)
        else:
            launch_env[key] = value
    return launch_env


def _float(env: Mapping[str, str], name: str) -> float | None:
    value = env_value(env, name)
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _extra_args_flags(env: Mapping[str, str]) -> frozenset[str]:
    raw = env_value(env, EXTRA_ARGS_NAME)
    if raw is None:
        return frozenset()
    try:
        words = shlex.split(raw)
    except ValueError:
        words = raw.split()
    return frozenset(word[2:].split("=", 1)[0].replace("_", "-") for word in words if word.startswith("--"))


@dataclass(frozen=True)
class LaunchProfile:
    """One launch configuration: `env` (the user's variables with the profile's overrides applied)
    and its typed knobs. name: "as configured" or the ladder step ("max_num_seqs=32", "eager")."""

    env: Mapping[str, str]
    max_concurrency: int
    max_num_seqs: int | None  # as set (0 and unset are None): the worker then passes its own default
    max_num_batched_tokens: int | None  # as set; None: vLLM's default
    enforce_eager: bool | None
    gpu_memory_utilization: float | None
    kv_cache_dtype: str
    tensor_parallel_size: int
    trust_remote_code: bool | None
    kv_cache: KvCacheSize | None  # the size fixed for a GPU engine
    kv_cache_cpu: KvCacheSize | None  # the size fixed for the CPU engine (VLLM_CPU_KVCACHE_SPACE wins there)
    extra_args_flags: frozenset[str]  # flags given in VLLM_EXTRA_ARGS, without their dashes
    offline: str | None  # HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE when one is true
    name: str = "as configured"
    overrides: Mapping[str, str | None] = field(default_factory=dict)

    @classmethod
    def parse(
        cls,
        env: Mapping[str, str],
        name: str = "as configured",
        overrides: Mapping[str, str | None] | None = None,
    ) -> "LaunchProfile":
        return cls(
            env=dict(env),
            max_concurrency=max_concurrency_of(env),
            max_num_seqs=env_int(env, "MAX_NUM_SEQS"),
            max_num_batched_tokens=env_int(env, "MAX_NUM_BATCHED_TOKENS"),
            enforce_eager=env_bool(env, "ENFORCE_EAGER"),
            gpu_memory_utilization=_float(env, "GPU_MEMORY_UTILIZATION"),
            kv_cache_dtype=(env_value(env, "KV_CACHE_DTYPE") or "auto").lower(),
            tensor_parallel_size=env_int(env, "TENSOR_PARALLEL_SIZE") or 1,
            trust_remote_code=env_bool(env, "TRUST_REMOTE_CODE"),
            kv_cache=explicit_kv_cache_size(env),
            kv_cache_cpu=explicit_kv_cache_size(env, cpu=True),
            extra_args_flags=_extra_args_flags(env),
            offline=next((v for v in _OFFLINE_VARIABLES if env_bool(env, v) is True), None),
            name=name,
            overrides=dict(overrides or {}),
        )

    def effective_max_num_seqs(self, max_concurrency: int | None = None) -> int:
        """MAX_NUM_SEQS the engine runs with: the variable, else the worker's default for the concurrency."""
        if self.max_num_seqs is not None:
            return self.max_num_seqs
        return multiple_of_8_at_least(max_concurrency if max_concurrency is not None else self.max_concurrency)

    def kv_cache_for(self, cpu: bool) -> KvCacheSize | None:
        return self.kv_cache_cpu if cpu else self.kv_cache
