"""The child and its lifecycle: `process` owns the `vllm serve` child (its group, a bounded tail of
its output, one terminate path); `gpu_memory` waits until the memory vLLM checks is free; `launcher`
performs one launch attempt for startup and restarts alike; `ladder` decides what to relaunch;
`monitor` watches a serving engine and relaunches it in place. Around each launch: `compile_cache`
keeps the engine's compile caches on the network volume, `startup_phases` reads where the start's
time went from the engine's lines, `download_progress` shows a download vLLM makes silently."""

__all__ = [
    "compile_cache", "download_progress", "gpu_memory", "ladder", "launcher", "monitor", "process", "startup_phases",
]
