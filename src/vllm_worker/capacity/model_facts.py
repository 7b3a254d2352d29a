"""What capacity planning knows about a model without its weights: `ModelFacts`.

A plan needs the attention shape (layers, KV heads, head size, sliding windows, MLA),
the MLP and vocabulary sizes the activation terms scale with, the context vLLM derives,
the checkpoint's quantization and its parameter counts per dtype. All of it comes from
`config.json` and the safetensors headers (or the Hub's safetensors metadata), never
from the weights themselves, so a plan costs two small requests or a few header reads.

Pure functions except `facts_from_folder`, `facts_from_hub` and `facts_from_cache` (I/O).
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping

MiB = 1 << 20
GiB = 1 << 30

MLA_MODEL_TYPES = frozenset(
    {
        "axk1", "deepseek_v2", "deepseek_v3", "deepseek_v32", "deepseek_mtp", "dots3_note", "k3_dspark",
        "glm5_next", "glm5_next_text", "glm_moe_dsa", "glm4_moe_lite", "kimi_k2", "kimi_linear",
        "longcat_flash", "pangu_ultra_moe", "bailing_hybrid", "hy_v4",
    }
)  # transformers_utils/model_arch_config_convertor.py is_deepseek_mla (those with kv_lora_rank)

# safetensors dtype -> bits per element (the Hub's `safetensors.parameters` keys).
DTYPE_BITS: dict[str, int] = {
    "F64": 64, "F32": 32, "F16": 16, "BF16": 16,
    "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8,
    "F6_E2M3": 6, "F6_E3M2": 6, "F4": 4, "F4_E2M1": 4,
    "I64": 64, "I32": 32, "I16": 16, "I8": 8, "I4": 4,
    "U64": 64, "U32": 32, "U16": 16, "U8": 8, "U4": 4, "BOOL": 8,
}
FLOAT_DTYPES = frozenset({"F64", "F32", "F16", "BF16"})
TORCH_DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "float64": 8, "double": 8}

# Layer kinds the KV accounting models; anything else (mamba, linear attention, chunked
# local attention, sparse indexers) makes the model "not modeled".
_FULL, _SLIDING = "full_attention", "sliding_attention"
_NOT_MODELED_TYPES = {
    "mamba", "mamba2", "jamba", "nemotron_h", "falcon_h1", "granitemoehybrid", "zamba", "zamba2", "bamba",
    "qwen3_next", "qwen3_5", "qwen3_5_moe", "minimax_m1", "minimax_text_01", "lfm2", "plamo2", "deepseek_v32",
    "deepseek_v4", "deepseek_v41", "llama4", "llama4_text", "kimi_linear", "bailing_hybrid", "hy_v4",
}


class CapacityError(ValueError):
    """The facts or settings cannot be turned into a plan; the text says why, in one sentence."""


@dataclass(frozen=True)
class ModelFacts:
    """What capacity planning needs to know about a model, read without its weights."""

    source: str
    model_type: str
    architectures: tuple[str, ...]
    num_layers: int
    layer_windows: tuple[int | None, ...]  # per decoder layer: None = full attention, else sliding window
    num_attention_heads: int
    num_kv_heads: int  # total, before tensor parallelism
    head_dim: int  # per KV head; for MLA the latent size kv_lora_rank + qk_rope_head_dim
    mla: bool
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    max_context: int  # vLLM's derived max_model_len (rope scaling applied)
    config_dtype: str | None
    quant_method: str | None
    kv_cache_scheme: str | None  # the checkpoint's own KV quantization ("fp8"), applied when KV_CACHE_DTYPE=auto
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    shared_intermediate_size: int = 0
    tie_word_embeddings: bool = False
    multimodal: bool = False
    param_counts: Mapping[str, int] = field(default_factory=dict)  # safetensors dtype -> elements
    params_source: str = "none"  # "safetensors" (exact counts) or "none"
    not_modeled: str | None = None  # why the KV accounting does not cover this model
    notes: tuple[str, ...] = ()

    @property
    def checkpoint_bytes(self) -> int | None:
        if not self.param_counts:
            return None
        return sum(count * DTYPE_BITS.get(dtype, 16) // 8 for dtype, count in self.param_counts.items())

    @property
    def total_params(self) -> int:
        return sum(self.param_counts.values()) if self.param_counts else estimate_params(self)


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    for key in ("text_config", "llm_config", "language_config"):
        sub = config.get(key)
        if isinstance(sub, Mapping) and sub:
            return sub
    thinker = config.get("thinker_config")
    if isinstance(thinker, Mapping) and isinstance(thinker.get("text_config"), Mapping):
        return thinker["text_config"]
    return config


def _first(config: Mapping[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        value = config.get(key)
        if value is not None:
            return value
    return default


def _rope_dicts(text: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    found: list[Mapping[str, Any]] = []
    for key in ("rope_parameters", "rope_scaling"):
        value = text.get(key)
        if not isinstance(value, Mapping):
            continue
        if value and all(isinstance(v, Mapping) for v in value.values()):
            found.extend(value.values())  # per layer type (transformers 5)
        else:
            found.append(value)
    return found


def derive_max_context(text: Mapping[str, Any], model_type: str) -> int:
    """vLLM's derived max_model_len (config/model.py _get_and_verify_max_len, keys in the convertor)."""
    keys = (
        "max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
        "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len",
    )
    derived = math.inf
    for key in keys:
        value = text.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            derived = min(derived, value)
    if isinstance(text.get("model_max_length"), (int, float)) and text.get("model_max_length"):
        derived = text["model_max_length"]
    if derived == math.inf:
        derived = 2048  # vLLM's default when no key is present
    ropes = _rope_dicts(text)
    if ropes and "gemma3" not in model_type:
        factor: float | None = 1.0
        for rope in ropes:
            kind = rope.get("rope_type") or rope.get("type") or "default"
            if kind not in ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling"):
                factor = rope.get("factor", factor)
        derived *= factor if factor is not None else 1.0
        if any((r.get("rope_type") or r.get("type")) == "longrope" for r in ropes):
            derived = text.get("original_max_position_embeddings", derived)
    return int(derived)


def _layer_types(text: Mapping[str, Any], model_type: str, num_layers: int) -> list[str] | None:
    """transformers' layer_types, including the defaults its configs fill in when config.json has none."""
    types = text.get("layer_types")
    if isinstance(types, list) and types:
        return [str(t) for t in types]
    if model_type in ("gemma2",):
        return [_SLIDING if (i + 1) % 2 else _FULL for i in range(num_layers)]
    if model_type in ("gemma3", "gemma3_text"):
        pattern = int(text.get("sliding_window_pattern") or 6)
        return [_SLIDING if (i + 1) % pattern else _FULL for i in range(num_layers)]
    if model_type in ("cohere2",):
        pattern = int(text.get("sliding_window_pattern") or 4)
        return [_SLIDING if (i + 1) % pattern else _FULL for i in range(num_layers)]
    if model_type in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe"):
        if not text.get("use_sliding_window") or not text.get("sliding_window"):
            return [_FULL] * num_layers
        first_sliding = int(text.get("max_window_layers") or 0)
        return [_SLIDING if i >= first_sliding else _FULL for i in range(num_layers)]
    return None


def _sliding_window(text: Mapping[str, Any], model_type: str) -> int | None:
    window = text.get("sliding_window", 4096 if model_type == "mistral" and "sliding_window" not in text else None)
    if model_type in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe") and not text.get("use_sliding_window"):
        return None
    if not window:  # 0 means disabled (config/model.py)
        return None
    return int(window)


def _quant(config: Mapping[str, Any], text: Mapping[str, Any]) -> tuple[str | None, str | None]:
    quant = config.get("quantization_config") or config.get("compression_config")
    if not isinstance(quant, Mapping):
        quant = text.get("quantization_config") if isinstance(text.get("quantization_config"), Mapping) else None
    if not quant:
        return None, None
    method = str(quant.get("quant_method") or "").lower().replace("compressed_tensors", "compressed-tensors") or None
    kv = None
    if quant.get("kv_cache_scheme"):
        kv = "fp8"
    inner = quant.get("quantization") if isinstance(quant.get("quantization"), Mapping) else quant
    algo = inner.get("kv_cache_quant_algo") if isinstance(inner, Mapping) else None
    if isinstance(algo, str) and algo.upper().startswith("FP8"):
        kv = "fp8"
    if method is None and isinstance(quant.get("producer"), Mapping):
        method = "modelopt"
    return method, kv


def facts_from_config(
    config: Mapping[str, Any],
    param_counts: Mapping[str, int] | None = None,
    *,
    source: str = "",
) -> ModelFacts:
    """ModelFacts from a parsed config.json and, when known, the parameter counts per dtype."""
    if not isinstance(config, Mapping):
        raise CapacityError(f"{source or 'the model'} has no usable config.json")
    text = _text_config(config)
    model_type = str(text.get("model_type") or config.get("model_type") or "")
    top_type = str(config.get("model_type") or model_type)
    architectures = tuple(config.get("architectures") or text.get("architectures") or ())
    num_layers = int(_first(text, "num_hidden_layers", "n_layer", "num_layers", "n_layers", default=0))
    heads = int(_first(text, "num_attention_heads", "n_head", "num_heads", default=0))
    hidden = int(_first(text, "hidden_size", "n_embd", "d_model", default=0))
    if model_type == "falcon" and text.get("multi_query") and not text.get("new_decoder_architecture"):
        kv_heads = 1
    else:
        kv_heads = int(
            _first(text, "n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num",
                   "num_attention_groups", default=heads)
        )
    mla = model_type in MLA_MODEL_TYPES and text.get("kv_lora_rank") is not None
    if mla:
        head_dim = int(text["kv_lora_rank"]) + int(text.get("qk_rope_head_dim") or 0)
    elif isinstance(text.get("head_dim"), int) and text["head_dim"] > 0:
        head_dim = int(text["head_dim"])
    elif text.get("hidden_size_per_head"):
        head_dim = int(text["hidden_size_per_head"])
    else:
        head_dim = hidden // heads if heads else 0

    not_modeled: str | None = None
    notes: list[str] = []
    if model_type in _NOT_MODELED_TYPES or top_type in _NOT_MODELED_TYPES:
        not_modeled = f"model type {model_type!r} has cache layers (state-space, linear or sparse attention) the plan does not model"
    if text.get("attention_chunk_size"):
        not_modeled = "chunked local attention (attention_chunk_size) is not modeled"
    if text.get("layers_block_type") or text.get("hybrid_override_pattern"):
        not_modeled = "hybrid state-space layers are not modeled"

    windows: list[int | None] = []
    types = _layer_types(text, model_type, num_layers)
    window = _sliding_window(text, model_type)
    if types is not None:
        if len(types) < num_layers:
            types = types + [types[-1]] * (num_layers - len(types))
        for kind in types[:num_layers]:
            if kind == _SLIDING and window:
                windows.append(window)
            elif kind in (_FULL, _SLIDING):
                windows.append(None)
            else:
                not_modeled = not_modeled or f"layer type {kind!r} is not modeled"
                windows.append(None)
    else:
        windows = [window] * num_layers
    if mla and any(w is not None for w in windows):
        windows = [None] * num_layers  # MLA has no sliding variant in these models

    if not num_layers or not heads or not hidden or not head_dim:
        raise CapacityError(
            f"{source or 'the model'}'s config.json lacks the attention shape (layers, heads, hidden size)"
        )

    experts = _first(text, "n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts", default=0) or 0
    num_experts = int(experts[0] if isinstance(experts, list) else experts)  # Ernie lists one per modality
    experts_per_token = int(_first(text, "num_experts_per_tok", "num_experts_per_token", "moe_topk", "top_k_experts", default=0) or 0)
    intermediate = int(_first(text, "intermediate_size", "ffn_hidden_size", "n_inner", "ffn_dim", default=4 * hidden) or 4 * hidden)
    moe_intermediate = int(_first(text, "moe_intermediate_size", "expert_intermediate_size", default=0) or 0)
    if num_experts and not moe_intermediate:
        moe_intermediate = intermediate  # Mixtral: intermediate_size is the expert's
    shared = int(_first(text, "shared_expert_intermediate_size", default=0) or 0)
    if not shared and text.get("n_shared_experts") and moe_intermediate:
        shared = int(text["n_shared_experts"]) * moe_intermediate

    method, kv_scheme = _quant(config, text)
    dtype = _first(text, "dtype", "torch_dtype") or _first(config, "dtype", "torch_dtype")
    multimodal = text is not config or bool(config.get("vision_config") or config.get("audio_config"))
    if multimodal:
        notes.append("multimodal encoder activations are not in the estimate")
    counts = {str(k): int(v) for k, v in (param_counts or {}).items() if int(v) > 0}
    return ModelFacts(
        source=source,
        model_type=model_type,
        architectures=architectures,
        num_layers=num_layers,
        layer_windows=tuple(windows),
        num_attention_heads=heads,
        num_kv_heads=1 if mla else kv_heads,
        head_dim=head_dim,
        mla=mla,
        hidden_size=hidden,
        intermediate_size=intermediate,
        vocab_size=int(_first(text, "vocab_size", "padded_vocab_size", default=config.get("vocab_size", 32000))),
        max_context=derive_max_context(text, model_type),
        config_dtype=str(dtype) if dtype else None,
        quant_method=method,
        kv_cache_scheme=kv_scheme,
        num_experts=num_experts,
        experts_per_token=experts_per_token,
        moe_intermediate_size=moe_intermediate,
        shared_intermediate_size=shared,
        tie_word_embeddings=bool(_first(text, "tie_word_embeddings", default=config.get("tie_word_embeddings", False))),
        multimodal=multimodal,
        param_counts=counts,
        params_source="safetensors" if counts else "none",
        not_modeled=not_modeled,
        notes=tuple(notes),
    )


def estimate_params(facts: ModelFacts) -> int:
    """Parameter count from the shape alone (used only when the checkpoint's counts are unknown)."""
    h, layers = facts.hidden_size, facts.num_layers
    head = facts.head_dim if not facts.mla else facts.hidden_size // max(1, facts.num_attention_heads)
    attention = h * facts.num_attention_heads * head * 2 + 2 * h * facts.num_kv_heads * head
    if facts.num_experts:
        mlp = facts.num_experts * 3 * h * facts.moe_intermediate_size + 3 * h * facts.shared_intermediate_size
        mlp += h * facts.num_experts
    else:
        mlp = 3 * h * facts.intermediate_size
    embeddings = facts.vocab_size * h * (1 if facts.tie_word_embeddings else 2)
    return layers * (attention + mlp + 2 * h) + embeddings + h


# --- reading facts: local folders and the Hub ---------------------------------------


def safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a .safetensors file: 8-byte little-endian length, then JSON."""
    with open(path, "rb") as handle:
        raw = handle.read(8)
        if len(raw) != 8:
            raise CapacityError(f"{path} is not a safetensors file")
        (length,) = struct.unpack("<Q", raw)
        if length > 100 * MiB:
            raise CapacityError(f"{path} has an implausible safetensors header ({length} bytes)")
        data = handle.read(length)
    try:
        header = json.loads(data)
    except ValueError as exc:
        raise CapacityError(f"{path} has an unreadable safetensors header") from exc
    if not isinstance(header, dict):
        raise CapacityError(f"{path} has an unreadable safetensors header")
    return header


def safetensors_counts(paths: Iterable[Path]) -> dict[str, int]:
    """Elements per dtype over the tensors of the given files (what the Hub's metadata reports)."""
    counts: dict[str, int] = {}
    for path in paths:
        for name, info in safetensors_header(path).items():
            if name == "__metadata__" or not isinstance(info, dict):
                continue
            dtype = str(info.get("dtype", ""))
            counts[dtype] = counts.get(dtype, 0) + math.prod(int(d) for d in info.get("shape", []))
    return counts


def _weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text()).get("weight_map", {})
            names = sorted(set(weight_map.values()))
            if names:
                return [folder / name for name in names if (folder / name).is_file()]
        except (OSError, ValueError):
            pass
    files = sorted(folder.glob("*.safetensors"))
    regular = [f for f in files if not f.name.startswith("consolidated")]
    return regular or files


def facts_from_folder(path: str | os.PathLike[str]) -> ModelFacts:
    """ModelFacts for a model directory (a baked model): config.json plus safetensors headers."""
    folder = Path(path).expanduser()
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise CapacityError(f"{folder} has no config.json")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as exc:
        raise CapacityError(f"{config_path} cannot be read as JSON") from exc
    return facts_from_config(config, safetensors_counts(_weight_files(folder)), source=str(folder))


def facts_from_hub(
    repo: str,
    revision: str | None = None,
    token: str | None = None,
    endpoint: str | None = None,
    *,
    timeout: float = 10.0,
    param_counts: Mapping[str, int] | None = None,
) -> ModelFacts:
    """ModelFacts for a Hub repository, without downloading weights.

    Two bounded requests: config.json, and `model_info(expand=["safetensors"])` for the
    counts per dtype, skipped when `param_counts` is given (the pre-flight already made
    that call: pass `PreflightResult.model_info_summary.safetensors_parameters`).
    """
    from huggingface_hub import HfApi, hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    base = (endpoint or "https://huggingface.co").rstrip("/")
    url = hf_hub_url(repo, "config.json", revision=revision, endpoint=base)
    headers = build_hf_headers(token=token or False, library_name="vllm-worker")
    response = get_session().get(url, headers=headers, timeout=timeout, follow_redirects=True)
    hf_raise_for_status(response)
    try:
        config = response.json()
    except ValueError as exc:
        raise CapacityError(f"{repo}'s config.json is not valid JSON") from exc
    if param_counts is None:
        info = HfApi(endpoint=base, token=False, library_name="vllm-worker").model_info(
            repo, revision=revision, timeout=timeout, expand=["safetensors"], token=token or False
        )
        safetensors = getattr(info, "safetensors", None)
        param_counts = dict(safetensors.parameters) if safetensors is not None else {}
    return facts_from_config(config, param_counts, source=repo)


def facts_from_cache(repo: str, revision: str | None) -> ModelFacts:
    """ModelFacts for a repository already in the local Hugging Face cache (HF_HUB_OFFLINE=1)."""
    from huggingface_hub import snapshot_download

    folder = snapshot_download(repo, revision=revision, local_files_only=True, allow_patterns=["*.json", "*.safetensors"])
    return replace(facts_from_folder(folder), source=repo)
