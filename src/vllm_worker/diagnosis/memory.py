"""The messages for a start that failed for memory: sizing, memory held by others, a profiling race.

A memory shortfall has many faces (the KV cache cannot hold one sequence, no room for it at
all, an out-of-memory while loading weights, warming up the sampler or capturing graphs, the
CPU backend's own checks), and the fix that remains depends on which and on what the worker
already relaunched with, so each is answered with its own figures and only the knobs left.
"""

from __future__ import annotations

import re

from vllm_worker.config.profile import (
    CPU_KV_SPACE,
    EXTRA_ARGS_NAME,
    KvCacheSize,
    LaunchProfile,
)
from vllm_worker.diagnosis.verdict import (
    EAGER_MAX_BATCHED_TOKENS,
    HIGHEST_ADVISED_UTILIZATION,
    Context,
    Diagnosis,
    answer,
    changed,
    device_of,
    gib,
    size_text,
)

# --- memory shortfall -------------------------------------------------------------

_DETAIL_PRIORITY = (
    "kv_too_small",
    "auto_fit",
    "no_kv_memory",
    "sampler_warmup",
    "weights_load",
    "cpu_kv_explicit",
    "cpu_kv_no_room",
    "cpu_out_of_memory",
    "out_of_memory",
)


def _knob_fixes(ctx: Context, observed_seqs: int | None = None) -> list[str]:
    """The relaunch knobs (see `engine.ladder`) that are still left to turn."""
    fixes: list[str] = []
    knobs = ctx.profile
    max_concurrency = knobs.max_concurrency
    target = LaunchProfile.default_max_num_seqs(max_concurrency)
    seqs = knobs.effective_max_num_seqs()
    if observed_seqs is not None and knobs.max_num_seqs is None:
        seqs = observed_seqs
    if seqs > target and not changed(ctx.tried, "MAX_NUM_SEQS"):
        fixes.append(f"set MAX_NUM_SEQS={target} (now {seqs}; MAX_CONCURRENCY={max_concurrency} needs no more)")
    if knobs.enforce_eager is not True and not changed(ctx.tried, "ENFORCE_EAGER"):
        fixes.append("set ENFORCE_EAGER=true (no CUDA graphs: less memory, slower replies)")
    # Only a value above the cap: unset, vLLM's own default is 2048 on most cards, and 8192 would raise it.
    tokens = knobs.max_num_batched_tokens
    if tokens is not None and tokens > EAGER_MAX_BATCHED_TOKENS and not changed(ctx.tried, "MAX_NUM_BATCHED_TOKENS"):
        fixes.append(f"lower MAX_NUM_BATCHED_TOKENS to {EAGER_MAX_BATCHED_TOKENS} (now {tokens})")
    return fixes


def _raise_utilization_fix(profile: LaunchProfile) -> list[str]:
    current = profile.utilization
    if current < HIGHEST_ADVISED_UTILIZATION:
        return [f"raise GPU_MEMORY_UTILIZATION from {current:g} to {HIGHEST_ADVISED_UTILIZATION:g}"]
    return []


def _kv_dtype_fix(profile: LaunchProfile) -> list[str]:
    if profile.kv_cache_dtype == "auto":
        return ["set KV_CACHE_DTYPE=fp8 (halves KV-cache memory; check output quality)"]
    return []


def _hardware_fix(profile: LaunchProfile, device: str) -> str:
    if device == "CPU":
        return "use a machine with more memory or a smaller or quantized checkpoint"
    tp = profile.tensor_parallel_size
    more = f"more GPUs (TENSOR_PARALLEL_SIZE is {tp})" if tp > 1 else "several GPUs with TENSOR_PARALLEL_SIZE"
    return f"use a GPU with more memory, {more}, or a smaller or quantized checkpoint"


def _context_description(ctx: Context, model_len: str | None) -> str:
    explicit = ctx.profile.written("MAX_MODEL_LEN")
    if explicit is not None and explicit not in ("0", "-1") and explicit.lower() != "auto":
        return f"MAX_MODEL_LEN={explicit}"
    if model_len:
        return f"the model's full context of {model_len} tokens (MAX_MODEL_LEN is not set)"
    return "the model's full context (MAX_MODEL_LEN is not set)"


def _gib_known(text: str) -> bool:
    """vLLM rounds GiB to 2 decimals: below 0.005 GiB it prints 0.0, which says nothing."""
    return float(text) > 0


# The weights are in memory once vLLM says so (V1 "Model loading took", V0 "Loading model weights took").
_LOADED = re.compile(r"Model loading took|Loading (?:model )?weights took", re.IGNORECASE)
# Frames and lines of loading the weights, and of what only runs after it (profiling, graphs, KV cache).
_LOADING = re.compile(
    r"Starting to load model|Loading (?:safetensors|pt) checkpoint shards|in load_model\b|in load_weights\b"
    r"|model_loader|in initialize_model\b|in _initialize_model\b|weight_loader|in load_weights_and",
    re.IGNORECASE,
)
_AFTER_LOADING = re.compile(
    r"profile_run|_dummy_run|_dummy_sampler_run|capture_model|determine_available_memory|initialize_kv_cache"
    r"|_initialize_kv_caches|determine_num_available_blocks|warming up|Graph capturing|KV cache",
    re.IGNORECASE,
)
# torch's allocator names the card's size: "has a total capacity of 23.53 GiB" (2.x), "23.69 GiB total capacity" (1.x).
_CARD_TOTAL = r"total capacity of ([\d.]+ [KMG]iB)|([\d.]+ [KMG]iB) total capacity"
_LOOKBACK_LINES = 120


def _oom_while_loading(ctx: Context, index: int) -> bool:
    """Whether the out-of-memory came before the weights were loaded: no graph or batch knob can help then."""
    before = ctx.lines[max(0, index - _LOOKBACK_LINES) : index + 1]
    if any(_LOADED.search(line) for line in ctx.lines[: index + 1]):
        return False
    if any(_AFTER_LOADING.search(line) for line in before):
        return False
    return any(_LOADING.search(line) for line in before)


def _weights_exceed_card(ctx: Context) -> bool:
    """The capacity plan's weights are larger than the card torch reports: only a smaller checkpoint fits."""
    m = ctx.search(_CARD_TOTAL)
    if ctx.weights_bytes is None or not m:
        return False
    text = m.group(1) or m.group(2)
    number, unit = text.split()
    total = float(number) * {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[unit]
    return ctx.weights_bytes >= total


def memory_shortfall_diagnosis(ctx: Context) -> Diagnosis:
    details = {hit.rule.detail for hit in ctx.hits}
    detail = next(d for d in _DETAIL_PRIORITY if d in details)
    hit = next(h for h in reversed(ctx.hits) if h.rule.detail == detail)
    if detail == "out_of_memory" and (_oom_while_loading(ctx, hit.index) or _weights_exceed_card(ctx)):
        detail = "weights_load"
    device = device_of(ctx)
    subject = ctx.subject
    facts: dict[str, str] = {"device": device}
    estimate: int | None = None
    fixes: list[str] = []
    hardware = True
    variable: str | None = "MODEL_NAME" if ctx.model else None
    value: str | None = ctx.model
    kv = ctx.profile.kv_cache_for(cpu=device == "CPU")
    if kv is None and device == "CPU" and ctx.search(r"Explicitly set \([\d.]+/[\d.]+\) GiB for KV cache"):
        kv = KvCacheSize(f"KV_CACHE_MEMORY_BYTES or {CPU_KV_SPACE}", None, None)
    if kv is not None:
        facts["kv_cache_variable"] = kv.variable
    kv_size = f" ({size_text(kv.size_bytes)})" if kv is not None and kv.size_bytes is not None else ""

    if detail == "kv_too_small":
        m = ctx.search(
            r"max seq len \((\d+)\), \(([\d.]+) GiB KV cache is needed, which is larger than the available "
            r"KV cache memory \(([\d.]+) GiB\)"
        )
        e = ctx.search(r"the estimated maximum model length is (\d+)")
        estimate = int(e.group(1)) if e and int(e.group(1)) > 0 else None
        model_len = m.group(1) if m else None
        where = _context_description(ctx, model_len)
        numbers = m is not None and _gib_known(m.group(2)) and _gib_known(m.group(3))
        if m:
            facts.update(max_model_len=m.group(1), needed_gib=m.group(2), available_gib=m.group(3))
        if kv is not None:
            # The size is the user's: memory, batch and graphs do not change it.
            need = (
                f"{gib(m.group(2))} GiB of KV cache, more than the {gib(m.group(3))} GiB it provides"
                if m and numbers
                else "more KV cache than that"
            )
            cause = (
                f"{subject} does not fit in the {device} KV cache set by {kv.setting}{kv_size} at {where}: "
                f"one full-length sequence needs {need}"
            )
            fixes.append(f"{kv.raise_fix} until a full-length sequence fits, or unset it so vLLM sizes the KV cache from the free memory")
            if estimate is not None:
                fixes.append(f"set MAX_MODEL_LEN <= {estimate}, about what {kv.setting} holds")
            variable, value, hardware = kv.variable, kv.value, False
        else:
            if m and numbers:
                need = (
                    f"{gib(m.group(2))} GiB of KV cache, but only {gib(m.group(3))} GiB is left after the "
                    f"weights and activations"
                )
            elif m or estimate is not None:
                need = "more KV cache than is left after the weights and activations"
            else:
                need = ""
            if need:
                cause = f"{subject} does not fit in {device} memory at {where}: one full-length sequence needs {need}"
            else:
                cause = f"{subject} does not fit in {device} memory at {where}: the KV cache cannot hold one full-length sequence"
            if estimate is not None:
                fixes.append(f"this {device} can serve about {estimate} tokens; set MAX_MODEL_LEN <= {estimate}")
        if estimate is None:
            if where.startswith("MAX_MODEL_LEN="):
                fixes.append(f"lower MAX_MODEL_LEN (now {where.split('=', 1)[1]})")
            else:
                fixes.append("set MAX_MODEL_LEN to a shorter context (or MAX_MODEL_LEN=auto to fit what the memory holds)")
        if kv is None:
            if device == "GPU":
                fixes += _knob_fixes(ctx)
            # On the CPU engine the same variable sets the share of the node's memory vLLM reserves.
            fixes += _raise_utilization_fix(ctx.profile)
        fixes += _kv_dtype_fix(ctx.profile)
    elif detail in ("no_kv_memory", "auto_fit"):
        how = " (MAX_MODEL_LEN=auto could not fit even one token)" if detail == "auto_fit" else ""
        if kv is not None:
            cause = (
                f"{subject} has no room for its KV cache{how}: the {device} KV cache size set by "
                f"{kv.setting}{kv_size} is too small to hold even one block"
            )
            fixes.append(f"{kv.raise_fix}, or unset it so vLLM sizes the KV cache from the free memory")
            variable, value, hardware = kv.variable, kv.value, False
        else:
            graphs = device == "GPU" and ctx.profile.enforce_eager is not True
            cause = (
                f"{subject} leaves no {device} memory for the KV cache{how}: the weights, activations"
                f"{' and CUDA graphs' if graphs else ''} take the whole memory budget"
            )
            if device == "GPU":
                fixes += _knob_fixes(ctx)
            fixes += _raise_utilization_fix(ctx.profile)
    elif detail == "sampler_warmup":
        m = ctx.search(r"warming up (?:sampler|pooler)(?: \(task=[^)]*\))? with (\d+) dummy requests")
        n = m.group(1) if m else str(ctx.profile.effective_max_num_seqs())
        facts["sequences"] = n
        cause = (
            f"{subject} ran out of GPU memory while warming up the sampler for {n} sequences at once "
            f"(the memory left outside the KV cache is too small for that batch)"
        )
        fixes += _knob_fixes(ctx, int(n))
        fixes.append(_room_outside_kv_fix(ctx.profile, kv))
    elif detail == "weights_load":
        m = ctx.search(r"Tried to allocate ([\d.]+ [KMG]iB)")
        card = ctx.search(_CARD_TOTAL)
        sizes = []
        if card:
            sizes.append(f"the GPU has {card.group(1) or card.group(2)} in all")
            facts["card_total"] = card.group(1) or card.group(2)
        if ctx.weights_bytes is not None:
            sizes.append(f"the weights take about {size_text(ctx.weights_bytes)} per GPU")
            facts["weights_bytes"] = str(ctx.weights_bytes)
        if m:
            sizes.append(f"{m.group(1)} more could not be allocated")
        tail = f" ({'; '.join(sizes)})" if sizes else ""
        cause = f"{subject} does not fit on this GPU: loading its weights ran out of GPU memory{tail}"
        # Graph and batch knobs act after loading: only a smaller checkpoint or more memory helps.
    elif detail == "cpu_kv_explicit":
        m = ctx.search(r"on kv cache allocation is less than requested memory for kv \(([\d.]+) GiB\)")
        a = ctx.search(r"Available memory on node \S+ \(([\d.]+)/([\d.]+) GiB\) on kv cache")
        want = f"{gib(m.group(1))} GiB" if m else "the requested size"
        free = f" only {gib(a.group(1))} GiB is available" if a else " there is not that much free memory"
        cause = f"The KV cache size set for the CPU backend ({want}) does not fit:{free}"
        if kv is not None and kv.value is not None:
            name = "--kv-cache-memory-bytes in VLLM_EXTRA_ARGS" if kv.variable == EXTRA_ARGS_NAME else kv.variable
            fixes.append(f"lower {name} (now {kv.value})")
            variable, value = kv.variable, kv.value
        else:
            fixes.append("lower VLLM_CPU_KVCACHE_SPACE or KV_CACHE_MEMORY_BYTES")
    elif detail == "cpu_kv_no_room":
        cause = f"{subject} leaves no CPU memory for the KV cache: the weights took the whole memory reservation"
        fixes += _raise_utilization_fix(ctx.profile)
    elif detail == "cpu_out_of_memory":
        m = ctx.search(r"you tried to allocate (\d+) bytes")
        tail = f" (an allocation of {int(m.group(1)) / 2**30:.1f} GiB failed)" if m else ""
        cause = f"{subject} ran out of CPU memory while starting{tail}"
        fixes += _kv_dtype_fix(ctx.profile)
    else:
        m = ctx.search(r"Tried to allocate ([\d.]+ [KMG]iB)")
        tail = f" (tried to allocate {m.group(1)} more)" if m else ""
        cause = f"{subject} ran out of GPU memory while starting{tail}"
        fixes += _knob_fixes(ctx)
        if kv is not None:
            fixes.append(_room_outside_kv_fix(ctx.profile, kv))
    if hardware:
        fixes.append(_hardware_fix(ctx.profile, device))
    return answer(ctx, "memory_shortfall", cause, fixes, line=hit.line, detail=detail, estimated_max_len=estimate,
        variable=variable, value=value, facts=facts)


def _room_outside_kv_fix(profile: LaunchProfile, kv: KvCacheSize | None) -> str:
    """More room for activations: with a fixed KV size only that size frees it, not the utilization."""
    if kv is not None:
        now = f" (now {kv.value})" if kv.value is not None else ""
        name = "--kv-cache-memory-bytes in VLLM_EXTRA_ARGS" if kv.variable == EXTRA_ARGS_NAME else kv.variable
        return f"lower {name}{now} to leave more room outside the KV cache"
    current = profile.utilization
    lower = max(0.5, round(current - 0.05, 2))
    return f"lower GPU_MEMORY_UTILIZATION from {current:g} to {lower:g} to leave more room outside the KV cache"


# --- memory held / profiling race ---------------------------------------------------


def memory_held_diagnosis(ctx: Context) -> Diagnosis:
    hit = ctx.hits[-1]
    gpu = re.search(
        r"Free memory on device (\S+) \(([\d.]+)/([\d.]+) GiB\) on startup is less than .*?\(([\d.]+), ([\d.]+) GiB\)",
        hit.line,
    )
    cpu = re.search(
        r"Available memory on node (\S+) \(([\d.]+)/([\d.]+) GiB\) on startup is less than .*?\(([\d.]+), ([\d.]+) GiB\)",
        hit.line,
    )
    m = gpu or cpu
    where = ("GPU " + m.group(1) if gpu else "NUMA node " + m.group(1)) if m else "the device"
    facts: dict[str, str] = {}
    if m:
        facts = {"device": m.group(1), "free_gib": m.group(2), "total_gib": m.group(3), "needed_gib": m.group(5)}
        numbers = (
            f": only {gib(m.group(2))} of {gib(m.group(3))} GiB was free on {where} when vLLM started, "
            f"and it needs {gib(m.group(5))} GiB"
        )
    else:
        numbers = f": {where} had less free memory than vLLM needs when it started"
    device = "machine" if cpu and not gpu else "GPU"
    cause = (
        f"Memory on this {device} is held by another process{numbers}. This is not a problem with the "
        f"model or its settings: typically a previous engine that has not exited yet, or another program "
        f"on the same {device}"
    )
    fixes = [
        f"if it persists, stop whatever else uses this {device}, or terminate this worker so the platform "
        f"starts a fresh one on another machine",
    ]
    return answer(ctx, "memory_held", cause, fixes, line=hit.line, facts=facts)


def profiling_race_diagnosis(ctx: Context) -> Diagnosis:
    hit = ctx.hits[-1]
    m = re.search(r"Initial free memory ([\d.]+) GiB, current free memory ([\d.]+) GiB", hit.line)
    numbers = f" (free memory went from {gib(m.group(1))} to {gib(m.group(2))} GiB)" if m else ""
    cause = (
        f"GPU memory changed while vLLM was measuring it during start-up{numbers}: another process on the "
        f"same GPU released memory meanwhile. This is not a problem with the model or its settings"
    )
    fixes = ["make sure nothing else runs on this GPU, or terminate this worker so the platform starts a fresh one"]
    return answer(ctx, "profiling_race", cause, fixes, line=hit.line,
        facts={"initial_free_gib": m.group(1), "current_free_gib": m.group(2)} if m else {})

