"""Runpod Hub entry point: the Hub looks for a handler file in a worker repository.

The image runs the same thing through its ENTRYPOINT (`/opt/worker/bin/vllm-worker run`);
the handler itself is `vllm_worker.serving.handler.handler`, started by `vllm_worker.main`.
"""

import sys

from vllm_worker.main import cli

if __name__ == "__main__":
    sys.exit(cli())
