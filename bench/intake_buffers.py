"""The trade of capacity-aware taking, in one run: a fixed worker against the capacity-aware one at several buffers
(INTAKE_BUFFER: jobs kept waiting inside vLLM past what its KV cache holds to their end), at two KV cache sizes,
and a burst of long jobs right after short ones (issue 43).

The real vLLM CPU engine (tiny Llama, MAX_MODEL_LEN=2048, jobs of 600 streamed tokens), the worker as a process
through the runpod SDK's job loop against the control-plane stand-in, bench/intake.py's burst and feed. For each
cache size: the fixed MAX_CONCURRENCY=30 worker's burst gives one engine's rate, and every worker is then fed
twice that for --feed-seconds; each capacity-aware worker first answers 10 short jobs (16 tokens), then takes
the burst of 40. Prints one row per worker: completed jobs a minute and generated tokens a second (second half
of the feed, and their ratio to the fixed worker's), first-token p95, taken-and-not-running p95 while the
platform queues (feed; burst after short jobs), vLLM's preemptions.

    flock /tmp/vllm-engine.lock .venv/bin/python bench/intake_buffers.py [--buffers 0,1,2,auto] [--kv-mib 4,8]
        [--feed-seconds 120]

Asserts nothing (a bench, not a test). This machine's engine speed drifts from minute to minute: a row is one
sample of it, printed with the machine's load.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench"), str(ROOT / "src")]

import intake as bench  # noqa: E402  (bench/intake.py)

from tests.support.control_plane import ControlPlane  # noqa: E402

SHORT = {"openai_route": "/v1/completions", "openai_input": {"prompt": "hello " * 20, "max_tokens": 16, "min_tokens": 16}}


def after_short(cp: ControlPlane, worker: Any) -> dict[str, Any]:
    """10 short jobs answered, then the burst of long ones at once."""
    for job in [cp.submit(SHORT) for _ in range(10)]:
        cp.result(job, timeout=300)
    asked_before = len(cp.asks())
    figures = bench.burst(cp, worker)
    figures["largest_take"] = max((asked for _, asked, handed in cp.asks()[asked_before:] if handed), default=0)
    return figures


def row(label: str, feed: dict[str, Any], fixed: dict[str, Any] | None, shifted: dict[str, Any] | None) -> str:
    def ratio(key: str) -> str:
        return f"{feed[key] / fixed[key]:.2f}" if fixed and fixed.get(key) else "-"

    burst = "-" if shifted is None else f"{shifted['taken_not_running_p95']:g} (largest take {shifted['largest_take']})"
    return (
        f"| {label} | {feed['completed_per_min_second_half']} ({ratio('completed_per_min_second_half')}) | "
        f"{feed['generated_tokens_per_s_second_half']} ({ratio('generated_tokens_per_s_second_half')}) | "
        f"{feed['first_token_wait_p95_s']} | {feed['taken_not_running_p95']:g} | {burst} | {feed['preemptions_second_half']} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--buffers", default="0,1,2,auto", help="INTAKE_BUFFER values, comma-separated (auto: unset)")
    parser.add_argument("--kv-mib", default="4,8", help="KV cache sizes in MiB, comma-separated")
    parser.add_argument("--feed-seconds", type=float, default=120.0)
    args = parser.parse_args()
    buffers = [b.strip() for b in args.buffers.split(",") if b.strip()]
    print(f"machine load (1 min) at start: {bench.load_note()}", flush=True)
    for kv in (int(k) for k in args.kv_mib.split(",")):
        bench.KV_MIB = kv
        rows = []
        with ControlPlane() as cp:
            fixed = bench.boot(cp, adaptive=False, label=f"fixed-{kv}")
            try:
                rate = 2 * bench.burst(cp, fixed)["jobs_per_min"]
                fixed_feed = bench.feed(cp, [fixed], rate, args.feed_seconds)
            finally:
                fixed.stop()
        rows.append(row("fixed MAX_CONCURRENCY=30", fixed_feed, None, None))
        print(rows[-1], flush=True)
        for buffer in buffers:
            extra = {"INTAKE_BUFFER": None if buffer == "auto" else buffer}
            with ControlPlane() as cp:
                worker = bench.boot(cp, adaptive=True, label=f"aware-{kv}-{buffer}", **extra)
                try:
                    shifted = after_short(cp, worker)
                    time.sleep(2)
                    feed = bench.feed(cp, [worker], rate, args.feed_seconds)
                finally:
                    worker.stop()
            rows.append(row(f"capacity-aware, INTAKE_BUFFER={buffer}", feed, fixed_feed, shifted))
            print(rows[-1], flush=True)
        print(f"\nKV cache {kv} MiB, fed {rate:.1f} jobs/min for {args.feed_seconds:g} s (load {bench.load_note()}):")
        print("| worker | completed/min (ratio) | generated tokens/s (ratio) | first-token p95 s | taken, not running p95 "
              "(feed) | after short jobs: taken, not running p95 | preemptions |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        print("\n".join(rows), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
