"""The relaunch ladder: every rule, on diagnoses of real-shaped engine output.

`launch_until_stop` drives `next_launch` the way the worker's start-up loop does:
apply the overrides to the user's environment, launch, diagnose the failure, ask
again. The launches' failures are scripted; the ladder itself is the real one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import pytest

from tests.support import vllm_texts as t
from vllm_worker.recovery import MAX_LAUNCHES, Attempt, Relaunch, Stop, next_launch
from vllm_worker.startup_errors import classify, diagnose

MODEL = "acme/m"
OOM = t.KV_TOO_SMALL_WITH_ESTIMATE
OOM_GRAPHS = t.TORCH_OOM


@dataclass
class Run:
    envs: list[dict[str, str]] = field(default_factory=list)
    relaunches: list[Relaunch] = field(default_factory=list)
    stop: Stop | None = None
    tried: list[str] = field(default_factory=list)


def launch_until_stop(base_env: Mapping[str, str], failures: Sequence[str], max_concurrency: int = 30) -> Run:
    """Launch with `base_env`; launch i fails with failures[i]; follow the ladder until it stops."""
    run = Run()
    env = dict(base_env)
    attempts: list[Attempt] = []
    for output in failures:
        run.envs.append(dict(env))
        diagnosis = diagnose(output, env.get("MODEL_NAME"), env=env, tried=run.tried)
        attempts.append(Attempt(env=dict(env), diagnosis=diagnosis))
        step = next_launch(base_env, attempts, max_concurrency)
        if isinstance(step, Stop):
            run.stop = step
            return run
        run.relaunches.append(step)
        run.tried.append(step.tried_phrase)
        env = dict(base_env)
        for name, value in step.overrides.items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
    return run


def one(base_env: Mapping[str, str], output: str, max_concurrency: int = 30) -> Relaunch | Stop:
    diagnosis = diagnose(output, MODEL, env=base_env)
    return next_launch(base_env, [Attempt(env=dict(base_env), diagnosis=diagnosis)], max_concurrency)


BASE = {"MODEL_NAME": MODEL}


# --- memory shortfall -------------------------------------------------------------------


def test_first_oom_lowers_max_num_seqs_and_keeps_graphs() -> None:
    step = one({**BASE, "MAX_NUM_SEQS": "256"}, OOM)
    assert isinstance(step, Relaunch)
    assert step.overrides == {"MAX_NUM_SEQS": "32"}
    assert step.profile == "max_num_seqs=32"
    assert step.tried_phrase == "relaunched with MAX_NUM_SEQS=32"
    assert not step.wait_for_memory and step.warnings == []


def test_step_one_uses_the_smallest_multiple_of_8_at_or_above_concurrency() -> None:
    step = one({**BASE, "MAX_NUM_SEQS": "256"}, OOM, max_concurrency=41)
    assert isinstance(step, Relaunch) and step.overrides == {"MAX_NUM_SEQS": "48"}


def test_second_oom_goes_eager_with_at_most_8192_batched_tokens() -> None:
    run = launch_until_stop({**BASE, "MAX_NUM_SEQS": "256"}, [OOM, OOM])
    assert [r.profile for r in run.relaunches] == ["max_num_seqs=32", "eager"]
    eager = run.relaunches[1]
    assert eager.overrides == {"MAX_NUM_SEQS": "32", "ENFORCE_EAGER": "true", "MAX_NUM_BATCHED_TOKENS": "8192"}
    assert eager.tried_phrase == "relaunched with ENFORCE_EAGER=true and MAX_NUM_BATCHED_TOKENS=8192"


def test_never_a_fourth_launch() -> None:
    run = launch_until_stop({**BASE, "MAX_NUM_SEQS": "256"}, [OOM, OOM, OOM, OOM])
    assert len(run.envs) == MAX_LAUNCHES == 3
    assert run.stop is not None


@pytest.mark.parametrize("max_launches", [1, 2])
def test_a_smaller_budget_is_respected(max_launches: int) -> None:
    env = {**BASE, "MAX_NUM_SEQS": "256"}
    attempts = [Attempt(env=env, diagnosis=diagnose(OOM, MODEL))] * max_launches
    assert isinstance(next_launch(env, attempts, 30, max_launches=max_launches), Stop)


def test_worker_default_max_num_seqs_skips_step_one() -> None:
    # MAX_NUM_SEQS unset: the worker already passes MAX_CONCURRENCY rounded up to 8.
    step = one(BASE, OOM)
    assert isinstance(step, Relaunch) and step.profile == "eager"
    assert "MAX_NUM_SEQS" not in step.overrides


@pytest.mark.parametrize("value", ["32", "16", "0", ""])
def test_step_one_skipped_when_max_num_seqs_is_already_small_or_unset(value: str) -> None:
    step = one({**BASE, "MAX_NUM_SEQS": value}, OOM)
    assert isinstance(step, Relaunch) and step.profile == "eager"
    assert "MAX_NUM_SEQS" not in step.overrides


def test_explicit_enforce_eager_false_is_overridden_loudly() -> None:
    step = one({**BASE, "ENFORCE_EAGER": "false"}, OOM)
    assert isinstance(step, Relaunch)
    assert step.overrides["ENFORCE_EAGER"] == "true"
    assert any("ENFORCE_EAGER=false" in warning and "OVERRIDDEN" in warning for warning in step.warnings)


def test_a_tighter_batched_tokens_value_is_kept() -> None:
    step = one({**BASE, "MAX_NUM_BATCHED_TOKENS": "4096"}, OOM)
    assert isinstance(step, Relaunch)
    assert step.overrides == {"ENFORCE_EAGER": "true"}
    assert "MAX_NUM_BATCHED_TOKENS=4096 kept" in step.reason
    assert step.tried_phrase == "relaunched with ENFORCE_EAGER=true"


@pytest.mark.parametrize("value,expected", [("0", "8192"), ("16384", "8192"), ("8193", "8192")])
def test_looser_or_zero_batched_tokens_are_capped(value: str, expected: str) -> None:
    step = one({**BASE, "MAX_NUM_BATCHED_TOKENS": value}, OOM)
    assert isinstance(step, Relaunch) and step.overrides["MAX_NUM_BATCHED_TOKENS"] == expected


def test_a_step_whose_knobs_are_all_there_is_skipped() -> None:
    # Step 1 applies; step 2 would change nothing (eager already on, budget already tight).
    env = {**BASE, "MAX_NUM_SEQS": "256", "ENFORCE_EAGER": "true", "MAX_NUM_BATCHED_TOKENS": "8192"}
    run = launch_until_stop(env, [OOM, OOM])
    assert [r.profile for r in run.relaunches] == ["max_num_seqs=32"]
    assert run.stop is not None and len(run.envs) == 2


def test_no_relaunch_when_no_step_can_change_anything() -> None:
    env = {**BASE, "ENFORCE_EAGER": "true", "MAX_NUM_BATCHED_TOKENS": "2048"}
    step = one(env, OOM)
    assert isinstance(step, Stop)


def test_knobs_set_in_vllm_extra_args_are_left_alone() -> None:
    env = {**BASE, "MAX_NUM_SEQS": "256", "VLLM_EXTRA_ARGS": "--max-num-seqs 256"}
    step = one(env, OOM)
    assert isinstance(step, Relaunch) and step.profile == "eager"


def test_weights_that_do_not_fit_are_not_relaunched() -> None:
    assert isinstance(one({**BASE, "MAX_NUM_SEQS": "256"}, t.TORCH_OOM_AT_LOAD), Stop)


@pytest.mark.parametrize("text", [OOM, OOM_GRAPHS, t.NO_CACHE_BLOCKS, t.CANNOT_AUTO_FIT, t.SAMPLER_WARMUP_OOM])
def test_max_model_len_is_never_an_override(text: str) -> None:
    env = {**BASE, "MAX_MODEL_LEN": "131072", "MAX_NUM_SEQS": "256", "MODEL_REVISION": "abc"}
    run = launch_until_stop(env, [text, text, text])
    assert len(run.relaunches) == 2
    for relaunch in run.relaunches:
        assert "MAX_MODEL_LEN" not in relaunch.overrides
    assert all(launched["MAX_MODEL_LEN"] == "131072" for launched in run.envs)


def test_final_message_says_what_ran_and_omits_applied_knobs() -> None:
    env = {**BASE, "MAX_NUM_SEQS": "256"}
    run = launch_until_stop(env, [OOM, OOM, OOM])
    assert run.tried == [
        "relaunched with MAX_NUM_SEQS=32",
        "relaunched with ENFORCE_EAGER=true and MAX_NUM_BATCHED_TOKENS=8192",
    ]
    final_env = run.envs[-1]
    message = classify(OOM, MODEL, env=final_env, tried=run.tried)
    assert message is not None
    assert "Already tried: relaunched with MAX_NUM_SEQS=32; relaunched with ENFORCE_EAGER=true" in message
    assert "set ENFORCE_EAGER" not in message and "set MAX_NUM_SEQS" not in message
    assert "set MAX_MODEL_LEN <= 77392" in message


# --- revision ---------------------------------------------------------------------------


def test_vanished_revision_relaunches_once_unpinned() -> None:
    env = {**BASE, "MODEL_REVISION": "abc123", "TOKENIZER_REVISION": "def456", "CODE_REVISION": "0ff1ce"}
    step = one(env, t.REVISION_NOT_FOUND)
    assert isinstance(step, Relaunch)
    assert step.profile == "revision_unpinned"
    assert step.overrides == {"MODEL_REVISION": None, "TOKENIZER_REVISION": None, "CODE_REVISION": None}
    assert any("MODEL_REVISION='abc123'" in warning for warning in step.warnings)


def test_revision_relaunch_is_used_once() -> None:
    run = launch_until_stop({**BASE, "MODEL_REVISION": "abc123"}, [t.REVISION_NOT_FOUND, t.REVISION_NOT_FOUND])
    assert [r.profile for r in run.relaunches] == ["revision_unpinned"]
    assert "MODEL_REVISION" not in run.envs[1]
    assert run.stop is not None


def test_revision_and_memory_budgets_compose_within_three_launches() -> None:
    env = {**BASE, "MODEL_REVISION": "abc123", "MAX_NUM_SEQS": "256"}
    run = launch_until_stop(env, [t.REVISION_NOT_FOUND, OOM, OOM, OOM])
    assert [r.profile for r in run.relaunches] == ["revision_unpinned", "max_num_seqs=32"]
    assert run.relaunches[1].overrides == {"MODEL_REVISION": None, "MAX_NUM_SEQS": "32"}
    assert "MODEL_REVISION" not in run.envs[2] and run.envs[2]["MAX_NUM_SEQS"] == "32"
    assert len(run.envs) == 3 and run.stop is not None


# --- memory held / race -------------------------------------------------------------------


def test_memory_held_relaunches_the_same_configuration_after_waiting() -> None:
    env = {**BASE, "MAX_NUM_SEQS": "256", "GPU_MEMORY_UTILIZATION": "0.95"}
    step = one(env, t.FREE_MEMORY_LESS_THAN_DESIRED)
    assert isinstance(step, Relaunch)
    assert step.profile == "same" and step.wait_for_memory
    assert step.overrides == {}


def test_memory_held_keeps_earlier_overrides_and_adds_none() -> None:
    run = launch_until_stop({**BASE, "MAX_NUM_SEQS": "256"}, [OOM, t.FREE_MEMORY_LESS_THAN_DESIRED])
    assert [r.profile for r in run.relaunches] == ["max_num_seqs=32", "same"]
    assert run.relaunches[1].overrides == run.relaunches[0].overrides


def test_memory_held_twice_stops() -> None:
    held = t.FREE_MEMORY_LESS_THAN_DESIRED
    run = launch_until_stop(BASE, [held, held, held])
    assert [r.profile for r in run.relaunches] == ["same"] and run.stop is not None


def test_memory_held_then_oom_still_gets_a_memory_step() -> None:
    run = launch_until_stop({**BASE, "MAX_NUM_SEQS": "256"}, [t.FREE_MEMORY_LESS_THAN_DESIRED, OOM, OOM])
    assert [r.profile for r in run.relaunches] == ["same", "max_num_seqs=32"]
    assert len(run.envs) == 3


def test_profiling_race_relaunches_the_same_configuration_once() -> None:
    run = launch_until_stop(BASE, [t.PROFILING_RACE, t.PROFILING_RACE])
    assert [(r.profile, r.overrides) for r in run.relaunches] == [("same", {})]
    assert run.stop is not None


# --- everything else stops -------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        t.GATED_REPO,
        t.REPO_NOT_FOUND,
        t.UNAUTHORIZED,
        t.MAX_MODEL_LEN_TOO_LARGE,
        t.ARGPARSE_INVALID_INT,
        t.UNSUPPORTED_ARCHITECTURE,
        t.TRUST_REMOTE_CODE,
        t.DISK_FULL,
        t.UNKNOWN_FAILURE,
    ],
)
def test_causes_a_relaunch_cannot_fix_stop(text: str) -> None:
    assert isinstance(one({**BASE, "MAX_NUM_SEQS": "256", "MODEL_REVISION": "abc"}, text), Stop)


def test_next_launch_needs_an_attempt() -> None:
    with pytest.raises(ValueError):
        next_launch(BASE, [], 30)
