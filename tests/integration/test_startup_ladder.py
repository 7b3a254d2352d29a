"""The relaunch ladder as a user meets it: the worker as a process, its engine failing on start.

Out-of-memory and memory-held failures only happen on a GPU, so the engine here is
the scripted stand-in (tests/support/fake_vllm.py) printing vLLM 0.32's own wordings
(tests/support/vllm_texts.py); everything else is real: `python -m vllm_worker run`,
the runpod SDK job loop against a control-plane stand-in, and the answers a client
reads. tests/integration/test_worker_process.py already covers OOM, OOM, success
(the step 2 command line) and memory held twice (same command line, answered with the
diagnosis); these tests cover the rest of the ladder:

- step 1 alone fits: fewer sequences, CUDA graphs kept, and the relaxed profile is
  visible in JSON answers, in streams, and to a status job;
- step 2 overrides an explicit ENFORCE_EAGER=false, loudly;
- never a fourth launch, and the final answer names what was tried and only the
  fixes that remain;
- a vanished revision and a memory shortfall share the same three launches;
- "Cannot auto-fit max_model_len" is a memory shortfall;
- memory held by another process is never answered with a smaller footprint;
- an explicit MAX_MODEL_LEN is never lowered.

Expected sentences are computed with the pure functions the worker uses
(`startup_errors.diagnose` over the same text, the real `ladder.Ladder` for what was
tried), so these tests pin the wiring, not the wording.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import pytest

from tests.support import vllm_texts
from tests.support.control_plane import ControlPlane
from tests.support.fake_engine import FakeEngine
from tests.support.worker_proc import WorkerProcess
from vllm_worker.diagnosis import verdict
from vllm_worker.diagnosis.verdict import Failure, Tried
from vllm_worker.config.profile import LaunchProfile
from vllm_worker.engine import ladder
from vllm_worker.diagnosis import startup_errors
from vllm_worker.config.settings import multiple_of_8_at_least

pytestmark = pytest.mark.integration

MODEL = "acme/tiny-chat"
JOB_TIMEOUT = 120.0
MESSAGES = [{"role": "user", "content": "Say two words."}]
CHAT = {"messages": MESSAGES, "sampling_params": {"max_tokens": 2}}
STATUS = {"route": "/worker/status"}
SEQS_30 = str(multiple_of_8_at_least(30))  # step 1's MAX_NUM_SEQS for MAX_CONCURRENCY=30
EAGER_TOKENS = str(verdict.EAGER_MAX_BATCHED_TOKENS)


# ----------------------------------------------------------------------------- helpers


def worker_env(engine: FakeEngine, **extra: str) -> dict[str, str]:
    # HF_HUB_OFFLINE=1: no Hub pre-flight (there is no Hub stand-in in this module).
    return {"HF_HUB_OFFLINE": "1", "MODEL_NAME": MODEL, **engine.env(), **extra}


def flags(argv: Sequence[str]) -> dict[str, str]:
    """`--flag value` / bare `--flag` -> {"--flag": "value" or ""}; the model and VLLM_COMMAND words dropped."""
    found: dict[str, str] = {}
    words = list(argv)
    for i, word in enumerate(words):
        if not word.startswith("--"):
            continue
        name, eq, value = word.partition("=")
        if eq:
            found[name] = value
        elif i + 1 < len(words) and not words[i + 1].startswith("--"):
            found[name] = words[i + 1]
        else:
            found[name] = ""
    return found


def changed(before: Sequence[str], after: Sequence[str]) -> dict[str, tuple[str | None, str | None]]:
    """flag -> (value before, value after) for every flag a relaunch added, removed or changed."""
    a, b = flags(before), flags(after)
    return {name: (a.get(name), b.get(name)) for name in sorted(set(a) | set(b)) if a.get(name) != b.get(name)}


def expected_answer(
    texts: Sequence[str], base_env: Mapping[str, str]
) -> tuple[str, list[ladder.Relaunch]]:
    """The sentence the worker must answer with after launches failing with `texts`, and the relaunches.

    Replays what the worker does, with the same pure functions: diagnose each failure
    with what was tried so far, ask the ladder for the next launch, apply its overrides.
    """
    climb = ladder.Ladder(LaunchProfile.parse(base_env))
    profile = climb.start_on(None)
    relaunches: list[ladder.Relaunch] = []
    tried: list[Tried] = []
    for text in texts:
        env = dict(profile.env)
        diagnosis = startup_errors.diagnose(Failure.of(text, env.get("MODEL_NAME"), revision=env.get("MODEL_REVISION"), exit_code=1, env=env, tried=tried))
        assert diagnosis is not None, "the scripted text must be one the worker recognises"
        step = climb.after_failure(profile, diagnosis)
        if isinstance(step, ladder.Stop):
            return diagnosis.message, relaunches
        relaunches.append(step)
        tried.append(step.tried)
        profile = climb.profile
    raise AssertionError(f"the ladder would launch again after {len(texts)} failures")


def assert_plain_sentence(result: dict[str, Any], expected: str) -> None:
    """The job-done body is exactly {"error": sentence}: a string, not a repr of a dict or list."""
    assert result == {"error": expected}
    error = result["error"]
    assert isinstance(error, str)
    assert not error.startswith(("{", "[", "(", "'")) and "Traceback" not in error and "\n" not in error


def run_to_answers(
    cp: ControlPlane, tmp_path: Path, launches: Sequence[dict[str, Any]], jobs: Sequence[Any], **env: str
) -> tuple[list[dict[str, Any]], FakeEngine, WorkerProcess]:
    """Start a worker on a scripted engine, submit `jobs`, return their job-done bodies."""
    engine = FakeEngine(tmp_path, launches)
    try:
        with WorkerProcess(worker_env(engine, **env), control_plane=cp, workdir=tmp_path) as worker:
            ids = [cp.submit(job) for job in jobs]
            results = [cp.result(job_id, timeout=JOB_TIMEOUT) for job_id in ids]
    finally:
        engine.kill_leftovers()
    return results, engine, worker


@pytest.fixture
def cp() -> Iterator[ControlPlane]:
    with ControlPlane() as plane:
        yield plane


# ----------------------------------------------------------------------------- step 1 fits: degraded but fast


class Step1:
    """One worker whose first launch runs out of memory and whose second (step 1) serves."""

    def __init__(self, cp: ControlPlane, worker: WorkerProcess, engine: FakeEngine) -> None:
        self.cp, self.worker, self.engine = cp, worker, engine

    def ask(self, job: Any) -> dict[str, Any]:
        return self.cp.result(self.cp.submit(job), timeout=JOB_TIMEOUT)


STEP1_ENV = {"MAX_CONCURRENCY": "30", "MAX_NUM_SEQS": "256", "MAX_MODEL_LEN": "16384"}


@pytest.fixture(scope="module")
def step1(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Step1]:
    root = tmp_path_factory.mktemp("ladder-step1")
    engine = FakeEngine(root, [{"text": "TORCH_OOM"}, {"serve": True}])
    try:
        with ControlPlane() as plane, WorkerProcess(worker_env(engine, **STEP1_ENV), control_plane=plane, workdir=root) as worker:
            yield Step1(plane, worker, engine)
    finally:
        engine.kill_leftovers()


def test_step_1_relaunches_with_fewer_sequences_and_keeps_cuda_graphs(step1: Step1) -> None:
    [completion] = step1.ask(CHAT)["output"]  # the engine serves: the relaunch is finished
    first, second = step1.engine.argvs()

    assert flags(first)["--max-num-seqs"] == "256"
    # Only MAX_NUM_SEQS changes: no eager mode, no batched-token cap, same context length.
    assert changed(first, second) == {"--max-num-seqs": ("256", SEQS_30)}
    assert "--enforce-eager" not in second and "--max-num-batched-tokens" not in second
    assert completion["choices"][0]["message"]["content"] == "w0 w1"


def test_a_json_answer_on_a_relaxed_profile_names_the_profile_and_why(step1: Step1) -> None:
    [completion] = step1.ask(CHAT)["output"]

    notice = completion["worker"]
    assert notice["degraded"] is True
    profile = notice["profile"]
    assert profile["name"] == f"max_num_seqs={SEQS_30}"
    assert profile["overrides"] == {"MAX_NUM_SEQS": SEQS_30}
    # Why: the value that failed and the one now used.
    assert "MAX_NUM_SEQS=256" in profile["reason"] and f"MAX_NUM_SEQS={SEQS_30}" in profile["reason"]
    # The engine's own answer is intact beside the notice.
    assert completion["object"] == "chat.completion"


def test_a_stream_on_a_relaxed_profile_starts_with_the_worker_comment(step1: Step1) -> None:
    job = step1.cp.submit({**CHAT, "stream": True})
    chunks = step1.cp.result(job, timeout=JOB_TIMEOUT)["output"]

    first = chunks[0]
    assert first.startswith(": worker ") and first.endswith("\n\n")
    # An SSE comment: OpenAI clients skip it; one JSON object, the same notice as in JSON answers.
    notice = json.loads(first[len(": worker ") :])
    assert notice["degraded"] is True and notice["profile"]["name"] == f"max_num_seqs={SEQS_30}"
    assert "".join(chunks).rstrip().endswith("data: [DONE]")
    # A /stream client sees the same first part.
    assert step1.cp.stream_outputs(job)[0] == first


def test_the_status_job_reports_launches_profile_and_causes(step1: Step1) -> None:
    [status] = step1.ask(STATUS)["output"]

    launches = status["launches"]
    assert [(l["launch"], l["outcome"]) for l in launches] == [(1, "failed"), (2, "ready")]
    assert launches[0]["cause"] == "memory_shortfall" and launches[0]["profile"] == "as configured"
    assert launches[1]["profile"] == f"max_num_seqs={SEQS_30}"
    assert launches[1]["overrides"] == {"MAX_NUM_SEQS": SEQS_30}
    assert status["causes"] == ["memory_shortfall"]
    assert status["profile"]["name"] == f"max_num_seqs={SEQS_30}"
    assert (status["ready"], status["fatal"]) == (True, None)
    # A status job is an answer, not a failure.
    assert "error" not in status


def test_the_relaunch_is_logged_with_its_reason(step1: Step1) -> None:
    step1.ask(STATUS)  # startup is over
    log = step1.worker.log()
    assert f"relaunching (max_num_seqs={SEQS_30})" in log
    assert "launch 1 failed:" in log and "launch 2:" in log


# ----------------------------------------------------------------------------- step 2 overrides ENFORCE_EAGER=false


def test_an_explicit_enforce_eager_false_is_overridden_at_step_2_loudly(cp: ControlPlane, tmp_path: Path) -> None:
    launches = [{"text": "TORCH_OOM"}, {"text": "CUDA_ERROR_OOM"}, {"serve": True}]
    # A batch budget above the cap is lowered to it at step 2 (an unset one is left to vLLM:
    # tests/integration/test_worker_process.py).
    env = {"MAX_CONCURRENCY": "30", "MAX_NUM_SEQS": "256", "ENFORCE_EAGER": "false", "MAX_NUM_BATCHED_TOKENS": "16384"}
    (result, status), engine, worker = run_to_answers(cp, tmp_path, launches, [CHAT, STATUS], **env)

    first, second, third = engine.argvs()
    assert flags(first)["--no-enforce-eager"] == ""
    assert changed(first, second) == {"--max-num-seqs": ("256", SEQS_30)}
    assert changed(second, third) == {
        "--no-enforce-eager": ("", None),
        "--enforce-eager": (None, ""),
        "--max-num-batched-tokens": ("16384", EAGER_TOKENS),
    }
    # Loud: a WARNING line of its own that names the variable and the value the user set.
    warnings = [line for line in worker.log().splitlines() if "WARNING" in line and "ENFORCE_EAGER=false" in line]
    assert len(warnings) == 1 and "OVERRIDDEN" in warnings[0]
    # Served, on the eager profile, and said so.
    [completion] = result["output"]
    assert completion["worker"]["profile"]["name"] == "eager"
    assert completion["worker"]["profile"]["overrides"] == {
        "MAX_NUM_SEQS": SEQS_30,
        "ENFORCE_EAGER": "true",
        "MAX_NUM_BATCHED_TOKENS": EAGER_TOKENS,
    }
    [report] = status["output"]
    assert report["causes"] == ["memory_shortfall", "memory_shortfall"]
    assert [l["profile"] for l in report["launches"]] == ["as configured", f"max_num_seqs={SEQS_30}", "eager"]


# ----------------------------------------------------------------------------- the budget: three launches


def test_out_of_memory_three_times_is_never_launched_a_fourth_time(cp: ControlPlane, tmp_path: Path) -> None:
    env = {"MAX_CONCURRENCY": "30", "MAX_NUM_SEQS": "256"}
    results, engine, worker = run_to_answers(cp, tmp_path, [{"text": "TORCH_OOM"}], [CHAT, {"prompt": "hi"}], **env)

    # Jobs are answered only once startup has given up, so this count is final.
    assert len(engine.argvs()) == 3
    base = dict(worker.env)
    expected, relaunches = expected_answer([vllm_texts.TORCH_OOM] * 3, base)
    assert [r.profile for r in relaunches] == [f"max_num_seqs={SEQS_30}", "eager"]
    for result in results:
        assert_plain_sentence(result, expected)
    # What was already tried is said, in order...
    assert f"relaunched with MAX_NUM_SEQS={SEQS_30}" in expected
    assert expected.index(f"MAX_NUM_SEQS={SEQS_30}") < expected.index("ENFORCE_EAGER=true")
    # ...and only what remains is offered: never a knob the worker already turned.
    fixes = expected.split("To fix:", 1)[1]
    assert "ENFORCE_EAGER" not in fixes and "MAX_NUM_SEQS" not in fixes and "MAX_NUM_BATCHED_TOKENS" not in fixes
    assert "GPU" in fixes


def test_an_explicit_max_model_len_is_never_lowered_even_when_a_shorter_one_would_fit(
    cp: ControlPlane, tmp_path: Path
) -> None:
    # vLLM says the 131072-token context does not fit and that about 77392 would.
    env = {"MAX_CONCURRENCY": "30", "MAX_NUM_SEQS": "256", "MAX_MODEL_LEN": "131072"}
    [result], engine, worker = run_to_answers(cp, tmp_path, [{"text": "KV_TOO_SMALL_WITH_ESTIMATE"}], [CHAT], **env)

    argvs = engine.argvs()
    assert len(argvs) == 3
    assert [flags(argv)["--max-model-len"] for argv in argvs] == ["131072"] * 3
    assert all("--max-model-len" not in changed(a, b) for a, b in zip(argvs, argvs[1:]))
    expected, _ = expected_answer([vllm_texts.KV_TOO_SMALL_WITH_ESTIMATE] * 3, dict(worker.env))
    assert_plain_sentence(result, expected)
    # The length that fits is offered to the user instead.
    assert "MAX_MODEL_LEN <= 77392" in expected


# ----------------------------------------------------------------------------- revision + memory share the budget


REVISION = "0123456789abcdef0123456789abcdef01234567"  # the commit vllm_texts.REVISION_NOT_FOUND names


@pytest.mark.parametrize("third", ["serves", "runs out of memory"])
def test_a_vanished_revision_and_a_memory_shortfall_fit_in_three_launches(
    cp: ControlPlane, tmp_path: Path, third: str
) -> None:
    launches = [
        {"text": "REVISION_NOT_FOUND"},
        {"text": "TORCH_OOM"},
        {"serve": True} if third == "serves" else {"text": "TORCH_OOM"},
    ]
    env = {"MODEL_NAME": "acme/gone-model", "MODEL_REVISION": REVISION, "MAX_CONCURRENCY": "30", "MAX_NUM_SEQS": "256"}
    [result, status], engine, worker = run_to_answers(cp, tmp_path, launches, [CHAT, STATUS], **env)

    first, second, third_argv = engine.argvs()
    assert flags(first)["--revision"] == REVISION
    assert changed(first, second) == {"--revision": (REVISION, None)}
    assert changed(second, third_argv) == {"--max-num-seqs": ("256", SEQS_30)}
    assert "MODEL_REVISION" in worker.log() and "no longer exists on the Hub" in worker.log()
    [report] = status["output"]
    assert report["causes"][:2] == ["revision_not_found", "memory_shortfall"]

    if third == "serves":
        [completion] = result["output"]
        profile = completion["worker"]["profile"]
        assert profile["name"] == f"max_num_seqs={SEQS_30}"
        # Both relaxations are in force, and both are said.
        assert profile["overrides"] == {"MODEL_REVISION": None, "MAX_NUM_SEQS": SEQS_30}
        assert profile["tried"] == ["relaunched without MODEL_REVISION", f"relaunched with MAX_NUM_SEQS={SEQS_30}"]
    else:
        texts = [vllm_texts.REVISION_NOT_FOUND, vllm_texts.TORCH_OOM, vllm_texts.TORCH_OOM]
        expected, _ = expected_answer(texts, dict(worker.env))
        assert_plain_sentence(result, expected)
        assert "relaunched without MODEL_REVISION" in expected
        assert f"relaunched with MAX_NUM_SEQS={SEQS_30}" in expected
        # The budget ran out before eager mode was tried: that fix remains, the tried one does not.
        fixes = expected.split("To fix:", 1)[1]
        assert "ENFORCE_EAGER=true" in fixes and "MAX_NUM_SEQS" not in fixes
        assert report["causes"] == ["revision_not_found", "memory_shortfall", "memory_shortfall"]
        assert report["fatal"] == expected


# ----------------------------------------------------------------------------- auto-fit


def test_cannot_auto_fit_max_model_len_is_a_memory_shortfall_and_relaunched(cp: ControlPlane, tmp_path: Path) -> None:
    env = {"MAX_CONCURRENCY": "30", "MAX_NUM_SEQS": "256", "MAX_MODEL_LEN": "auto"}
    [result, status], engine, worker = run_to_answers(
        cp, tmp_path, [{"text": "CANNOT_AUTO_FIT"}, {"serve": True}], [CHAT, STATUS], **env
    )

    first, second = engine.argvs()
    assert changed(first, second) == {"--max-num-seqs": ("256", SEQS_30)}
    assert flags(second)["--max-model-len"] == "auto"
    [report] = status["output"]
    assert report["causes"] == ["memory_shortfall"]
    [completion] = result["output"]
    assert completion["worker"]["profile"]["name"] == f"max_num_seqs={SEQS_30}"


# ----------------------------------------------------------------------------- memory held by someone else


def test_memory_held_relaunches_the_same_configuration_and_serves_undegraded(cp: ControlPlane, tmp_path: Path) -> None:
    # MAX_NUM_SEQS=256 is what step 1 would lower: held memory must not be mistaken for a shortfall.
    env = {"MAX_CONCURRENCY": "30", "MAX_NUM_SEQS": "256"}
    [result, status], engine, worker = run_to_answers(
        cp, tmp_path, [{"text": "FREE_MEMORY_LESS_THAN_DESIRED"}, {"serve": True}], [CHAT, STATUS], **env
    )

    first, second = engine.argvs()
    assert second == first
    [completion] = result["output"]
    # Same configuration: nothing is relaxed, so nothing is announced.
    assert "worker" not in completion
    [report] = status["output"]
    assert report["causes"] == ["memory_held"]
    assert report["profile"] == "as configured"
    assert [l["outcome"] for l in report["launches"]] == ["failed", "ready"]


def test_memory_held_twice_is_answered_without_sending_the_reader_to_gpu_memory_utilization(
    cp: ControlPlane, tmp_path: Path
) -> None:
    # vLLM's own text says "Decrease GPU memory utilization": the worker's sentence must not relay it.
    # WORKER_REFRESH_LIMIT=0: no fresh-worker sentence after the cause (tests/integration/test_fresh_worker.py has it).
    env = {"MAX_CONCURRENCY": "30", "MAX_NUM_SEQS": "256", "GPU_MEMORY_UTILIZATION": "0.92", "WORKER_REFRESH_LIMIT": "0"}
    results, engine, worker = run_to_answers(
        cp, tmp_path, [{"text": "FREE_MEMORY_LESS_THAN_BUDGET"}], [CHAT, {"prompt": "hi"}], **env
    )

    argvs = engine.argvs()
    assert argvs == [argvs[0]] * 2
    assert flags(argvs[0])["--max-num-seqs"] == "256"
    expected, relaunches = expected_answer([vllm_texts.FREE_MEMORY_LESS_THAN_BUDGET] * 2, dict(worker.env))
    assert [r.profile for r in relaunches] == ["same"]
    for result in results:
        assert_plain_sentence(result, expected)
    lowered = expected.lower()
    assert "gpu_memory_utilization" not in lowered and "gpu memory utilization" not in lowered
    assert "max_num_seqs" not in lowered and "enforce_eager" not in lowered
    assert "held by another process" in expected
