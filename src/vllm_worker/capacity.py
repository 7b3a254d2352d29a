"""How much of a card a model and its settings need, predicted before vLLM is launched.

A configuration that does not fit costs a user a full cold start (download, load,
profile) before vLLM says so, and the relaunch ladder then spends up to two more.
Most of what decides the outcome is arithmetic on facts known without any weights:
the model's `config.json`, the parameter counts per dtype (the Hub's safetensors
metadata, or the headers of local `.safetensors` files), and the settings. This
module does that arithmetic the way vLLM 0.32 does it, so the worker can start on a
configuration that fits, refuse one that cannot fit with the figures and the fixes,
and tell the user how many full-length conversations the card holds.

Two kinds of terms, kept apart on purpose:

- The KV-cache accounting (bytes per token, pages, blocks, hybrid sliding-window
  groups, MLA, the null block, the reported token count and concurrency) is exact:
  it mirrors vllm/v1/core/kv_cache_utils.py and vllm/v1/kv_cache_interface.py, and
  tests/engine/test_capacity_accuracy.py checks it token-for-token against the real
  engine with a fixed KV-cache size.
- What vLLM measures on a GPU at startup (weights as loaded, the activation peak of
  the profiling pass, non-torch allocations, the CUDA-graph estimate) is derived from
  the structure of vLLM's profiling code with the constants gathered in one block
  below, each with its source. These are estimates; `Plan.margin_bytes` is their
  stated error, and decisions only act on a prediction that is wrong by more than it.

Everything here is a pure function except `facts_from_hub`/`facts_from_folder` (I/O)
and `startup_plan`/`plan_cli`, the thin edges the worker and the CLI call.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import struct
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from vllm_worker.diagnosis import Diagnosis, parse_human_int
from vllm_worker.settings import multiple_of_8_at_least

MiB = 1 << 20
GiB = 1 << 30

# =====================================================================================
# vLLM 0.32 constants. Exact ones are read from the sources; estimated ones say so.
# =====================================================================================

# --- exact (vLLM 0.32 sources) ---
GPU_BLOCK_SIZE = 16  # config/cache.py CacheConfig.DEFAULT_BLOCK_SIZE; FlashAttention keeps it (flash_attn.py)
GPU_MLA_BLOCK_SIZE = 64  # v1/attention/backends/mla/flashmla.py get_supported_kernel_block_sizes (Hopper MLA)
CPU_BLOCK_SIZE = 128  # platforms/cpu.py: cache_config.block_size = 128 unless set
CPU_MLA_BLOCK_SIZE = 16  # platforms/cpu.py: the reference CPU MLA kernel forces 16 (no AMX)
DEFAULT_UTILIZATION = 0.92  # config/cache.py gpu_memory_utilization default (also startup_errors)
HIGHEST_ADVISED_UTILIZATION = 0.95  # the most the worker advises (startup_errors)
EAGER_MAX_BATCHED_TOKENS = 8192  # recovery's eager step caps MAX_NUM_BATCHED_TOKENS here
# engine/arg_utils.py get_batch_defaults, OPENAI_API_SERVER usage context:
# >= 160 GiB: 16384 tokens / 1024 seqs; >= 70 GiB and not A100: 8192 / 1024; else 2048 / 256;
# CPU: 2048 x world size / 128 x world size.
DEFAULT_CAPTURE_CEILING = 512  # config/vllm.py: max_cudagraph_capture_size default (1024 on B200/B300)
# v1/core/sched + config/vllm.py max_concurrent_batches: 2 with async scheduling (the GPU
# default), 1 on CPU (platforms/cpu.py sets async_scheduling = False).
# The least context the worker launches a fitted or advised configuration with (MAX_MODEL_LEN=auto,
# more GPUs): a worker decision, not vLLM's.
_MIN_USEFUL_CONTEXT = 4096
MLA_MODEL_TYPES = frozenset(
    {
        "axk1", "deepseek_v2", "deepseek_v3", "deepseek_v32", "deepseek_mtp", "dots3_note", "k3_dspark",
        "glm5_next", "glm5_next_text", "glm_moe_dsa", "glm4_moe_lite", "kimi_k2", "kimi_linear",
        "longcat_flash", "pangu_ultra_moe", "bailing_hybrid", "hy_v4",
    }
)  # transformers_utils/model_arch_config_convertor.py is_deepseek_mla (those with kv_lora_rank)

# --- estimated (GPU-only terms; see docs/capacity.md for the derivation and the error) ---
# Non-torch memory allocated after vLLM's baseline snapshot (taken after CUDA and NCCL
# init, gpu_worker.py init_device): cuBLAS/cuBLASLt workspaces, kernels loaded on first
# use, NCCL/custom all-reduce buffers with TP. vLLM logs 0.16-0.20 GiB single-GPU
# (vLLM PR #12126, PR #14447 logs); TP adds communication buffers.
NON_TORCH_BYTES = 256 * MiB
NON_TORCH_TP_EXTRA_BYTES = 512 * MiB
# CUDA context and driver state that exist before the baseline snapshot: not in the
# budget, but vLLM refuses to start when free memory < utilization x total (request_memory).
CUDA_CONTEXT_BYTES = 512 * MiB
# Sampler warm-up (gpu_model_runner.py _dummy_sampler_run) on min(max_num_seqs,
# max_num_batched_tokens) rows x vocab: logits in the model dtype, a float32 copy
# (sampler.py), softmax probs and exponential noise (topk_topp_sampler.py random_sample).
SAMPLER_FP32_COPIES = 3
# Driver memory per captured CUDA graph and decoder layer: ~24 MiB per FULL graph on a
# 64-layer model (vLLM issue #50780), 0.36 GiB for 16 PIECEWISE sizes (gpustack/runner PR #251).
GRAPH_BYTES_PER_LAYER = 384 * 1024
GRAPH_MIN_BYTES = 1 * MiB  # gpu_model_runner.py profile_cudagraph_memory: at least 1 MiB per graph
# Relative error of each estimated term (docs/capacity.md, "Expected error").
ERROR_FIXED = 256 * MiB
ERROR_WEIGHTS = 0.02
ERROR_WEIGHTS_FROM_CONFIG = 0.10
ERROR_ACTIVATION = 0.5
ERROR_GRAPHS = 0.5
ERROR_NON_TORCH = 1.0

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
KV_DTYPE_BYTES = {
    "bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1,
}

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


# =====================================================================================
# Model facts
# =====================================================================================


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

    base = (endpoint or os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
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


# =====================================================================================
# Settings
# =====================================================================================


def parse_size(text: str) -> int:
    """Bytes from '24GiB', '80GB', '24G' (binary), '1.5TiB', or a plain number of bytes."""
    m = re.fullmatch(r"\s*([\d.]+)\s*([kmgt]?)(i?)(b?)\s*", text, re.IGNORECASE)
    if not m or not m.group(1).replace(".", "", 1).isdigit():
        raise CapacityError(f"{text!r} is not a memory size; use a figure such as 24GiB or 80GB")
    number, unit, binary, _ = m.groups()
    power = "kmgt".find(unit.lower()) + 1 if unit else 0
    # A bare unit letter (24G) means binary, as nvidia-smi and vLLM's K/M/G do; GB is decimal.
    base = 1024 if binary or (unit and not m.group(4)) else 1000
    return int(float(number) * base**power)


_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}

# VLLM_EXTRA_ARGS flags that change the plan -> env name they stand for.
_EXTRA_FLAGS = {
    "--max-model-len": "MAX_MODEL_LEN",
    "--max-num-seqs": "MAX_NUM_SEQS",
    "--max-num-batched-tokens": "MAX_NUM_BATCHED_TOKENS",
    "--gpu-memory-utilization": "GPU_MEMORY_UTILIZATION",
    "--kv-cache-memory-bytes": "KV_CACHE_MEMORY_BYTES",
    "--kv-cache-memory": "KV_CACHE_MEMORY_BYTES",
    "--kv-cache-dtype": "KV_CACHE_DTYPE",
    "--tensor-parallel-size": "TENSOR_PARALLEL_SIZE",
    "-tp": "TENSOR_PARALLEL_SIZE",
    "--pipeline-parallel-size": "PIPELINE_PARALLEL_SIZE",
    "-pp": "PIPELINE_PARALLEL_SIZE",
    "--block-size": "BLOCK_SIZE",
    "--dtype": "DTYPE",
    "--quantization": "QUANTIZATION",
    "-q": "QUANTIZATION",
    "--num-gpu-blocks-override": "NUM_GPU_BLOCKS_OVERRIDE",
    "--cpu-offload-gb": "CPU_OFFLOAD_GB",
}
_EXTRA_BOOLS = {
    "--enforce-eager": ("ENFORCE_EAGER", "true"),
    "--no-enforce-eager": ("ENFORCE_EAGER", "false"),
    "--disable-sliding-window": ("DISABLE_SLIDING_WINDOW", "true"),
    "--disable-hybrid-kv-cache-manager": ("DISABLE_HYBRID_KV_CACHE_MANAGER", "true"),
    "--no-enable-chunked-prefill": ("ENABLE_CHUNKED_PREFILL", "false"),
    "--no-async-scheduling": ("ASYNC_SCHEDULING", "false"),
}


def effective_env(env: Mapping[str, str]) -> dict[str, str]:
    """The env with VLLM_EXTRA_ARGS flags folded in (they come last on the command line, so they win)."""
    merged = {k: v for k, v in env.items() if v is not None}
    raw = (env.get("VLLM_EXTRA_ARGS") or "").strip()
    if not raw:
        return merged
    try:
        words = shlex.split(raw)
    except ValueError:
        return merged
    i = 0
    while i < len(words):
        word = words[i]
        flag, _, inline = word.partition("=")
        if flag.startswith("--"):
            flag = "--" + flag[2:].replace("_", "-")
        if flag in _EXTRA_BOOLS:
            name, value = _EXTRA_BOOLS[flag]
            merged[name] = value
        elif flag in _EXTRA_FLAGS:
            value = inline if inline else (words[i + 1] if i + 1 < len(words) else "")
            if not inline:
                i += 1
            merged[_EXTRA_FLAGS[flag]] = value
        i += 1
    return merged


def _get(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    if value is None or str(value).strip() == "":
        return None
    return str(value).strip()


def _int(env: Mapping[str, str], name: str, *, zero_unset: bool = True, human: bool = False) -> int | None:
    value = _get(env, name)
    if value is None:
        return None
    try:
        number = parse_human_int(value) if human else int(value)
    except ValueError:
        raise CapacityError(f"{name}={value!r} is not a whole number") from None
    return None if zero_unset and number == 0 else number


def _bool(env: Mapping[str, str], name: str) -> bool | None:
    value = _get(env, name)
    if value is None:
        return None
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise CapacityError(f"{name}={value!r} is not true or false")


@dataclass(frozen=True)
class Knobs:
    """The settings that decide the memory budget, resolved to what vLLM 0.32 will use."""

    platform: str = "cuda"  # "cuda" or "cpu"
    utilization: float = DEFAULT_UTILIZATION
    max_model_len: int | None = None  # None: the model's full context; -1: auto-fit
    max_num_seqs: int | None = None  # None: vLLM's default for the card
    max_num_batched_tokens: int | None = None  # None: vLLM's default for the card
    kv_cache_dtype: str = "auto"
    kv_cache_memory_bytes: int | None = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    enforce_eager: bool = False
    dtype: str = "auto"
    quantization: str | None = None
    block_size: int | None = None
    num_gpu_blocks_override: int | None = None
    disable_sliding_window: bool = False
    disable_hybrid_kv_cache_manager: bool = False
    chunked_prefill: bool = True
    async_scheduling: bool | None = None  # None: vLLM's default (True on GPU, False on CPU)
    cpu_offload_bytes: int = 0
    estimate_cudagraphs: bool = True  # VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS
    allow_long_max_model_len: bool = False  # VLLM_ALLOW_LONG_MAX_MODEL_LEN
    device_name: str | None = None


def knobs_from_env(
    env: Mapping[str, str],
    *,
    max_concurrency: int | None = None,
    platform: str = "cuda",
    device_name: str | None = None,
) -> Knobs:
    """Knobs from the worker's variables (and VLLM_EXTRA_ARGS). MAX_NUM_SEQS defaults as the worker's."""
    env = effective_env(env)
    util = _get(env, "GPU_MEMORY_UTILIZATION")
    try:
        utilization = float(util) if util is not None else DEFAULT_UTILIZATION
    except ValueError:
        raise CapacityError(f"GPU_MEMORY_UTILIZATION={util!r} is not a number") from None
    raw_len = _get(env, "MAX_MODEL_LEN")
    if raw_len is not None and (raw_len.lower() == "auto" or raw_len == "-1"):
        max_model_len: int | None = -1
    else:
        max_model_len = _int(env, "MAX_MODEL_LEN", human=True)
    seqs = _int(env, "MAX_NUM_SEQS")
    if seqs is None and max_concurrency is not None:
        seqs = multiple_of_8_at_least(max_concurrency)
    estimate = (_get(env, "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS") or "1").lower() not in _FALSE
    offload = _get(env, "CPU_OFFLOAD_GB")
    return Knobs(
        platform=platform,
        utilization=utilization,
        max_model_len=max_model_len,
        max_num_seqs=seqs,
        max_num_batched_tokens=_int(env, "MAX_NUM_BATCHED_TOKENS", human=True),
        kv_cache_dtype=(_get(env, "KV_CACHE_DTYPE") or "auto").lower(),
        kv_cache_memory_bytes=_int(env, "KV_CACHE_MEMORY_BYTES", human=True),
        tensor_parallel_size=_int(env, "TENSOR_PARALLEL_SIZE") or 1,
        pipeline_parallel_size=_int(env, "PIPELINE_PARALLEL_SIZE") or 1,
        enforce_eager=bool(_bool(env, "ENFORCE_EAGER")),
        dtype=(_get(env, "DTYPE") or "auto").lower(),
        quantization=(_get(env, "QUANTIZATION") or None),
        block_size=_int(env, "BLOCK_SIZE"),
        num_gpu_blocks_override=_int(env, "NUM_GPU_BLOCKS_OVERRIDE"),
        disable_sliding_window=bool(_bool(env, "DISABLE_SLIDING_WINDOW")),
        disable_hybrid_kv_cache_manager=bool(_bool(env, "DISABLE_HYBRID_KV_CACHE_MANAGER")),
        chunked_prefill=_bool(env, "ENABLE_CHUNKED_PREFILL") is not False,
        async_scheduling=_bool(env, "ASYNC_SCHEDULING"),
        cpu_offload_bytes=int(float(offload) * GiB) if offload else 0,
        estimate_cudagraphs=estimate,
        allow_long_max_model_len=(_get(env, "VLLM_ALLOW_LONG_MAX_MODEL_LEN") or "0").lower() not in _FALSE,
        device_name=device_name,
    )


# =====================================================================================
# KV cache accounting (exact: mirrors vLLM 0.32's kv_cache_utils.py / kv_cache_interface.py)
# =====================================================================================


def model_dtype_bytes(facts: ModelFacts, dtype: str = "auto") -> int:
    """Bytes per element of the model dtype vLLM runs (config/model.py _get_and_verify_dtype).

    'auto' takes the config's dtype and downcasts float32 to bfloat16/float16: 2 bytes
    in every case but an explicit DTYPE=float32.
    """
    if dtype not in ("auto", ""):
        if dtype not in TORCH_DTYPE_BYTES:
            raise CapacityError(f"DTYPE={dtype!r} is not a dtype the plan knows")
        return TORCH_DTYPE_BYTES[dtype]
    return 2


def kv_dtype_bytes(facts: ModelFacts, kv_cache_dtype: str = "auto", dtype: str = "auto") -> int:
    """Bytes per cached element: 'auto' follows the checkpoint's KV scheme, else the model dtype."""
    kv = kv_cache_dtype.lower()
    if kv == "auto":
        if facts.kv_cache_scheme:
            return 1
        return model_dtype_bytes(facts, dtype)
    if kv not in KV_DTYPE_BYTES:
        raise CapacityError(f"KV_CACHE_DTYPE={kv_cache_dtype!r} is not modeled (known: auto, fp8, fp8_e4m3, fp8_e5m2, bfloat16, float16)")
    return KV_DTYPE_BYTES[kv]


def kv_heads_per_rank(facts: ModelFacts, tensor_parallel_size: int = 1) -> int:
    """KV heads one GPU holds: MLA 1; else total // TP, never below 1 (config/model.py get_num_kv_heads)."""
    if facts.mla:
        return 1
    return max(1, facts.num_kv_heads // max(1, tensor_parallel_size))


def kv_bytes_per_token_per_layer(facts: ModelFacts, tensor_parallel_size: int = 1, kv_cache_dtype: str = "auto", dtype: str = "auto") -> int:
    """One layer's KV bytes per token on one GPU: 2 x kv_heads x head_dim x bytes; MLA: latent x bytes."""
    size = kv_dtype_bytes(facts, kv_cache_dtype, dtype)
    if facts.mla:
        return facts.head_dim * size  # MLAAttentionSpec: head_size_v = 0, one latent "head"
    return kv_heads_per_rank(facts, tensor_parallel_size) * 2 * facts.head_dim * size


def kv_bytes_per_token(facts: ModelFacts, tensor_parallel_size: int = 1, kv_cache_dtype: str = "auto", dtype: str = "auto") -> int:
    """KV bytes per token over all layers on one GPU (sliding-window layers counted while inside their window)."""
    return facts.num_layers * kv_bytes_per_token_per_layer(facts, tensor_parallel_size, kv_cache_dtype, dtype)


@dataclass(frozen=True)
class KVGroup:
    """One KV-cache group: layers sharing a block table (kv_cache_utils.py get_kv_cache_groups)."""

    window: int | None  # None = full attention
    layers: int
    page_bytes: int  # per layer
    block_size: int


@dataclass(frozen=True)
class KVLayout:
    block_size: int
    groups: tuple[KVGroup, ...]
    bytes_per_block: int  # what one block id costs in the shared pool
    per_token_bytes: int  # all layers, one GPU
    hybrid: bool
    note: str | None = None


def default_block_size(facts: ModelFacts, knobs: Knobs) -> int:
    if knobs.platform == "cpu":
        if facts.mla:
            return CPU_MLA_BLOCK_SIZE
        return knobs.block_size or CPU_BLOCK_SIZE
    if knobs.block_size:
        return knobs.block_size
    return GPU_MLA_BLOCK_SIZE if facts.mla else GPU_BLOCK_SIZE


def kv_layout(facts: ModelFacts, knobs: Knobs) -> KVLayout:
    """The KV-cache groups and the bytes of one block, as vLLM 0.32 builds them."""
    if facts.not_modeled:
        raise CapacityError(f"{facts.source or 'this model'}: {facts.not_modeled}")
    block = default_block_size(facts, knobs)
    per_token_layer = kv_bytes_per_token_per_layer(facts, knobs.tensor_parallel_size, knobs.kv_cache_dtype, knobs.dtype)
    page = block * per_token_layer
    layers = math.ceil(facts.num_layers / max(1, knobs.pipeline_parallel_size))
    windows = list(facts.layer_windows[:layers])
    if knobs.disable_sliding_window:
        windows = [None] * layers
    has_full = any(w is None for w in windows)
    has_sliding = any(w is not None for w in windows)
    if has_full and has_sliding and knobs.disable_hybrid_kv_cache_manager:
        # unify_hybrid_kv_cache_specs: sliding layers promoted to full attention
        windows = [None] * layers
    buckets: dict[int | None, int] = {}
    for w in windows:
        buckets[w] = buckets.get(w, 0) + 1
    if len(buckets) == 1:
        # Uniform spec: one group with every layer (_get_kv_cache_groups_uniform_spec).
        (w, count), = buckets.items()
        groups = (KVGroup(w, count, page, block),)
        return KVLayout(block, groups, count * page, layers * per_token_layer, hybrid=False)
    # Hybrid with one page size (_get_kv_cache_groups_uniform_page_size): same-size groups.
    counts = list(buckets.values())
    group_size = min(counts)
    if max(counts) < group_size * 1.5:
        group_size = max(counts)
    groups_list: list[KVGroup] = []
    for w, count in buckets.items():
        n_groups = math.ceil(count / group_size)
        for i in range(n_groups):
            members = len(range(i, count, n_groups))  # layers[i::num_groups]
            groups_list.append(KVGroup(w, members, page, block))
    bytes_per_block = max(g.layers * g.page_bytes for g in groups_list)
    return KVLayout(block, tuple(groups_list), bytes_per_block, layers * per_token_layer, hybrid=True)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def blocks_per_request(layout: KVLayout, max_model_len: int, max_in_flight_tokens: int) -> int:
    """Blocks one request at `max_model_len` draws from the pool, summed over groups."""
    total = 0
    for group in layout.groups:
        if group.window is None:
            total += _cdiv(max_model_len, group.block_size)  # FullAttentionSpec.max_memory_usage_bytes
        else:
            # SlidingWindowSpec.max_admission_blocks_per_request
            tokens = min(group.window - 1 + max_in_flight_tokens, max_model_len)
            total += _cdiv(tokens, group.block_size) + 1
    return total


def kv_capacity(num_blocks: int, layout: KVLayout, max_model_len: int, max_in_flight_tokens: int) -> tuple[int, float]:
    """(tokens, max concurrency) exactly as vLLM reports them (kv_cache_utils.py get_kv_cache_capacity)."""
    per_request = blocks_per_request(layout, max_model_len, max_in_flight_tokens)
    concurrency = num_blocks / per_request
    return int(concurrency * max_model_len), concurrency


def longest_fitting_len(layout: KVLayout, available_bytes: int, model_max: int, max_in_flight_tokens: int) -> int:
    """vLLM's estimate_max_model_len: the longest context one request can hold, the null block reserved."""
    budget = available_bytes - layout.bytes_per_block
    if budget < layout.bytes_per_block * blocks_per_request(layout, 1, max_in_flight_tokens):
        return 0
    low, high, best = 1, max(1, model_max), 1
    while low <= high:
        mid = (low + high) // 2
        if layout.bytes_per_block * blocks_per_request(layout, mid, max_in_flight_tokens) <= budget:
            best, low = mid, mid + 1
        else:
            high = mid - 1
    return best


# =====================================================================================
# The budget (GPU terms estimated; see the constants block)
# =====================================================================================


def resolved_batch(facts: ModelFacts, knobs: Knobs, device_total: int | None, max_model_len: int) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) vLLM will run (engine/arg_utils.py defaults)."""
    world = knobs.tensor_parallel_size * knobs.pipeline_parallel_size
    if knobs.platform == "cpu":
        default_tokens, default_seqs = 2048 * world, 128 * world
    else:
        total = device_total or 0
        name = (knobs.device_name or "").lower()
        if total >= 160 * GiB:
            default_tokens, default_seqs = 16384, 1024
        elif total >= 70 * GiB and "a100" not in name:
            default_tokens, default_seqs = 8192, 1024
        else:
            default_tokens, default_seqs = 2048, 256
    seqs = knobs.max_num_seqs or default_seqs
    tokens = knobs.max_num_batched_tokens
    if tokens is None:
        tokens = default_tokens
        if not knobs.chunked_prefill:
            tokens = max(max_model_len, tokens)
        tokens = min(seqs * max_model_len, tokens)
    if knobs.max_num_seqs is None:
        seqs = min(seqs, tokens)
    return seqs, tokens


def in_flight_tokens(knobs: Knobs, max_num_batched_tokens: int) -> int:
    """vllm_config.max_in_flight_tokens: one batch per concurrent step (2 with async scheduling)."""
    async_on = knobs.async_scheduling if knobs.async_scheduling is not None else knobs.platform != "cpu"
    if knobs.platform == "cpu":
        async_on = False  # platforms/cpu.py: async scheduling is always off on CPU
    return max_num_batched_tokens * (2 if async_on else 1)


def capture_sizes(max_num_seqs: int, max_num_batched_tokens: int, ceiling: int = DEFAULT_CAPTURE_CEILING) -> list[int]:
    """CUDA-graph capture sizes (config/vllm.py _set_cudagraph_sizes, decode query length 1)."""
    top = min(max_num_seqs * 2, ceiling)
    top = min(max_num_batched_tokens, top)
    sizes = [i for i in (1, 2, 4) if i <= top]
    if top >= 8:
        sizes += list(range(8, min(top + 1, 256), 8))
    if top >= 256:
        sizes += list(range(256, top + 1, 16))
    if max_num_batched_tokens <= top and max_num_batched_tokens not in sizes:
        sizes.append(max_num_batched_tokens)
    if max_num_seqs <= min(max_num_seqs * 2, ceiling) and max_num_seqs <= max_num_batched_tokens:
        sizes.append(max_num_seqs)
    return sorted(set(sizes))


def weights_bytes(facts: ModelFacts, knobs: Knobs) -> tuple[int, str]:
    """Weight bytes as vLLM holds them (all GPUs together) and where the figure comes from."""
    dtype_bytes = model_dtype_bytes(facts, knobs.dtype)
    if facts.param_counts:
        floats = sum(c for d, c in facts.param_counts.items() if d in FLOAT_DTYPES)
        others = sum(c * DTYPE_BITS.get(d, 16) / 8 for d, c in facts.param_counts.items() if d not in FLOAT_DTYPES)
        if facts.quant_method:
            # Quantized checkpoints keep their storage (packed ints, fp8, scales) as loaded.
            total = sum(c * DTYPE_BITS.get(d, 16) / 8 for d, c in facts.param_counts.items())
        else:
            total = floats * dtype_bytes + others
        source = "safetensors"
        params = sum(facts.param_counts.values())
    else:
        params = estimate_params(facts)
        total = params * dtype_bytes
        source = "estimated from config.json"
    quant = (knobs.quantization or "").lower()
    if quant and not facts.quant_method and quant in ("fp8", "bitsandbytes", "int8"):
        # Online quantization of the linear layers; embeddings stay in the model dtype.
        embeddings = facts.vocab_size * facts.hidden_size * (1 if facts.tie_word_embeddings else 2)
        linear = max(0, params - embeddings)
        per = 0.5 if quant == "bitsandbytes" else 1.0
        total = embeddings * dtype_bytes + linear * per
        source += f", quantized online ({quant})"
    return int(total), source


def activation_bytes(facts: ModelFacts, knobs: Knobs, seqs: int, tokens: int) -> int:
    """The profiling pass's transient peak (gpu_model_runner.py profile_run): forward then sampler."""
    b = model_dtype_bytes(facts, knobs.dtype)
    tp = max(1, knobs.tensor_parallel_size)
    h = facts.hidden_size
    head = facts.head_dim if not facts.mla else h // max(1, facts.num_attention_heads)
    attention = (facts.num_attention_heads * 2 + 2 * facts.num_kv_heads) * head / tp + 2 * h
    dense = 3 * facts.intermediate_size / tp + 2 * h  # gate_up (2I) + SiluAndMul out (I), residual, hidden
    per_token = max(attention, dense)
    if facts.num_experts:
        routed = facts.experts_per_token * (3 * facts.moe_intermediate_size / tp + h)  # fused_moe caches 1-3
        shared = 3 * facts.shared_intermediate_size / tp
        per_token = max(per_token, max(routed, shared) + 2 * h + facts.num_experts * 4 / b)
    forward = tokens * per_token * b
    rows = min(seqs, tokens)
    sampler = rows * facts.vocab_size * (b + 4 * SAMPLER_FP32_COPIES) + rows * h * b
    held = tokens * h * b  # hidden states live through the sampler run
    return int(max(forward, sampler) + held)


def cudagraph_bytes(facts: ModelFacts, knobs: Knobs, seqs: int, tokens: int) -> tuple[int, int]:
    """(estimated CUDA-graph memory, graphs captured); 0 when eager or the estimate is off."""
    if knobs.enforce_eager or knobs.platform == "cpu":
        return 0, 0
    sizes = capture_sizes(seqs, tokens)
    piecewise = len(sizes)
    full = len([s for s in sizes if s <= seqs])  # FULL_AND_PIECEWISE: FULL graphs for uniform decode
    layers = math.ceil(facts.num_layers / max(1, knobs.pipeline_parallel_size))
    per_graph = max(GRAPH_MIN_BYTES, GRAPH_BYTES_PER_LAYER * layers)
    b = model_dtype_bytes(facts, knobs.dtype)
    largest = max(sizes) if sizes else 0
    first = largest * (3 * facts.intermediate_size / max(1, knobs.tensor_parallel_size) + 2 * facts.hidden_size) * b
    estimate = int(first + per_graph * (piecewise + full - 1)) if sizes else 0
    return (estimate if knobs.estimate_cudagraphs else 0), piecewise + full


# =====================================================================================
# The plan
# =====================================================================================


@dataclass(frozen=True)
class Change:
    """One setting change that makes the configuration fit (by the plan, with its margin)."""

    variable: str  # the worker variable, or "GPU" for a larger card
    value: str
    flag: str  # the `vllm-worker plan` spelling
    effect: str  # what it buys, in words

    def __str__(self) -> str:
        if self.variable == "GPU":
            return f"use a GPU with more memory ({self.effect}, such as {self.value})"
        return f"set {self.variable}={self.value} ({self.effect})"


@dataclass(frozen=True)
class Plan:
    """A predicted vLLM 0.32 start: the budget, the KV cache, and whether one full-length request fits.

    Sizes are per GPU. `kv_cache_tokens` and `max_concurrency` are the figures vLLM logs
    in "KV cache size: N tokens, Maximum concurrency for L tokens per request: Cx".
    """

    model: str
    platform: str
    device_total_bytes: int | None
    gpus: int
    utilization: float
    requested_bytes: int | None
    weights_bytes: int  # per GPU
    weights_total_bytes: int
    weights_source: str
    non_torch_bytes: int
    activation_bytes: int
    cudagraph_bytes: int
    graphs: int
    kv_cache_bytes: int  # memory the KV cache gets on one GPU
    kv_exact: bool  # True when the KV memory is set explicitly (no GPU estimate involved)
    kv_bytes_per_token: int
    block_size: int
    bytes_per_block: int
    num_blocks: int
    kv_cache_tokens: int
    model_max_len: int
    max_model_len: int  # the context the engine runs with
    max_model_len_fits: int  # the longest context one request can hold (capped at the model's)
    max_model_len_fits_margin: int  # the same if the prediction is off by margin_bytes
    max_concurrency: float  # at max_model_len
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_cache_dtype: str
    enforce_eager: bool
    tensor_parallel_size: int
    needed_bytes: int  # KV bytes one request at max_model_len needs, the null block included
    surplus_bytes: int  # kv_cache_bytes - needed_bytes (negative: does not fit)
    margin_bytes: int  # the expected error of the prediction
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    changes: tuple[Change, ...] = ()

    @property
    def fits(self) -> bool:
        return not self.problems and self.surplus_bytes >= 0

    @property
    def verdict(self) -> str:
        """'fits', 'uncertain' (within the margin either way) or 'does_not_fit'."""
        if self.problems:
            return "does_not_fit"
        if self.surplus_bytes >= self.margin_bytes:
            return "fits"
        if self.surplus_bytes < -self.margin_bytes:
            return "does_not_fit"
        return "uncertain"

    @property
    def smallest_change(self) -> Change | None:
        return self.changes[0] if self.changes else None

    def to_json(self) -> dict[str, Any]:
        """One JSON object; `max_model_len` is the longest context that fits, `context_len` the one planned."""
        data = asdict(self)
        data["context_len"] = self.max_model_len
        data["max_model_len"] = self.max_model_len_fits
        data["changes"] = [asdict(c) for c in self.changes]
        data["fits"] = self.fits
        data["verdict"] = self.verdict
        data["smallest_change"] = asdict(self.changes[0]) if self.changes else None
        data["problems"] = list(self.problems)
        data["notes"] = list(self.notes)
        data["max_concurrency"] = round(self.max_concurrency, 4)
        return data


def _resolved_max_len(facts: ModelFacts, knobs: Knobs) -> tuple[int, bool, list[str]]:
    """(max_model_len before auto-fit, auto, notes)."""
    notes: list[str] = []
    model_max = facts.max_context
    if knobs.max_model_len is None:
        return model_max, False, notes
    if knobs.max_model_len == -1:
        return model_max, True, notes
    if knobs.max_model_len > model_max and not knobs.allow_long_max_model_len:
        # vLLM refuses this at once, before any download, with its own message (startup_errors
        # words it): not a memory question, so the plan does not decide on it.
        notes.append(f"MAX_MODEL_LEN={knobs.max_model_len} is longer than the model's {model_max}-token context; vLLM will refuse it")
    return knobs.max_model_len, False, notes


def plan(facts: ModelFacts, device_total_bytes: int | None, knobs: Knobs, *, with_changes: bool = True, max_concurrency: int | None = None) -> Plan:
    """Predict vLLM 0.32's start for `knobs` on a GPU of `device_total_bytes` (per GPU).

    Without a device total the KV memory must be explicit (KV_CACHE_MEMORY_BYTES), as on
    the CPU engine; the KV figures are then exact.
    """
    layout = kv_layout(facts, knobs)
    gpus = knobs.tensor_parallel_size * knobs.pipeline_parallel_size
    max_len, auto, len_notes = _resolved_max_len(facts, knobs)
    problems: list[str] = []
    seqs, tokens = resolved_batch(facts, knobs, device_total_bytes, max_len)
    in_flight = in_flight_tokens(knobs, tokens)
    weights_total, weights_source = weights_bytes(facts, knobs)
    weights_gpu = max(0, int(weights_total / gpus) - knobs.cpu_offload_bytes)
    notes = list(facts.notes) + len_notes
    if knobs.pipeline_parallel_size > 1:
        notes.append("pipeline parallelism is approximated (layers and weights split evenly)")
    if layout.note:
        notes.append(layout.note)
    requested: int | None = None
    non_torch = activation = graphs_bytes = graphs = 0
    exact = knobs.kv_cache_memory_bytes is not None
    if knobs.kv_cache_memory_bytes is not None:
        available = knobs.kv_cache_memory_bytes
        if knobs.platform == "cuda" and device_total_bytes is not None:
            # vLLM skips its memory check for an explicit size; the card must still hold it all.
            non_torch = NON_TORCH_BYTES + (NON_TORCH_TP_EXTRA_BYTES if gpus > 1 else 0)
            activation = activation_bytes(facts, knobs, seqs, tokens)
            graphs_bytes, graphs = cudagraph_bytes(facts, knobs, seqs, tokens)
            total_need = weights_gpu + non_torch + activation + graphs_bytes + available
            slack = ERROR_FIXED + ERROR_ACTIVATION * activation + ERROR_GRAPHS * graphs_bytes + ERROR_NON_TORCH * non_torch
            if total_need > device_total_bytes - CUDA_CONTEXT_BYTES + slack:
                problems.append(
                    f"KV_CACHE_MEMORY_BYTES={available} plus the weights ({_gib(weights_gpu)} GiB) and activations "
                    f"need {_gib(total_need)} GiB, more than the {_gib(device_total_bytes)} GiB GPU holds"
                )
    elif device_total_bytes is None:
        raise CapacityError("the plan needs the GPU memory (or KV_CACHE_MEMORY_BYTES) to size the KV cache")
    elif knobs.platform == "cpu":
        raise CapacityError("on the CPU engine the plan needs KV_CACHE_MEMORY_BYTES (vLLM sizes it from the process's RSS otherwise)")
    else:
        requested = math.ceil(device_total_bytes * knobs.utilization)
        non_torch = NON_TORCH_BYTES + (NON_TORCH_TP_EXTRA_BYTES if gpus > 1 else 0)
        activation = activation_bytes(facts, knobs, seqs, tokens)
        graphs_bytes, graphs = cudagraph_bytes(facts, knobs, seqs, tokens)
        available = requested - weights_gpu - non_torch - activation - graphs_bytes
        if requested > device_total_bytes - CUDA_CONTEXT_BYTES + ERROR_FIXED:
            problems.append(
                f"GPU_MEMORY_UTILIZATION={knobs.utilization:g} asks for {_gib(requested)} GiB, more than a "
                f"{_gib(device_total_bytes)} GiB GPU has free once CUDA is initialised"
            )
    if knobs.num_gpu_blocks_override:
        available = knobs.num_gpu_blocks_override * layout.bytes_per_block
    if facts.params_source == "none" and not exact:
        notes.append("the checkpoint's parameter counts are unknown: weights estimated from config.json")
    margin = 0
    if not exact:
        weight_error = ERROR_WEIGHTS if facts.param_counts else ERROR_WEIGHTS_FROM_CONFIG
        margin = int(
            ERROR_FIXED
            + weight_error * weights_gpu
            + ERROR_ACTIVATION * activation
            + ERROR_GRAPHS * graphs_bytes
            + ERROR_NON_TORCH * non_torch
        )
    num_blocks = max(0, available // layout.bytes_per_block) if available > 0 else 0
    fits_len = min(facts.max_context, longest_fitting_len(layout, max(0, available), facts.max_context, in_flight))
    fits_len_margin = min(fits_len, longest_fitting_len(layout, max(0, available - margin), facts.max_context, in_flight))
    # One request at max_model_len, plus the null block BlockPool holds back.
    needed = layout.bytes_per_block * (blocks_per_request(layout, max_len, in_flight) + 1)
    if auto:
        # vLLM fits the context to the memory it measures: what must fit is one block.
        max_len = max(1, min(max_len, fits_len))
        needed = layout.bytes_per_block * (blocks_per_request(layout, 1, in_flight) + 1)
    tokens_reported, concurrency = kv_capacity(num_blocks, layout, max_len, in_flight)
    result = Plan(
        model=facts.source,
        platform=knobs.platform,
        device_total_bytes=device_total_bytes,
        gpus=gpus,
        utilization=knobs.utilization,
        requested_bytes=requested,
        weights_bytes=weights_gpu,
        weights_total_bytes=weights_total,
        weights_source=weights_source,
        non_torch_bytes=non_torch,
        activation_bytes=activation,
        cudagraph_bytes=graphs_bytes,
        graphs=graphs,
        kv_cache_bytes=int(available),
        kv_exact=exact,
        kv_bytes_per_token=layout.per_token_bytes,
        block_size=layout.block_size,
        bytes_per_block=layout.bytes_per_block,
        num_blocks=num_blocks,
        kv_cache_tokens=tokens_reported,
        model_max_len=facts.max_context,
        max_model_len=max_len,
        max_model_len_fits=fits_len,
        max_model_len_fits_margin=fits_len_margin,
        max_concurrency=concurrency,
        max_num_seqs=seqs,
        max_num_batched_tokens=tokens,
        kv_cache_dtype=knobs.kv_cache_dtype,
        enforce_eager=knobs.enforce_eager,
        tensor_parallel_size=knobs.tensor_parallel_size,
        needed_bytes=needed,
        surplus_bytes=int(available - needed),
        margin_bytes=margin,
        problems=tuple(problems),
        notes=tuple(notes),
    )
    if with_changes and result.verdict != "fits":
        result = replace(result, changes=tuple(_changes(facts, device_total_bytes, knobs, result, max_concurrency)))
    return result


def _changes(facts: ModelFacts, total: int | None, knobs: Knobs, base: Plan, max_concurrency: int | None) -> list[Change]:
    """Single setting changes that make `base` fit with its margin, least costly first."""
    found: list[Change] = []

    def fits(candidate: Knobs, device: int | None = total) -> Plan | None:
        try:
            p = plan(facts, device, candidate, with_changes=False)
        except CapacityError:
            return None
        return p if p.verdict == "fits" else None

    gpu = knobs.platform == "cuda" and total is not None and knobs.kv_cache_memory_bytes is None
    if gpu and knobs.utilization > HIGHEST_ADVISED_UTILIZATION and base.problems:
        if fits(replace(knobs, utilization=HIGHEST_ADVISED_UTILIZATION)):
            found.append(Change("GPU_MEMORY_UTILIZATION", f"{HIGHEST_ADVISED_UTILIZATION:g}", "--gpu-memory-utilization",
                                f"leaves room for the CUDA context; now {knobs.utilization:g}"))
    if gpu and knobs.utilization < HIGHEST_ADVISED_UTILIZATION:
        for step in range(math.ceil(knobs.utilization * 100) + 1, int(HIGHEST_ADVISED_UTILIZATION * 100) + 1):
            if fits(replace(knobs, utilization=step / 100)):
                found.append(Change("GPU_MEMORY_UTILIZATION", f"{step / 100:g}", "--gpu-memory-utilization",
                                    f"vLLM may use {step}% of the GPU; now {knobs.utilization:g}"))
                break
    if gpu:
        target = multiple_of_8_at_least(max_concurrency) if max_concurrency else 8
        if base.max_num_seqs > target and fits(replace(knobs, max_num_seqs=target)):
            found.append(Change("MAX_NUM_SEQS", str(target), "--max-num-seqs",
                                f"a smaller sampler and fewer CUDA graphs; now {base.max_num_seqs}"))
    if kv_dtype_bytes(facts, knobs.kv_cache_dtype, knobs.dtype) > 1 and not facts.mla:
        if fits(replace(knobs, kv_cache_dtype="fp8")):
            found.append(Change("KV_CACHE_DTYPE", "fp8", "--kv-cache-dtype", "halves the KV cache per token; check output quality"))
    if gpu and not knobs.enforce_eager:
        eager = replace(knobs, enforce_eager=True)
        # The ladder caps the effective value (vLLM's card default when unset); it never raises it.
        if base.max_num_batched_tokens > EAGER_MAX_BATCHED_TOKENS:
            eager = replace(eager, max_num_batched_tokens=EAGER_MAX_BATCHED_TOKENS)
        if fits(eager):
            found.append(Change("ENFORCE_EAGER", "true", "--enforce-eager", "no CUDA graphs: less memory, slower replies"))
    if base.max_model_len > 1 and not base.problems and knobs.max_model_len != -1:
        longest = min(base.max_model_len, base.max_model_len_fits_margin)
        if longest >= 256:
            rounded = longest // 256 * 256 if longest >= 1024 else longest
            found.append(Change("MAX_MODEL_LEN", str(rounded), "--max-model-len",
                                f"the longest context that fits; now {base.max_model_len}"))
    if gpu:
        for tp in (2, 4, 8):
            if tp > knobs.tensor_parallel_size and fits(replace(knobs, tensor_parallel_size=tp)):
                found.append(Change("TENSOR_PARALLEL_SIZE", str(tp), "--tensor-parallel-size",
                                    f"on {tp} GPUs of this size"))
                break
        from vllm_worker.gpus import CARDS

        for card in sorted(CARDS, key=lambda c: c.total_bytes):
            if card.total_bytes > (total or 0) and fits(knobs, card.total_bytes):
                found.append(Change("GPU", card.name, "--gpu", f"{_gib(card.total_bytes)} GiB or more"))
                break
    return found


def _gib(value: float | int | None) -> str:
    if value is None:
        return "?"
    return f"{value / GiB:.1f}"


def _tokens(n: int) -> str:
    return f"{n:,}"


# =====================================================================================
# Startup: item 3 (fit before launch) and item 4 (predicted vs actual after ready)
# =====================================================================================


@dataclass
class FitDecision:
    """What to launch first: as configured, a ladder profile predicted to fit, or nothing."""

    status: str  # "as_configured" | "profile" | "cannot_fit" | "unknown"
    overrides: dict[str, str | None] = field(default_factory=dict)
    relaunch: Any = None  # recovery.Relaunch for the chosen profile (None when as configured)
    not_fitting: list[str] = field(default_factory=list)  # ladder profiles predicted not to fit (for the log)
    plan: Plan | None = None  # the plan of the configuration that will be launched
    configured: Plan | None = None  # the plan as configured
    warnings: list[str] = field(default_factory=list)
    fatal_message: str | None = None


def fit_profile(
    facts: ModelFacts,
    device_total_bytes: int,
    env: Mapping[str, str],
    max_concurrency: int,
    *,
    device_name: str | None = None,
    fit_context: bool = True,
) -> FitDecision:
    """Choose the first launch (item 3 of the capacity issue).

    As configured when the plan does not say, by more than its margin, that it cannot
    fit; otherwise the first profile of the relaunch ladder (recovery.next_launch on a
    memory shortfall: MAX_NUM_SEQS, then eager) predicted to fit; then, only when
    MAX_MODEL_LEN is not set, MAX_MODEL_LEN=auto (vLLM fits the longest context itself);
    else "cannot_fit" with the figures and the fixes. An explicit MAX_MODEL_LEN is never
    lowered, and every explicit setting a profile changes is named in a warning.
    """
    from vllm_worker import recovery

    def plan_for(launch_env: Mapping[str, str]) -> Plan:
        knobs = knobs_from_env(launch_env, max_concurrency=max_concurrency, device_name=device_name)
        return plan(facts, device_total_bytes, knobs, max_concurrency=max_concurrency)

    configured = plan_for(env)
    decision = FitDecision(status="as_configured", plan=configured, configured=configured)
    if configured.verdict != "does_not_fit":
        return decision

    shortfall = Diagnosis(kind="memory_shortfall", message="predicted", evidence="capacity plan", detail="kv_too_small")
    attempts: list[Any] = []
    launch_env = dict(env)
    candidates: list[tuple[Any, dict[str, str], Plan]] = []
    while True:
        attempts.append(recovery.Attempt(env=dict(launch_env), diagnosis=shortfall))
        step = recovery.next_launch(env, attempts, max_concurrency, device_total_bytes=device_total_bytes)
        if isinstance(step, recovery.Stop):
            break
        launch_env = _apply(env, step.overrides)
        candidate = plan_for(launch_env)
        candidates.append((step, launch_env, candidate))
        if candidate.verdict != "does_not_fit":
            break

    chosen = next(((s, e, p) for s, e, p in candidates if p.verdict == "fits"), None)
    chosen = chosen or next(((s, e, p) for s, e, p in candidates if p.verdict == "uncertain"), None)
    explicit_len = _get(effective_env(env), "MAX_MODEL_LEN") is not None
    if chosen is None and fit_context and not explicit_len and not configured.problems:
        base_step = candidates[0][0] if candidates and candidates[0][0].profile.startswith("max_num_seqs") else None
        overrides = dict(base_step.overrides) if base_step else {}
        overrides["MAX_MODEL_LEN"] = "auto"
        auto_env = _apply(env, overrides)
        auto_plan = plan_for(auto_env)
        if auto_plan.verdict == "fits" and auto_plan.max_model_len_fits_margin >= min(_MIN_USEFUL_CONTEXT, facts.max_context):
            context = recovery.Relaunch(
                overrides=overrides,
                profile="context_auto",
                reason=(
                    f"the model's full context ({facts.max_context} tokens) does not fit and MAX_MODEL_LEN is not set: "
                    f"launching with MAX_MODEL_LEN=auto, vLLM serves the longest context that fits "
                    f"(predicted about {auto_plan.max_model_len} tokens)"
                ),
                tried_phrase="launched with MAX_MODEL_LEN=auto",
                warnings=[
                    f"MAX_MODEL_LEN is not set and the model's full {facts.max_context}-token context does not fit "
                    f"on this GPU: launching with MAX_MODEL_LEN=auto (about {auto_plan.max_model_len} tokens predicted); "
                    f"set MAX_MODEL_LEN to choose the context yourself"
                ],
            )
            chosen = (context, auto_env, auto_plan)

    decision.not_fitting = [s.profile for s, _, p in candidates if p.verdict == "does_not_fit"]
    if chosen is None:
        best = max([configured, *(p for _, _, p in candidates)], key=lambda p: p.kv_cache_bytes)
        decision.status = "cannot_fit"
        decision.plan = best
        decision.fatal_message = cannot_fit_message(
            facts, configured, best, env, max_concurrency=max_concurrency, device_name=device_name
        )
        return decision
    step, launch_env, chosen_plan = chosen
    decision.status = "profile"
    decision.relaunch = step
    decision.overrides = {
        k: v for k, v in step.overrides.items() if (k in env if v is None else env.get(k) != v)
    }
    decision.plan = chosen_plan
    decision.warnings = list(step.warnings)
    for name, value in decision.overrides.items():
        before = _get(env, name)
        if before is not None and value is not None and before != value:
            line = (
                f"{name}={before} is OVERRIDDEN to {value} for the first launch: the capacity plan predicts the "
                f"configuration as set does not fit ({_gib(-configured.surplus_bytes)} GiB short, error margin "
                f"{_gib(configured.margin_bytes)} GiB)"
            )
            if not any(line.split(" is OVERRIDDEN")[0] in w for w in decision.warnings):
                decision.warnings.append(line)
    return decision


def _apply(env: Mapping[str, str], overrides: Mapping[str, str | None]) -> dict[str, str]:
    result = dict(env)
    for key, value in overrides.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = value
    return result


def cannot_fit_message(
    facts: ModelFacts,
    configured: Plan,
    best: Plan,
    env: Mapping[str, str],
    *,
    max_concurrency: int | None = None,
    device_name: str | None = None,
) -> str:
    """The one message every job is answered with when nothing is predicted to fit."""
    subject = f"MODEL_NAME={facts.source!r}" if facts.source else "The model"
    device = f"{_gib(configured.device_total_bytes)} GiB GPU"
    if configured.gpus > 1:
        device = f"{configured.gpus} x {_gib(configured.device_total_bytes)} GiB GPUs"
    explicit_len = _get(effective_env(env), "MAX_MODEL_LEN") is not None
    weights_only = best.weights_bytes + best.non_torch_bytes + best.activation_bytes >= (best.requested_bytes or 0)
    fixes: list[str]
    if configured.problems:
        cause = f"{subject} cannot start as configured: {configured.problems[0]}"
        fixes = [str(c) for c in configured.changes]
    elif weights_only:
        cause = (
            f"{subject} does not fit on this {device}: its weights alone take {_gib(configured.weights_bytes)} GiB per "
            f"GPU of the {_gib(configured.requested_bytes)} GiB vLLM may use (GPU_MEMORY_UTILIZATION="
            f"{configured.utilization:g}), before any KV cache (predicted before launch)"
        )
        fixes = _hardware_fixes(facts, configured, env, max_concurrency, device_name, explicit_len)
    else:
        where = (
            f"MAX_MODEL_LEN={configured.max_model_len}"
            if explicit_len
            else f"the model's full context of {configured.max_model_len} tokens (MAX_MODEL_LEN is not set)"
        )
        cause = (
            f"{subject} does not fit on this {device} at {where}: one full-length sequence needs "
            f"{_gib(best.needed_bytes)} GiB of KV cache, but only {_gib(max(0, best.kv_cache_bytes))} GiB is left after "
            f"the weights ({_gib(best.weights_bytes)} GiB), activations and CUDA graphs, and neither fewer "
            f"sequences nor eager mode frees enough (predicted before launch, error margin {_gib(best.margin_bytes)} GiB)"
        )
        fixes = [str(c) for c in configured.changes if c.variable not in ("MAX_NUM_SEQS", "ENFORCE_EAGER")]
    if not fixes:
        fixes = ["use a GPU with more memory, more GPUs with TENSOR_PARALLEL_SIZE, or a smaller or quantized checkpoint"]
    return f"{cause}. To fix: {'; or '.join(fixes)}."


def _hardware_fixes(
    facts: ModelFacts,
    configured: Plan,
    env: Mapping[str, str],
    max_concurrency: int | None,
    device_name: str | None,
    explicit_len: bool,
) -> list[str]:
    """More GPUs or a larger card that hold the weights and a useful context (MAX_MODEL_LEN=auto when unset)."""
    from vllm_worker.gpus import CARDS

    launch = dict(env)
    if not explicit_len:
        launch["MAX_MODEL_LEN"] = "auto"
    want = min(_MIN_USEFUL_CONTEXT, facts.max_context)

    def fits(extra: Mapping[str, str], total: int | None) -> Plan | None:
        try:
            knobs = knobs_from_env({**launch, **extra}, max_concurrency=max_concurrency, device_name=device_name)
            p = plan(facts, total, knobs, with_changes=False)
        except CapacityError:
            return None
        return p if p.verdict == "fits" and p.max_model_len_fits_margin >= want else None

    fixes: list[str] = []
    tp = configured.tensor_parallel_size
    for more in (2, 4, 8, 16):
        if more > tp:
            p = fits({"TENSOR_PARALLEL_SIZE": str(more)}, configured.device_total_bytes)
            if p is not None:
                fixes.append(
                    f"set TENSOR_PARALLEL_SIZE={more} and run on {more} GPUs like this one (about "
                    f"{_tokens(min(p.max_model_len_fits, facts.max_context))} tokens of context fit)"
                )
                break
    for card in sorted(CARDS, key=lambda c: c.total_bytes):
        if card.total_bytes > (configured.device_total_bytes or 0):
            p = fits({}, card.total_bytes)
            if p is not None:
                fixes.append(f"use a GPU with {_gib(card.total_bytes)} GiB or more, such as {card.name}")
                break
    fixes.append("serve a quantized checkpoint of the model (4-bit weights take about a quarter of 16-bit ones)")
    return fixes


@dataclass
class StartupPlan:
    """What `main` needs from the capacity plan before the first launch."""

    status: str  # "as_configured" | "profile" | "cannot_fit" | "unknown"
    log_line: str
    overrides: dict[str, str | None] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    fatal_message: str | None = None
    predicted: Plan | None = None  # the plan of what will be launched
    relaunch: Any = None  # recovery.Relaunch when a ladder profile was chosen
    facts: ModelFacts | None = None
    device_total_bytes: int | None = None
    device_name: str | None = None
    platform: str = "cuda"
    max_concurrency: int = 1

    def predict_for(self, launch_env: Mapping[str, str]) -> Plan | None:
        """The plan for another launch configuration (after a relaunch), without reading the model again."""
        if self.facts is None:
            return None
        try:
            knobs = knobs_from_env(launch_env, max_concurrency=self.max_concurrency, platform=self.platform,
                                   device_name=self.device_name)
            return plan(self.facts, self.device_total_bytes, knobs, with_changes=False)
        except CapacityError:
            return None

    def status_fields(self) -> dict[str, Any]:
        """JSON-safe summary for the status job."""
        p = self.predicted
        out: dict[str, Any] = {"plan": self.status}
        if p is not None:
            out.update(
                predicted_kv_cache_tokens=p.kv_cache_tokens,
                predicted_max_concurrency=round(p.max_concurrency, 2),
                predicted_kv_cache_gib=round(p.kv_cache_bytes / GiB, 2),
                predicted_margin_gib=round(p.margin_bytes / GiB, 2),
                predicted_max_model_len=p.max_model_len,
                weights_gib=round(p.weights_bytes / GiB, 2),
                kv_bytes_per_token=p.kv_bytes_per_token,
            )
        if self.overrides:
            out["plan_overrides"] = dict(self.overrides)
        return out


def summary_line(p: Plan) -> str:
    """The one log line describing a plan."""
    head = f"capacity plan ({p.verdict.replace('_', ' ')})"
    if p.kv_exact:
        budget = f"KV cache {_gib(p.kv_cache_bytes)} GiB (set explicitly)"
    else:
        budget = (
            f"{_gib(p.device_total_bytes)} GiB x {p.utilization:g} = {_gib(p.requested_bytes)} GiB: weights "
            f"{_gib(p.weights_bytes)}, activations {_gib(p.activation_bytes)}, CUDA graphs {_gib(p.cudagraph_bytes)}, "
            f"non-torch {_gib(p.non_torch_bytes)} -> KV cache {_gib(p.kv_cache_bytes)} GiB (+/- {_gib(p.margin_bytes)})"
        )
    return (
        f"{head}: {budget}; {p.kv_bytes_per_token / 1024:.1f} KiB/token -> {_tokens(p.kv_cache_tokens)} tokens, "
        f"{p.max_concurrency:.2f}x at {_tokens(p.max_model_len)} tokens per request; longest context that fits "
        f"{_tokens(p.max_model_len_fits)} (MAX_NUM_SEQS={p.max_num_seqs}, MAX_NUM_BATCHED_TOKENS="
        f"{p.max_num_batched_tokens}, {'eager' if p.enforce_eager else 'CUDA graphs'})"
    )


def startup_plan(
    env: Mapping[str, str],
    device_total_bytes: int | None,
    max_concurrency: int,
    *,
    device_name: str | None = None,
    platform: str = "cuda",
    safetensors_parameters: Mapping[str, int] | None = None,
    config: Mapping[str, Any] | None = None,
    facts: ModelFacts | None = None,
    timeout: float = 10.0,
) -> StartupPlan:
    """The capacity plan for the configured settings, before the first launch. Never raises.

    `device_total_bytes`: the per-GPU total vLLM multiplies by the utilization
    (gpu_memory.DeviceMemory.total, the smallest of the GPUs used); None where unknown.
    `safetensors_parameters`: the pre-flight's `model_info_summary.safetensors_parameters`
    (run it with expand=["safetensors"]), so the Hub is not asked twice. Anything that
    cannot be read (no network, a missing path, an unsupported architecture) gives
    status "unknown" and a log line that says why: the boot goes on as configured.
    """
    try:
        if facts is None:
            facts = _startup_facts(env, safetensors_parameters, config, timeout)
        if device_total_bytes is None or platform == "cpu":
            knobs = knobs_from_env(env, max_concurrency=max_concurrency, platform=platform, device_name=device_name)
            if knobs.kv_cache_memory_bytes is None:
                per_token = kv_bytes_per_token(facts, knobs.tensor_parallel_size, knobs.kv_cache_dtype, knobs.dtype)
                weights, _ = weights_bytes(facts, knobs)
                return StartupPlan(
                    status="unknown",
                    log_line=(
                        f"capacity plan: weights {_gib(weights)} GiB, KV cache {per_token / 1024:.1f} KiB per token; "
                        f"no fit check ({'CPU engine' if platform == 'cpu' else 'GPU memory unknown'})"
                    ),
                )
            predicted = plan(facts, device_total_bytes, knobs, max_concurrency=max_concurrency)
            return StartupPlan(status="as_configured", log_line=summary_line(predicted), predicted=predicted,
                               warnings=_concurrency_warning(predicted, max_concurrency), facts=facts,
                               device_total_bytes=device_total_bytes, device_name=device_name,
                               platform=platform, max_concurrency=max_concurrency)
        decision = fit_profile(facts, device_total_bytes, env, max_concurrency, device_name=device_name)
    except Exception as exc:  # noqa: BLE001 - a plan must never block the boot
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
            token = _get(env, name)
            if token:
                reason = reason.replace(token, "***")
        return StartupPlan(status="unknown", log_line=f"capacity plan unavailable ({reason}); launching as configured")
    assert decision.plan is not None
    line = summary_line(decision.plan)
    if decision.status == "profile" and decision.relaunch is not None:
        line += f"; first launch on profile {decision.relaunch.profile}: {decision.relaunch.reason}"
    elif decision.status == "cannot_fit":
        line += "; nothing predicted to fit, not launching"
    if decision.not_fitting:
        line += f" (predicted not to fit: {', '.join(decision.not_fitting)})"
    warnings = list(decision.warnings)
    if decision.status != "cannot_fit":
        warnings += _concurrency_warning(decision.plan, max_concurrency)
    return StartupPlan(
        status=decision.status,
        log_line=line,
        overrides=decision.overrides,
        warnings=warnings,
        fatal_message=decision.fatal_message,
        predicted=decision.plan,
        relaunch=decision.relaunch,
        facts=facts,
        device_total_bytes=device_total_bytes,
        device_name=device_name,
        platform=platform,
        max_concurrency=max_concurrency,
    )


def _concurrency_warning(p: Plan, max_concurrency: int) -> list[str]:
    if p.verdict == "does_not_fit" or p.max_concurrency >= max_concurrency:
        return []
    return [
        f"predicted: the KV cache holds {p.max_concurrency:.2f} requests of MAX_MODEL_LEN={p.max_model_len} tokens at once, "
        f"fewer than MAX_CONCURRENCY={max_concurrency}; long requests will queue (lower MAX_MODEL_LEN or use more GPU memory)"
    ]


def _startup_facts(
    env: Mapping[str, str],
    safetensors_parameters: Mapping[str, int] | None,
    config: Mapping[str, Any] | None,
    timeout: float,
) -> ModelFacts:
    merged = effective_env(env)
    baked = _get(merged, "BAKED_MODEL_PATH")
    model = baked or _get(merged, "MODEL_NAME")
    if model is None:
        raise CapacityError("MODEL_NAME is not set")
    if config is not None:
        return facts_from_config(config, safetensors_parameters, source=_get(merged, "MODEL_NAME") or model)
    if baked or model.startswith(("/", "./", "../", "~")) or Path(model).expanduser().is_dir():
        facts = facts_from_folder(model)
        return replace(facts, source=_get(merged, "MODEL_NAME") or model)
    if "://" in model:
        raise CapacityError(f"{model} is not a Hub repository or a local folder")
    offline = (_get(merged, "HF_HUB_OFFLINE") or "").lower() in ("1", "true", "yes", "on")
    if offline:
        return _facts_from_cache(model, _get(merged, "MODEL_REVISION") or _get(merged, "REVISION"))
    return facts_from_hub(
        model,
        revision=_get(merged, "MODEL_REVISION") or _get(merged, "REVISION"),
        token=_get(merged, "HF_TOKEN") or _get(merged, "HUGGING_FACE_HUB_TOKEN"),
        endpoint=_get(merged, "HF_ENDPOINT"),
        timeout=timeout,
        param_counts=safetensors_parameters,
    )


def _facts_from_cache(repo: str, revision: str | None) -> ModelFacts:
    from huggingface_hub import snapshot_download

    folder = snapshot_download(repo, revision=revision, local_files_only=True, allow_patterns=["*.json", "*.safetensors"])
    return replace(facts_from_folder(folder), source=repo)


# --- after the engine is ready (item 4) ---------------------------------------------


@dataclass(frozen=True)
class EngineCapacity:
    """What the engine reported: KV tokens and the concurrency at its max_model_len."""

    kv_tokens: int
    max_concurrency: float
    max_model_len: int | None = None
    pool: str | None = None  # "GPU", "CPU", "GPU + host"


# kv_cache_utils.py update_kv_cache_capacity:
# "%s KV cache size: %s tokens, Maximum concurrency for %s tokens per request: %.2fx"
_CAPACITY_LINE = re.compile(
    r"(?P<pool>[A-Z]+(?: \+ host)?) KV cache size: (?P<tokens>[\d,]+) tokens, "
    r"Maximum concurrency for (?P<len>[\d,]+) tokens per request: (?P<conc>[\d.]+)x"
)


def parse_engine_capacity(output: str) -> EngineCapacity | None:
    """The engine's own capacity from its log (the last such line), or None."""
    found = None
    for m in _CAPACITY_LINE.finditer(output or ""):
        found = m
    if found is None:
        return None
    return EngineCapacity(
        kv_tokens=int(found.group("tokens").replace(",", "")),
        max_concurrency=float(found.group("conc")),
        max_model_len=int(found.group("len").replace(",", "")),
        pool=found.group("pool"),
    )


_METRIC_LINE = re.compile(r"^vllm:cache_config_info\{(?P<labels>.*)\}\s", re.MULTILINE)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_cache_config_metric(metrics_text: str) -> EngineCapacity | None:
    """The same figures from the `vllm:cache_config_info` Prometheus metric (GET /metrics)."""
    m = _METRIC_LINE.search(metrics_text or "")
    if not m:
        return None
    labels = dict(_LABEL.findall(m.group("labels")))
    try:
        tokens = int(labels["kv_cache_size_tokens"])
        concurrency = float(labels["kv_cache_max_concurrency"])
    except (KeyError, ValueError):
        return None
    return EngineCapacity(kv_tokens=tokens, max_concurrency=concurrency)


@dataclass
class CapacityReport:
    log_line: str
    warnings: list[str]
    status: dict[str, Any]


def capacity_report(predicted: Plan | None, actual: EngineCapacity | None, max_concurrency: int) -> CapacityReport:
    """Predicted vs actual after a successful start, for the log and the status job."""
    status: dict[str, Any] = {}
    warnings: list[str] = []
    if predicted is not None:
        status.update(
            predicted_kv_cache_tokens=predicted.kv_cache_tokens,
            predicted_max_concurrency=round(predicted.max_concurrency, 2),
        )
    if actual is None:
        return CapacityReport("engine capacity: not found in the engine's output", warnings, status)
    status.update(kv_cache_tokens=actual.kv_tokens, max_concurrency=actual.max_concurrency)
    if actual.max_model_len is not None:
        status["max_model_len"] = actual.max_model_len
    line = f"engine capacity: {_tokens(actual.kv_tokens)} KV tokens, {actual.max_concurrency:.2f}x at "
    line += f"{_tokens(actual.max_model_len)} tokens per request" if actual.max_model_len else "max_model_len"
    if predicted is not None:
        error = actual.kv_tokens - predicted.kv_cache_tokens
        relative = error / predicted.kv_cache_tokens if predicted.kv_cache_tokens else 0.0
        status["prediction_error_tokens"] = error
        line += f" (predicted {_tokens(predicted.kv_cache_tokens)}, {predicted.max_concurrency:.2f}x; {relative:+.1%})"
    if actual.max_concurrency < max_concurrency:
        length = f"{actual.max_model_len:,}-token" if actual.max_model_len else "full-length"
        warnings.append(
            f"the KV cache holds {actual.max_concurrency:.2f} {length} requests at once, fewer than "
            f"MAX_CONCURRENCY={max_concurrency}: long requests will wait for memory; lower MAX_MODEL_LEN, "
            f"set KV_CACHE_DTYPE=fp8, or give vLLM more GPU memory"
        )
    return CapacityReport(line, warnings, status)


# =====================================================================================
# CLI: vllm-worker plan MODEL ...
# =====================================================================================


CLI_DEFAULT_GPU_BYTES = 24 * GiB


def _cli_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vllm-worker plan",
        description="Predict whether a model fits a GPU under vLLM 0.32, without downloading its weights.",
    )
    p.add_argument("model", help="Hugging Face repo id (HF_TOKEN honoured) or a local model folder")
    p.add_argument("--revision", default=None)
    where = p.add_mutually_exclusive_group()
    where.add_argument("--gpu-memory", help="memory of one GPU, e.g. 24GiB or 80GB (CUDA's total)")
    where.add_argument("--gpu", help="a card name from the table, e.g. 'RTX 4090', 'H100', 'L40S'")
    p.add_argument("--gpus", type=int, default=None, help="GPUs (tensor parallel size when --tensor-parallel-size is not given)")
    p.add_argument("--utilization", type=float, default=None, help=f"GPU_MEMORY_UTILIZATION (default {DEFAULT_UTILIZATION})")
    p.add_argument("--max-model-len", default=None, help="context length (default: the model's; 'auto' fits what the memory holds)")
    p.add_argument("--max-num-seqs", type=int, default=None, help="default: the worker's, a multiple of 8 >= --max-concurrency")
    p.add_argument("--max-concurrency", type=int, default=30, help="the worker's MAX_CONCURRENCY (default 30)")
    p.add_argument("--max-num-batched-tokens", default=None)
    p.add_argument("--kv-cache-dtype", default=None, help="auto (default) or fp8")
    p.add_argument("--tensor-parallel-size", type=int, default=None)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--dtype", default=None)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def plan_cli(argv: Sequence[str]) -> int:
    """`vllm-worker plan ...`: print the plan as a table (or JSON); exit 0 fits, 1 does not, 2 error."""
    parser = _cli_parser()
    args = parser.parse_args(list(argv))
    env: dict[str, str] = {}
    device_name: str | None = None
    try:
        if args.gpu:
            from vllm_worker.gpus import find_card

            card = find_card(args.gpu)
            total: int | None = card.total_bytes
            device_name = card.name
        elif args.gpu_memory:
            total = parse_size(args.gpu_memory)
        else:
            total = CLI_DEFAULT_GPU_BYTES
        tp = args.tensor_parallel_size or args.gpus or 1
        for name, value in (
            ("GPU_MEMORY_UTILIZATION", args.utilization),
            ("MAX_MODEL_LEN", args.max_model_len),
            ("MAX_NUM_SEQS", args.max_num_seqs),
            ("MAX_NUM_BATCHED_TOKENS", args.max_num_batched_tokens),
            ("KV_CACHE_DTYPE", args.kv_cache_dtype),
            ("TENSOR_PARALLEL_SIZE", tp if tp > 1 else None),
            ("DTYPE", args.dtype),
        ):
            if value is not None:
                env[name] = str(value)
        if args.enforce_eager:
            env["ENFORCE_EAGER"] = "true"
        facts = _cli_facts(args.model, args.revision)
        knobs = knobs_from_env(env, max_concurrency=args.max_concurrency, device_name=device_name)
        result = plan(facts, total, knobs, max_concurrency=args.max_concurrency)
        if not (args.gpu or args.gpu_memory):
            result = replace(result, notes=(*result.notes, "no --gpu or --gpu-memory given: planned for a 24 GiB GPU"))
    except Exception as exc:  # noqa: BLE001 - the CLI reports every failure in one line
        message = _cli_error(exc, args.model)
        if args.json:
            print(json.dumps({"error": message}))
        else:
            print(f"vllm-worker plan: {message}", file=sys.stderr)
        return 2
    if args.json:
        data = result.to_json()
        data["gpu"] = device_name
        print(json.dumps(data, indent=None, sort_keys=True))
    else:
        print(render_table(result, facts, device_name, args.max_concurrency))
    return 0 if result.verdict != "does_not_fit" else 1


def _cli_facts(model: str, revision: str | None) -> ModelFacts:
    path = Path(model).expanduser()
    if path.is_dir():
        return facts_from_folder(path)
    token = os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN") or None
    if (os.environ.get("HF_HUB_OFFLINE") or "").lower() in ("1", "true", "yes", "on"):
        return _facts_from_cache(model, revision)
    return facts_from_hub(model, revision=revision, token=token, endpoint=os.environ.get("HF_ENDPOINT"))


def _cli_error(exc: BaseException, model: str) -> str:
    if isinstance(exc, CapacityError):
        return str(exc)
    try:
        from vllm_worker.preflight import Target, classify_hub_error, failure_message

        kind, definitive = classify_hub_error(exc)
        if definitive:
            token_set = bool(os.environ.get("HF_TOKEN"))
            text = failure_message(kind, Target(model, None, "MODEL", "--revision"), token_set)
            if text:
                return text
        return f"could not read {model!r} from the Hub ({kind}: {type(exc).__name__})"
    except Exception:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"


def render_table(p: Plan, facts: ModelFacts, device_name: str | None, max_concurrency: int) -> str:
    """The plan as a table a person can act on."""
    gpu = f"{device_name} ({_gib(p.device_total_bytes)} GiB)" if device_name else f"{_gib(p.device_total_bytes)} GiB"
    if p.gpus > 1:
        gpu = f"{p.gpus} x {gpu}"
    kv_dtype = f"{p.kv_cache_dtype}, {kv_dtype_bytes(facts, p.kv_cache_dtype)} byte(s) per value"
    attention = "MLA" if facts.mla else f"{facts.num_kv_heads} KV heads x {facts.head_dim}"
    sliding = sum(1 for w in facts.layer_windows if w is not None)
    if sliding:
        attention += f", {sliding}/{facts.num_layers} layers sliding-window"
    rows: list[tuple[str, str]] = [
        ("model", f"{facts.source} ({facts.model_type}, {facts.num_layers} layers, {attention})"),
        ("GPU", f"{gpu} x GPU_MEMORY_UTILIZATION {p.utilization:g} = {_gib(p.requested_bytes)} GiB"),
        ("weights", f"{_gib(p.weights_bytes)} GiB per GPU ({p.weights_source})"),
        ("activations", f"{_gib(p.activation_bytes)} GiB (MAX_NUM_BATCHED_TOKENS={p.max_num_batched_tokens}, MAX_NUM_SEQS={p.max_num_seqs})"),
        ("CUDA graphs", "none (eager)" if p.enforce_eager else f"{_gib(p.cudagraph_bytes)} GiB ({p.graphs} graphs)"),
        ("non-torch", f"{_gib(p.non_torch_bytes)} GiB"),
        ("KV cache", f"{_gib(p.kv_cache_bytes)} GiB (+/- {_gib(p.margin_bytes)} GiB expected error)"),
        ("KV per token", f"{p.kv_bytes_per_token:,} bytes (KV_CACHE_DTYPE={kv_dtype})"),
        ("KV tokens", f"{_tokens(p.kv_cache_tokens)} ({p.num_blocks:,} blocks of {p.block_size})"),
        ("longest context", f"{_tokens(p.max_model_len_fits)} tokens (model maximum {_tokens(p.model_max_len)})"),
        ("concurrency", f"{p.max_concurrency:.2f} requests of {_tokens(p.max_model_len)} tokens at once"),
        ("verdict", {"fits": "fits", "uncertain": "fits only within the error margin", "does_not_fit": "DOES NOT FIT"}[p.verdict]),
    ]
    for problem in p.problems:
        rows.append(("problem", problem))
    if p.verdict != "fits":
        if p.changes:
            rows.append(("smallest change", f"{p.changes[0].flag} {p.changes[0].value} ({p.changes[0].effect})"))
            for change in p.changes[1:]:
                rows.append(("or", f"{change.flag} {change.value} ({change.effect})"))
        else:
            rows.append(("fix", "no single setting change fits: use a larger GPU or a smaller or quantized checkpoint"))
    elif p.max_concurrency < max_concurrency:
        rows.append(("note", f"fewer than MAX_CONCURRENCY={max_concurrency} full-length requests fit at once"))
    for note in p.notes:
        rows.append(("note", note))
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label.ljust(width)}  {value}" for label, value in rows)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(plan_cli(sys.argv[1:]))
