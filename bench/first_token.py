"""The first job after a start against the next ten: does the first user pay the engine's warm-up (issue 44)?

Starts the worker on the tiny Llama and the real vLLM CPU engine with torch.compile on (ENFORCE_EAGER=false),
through the SDK's job loop against the control-plane stand-in. Once it takes jobs, sends eleven jobs one after
another, each a completion of one token (its time is the time to the first token, through the worker and the
platform's path), and prints the first's time, the median of the next ten, and their ratio. The worker sends
the engine a warm-up request of its own before it takes the first job (engine/warmup.py); the log line
with its time is printed too.

    .venv/bin/python bench/first_token.py [--starts 2]
"""

from __future__ import annotations

import argparse
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support import engine_env  # noqa: E402
from tests.support.control_plane import ControlPlane  # noqa: E402
from tests.support.worker_proc import WorkerProcess  # noqa: E402

JOB = {"openai_route": "/v1/completions", "openai_input": {"prompt": "Once upon a time, " * 8, "max_tokens": 1, "temperature": 0}}


def one_start(workdir: Path) -> tuple[float, list[float], str]:
    env = engine_env.tiny_worker_env(engine_env.make_tiny_model(), ENFORCE_EAGER="false", MAX_CONCURRENCY="2")
    with ControlPlane() as cp, WorkerProcess(env, control_plane=cp, workdir=workdir) as worker:
        worker.wait_for_log(r"engine ready; taking jobs", timeout=engine_env.BOOT_TIMEOUT)
        times = []
        for _ in range(11):
            started = time.monotonic()
            result = cp.result(cp.submit(JOB), timeout=300)
            times.append(time.monotonic() - started)
            assert "error" not in result, result
        warm = re.search(r"warm-up request: .*", worker.log())
    return times[0], times[1:], warm.group(0) if warm else "no warm-up line"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--starts", type=int, default=2)
    args = parser.parse_args()
    print(f"{platform.node()}: tiny Llama, vLLM CPU engine, torch.compile on; one-token completions through the worker")
    for n in range(args.starts):
        first, rest, warm = one_start(Path(tempfile.mkdtemp(prefix="first-token-")))
        median = statistics.median(rest)
        print(
            f"start {n + 1}: first job {first * 1000:.0f} ms, median of the next ten {median * 1000:.0f} ms "
            f"(min {min(rest) * 1000:.0f}, max {max(rest) * 1000:.0f}): ratio {first / median:.2f}; {warm}",
            flush=True,
        )


if __name__ == "__main__":
    main()
