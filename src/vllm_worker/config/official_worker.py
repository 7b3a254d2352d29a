"""Runpod's official vLLM worker (runpod-workers/worker-vllm): what each of its variables does here.

Most users of this worker come from that one and bring its endpoint's variables: its Hub form
(`.runpod/hub.json`), its README's table, its configuration reference. A variable that changes
nothing and says nothing is a setting the user believes applies, so each of them is listed in
`OFFICIAL` with what it does in this worker:

- "option": a `vllm serve` option of the same name, passed as such;
- "alias": another name for a vLLM option (MODEL_NAME, TOKENIZER_NAME, ...; OPENAI_RESPONSE_ROLE
  is `--response-role`, through `ALIASES`);
- "folded": a field of the speculative-decoding config the official worker assembled from single
  variables, folded here into `--speculative-config` (`speculative_fields`);
- "worker": a setting the worker itself reads, with the same meaning;
- "volume": BASE_PATH, the network volume's root, under which the worker keeps its caches;
- "engine_env": read by vLLM or torch from the engine's environment, which carries it unchanged;
- "removed": a vLLM option vLLM 0.32 no longer has, answered by args_builder's removed-variable warning;
- "answered": nothing here does what it did there; set to anything but the form's default, it
  draws one sentence (`notices`) in the log and the status job naming it and what to do instead.

The Hub form writes its defaults into every endpoint's environment, so an "answered" or "removed"
variable left at the form's default asks for nothing and draws no sentence (`at_form_default`).

Pure; it reads strings through `config.env` only, and `args_builder` folds this table into the launch.
tests/unit/test_official_worker.py walks every name of the official form through it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal, Mapping

from vllm_worker.config.env import RefusedValue, bool_word
from vllm_worker.config.env import value as value_of

How = Literal["option", "alias", "folded", "worker", "volume", "engine_env", "removed", "answered"]


@dataclass(frozen=True)
class OfficialVariable:
    """One variable of the official worker. default: its form's default as the environment holds it
    (None: unset). target: the vLLM option name an option or alias sets, or the speculative-config
    field a folded variable fills. answer: for "answered", what happens here instead and what to do."""

    how: How
    default: str | None = None
    target: str | None = None
    answer: str | None = None


_STREAMED = "the worker posts a stream's events as vLLM sends them, a few times a second, never by token count; remove it"

OFFICIAL: dict[str, OfficialVariable] = {
    "MODEL_NAME": OfficialVariable("alias", None, "MODEL"),
    "MODEL_REVISION": OfficialVariable("alias", None, "REVISION"),
    "TOKENIZER": OfficialVariable("option", None, "TOKENIZER"),
    "TOKENIZER_NAME": OfficialVariable("alias", None, "TOKENIZER"),
    "TOKENIZER_REVISION": OfficialVariable("option", None, "TOKENIZER_REVISION"),
    "TOKENIZER_MODE": OfficialVariable("option", "auto", "TOKENIZER_MODE"),
    "SKIP_TOKENIZER_INIT": OfficialVariable("option", "false", "SKIP_TOKENIZER_INIT"),
    "TRUST_REMOTE_CODE": OfficialVariable("option", "false", "TRUST_REMOTE_CODE"),
    "DOWNLOAD_DIR": OfficialVariable("option", None, "DOWNLOAD_DIR"),
    "LOAD_FORMAT": OfficialVariable("option", None, "LOAD_FORMAT"),
    "DTYPE": OfficialVariable("option", "auto", "DTYPE"),
    "KV_CACHE_DTYPE": OfficialVariable("option", "auto", "KV_CACHE_DTYPE"),
    "MAX_MODEL_LEN": OfficialVariable("option", "auto", "MAX_MODEL_LEN"),
    "DISTRIBUTED_EXECUTOR_BACKEND": OfficialVariable("option", "mp", "DISTRIBUTED_EXECUTOR_BACKEND"),
    "RAY_WORKERS_USE_NSIGHT": OfficialVariable("option", "false", "RAY_WORKERS_USE_NSIGHT"),
    "PIPELINE_PARALLEL_SIZE": OfficialVariable("option", "1", "PIPELINE_PARALLEL_SIZE"),
    "TENSOR_PARALLEL_SIZE": OfficialVariable("option", "1", "TENSOR_PARALLEL_SIZE"),
    "MAX_PARALLEL_LOADING_WORKERS": OfficialVariable("option", "1", "MAX_PARALLEL_LOADING_WORKERS"),
    "ENABLE_PREFIX_CACHING": OfficialVariable("option", "false", "ENABLE_PREFIX_CACHING"),
    "DISABLE_SLIDING_WINDOW": OfficialVariable("option", "false", "DISABLE_SLIDING_WINDOW"),
    "SEED": OfficialVariable("option", "0", "SEED"),
    "MAX_NUM_SEQS": OfficialVariable("option", "256", "MAX_NUM_SEQS"),
    "MAX_LOGPROBS": OfficialVariable("option", "20", "MAX_LOGPROBS"),
    "DISABLE_LOG_STATS": OfficialVariable("option", "false", "DISABLE_LOG_STATS"),
    "QUANTIZATION": OfficialVariable("option", None, "QUANTIZATION"),
    "ENABLE_LORA": OfficialVariable("option", "false", "ENABLE_LORA"),
    "MAX_LORAS": OfficialVariable("option", "1", "MAX_LORAS"),
    "MAX_LORA_RANK": OfficialVariable("option", "16", "MAX_LORA_RANK"),
    "LORA_DTYPE": OfficialVariable("option", "auto", "LORA_DTYPE"),
    "MAX_CPU_LORAS": OfficialVariable("option", None, "MAX_CPU_LORAS"),
    "FULLY_SHARDED_LORAS": OfficialVariable("option", "false", "FULLY_SHARDED_LORAS"),
    "ENABLE_CHUNKED_PREFILL": OfficialVariable("option", "true", "ENABLE_CHUNKED_PREFILL"),
    "SPECULATIVE_CONFIG": OfficialVariable("option", None, "SPECULATIVE_CONFIG"),
    "MODEL_LOADER_EXTRA_CONFIG": OfficialVariable("option", None, "MODEL_LOADER_EXTRA_CONFIG"),
    "ENABLE_LOG_REQUESTS": OfficialVariable("option", "false", "ENABLE_LOG_REQUESTS"),
    "CUSTOM_CHAT_TEMPLATE": OfficialVariable("alias", None, "CHAT_TEMPLATE"),
    "GPU_MEMORY_UTILIZATION": OfficialVariable("option", "0.95", "GPU_MEMORY_UTILIZATION"),
    "BLOCK_SIZE": OfficialVariable("option", "16", "BLOCK_SIZE"),
    "ENFORCE_EAGER": OfficialVariable("option", "false", "ENFORCE_EAGER"),
    "DISABLE_CUSTOM_ALL_REDUCE": OfficialVariable("option", "false", "DISABLE_CUSTOM_ALL_REDUCE"),
    "OPENAI_RESPONSE_ROLE": OfficialVariable("alias", "assistant", "RESPONSE_ROLE"),
    "OPENAI_SERVED_MODEL_NAME_OVERRIDE": OfficialVariable("alias", None, "SERVED_MODEL_NAME"),
    "ENABLE_EXPERT_PARALLEL": OfficialVariable("option", "false", "ENABLE_EXPERT_PARALLEL"),
    "ENABLE_AUTO_TOOL_CHOICE": OfficialVariable("option", "false", "ENABLE_AUTO_TOOL_CHOICE"),
    "TOOL_CALL_PARSER": OfficialVariable("option", "", "TOOL_CALL_PARSER"),
    "REASONING_PARSER": OfficialVariable("option", "", "REASONING_PARSER"),
    "VLLM_CONFIG_FILE": OfficialVariable("alias", None, "CONFIG"),
    "VLLM_EXTRA_ARGS": OfficialVariable("worker"),
    # The speculative-decoding fields the official worker put together into one config.
    "SPECULATIVE_METHOD": OfficialVariable("folded", "", "method"),
    "SPECULATIVE_MODEL": OfficialVariable("folded", None, "model"),
    "NUM_SPECULATIVE_TOKENS": OfficialVariable("folded", None, "num_speculative_tokens"),
    "NGRAM_PROMPT_LOOKUP_MAX": OfficialVariable("folded", None, "prompt_lookup_max"),
    "NGRAM_PROMPT_LOOKUP_MIN": OfficialVariable("folded", None, "prompt_lookup_min"),
    "SPECULATIVE_DRAFT_TENSOR_PARALLEL_SIZE": OfficialVariable("folded", None, "draft_tensor_parallel_size"),
    "SPECULATIVE_MAX_MODEL_LEN": OfficialVariable("folded", None, "max_model_len"),
    "MAX_CONCURRENCY": OfficialVariable("worker", "30"),
    "VLLM_PORT": OfficialVariable("worker", "8000"),
    "VLLM_STARTUP_TIMEOUT": OfficialVariable("worker", "1200"),
    "REQUEST_TIMEOUT": OfficialVariable("worker", "3600"),
    "BASE_PATH": OfficialVariable("volume", "/runpod-volume"),
    "HF_TOKEN": OfficialVariable("engine_env"),
    "PYTORCH_ALLOC_CONF": OfficialVariable("engine_env", "expandable_segments:True"),
    "VLLM_USE_DEEP_GEMM": OfficialVariable("engine_env", "0"),
    "SCHEDULER_DELAY_FACTOR": OfficialVariable("removed", "0"),
    "DEVICE": OfficialVariable(
        "answered",
        "auto",
        answer=(
            "vLLM 0.32 has no --device: it runs on the platform its build targets (the GPUs, in this "
            "worker's image); remove it (CUDA_VISIBLE_DEVICES chooses which GPUs)"
        ),
    ),
    "DEFAULT_BATCH_SIZE": OfficialVariable("answered", "50", answer=_STREAMED),
    "DEFAULT_MIN_BATCH_SIZE": OfficialVariable("answered", "1", answer=_STREAMED),
    "DEFAULT_BATCH_SIZE_GROWTH_FACTOR": OfficialVariable("answered", "3", answer=_STREAMED),
    "RAW_OPENAI_OUTPUT": OfficialVariable(
        "answered",
        "true",
        answer=(
            "the worker always relays an OpenAI stream as vLLM's Server-Sent Events text ('data: {...}' "
            "events); read each event's data line in the client, and remove it"
        ),
    ),
}

# Official names for vLLM options that args_builder takes as its own second spellings.
ALIASES: dict[str, str] = {"OPENAI_RESPONSE_ROLE": "RESPONSE_ROLE"}

SPECULATIVE_CONFIG = "SPECULATIVE_CONFIG"
# vLLM's own single-field options for the same fields: setting both is refused by vLLM at startup.
SPECULATIVE_TWINS: dict[str, str] = {"method": "SPEC_METHOD", "model": "SPEC_MODEL", "num_speculative_tokens": "SPEC_TOKENS"}
_TEXT_FIELDS = frozenset({"method", "model"})


class FoldError(RefusedValue):
    """A folded variable the worker cannot put into the speculative config; str() is the sentence."""


def speculative_fields(env: Mapping[str, str]) -> dict[str, tuple[str, str | int]]:
    """Speculative-config field -> (the official variable that sets it, its value), for the ones set.

    Numbers are whole and positive; 0 means unset, as the official worker read it (its form's
    empty number fields arrive as 0). Raises FoldError for a value that is no such number.
    """
    fields: dict[str, tuple[str, str | int]] = {}
    for name, entry in OFFICIAL.items():
        if entry.how != "folded" or entry.target is None:
            continue
        raw = value_of(env, name)
        if raw is None:
            continue
        if entry.target in _TEXT_FIELDS:
            fields[entry.target] = (name, raw)
            continue
        try:
            number = int(raw)
        except ValueError:
            number = -1
        if number < 0:
            raise FoldError(name, raw, f"a whole number greater than 0 (it becomes {entry.target} of SPECULATIVE_CONFIG)")
        if number:
            fields[entry.target] = (name, number)
    return fields


def fold_speculative(
    config_text: str | None, fields: Mapping[str, tuple[str, str | int]], set_elsewhere: frozenset[str] = frozenset()
) -> str:
    """SPECULATIVE_CONFIG (a JSON object, or None) with the folded fields added, as JSON.

    A field both places set to different values is refused (FoldError names both), never one
    silently dropped. set_elsewhere: fields vLLM's own single options set (SPEC_METHOD, ...).
    As the official worker did, n-gram window sizes with neither a method nor a draft model
    anywhere mean the n-gram method.
    """
    config: dict[str, object] = {}
    if config_text is not None:
        try:
            parsed = json.loads(config_text)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            names = ", ".join(sorted({variable for variable, _ in fields.values()}))
            raise FoldError(SPECULATIVE_CONFIG, config_text, f"a JSON object, to be combined with {names}")
        config = {key.replace("-", "_"): value for key, value in parsed.items()}
    for key, (variable, value) in fields.items():
        if key in config and config[key] != value:
            raise FoldError(
                variable,
                str(value),
                f"SPECULATIVE_CONFIG sets {key} to {config[key]!r}; set it in one place only",
            )
        config[key] = value
    window = fields.get("prompt_lookup_max") or fields.get("prompt_lookup_min")
    if window is not None and not {"method", "model"} & (set(config) | set_elsewhere):
        config["method"] = "ngram"
    return json.dumps(config)


def _same(value: str, default: str) -> bool:
    a, b = value.strip().lower(), default.strip().lower()
    if a == b or (bool_word(a) is not None and bool_word(a) == bool_word(b)):
        return True
    try:
        return float(a) == float(b)
    except ValueError:
        return False


def at_form_default(name: str, value: str) -> bool:
    """Whether `value` is the official form's default for `name`: then it asks for nothing the user chose."""
    entry = OFFICIAL.get(name)
    return entry is not None and entry.default is not None and _same(value, entry.default)


def notices(env: Mapping[str, str]) -> list[str]:
    """One sentence per "answered" variable set to something other than the official form's default."""
    sentences = []
    for name, entry in OFFICIAL.items():
        value = value_of(env, name)
        if entry.how != "answered" or value is None or at_form_default(name, value):
            continue
        sentences.append(f"{name}={value!r} has no effect here: {entry.answer}.")
    return sentences
