"""Will this model fit this GPU under vLLM 0.32? The capacity plan, one import away.

The plan lives in modules named for what they decide; this facade keeps the names the
worker (main.py), the CLI and the tests import from `vllm_worker.capacity`:

- `model_facts`: what a model is, read from config.json and safetensors headers;
- `plan_settings`: the worker's variables resolved to what vLLM will run with;
- `kv_cache`: how vLLM turns KV memory into blocks, tokens and a longest context (exact);
- `budget_versions`: where a vLLM version budgets differently from 0.32;
- `memory_budget`: vLLM 0.32's memory budget term by term, and the plan;
- `plan_report`: the table, the JSON and the log line (`vllm-worker plan`);
- `capacity_at_boot`: the first launch, and the answer when nothing fits;
- `engine_capacity`: the engine's real figures against the plan, after a start.
"""

from __future__ import annotations

from vllm_worker.budget_versions import VLLM_032, Budgeting, budgeting_for
from vllm_worker.capacity_at_boot import (
    FitDecision,
    StartupPlan,
    cannot_fit_message,
    fit_profile,
    startup_plan,
)
from vllm_worker.diagnosis import parse_human_int
from vllm_worker.engine_capacity import (
    CapacityReport,
    EngineCapacity,
    capacity_report,
    compared_terms,
    parse_cache_config_metric,
    parse_engine_capacity,
)
from vllm_worker.kv_cache import (
    CPU_BLOCK_SIZE,
    CPU_MLA_BLOCK_SIZE,
    GPU_BLOCK_SIZE,
    GPU_MLA_BLOCK_SIZE,
    KV_DTYPE_BYTES,
    KVGroup,
    KVLayout,
    blocks_per_request,
    default_block_size,
    kv_bytes_per_token,
    kv_bytes_per_token_per_layer,
    kv_capacity,
    kv_dtype_bytes,
    kv_heads_per_rank,
    kv_layout,
    logged_tokens,
    longest_fitting_len,
    model_dtype_bytes,
)
from vllm_worker.memory_budget import (
    CUDA_CONTEXT_BYTES,
    DEFAULT_CAPTURE_CEILING,
    EAGER_MAX_BATCHED_TOKENS,
    HIGHEST_ADVISED_UTILIZATION,
    VERDICT_TEXT,
    Change,
    Plan,
    activation_bytes,
    capture_sizes,
    compile_bytes,
    cudagraph_bytes,
    forward_bytes_per_token,
    in_flight_tokens,
    non_torch_bytes,
    plan,
    resolved_batch,
    sampler_bytes,
    weights_bytes,
)
from vllm_worker.model_facts import (
    DTYPE_BITS,
    FLOAT_DTYPES,
    MLA_MODEL_TYPES,
    TORCH_DTYPE_BYTES,
    CapacityError,
    GiB,
    MiB,
    ModelFacts,
    derive_max_context,
    estimate_params,
    facts_from_cache,
    facts_from_config,
    facts_from_folder,
    facts_from_hub,
    safetensors_counts,
    safetensors_header,
)
from vllm_worker.plan_report import CLI_DEFAULT_GPU_BYTES, context_text, plan_cli, render_table, summary_line
from vllm_worker.plan_settings import DEFAULT_UTILIZATION, Knobs, cpu_has_amx, effective_env, knobs_from_env, parse_size

__all__ = [
    "CLI_DEFAULT_GPU_BYTES", "CPU_BLOCK_SIZE", "CPU_MLA_BLOCK_SIZE", "CUDA_CONTEXT_BYTES", "DEFAULT_CAPTURE_CEILING",
    "DEFAULT_UTILIZATION", "DTYPE_BITS", "EAGER_MAX_BATCHED_TOKENS", "FLOAT_DTYPES", "GPU_BLOCK_SIZE",
    "GPU_MLA_BLOCK_SIZE", "HIGHEST_ADVISED_UTILIZATION", "KV_DTYPE_BYTES", "MLA_MODEL_TYPES", "TORCH_DTYPE_BYTES",
    "VERDICT_TEXT", "VLLM_032", "Budgeting", "CapacityError", "CapacityReport", "Change", "EngineCapacity",
    "FitDecision", "GiB", "KVGroup", "KVLayout", "Knobs", "MiB", "ModelFacts", "Plan", "StartupPlan",
    "activation_bytes", "blocks_per_request", "budgeting_for", "cannot_fit_message", "capacity_report",
    "capture_sizes", "compared_terms", "cpu_has_amx", "compile_bytes", "context_text", "cudagraph_bytes", "default_block_size",
    "derive_max_context", "effective_env", "estimate_params", "facts_from_cache", "facts_from_config",
    "facts_from_folder", "facts_from_hub", "fit_profile", "forward_bytes_per_token", "in_flight_tokens",
    "knobs_from_env", "kv_bytes_per_token", "kv_bytes_per_token_per_layer", "kv_capacity", "kv_dtype_bytes",
    "kv_heads_per_rank", "kv_layout", "logged_tokens", "longest_fitting_len", "model_dtype_bytes",
    "non_torch_bytes", "parse_cache_config_metric", "parse_engine_capacity", "parse_human_int", "parse_size",
    "plan", "plan_cli", "render_table", "resolved_batch", "safetensors_counts", "safetensors_header",
    "sampler_bytes", "startup_plan", "summary_line", "weights_bytes",
]

if __name__ == "__main__":  # pragma: no cover
    import sys

    raise SystemExit(plan_cli(sys.argv[1:]))
