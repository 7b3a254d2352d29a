"""Turn the worker's environment into the `vllm serve` command line.

Users configure vLLM only through environment variables, so each supported flag
is listed here under the UPPER_SNAKE form of its vLLM 0.32 name, with how the
flag is spelled on the command line (its *kind*). The table is hand-written on
purpose: a generic "any variable that looks like a flag" scan would pass stray
platform variables to vLLM and put HF_TOKEN on a command line that is logged.
`tests/engine/test_flag_table.py` checks every entry against vLLM 0.32's real
parser, so a renamed or removed flag fails a test instead of a user's startup.

Variables that older workers accepted but vLLM 0.32 no longer knows are kept as
kind "removed": they are dropped with a warning that names the replacement,
because `unrecognized arguments` at startup would take the endpoint down for a
stale template default.

The worker sizes vLLM for its own concurrency: when MAX_NUM_SEQS is unset it
passes the smallest multiple of 8 that is >= MAX_CONCURRENCY, because vLLM's own
default (256, or 1024 on 70 GiB+ cards) costs minutes of CUDA-graph capture and
activation memory for batch sizes the worker never sends.

HF_TOKEN reaches vLLM only through the child's environment (huggingface_hub
reads it there); `mask()` keeps it and any other secret out of logged commands.

`build_args` is pure: it returns warnings instead of logging them.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass, field
from typing import Iterable, Literal, Mapping, Sequence

from vllm_worker.settings import Settings, multiple_of_8_at_least

Kind = Literal["value", "list", "pair", "store_true", "removed"]
# value:      `--flag VALUE`
# list:       `--flag V1 V2 ...` (nargs="+"): the variable is split like shell words,
#             unless it starts with '{' or '[' (one JSON argument)
# pair:       argparse BooleanOptionalAction: true -> `--flag`, false -> `--no-flag`
# store_true: true -> `--flag`, false -> nothing
# removed:    gone from vLLM 0.32: warn and drop (see REMOVED_NOTES)

# Grouped as vLLM 0.32 groups them in `vllm serve --help`; argv follows this order.
FLAGS: dict[str, Kind] = {
    # ModelConfig
    "RUNNER": "value",
    "CONVERT": "value",
    "TOKENIZER": "value",
    "TOKENIZER_MODE": "value",
    "TRUST_REMOTE_CODE": "pair",
    "DTYPE": "value",
    "SEED": "value",
    "HF_CONFIG_PATH": "value",
    "ALLOWED_LOCAL_MEDIA_PATH": "value",
    "ALLOWED_MEDIA_DOMAINS": "list",
    "REVISION": "value",
    "CODE_REVISION": "value",
    "TOKENIZER_REVISION": "value",
    "MAX_MODEL_LEN": "value",
    "QUANTIZATION": "value",
    "QUANTIZATION_CONFIG": "value",
    "ALLOW_DEPRECATED_QUANTIZATION": "pair",
    "ENFORCE_EAGER": "pair",
    "MAX_LOGPROBS": "value",
    "LOGPROBS_MODE": "value",
    "DISABLE_SLIDING_WINDOW": "pair",
    "DISABLE_CASCADE_ATTN": "pair",
    "SKIP_TOKENIZER_INIT": "pair",
    "ENABLE_PROMPT_EMBEDS": "pair",
    "SERVED_MODEL_NAME": "list",
    "CONFIG_FORMAT": "value",
    "HF_OVERRIDES": "value",
    "POOLER_CONFIG": "value",
    "GENERATION_CONFIG": "value",
    "OVERRIDE_GENERATION_CONFIG": "value",
    "MODEL_IMPL": "value",
    "LOGITS_PROCESSORS": "list",
    # LoadConfig
    "LOAD_FORMAT": "value",
    "DOWNLOAD_DIR": "value",
    "SAFETENSORS_LOAD_STRATEGY": "value",
    "MODEL_LOADER_EXTRA_CONFIG": "value",
    "IGNORE_PATTERNS": "list",
    "USE_TQDM_ON_LOAD": "pair",
    # AttentionConfig
    "ATTENTION_BACKEND": "value",
    # StructuredOutputsConfig / reasoning
    "REASONING_PARSER": "value",
    "REASONING_PARSER_PLUGIN": "value",
    "STRUCTURED_OUTPUTS_CONFIG": "value",
    # ParallelConfig
    "DISTRIBUTED_EXECUTOR_BACKEND": "value",
    "PIPELINE_PARALLEL_SIZE": "value",
    "TENSOR_PARALLEL_SIZE": "value",
    "DATA_PARALLEL_SIZE": "value",
    "ENABLE_EXPERT_PARALLEL": "pair",
    "ENABLE_EPLB": "pair",
    "EPLB_CONFIG": "value",
    "MAX_PARALLEL_LOADING_WORKERS": "value",
    "DISABLE_CUSTOM_ALL_REDUCE": "pair",
    # CacheConfig
    "BLOCK_SIZE": "value",
    "GPU_MEMORY_UTILIZATION": "value",
    "KV_CACHE_MEMORY_BYTES": "value",
    "KV_CACHE_DTYPE": "value",
    "NUM_GPU_BLOCKS_OVERRIDE": "value",
    "ENABLE_PREFIX_CACHING": "pair",
    "PREFIX_CACHING_HASH_ALGO": "value",
    "KV_OFFLOADING_SIZE": "value",
    "KV_OFFLOADING_BACKEND": "value",
    # OffloadConfig
    "CPU_OFFLOAD_GB": "value",
    # MultiModalConfig
    "LANGUAGE_MODEL_ONLY": "pair",
    "LIMIT_MM_PER_PROMPT": "value",
    "MEDIA_IO_KWARGS": "value",
    "MM_PROCESSOR_KWARGS": "value",
    "MM_PROCESSOR_CACHE_GB": "value",
    "MM_ENCODER_TP_MODE": "value",
    "SKIP_MM_PROFILING": "pair",
    # LoRAConfig
    "ENABLE_LORA": "pair",
    "MAX_LORAS": "value",
    "MAX_LORA_RANK": "value",
    "LORA_DTYPE": "value",
    "MAX_CPU_LORAS": "value",
    "FULLY_SHARDED_LORAS": "pair",
    "DEFAULT_MM_LORAS": "value",
    # ObservabilityConfig
    "OTLP_TRACES_ENDPOINT": "value",
    # SchedulerConfig
    "MAX_NUM_BATCHED_TOKENS": "value",
    "MAX_NUM_SEQS": "value",
    "LONG_PREFILL_TOKEN_THRESHOLD": "value",
    "SCHEDULING_POLICY": "value",
    "ENABLE_CHUNKED_PREFILL": "pair",
    "DISABLE_HYBRID_KV_CACHE_MANAGER": "pair",
    "ASYNC_SCHEDULING": "pair",
    "STREAM_INTERVAL": "value",
    # CompilationConfig
    "COMPILATION_CONFIG": "value",
    "CUDAGRAPH_CAPTURE_SIZES": "list",
    "MAX_CUDAGRAPH_CAPTURE_SIZE": "value",
    "OPTIMIZATION_LEVEL": "value",
    # SpeculativeConfig
    "SPECULATIVE_CONFIG": "value",
    "SPEC_METHOD": "value",
    "SPEC_MODEL": "value",
    "SPEC_TOKENS": "value",
    # VllmConfig / AsyncEngineArgs
    "DISABLE_LOG_STATS": "store_true",
    "ENABLE_LOG_REQUESTS": "pair",
    # Frontend
    "LORA_MODULES": "list",
    "CHAT_TEMPLATE": "value",
    "CHAT_TEMPLATE_CONTENT_FORMAT": "value",
    "TRUST_REQUEST_CHAT_TEMPLATE": "pair",
    "DEFAULT_CHAT_TEMPLATE_KWARGS": "value",
    "RESPONSE_ROLE": "value",
    "RETURN_TOKENS_AS_TOKEN_IDS": "pair",
    "ENABLE_AUTO_TOOL_CHOICE": "pair",
    "EXCLUDE_TOOLS_WHEN_TOOL_CHOICE_NONE": "pair",
    "TOOL_CALL_PARSER": "value",
    "TOOL_PARSER_PLUGIN": "value",
    "MAX_LOG_LEN": "value",
    "ENABLE_PROMPT_TOKENS_DETAILS": "pair",
    "ENABLE_FORCE_INCLUDE_USAGE": "pair",
    "ENABLE_LOG_OUTPUTS": "pair",
    "UVICORN_LOG_LEVEL": "value",
    "DISABLE_UVICORN_ACCESS_LOG": "pair",
    # Removed upstream: set by templates of older workers.
    "DISABLE_LOG_REQUESTS": "removed",
    "SWAP_SPACE": "removed",
    "PREEMPTION_MODE": "removed",
    "USE_V2_BLOCK_MANAGER": "removed",
    "NUM_SCHEDULER_STEPS": "removed",
    "SCHEDULER_DELAY_FACTOR": "removed",
    "MAX_NUM_PARTIAL_PREFILLS": "removed",
    "MAX_LONG_PARTIAL_PREFILLS": "removed",
    "MAX_SEQ_LEN_TO_CAPTURE": "removed",
    "MAX_CONTEXT_LEN_TO_CAPTURE": "removed",
    "CUDA_GRAPH_SIZES": "removed",
    "DISABLE_FRONTEND_MULTIPROCESSING": "removed",
    "WORKER_USE_RAY": "removed",
    "TOKENIZER_POOL_SIZE": "removed",
    "TOKENIZER_POOL_TYPE": "removed",
    "TOKENIZER_POOL_EXTRA_CONFIG": "removed",
    "ROPE_SCALING": "removed",
    "ROPE_THETA": "removed",
    "QUANTIZATION_PARAM_PATH": "removed",
    "CALCULATE_KV_SCALES": "removed",
    "OVERRIDE_ATTENTION_DTYPE": "removed",
    "TASK": "removed",
    "OVERRIDE_POOLER_CONFIG": "removed",
    "GUIDED_DECODING_BACKEND": "removed",
    "GUIDED_DECODING_DISABLE_FALLBACK": "removed",
    "GUIDED_DECODING_DISABLE_ANY_WHITESPACE": "removed",
    "GUIDED_DECODING_DISABLE_ADDITIONAL_PROPERTIES": "removed",
    "LOGITS_PROCESSOR_PATTERN": "removed",
    "DISABLE_MM_PREPROCESSOR_CACHE": "removed",
    "ENABLE_MULTIMODAL_ENCODER_DATA_PARALLEL": "removed",
    "ENABLE_PROMPT_ADAPTER": "removed",
    "MAX_PROMPT_ADAPTERS": "removed",
    "MAX_PROMPT_ADAPTER_TOKEN": "removed",
    "ENABLE_LORA_BIAS": "removed",
    "LORA_EXTRA_VOCAB_SIZE": "removed",
    "LONG_LORA_SCALING_FACTORS": "removed",
    "QLORA_ADAPTER_NAME_OR_PATH": "removed",
    "NUM_LOOKAHEAD_SLOTS": "removed",
    "SPECULATIVE_MODEL": "removed",
    "NUM_SPECULATIVE_TOKENS": "removed",
    "SPECULATIVE_DRAFT_TENSOR_PARALLEL_SIZE": "removed",
    "SPECULATIVE_MAX_MODEL_LEN": "removed",
    "SPECULATIVE_DISABLE_BY_BATCH_SIZE": "removed",
    "NGRAM_PROMPT_LOOKUP_MAX": "removed",
    "NGRAM_PROMPT_LOOKUP_MIN": "removed",
    "SPEC_DECODING_ACCEPTANCE_METHOD": "removed",
    "TYPICAL_ACCEPTANCE_SAMPLER_POSTERIOR_THRESHOLD": "removed",
    "TYPICAL_ACCEPTANCE_SAMPLER_POSTERIOR_ALPHA": "removed",
    "DISABLE_LOGPROBS_DURING_SPEC_DECODING": "removed",
    "NUM_REDUNDANT_EXPERTS": "removed",
    "EPLB_WINDOW_SIZE": "removed",
    "EPLB_STEP_INTERVAL": "removed",
    "EPLB_LOG_BALANCEDNESS": "removed",
}

_SPEC = "set it inside SPECULATIVE_CONFIG (or use SPEC_METHOD, SPEC_MODEL and SPEC_TOKENS)"
_STRUCTURED = "set it inside STRUCTURED_OUTPUTS_CONFIG, e.g. '{\"backend\": \"xgrammar\"}'"
_EPLB = "set it inside EPLB_CONFIG"
_NONE = "vLLM 0.32 has no replacement"

# What the warning for a removed variable tells the user to do instead.
REMOVED_NOTES: dict[str, str] = {
    "DISABLE_LOG_REQUESTS": "vLLM 0.32 logs no requests unless ENABLE_LOG_REQUESTS=true",
    "SWAP_SPACE": "vLLM 0.32 does not swap to CPU memory; CPU KV-cache offloading is KV_OFFLOADING_SIZE",
    "PREEMPTION_MODE": "vLLM 0.32 always preempts by recomputation",
    "USE_V2_BLOCK_MANAGER": "vLLM 0.32 has a single block manager",
    "NUM_SCHEDULER_STEPS": "multi-step scheduling is gone; ASYNC_SCHEDULING is its successor",
    "SCHEDULER_DELAY_FACTOR": _NONE,
    "MAX_NUM_PARTIAL_PREFILLS": _NONE,
    "MAX_LONG_PARTIAL_PREFILLS": _NONE,
    "MAX_SEQ_LEN_TO_CAPTURE": "CUDA graphs no longer depend on the sequence length; MAX_CUDAGRAPH_CAPTURE_SIZE bounds the batch size",
    "MAX_CONTEXT_LEN_TO_CAPTURE": "CUDA graphs no longer depend on the sequence length; MAX_CUDAGRAPH_CAPTURE_SIZE bounds the batch size",
    "CUDA_GRAPH_SIZES": "use CUDAGRAPH_CAPTURE_SIZES",
    "DISABLE_FRONTEND_MULTIPROCESSING": _NONE,
    "WORKER_USE_RAY": "use DISTRIBUTED_EXECUTOR_BACKEND=ray",
    "TOKENIZER_POOL_SIZE": _NONE,
    "TOKENIZER_POOL_TYPE": _NONE,
    "TOKENIZER_POOL_EXTRA_CONFIG": _NONE,
    "ROPE_SCALING": "pass it inside HF_OVERRIDES",
    "ROPE_THETA": "pass it inside HF_OVERRIDES",
    "QUANTIZATION_PARAM_PATH": "KV-cache scales are read from the checkpoint",
    "CALCULATE_KV_SCALES": _NONE,
    "OVERRIDE_ATTENTION_DTYPE": _NONE,
    "TASK": "use RUNNER (e.g. pooling) and CONVERT (e.g. embed)",
    "OVERRIDE_POOLER_CONFIG": "use POOLER_CONFIG",
    "GUIDED_DECODING_BACKEND": _STRUCTURED,
    "GUIDED_DECODING_DISABLE_FALLBACK": _STRUCTURED,
    "GUIDED_DECODING_DISABLE_ANY_WHITESPACE": _STRUCTURED,
    "GUIDED_DECODING_DISABLE_ADDITIONAL_PROPERTIES": _STRUCTURED,
    "LOGITS_PROCESSOR_PATTERN": "use LOGITS_PROCESSORS",
    "DISABLE_MM_PREPROCESSOR_CACHE": "use MM_PROCESSOR_CACHE_GB=0",
    "ENABLE_MULTIMODAL_ENCODER_DATA_PARALLEL": "use MM_ENCODER_TP_MODE=data",
    "ENABLE_PROMPT_ADAPTER": "prompt adapters are gone from vLLM",
    "MAX_PROMPT_ADAPTERS": "prompt adapters are gone from vLLM",
    "MAX_PROMPT_ADAPTER_TOKEN": "prompt adapters are gone from vLLM",
    "ENABLE_LORA_BIAS": _NONE,
    "LORA_EXTRA_VOCAB_SIZE": _NONE,
    "LONG_LORA_SCALING_FACTORS": _NONE,
    "QLORA_ADAPTER_NAME_OR_PATH": "use ENABLE_LORA=true and LORA_MODULES",
    "NUM_LOOKAHEAD_SLOTS": _SPEC,
    "SPECULATIVE_MODEL": _SPEC,
    "NUM_SPECULATIVE_TOKENS": _SPEC,
    "SPECULATIVE_DRAFT_TENSOR_PARALLEL_SIZE": _SPEC,
    "SPECULATIVE_MAX_MODEL_LEN": _SPEC,
    "SPECULATIVE_DISABLE_BY_BATCH_SIZE": _SPEC,
    "NGRAM_PROMPT_LOOKUP_MAX": _SPEC,
    "NGRAM_PROMPT_LOOKUP_MIN": _SPEC,
    "SPEC_DECODING_ACCEPTANCE_METHOD": _SPEC,
    "TYPICAL_ACCEPTANCE_SAMPLER_POSTERIOR_THRESHOLD": _SPEC,
    "TYPICAL_ACCEPTANCE_SAMPLER_POSTERIOR_ALPHA": _SPEC,
    "DISABLE_LOGPROBS_DURING_SPEC_DECODING": _SPEC,
    "NUM_REDUNDANT_EXPERTS": _EPLB,
    "EPLB_WINDOW_SIZE": _EPLB,
    "EPLB_STEP_INTERVAL": _EPLB,
    "EPLB_LOG_BALANCEDNESS": _EPLB,
}

# Worker-documented names for flags whose UPPER_SNAKE name is less obvious.
# Both spellings work; setting both to different values is an error.
ALIASES: dict[str, str] = {
    "MODEL_REVISION": "REVISION",
    "TOKENIZER_NAME": "TOKENIZER",
}

# Names from older workers: the current name wins, and using one draws a warning.
LEGACY_ALIASES: dict[str, str] = {
    "OPENAI_SERVED_MODEL_NAME_OVERRIDE": "SERVED_MODEL_NAME",
    "CUSTOM_CHAT_TEMPLATE": "CHAT_TEMPLATE",
}

# vLLM rejects 0 for these, and older workers documented 0 as "use the default"
# (templates still carry MAX_NUM_BATCHED_TOKENS=0), so 0 means "not set".
# Many other flags take a meaningful 0 (SEED, CPU_OFFLOAD_GB): keep this explicit.
ZERO_MEANS_UNSET: frozenset[str] = frozenset(
    {
        "MAX_NUM_BATCHED_TOKENS",
        "MAX_NUM_SEQS",
        "MAX_MODEL_LEN",
        "NUM_GPU_BLOCKS_OVERRIDE",
        "MAX_PARALLEL_LOADING_WORKERS",
        "MAX_CPU_LORAS",
    }
)

# Short spellings vLLM accepts for table flags, so VLLM_EXTRA_ARGS overrides are noticed.
SHORT_OPTIONS: dict[str, str] = {
    "-tp": "--tensor-parallel-size",
    "-pp": "--pipeline-parallel-size",
    "-dp": "--data-parallel-size",
    "-ep": "--enable-expert-parallel",
    "-q": "--quantization",
    "-sc": "--speculative-config",
    "-cc": "--compilation-config",
}

# Flags the worker owns: the engine must listen where the worker connects, and the
# model comes from MODEL_NAME. Anything else in VLLM_EXTRA_ARGS is the user's call.
RESERVED_IN_EXTRA_ARGS: dict[str, str] = {
    "--host": "the worker sets --host itself and connects only to 127.0.0.1",
    "--port": "the worker sets --port itself from VLLM_PORT",
    "--uds": "the worker connects to the engine over TCP on VLLM_PORT",
    "--model": "the worker passes the model from MODEL_NAME",
}

TRUE_WORDS = frozenset({"true", "1", "yes", "on"})
FALSE_WORDS = frozenset({"false", "0", "no", "off"})
BOOL_ACCEPTED = "use true or false (also 1/0, yes/no, on/off)"

BAKED_MODEL_PATH = "BAKED_MODEL_PATH"
EXTRA_ARGS = "VLLM_EXTRA_ARGS"
MASK = "***"


class ArgsError(ValueError):
    """A variable that becomes a `vllm serve` argument holds a value the worker cannot use."""

    def __init__(self, variable: str, value: str, accepted: str, message: str | None = None) -> None:
        self.variable = variable
        self.value = value
        self.accepted = accepted
        super().__init__(message or f"{variable}={value!r} is not valid: {accepted}.")


@dataclass
class BuiltArgs:
    """The command that starts the engine, and what the worker needs to know about it."""

    argv: list[str]
    served_model_name: str
    engine_env: dict[str, str]
    warnings: list[str] = field(default_factory=list)

    def masked(self) -> str:
        """The command line as it may be logged."""
        return mask(self.argv, self.engine_env)


def flag_for(name: str) -> str:
    """`MAX_MODEL_LEN` -> `--max-model-len`."""
    return "--" + name.lower().replace("_", "-")


def parse_bool(variable: str, value: str | None) -> bool | None:
    """True/False for a boolean variable, None when unset or empty; ArgsError when unreadable."""
    if value is None or value.strip() == "":
        return None
    word = value.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ArgsError(variable, value, BOOL_ACCEPTED)


def is_true(value: str | None, variable: str = "value") -> bool:
    """Whether a boolean variable is set to true; unset or empty is false."""
    return parse_bool(variable, value) is True


def _get(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    if value is None or value.strip() == "":
        return None
    return value.strip()


def _is_zero(value: str) -> bool:
    try:
        return int(value) == 0
    except ValueError:
        return False


def _split_words(variable: str, value: str, env: Mapping[str, str]) -> list[str]:
    try:
        return shlex.split(value)
    except ValueError:
        shown = _mask_text(value, _secret_values(env))
        raise ArgsError(
            variable,
            shown,
            "its quotes are unbalanced; quote values the way a shell would, e.g. --flag 'a b'",
        ) from None


def _list_values(variable: str, value: str, env: Mapping[str, str]) -> list[str]:
    if value[0] in "{[":
        return [value]
    return _split_words(variable, value, env)


def _resolve(env: Mapping[str, str], warnings: list[str]) -> dict[str, str]:
    """Table name -> value, after aliases; raises ArgsError on conflicting spellings."""
    values: dict[str, str] = {}
    for name in FLAGS:
        value = _get(env, name)
        if value is not None:
            values[name] = value
    for alias, name in ALIASES.items():
        value = _get(env, alias)
        if value is None:
            continue
        if name in values and values[name] != value:
            raise ArgsError(
                name,
                values[name],
                f"it disagrees with {alias}={value!r}, which sets the same vLLM flag; set only one of them",
            )
        values[name] = value
    for legacy, name in LEGACY_ALIASES.items():
        value = _get(env, legacy)
        if value is None:
            continue
        if name in values:
            warnings.append(f"{legacy} is deprecated and ignored because {name} is also set; remove {legacy}.")
        else:
            warnings.append(f"{legacy} is deprecated; use {name} instead (its value is used this time).")
            values[name] = value
    return values


def _extra_args(env: Mapping[str, str]) -> list[str]:
    raw = _get(env, EXTRA_ARGS)
    if raw is None:
        return []
    words = _split_words(EXTRA_ARGS, raw, env)
    for flag in _flags_in(words):
        if flag in RESERVED_IN_EXTRA_ARGS:
            shown = _mask_text(raw, _secret_values(env))
            raise ArgsError(EXTRA_ARGS, shown, f"{RESERVED_IN_EXTRA_ARGS[flag]}; remove {flag} from {EXTRA_ARGS}")
    return words


def _flags_in(words: Iterable[str]) -> set[str]:
    """Long flag names in an argument list, normalized as vLLM's parser does."""
    flags: set[str] = set()
    for word in words:
        if word.startswith("--") and len(word) > 2:
            name = word[2:].split("=", 1)[0].split(".", 1)[0].replace("_", "-")
            flags.add("--" + name)
        elif word in SHORT_OPTIONS:
            flags.add(SHORT_OPTIONS[word])
    return flags


def build_args(env: Mapping[str, str], settings: Settings) -> BuiltArgs:
    """The `vllm serve` argv for a launch configuration (the env mapping); ArgsError if unusable."""
    warnings: list[str] = []
    baked = _get(env, BAKED_MODEL_PATH)
    model_name = _get(env, "MODEL_NAME")
    if baked is None and model_name is None:
        raise ArgsError(
            "MODEL_NAME",
            "",
            "",
            message="MODEL_NAME is not set: set it to the Hugging Face model to serve, such as 'Qwen/Qwen3-0.6B'.",
        )
    model = baked or model_name
    assert model is not None

    values = _resolve(env, warnings)
    extra = _extra_args(env)
    extra_flags = _flags_in(extra)

    if baked is not None:
        # The baked directory is the revision that was downloaded at build time.
        dropped = [name for name in ("REVISION", "CODE_REVISION") if values.pop(name, None) is not None]
        if "TOKENIZER" not in values and values.pop("TOKENIZER_REVISION", None) is not None:
            dropped.append("TOKENIZER_REVISION")
        if dropped:
            warnings.append(f"{', '.join(dropped)} ignored: the model is baked into the image at {baked}.")
        if "SERVED_MODEL_NAME" not in values and model_name is not None:
            # Clients keep asking for the Hub name, not the path inside the image.
            values["SERVED_MODEL_NAME"] = model_name

    for name in ZERO_MEANS_UNSET:
        if name in values and _is_zero(values[name]):
            del values[name]
    if "MAX_NUM_SEQS" not in values and "--max-num-seqs" not in extra_flags:
        values["MAX_NUM_SEQS"] = str(multiple_of_8_at_least(settings.max_concurrency))

    argv = [*settings.vllm_command, model, "--host", settings.vllm_host, "--port", str(settings.vllm_port)]
    for name, kind in FLAGS.items():
        if name not in values:
            continue
        value = values[name]
        flag = flag_for(name)
        if kind == "removed":
            warnings.append(f"{name}={value!r} is ignored: vLLM 0.32 has no {flag} ({REMOVED_NOTES[name]}).")
            continue
        if flag in extra_flags or (kind == "pair" and "--no-" + flag[2:] in extra_flags):
            warnings.append(f"{name} sets {flag}, but {EXTRA_ARGS} sets it too; the {EXTRA_ARGS} value wins.")
        if kind == "pair":
            argv.append(flag if parse_bool(name, value) else "--no-" + flag[2:])
        elif kind == "store_true":
            if parse_bool(name, value):
                argv.append(flag)
        elif kind == "list":
            argv += [flag, *_list_values(name, value, env)]
        elif value.startswith("-"):
            argv.append(f"{flag}={value}")
        else:
            argv += [flag, value]
    argv += extra

    served = values.get("SERVED_MODEL_NAME")
    served_model_name = _list_values("SERVED_MODEL_NAME", served, env)[0] if served else model
    return BuiltArgs(argv=argv, served_model_name=served_model_name, engine_env=engine_env(env), warnings=warnings)


# The platform's credentials and job-queue URLs: the worker's business, never the engine's.
_WORKER_ONLY = ("RUNPOD_AI_API_KEY", "RUNPOD_WEBHOOK_")


def engine_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment the engine is started with: the launch configuration less the worker-only variables."""
    return {name: value for name, value in env.items() if not name.startswith(_WORKER_ONLY)}


# --- masking -----------------------------------------------------------------

_SECRET_WORDS = ("token", "key", "secret", "password", "passwd", "apikey", "credential", "credentials")
_SECRET_ENV_NAMES = frozenset({"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"})
# Shorter values are masked only where a whole argument equals them: replacing
# "1" inside every argument would garble the log without protecting anything.
_MIN_SUBSTRING_SECRET = 4


def _is_secret_name(name: str) -> bool:
    """A flag or variable whose value is a credential: its last word names one.

    The last word, not any word: --max-num-batched-tokens and
    --long-prefill-token-threshold carry numbers, --tokenizer a repo id.
    """
    words = [w for w in re.split(r"[-_.]+", name.lower()) if w]
    if not words:
        return False
    return words[-1] in _SECRET_WORDS or any(w in ("secret", "password", "passwd") for w in words)


def _secret_values(env: Mapping[str, str]) -> list[str]:
    secrets = []
    for name, value in env.items():
        if (name in _SECRET_ENV_NAMES or _is_secret_name(name)) and value.strip():
            secrets.append(value.strip())
    # Longest first, so a secret that contains another is masked whole.
    return sorted(set(secrets), key=len, reverse=True)


def _mask_text(text: str, secrets: Sequence[str]) -> str:
    for secret in secrets:
        if len(secret) >= _MIN_SUBSTRING_SECRET:
            text = text.replace(secret, MASK)
    # Quotes around the value stay: in a quoting error they are the point.
    return re.sub(
        r"(?<!\S)(--?[\w.-]+)(=|\s+)([\"']?)([^\s\"']+)",
        lambda m: m.group(1) + m.group(2) + m.group(3) + MASK if _is_secret_name(m.group(1).lstrip("-")) else m.group(0),
        text,
    )


def mask(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """`argv` as one shell-quoted line with credentials replaced by '***'.

    Masks the values of secret-looking flags (--api-key, --hf-token, ...), and
    every occurrence of a secret variable's value (HF_TOKEN, *_API_KEY, ...) taken
    from `env` (default: the worker's own environment).
    """
    secrets = _secret_values(os.environ if env is None else env)
    out: list[str] = []
    in_secret = False
    for arg in argv:
        if arg.startswith("-") and not _looks_negative_number(arg):
            name, eq, _ = arg.partition("=")
            secret_flag = _is_secret_name(name.lstrip("-"))
            if eq and secret_flag:
                out.append(f"{name}={MASK}")
                in_secret = False
                continue
            in_secret = secret_flag and not eq
            out.append(_mask_arg(arg, secrets))
        elif in_secret:
            out.append(MASK)  # nargs="+" flags such as --api-key take several values
        else:
            out.append(_mask_arg(arg, secrets))
    return shlex.join(out)


def _mask_arg(arg: str, secrets: Sequence[str]) -> str:
    for secret in secrets:
        if arg == secret:
            return MASK
        if len(secret) >= _MIN_SUBSTRING_SECRET:
            arg = arg.replace(secret, MASK)
    return arg


def _looks_negative_number(arg: str) -> bool:
    try:
        float(arg)
    except ValueError:
        return False
    return True
