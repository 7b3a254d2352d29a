"""The phases of a start, read from real vLLM 0.32 CPU output and from vLLM's GPU wordings.

The CPU files are two real starts with torch.compile on (tests/support/real_texts/README.md):
an empty cache, then the cache the first left. Lines are fed with the time of the engine's own
timestamp, as the launcher feeds them with their arrival time.
"""

from __future__ import annotations

import re
from pathlib import Path

from vllm_worker.engine.startup_phases import ENGINE_PHASES, PhaseClock, phases_line

TEXTS = Path(__file__).resolve().parents[1] / "support" / "real_texts"
_STAMP = re.compile(r"\b\d\d-\d\d (\d\d):(\d\d):(\d\d)\b")


def feed_file(name: str) -> PhaseClock:
    clock = PhaseClock()
    first: int | None = None
    at = 0.0
    for line in (TEXTS / name).read_text().splitlines():
        stamp = _STAMP.search(line)
        if stamp:
            seconds = int(stamp[1]) * 3600 + int(stamp[2]) * 60 + int(stamp[3])
            first = seconds if first is None else first
            at = float(seconds - first)
        clock.feed(at, line)
    return clock


def test_a_cold_cpu_start_reports_its_phases_and_a_cold_cache() -> None:
    clock = feed_file("startup_compile_cold.txt")
    phases = clock.phases(ready_at=54.4)
    assert list(phases) == ["import_config", "weights_load", "torch_compile", "kv_profiling", "engine_init", "ready"]
    assert phases["weights_load"] == 0.01
    assert phases["engine_init"] == 26.79
    assert phases["kv_profiling"] == 0.11
    assert phases["import_config"] == 13.0  # 21:08:34 (first line) to the engine core's first line at 21:08:47
    assert phases["torch_compile"] == 27.0  # "Warming up model for the compilation..." 21:08:54 to "Warming up done." 21:09:21
    assert phases["ready"] == 54.4
    assert clock.cache == "cold"
    assert clock.aot_load_failure is None


def test_a_warm_cpu_start_says_warm_with_the_aot_load_failure_of_the_cpu_build() -> None:
    clock = feed_file("startup_compile_warm.txt")
    phases = clock.phases(ready_at=29.8)
    assert phases["engine_init"] == 8.10
    assert phases["torch_compile"] == 8.0
    assert clock.cache == "warm"
    assert clock.aot_load_failure == "'function' object has no attribute 'finalize_loading'"
    assert clock.corrupt_entry is None


def test_phases_vllm_did_not_print_are_absent_not_zero() -> None:
    clock = feed_file("startup_compile_cold.txt")
    phases = clock.phases()
    assert "download" not in phases and "graph_capture" not in phases and "ready" not in phases
    eager = PhaseClock()
    eager.feed(3.0, "(EngineCore pid=1) INFO 12-01 21:08:47 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: ...")
    eager.feed(9.0, "(EngineCore pid=1) INFO 12-01 21:08:53 [core.py:402] init engine (profile, create kv cache, warmup model) took 1.20 s")
    assert eager.phases() == {"import_config": 3.0, "engine_init": 1.2}
    assert eager.cache is None


# vLLM 0.32's GPU wordings, as its format strings print them (gpu_model_runner.py, monitor.py,
# backends.py, weight_utils.py, core.py), with the loose spacing and case the matcher allows.
GPU_COLD = [
    "(Worker pid=9) INFO 01-01 00:00:10 [weight_utils.py:533] Time spent downloading weights for org/model: 41.204518 seconds",
    "(Worker pid=9) INFO 01-01 00:00:12 [default_loader.py:501] Loading weights took 2.51 seconds",
    "(Worker pid=9) INFO 01-01 00:00:20 [backends.py:399] [backbone] Compiling a graph for compile range (1, 8192) takes 30.12 s",
    "(Worker pid=9) INFO 01-01 00:00:50 [monitor.py:62] [backbone] torch.compile took 42.37 s in total",
    "(Worker pid=9) INFO 01-01 00:00:51 [monitor.py:91] [backbone] Initial profiling/warmup run took 1.05 s",
    "(Worker pid=9) INFO 01-01 00:01:40 [gpu_model_runner.py:6582] Graph capturing finished in 54 secs, took 0.52 GiB",
    "(EngineCore pid=8) INFO 01-01 00:01:41 [core.py:386] init engine (profile, create kv cache, warmup model) took "
    "101.30 s (compilation: 42.37 s)",
]


def test_gpu_wordings_give_download_compile_capture_and_profiling() -> None:
    clock = PhaseClock()
    for at, line in enumerate(GPU_COLD):
        clock.feed(float(at), line)
    phases = clock.phases(ready_at=130.0)
    assert phases == {
        "download": 41.2,
        "weights_load": 2.51,
        "torch_compile": 42.37,
        "graph_capture": 54.0,
        "kv_profiling": 1.05,
        "engine_init": 101.3,
        "ready": 130.0,
    }
    assert list(phases) == [p for p in ENGINE_PHASES if p in phases]
    assert clock.cache == "cold"


def test_the_first_line_with_the_weights_on_disk_marks_the_end_of_the_download() -> None:
    clock = PhaseClock()
    clock.feed(30.0, "(EngineCore pid=7) INFO [core.py:93] Initializing a V1 LLM engine (v0.32.0) with config: ...")
    assert clock.downloaded_at is None
    clock.feed(88.5, "(EngineCore pid=7) INFO [weight_utils.py:450] Time spent downloading weights for acme/m: 41.2 s")
    clock.feed(90.0, "(EngineCore pid=7) INFO [default_loader.py:290] Loading weights took 1.50 seconds")
    assert clock.downloaded_at == 88.5  # the first such line, not a later one
    assert clock.phases()["download"] == 41.2 and clock.phases()["weights_load"] == 1.5
    quiet = PhaseClock()  # a download under 0.5 s has no line of its own: the load's line marks it
    quiet.feed(31.0, "Loading safetensors checkpoint shards:   0% Completed | 0/1 [00:00<?, ?it/s]")
    assert quiet.downloaded_at == 31.0


def test_a_cache_loaded_on_a_gpu_is_warm_and_a_corrupt_artifact_is_named() -> None:
    warm = PhaseClock()
    warm.feed(1.0, "(Worker pid=9) INFO 01-01 00:00:20 [backends.py:295] [backbone] Directly load the compiled graph(s) "
                   "for compile range (1, 8192) from the cache, took 3.118 s")
    assert warm.cache == "warm"
    aot = PhaseClock()
    aot.feed(1.0, "(Worker pid=9) INFO 01-01 00:00:20 [decorators.py:327] [backbone] Directly load AOT compilation from "
                  "path /vol/engine-cache/vllm/torch_compile_cache/torch_aot_compile/abc/rank_0_0/model")
    assert aot.cache == "warm"
    torn = PhaseClock()
    torn.feed(1.0, "(Worker pid=9) WARNING 01-01 00:00:20 [decorators.py:333] [backbone] Compiling model again due to a "
                   "load failure from /vol/engine-cache/vllm/torch_compile_cache/torch_aot_compile/abc/rank_0_0/model, "
                   "reason: Compile cache file corrupted.")
    assert torn.cache == "warm"
    assert torn.corrupt_entry == "/vol/engine-cache/vllm/torch_compile_cache/torch_aot_compile/abc/rank_0_0/model"


def test_the_line_at_ready_names_the_worker_steps_the_engine_phases_and_the_caches() -> None:
    line = phases_line(
        1,
        {"settings": 0.01, "preflight": 0.42, "plan": 0.3, "memory_wait": 0.0},
        {"import_config": 13.0, "torch_compile": 27.0, "ready": 54.4},
        "warm",
    )
    assert line == (
        "startup phases, launch 1: settings 0.0s, preflight 0.4s, plan 0.3s, memory_wait 0.0s, "
        "import_config 13.0s, torch_compile 27.0s, ready 54.4s; compile caches warm"
    )
