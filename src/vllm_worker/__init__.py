"""vllm-worker: a Runpod Serverless worker that supervises `vllm serve` and proxies jobs to it."""

__version__ = "0.1.0"
