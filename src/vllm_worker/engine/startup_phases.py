"""Where a start's time went: the worker's own steps, and the engine's, read from its log lines.

vLLM prints what each step of its start took, but spread over three processes and a few
hundred lines; a user paying for a cold start wants one line: import and config, download,
weights load, torch.compile, graph capture, KV profiling, ready. The engine's steps are read
from its own wordings (vLLM 0.32's sources, matched loosely as the failure rules are: case,
spacing and the number's format may drift), and a step vLLM did not print is absent, never
zero: an eager start has no compile, a CPU start no graph capture, a cached model no download.

Two kinds of reading: lines that carry their own seconds ("Loading weights took 0.01
seconds"), and marks whose arrival time, counted from the launch, bounds a step (the engine
core's "Initializing a V1 LLM engine" ends import and config; on CPU, where vLLM compiles
with Dynamo traced once and logs no compile time, "Warming up model for the compilation"
to "Warming up done" is the compile). The same lines say whether the compile caches were
warm. Pure: `PhaseClock` is fed (seconds since launch, line); nothing here reads a clock.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal, Mapping

from vllm_worker.engine.download_progress import download_over

CacheState = Literal["warm", "cold"]

# The engine's phases, in the order of a start; the one line and the status job keep it.
ENGINE_PHASES: tuple[str, ...] = (
    "import_config",
    "download",
    "weights_load",
    "torch_compile",
    "graph_capture",
    "kv_profiling",
    "engine_init",
    "ready",
)
WORKER_PHASES: tuple[str, ...] = ("settings", "preflight", "plan", "memory_wait")

_NUMBER = r"(\d+(?:\.\d+)?)"

# Lines that carry their own duration: phase -> pattern whose group 1 is the seconds. Several
# matches of one phase add up (vLLM compiles an encoder and a language model separately).
_REPORTED: tuple[tuple[str, re.Pattern[str]], ...] = (
    # model_executor/model_loader/weight_utils.py (only printed above 0.5 s)
    ("download", re.compile(r"time\s+spent\s+downloading\s+weights\s+for\s+.*?:\s*" + _NUMBER + r"\s*s", re.I)),
    # model_executor/model_loader/default_loader.py
    ("weights_load", re.compile(r"loading\s+weights\s+took\s+" + _NUMBER + r"\s*s", re.I)),
    # compilation/monitor.py (VLLM_COMPILE mode: GPUs)
    ("torch_compile", re.compile(
        r"torch\.compile(?:\s+and\s+initial\s+profiling/warm-?up\s+run\s+together)?\s+(?:took|takes)\s+"
        + _NUMBER + r"\s*s(?:ec\w*)?\s+in\s+total",
        re.I,
    ),),
    # v1/worker/gpu_model_runner.py
    ("graph_capture", re.compile(r"graph\s+capturing\s+finished\s+in\s+" + _NUMBER + r"\s*s", re.I)),
    # compilation/monitor.py monitor_profiling_run: the first forward after the compile, which is
    # the profiling run that sizes the KV cache on GPUs
    ("kv_profiling", re.compile(r"initial\s+profiling/warm-?up\s+run\s+took\s+" + _NUMBER + r"\s*s", re.I)),
    # v1/engine/core.py: profile, KV cache and warm-up (compile and capture included)
    (
        "engine_init",
        re.compile(r"init\s+engine\s+\(profile,\s*create\s+kv\s+cache,\s*warm-?up\s+model\)\s+took\s+" + _NUMBER + r"\s*s", re.I),
    ),
)
# v1/engine/core.py: the engine core process has imported and resolved its configuration.
_CORE_STARTED = re.compile(r"initializing\s+a\s+v1\s+llm\s+engine", re.I)
# v1/worker/cpu_model_runner.py: the CPU runner's compile (Dynamo traced once, then Inductor).
_CPU_COMPILE_START = re.compile(r"warming\s+up\s+model\s+for\s+the\s+compilation", re.I)
_CPU_COMPILE_DONE = re.compile(r"warming\s+up\s+done", re.I)

# Compile caches (compilation/backends.py, compilation/decorators.py).
_CACHE_LOADED = re.compile(
    r"directly\s+load\s+(?:the\s+compiled\s+graph|aot\s+compil)", re.I
)
_COMPILED_FRESH = re.compile(r"compiling\s+a\s+graph\s+for\s+compile\s+range|saved\s+aot\s+compiled\s+function", re.I)
# An AOT artifact was there but did not load: vLLM compiles again (with Inductor's cache, which
# sits in the same folder). On the CPU build this happens on every warm start.
_AOT_RELOAD = re.compile(r"compiling\s+model\s+again\s+due\s+to\s+a\s+load\s+failure\s+from\s+(\S+?),?\s+reason:\s*(.*)", re.I)
_CORRUPT = re.compile(r"corrupt|EOFError|unpickling|truncated", re.I)


@dataclass
class PhaseClock:
    """The engine's phases of one launch, from its lines as they arrive."""

    reported: dict[str, float] = field(default_factory=dict)
    marks: dict[str, float] = field(default_factory=dict)
    cache: CacheState | None = None
    aot_load_failure: str | None = None  # vLLM's reason, when an artifact was found and not loaded
    corrupt_entry: str | None = None  # the path of an artifact vLLM found corrupt

    def feed(self, at: float, line: str) -> None:
        """One line of the engine's output, `at` seconds after the launch started."""
        if "downloaded" not in self.marks and download_over(line):
            # The weights are on disk from here (vLLM's own download line covers only part of a download):
            # what a start that fetched takes after its download is counted from this mark.
            self.marks["downloaded"] = at
        for phase, pattern in _REPORTED:
            match = pattern.search(line)
            if match:
                self.reported[phase] = self.reported.get(phase, 0.0) + float(match.group(1))
                return
        if "core_started" not in self.marks and _CORE_STARTED.search(line):
            self.marks["core_started"] = at
        elif _CPU_COMPILE_START.search(line):
            self.marks.setdefault("cpu_compile_start", at)
        elif _CPU_COMPILE_DONE.search(line) and "cpu_compile_start" in self.marks:
            self.marks["cpu_compile_done"] = at
        self._cache_line(line)

    def _cache_line(self, line: str) -> None:
        reload = _AOT_RELOAD.search(line)
        if reload:
            # The artifact was there (torn or, on the CPU build, unloadable): vLLM compiles again from
            # the Inductor cache beside it, which is what makes the start shorter.
            reason = reload.group(2).strip()
            self.aot_load_failure = reason
            if _CORRUPT.search(reason):
                self.corrupt_entry = reload.group(1)
            self.cache = "warm"
        elif _CACHE_LOADED.search(line):
            self.cache = "warm"
        elif _COMPILED_FRESH.search(line) and self.cache is None:
            self.cache = "cold"

    @property
    def downloaded_at(self) -> float | None:
        """Seconds after the launch of the engine's first line with the weights on disk; None before it."""
        return self.marks.get("downloaded")

    def phases(self, ready_at: float | None = None) -> dict[str, float]:
        """The engine's phases in seconds, in start order; only those the engine printed (and `ready`)."""
        found: dict[str, float] = dict(self.reported)
        if "core_started" in self.marks:
            found["import_config"] = self.marks["core_started"]
        if "torch_compile" not in found and "cpu_compile_done" in self.marks:
            found["torch_compile"] = self.marks["cpu_compile_done"] - self.marks["cpu_compile_start"]
        if ready_at is not None:
            found["ready"] = ready_at
        return {name: round(found[name], 2) for name in ENGINE_PHASES if name in found}


def phases_line(launch: int, worker: Mapping[str, float], engine: Mapping[str, float], cache: str | None) -> str:
    """The one line at ready: the worker's steps, then the engine's, then the caches' state."""
    parts = [f"{name} {worker[name]:.1f}s" for name in WORKER_PHASES if name in worker]
    parts += [f"{name} {engine[name]:.1f}s" for name in ENGINE_PHASES if name in engine]
    text = f"startup phases, launch {launch}: " + (", ".join(parts) if parts else "none reported")
    if cache is not None:
        text += f"; compile caches {cache}"
    return text
