"""vLLM 0.32's GPU memory budget, term by term, and the plan built on it: `plan()` -> `Plan`.

On a GPU, vLLM sizes the KV cache from what it measures at startup
(v1/worker/gpu_worker.py `determine_available_memory`):

    requested = ceil(total x GPU_MEMORY_UTILIZATION)            (v1/worker/utils.py request_memory)
    KV cache  = requested - consumed - transient peak - CUDA-graph estimate

where `consumed` is the weights plus what stays allocated after the profiling pass
(utils/mem_utils.py `memory_profiling`). The plan predicts each term from the model's
facts and the settings, with the figures `budget_versions` fitted on real boots, and
turns the KV memory into tokens with the exact rules of `kv_cache`. Its stated error
(`margin_bytes`) is the calibrated one: the plan states the longest context that fits
at the conservative end of that band, and calls a request inside the band too close
to call. docs/capacity.md has each term, its source lines and its measured error.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from vllm_worker.capacity.budget_versions import VLLM_032, Budgeting
from vllm_worker.capacity.gpus import CARDS
from vllm_worker.capacity.kv_cache import (
    blocks_per_request,
    kv_capacity,
    kv_dtype_bytes,
    kv_layout,
    logged_tokens,
    longest_fitting_len,
    model_dtype_bytes,
)
from vllm_worker.capacity.model_facts import DTYPE_BITS, FLOAT_DTYPES, CapacityError, GiB, MiB, ModelFacts, estimate_params
from vllm_worker.capacity.plan_settings import Knobs
from vllm_worker.config.settings import multiple_of_8_at_least

HIGHEST_ADVISED_UTILIZATION = 0.95  # the most the worker advises (startup_errors)
EAGER_MAX_BATCHED_TOKENS = 8192  # recovery's eager step caps MAX_NUM_BATCHED_TOKENS here
DEFAULT_CAPTURE_CEILING = 512  # config/vllm.py: max_cudagraph_capture_size default (1024 on B200/B300)
# CUDA context and driver state (NCCL's buffers too, with tensor parallelism: gpu_worker.py
# init_device sets them up before its baseline snapshot) are outside the budget, but vLLM
# refuses to start when free memory < requested (request_memory).
CUDA_CONTEXT_BYTES = 512 * MiB
CUDA_CONTEXT_ERROR = 256 * MiB  # the context takes 0.3-0.7 GiB depending on card and driver
# Driver memory per captured CUDA graph and decoder layer, on top of the first capture's
# activations: 0.28-0.38 GiB estimated for 86 graphs of 24-28 layers (dev boots 006 007 017 034).
GRAPH_BYTES_PER_LAYER_GRAPH = 138_000
COLD_COMPILE_MEASURED_SHAPE = 28 * 3584  # layers x hidden of the largest model the cost was measured on
COLD_COMPILE_MEASURED_TOKENS = 2048  # the batch it was measured at
# The stated error: every dev boot's KV memory lies within it (docs/capacity.md, "Error band").
ERROR_FIXED = 128 * MiB
ERROR_TERMS = 0.10  # of non-torch + activations + CUDA graphs + cold compile
ERROR_WEIGHTS = 0.01  # weights from safetensors counts (vLLM's rotary caches, padding, load buffers)
ERROR_WEIGHTS_FROM_CONFIG = 0.10
# The least context the worker launches a fitted or advised configuration with: a worker decision.
MIN_USEFUL_CONTEXT = 4096


def budgeting(knobs: Knobs) -> Budgeting:
    return knobs.budgeting or VLLM_032


# =====================================================================================
# The terms
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


def forward_bytes_per_token(facts: ModelFacts, knobs: Knobs) -> float:
    """The largest activation one layer holds per token, on one GPU (the profile run's forward pass).

    Dense MLP: gate_up (2 x intermediate) and SiluAndMul's output (intermediate), plus the
    residual stream and its normed copies (4 x hidden). MoE (fused_moe's three caches):
    top_k x (3 x moe_intermediate + hidden) plus the router's float32 logits. Attention:
    q, k and v, plus the same hidden terms. Boots 018 and 034 measure 3 x intermediate +
    4 x hidden per token within 5%.
    """
    b = model_dtype_bytes(facts, knobs.dtype)
    tp = max(1, knobs.tensor_parallel_size)
    h = facts.hidden_size
    head = facts.head_dim if not facts.mla else h // max(1, facts.num_attention_heads)
    attention = (facts.num_attention_heads + 2 * facts.num_kv_heads) * head / tp + 4 * h
    mlp = 3 * facts.intermediate_size / tp + 4 * h
    if facts.num_experts:
        routed = facts.experts_per_token * (3 * facts.moe_intermediate_size / tp + h)
        shared = 3 * facts.shared_intermediate_size / tp
        mlp = max(routed, shared) + 4 * h + facts.num_experts * 4 / b
    return max(attention, mlp) * b


def sampler_bytes(facts: ModelFacts, knobs: Knobs, seqs: int, tokens: int) -> int:
    """The sampler warm-up's peak: min(MAX_NUM_SEQS, MAX_NUM_BATCHED_TOKENS) rows of the full vocabulary."""
    rows = min(seqs, tokens)
    return int(rows * facts.vocab_size * budgeting(knobs).sampler_bytes_per_logit)


def activation_bytes(facts: ModelFacts, knobs: Knobs, seqs: int, tokens: int) -> int:
    """The profile run's transient peak (gpu_model_runner.py profile_run): the forward pass over
    MAX_NUM_BATCHED_TOKENS tokens, or the sampler warm-up with the hidden states still held."""
    forward = tokens * forward_bytes_per_token(facts, knobs)
    held = tokens * facts.hidden_size * model_dtype_bytes(facts, knobs.dtype)
    return int(max(forward, held + sampler_bytes(facts, knobs, seqs, tokens)))


def cudagraph_bytes(facts: ModelFacts, knobs: Knobs, seqs: int, tokens: int) -> tuple[int, int]:
    """(CUDA-graph estimate subtracted from the budget, graphs captured); 0 when eager or not subtracted.

    gpu/cudagraph_utils.py profile_cudagraph_memory captures every PIECEWISE size and
    extrapolates the FULL ones (FULL_AND_PIECEWISE: a FULL graph per size up to
    MAX_NUM_SEQS). Estimate = the largest size's activations + a fixed cost per graph and
    layer (GRAPH_BYTES_PER_LAYER_GRAPH).
    """
    if knobs.enforce_eager or knobs.platform == "cpu":
        return 0, 0
    sizes = capture_sizes(seqs, tokens)
    graphs = len(sizes) + len([s for s in sizes if s <= seqs])
    if not sizes or not knobs.estimate_cudagraphs or not budgeting(knobs).graphs_in_budget:
        return 0, graphs
    layers = math.ceil(facts.num_layers / max(1, knobs.pipeline_parallel_size))
    first = max(sizes) * forward_bytes_per_token(facts, knobs)
    return int(first + GRAPH_BYTES_PER_LAYER_GRAPH * layers * graphs), graphs


def compile_bytes(facts: ModelFacts, knobs: Knobs, tokens: int) -> int:
    """What a cold torch.compile cache adds during profiling (budget_versions: V2 runner, graphs on).

    Measured on two models up to 28 layers x 3584 hidden, at 2048 batched tokens, on 0.29;
    larger shapes and batches are held at those sizes rather than extrapolated, so the
    term is at most factor x 28 x 3584 x 2048 x 2 bytes: 1.7 GiB for 0.21-0.31 (4.5),
    0.7 GiB for 0.32 (1.9, its transient share: see budget_versions).
    """
    if knobs.enforce_eager or knobs.platform == "cpu":
        return 0
    layers = math.ceil(facts.num_layers / max(1, knobs.pipeline_parallel_size))
    shape = min(layers * facts.hidden_size, COLD_COMPILE_MEASURED_SHAPE)
    per = budgeting(knobs).cold_compile_factor
    batch = min(tokens, COLD_COMPILE_MEASURED_TOKENS)
    return int(per * shape * batch * model_dtype_bytes(facts, knobs.dtype))


def non_torch_bytes(knobs: Knobs) -> int:
    """What stays allocated after profiling besides weights (non-torch and persistent buffers)."""
    return budgeting(knobs).non_torch_bytes if knobs.platform != "cpu" else 0


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


VERDICT_TEXT = {"fits": "fits", "too_close_to_call": "too close to call", "does_not_fit": "does not fit"}


@dataclass(frozen=True)
class Plan:
    """A predicted vLLM start: the budget, the KV cache, and whether one full-length request fits.

    Sizes are per GPU. `kv_cache_tokens` and `max_concurrency` are the figures vLLM logs
    in "KV cache size: N tokens, Maximum concurrency for L tokens per request: Cx".
    `longest_context` is the plan's one answer to "how long a context fits": the
    conservative end of its error band (`max_model_len_low`..`max_model_len_high`).
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
    compile_bytes: int  # a cold torch.compile cache's cost (see compile_cache)
    compile_persistent_bytes: int  # ... the part of it still counted as consumed after profiling
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
    max_model_len_fits: int  # the longest context at the predicted KV memory (vLLM's own estimate)
    max_model_len_low: int  # ... at the KV memory less the margin: the context the plan states
    max_model_len_high: int  # ... at the KV memory plus the margin
    max_concurrency: float  # at max_model_len
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_cache_dtype: str
    enforce_eager: bool
    tensor_parallel_size: int
    needed_bytes: int  # KV bytes one request at max_model_len needs, the null block included
    surplus_bytes: int  # kv_cache_bytes - needed_bytes (negative: does not fit)
    margin_bytes: int  # the stated error of kv_cache_bytes
    budget_version: str = VLLM_032.version
    compile_cache: str = "unknown"  # "cold": compile_bytes is in the budget; "unknown": at the conservative end only; "none"
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    changes: tuple[Change, ...] = ()

    @property
    def conservative_margin_bytes(self) -> int:
        """The band's low side: the error, plus a cold compile when the cache's state is unknown."""
        return self.margin_bytes + (self.compile_bytes if self.compile_cache == "unknown" else 0)

    @property
    def fits(self) -> bool:
        return not self.problems and self.surplus_bytes >= self.conservative_margin_bytes

    @property
    def verdict(self) -> str:
        """'fits', 'too_close_to_call' (the request is inside the error band) or 'does_not_fit'."""
        if self.problems:
            return "does_not_fit"
        if self.surplus_bytes >= self.conservative_margin_bytes:
            return "fits"
        if self.surplus_bytes < -self.margin_bytes:
            return "does_not_fit"
        return "too_close_to_call"

    @property
    def longest_context(self) -> int:
        return self.max_model_len_low

    @property
    def longest_context_basis(self) -> str:
        """Which end of the band `longest_context` is, in words (`plan` prints it beside the figure)."""
        if self.max_model_len_high == self.max_model_len_low:
            return "exact: the KV cache size is set"
        if self.compile_cache == "unknown":
            return "the conservative end of the error band, a first boot's torch.compile counted"
        return "the conservative end of the error band"

    @property
    def smallest_change(self) -> Change | None:
        return self.changes[0] if self.changes else None

    def to_json(self) -> dict[str, Any]:
        """One JSON object: `max_model_len` is the longest context the plan states, `context_len` the one planned."""
        data = asdict(self)
        data["context_len"] = self.max_model_len
        data["max_model_len"] = self.longest_context
        data["max_model_len_basis"] = self.longest_context_basis
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


def margin(weights: int, other_terms: int, *, weights_from_config: bool) -> int:
    """The stated error of a predicted KV memory (ERROR_* above)."""
    weight_error = ERROR_WEIGHTS_FROM_CONFIG if weights_from_config else ERROR_WEIGHTS
    return int(ERROR_FIXED + ERROR_TERMS * other_terms + weight_error * weights)


def plan(
    facts: ModelFacts,
    device_total_bytes: int | None,
    knobs: Knobs,
    *,
    with_changes: bool = True,
    max_concurrency: int | None = None,
    weights_bytes_per_gpu: int | None = None,
) -> Plan:
    """Predict vLLM's start for `knobs` on a GPU of `device_total_bytes` (per GPU).

    Without a device total the KV memory must be explicit (KV_CACHE_MEMORY_BYTES), as on
    the CPU engine; the KV figures are then exact. `weights_bytes_per_gpu` replaces the
    weights estimate with a known figure (what the engine logged as "Model loading took").
    """
    layout = kv_layout(facts, knobs)
    rules = budgeting(knobs)
    gpus = knobs.tensor_parallel_size * knobs.pipeline_parallel_size
    max_len, auto, len_notes = _resolved_max_len(facts, knobs)
    problems: list[str] = []
    seqs, tokens = resolved_batch(facts, knobs, device_total_bytes, max_len)
    in_flight = in_flight_tokens(knobs, tokens)
    weights_total, weights_source = weights_bytes(facts, knobs)
    weights_gpu = max(0, int(weights_total / gpus) - knobs.cpu_offload_bytes)
    if weights_bytes_per_gpu is not None:
        weights_gpu, weights_total, weights_source = weights_bytes_per_gpu, weights_bytes_per_gpu * gpus, "as logged"
    notes = list(facts.notes) + len_notes
    if knobs.pipeline_parallel_size > 1:
        notes.append("pipeline parallelism is approximated (layers and weights split evenly)")
    if layout.note:
        notes.append(layout.note)
    requested: int | None = None
    non_torch = activation = graphs_bytes = graphs = cold = 0
    exact = knobs.kv_cache_memory_bytes is not None
    if knobs.platform == "cuda" and device_total_bytes is not None:
        non_torch = non_torch_bytes(knobs)
        activation = activation_bytes(facts, knobs, seqs, tokens)
        graphs_bytes, graphs = cudagraph_bytes(facts, knobs, seqs, tokens)
        cold = compile_bytes(facts, knobs, tokens)
    if knobs.compile_cache == "warm":
        cold = 0
    counted = cold if knobs.compile_cache == "cold" else 0
    # An explicit KV size is exact whatever the compile costs; it only has to fit the card.
    allowance = cold if knobs.compile_cache == "unknown" and not exact else 0
    other_terms = non_torch + activation + graphs_bytes + counted
    from_config = facts.params_source == "none" and weights_bytes_per_gpu is None
    if knobs.kv_cache_memory_bytes is not None:
        available = knobs.kv_cache_memory_bytes
        if knobs.platform == "cuda" and device_total_bytes is not None:
            # vLLM skips its memory check for an explicit size; the card must still hold it all.
            total_need = weights_gpu + other_terms + available
            slack = margin(weights_gpu, other_terms, weights_from_config=from_config)
            if total_need > device_total_bytes - CUDA_CONTEXT_BYTES + slack:
                problems.append(
                    f"KV_CACHE_MEMORY_BYTES={available} plus the weights ({fmt_gib(weights_gpu)} GiB) and activations "
                    f"need {fmt_gib(total_need)} GiB, more than the {fmt_gib(device_total_bytes)} GiB GPU holds"
                )
    elif device_total_bytes is None:
        raise CapacityError("the plan needs the GPU memory (or KV_CACHE_MEMORY_BYTES) to size the KV cache")
    elif knobs.platform == "cpu":
        raise CapacityError("on the CPU engine the plan needs KV_CACHE_MEMORY_BYTES (vLLM sizes it from the process's RSS otherwise)")
    else:
        requested = math.ceil(device_total_bytes * knobs.utilization)
        available = requested - weights_gpu - other_terms
        if requested > device_total_bytes - CUDA_CONTEXT_BYTES + CUDA_CONTEXT_ERROR:
            problems.append(
                f"GPU_MEMORY_UTILIZATION={knobs.utilization:g} asks for {fmt_gib(requested)} GiB, more than a "
                f"{fmt_gib(device_total_bytes)} GiB GPU has free once CUDA is initialised"
            )
    if knobs.num_gpu_blocks_override:
        available = knobs.num_gpu_blocks_override * layout.bytes_per_block
    if from_config and not exact:
        notes.append("the checkpoint's parameter counts are unknown: weights estimated from config.json")
    error = 0 if exact else margin(weights_gpu, other_terms + allowance, weights_from_config=from_config)
    num_blocks = max(0, available // layout.bytes_per_block) if available > 0 else 0
    model_max = facts.max_context

    def longest(memory: int) -> int:
        return min(model_max, longest_fitting_len(layout, max(0, memory), model_max, in_flight))

    fits_len, low, high = longest(available), longest(available - error - allowance), longest(available + error)
    # One request at max_model_len, plus the null block BlockPool holds back.
    needed = layout.bytes_per_block * (blocks_per_request(layout, max_len, in_flight) + 1)
    if auto:
        # vLLM fits the context to the memory it measures: what must fit is one block.
        max_len = max(1, min(max_len, fits_len))
        needed = layout.bytes_per_block * (blocks_per_request(layout, 1, in_flight) + 1)
    tokens_reported = logged_tokens(num_blocks, layout, max_len, in_flight, capacity_formula=rules.reports_capacity)
    concurrency = kv_capacity(num_blocks, layout, max_len, in_flight)[1]
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
        compile_bytes=cold,
        compile_persistent_bytes=int(cold * rules.compile_persistent_share),
        graphs=graphs,
        kv_cache_bytes=int(available),
        kv_exact=exact,
        kv_bytes_per_token=layout.per_token_bytes,
        block_size=layout.block_size,
        bytes_per_block=layout.bytes_per_block,
        num_blocks=num_blocks,
        kv_cache_tokens=tokens_reported,
        model_max_len=model_max,
        max_model_len=max_len,
        max_model_len_fits=fits_len,
        max_model_len_low=low,
        max_model_len_high=high,
        max_concurrency=concurrency,
        max_num_seqs=seqs,
        max_num_batched_tokens=tokens,
        kv_cache_dtype=knobs.kv_cache_dtype,
        enforce_eager=knobs.enforce_eager,
        tensor_parallel_size=knobs.tensor_parallel_size,
        needed_bytes=needed,
        surplus_bytes=int(available - needed),
        margin_bytes=error,
        budget_version=rules.version,
        compile_cache=knobs.compile_cache if cold and not (exact and knobs.compile_cache == "unknown") else "none",
        problems=tuple(problems),
        notes=tuple(notes),
    )
    if with_changes and result.verdict != "fits":
        changes = _changes(facts, device_total_bytes, knobs, result, max_concurrency, weights_bytes_per_gpu)
        result = replace(result, changes=tuple(changes))
    return result


def _changes(
    facts: ModelFacts,
    total: int | None,
    knobs: Knobs,
    base: Plan,
    max_concurrency: int | None,
    weights_bytes_per_gpu: int | None,
) -> list[Change]:
    """Single setting changes that make `base` fit with its margin, least costly first."""
    found: list[Change] = []

    def fits(candidate: Knobs, device: int | None = total) -> Plan | None:
        try:
            p = plan(facts, device, candidate, with_changes=False, weights_bytes_per_gpu=weights_bytes_per_gpu)
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
        longest = min(base.max_model_len, base.longest_context)
        if longest >= 256:
            found.append(Change("MAX_MODEL_LEN", str(longest), "--max-model-len",
                                f"the longest context that fits; now {base.max_model_len}"))
    if gpu:
        for tp in (2, 4, 8):
            if tp > knobs.tensor_parallel_size and fits(replace(knobs, tensor_parallel_size=tp)):
                found.append(Change("TENSOR_PARALLEL_SIZE", str(tp), "--tensor-parallel-size",
                                    f"on {tp} GPUs of this size"))
                break
        for card in sorted(CARDS, key=lambda c: c.total_bytes):
            if card.total_bytes > (total or 0) and fits(knobs, card.total_bytes):
                found.append(Change("GPU", card.name, "--gpu", f"{fmt_gib(card.total_bytes)} GiB or more"))
                break
    return found


def fmt_gib(value: float | int | None) -> str:
    if value is None:
        return "?"
    return f"{value / GiB:.1f}"


def fmt_tokens(n: int) -> str:
    return f"{n:,}"
