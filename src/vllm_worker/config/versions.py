"""The one place that states which vLLM release the worker is built and tested against.

The image's base tag (Dockerfile), the CPU engine the engine tests run (scripts/setup.sh)
and the flag names the worker passes must all be the same release, or a test can pass
against one vLLM while users run another; tests/unit/test_dockerfile.py checks they agree.
The worker never imports vLLM, so this is the only record of the version in the package.
"""

VLLM_VERSION = "0.32.0"
