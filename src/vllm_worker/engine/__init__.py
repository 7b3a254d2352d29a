"""The child and its lifecycle: `process` owns the `vllm serve` child (its group, a bounded tail of
its output, one terminate path); `gpu_memory` waits until the memory vLLM checks is free; `launcher`
performs one launch attempt for startup and restarts alike; `ladder` decides what to launch next;
`monitor` watches a serving engine and relaunches it in place; `compile_cache` keeps the engine's
compile caches on the network volume; `startup_phases` and `download_progress` say where a start's
time goes; `start_forecast` predicts it before the download and sets it against the platform's limit,
and `start_watch` carries that forecast through the launch; `warmup` sends a ready engine one request of the
worker's own before the first job."""

__all__ = [
    "compile_cache", "download_progress", "gpu_memory", "ladder", "launcher", "monitor", "process", "start_forecast",
    "start_watch", "startup_phases", "warmup",
]
