"""Capacity-aware taking on the REAL vLLM CPU engine, through the runpod SDK's own job loop (serving.intake).

The tiny Llama with a 4 MiB KV cache (4,096 tokens) and MAX_MODEL_LEN=2048 holds about six
600-token requests. 40 of them are queued at once on the control-plane stand-in; while the platform
still queues, the worker must hold few jobs it has taken that the engine is not running (a worker
taking MAX_CONCURRENCY=30 held 25: issue 26), and every job must complete. The status job shows the
limit and why. bench/intake.py has the timings, against a fixed worker.

Issue 26 aims at a p95 of at most 2. The worker takes the next job the moment one ends, so every
refill of a batch that ends together is taken and not yet running for a moment, and on two busy
cores that moment is long: the raw count's p95 was 1 to 5 from run to run with two engine files at
once (on a quiet machine bench/intake.py measured it at 1 to 2, all of it outside vLLM, before the
first token). The test asserts the count less the jobs on their way in (taken under ON_THE_WAY_S
ago, no token yet: the SDK's take, the relay, vLLM's tokenizer and next step), measured at 0 to 2
with another engine file beside it, against a bound of 3 (one over the target, for a CI run's
load), and prints both. A worker that holds jobs back fails it: the fixed MAX_CONCURRENCY=30
worker's p95 on that measure is 23 to 24 in the bench (its jobs wait in vLLM for many seconds).
"""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path

import pytest

from tests.support import engine_env, vllm_metrics
from tests.support.control_plane import ControlPlane
from tests.support.worker_proc import WorkerProcess, stop_with_engine

pytestmark = pytest.mark.engine

JOBS = 40
TOKENS = 600
SAMPLE_S = 0.25
P95_BOUND = 3  # issue 26's target is 2: see the module docstring
# A job taken this recently that has no token yet is on its way into the engine (the SDK's take, the
# relay, vLLM's tokenizer and next step), not held from it: as long as runpod 1.12 itself leaves a
# free slot empty before it asks again.
ON_THE_WAY_S = 1.0


def running_in_engine(port: int) -> int:
    return int(vllm_metrics.metric(port, "vllm:num_requests_running"))


def test_a_burst_stays_in_the_platforms_queue_and_every_job_completes(tiny_model: Path, tmp_path: Path) -> None:
    env = engine_env.tiny_worker_env(
        tiny_model, MAX_MODEL_LEN="2048", KV_CACHE_MEMORY_BYTES="4194304", MAX_CONCURRENCY="30", DRAIN_TIMEOUT="0"
    )
    port = int(env["VLLM_PORT"])
    with ControlPlane() as cp:
        proc = WorkerProcess(env, control_plane=cp, workdir=tmp_path).start()
        try:
            proc.wait_for_log(r"engine ready; taking jobs", timeout=engine_env.BOOT_TIMEOUT)
            body = {"prompt": "hello " * 20, "max_tokens": TOKENS, "min_tokens": TOKENS, "stream": True}
            jobs = [cp.submit({"openai_route": "/v1/completions", "openai_input": body}) for _ in range(JOBS)]
            spare: list[int] = []
            settled: list[int] = []
            done = threading.Event()

            def sample() -> None:
                while not done.wait(SAMPLE_S):
                    if cp.queued() == 0:
                        continue
                    at = time.monotonic()
                    lines = [cp.timeline(j) for j in jobs]
                    held = [t for t in lines if t["taken"] is not None and t["done"] is None]
                    arriving = [t for t in held if t["first_stream"] is None and at - (t["taken"] or at) < ON_THE_WAY_S]
                    engine = running_in_engine(port)
                    spare.append(len(held) - engine)
                    settled.append(len(held) - len(arriving) - engine)

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            try:
                results = [cp.result(j, timeout=engine_env.BOOT_TIMEOUT) for j in jobs]
            finally:
                done.set()
                sampler.join()
            status = cp.result(cp.submit({"route": "/worker/status"}), timeout=60)["output"][0]["intake"]
        finally:
            stop_with_engine(proc, timeout=60)

    assert [r["error"] for r in results if "error" in r] == []
    assert spare, "the platform never queued: nothing was measured"
    p95, settled_p95 = (sorted(xs)[math.ceil(0.95 * len(xs)) - 1] for xs in (spare, settled))
    print(
        f"taken but not running while the platform queued: p95 {p95}, max {max(spare)}, {len(spare)} samples; "
        f"less the jobs in their first {ON_THE_WAY_S:g} s without a token: p95 {settled_p95}, max {max(settled)}"
    )
    assert settled_p95 <= P95_BOUND
    assert status["adaptive"] is True and 1 <= status["limit"] <= 30 and status["reason"]
    assert status["left_in_platform_queue"] == 30 - max(status["limit"], status["paced_up_to"] or 0)
    # The 40 finished requests' means, from vLLM's own histograms: the tiny model's prompt and the 600 tokens.
    assert status["recent_requests"]["generated_tokens"] == pytest.approx(600.0)
    assert status["recent_requests"]["engine_seconds"] > 0
