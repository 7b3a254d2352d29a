"""The child and its lifecycle: `process` owns the `vllm serve` child (its group, a bounded tail of
its output, one terminate path); `gpu_memory` waits until the memory vLLM checks is free; `launcher`
performs one launch attempt for startup and restarts alike; `ladder` decides what to relaunch;
`monitor` watches a serving engine and relaunches it in place."""

__all__ = ["gpu_memory", "ladder", "launcher", "monitor", "process"]
