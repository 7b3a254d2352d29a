"""What the engine reported about its memory, against what the plan predicted (learning at boot).

Once vLLM is up, its log holds the real figures: the KV tokens and concurrency, and on
a GPU the terms of its budget ("Model loading took", "Available KV cache memory", the
"Free memory on device ... Actual usage is ..." line, the CUDA-graph estimate). The
worker keeps predicted against actual per term in the status job, and a gap of more
than `GAP_WARNING` in KV tokens becomes a warning naming the terms furthest apart, so
a user can report it and the plan can be corrected. Wordings are vLLM 0.32's
(gpu_worker.py, gpu/model_runner.py, kv_cache_utils.py); the older two-line capacity
wording is read too, since the calibration boots use it.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vllm_worker.capacity.memory_budget import Plan
from vllm_worker.capacity.model_facts import GiB
from vllm_worker.config.profile import LaunchProfile

if TYPE_CHECKING:
    from vllm_worker.capacity.first_launch import StartupPlan

log = logging.getLogger("vllm_worker")

GAP_WARNING = 0.05  # relative KV-token gap that is worth a report


@dataclass(frozen=True)
class EngineCapacity:
    """What the engine reported: KV tokens and the concurrency at its max_model_len, and, on a
    GPU, the budget's terms in bytes where the log gives them (None where it does not)."""

    kv_tokens: int
    max_concurrency: float
    max_model_len: int | None = None
    pool: str | None = None  # "GPU", "CPU", "GPU + host"
    kv_cache_bytes: int | None = None  # "Available KV cache memory"
    weights_bytes: int | None = None  # "Model loading took"
    consumed_bytes: int | None = None  # weights + non-torch, after profiling
    peak_activation_bytes: int | None = None  # transient peak + the CUDA-graph estimate applied
    cudagraph_estimate_bytes: int | None = None
    cudagraph_actual_bytes: int | None = None
    requested_bytes: int | None = None
    total_bytes: int | None = None


# kv_cache_utils.py update_kv_cache_capacity:
# "%s KV cache size: %s tokens, Maximum concurrency for %s tokens per request: %.2fx"
# (before 0.21 the two halves were two log lines).
_CAPACITY_LINE = re.compile(
    r"(?P<pool>[A-Z]+(?: \+ host)?) KV cache size: (?P<tokens>[\d,]+) tokens(?:,|\s*\n[^\n]*?)\s*"
    r"Maximum concurrency for (?P<len>[\d,]+) tokens per request: (?P<conc>[\d.]+)x"
)
_GIB = r"(-?[\d.]+) GiB"
_WEIGHTS = re.compile(r"Model loading took " + _GIB)
_KV_MEMORY = re.compile(r"Available KV cache memory: " + _GIB)
_GRAPH_POOL = re.compile(r"CUDA graph pool memory: " + _GIB + r" \(actual\), " + _GIB + r" \(estimated\)")
_GRAPH_ESTIMATE = re.compile(r"Estimated CUDA graph memory: " + _GIB + " total")
_USAGE = re.compile(
    r"Free memory on device \(([\d.]+)/([\d.]+) GiB\) on startup\. Desired GPU memory utilization is "
    r"\([\d.]+, ([\d.]+) GiB\)\. Actual usage is ([\d.]+) GiB for consumed memory \(weights \+ non-torch\), "
    r"([\d.]+) GiB for peak activation, and ([\d.]+) GiB for CUDAGraph memory"
)


def _bytes(value: str | None) -> int | None:
    return None if value is None else int(float(value) * GiB)


def parse_engine_capacity(output: str) -> EngineCapacity | None:
    """The engine's own capacity from its log (the last capacity line), with the budget's terms, or None."""
    text = output or ""
    found = None
    for m in _CAPACITY_LINE.finditer(text):
        found = m
    if found is None:
        return None
    weights = [float(w) for w in _WEIGHTS.findall(text)]
    kv_memory = [float(k) for k in _KV_MEMORY.findall(text)]
    pool = _GRAPH_POOL.findall(text)
    estimate = _GRAPH_ESTIMATE.findall(text)
    usage = _USAGE.findall(text)
    graph_estimate = pool[-1][1] if pool else (estimate[-1] if estimate else None)
    total = requested = consumed = peak = None
    if usage:
        _, total, requested, consumed, peak, _ = usage[-1]
    return EngineCapacity(
        kv_tokens=int(found.group("tokens").replace(",", "")),
        max_concurrency=float(found.group("conc")),
        max_model_len=int(found.group("len").replace(",", "")),
        pool=found.group("pool"),
        kv_cache_bytes=int(min(kv_memory) * GiB) if kv_memory else None,  # the tightest rank decides
        weights_bytes=int(max(weights) * GiB) if weights else None,
        consumed_bytes=_bytes(consumed),
        peak_activation_bytes=_bytes(peak),
        cudagraph_estimate_bytes=_bytes(graph_estimate),
        cudagraph_actual_bytes=_bytes(pool[-1][0]) if pool else None,
        requested_bytes=_bytes(requested),
        total_bytes=_bytes(total),
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


def compared_terms(predicted: Plan, actual: EngineCapacity) -> dict[str, tuple[int, int]]:
    """term -> (predicted bytes, actual bytes), for the terms the engine's log gives.

    vLLM 0.32's "peak activation" includes the CUDA-graph estimate it subtracted, and a
    cold compile's extra memory (when the plan counts it) shows partly in "consumed",
    partly in the peak.
    """
    cold = predicted.compile_bytes if predicted.compile_cache == "cold" else 0
    persistent = predicted.compile_persistent_bytes if cold else 0
    terms: dict[str, tuple[int, int]] = {}
    if actual.weights_bytes is not None:
        terms["weights"] = (predicted.weights_bytes, actual.weights_bytes)
    if actual.consumed_bytes is not None and actual.weights_bytes is not None:
        terms["non_torch"] = (predicted.non_torch_bytes + persistent, actual.consumed_bytes - actual.weights_bytes)
    if actual.peak_activation_bytes is not None:
        applied = actual.cudagraph_estimate_bytes or 0
        terms["activation"] = (predicted.activation_bytes + cold - persistent, actual.peak_activation_bytes - applied)
    if actual.cudagraph_estimate_bytes is not None and predicted.cudagraph_bytes:
        terms["cuda_graphs"] = (predicted.cudagraph_bytes, actual.cudagraph_estimate_bytes)
    if actual.kv_cache_bytes is not None:
        terms["kv_cache"] = (predicted.kv_cache_bytes, actual.kv_cache_bytes)
    return terms


@dataclass
class CapacityReport:
    log_line: str
    warnings: list[str]
    status: dict[str, Any]


def _gib(value: int) -> str:
    return f"{value / GiB:.2f}"


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
    line = f"engine capacity: {actual.kv_tokens:,} KV tokens, {actual.max_concurrency:.2f}x at "
    line += f"{actual.max_model_len:,} tokens per request" if actual.max_model_len else "max_model_len"
    if predicted is not None:
        error = actual.kv_tokens - predicted.kv_cache_tokens
        relative = error / predicted.kv_cache_tokens if predicted.kv_cache_tokens else 0.0
        status["prediction_error_tokens"] = error
        status["prediction_error_pct"] = round(100 * relative, 2)
        terms = compared_terms(predicted, actual)
        if terms:
            status["capacity_terms"] = {
                name: {"predicted_gib": round(p / GiB, 2), "actual_gib": round(a / GiB, 2)} for name, (p, a) in terms.items()
            }
        line += f" (predicted {predicted.kv_cache_tokens:,}, {predicted.max_concurrency:.2f}x; {relative:+.1%})"
        if abs(relative) > GAP_WARNING and predicted.kv_cache_tokens:
            apart = sorted(
                ((name, p, a) for name, (p, a) in terms.items() if name != "kv_cache" and abs(a - p) >= GiB // 50),
                key=lambda t: -abs(t[2] - t[1]),
            )
            named = "; ".join(f"{name.replace('_', ' ')} {_gib(a)} GiB logged, {_gib(p)} GiB predicted" for name, p, a in apart[:3])
            where = f"the terms furthest apart: {named}" if named else "the engine's log gives no per-term figures to compare"
            warnings.append(
                f"the engine's KV cache holds {actual.kv_tokens:,} tokens, {relative:+.1%} against the "
                f"{predicted.kv_cache_tokens:,} the capacity plan predicted ({where}); please report this with the "
                f"engine log so the plan can be corrected"
            )
    if actual.max_concurrency < max_concurrency:
        length = f"{actual.max_model_len:,}-token" if actual.max_model_len else "full-length"
        warnings.append(
            f"the KV cache holds {actual.max_concurrency:.2f} {length} requests at once, fewer than "
            f"MAX_CONCURRENCY={max_concurrency}: long requests will wait for memory; lower MAX_MODEL_LEN, "
            f"set KV_CACHE_DTYPE=fp8, or give vLLM more GPU memory"
        )
    return CapacityReport(line, warnings, status)


def capacity_line(tail: str) -> str | None:
    """The engine's own capacity line ("Maximum concurrency for ...", "KV cache size: ..."), last first."""
    for line in reversed(tail.splitlines()):
        if "Maximum concurrency for" in line or "KV cache size:" in line or "GPU KV cache size" in line:
            return line.split("] ", 1)[-1].strip()
    return None


def ready_engine_report(
    startup_plan: "StartupPlan | None", profile: LaunchProfile, tail: str
) -> tuple[str | None, dict[str, Any]]:
    """A ready engine's capacity: its own line, and predicted against actual for the profile that
    became ready (logged once, kept for the status job; empty without a plan)."""
    line = capacity_line(tail)
    if startup_plan is None:
        return line, {}
    report = capacity_report(startup_plan.predict_for(profile), parse_engine_capacity(tail), profile.max_concurrency)
    log.info("%s", report.log_line)
    for warning in report.warnings:
        log.warning("%s", warning)
    return line, {**startup_plan.status_fields(), **report.status}
