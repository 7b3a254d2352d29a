"""Capacity planning as pure functions: model facts, the KV accounting, the budget, the decisions.

Expected figures are worked out by hand from vLLM 0.32's rules (quoted next to each), not
read back from the module: the configs are the public config.json shapes of real models.
The KV accounting is also checked token-for-token against the real engine in
tests/engine/test_capacity_accuracy.py.
"""

from __future__ import annotations

import json
import struct
from dataclasses import replace
from pathlib import Path

import pytest

from tests.support.model_configs import (
    LLAMA_31_8B,
    LLAMA_31_8B_PARAMS,
    LLAMA_31_70B,
    LLAMA_31_70B_PARAMS,
)
from vllm_worker.config.profile import LaunchProfile
from vllm_worker import capacity as cap
from vllm_worker.config.env import parse_human_int
from vllm_worker.capacity import first_launch, budget_versions, kv_cache, memory_budget, model_facts, plan_report, plan_settings
from vllm_worker.capacity import GiB, MiB
from vllm_worker.capacity.gpus import UnknownCard, cards_with_at_least, find_card

# --- public config.json shapes ---------------------------------------------------------


QWEN25_7B = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "max_position_embeddings": 32768,
    "max_window_layers": 28,
    "sliding_window": 131072,
    "use_sliding_window": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 152064,
}

MISTRAL_7B_V01 = {
    "architectures": ["MistralForCausalLM"],
    "model_type": "mistral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 32768,
    "sliding_window": 4096,
    "torch_dtype": "bfloat16",
    "vocab_size": 32000,
}

DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 3,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "num_hidden_layers": 61,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "max_position_embeddings": 163840,
    "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096},
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                            "weight_block_size": [128, 128]},
    "torch_dtype": "bfloat16",
    "vocab_size": 129280,
}
DEEPSEEK_V3_PARAMS = {"F8_E4M3": 680_000_000_000, "BF16": 3_900_000_000, "F32": 41_000_000}

GEMMA3_12B = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "model_type": "gemma3",
    "text_config": {
        "model_type": "gemma3_text",
        "hidden_size": 3840,
        "intermediate_size": 15360,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 256,
        "num_hidden_layers": 48,
        "sliding_window": 1024,
        "sliding_window_pattern": 6,
        "max_position_embeddings": 131072,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "vocab_size": 262208,
    },
    "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152},
    "torch_dtype": "bfloat16",
}

FALCON_7B = {
    "architectures": ["FalconForCausalLM"],
    "model_type": "falcon",
    "hidden_size": 4544,
    "n_head": 71,
    "n_layer": 32,
    "multi_query": True,
    "new_decoder_architecture": False,
    "vocab_size": 65024,
}

RTX_4090 = find_card("RTX 4090").total_bytes
H100 = find_card("H100").total_bytes


def facts(config: dict, params: dict | None = None, source: str = "org/model") -> cap.ModelFacts:
    return cap.facts_from_config(config, params, source=source)


def knobs(env: dict[str, str] | None = None, **kw: object) -> cap.Knobs:
    return cap.knobs_from_env(env or {}, **kw)  # type: ignore[arg-type]


# --- model facts and KV bytes per token ----------------------------------------------------


def test_llama_full_attention_gqa_kv_per_token() -> None:
    f = facts(LLAMA_31_8B, LLAMA_31_8B_PARAMS)
    # 2 (K and V) x 8 KV heads x 128 head_dim x 2 bytes x 32 layers
    assert kv_cache.kv_bytes_per_token(f) == 2 * 8 * 128 * 2 * 32 == 131072
    assert f.layer_windows == (None,) * 32
    assert f.max_context == 131072  # llama3 rope leaves max_position_embeddings as it is
    assert f.head_dim == 128 and f.num_kv_heads == 8 and not f.mla


def test_tensor_parallel_divides_kv_heads_but_never_below_one() -> None:
    f = facts(LLAMA_31_8B)
    assert kv_cache.kv_bytes_per_token(f, tensor_parallel_size=2) == 65536
    assert kv_cache.kv_heads_per_rank(f, 8) == 1
    assert kv_cache.kv_heads_per_rank(f, 16) == 1  # 8 // 16 = 0 -> replicated, one head per GPU
    assert kv_cache.kv_bytes_per_token(f, tensor_parallel_size=16) == 2 * 1 * 128 * 2 * 32


def test_qwen2_gqa_ignores_sliding_window_when_disabled() -> None:
    f = facts(QWEN25_7B)
    assert kv_cache.kv_bytes_per_token(f) == 2 * 4 * 128 * 2 * 28 == 57344
    assert f.layer_windows == (None,) * 28  # use_sliding_window false: sliding_window is ignored
    assert f.max_context == 32768


def test_qwen2_sliding_window_from_max_window_layers() -> None:
    f = facts({**QWEN25_7B, "use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 20})
    assert f.layer_windows == (None,) * 20 + (4096,) * 8


def test_mistral_sliding_window_on_every_layer() -> None:
    f = facts(MISTRAL_7B_V01)
    assert f.layer_windows == (4096,) * 32
    layout = kv_cache.kv_layout(f, knobs())
    assert len(layout.groups) == 1 and not layout.hybrid
    assert layout.bytes_per_block == 32 * 16 * 8 * 2 * 128 * 2  # layers x page(block 16)
    # SlidingWindowSpec: cdiv(min(window - 1 + in-flight, L), block) + 1; in-flight = 2 x 2048 (async)
    assert kv_cache.blocks_per_request(layout, 32768, 4096) == -(-(4095 + 4096) // 16) + 1 == 513


def test_mistral_sliding_window_capacity_with_fixed_kv_memory() -> None:
    f = facts(MISTRAL_7B_V01)
    p = cap.plan(f, H100, knobs({"KV_CACHE_MEMORY_BYTES": str(4 * GiB), "MAX_MODEL_LEN": "32768",
                                 "MAX_NUM_SEQS": "32", "MAX_NUM_BATCHED_TOKENS": "2048"}))
    assert p.kv_exact and p.margin_bytes == 0
    assert p.num_blocks == 4 * GiB // (2 * MiB) == 2048
    assert p.max_concurrency == 2048 / 513
    assert p.kv_cache_tokens == int(2048 / 513 * 32768)


def test_deepseek_mla_latent_is_not_divided_by_tp() -> None:
    f = facts(DEEPSEEK_V3, DEEPSEEK_V3_PARAMS)
    assert f.mla and f.head_dim == 512 + 64
    assert kv_cache.kv_bytes_per_token(f) == 61 * 576 * 2 == 70272
    assert kv_cache.kv_bytes_per_token(f, tensor_parallel_size=8) == 70272
    assert kv_cache.kv_bytes_per_token(f, kv_cache_dtype="fp8") == 61 * 576
    assert kv_cache.default_block_size(f, knobs()) == 64  # FlashMLA
    assert kv_cache.default_block_size(f, knobs(platform="cpu")) == 16  # reference CPU MLA
    assert kv_cache.default_block_size(f, knobs(platform="cpu", cpu_amx=True)) == 128  # AMX_MLA: the CPU default
    assert f.max_context == 163840  # yarn: max_position_embeddings is already the scaled length


def test_gemma3_multimodal_reads_text_config_and_builds_hybrid_groups() -> None:
    f = facts(GEMMA3_12B)
    assert f.multimodal and f.model_type == "gemma3_text" and f.head_dim == 256
    assert f.max_context == 131072  # gemma3's max length is already scaled: factor 8 not applied
    full = [i for i, w in enumerate(f.layer_windows) if w is None]
    assert full == [5, 11, 17, 23, 29, 35, 41, 47]  # (i + 1) % 6 == 0
    layout = kv_cache.kv_layout(f, knobs())
    page = 16 * 8 * 2 * 256 * 2
    # 40 sliding + 8 full: group size 8 -> 5 sliding groups and 1 full group of 8 layers each.
    assert sorted((g.window or 0, g.layers) for g in layout.groups) == [(0, 8)] + [(1024, 8)] * 5
    assert layout.bytes_per_block == 8 * page
    per_request = 131072 // 16 + 5 * (-(-(1023 + 4096) // 16) + 1)
    assert kv_cache.blocks_per_request(layout, 131072, 4096) == per_request == 9797


def test_hybrid_group_sizes_follow_vllm_padding_rule() -> None:
    base = {**LLAMA_31_8B, "num_hidden_layers": 4, "sliding_window": 512}
    three_one = facts({**base, "layer_types": ["sliding_attention"] * 3 + ["full_attention"]})
    layout = kv_cache.kv_layout(three_one, knobs())
    assert sorted((g.window is None, g.layers) for g in layout.groups) == [(False, 1)] * 3 + [(True, 1)]
    page = 16 * 8 * 2 * 128 * 2
    assert layout.bytes_per_block == page
    seven = facts({**base, "num_hidden_layers": 7,
                   "layer_types": ["sliding_attention", "full_attention"] * 3 + ["sliding_attention"]})
    layout = kv_cache.kv_layout(seven, knobs())
    # 4 sliding, 3 full: 4 < 1.5 x 3, so the group size is 4 (one group each, the full one padded).
    assert sorted((g.window is None, g.layers) for g in layout.groups) == [(False, 4), (True, 3)]
    assert layout.bytes_per_block == 4 * page


def test_disable_hybrid_kv_cache_manager_promotes_sliding_layers() -> None:
    f = facts(GEMMA3_12B)
    layout = kv_cache.kv_layout(f, knobs({"DISABLE_HYBRID_KV_CACHE_MANAGER": "true"}))
    assert len(layout.groups) == 1 and layout.groups[0].window is None and layout.groups[0].layers == 48


def test_gemma2_default_layer_types_alternate() -> None:
    f = facts({"model_type": "gemma2", "hidden_size": 2304, "num_attention_heads": 8, "num_key_value_heads": 4,
               "head_dim": 256, "num_hidden_layers": 4, "sliding_window": 4096, "vocab_size": 256000,
               "max_position_embeddings": 8192, "intermediate_size": 9216})
    assert f.layer_windows == (4096, None, 4096, None)


def test_falcon_multi_query_has_one_kv_head() -> None:
    f = facts(FALCON_7B)
    assert f.num_kv_heads == 1 and f.head_dim == 4544 // 71
    assert kv_cache.kv_bytes_per_token(f) == 2 * 1 * 64 * 2 * 32
    assert f.max_context == 2048  # no length key: vLLM's default


def test_rope_scaling_factor_and_longrope() -> None:
    linear = {**LLAMA_31_8B, "max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 4.0}}
    assert facts(linear).max_context == 16384
    longrope = {**LLAMA_31_8B, "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
                "rope_scaling": {"type": "longrope", "long_factor": [1.0], "short_factor": [1.0]}}
    assert facts(longrope).max_context == 4096


def test_kv_cache_dtype_bytes() -> None:
    f = facts(LLAMA_31_8B)
    assert kv_cache.kv_bytes_per_token(f, kv_cache_dtype="fp8") == 65536
    assert kv_cache.kv_bytes_per_token(f, kv_cache_dtype="fp8_e5m2") == 65536
    assert kv_cache.kv_bytes_per_token(f, dtype="float32") == 262144  # auto follows an explicit float32 model dtype
    with pytest.raises(cap.CapacityError, match="KV_CACHE_DTYPE='nvfp4' is not modeled"):
        kv_cache.kv_bytes_per_token(f, kv_cache_dtype="nvfp4")


def test_checkpoint_kv_scheme_makes_auto_fp8() -> None:
    config = {**LLAMA_31_8B, "quantization_config": {"quant_method": "compressed-tensors",
                                                     "kv_cache_scheme": {"num_bits": 8, "type": "float"}}}
    f = facts(config)
    assert f.kv_cache_scheme == "fp8" and f.quant_method == "compressed-tensors"
    assert kv_cache.kv_bytes_per_token(f) == 65536
    assert kv_cache.kv_bytes_per_token(f, kv_cache_dtype="bfloat16") == 131072


# --- weights -------------------------------------------------------------------------------


def test_weights_of_a_bf16_checkpoint() -> None:
    weights, source = memory_budget.weights_bytes(facts(LLAMA_31_8B, LLAMA_31_8B_PARAMS), knobs())
    assert weights == 8030261248 * 2 and source == "safetensors"


def test_float32_checkpoint_is_loaded_in_16_bits_unless_dtype_float32() -> None:
    f = facts({**LLAMA_31_8B, "torch_dtype": "float32"}, {"F32": 1_000_000})
    assert memory_budget.weights_bytes(f, knobs())[0] == 2_000_000  # auto downcasts float32 to bfloat16
    assert memory_budget.weights_bytes(f, knobs({"DTYPE": "float32"}))[0] == 4_000_000


@pytest.mark.parametrize(
    ("method", "counts", "expected"),
    [
        ("gptq", {"I32": 1_000_000, "F16": 500_000}, 4_000_000 + 1_000_000),  # packed int4 in int32 + fp16 scales
        ("fp8", {"F8_E4M3": 1_000_000, "BF16": 100_000, "F32": 10_000}, 1_000_000 + 200_000 + 40_000),
        ("modelopt_fp4", {"U8": 1_000_000, "F8_E4M3": 100_000, "BF16": 10_000}, 1_000_000 + 100_000 + 20_000),
        ("bitsandbytes", {"U8": 1_000_000, "F32": 1_000, "BF16": 10_000}, 1_000_000 + 4_000 + 20_000),
    ],
)
def test_quantized_checkpoints_keep_their_storage(method: str, counts: dict[str, int], expected: int) -> None:
    f = facts({**LLAMA_31_8B, "quantization_config": {"quant_method": method}}, counts)
    assert f.quant_method == method
    assert memory_budget.weights_bytes(f, knobs())[0] == expected


def test_deepseek_fp8_weights_per_gpu() -> None:
    f = facts(DEEPSEEK_V3, DEEPSEEK_V3_PARAMS)
    total = 680_000_000_000 + 2 * 3_900_000_000 + 4 * 41_000_000
    assert memory_budget.weights_bytes(f, knobs())[0] == total
    p = cap.plan(f, find_card("H200").total_bytes, knobs({"TENSOR_PARALLEL_SIZE": "8", "MAX_MODEL_LEN": "32768"}))
    assert p.weights_bytes == total // 8 and p.gpus == 8


def test_weights_estimated_from_config_without_counts() -> None:
    f = facts(LLAMA_31_8B)
    weights, source = memory_budget.weights_bytes(f, knobs())
    assert source == "estimated from config.json"
    assert abs(weights / 2 - 8030261248) / 8030261248 < 0.01  # the shape formula is within 1% for Llama


# --- safetensors headers --------------------------------------------------------------------


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    """A file in the safetensors layout: u64 little-endian header length, JSON header, data."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        size = model_facts.DTYPE_BITS[dtype] // 8
        for d in shape:
            size *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)


def test_safetensors_headers_are_counted_per_dtype(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_31_8B))
    write_safetensors(tmp_path / "model-00001-of-00002.safetensors", {"a": ("BF16", [2, 3]), "b": ("I32", [4])})
    write_safetensors(tmp_path / "model-00002-of-00002.safetensors", {"c": ("BF16", [5])})
    write_safetensors(tmp_path / "consolidated.safetensors", {"a": ("BF16", [1000])})  # Mistral-format duplicate
    f = cap.facts_from_folder(tmp_path)
    assert dict(f.param_counts) == {"BF16": 11, "I32": 4}
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors"}})
    )
    assert dict(cap.facts_from_folder(tmp_path).param_counts) == {"BF16": 6, "I32": 4}


def test_folder_without_config_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(cap.CapacityError, match="has no config.json"):
        cap.facts_from_folder(tmp_path)


def test_unsupported_cache_layers_are_not_modeled() -> None:
    f = facts({**LLAMA_31_8B, "model_type": "qwen3_next"})
    assert f.not_modeled
    with pytest.raises(cap.CapacityError, match="does not model"):
        kv_cache.kv_layout(f, knobs())
    layered = facts({**LLAMA_31_8B, "num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"]})
    assert layered.not_modeled == "layer type 'linear_attention' is not modeled"


# --- settings ----------------------------------------------------------------------------------


def test_sizes_and_human_readable_integers() -> None:
    assert plan_settings.parse_size("24GiB") == 24 * GiB
    assert plan_settings.parse_size("24G") == 24 * GiB
    assert plan_settings.parse_size("80GB") == 80 * 10**9
    assert plan_settings.parse_size("1000") == 1000
    with pytest.raises(cap.CapacityError):
        plan_settings.parse_size("lots")
    assert parse_human_int("8k") == 8000 and parse_human_int("8K") == 8192
    assert parse_human_int("1G") == GiB and parse_human_int("25.6k") == 25600


def test_knobs_from_env_with_extra_args() -> None:
    k = knobs(
        {"MAX_MODEL_LEN": "32k", "KV_CACHE_MEMORY_BYTES": "1G", "MAX_NUM_BATCHED_TOKENS": "0",
         "VLLM_EXTRA_ARGS": "--max-num-seqs 64 --enforce-eager -tp 2 --kv_cache_dtype=fp8"},
        worker_seqs=True,
    )
    assert (k.max_model_len, k.kv_cache_memory_bytes, k.max_num_batched_tokens) == (32000, GiB, None)
    assert (k.max_num_seqs, k.enforce_eager, k.tensor_parallel_size, k.kv_cache_dtype) == (64, True, 2, "fp8")
    assert knobs({"MAX_MODEL_LEN": "auto"}).max_model_len == -1
    assert knobs({}, worker_seqs=True).max_num_seqs == 32  # the worker's default, a multiple of 8
    with pytest.raises(cap.CapacityError, match="GPU_MEMORY_UTILIZATION='high'"):
        knobs({"GPU_MEMORY_UTILIZATION": "high"})


def test_batch_defaults_follow_the_card() -> None:
    f = facts(LLAMA_31_8B)
    assert memory_budget.resolved_batch(f, knobs(), 24 * GiB, 8192) == (256, 2048)
    assert memory_budget.resolved_batch(f, knobs(), 79 * GiB, 8192) == (1024, 8192)
    assert memory_budget.resolved_batch(f, knobs(device_name="A100 80GB"), 79 * GiB, 8192) == (256, 2048)
    assert memory_budget.resolved_batch(f, knobs(), 180 * GiB, 8192) == (1024, 16384)
    assert memory_budget.resolved_batch(f, knobs({"MAX_NUM_SEQS": "8"}), 24 * GiB, 100) == (8, 800)  # seqs x max_model_len
    assert memory_budget.resolved_batch(f, knobs(platform="cpu"), None, 8192) == (128, 2048)


def test_cuda_graph_capture_sizes() -> None:
    assert memory_budget.capture_sizes(32, 2048) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    sizes = memory_budget.capture_sizes(256, 8192)
    assert len(sizes) == 3 + 31 + 17 and sizes[-1] == 512
    assert memory_budget.capture_sizes(8, 48) == [1, 2, 4, 8, 16]
    assert memory_budget.capture_sizes(64, 100) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 100]


def test_eager_and_cpu_have_no_graph_memory() -> None:
    f = facts(LLAMA_31_8B)
    assert memory_budget.cudagraph_bytes(f, knobs({"ENFORCE_EAGER": "true"}), 32, 2048) == (0, 0)
    assert memory_budget.cudagraph_bytes(f, knobs(platform="cpu"), 32, 2048) == (0, 0)
    estimate, graphs = memory_budget.cudagraph_bytes(f, knobs(), 32, 2048)
    assert graphs == 11 + 7  # PIECEWISE for every size, FULL for sizes <= MAX_NUM_SEQS
    assert 0 < estimate < 1 * GiB


# --- the plan --------------------------------------------------------------------------------


def test_exact_plan_with_fixed_kv_memory() -> None:
    f = facts(LLAMA_31_8B, LLAMA_31_8B_PARAMS)
    p = cap.plan(f, None, knobs({"KV_CACHE_MEMORY_BYTES": str(8 * GiB), "MAX_MODEL_LEN": "8192"}))
    assert p.bytes_per_block == 32 * 16 * 8 * 2 * 128 * 2 == 2 * MiB
    assert p.num_blocks == 4096
    assert (p.kv_cache_tokens, p.max_concurrency) == (4096 * 16, 8.0)
    assert p.max_model_len_fits == (4096 - 1) * 16  # the null block is held back
    assert p.verdict == "fits" and p.changes == ()


def test_explicit_kv_memory_must_still_fit_the_card() -> None:
    f = facts(LLAMA_31_8B, LLAMA_31_8B_PARAMS)
    ok = cap.plan(f, RTX_4090, knobs({"KV_CACHE_MEMORY_BYTES": str(4 * GiB), "MAX_MODEL_LEN": "8192"}))
    assert ok.problems == () and ok.kv_exact
    too_much = cap.plan(f, RTX_4090, knobs({"KV_CACHE_MEMORY_BYTES": str(12 * GiB), "MAX_MODEL_LEN": "8192"}))
    assert too_much.verdict == "does_not_fit" and "more than the 23.5 GiB GPU holds" in too_much.problems[0]


def test_plan_that_does_not_fit_offers_changes_that_do() -> None:
    f = facts(LLAMA_31_8B, LLAMA_31_8B_PARAMS)
    p = cap.plan(f, None, knobs({"KV_CACHE_MEMORY_BYTES": str(8 * GiB), "MAX_MODEL_LEN": "100000"}))
    assert p.verdict == "does_not_fit" and not p.fits
    changes = {c.variable: c.value for c in p.changes}
    assert changes["KV_CACHE_DTYPE"] == "fp8"  # 8192 blocks of 16 tokens hold 100,000
    assert changes["MAX_MODEL_LEN"] == "65520" == str(p.longest_context)  # (4096 - 1) x 16: the null block held back


def test_gpu_budget_terms_add_up() -> None:
    f = facts(LLAMA_31_8B, LLAMA_31_8B_PARAMS)
    p = cap.plan(f, RTX_4090, knobs({"MAX_MODEL_LEN": "8192"}, worker_seqs=True))
    assert p.requested_bytes == -(-RTX_4090 * 92 // 100)
    # The worker cannot know whether torch.compile's cache is warm: a cold compile is counted
    # at the conservative end of the band only, not in the central prediction.
    assert p.compile_cache == "unknown" and p.compile_bytes > 0
    assert p.kv_cache_bytes == p.requested_bytes - p.weights_bytes - p.non_torch_bytes - p.activation_bytes - p.cudagraph_bytes
    assert p.num_blocks == p.kv_cache_bytes // (2 * MiB)
    assert p.verdict == "fits" and p.max_model_len_fits < f.max_context
    assert 0 < p.margin_bytes < 1 * GiB
    cold = cap.plan(f, RTX_4090, replace(knobs({"MAX_MODEL_LEN": "8192"}, worker_seqs=True), compile_cache="cold"))
    assert cold.kv_cache_bytes == p.kv_cache_bytes - p.compile_bytes
    warm = cap.plan(f, RTX_4090, replace(knobs({"MAX_MODEL_LEN": "8192"}, worker_seqs=True), compile_cache="warm"))
    assert warm.kv_cache_bytes == p.kv_cache_bytes and warm.compile_bytes == 0
    assert warm.max_model_len_low > p.max_model_len_low  # no first-boot allowance at the conservative end


def test_gpu_terms_follow_vllm_032s_profile_run() -> None:
    f = facts(LLAMA_31_8B, LLAMA_31_8B_PARAMS)
    k = knobs({"MAX_MODEL_LEN": "8192"}, worker_seqs=True)  # MAX_NUM_SEQS=32, 2048 batched tokens (< 70 GiB)
    # Forward pass: gate_up + SiluAndMul (3 x 14336) and four hidden-sized tensors per token, in bf16.
    assert memory_budget.forward_bytes_per_token(f, k) == (3 * 14336 + 4 * 4096) * 2
    # V2 runner: the sampler warm-up samples from 32 rows of float32 logits; the forward pass is the peak.
    assert memory_budget.sampler_bytes(f, k, 32, 2048) == 32 * 128256 * 4
    assert memory_budget.activation_bytes(f, k, 32, 2048) == 2048 * (3 * 14336 + 4 * 4096) * 2
    # CUDA graphs: 11 PIECEWISE sizes up to 64 and 7 FULL ones up to 32, 138,000 bytes per graph and
    # layer, plus the largest size's activations.
    graphs, count = memory_budget.cudagraph_bytes(f, k, 32, 2048)
    assert count == 18 and graphs == int(64 * (3 * 14336 + 4 * 4096) * 2 + 138_000 * 32 * 18)
    # A cold compile on 0.32: 1.9 x layers x hidden x batched tokens x 2 bytes (the transient share of
    # 0.29's 4.5; 0.32 profiles under an allocator split limit), held at 28 x 3584 and 2048 tokens.
    assert memory_budget.compile_bytes(f, k, 2048) == int(1.9 * (28 * 3584) * 2048 * 2)  # 32 x 4096 is larger: held
    small = facts({**LLAMA_31_8B, "num_hidden_layers": 4})
    assert memory_budget.compile_bytes(small, k, 1024) == int(1.9 * 4 * 4096 * 1024 * 2)
    assert memory_budget.compile_bytes(f, replace(k, enforce_eager=True), 2048) == 0
    v029 = replace(k, budgeting=budget_versions.budgeting_for("0.29.0"))
    assert memory_budget.compile_bytes(f, v029, 2048) == int(4.5 * (28 * 3584) * 2048 * 2)
    assert memory_budget.non_torch_bytes(k) == 512 * MiB


def test_older_vllm_versions_budget_differently() -> None:
    v032 = budget_versions.budgeting_for("0.32.0")
    assert v032 == replace(budget_versions.VLLM_032, version="0.32.0") and v032.graphs_in_budget and v032.runner == "v2"
    # The cold compile: 0.21-0.31 in full, 57 % of it consumed after profiling; 0.32 its transient share only.
    v029 = budget_versions.budgeting_for("0.29.0")
    assert (v029.cold_compile_factor, v029.compile_persistent_share) == (4.5, 0.57)
    assert (v032.cold_compile_factor, v032.compile_persistent_share) == (1.9, 0.0)
    assert budget_versions.budgeting_for("0.31.1").cold_compile_factor == 4.5
    old = budget_versions.budgeting_for("0.10.1.1")
    assert (old.runner, old.graphs_in_budget, old.cold_compile_factor, old.reports_capacity) == ("v1", False, 0.0, False)
    assert old.sampler_bytes_per_logit > budget_versions.budgeting_for("0.10.1.1", flashinfer_sampler=True).sampler_bytes_per_logit
    assert budget_versions.budgeting_for("0.19.1").sampler_bytes_per_logit < old.sampler_bytes_per_logit
    with pytest.raises(ValueError):
        budget_versions.budgeting_for("unknown")
    f = facts(LLAMA_31_8B, LLAMA_31_8B_PARAMS)
    env = {"MAX_MODEL_LEN": "8192", "MAX_NUM_SEQS": "1024", "MAX_NUM_BATCHED_TOKENS": "8192"}
    new = cap.plan(f, H100, knobs(env))
    before = cap.plan(f, H100, replace(knobs(env), budgeting=old))
    # V1's sampler warm-up over 1024 rows x 128,256 logits dominates the peak; V1 captured graphs after sizing.
    assert before.activation_bytes == int(8192 * 4096 * 2 + 1024 * 128256 * old.sampler_bytes_per_logit)
    assert before.cudagraph_bytes == 0 and new.cudagraph_bytes > 0 and before.budget_version == "0.10.1.1"


def test_one_longest_context_with_its_band_and_a_verdict_inside_it() -> None:
    f = facts(LLAMA_31_8B, LLAMA_31_8B_PARAMS)
    base = cap.plan(f, RTX_4090, knobs({}, worker_seqs=True), max_concurrency=30)
    assert base.verdict == "does_not_fit"  # the full 131,072-token context
    low, central, high = base.max_model_len_low, base.max_model_len_fits, base.max_model_len_high
    assert 0 < low < central < high < f.max_context and base.longest_context == low
    change = next(c for c in base.changes if c.variable == "MAX_MODEL_LEN")
    assert change.value == str(low)  # the suggestion is the number the plan states
    assert base.to_json()["max_model_len"] == low and base.to_json()["max_model_len_high"] == high

    def verdict(length: int) -> str:
        return cap.plan(f, RTX_4090, knobs({"MAX_MODEL_LEN": str(length)}, worker_seqs=True)).verdict

    assert verdict(low) == "fits"
    assert verdict((central + high) // 2) == "too_close_to_call"
    assert verdict(high + 4096) == "does_not_fit"
    table = plan_report.render_table(cap.plan(f, RTX_4090, knobs({"MAX_MODEL_LEN": str(central)}, worker_seqs=True)), f,
                             "RTX 4090", 30)
    assert "too close to call" in table


def test_utilization_beyond_the_free_memory_is_a_problem() -> None:
    f = facts(LLAMA_31_8B, LLAMA_31_8B_PARAMS)
    p = cap.plan(f, RTX_4090, knobs({"GPU_MEMORY_UTILIZATION": "0.999", "MAX_MODEL_LEN": "4096"}))
    assert p.verdict == "does_not_fit" and "once CUDA is initialised" in p.problems[0]
    assert str(p.changes[0]) == "set GPU_MEMORY_UTILIZATION=0.95 (leaves room for the CUDA context; now 0.999)"
    d = first_launch.fit_profile(f, RTX_4090, LaunchProfile.parse({"MODEL_NAME": "m", "GPU_MEMORY_UTILIZATION": "0.999", "MAX_MODEL_LEN": "4096"}))
    assert d.status == "cannot_fit" and "set GPU_MEMORY_UTILIZATION=0.95" in (d.fatal_message or "")
    # Within the estimate's error, vLLM may well start: no verdict from the plan.
    assert cap.plan(f, RTX_4090, knobs({"GPU_MEMORY_UTILIZATION": "0.985", "MAX_MODEL_LEN": "4096"})).problems == ()


def test_max_model_len_above_the_model_is_left_to_vllm() -> None:
    f = facts(QWEN25_7B, {"BF16": 7615616512})
    p = cap.plan(f, H100, knobs({"MAX_MODEL_LEN": "65536"}))
    assert p.problems == () and "vLLM will refuse it" in p.notes[0]
    allowed = cap.plan(f, H100, knobs({"MAX_MODEL_LEN": "65536", "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}))
    assert allowed.notes == ()


def test_auto_max_model_len_fits_the_memory() -> None:
    f = facts(LLAMA_31_8B, LLAMA_31_8B_PARAMS)
    p = cap.plan(f, RTX_4090, knobs({"MAX_MODEL_LEN": "auto"}, worker_seqs=True))
    assert p.verdict == "fits" and p.max_model_len == p.max_model_len_fits < 131072


# --- item 3: the first launch -------------------------------------------------------------------


def test_fits_as_configured() -> None:
    f = facts(LLAMA_31_8B, LLAMA_31_8B_PARAMS)
    d = first_launch.fit_profile(f, RTX_4090, LaunchProfile.parse({"MODEL_NAME": "m", "MAX_MODEL_LEN": "8192"}))
    assert (d.status, d.overrides, d.fatal_message, d.relaunch) == ("as_configured", {}, None, None)


def test_unset_context_that_does_not_fit_launches_with_auto() -> None:
    f = facts(LLAMA_31_8B, LLAMA_31_8B_PARAMS)
    d = first_launch.fit_profile(f, RTX_4090, LaunchProfile.parse({"MODEL_NAME": "m"}))
    assert d.status == "profile" and d.relaunch.profile == "context_auto"
    assert d.overrides == {"MAX_MODEL_LEN": "auto"}
    assert "MAX_MODEL_LEN is not set" in d.warnings[0]
    assert d.configured is not None and d.configured.verdict == "does_not_fit"


def test_explicit_context_is_never_lowered() -> None:
    f = facts(LLAMA_31_8B, LLAMA_31_8B_PARAMS)
    d = first_launch.fit_profile(f, RTX_4090, LaunchProfile.parse({"MODEL_NAME": "m", "MAX_MODEL_LEN": "131072"}))
    assert d.status == "cannot_fit" and d.overrides == {}
    message = d.fatal_message or ""
    assert message.startswith("MODEL_NAME='org/model' does not fit on this 23.5 GiB GPU at MAX_MODEL_LEN=131072")
    assert "set MAX_MODEL_LEN=" in message and "set TENSOR_PARALLEL_SIZE=2" in message
    assert "MAX_NUM_SEQS" not in message.split("To fix:")[1]  # profiles predicted not to help are not advised


def test_weights_alone_exceed_the_card() -> None:
    f = facts(LLAMA_31_70B, LLAMA_31_70B_PARAMS)
    d = first_launch.fit_profile(f, RTX_4090, LaunchProfile.parse({"MODEL_NAME": "m"}))
    assert d.status == "cannot_fit"
    message = d.fatal_message or ""
    assert "its weights alone take 131.4 GiB per GPU of the 21.6 GiB vLLM may use" in message
    assert "set TENSOR_PARALLEL_SIZE=8 and run on 8 GPUs like this one" in message
    assert "quantized checkpoint" in message


def _big_vocab_model() -> cap.ModelFacts:
    # A sampler that matters: 256 sequences x 1,000,000 logits is several GiB.
    config = {**LLAMA_31_8B, "vocab_size": 1_000_000, "max_position_embeddings": 1_048_576, "rope_scaling": None}
    return facts(config, LLAMA_31_8B_PARAMS)


def _context_beyond(f: cap.ModelFacts, total: int, loose: dict[str, str]) -> int:
    """A MAX_MODEL_LEN just past what `loose` holds even with its error margin (scenario set-up)."""
    a = cap.plan(f, total, knobs(loose, worker_seqs=True))
    return (a.kv_cache_bytes + a.margin_bytes) // kv_cache.kv_bytes_per_token(f) + 256


def test_explicit_max_num_seqs_is_lowered_loudly() -> None:
    f = _big_vocab_model()
    length = _context_beyond(f, RTX_4090, {"MAX_NUM_SEQS": "256"})
    env = {"MODEL_NAME": "m", "MAX_NUM_SEQS": "256", "MAX_MODEL_LEN": str(length)}
    d = first_launch.fit_profile(f, RTX_4090, LaunchProfile.parse(env))
    assert d.configured is not None and d.configured.verdict == "does_not_fit"
    assert d.status == "profile" and d.relaunch.profile == "max_num_seqs=32"
    assert d.overrides == {"MAX_NUM_SEQS": "32"}
    assert d.plan is not None and d.plan.verdict != "does_not_fit"
    assert any(w.startswith("MAX_NUM_SEQS=256 is OVERRIDDEN to 32") for w in d.warnings)


def test_explicit_eager_false_is_overridden_with_the_ladder_warning() -> None:
    f = _big_vocab_model()
    loose = {"ENFORCE_EAGER": "false", "MAX_NUM_BATCHED_TOKENS": "8192", "VLLM_EXTRA_ARGS": "--max-num-seqs 256"}
    length = _context_beyond(f, H100, loose)
    env = {"MODEL_NAME": "m", "MAX_MODEL_LEN": str(length), **loose}
    d = first_launch.fit_profile(f, H100, LaunchProfile.parse(env))
    assert d.configured is not None and d.configured.verdict == "does_not_fit"
    assert d.status == "profile" and d.relaunch.profile == "eager"
    assert d.overrides == {"ENFORCE_EAGER": "true"}
    assert any("ENFORCE_EAGER=false is OVERRIDDEN to true" in w for w in d.warnings)


# --- startup_plan: never raises ------------------------------------------------------------------


def test_startup_plan_with_preflight_counts_and_config() -> None:
    sp = cap.startup_plan(LaunchProfile.parse({"MODEL_NAME": "meta-llama/Llama-3.1-8B-Instruct", "MAX_MODEL_LEN": "8192"}), RTX_4090,
                          config=LLAMA_31_8B, safetensors_parameters=LLAMA_31_8B_PARAMS)
    assert sp.status == "as_configured" and sp.fatal_message is None and sp.overrides == {}
    assert sp.log_line.startswith("capacity plan (fits):")
    assert sp.predicted is not None and sp.predicted.weights_bytes == 2 * 8030261248
    assert any("fewer than MAX_CONCURRENCY=30" in w for w in sp.warnings)
    fields = sp.status_fields()
    assert fields["plan"] == "as_configured" and fields["predicted_kv_cache_tokens"] == sp.predicted.kv_cache_tokens
    eager = sp.predict_for(LaunchProfile.parse({"MODEL_NAME": "m", "MAX_MODEL_LEN": "8192", "ENFORCE_EAGER": "true"}))
    assert eager is not None and eager.cudagraph_bytes == 0 and eager.kv_cache_bytes > sp.predicted.kv_cache_bytes


def test_a_start_that_will_find_the_compile_caches_warm_plans_without_the_cold_compile() -> None:
    env = LaunchProfile.parse({"MODEL_NAME": "meta-llama/Llama-3.1-8B-Instruct", "MAX_MODEL_LEN": "8192"})
    unknown = cap.startup_plan(env, RTX_4090, config=LLAMA_31_8B, safetensors_parameters=LLAMA_31_8B_PARAMS)
    warm = cap.startup_plan(env, RTX_4090, config=LLAMA_31_8B, safetensors_parameters=LLAMA_31_8B_PARAMS,
                            compile_cache="warm")
    assert unknown.predicted is not None and warm.predicted is not None
    assert unknown.predicted.compile_bytes > 0 and warm.predicted.compile_bytes == 0
    assert warm.predicted.max_model_len_low > unknown.predicted.max_model_len_low


def test_startup_plan_is_unknown_when_facts_cannot_be_read(tmp_path: Path) -> None:
    sp = cap.startup_plan(LaunchProfile.parse({"MODEL_NAME": str(tmp_path / "missing")}), RTX_4090)
    assert sp.status == "unknown" and sp.overrides == {} and sp.fatal_message is None
    assert "capacity plan unavailable" in sp.log_line and "launching as configured" in sp.log_line
    assert cap.startup_plan(LaunchProfile.parse({}), RTX_4090).status == "unknown"
    unmodeled = cap.startup_plan(LaunchProfile.parse({"MODEL_NAME": "m"}), RTX_4090, config={**LLAMA_31_8B, "model_type": "qwen3_next"})
    assert unmodeled.status == "unknown"


def test_startup_plan_without_a_gpu_figure_only_logs_facts() -> None:
    sp = cap.startup_plan(LaunchProfile.parse({"MODEL_NAME": "m"}), None, config=LLAMA_31_8B, safetensors_parameters=LLAMA_31_8B_PARAMS)
    assert sp.status == "unknown" and "128.0 KiB per token" in sp.log_line


def test_startup_plan_on_cpu_with_fixed_kv_memory_is_exact() -> None:
    env = {"MODEL_NAME": "m", "KV_CACHE_MEMORY_BYTES": str(64 * MiB), "MAX_MODEL_LEN": "512"}
    sp = cap.startup_plan(LaunchProfile.parse(env), None, platform="cpu", config=LLAMA_31_8B)
    assert sp.status == "as_configured" and sp.predicted is not None
    # CPU block 128: 32 layers x 128 x 8 x 2 x 128 x 2 bytes = 16 MiB per block -> 4 blocks, 1 request of 512
    assert (sp.predicted.num_blocks, sp.predicted.kv_cache_tokens) == (4, 512)


def test_startup_plan_cannot_fit_answers_with_the_message() -> None:
    sp = cap.startup_plan(LaunchProfile.parse({"MODEL_NAME": "m"}), RTX_4090, config=LLAMA_31_70B,
                          safetensors_parameters=LLAMA_31_70B_PARAMS)
    assert sp.status == "cannot_fit" and sp.fatal_message and "weights alone" in sp.fatal_message
    assert "not launching" in sp.log_line


# --- item 4: the engine's own figures --------------------------------------------------------------

CPU_LINE = (
    "(EngineCore pid=775) INFO 11-29 15:56:13 [kv_cache_utils.py:2327] CPU KV cache size: 875 tokens, "
    "Maximum concurrency for 500 tokens per request: 1.75x"
)


def test_parse_engine_capacity() -> None:
    got = cap.parse_engine_capacity("noise\n" + CPU_LINE + "\nmore")
    assert got == cap.EngineCapacity(kv_tokens=875, max_concurrency=1.75, max_model_len=500, pool="CPU")
    gpu = "INFO [kv_cache_utils.py:2327] GPU KV cache size: 443,920 tokens, Maximum concurrency for 8,192 tokens per request: 54.19x"
    assert cap.parse_engine_capacity(gpu) == cap.EngineCapacity(443920, 54.19, 8192, "GPU")
    host = "GPU + host KV cache size: 1,024 tokens, Maximum concurrency for 512 tokens per request: 2.00x"
    assert cap.parse_engine_capacity(host).pool == "GPU + host"  # type: ignore[union-attr]
    assert cap.parse_engine_capacity("Starting vLLM API server") is None


def test_parse_cache_config_metric() -> None:
    text = (
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="16",cache_dtype="auto",kv_cache_max_concurrency="54.18896484375",'
        'kv_cache_size_tokens="443920",num_gpu_blocks="27745"} 1.0\n'
    )
    assert cap.parse_cache_config_metric(text) == cap.EngineCapacity(443920, 54.18896484375)
    assert cap.parse_cache_config_metric("vllm:num_requests_running 0.0") is None


def test_capacity_report_compares_and_warns() -> None:
    f = facts(LLAMA_31_8B, LLAMA_31_8B_PARAMS)
    predicted = cap.plan(f, RTX_4090, knobs({"MAX_MODEL_LEN": "8192"}, worker_seqs=True))
    actual = cap.EngineCapacity(kv_tokens=predicted.kv_cache_tokens - 1000, max_concurrency=5.92, max_model_len=8192, pool="GPU")
    report = cap.capacity_report(predicted, actual, 30)
    assert report.status["kv_cache_tokens"] == actual.kv_tokens
    assert report.status["predicted_kv_cache_tokens"] == predicted.kv_cache_tokens
    assert report.status["prediction_error_tokens"] == -1000
    assert "predicted" in report.log_line and "5.92x" in report.log_line
    assert len(report.warnings) == 1 and "fewer than MAX_CONCURRENCY=30" in report.warnings[0]
    assert cap.capacity_report(predicted, actual, 4).warnings == []
    assert cap.capacity_report(None, None, 4).status == {}


BOOTS = Path(__file__).resolve().parents[1] / "field" / "boots"


def boot_log(prefix: str) -> str:
    return next(BOOTS.glob(f"{prefix}_*.log")).read_text()


def test_parse_engine_capacity_reads_the_budget_terms_of_a_real_boot() -> None:
    # Boot 007 (vLLM 0.29, RTX 5090): the wordings are vLLM 0.32's (gpu_worker.py, gpu/model_runner.py).
    got = cap.parse_engine_capacity(boot_log("007"))
    assert got is not None and (got.kv_tokens, got.max_concurrency, got.max_model_len) == (209120, 25.53, 8192)
    gib = {name: round(getattr(got, name) / GiB, 2) for name in (
        "weights_bytes", "kv_cache_bytes", "consumed_bytes", "peak_activation_bytes", "cudagraph_estimate_bytes",
        "cudagraph_actual_bytes", "requested_bytes", "total_bytes")}
    assert gib == {"weights_bytes": 14.29, "kv_cache_bytes": 11.17, "consumed_bytes": 15.65,
                   "peak_activation_bytes": 1.4, "cudagraph_estimate_bytes": 0.38, "cudagraph_actual_bytes": 0.18,
                   "requested_bytes": 28.22, "total_bytes": 31.36}
    # Before 0.21 the capacity was two log lines (boot 002, vLLM 0.10.1).
    older = cap.parse_engine_capacity(boot_log("002"))
    assert older is not None and (older.kv_tokens, older.max_concurrency, older.max_model_len) == (464848, 28.37, 16384)
    assert older.consumed_bytes is None and older.kv_cache_bytes == int(24.83 * GiB)


def _boot_007_plan(compile_cache: str) -> cap.Plan:
    config = json.loads((BOOTS / "configs" / "Qwen--Qwen2.5-7B-Instruct.json").read_text())
    f = cap.facts_from_config(config, {"BF16": 7_615_616_512}, source="Qwen/Qwen2.5-7B-Instruct")
    k = replace(knobs({"GPU_MEMORY_UTILIZATION": "0.9", "MAX_MODEL_LEN": "8192"}), compile_cache=compile_cache,
                budgeting=budget_versions.budgeting_for("0.29.0"))  # the boot's own vLLM
    return cap.plan(f, int(31.36 * GiB), k)


def test_capacity_report_keeps_predicted_and_actual_per_term() -> None:
    actual = cap.parse_engine_capacity(boot_log("007"))
    report = cap.capacity_report(_boot_007_plan("cold"), actual, 4)
    terms = report.status["capacity_terms"]
    assert set(terms) == {"weights", "non_torch", "activation", "cuda_graphs", "kv_cache"}
    assert terms["weights"] == {"predicted_gib": 14.19, "actual_gib": 14.29}
    assert terms["kv_cache"]["actual_gib"] == 11.17 and abs(terms["kv_cache"]["predicted_gib"] - 11.17) < 0.05
    assert abs(report.status["prediction_error_pct"]) < 1 and report.warnings == []


def test_a_gap_over_5_percent_is_a_warning_naming_the_terms() -> None:
    # The worker does not know the compile cache was cold: its central prediction is 15% high.
    actual = cap.parse_engine_capacity(boot_log("007"))
    report = cap.capacity_report(_boot_007_plan("unknown"), actual, 4)
    assert report.status["prediction_error_pct"] < -5
    [warning] = report.warnings
    assert warning.startswith("the engine's KV cache holds 209,120 tokens, -1")
    named = warning.split("the terms furthest apart: ")[1]
    assert named.startswith("non torch 1.36 GiB logged, 0.50 GiB predicted; activation 1.02 GiB logged")
    assert "please report this" in warning


# --- the card table and the table output -----------------------------------------------------------


def test_card_lookup() -> None:
    assert find_card("NVIDIA GeForce RTX 4090").name == "RTX 4090"
    assert find_card("h100").name == "H100 80GB"
    assert find_card("NVIDIA A100-SXM4-80GB").name == "A100 80GB"
    assert find_card("a10").name == "A10"
    assert 23 * GiB < find_card("RTX 4090").total_bytes < 24 * GiB
    with pytest.raises(UnknownCard, match="matches several cards"):
        find_card("RTX")
    with pytest.raises(UnknownCard, match="not in the table"):
        find_card("Voodoo 2")
    assert cards_with_at_least(100 * GiB)[0].name == "H200"


def test_render_table_names_the_smallest_change() -> None:
    f = facts(LLAMA_31_8B, LLAMA_31_8B_PARAMS)
    p = cap.plan(f, RTX_4090, knobs({}, worker_seqs=True), max_concurrency=30)
    table = plan_report.render_table(p, f, "RTX 4090", 30)
    assert "DOES NOT FIT" in table
    assert "smallest change  --max-model-len" in table
    lines = dict(line.split("  ", 1) for line in table.splitlines() if "  " in line)
    assert lines["KV per token"].strip().startswith("131,072 bytes")
