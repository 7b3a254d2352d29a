"""The settings that decide vLLM's memory budget, resolved from the worker's variables: `Knobs`.

A user configures the worker with env vars (and VLLM_EXTRA_ARGS, whose flags come last on
vLLM's command line and so win); the plan needs what vLLM will actually run with. This
module turns the one into the other and nothing else: what those settings cost is
`memory_budget`'s business.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

from vllm_worker.capacity.model_facts import CapacityError, GiB
from vllm_worker.config.profile import DEFAULT_GPU_MEMORY_UTILIZATION, LaunchProfile

if TYPE_CHECKING:
    from vllm_worker.capacity.budget_versions import Budgeting



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


_PLAN_KNOBS = (
    "GPU_MEMORY_UTILIZATION", "MAX_MODEL_LEN", "MAX_NUM_SEQS", "MAX_NUM_BATCHED_TOKENS", "KV_CACHE_MEMORY_BYTES",
    "TENSOR_PARALLEL_SIZE", "PIPELINE_PARALLEL_SIZE", "ENFORCE_EAGER", "BLOCK_SIZE", "NUM_GPU_BLOCKS_OVERRIDE",
    "DISABLE_SLIDING_WINDOW", "DISABLE_HYBRID_KV_CACHE_MANAGER", "ENABLE_CHUNKED_PREFILL", "ASYNC_SCHEDULING",
    "CPU_OFFLOAD_GB", "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", "VLLM_ALLOW_LONG_MAX_MODEL_LEN",
)


@dataclass(frozen=True)
class Knobs:
    """The settings that decide the memory budget, resolved to what vLLM 0.32 will use."""

    platform: str = "cuda"  # "cuda" or "cpu"
    utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
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
    # torch.compile's cache: "cold" (empty: a first boot), "warm" (artifacts loaded from
    # VLLM_CACHE_ROOT) or "unknown", the worker's case: memory_budget.compile_bytes is then
    # counted at the conservative end of the plan's band only.
    compile_cache: str = "unknown"
    budgeting: "Budgeting | None" = None  # None: vLLM 0.32 (budget_versions.VLLM_032)
    cpu_amx: bool = False  # CPU engine on an AMX CPU: MLA runs AMX_MLA (block 128), not the reference kernel (16)


def knobs_for(
    profile: LaunchProfile,
    *,
    worker_seqs: bool = False,
    platform: str = "cuda",
    device_name: str | None = None,
    cpu_amx: bool = False,
    compile_cache: str = "unknown",
) -> Knobs:
    """Knobs from a launch profile (VLLM_EXTRA_ARGS and vLLM's spellings already folded in).
    worker_seqs: an unset MAX_NUM_SEQS is the worker's default for the profile's MAX_CONCURRENCY, as the
    worker passes it (False: vLLM's default for the card). CapacityError names a value the plan cannot read.
    `compile_cache`: what the start will find in torch.compile's cache ("warm" when the worker's mark
    says a start of this configuration left it, engine.compile_cache)."""
    unreadable = next(((name, profile.unreadable[name]) for name in _PLAN_KNOBS if name in profile.unreadable), None)
    if unreadable is not None:
        raise CapacityError(f"{unreadable[0]}={unreadable[1]!r} cannot be read")
    seqs = profile.effective_max_num_seqs() if worker_seqs else profile.max_num_seqs
    return Knobs(
        platform=platform,
        utilization=profile.utilization,
        max_model_len=profile.context_tokens,
        max_num_seqs=seqs,
        max_num_batched_tokens=profile.max_num_batched_tokens,
        kv_cache_dtype=profile.kv_cache_dtype,
        kv_cache_memory_bytes=profile.kv_cache_memory_bytes,
        tensor_parallel_size=profile.tensor_parallel_size,
        pipeline_parallel_size=profile.pipeline_parallel_size,
        enforce_eager=profile.enforce_eager is True,
        dtype=profile.dtype,
        quantization=profile.quantization,
        block_size=profile.block_size,
        num_gpu_blocks_override=profile.num_gpu_blocks_override,
        disable_sliding_window=profile.disable_sliding_window,
        disable_hybrid_kv_cache_manager=profile.disable_hybrid_kv_cache_manager,
        chunked_prefill=profile.chunked_prefill,
        async_scheduling=profile.async_scheduling,
        cpu_offload_bytes=int(profile.cpu_offload_gb * GiB) if profile.cpu_offload_gb else 0,
        estimate_cudagraphs=profile.estimate_cudagraphs,
        allow_long_max_model_len=profile.allow_long_max_model_len,
        device_name=device_name,
        cpu_amx=cpu_amx,
        compile_cache=compile_cache,
    )


def knobs_from_env(env: Mapping[str, str], **kwargs: Any) -> Knobs:
    """`knobs_for` a mapping of variables (the plan CLI's flags, tests)."""
    return knobs_for(LaunchProfile.parse(env), **kwargs)


# =====================================================================================
# KV cache accounting (exact: mirrors vLLM 0.32's kv_cache_utils.py / kv_cache_interface.py)


def cpu_has_amx(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this x86 CPU has AMX tiles, as torch.cpu._is_amx_tile_supported() sees them
    (platforms/cpu.py then runs MLA on AMX_MLA with the CPU's default block of 128)."""
    try:
        with open(cpuinfo) as handle:
            return any(line.startswith("flags") and " amx_tile" in line for line in handle)
    except OSError:
        return False
