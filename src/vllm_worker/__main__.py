"""`python -m vllm_worker` runs the worker, like `vllm-worker run`."""

import sys

from vllm_worker.main import cli

sys.exit(cli())
