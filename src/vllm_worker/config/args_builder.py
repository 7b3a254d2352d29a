"""vLLM's `vllm serve` options as the worker's variables: the table, its spellings and its checks.

`profile.fold` resolves the variables by this table (`resolve`); `command.build_args` renders the
profile's options by it.

Users configure vLLM only through environment variables, so every `vllm serve` option
of vLLM 0.32 is settable by the UPPER_SNAKE form of its name (MAX_NUM_SEQS ->
--max-num-seqs). What the options are, how each is spelled on a command line (its
*kind*) and which values each takes come from src/vllm_worker/config/vllm_flags.json, which
scripts/gen_flag_table.py reads from vLLM's own parser; tests/engine/test_flag_table.py
fails when the installed vLLM no longer matches it.

Three kinds of name are not passed on although vLLM has the option (`NOT_FROM_ENV`):
options the worker owns (--host, --port, --model, --config), ones that would cut the
worker off from the engine (--headless, --api-key, TLS) and ordinary environment
variables that happen to spell an option (MASTER_ADDR, LOG_LEVEL). HF_TOKEN reaches
vLLM only through the child's environment (huggingface_hub reads it there); `mask()`
keeps it and any other secret out of logged commands.

Values are checked before launch against what vLLM's parser and config fields reject
for every model (types, choices, bounds: `flag_messages`), so MAX_NUM_SEQS=abc is
answered in milliseconds instead of after vLLM's ~12 s import; the engine stays the
judge of everything else. A variable that looks like an option but is not one
(MAX_NUM_SEQ) draws a warning naming the closest name the worker reads.

Variables that older workers accepted but vLLM 0.32 no longer knows are kept as
kind "removed": they are dropped with a warning that names the replacement,
because `unrecognized arguments` at startup would take the endpoint down for a
stale template default.

The worker sizes vLLM for its own concurrency: when MAX_NUM_SEQS is unset it
passes the smallest multiple of 8 that is >= MAX_CONCURRENCY, because vLLM's own
default (256, or 1024 on 70 GiB+ cards) costs minutes of CUDA-graph capture and
activation memory for batch sizes the worker never sends.

`command.build_args` is pure: it returns warnings instead of logging them.
"""

from __future__ import annotations

import difflib
import json
from importlib import resources
from typing import Any, Literal, Mapping

from vllm_worker.config import flag_messages, official_worker
from vllm_worker.config.env import BOOL_ACCEPTED, RefusedValue, bool_word
from vllm_worker.config.env import value as value_of
from vllm_worker.config.secrets import mask_text, secret_values
from vllm_worker.config.settings import DOCUMENTED

Kind = Literal["value", "optional_value", "list", "append", "pair", "store_true", "removed"]
# value:      `--flag VALUE` (optional_value: the same; vLLM also takes the bare flag)
# list:       `--flag V1 V2 ...` (nargs="+"): the variable is split like shell words; a JSON
#             array gives one argument per element, a JSON object is one argument
# append:     `--flag V1 --flag V2`: the variable is split like shell words
# pair:       argparse BooleanOptionalAction: true -> `--flag`, false -> `--no-flag`
# store_true: true -> `--flag`, false -> nothing
# removed:    gone from vLLM 0.32: warn and drop (see REMOVED_NOTES)

TABLE_FILE = "vllm_flags.json"


def load_table() -> dict[str, Any]:
    """vLLM 0.32's `vllm serve` options as scripts/gen_flag_table.py wrote them (package data)."""
    text = resources.files("vllm_worker.config").joinpath(TABLE_FILE).read_text(encoding="utf-8")
    return json.loads(text)


TABLE = load_table()
# UPPER_SNAKE name -> the option's entry, in the order of vLLM's parser (the argv order).
OPTIONS: dict[str, dict[str, Any]] = TABLE["options"]

_PLAIN_HTTP = "the worker talks to vLLM over plain HTTP on 127.0.0.1"
# vLLM options never set from a variable of the same name. A reason makes setting one a
# warning; None marks an ordinary variable that merely spells an option (ignored quietly:
# torch.distributed launchers and many images set these for their own use).
NOT_FROM_ENV: dict[str, str | None] = {
    "HOST": None,
    "PORT": None,
    "MODEL": None,
    "CONFIG": None,
    "LOG_LEVEL": None,
    "MASTER_ADDR": None,
    "MASTER_PORT": None,
    "NODE_RANK": None,
    "NNODES": None,
    "HF_TOKEN": None,  # read by huggingface_hub in the engine's environment, never put on its command line
    "UDS": "the worker connects to vLLM over TCP on VLLM_PORT",
    "API_KEY": "the worker calls vLLM on 127.0.0.1 without a key; Runpod already authenticates callers",
    "HEADLESS": "--headless starts no API server for the worker to call",
    "GRPC": "--grpc replaces the HTTP API the worker calls",
    "TOKENS_ONLY": "--tokens-only disables the OpenAI endpoints the worker calls",
    "SSL_KEYFILE": _PLAIN_HTTP,
    "SSL_CERTFILE": _PLAIN_HTTP,
    "SSL_CA_CERTS": _PLAIN_HTTP,
    "SSL_CERT_REQS": _PLAIN_HTTP,
    "SSL_CIPHERS": _PLAIN_HTTP,
    "ENABLE_SSL_REFRESH": _PLAIN_HTTP,
}

_SPEC = "the number of tokens proposed per step is num_speculative_tokens inside SPECULATIVE_CONFIG"
_SPEC_NONE = "vLLM 0.32's speculative decoding has no such setting; SPECULATIVE_CONFIG holds the ones it has"
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
    # Speculative-decoding knobs with no field in vLLM 0.32's SpeculativeConfig (the ones that have
    # one, SPECULATIVE_MODEL and the like, are folded into it: official_worker).
    "NUM_LOOKAHEAD_SLOTS": _SPEC,
    "SPECULATIVE_DISABLE_BY_BATCH_SIZE": _SPEC_NONE,
    "SPEC_DECODING_ACCEPTANCE_METHOD": _SPEC_NONE,
    "TYPICAL_ACCEPTANCE_SAMPLER_POSTERIOR_THRESHOLD": _SPEC_NONE,
    "TYPICAL_ACCEPTANCE_SAMPLER_POSTERIOR_ALPHA": _SPEC_NONE,
    "DISABLE_LOGPROBS_DURING_SPEC_DECODING": _SPEC_NONE,
    "NUM_REDUNDANT_EXPERTS": _EPLB,
    "EPLB_WINDOW_SIZE": _EPLB,
    "EPLB_STEP_INTERVAL": _EPLB,
    "EPLB_LOG_BALANCEDNESS": _EPLB,
}

# Worker-documented names for flags whose UPPER_SNAKE name is less obvious, and the names of
# vLLM's own second spellings (--device-memory-utilization for --gpu-memory-utilization).
# Both spellings work; setting both to different values is an error.
ALIASES: dict[str, str] = {
    "MODEL_REVISION": "REVISION",
    "TOKENIZER_NAME": "TOKENIZER",
    **official_worker.ALIASES,
    **{
        alias[2:].replace("-", "_").upper(): name
        for name, option in OPTIONS.items()
        if name not in NOT_FROM_ENV
        for alias in option.get("aliases", ())
    },
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

# What each variable the worker turns into flags does: live options in vLLM's parser order
# (the argv order), then the removed ones.
FLAGS: dict[str, Kind] = {
    **{name: option["kind"] for name, option in OPTIONS.items() if name not in NOT_FROM_ENV},
    **{name: "removed" for name in REMOVED_NOTES},
}

# Other spellings vLLM accepts (-tp, -q, --device-memory-utilization, ...), so VLLM_EXTRA_ARGS
# overrides are noticed.
SHORT_OPTIONS: dict[str, str] = {
    short: option["flag"] for option in OPTIONS.values() for short in option.get("short", ())
}
LONG_ALIASES: dict[str, str] = {
    alias: option["flag"] for option in OPTIONS.values() for alias in option.get("aliases", ())
}

CONFIG_FILE = "VLLM_CONFIG_FILE"
CONFIG_FILE_ACCEPTED = "the path of a YAML file, whose name vLLM requires to end in .yaml or .yml"

# Variables the worker itself reads beside its settings (settings.DOCUMENTED) and the flags.
WORKER_VARIABLES: frozenset[str] = frozenset(
    {"MODEL_NAME", "BAKED_MODEL_PATH", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "VLLM_EXTRA_ARGS", CONFIG_FILE,
     "MODEL_CONFIG", "CPU_VISIBLE_MEMORY_NODES"}
)

# Environment names that are nobody's typo: the look-alike check leaves them alone.
_ORDINARY_NAMES = frozenset(
    {"PATH", "HOME", "HOSTNAME", "PWD", "OLDPWD", "SHELL", "USER", "LOGNAME", "TERM", "LANG", "LANGUAGE", "TZ",
     "SHLVL", "MAIL", "DISPLAY", "EDITOR", "PAGER", "TMPDIR", "TEMP", "TMP", "PS1", "CI", "DO_NOT_TRACK",
     "DEBIAN_FRONTEND", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "PUBLIC_KEY", "MAX_JOBS",
     "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "LIBRARY_PATH", "CPATH", "MANPATH", "INFOPATH"}
)
_ORDINARY_PREFIXES = (
    "CUDA_", "NVIDIA_", "NV_", "NCCL_", "CUDNN_", "CUBLAS", "RUNPOD_", "HF_", "HUGGING_FACE_", "HUGGINGFACE_",
    "TRANSFORMERS_", "TOKENIZERS_", "TORCH", "PYTORCH_", "TRITON_", "VLLM_", "PYTHON", "PIP_", "UV_", "LC_", "LD_",
    "XDG_", "SSL_", "OMP_", "MKL_", "KMP_", "OPENBLAS_", "GOMP_", "AWS_", "GOOGLE_", "GCP_", "AZURE_", "CLOUDSDK_",
    "KUBERNETES_", "DOCKER_", "GIT_", "CONDA_", "NPM_", "NODE_", "JAVA_", "OTEL_", "SSH_", "GRPC_", "REQUESTS_",
    "CURL_", "NIX_", "RAY_", "NUMBA_", "JUPYTER_", "PYENV_", "VIRTUAL_ENV", "RUST", "CARGO_", "GPG_", "DBUS_",
    "TERM_", "HIST", "DD_", "SENTRY_", "PROMETHEUS_", "MAMBA_ROOT", "MAMBA_EXE", "OPENAI_", "ANTHROPIC_",
)
# How close (difflib ratio) an unknown name must be to a known one to be called a look-alike:
# MAX_NUM_SEQ/MAX_NUM_SEQS is 0.96, MAX_MODEL_LENGTH/MAX_MODEL_LEN 0.90, TENSOR_PARALLEL/...SIZE 0.86.
LOOKALIKE_CUTOFF = 0.85

# Flags the worker owns: the engine must listen where the worker connects, and the
# model comes from MODEL_NAME. Anything else in VLLM_EXTRA_ARGS is the user's call.
RESERVED_IN_EXTRA_ARGS: dict[str, str] = {
    "--host": "the worker sets --host itself and connects only to 127.0.0.1",
    "--port": "the worker sets --port itself from VLLM_PORT",
    "--uds": "the worker connects to the engine over TCP on VLLM_PORT",
    "--model": "the worker passes the model from MODEL_NAME",
}


BAKED_MODEL_PATH = "BAKED_MODEL_PATH"


class ArgsError(RefusedValue):
    """A variable that becomes a `vllm serve` argument holds a value the worker cannot use."""


def flag_for(name: str) -> str:
    """`MAX_MODEL_LEN` -> `--max-model-len`."""
    return "--" + name.lower().replace("_", "-")


def parse_bool(variable: str, value: str | None) -> bool | None:
    """True/False for a boolean variable, None when unset or empty; ArgsError when unreadable."""
    if value is None or value.strip() == "":
        return None
    word = bool_word(value)
    if word is None:
        raise ArgsError(variable, value, BOOL_ACCEPTED)
    return word


def is_true(value: str | None, variable: str = "value") -> bool:
    """Whether a boolean variable is set to true; unset or empty is false."""
    return parse_bool(variable, value) is True


def resolve(env: Mapping[str, str], warnings: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """Table name -> value, and table name -> the variable that set it, after aliases, legacy names and
    the official worker's speculative variables. `LaunchProfile.parse` calls it, once per profile.

    Raises ArgsError on conflicting spellings.
    """
    values: dict[str, str] = {}
    sources: dict[str, str] = {}
    for name in FLAGS:
        value = value_of(env, name)
        if value is not None:
            values[name], sources[name] = value, name
    for alias, name in ALIASES.items():
        value = value_of(env, alias)
        if value is None:
            continue
        if name in values and values[name] != value:
            raise ArgsError(
                name,
                values[name],
                f"it disagrees with {alias}={value!r}, which sets the same vLLM flag; set only one of them",
            )
        values[name] = value
        sources.setdefault(name, alias)
    for legacy, name in LEGACY_ALIASES.items():
        value = value_of(env, legacy)
        if value is None:
            continue
        if name in values:
            warnings.append(f"{legacy} is deprecated and ignored because {name} is also set; remove {legacy}.")
        else:
            warnings.append(f"{legacy} is deprecated; use {name} instead (its value is used this time).")
            values[name], sources[name] = value, legacy
    _fold_official_speculative(env, values, sources)
    return values, sources


def _fold_official_speculative(env: Mapping[str, str], values: dict[str, str], sources: dict[str, str]) -> None:
    """The official worker's single speculative-decoding variables, folded into SPECULATIVE_CONFIG."""
    try:
        fields = official_worker.speculative_fields(env)
        if not fields:
            return
        for key, (variable, value) in fields.items():
            twin = official_worker.SPECULATIVE_TWINS.get(key)
            if twin is None:
                continue
            if twin in values:
                raise ArgsError(variable, str(value), f"{twin} sets the same speculative-config field ({key}); set only one of them")
            _checked(variable, OPTIONS[twin], [str(value)], str(value), env)  # vLLM's choices and types for the field
        twins_set = frozenset(key for key, twin in official_worker.SPECULATIVE_TWINS.items() if twin in values)
        values["SPECULATIVE_CONFIG"] = official_worker.fold_speculative(values.get("SPECULATIVE_CONFIG"), fields, twins_set)
    except official_worker.FoldError as error:
        raise ArgsError(error.variable, mask_text(error.value, secret_values(env)), error.accepted) from None
    sources.setdefault("SPECULATIVE_CONFIG", ", ".join(sorted({variable for variable, _ in fields.values()})))


def _checked(source: str, option: Mapping[str, Any], items: list[str], value: str, env: Mapping[str, str]) -> None:
    """ArgsError when vLLM's parser or its config would refuse these argument(s)."""
    accepted = flag_messages.problem(option, items)
    if accepted is None:
        return
    shown = mask_text(value, secret_values(env))
    flag = option["flag"]
    raise ArgsError(source, shown, f"{flag} takes {accepted}",
                    message=flag_messages.invalid_value(source, shown, flag, accepted))


def option_for(flag_or_field: str) -> dict[str, Any] | None:
    """The table entry for a flag vLLM named in an error (--max-num-seqs, -tp, --no-enforce-eager) or
    for a config field it named (max_num_seqs, cache_config.block_size); None when it is no option."""
    text = flag_or_field.strip()
    if text in SHORT_OPTIONS:
        text = SHORT_OPTIONS[text]
    if text.startswith("-"):
        text = LONG_ALIASES.get(text, text).lstrip("-")
        if text.startswith("no-") and text[3:].replace("-", "_").upper() in OPTIONS:
            text = text[3:]
    name = text.split(".")[-1].replace("-", "_").upper()
    return OPTIONS.get(name)


def lookalike_warnings(env: Mapping[str, str]) -> list[str]:
    """Warnings for set variables that look like a name the worker reads but are none (MAX_NUM_SEQ).

    Ordinary environment variables (PATH, CUDA_*, RUNPOD_*, HF_*, VLLM_*, ...) are left alone.
    """
    known = {*OPTIONS, *REMOVED_NOTES, *ALIASES, *LEGACY_ALIASES, *DOCUMENTED, *WORKER_VARIABLES, *official_worker.OFFICIAL}
    flags = [name for name, kind in FLAGS.items() if kind != "removed"]
    candidates = [*flags, *ALIASES, *DOCUMENTED, *sorted(WORKER_VARIABLES)]
    warnings = []
    for name in sorted(env):
        if name in known or not env[name].strip():
            continue
        normalized = name.strip().upper().replace("-", "_")
        if normalized != name:
            close = [normalized] if normalized in candidates else []
        elif name in _ORDINARY_NAMES or name.startswith(_ORDINARY_PREFIXES):
            continue
        else:
            close = difflib.get_close_matches(name, candidates, n=1, cutoff=LOOKALIKE_CUTOFF)
        if close:
            match = close[0]
            what = f"vLLM's {OPTIONS[match]['flag']}" if match in OPTIONS else "a worker setting"
            if match in ALIASES:
                what = f"vLLM's {OPTIONS[ALIASES[match]]['flag']}"
            warnings.append(
                f"{name} is set but is not a variable the worker reads, so it has no effect; "
                f"did you mean {match} ({what})?"
            )
    return warnings
