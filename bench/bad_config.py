"""Seconds from worker start to a job answered with the cause, for a wrong model reference or flag value.

A user who typed the model name or a vLLM setting wrong learns it only from a job's
answer, so that answer should come about as fast as a process can start: the target is
under 2 s from the worker's spawn (interpreter start included) to the job-done post.

Each case starts a Hub stand-in (tests/support/hub_stub.py) and a control-plane
stand-in (tests/support/control_plane.py) on 127.0.0.1, queues one job *before* the
worker starts (as the platform does on a cold start), spawns `python -m vllm_worker run`
with HF_ENDPOINT pointing at the stand-in, and takes the moment the control plane
received the job-done post. VLLM_COMMAND is the scripted `vllm` stand-in: it must never
be launched, and the bench checks that it was not.

Cases: a typo'd model id, a gated repository without a token, a MODEL_REVISION that
does not exist, and flag values vLLM 0.32 refuses (MAX_NUM_SEQS=abc, GPU_MEMORY_UTILIZATION=1.5,
DTYPE=float13, KV_CACHE_DTYPE=fp7, TENSOR_PARALLEL_SIZE=0), which the worker checks against
the flag table before launch instead of after vLLM's ~12 s import; a VLLM_COMMAND that
does not exist; and a failure no rule knows (the scripted engine prints a real vLLM line from
the field corpus, tests/field/startup_failures/neg_021, and exits 1: the only case where the
engine runs). Rounds alternate the cases so a warming page cache favours none.

    .venv/bin/python bench/bad_config.py [--rounds 5] [--importtime]

--importtime also prints the slowest imports of the worker (python -X importtime).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from tests.support import fake_vllm  # noqa: E402
from tests.support.control_plane import ControlPlane  # noqa: E402
from tests.support.hub_stub import HubStub  # noqa: E402
from tests.support.worker_proc import WorkerProcess  # noqa: E402

TARGET_S = 2.0
CASES: dict[str, dict[str, str]] = {
    "typo'd model id": {"MODEL_NAME": "org/pubilc"},
    "gated repo, no token": {"MODEL_NAME": "org/gated"},
    "bad MODEL_REVISION": {"MODEL_NAME": "org/public", "MODEL_REVISION": "no-such-rev"},
}
EXPECTED_WORDS = {"typo'd model id": "was not found", "gated repo, no token": "gated", "bad MODEL_REVISION": "does not exist"}
BAD_FLAG_VALUES = {
    "MAX_NUM_SEQS": "abc",
    "GPU_MEMORY_UTILIZATION": "1.5",
    "DTYPE": "float13",
    "KV_CACHE_DTYPE": "fp7",
    "TENSOR_PARALLEL_SIZE": "0",
}
for _name, _value in BAD_FLAG_VALUES.items():
    CASES[f"{_name}={_value}"] = {"MODEL_NAME": "org/public", _name: _value}
    EXPECTED_WORDS[f"{_name}={_value}"] = f"{_name}={_value!r} is not valid"
CASES["VLLM_COMMAND missing"] = {"MODEL_NAME": "org/public", "VLLM_COMMAND": "no-such-vllm serve"}
EXPECTED_WORDS["VLLM_COMMAND missing"] = "cannot be started"
UNKNOWN = "unknown engine failure"
CASES[UNKNOWN] = {"MODEL_NAME": "org/public"}
EXPECTED_WORDS[UNKNOWN] = "vLLM failed to start: TimeoutError: Timed out waiting for engines"
# Verbatim from tests/field/startup_failures/neg_021_timeout_engines_initial_message.log.
UNKNOWN_OUTPUT = "TimeoutError: Timed out waiting for engines to send initial message on input socket."


def one(case: str, hub: HubStub, root: Path) -> tuple[float, str]:
    """Seconds from spawn to the job-done post, and the answer."""
    state = root / "fake-vllm"
    launch = {"output": UNKNOWN_OUTPUT, "exit_code": 1} if case == UNKNOWN else {"serve": True}
    script = fake_vllm.write_script(root / "script.json", [launch])
    env = {
        "HF_ENDPOINT": hub.endpoint,
        "VLLM_COMMAND": fake_vllm.command(),
        "FAKE_VLLM_SCRIPT": str(script),
        "FAKE_VLLM_STATE_DIR": str(state),
        **CASES[case],
    }
    with ControlPlane() as cp:
        job = cp.submit({"prompt": "hi"})
        worker = WorkerProcess(env, control_plane=cp, workdir=root)
        start = time.monotonic()
        with worker:
            answer = cp.result(job, timeout=60)
        done = cp.requests("done")[0].at
    launched = len(fake_vllm.launches(state))
    if launched != (1 if case == UNKNOWN else 0):
        raise SystemExit(f"{case}: vLLM was launched {launched} times")
    error = answer.get("error", "")
    if EXPECTED_WORDS[case] not in error:
        raise SystemExit(f"{case}: unexpected answer {answer!r}")
    return done - start, error


def importtime() -> None:
    """The slowest cumulative imports of `python -m vllm_worker` (its modules and the SDK)."""
    code = "import vllm_worker.main, vllm_worker.serving.handler, vllm_worker.model.preflight, huggingface_hub, runpod"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", code], env=env, capture_output=True, text=True).stderr
    rows = []
    for line in out.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)", line)
        if m:
            rows.append((int(m.group(2)), len(m.group(3)) // 2, m.group(4)))
    print("slowest imports (cumulative, top level of each):")
    for cumulative, depth, name in sorted((r for r in rows if r[1] <= 1), reverse=True)[:8]:
        print(f"  {cumulative / 1e6:6.2f} s  {name}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--importtime", action="store_true")
    args = parser.parse_args()
    seconds: dict[str, list[float]] = {case: [] for case in CASES}
    with HubStub() as hub, tempfile.TemporaryDirectory(prefix="bench-bad-config-") as tmp:
        hub.add_repo("org/public", files={"config.json": "{}"}, branches=("main",))
        hub.add_repo("org/gated", files={"config.json": "{}"}, gated="manual")
        for r in range(args.rounds):
            for i, case in enumerate(CASES):
                root = Path(tmp) / f"r{r}-c{i}"
                root.mkdir()
                elapsed, error = one(case, hub, root)
                seconds[case].append(elapsed)
                print(f"round {r + 1} {case:29s} {elapsed:5.2f} s  -> {error[:70]}...", flush=True)
    print()
    worst = 0.0
    for case, values in seconds.items():
        median = statistics.median(values)
        worst = max(worst, median)
        print(f"{case:29s} median {median:5.2f} s (min {min(values):.2f}, max {max(values):.2f}); target < {TARGET_S:g} s"
              f" -> {'met' if median < TARGET_S else 'MISSED'}")
    if args.importtime:
        print()
        importtime()
    return 0


if __name__ == "__main__":
    sys.exit(main())
