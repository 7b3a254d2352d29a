"""The launch configuration, parsed once: the user's variables as typed values, and a ladder step's overrides.

Every module that decides something about a launch (the pre-flight and the model cache, the
capacity plan, the memory wait, the ladder, the messages of `diagnosis`, the restarts of
`monitor`) reads these typed fields; none of them parses an environment string again, so
"0 means unset", "true/1/yes/on", "REVISION is MODEL_REVISION" and "a flag in VLLM_EXTRA_ARGS
wins" are decided here once. `args_builder` renders the same launch configuration
(`LaunchProfile.env`) into `vllm serve` flags.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from vllm_worker.config import env as envs
from vllm_worker.config.args_builder import ALIASES, FLAGS, LEGACY_ALIASES, LONG_ALIASES, OPTIONS, SHORT_OPTIONS
from vllm_worker.config.env import parse_human_int
from vllm_worker.config.settings import multiple_of_8_at_least

DEFAULT_MAX_CONCURRENCY = 30
EXTRA_ARGS_NAME = envs.EXTRA_ARGS
CPU_KV_SPACE = "VLLM_CPU_KVCACHE_SPACE"
_OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
# vLLM 0.32's default --gpu-memory-utilization (vllm/config/cache.py).
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92
TOKEN_VARIABLES = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
CONFIG_FILE_VARIABLES = ("VLLM_CONFIG_FILE", "MODEL_CONFIG")

env_value = envs.value


def env_bool(env: Mapping[str, str], name: str) -> bool | None:
    """True/False for a boolean variable; None when unset, blank or unreadable."""
    return envs.bool_word(env.get(name))


def _whole(text: str | None) -> int | None:
    """A whole number; None when unset, unreadable or 0 (0 means unset)."""
    if text is None:
        return None
    try:
        number = int(text)
    except ValueError:
        return None
    return number if number != 0 else None


def env_int(env: Mapping[str, str], name: str) -> int | None:
    """A whole-number variable; None when unset, blank, unreadable or 0 (0 means unset)."""
    return _whole(env_value(env, name))


# --- VLLM_EXTRA_ARGS and vLLM's second spellings, folded once ---------------------------------

_NAME_OF_FLAG = {option["flag"]: name for name, option in OPTIONS.items()}
_SWITCHES = frozenset(name for name, kind in FLAGS.items() if kind in ("pair", "store_true"))


def _extra_args_values(words: list[str]) -> list[tuple[str, str]]:
    """(table name, value) for each flag in VLLM_EXTRA_ARGS vLLM's parser knows, in order."""
    found: list[tuple[str, str]] = []
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if word.startswith("--"):
            flag, eq, inline = word.partition("=")
            flag = "--" + flag[2:].replace("_", "-")
        elif word in SHORT_OPTIONS:
            flag, eq, inline = word, "", ""
        else:
            continue
        negated = flag.startswith("--no-") and "--" + flag[5:] in _NAME_OF_FLAG
        flag = LONG_ALIASES.get(flag, flag)
        flag = SHORT_OPTIONS.get(flag, flag)
        name = _NAME_OF_FLAG.get("--" + flag[5:] if negated else flag)
        if name is None:
            continue
        if name in _SWITCHES:
            found.append((name, "false" if negated else (inline if eq else "true")))
        elif eq:
            found.append((name, inline))
        elif i < len(words):
            found.append((name, words[i]))
            i += 1
    return found


def fold(env: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """The launch values under vLLM's table names, and the variable that set each.

    Every non-blank variable is kept as written; vLLM's other spellings (REVISION for
    MODEL_REVISION, TOKENIZER for TOKENIZER_NAME, --device-memory-utilization) and the legacy
    names fill the table name when it is unset; flags in VLLM_EXTRA_ARGS come last on vLLM's
    command line, so they win.
    """
    values = {name: value for name in env if (value := env_value(env, name)) is not None}
    sources = {name: name for name in values}
    for alias, name in (*ALIASES.items(), *LEGACY_ALIASES.items()):
        if alias in values and name not in sources:
            values[name], sources[name] = values[alias], alias
    words = envs.shell_words(values.get(EXTRA_ARGS_NAME, "")) or []
    for name, value in _extra_args_values(words):
        values[name], sources[name] = value, EXTRA_ARGS_NAME
    return values, sources


def canonical(name: str) -> str:
    """The table name of a variable: `MODEL_REVISION` -> `REVISION`."""
    return ALIASES.get(name) or LEGACY_ALIASES.get(name) or name


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
    words = _extra_words(env)
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


def _extra_words(env: Mapping[str, str]) -> list[str]:
    """VLLM_EXTRA_ARGS as words; with unbalanced quotes, split on blanks (args_builder refuses it)."""
    raw = env_value(env, EXTRA_ARGS_NAME) or ""
    words = envs.shell_words(raw)
    return words if words is not None else raw.split()


def apply_overrides(env: Mapping[str, str], overrides: Mapping[str, str | None]) -> dict[str, str]:
    """The launch configuration of a ladder profile: a value sets the variable, None removes it."""
    launch_env = dict(env)
    for key, value in overrides.items():
        if value is None:
            launch_env.pop(key, None)
        else:
            launch_env[key] = value
    return launch_env


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


@dataclass(frozen=True)
class LaunchProfile:
    """One launch configuration: `env` (the user's variables with the profile's overrides applied)
    and its typed knobs, read once. name: "as configured" or the ladder step ("max_num_seqs=32", "eager").

    `value(NAME)` is a knob as vLLM will see it, whichever spelling set it (MODEL_REVISION,
    REVISION or --revision in VLLM_EXTRA_ARGS); `variable(NAME)` names the one the user wrote,
    so a message can tell them what to change.
    """

    env: Mapping[str, str] = field(repr=False)
    values: Mapping[str, str] = field(repr=False)
    sources: Mapping[str, str]
    model: str | None
    baked_model_path: str | None
    revision: str | None
    tokenizer: str | None
    tokenizer_revision: str | None
    hf_token: str | None = field(repr=False)
    hf_endpoint: str | None
    max_concurrency: int
    max_num_seqs: int | None  # as set (0 and unset are None): the worker then passes its own default
    max_num_batched_tokens: int | None  # as set; None: vLLM's default
    max_model_len: str | None  # as written: a number, "8k", "auto" or -1
    enforce_eager: bool | None
    gpu_memory_utilization: float | None
    kv_cache_dtype: str
    tensor_parallel_size: int
    pipeline_parallel_size: int
    data_parallel_size: int
    trust_remote_code: bool | None
    kv_cache: KvCacheSize | None  # the size fixed for a GPU engine
    kv_cache_cpu: KvCacheSize | None  # the size fixed for the CPU engine (VLLM_CPU_KVCACHE_SPACE wins there)
    extra_args_flags: frozenset[str]  # flags given in VLLM_EXTRA_ARGS, without their dashes
    offline: str | None  # HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE when one is true
    modelscope: bool  # VLLM_USE_MODELSCOPE: the model comes from ModelScope, not the Hub
    config_file: str | None  # the variable that passes vLLM a config file, when one does
    name: str = "as configured"
    overrides: Mapping[str, str | None] = field(default_factory=dict)

    @classmethod
    def parse(
        cls,
        env: Mapping[str, str],
        name: str = "as configured",
        overrides: Mapping[str, str | None] | None = None,
    ) -> "LaunchProfile":
        values, sources = fold(env)
        concurrency = _whole(values.get("MAX_CONCURRENCY"))
        return cls(
            env=dict(env),
            values=values,
            sources=sources,
            model=values.get("MODEL_NAME"),
            baked_model_path=values.get("BAKED_MODEL_PATH"),
            revision=values.get("REVISION"),
            tokenizer=values.get("TOKENIZER"),
            tokenizer_revision=values.get("TOKENIZER_REVISION"),
            hf_token=next((values[v] for v in TOKEN_VARIABLES if v in values), None),
            hf_endpoint=values.get("HF_ENDPOINT"),
            max_concurrency=concurrency if concurrency is not None and concurrency > 0 else DEFAULT_MAX_CONCURRENCY,
            max_num_seqs=_whole(values.get("MAX_NUM_SEQS")),
            max_num_batched_tokens=_whole(values.get("MAX_NUM_BATCHED_TOKENS")),
            max_model_len=values.get("MAX_MODEL_LEN"),
            enforce_eager=envs.bool_word(values.get("ENFORCE_EAGER")),
            gpu_memory_utilization=_float(values.get("GPU_MEMORY_UTILIZATION")),
            kv_cache_dtype=values.get("KV_CACHE_DTYPE", "auto").lower(),
            tensor_parallel_size=max(_whole(values.get("TENSOR_PARALLEL_SIZE")) or 1, 1),
            pipeline_parallel_size=max(_whole(values.get("PIPELINE_PARALLEL_SIZE")) or 1, 1),
            data_parallel_size=max(_whole(values.get("DATA_PARALLEL_SIZE")) or 1, 1),
            trust_remote_code=envs.bool_word(values.get("TRUST_REMOTE_CODE")),
            kv_cache=explicit_kv_cache_size(env),
            kv_cache_cpu=explicit_kv_cache_size(env, cpu=True),
            extra_args_flags=frozenset(
                w[2:].split("=", 1)[0].replace("_", "-") for w in _extra_words(env) if w.startswith("--")
            ),
            offline=next((v for v in _OFFLINE_VARIABLES if envs.bool_word(values.get(v)) is True), None),
            modelscope=envs.bool_word(values.get("VLLM_USE_MODELSCOPE")) is True,
            config_file=next((v for v in CONFIG_FILE_VARIABLES if v in values), None),
            name=name,
            overrides=dict(overrides or {}),
        )

    def value(self, name: str) -> str | None:
        """A knob as vLLM will see it, by any of its spellings; None when unset."""
        return self.values.get(canonical(name))

    def raw(self, name: str) -> str | None:
        """One variable exactly as the user set it (stripped; None when unset or blank), no spelling folded."""
        return env_value(self.env, name)

    @property
    def token_set(self) -> bool:
        return self.hf_token is not None

    def variable(self, name: str) -> str | None:
        """The variable the user set for a knob (`REVISION` -> `MODEL_REVISION`); None when unset."""
        return self.sources.get(canonical(name))

    def with_overrides(self, name: str, overrides: Mapping[str, str | None]) -> "LaunchProfile":
        """The profile a ladder step launches: its overrides applied to this profile's variables."""
        return LaunchProfile.parse(apply_overrides(self.env, overrides), name, overrides)

    @property
    def utilization(self) -> float:
        """The share of the card vLLM may use: GPU_MEMORY_UTILIZATION, else vLLM's default."""
        return self.gpu_memory_utilization if self.gpu_memory_utilization is not None else DEFAULT_GPU_MEMORY_UTILIZATION

    @property
    def served_model(self) -> str | None:
        """The model vLLM loads: the baked folder when there is one, else MODEL_NAME."""
        return self.baked_model_path or self.model

    def effective_max_num_seqs(self, max_concurrency: int | None = None) -> int:
        """MAX_NUM_SEQS the engine runs with: the variable, else the worker's default for the concurrency."""
        if self.max_num_seqs is not None:
            return self.max_num_seqs
        return multiple_of_8_at_least(max_concurrency if max_concurrency is not None else self.max_concurrency)

    def kv_cache_for(self, cpu: bool) -> KvCacheSize | None:
        return self.kv_cache_cpu if cpu else self.kv_cache
