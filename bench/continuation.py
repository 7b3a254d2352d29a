"""What continuing a job on the relaunched engine adds to its time, beyond the relaunch itself.

Boots the worker (runpod's job loop against the control-plane stand-in) on the real vLLM CPU
engine with the tiny model, runs one streamed completion of --tokens tokens at temperature 0
undisturbed, then the same job with the engine's process group SIGKILLed a third of the way
through. The relaunch is timed from the kill to the worker's "engine ready again" line; the
rest of the disturbed job's time is the job's own work plus what the continuation adds (the
death noticed, the longer prompt prefilled, the stream rejoined). Prints the three times and

    ratio = (disturbed - relaunch) / undisturbed     (1.00: the continuation adds nothing)

With --share it then runs the engine test's four jobs (completion and chat, streamed and plain,
600 tokens, temperature 0) undisturbed and with a kill, and prints how many of the four texts
are identical to the undisturbed run's; --model serves another model folder (SmolLM2:
.cache/smollm2-135m-instruct).

    flock /tmp/vllm-engine.lock .venv/bin/python bench/continuation.py [--tokens 600] [--rounds 1] [--share] [--model DIR]
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "src")]


from tests.support import engine_env  # noqa: E402
from tests.support.control_plane import ControlPlane  # noqa: E402
from tests.support.worker_proc import WorkerProcess, engine_leader, kill_engine_group  # noqa: E402


def generated(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(float(v) for v in re.findall(r"^vllm:generation_tokens_total(?:\{[^}]*\})? (\S+)$", text, re.M))


def kill_engine(worker: WorkerProcess) -> None:
    kill_engine_group(engine_leader(worker.pid))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--share", action="store_true", help="also the four jobs' share identical after a kill")
    parser.add_argument("--model", type=Path, default=None, help="a model folder (default: the built-in tiny Llama)")
    args = parser.parse_args()
    job = {
        "openai_route": "/v1/completions",
        "openai_input": {
            "prompt": "Once upon a time, in a land far away,",
            "max_tokens": args.tokens,
            "min_tokens": args.tokens,
            "temperature": 0,
            "stream": True,
        },
    }
    model = args.model.resolve() if args.model else engine_env.make_tiny_model()
    env = engine_env.tiny_worker_env(
        model, MAX_MODEL_LEN="2048", REQUEST_TIMEOUT="3600", WORKER_READY_TIMEOUT="600", MAX_CONCURRENCY="8",
        KV_CACHE_MEMORY_BYTES=str(256 << 20),
    )
    port = int(env["VLLM_PORT"])
    with ControlPlane() as cp:
        worker = WorkerProcess(env, control_plane=cp, workdir=Path(os.environ.get("TMPDIR", "/tmp"))).start()
        try:
            worker.wait_for_log(r"engine ready; taking jobs", timeout=engine_env.BOOT_TIMEOUT)
            for round_ in range(1, args.rounds + 1):
                started = time.monotonic()
                cp.result(cp.submit(job), timeout=600)
                undisturbed = time.monotonic() - started

                before = generated(port)
                started = time.monotonic()
                running_job = cp.submit(job)
                while generated(port) - before < args.tokens / 3:
                    time.sleep(0.02)
                readies = worker.log().count("engine ready again after restart")
                kill_engine(worker)
                killed = time.monotonic()
                ready_at: list[float] = []

                def watch() -> None:
                    while worker.log().count("engine ready again after restart") <= readies:
                        time.sleep(0.05)
                    ready_at.append(time.monotonic())

                watcher = threading.Thread(target=watch, daemon=True)
                watcher.start()
                result = cp.result(running_job, timeout=900)
                disturbed = time.monotonic() - started
                watcher.join(timeout=60)
                relaunch = ready_at[0] - killed
                assert "error" not in result, str(result)[:300]
                ratio = (disturbed - relaunch) / undisturbed
                print(
                    f"round {round_}: undisturbed {undisturbed:.2f} s; disturbed {disturbed:.2f} s, of which the "
                    f"relaunch {relaunch:.2f} s; the continuation adds {disturbed - relaunch - undisturbed:+.2f} s; "
                    f"ratio (disturbed - relaunch) / undisturbed = {ratio:.2f}"
                )
            if args.share:
                from tests.engine import test_continuation_real_engine as four

                base = four.run_round(cp, port)
                killed_round = four.run_round(cp, port, lambda: kill_engine(worker))
                same = [name for name in four.JOBS if killed_round[name]["text"] == base[name]["text"]]
                whole = [name for name in four.JOBS if killed_round[name]["usage"]["completion_tokens"] == four.TOKENS]
                print(
                    f"{model.name}: after a kill, {len(whole)}/4 complete whole; identical to the undisturbed run: "
                    f"{len(same)}/4 {same}"
                )
        finally:
            worker.stop(timeout=120)


if __name__ == "__main__":
    main()
