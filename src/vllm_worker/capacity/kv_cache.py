"""How vLLM 0.32 turns KV-cache memory into blocks, tokens and a longest context (exact).

These rules mirror vllm/v1/core/kv_cache_utils.py and vllm/v1/kv_cache_interface.py:
bytes per token, pages, blocks, hybrid sliding-window groups, MLA, the null block, and
the token count and concurrency vLLM logs. tests/engine/test_capacity_accuracy.py checks
them token for token against the real engine with a fixed KV-cache size; nothing here is
estimated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from vllm_worker.capacity.model_facts import TORCH_DTYPE_BYTES, CapacityError, ModelFacts
from vllm_worker.capacity.plan_settings import Knobs

GPU_BLOCK_SIZE = 16  # config/cache.py CacheConfig.DEFAULT_BLOCK_SIZE; FlashAttention keeps it (flash_attn.py)
GPU_MLA_BLOCK_SIZE = 64  # v1/attention/backends/mla/flashmla.py get_supported_kernel_block_sizes (Hopper MLA)
CPU_BLOCK_SIZE = 128  # platforms/cpu.py: cache_config.block_size = 128 unless set
CPU_MLA_BLOCK_SIZE = 16  # platforms/cpu.py: the reference CPU MLA kernel forces 16 (AMX CPUs run AMX_MLA at 128)
KV_DTYPE_BYTES = {
    "bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1,
}


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


def kv_bytes_per_token_per_layer(
    facts: ModelFacts, tensor_parallel_size: int = 1, kv_cache_dtype: str = "auto", dtype: str = "auto"
) -> int:
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
        if facts.mla and not knobs.cpu_amx:
            return CPU_MLA_BLOCK_SIZE  # platforms/cpu.py: the reference CPU MLA kernel, whatever was asked
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


def logged_tokens(num_blocks: int, layout: KVLayout, max_model_len: int, max_in_flight_tokens: int,
                  *, capacity_formula: bool = True) -> int:
    """The token count vLLM logs for `num_blocks`: int(concurrency x max_model_len) since 0.21
    (get_kv_cache_capacity), num_blocks // groups x block_size before (budget_versions)."""
    if capacity_formula:
        return kv_capacity(num_blocks, layout, max_model_len, max_in_flight_tokens)[0]
    return num_blocks // len(layout.groups) * layout.block_size
