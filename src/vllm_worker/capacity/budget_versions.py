"""How a vLLM version budgets a GPU where it differs from 0.32: `Budgeting`.

The worker launches vLLM 0.32 and plans 0.32's budget (`VLLM_032`). The plan is checked
against public startup logs of vLLM 0.8 to 0.30 (tests/field/boots), which subtract a few
things differently; a `Budgeting` names those differences, so one plan function predicts
every boot from that boot's own configuration and each term meets the versions that log
it. The fitted figures come from the calibration's dev boots only; docs/capacity.md gives
each one's source lines, its fit and its error on the held-out boots.

The differences, by era:

- CUDA-graph memory is subtracted from the KV budget from 0.21 on
  (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS defaults to 1; 0.19 estimated it but only
  applied it on request). Before, graphs were captured after the KV cache was sized.
- The model runner: 0.21+ runs the V2 runner on GPUs (v1/worker/gpu/model_runner.py).
  Its profiling sampler samples straight from the logits (no top-k/top-p, sampler.py
  `apply_sampling_params` returns early); the V1 runner's `_dummy_sampler_run` ran the
  full top-k/top-p path over `min(MAX_NUM_SEQS, MAX_NUM_BATCHED_TOKENS)` rows, through
  PyTorch's sort (about 40 bytes per logit at its peak) or, where the log says "Using
  FlashInfer for top-p & top-k sampling.", FlashInfer's kernel (about 13.5). From 0.17
  the V1 warm-up costs about 16.5 bytes per logit.
- What stays allocated after profiling besides the weights: a few tens of MiB on V1,
  about 0.5 GiB on V2 (its persistent input, sampler and attention buffers).
- A cold torch.compile cache (a first boot: "Compiling a graph for compile range")
  leaves about 4.5 x layers x hidden x batched tokens x dtype bytes more in use during
  V2 profiling than a warm one ("Directly load AOT compilation") on 0.29 (the pair 007
  and 043: same host, model and flags); 57 % of it stays counted as consumed after
  profiling, the rest is the transient peak. No V1 boot shows it. 0.32 profiles under
  a 20 MiB allocator split limit (gpu_worker.py determine_available_memory,
  `_scoped_allocator_max_split`), so a freed compile block is no longer pinned past
  the profiler's empty_cache() and counted as consumed: 0.32 keeps the transient
  part only (4.5 x 0.43 = 1.9).
- The token count logged: 0.21+ logs int(concurrency x max_model_len)
  (kv_cache_utils.py get_kv_cache_capacity); earlier versions num_blocks // groups x
  block_size. They differ only for sliding-window layers and lengths that are not a
  multiple of the block.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

MiB = 1 << 20


@dataclass(frozen=True)
class Budgeting:
    """The version-specific parts of the memory budget (see the module docstring)."""

    version: str
    runner: str  # "v2" or "v1"
    graphs_in_budget: bool
    sampler_bytes_per_logit: float
    non_torch_bytes: int
    cold_compile_factor: float
    # Of a cold compile's extra memory, the part still counted as consumed after profiling.
    compile_persistent_share: float
    reports_capacity: bool  # tokens logged as int(concurrency x max_model_len), else blocks // groups x block


# 0.21-0.31: the compile's extra memory in full, 57 % of it consumed after profiling (boot 007 cold
# against 043, the same configuration warm, 1.74 GiB of KV apart; 006 and 007 against 017, 018, 034).
_V2_COLD_COMPILE_FACTOR = 4.5
_V2_COMPILE_PERSISTENT_SHARE = 0.57
# The first release whose profiling runs under the allocator split limit: the one whose source was
# read (0.30 and 0.31 were not, and no public cold boot of them was found).
_SPLIT_LIMITED_PROFILING = (0, 32)

# vLLM 0.32, what the worker runs. The V2-runner figures were measured on 0.22-0.30 boots.
VLLM_032 = Budgeting(
    version="0.32",
    runner="v2",
    graphs_in_budget=True,
    sampler_bytes_per_logit=4.0,  # float32 logits, then gumbel sampling in place (sample/gumbel.py)
    non_torch_bytes=512 * MiB,  # boots 017 and 034: consumed - weights, warm cache
    # The 0.29 factor's transient share (boot 007 against 043); 0.32's split limit frees the rest.
    cold_compile_factor=round(_V2_COLD_COMPILE_FACTOR * (1 - _V2_COMPILE_PERSISTENT_SHARE), 1),
    compile_persistent_share=0.0,
    reports_capacity=True,
)


_V1_TORCH_SAMPLER = 39.5  # bytes per logit, 0.9-0.16 (dev boots 004 013 015 016 019 023 024 027 029 041)
_V1_FLASHINFER_SAMPLER = 13.5  # bytes per logit with FlashInfer's top-k/top-p (dev boots 002 005)
_V1_017_SAMPLER = 16.5  # bytes per logit, 0.17-0.20 (dev boot 022)
_V1_NON_TORCH = 64 * MiB  # 0.10.2 logs "0.02 GiB for non-torch memory" (boots 014, 020), plus load-time buffers


def _version_tuple(version: str) -> tuple[int, int]:
    m = re.match(r"\s*v?(\d+)\.(\d+)", version)
    if not m:
        raise ValueError(f"{version!r} is not a vLLM version")
    return int(m.group(1)), int(m.group(2))


def budgeting_for(version: str, *, flashinfer_sampler: bool = False) -> Budgeting:
    """The budget rules of vLLM `version` ('0.10.1.1', '0.29.0', ...).

    `flashinfer_sampler`: the V1 log says "Using FlashInfer for top-p & top-k sampling."
    (it only changes V1's sampler warm-up).
    """
    major_minor = _version_tuple(version)
    if major_minor >= _SPLIT_LIMITED_PROFILING:
        return replace(VLLM_032, version=version)
    if major_minor >= (0, 21):
        return replace(VLLM_032, version=version, cold_compile_factor=_V2_COLD_COMPILE_FACTOR,
                       compile_persistent_share=_V2_COMPILE_PERSISTENT_SHARE)
    if major_minor >= (0, 17):
        sampler = _V1_017_SAMPLER
    else:
        sampler = _V1_FLASHINFER_SAMPLER if flashinfer_sampler else _V1_TORCH_SAMPLER
    return Budgeting(
        version=version,
        runner="v1",
        graphs_in_budget=False,
        sampler_bytes_per_logit=sampler,
        non_torch_bytes=_V1_NON_TORCH,
        cold_compile_factor=0.0,
        compile_persistent_share=0.0,
        reports_capacity=False,
    )
