"""How the engine copes under load, from vLLM's own /metrics: figures for the status job, a warning in the log.

What an operator reads first when replies slow down is in vLLM's Prometheus text, which jobs
cannot reach: how full the KV cache is, how many requests run and wait, how many were preempted
(their KV cache freed to make room, their work recomputed later), the prompt and generation
throughput, the prefix-cache hit rate. The status job shows them; a `LoadWatch` thread reads
them every POLL_S seconds and warns in the log, at most once per WARN_EVERY_S, when requests are
preempted or the KV cache stays full with requests waiting, naming the settings that help.

Metric names are vLLM 0.32's (vllm/v1/metrics/loggers.py), as the CPU engine serves them:
gauges `vllm:kv_cache_usage_perc` (a fraction), `vllm:num_requests_running`,
`vllm:num_requests_waiting`; counters (`_total`) `vllm:num_preemptions`, `vllm:prompt_tokens`,
`vllm:generation_tokens`, `vllm:prefix_cache_queries`, `vllm:prefix_cache_hits`; one series per
engine (label `engine`), summed here. With DISABLE_LOG_STATS=true vLLM keeps none of them.
Reading /metrics costs the API server about 10 ms on 2 CPU cores; bench/metrics_overhead.py
measures that polling it does not slow jobs.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable

from vllm_worker.config.profile import LaunchProfile
from vllm_worker.serving import intake

log = logging.getLogger("vllm_worker")

POLL_S = 10.0
WARN_EVERY_S = 300.0
READ_TIMEOUT_S = 2.0
# The status job's own read may wait longer: it is asked for rarely, and an engine busy with a burst
# on few cores has been measured answering /metrics after more than 2 s.
STATUS_READ_TIMEOUT_S = 10.0
NO_ANSWER = "the engine's /metrics did not answer within {seconds:g} s (the engine is busy, or not serving)"
# A KV cache this full in two reads in a row, with requests waiting, is "full".
KV_FULL = 0.95

_GAUGES = {
    "vllm:kv_cache_usage_perc": "kv_cache_usage",
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
}
_COUNTERS = {
    "vllm:num_preemptions_total": "preemptions",
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:generation_tokens_total": "generation_tokens",
    "vllm:prefix_cache_queries_total": "prefix_cache_queries",
    "vllm:prefix_cache_hits_total": "prefix_cache_hits",
    # Histograms of finished requests: their prompt and generated tokens (the intake's request length).
    "vllm:request_prompt_tokens_sum": "finished_prompt_tokens",
    "vllm:request_generation_tokens_sum": "finished_generation_tokens",
    "vllm:request_prompt_tokens_count": "finished_requests",
}
# A histogram's sum in seconds: kept as a float.
_SECONDS = {"vllm:request_inference_time_seconds_sum": "finished_engine_seconds"}
NO_STATS = (
    "the engine's /metrics has no vllm:num_requests_running: vLLM keeps no statistics "
    "with DISABLE_LOG_STATS=true"
)

# Loopback reads must never go through an HTTP(S)_PROXY from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class Sample:
    """One read of /metrics (`at`: time.monotonic() of the read)."""

    at: float
    kv_cache_usage: float
    running: int
    waiting: int
    preemptions: int
    prompt_tokens: int
    generation_tokens: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    finished_prompt_tokens: int = 0
    finished_generation_tokens: int = 0
    finished_requests: int = 0
    finished_engine_seconds: float = 0.0  # their time in the engine, summed (vllm:request_inference_time_seconds)
    kv_tokens: int | None = None  # from vllm:cache_config_info
    block_size: int | None = None  # from vllm:cache_config_info


_CACHE_INFO = re.compile(r'^vllm:cache_config_info\{(?P<labels>[^}]*)\}', re.MULTILINE)
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def _cache_labels(text: str) -> dict[str, str]:
    """vLLM's cache_config_info labels ({} when /metrics has none)."""
    found = _CACHE_INFO.search(text)
    return dict(_LABEL.findall(found.group("labels"))) if found is not None else {}


def _block_size(labels: dict[str, str]) -> int | None:
    """The tokens of one KV cache block (None: not given)."""
    value = labels.get("block_size", "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def _kv_tokens(labels: dict[str, str]) -> int | None:
    """The KV cache's size in tokens."""
    try:
        if labels.get("kv_cache_size_tokens") not in (None, "", "None"):
            return int(labels["kv_cache_size_tokens"])
        return int(labels["num_gpu_blocks"]) * int(labels["block_size"])
    except (KeyError, ValueError):
        return None


def parse(text: str, at: float) -> Sample | None:
    """The figures in a Prometheus text from vLLM's /metrics; None when vLLM keeps no statistics."""
    values: dict[str, float] = {}
    kv: list[float] = []
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        ends = [i for i in (line.find("{"), line.find(" ")) if i >= 0]
        name = line[: min(ends)] if ends else line
        field = _GAUGES.get(name) or _COUNTERS.get(name) or _SECONDS.get(name)
        if field is None:
            continue
        try:
            value = float(line.rsplit(" ", 1)[1])
        except (IndexError, ValueError):
            continue
        if not math.isfinite(value):
            continue
        if field == "kv_cache_usage":
            kv.append(value)
        else:
            values[field] = values.get(field, 0.0) + value
    if "running" not in values:
        return None
    cache = _cache_labels(text)
    return Sample(
        at=at,
        kv_cache_usage=max(kv) if kv else 0.0,
        **{field: int(values.get(field, 0.0)) for field in ("running", "waiting", *_COUNTERS.values())},
        finished_engine_seconds=values.get("finished_engine_seconds", 0.0),
        kv_tokens=_kv_tokens(cache),
        block_size=_block_size(cache),
    )


def figures(current: Sample | None, previous: Sample | None) -> dict[str, Any]:
    """What the status job shows: the gauges now, the counters since the engine started, and the rates
    over the time since `previous` (None when there is no earlier read of the same engine)."""
    if current is None:
        return {"available": False, "reason": NO_STATS}
    report: dict[str, Any] = {
        "available": True,
        "kv_cache_usage": round(current.kv_cache_usage, 4),
        "running": current.running,
        "waiting": current.waiting,
        "preemptions": current.preemptions,
        "prefix_cache_hit_rate": _ratio(current.prefix_cache_hits, current.prefix_cache_queries),
        "prompt_tokens_per_s": None,
        "generation_tokens_per_s": None,
        "over_seconds": None,
    }
    base = previous if _same_engine(previous, current) else None
    if base is not None and current.at > base.at:
        seconds = current.at - base.at
        report["prompt_tokens_per_s"] = round((current.prompt_tokens - base.prompt_tokens) / seconds, 1)
        report["generation_tokens_per_s"] = round((current.generation_tokens - base.generation_tokens) / seconds, 1)
        report["over_seconds"] = round(seconds, 1)
    return report


def _ratio(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole > 0 else None


def _same_engine(previous: Sample | None, current: Sample) -> bool:
    """A restarted engine starts its counters again at 0: no rate across the restart."""
    if previous is None:
        return False
    return all(getattr(current, name) >= getattr(previous, name) for name in _COUNTERS.values())


def engine_now(current: Sample | None, previous: Sample | None) -> intake.EngineNow | None:
    """What the intake decision reads of one sample: the gauges, and since `previous` (the same engine's;
    since the engine started when there is none) the preemptions and the requests finished, with their
    tokens and time in the engine, and (only since a `previous` read of it) the tokens made and the seconds."""
    if current is None:
        return None
    base = previous if _same_engine(previous, current) else None

    def since(name: str) -> float:
        value: float = getattr(current, name)
        return value - getattr(base, name) if base is not None else value

    return intake.EngineNow(
        running=current.running,
        waiting=current.waiting,
        kv_cache_usage=current.kv_cache_usage,
        preempted=int(since("preemptions")) if base is not None else 0,
        finished=int(since("finished_requests")),
        prompt_tokens=since("finished_prompt_tokens"),
        generated_tokens=since("finished_generation_tokens"),
        engine_seconds=since("finished_engine_seconds"),
        kv_tokens=current.kv_tokens,
        block_size=current.block_size,
        generated_now=since("generation_tokens") if base is not None else 0.0,
        seconds=max(0.0, current.at - base.at) if base is not None else 0.0,
        running_before=base.running if base is not None else None,
    )


def _preempted(previous: Sample | None, current: Sample) -> int:
    """Preemptions since `previous`, or since the engine started when it is not a read of this engine."""
    base = previous if _same_engine(previous, current) else None
    return current.preemptions - (base.preemptions if base is not None else 0)


def advice(previous: Sample | None, current: Sample, profile: LaunchProfile, max_concurrency: int) -> str | None:
    """The warning when requests were preempted since `previous` (since the engine started when there
    is no earlier read of it), or the KV cache stayed full with requests waiting; None when it copes."""
    base = previous if _same_engine(previous, current) else None
    preempted = _preempted(previous, current)
    full = (
        base is not None
        and current.kv_cache_usage >= KV_FULL
        and base.kv_cache_usage >= KV_FULL
        and current.waiting > 0
    )
    if preempted <= 0 and not full:
        return None
    seconds = current.at - base.at if base is not None else 0.0
    if preempted > 0:
        when = f"in the last {seconds:.0f} s" if base is not None else "since the engine started"
        what = (
            f"{preempted} request{'s were' if preempted != 1 else ' was'} preempted {when} "
            f"(their KV cache freed for others and their work recomputed later, which slows every reply)"
        )
    else:
        what = f"the KV cache stayed full for {seconds:.0f} s with requests waiting"
    now = (
        f"KV cache {current.kv_cache_usage:.0%} used, {current.running} running, {current.waiting} waiting, "
        f"{current.preemptions} preemptions since the engine started"
    )
    seqs = profile.max_num_seqs or "the worker's default"
    length = profile.max_model_len or "the model's"
    dtype = profile.kv_cache_dtype
    tp = profile.tensor_parallel_size
    helps = (
        f"fewer sequences at once (MAX_NUM_SEQS, now {seqs}, and MAX_CONCURRENCY, now {max_concurrency}), "
        f"a shorter MAX_MODEL_LEN (now {length}), KV_CACHE_DTYPE=fp8 (now {dtype}), or more memory for the "
        f"KV cache: a larger card, or TENSOR_PARALLEL_SIZE above {tp}"
    )
    return f"The engine is short of KV cache: {what}; {now}. What helps: {helps}."


def metrics_url(host: str, port: int) -> str:
    return f"http://{host}:{port}/metrics"


def read(url: str, timeout: float = READ_TIMEOUT_S, clock: Callable[[], float] = time.monotonic) -> tuple[Sample | None, bool]:
    """(the sample, whether /metrics answered at all)."""
    try:
        with _OPENER.open(url, timeout=timeout) as response:
            text = response.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, ValueError):
        return None, False
    return parse(text, clock()), True


class LoadWatch:
    """Reads /metrics every `interval` seconds beside the job loop; keeps the last read for the status
    job's rates and warns in the log when the engine is short of KV cache (at most every WARN_EVERY_S,
    except that the first preemptions after a full-cache warning are warned about at once)."""

    def __init__(
        self,
        host: str,
        port: int,
        profile: Callable[[], LaunchProfile],
        max_concurrency: int,
        interval: float = POLL_S,
        clock: Callable[[], float] = time.monotonic,
        intake: intake.Intake | None = None,
    ) -> None:
        self.url = metrics_url(host, port)
        # With an adaptive intake, /metrics is read every intake.POLL_S for it; the warning still every `interval`.
        self.intake = intake
        self._intake_last: Sample | None = None
        self._observed_at: float | None = None
        self.profile = profile  # the configuration serving now (a restart may have taken a ladder step)
        self.max_concurrency = max_concurrency
        self.interval = interval
        self.clock = clock
        self.last: Sample | None = None
        self.latest: Sample | None = None  # the most recent read with figures (intake or warning)
        self._warned_at: float | None = None
        self._warned_preempted = False  # whether the last warning named preemptions
        self._since_warning: Sample | None = None
        self._stop = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self) -> "LoadWatch":
        self.thread = threading.Thread(target=self._run, name="engine-load", daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        adaptive = self.intake is not None and self.intake.adaptive
        every = min(self.interval, intake.POLL_S) if adaptive else self.interval
        while True:
            sample, answered = read(self.url, clock=self.clock)
            if sample is not None:
                self.latest = sample
            if adaptive and answered:
                self.feed_intake(sample)
            if sample is not None and (self._observed_at is None or sample.at - self._observed_at >= self.interval - every / 2):
                self._observed_at = sample.at
                self.observe(sample)
            if self._stop.wait(every):
                return

    def feed_intake(self, sample: Sample | None) -> None:
        """One read for the intake decision (an answered /metrics without figures: no adaptation)."""
        assert self.intake is not None
        previous, self._intake_last = self._intake_last, sample
        self.intake.observe(engine_now(sample, previous), self.clock() if sample is None else sample.at)

    def observe(self, sample: Sample) -> str | None:
        """Take one read; returns the warning logged for it, if any."""
        previous, self.last = self.last, sample
        baseline = self._since_warning if _same_engine(self._since_warning, sample) else previous
        warning = advice(baseline, sample, self.profile(), self.max_concurrency)
        if warning is None:
            return None
        preempted = _preempted(baseline, sample) > 0
        # A full cache warned about first does not hide the preemptions that follow it: those are worse.
        escalates = preempted and not self._warned_preempted
        if self._warned_at is not None and sample.at - self._warned_at < WARN_EVERY_S and not escalates:
            return None
        self._warned_at = sample.at
        self._warned_preempted = preempted
        self._since_warning = sample
        log.warning("%s", warning)
        return warning

    def status(self, current: Sample | None, answered: bool = True) -> dict[str, Any]:
        """The status job's figures for a fresh read, with rates since the watch's last read. When the
        engine did not answer, the watch's latest read, said to be that (and how old), where there is one."""
        if answered:
            return figures(current, self.last)
        latest, no_answer = self.latest, NO_ANSWER.format(seconds=STATUS_READ_TIMEOUT_S)
        if latest is None:
            return {"available": False, "reason": no_answer}
        report = figures(latest, self.last)  # no rates when `last` is that same read
        report["stale"] = no_answer + ": these are the worker's last read"
        report["read_seconds_ago"] = round(max(0.0, self.clock() - latest.at), 1)
        return report
