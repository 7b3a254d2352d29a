"""The relaunch ladder: every rule, on diagnoses of real-shaped engine output.

`launch_until_stop` drives the real `Ladder` the way the worker's start-up loop does:
launch its profile, diagnose the failure, ask it again. The launches' failures are scripted; the ladder itself is the real one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import pytest

from tests.support import vllm_texts as t
from vllm_worker.diagnosis.verdict import Failure, Tried
from vllm_worker.config.profile import LaunchProfile, ProfileChange
from vllm_worker.diagnosis.verdict import Diagnosis
from vllm_worker.engine.ladder import MAX_LAUNCHES, Attempt, Ladder, Relaunch, Stop, next_launch
from vllm_worker.diagnosis.startup_errors import classify, diagnose

MODEL = "acme/m"
OOM = t.KV_TOO_SMALL_WITH_ESTIMATE
OOM_GRAPHS = t.TORCH_OOM


@dataclass
class Run:
    envs: list[dict[str, str]] = field(default_factory=list)
    relaunches: list[Relaunch] = field(default_factory=list)
    stop: Stop | None = None
    tried: list[Tried] = field(default_factory=list)


def launch_until_stop(base_env: Mapping[str, str], failures: Sequence[str]) -> Run:
    """Launch with `base_env`; launch i fails with failures[i]; follow the real `Ladder` until it stops."""
    run = Run()
    climb = Ladder(LaunchProfile.parse(base_env))
    profile = climb.start_on(None)
    for output in failures:
        env = dict(profile.env)
        run.envs.append(env)
        diagnosis = diagnose(Failure.of(output, env.get("MODEL_NAME"), env=env, tried=run.tried))
        step = climb.after_failure(profile, diagnosis)
        if isinstance(step, Stop):
            run.stop = step
            return run
        run.relaunches.append(step)
        run.tried.append(step.tried)
        profile = climb.profile
    return run


def one(base_env: Mapping[str, str], output: str) -> Relaunch | Stop:
    diagnosis = diagnose(Failure.of(output, MODEL, env=base_env))
    return next_launch(base_env, [Attempt(env=dict(base_env), diagnosis=diagnosis)])


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
    step = one({**BASE, "MAX_NUM_SEQS": "256", "MAX_CONCURRENCY": "41"}, OOM)
    assert isinstance(step, Relaunch) and step.overrides == {"MAX_NUM_SEQS": "48"}


def test_second_oom_goes_eager_and_caps_a_larger_batched_tokens_value_at_8192() -> None:
    run = launch_until_stop({**BASE, "MAX_NUM_SEQS": "256", "MAX_NUM_BATCHED_TOKENS": "16384"}, [OOM, OOM])
    assert [r.profile for r in run.relaunches] == ["max_num_seqs=32", "eager"]
    eager = run.relaunches[1]
    assert eager.overrides == {"MAX_NUM_SEQS": "32", "ENFORCE_EAGER": "true", "MAX_NUM_BATCHED_TOKENS": "8192"}
    assert eager.tried_phrase == "relaunched with ENFORCE_EAGER=true and MAX_NUM_BATCHED_TOKENS=8192"


def test_second_oom_goes_eager_and_leaves_unset_batched_tokens_to_vllm() -> None:
    # Unset, vLLM's default is 2048 on most cards: setting 8192 would raise the activation memory.
    run = launch_until_stop({**BASE, "MAX_NUM_SEQS": "256"}, [OOM, OOM])
    assert [r.profile for r in run.relaunches] == ["max_num_seqs=32", "eager"]
    eager = run.relaunches[1]
    assert eager.overrides == {"MAX_NUM_SEQS": "32", "ENFORCE_EAGER": "true"}
    assert eager.tried_phrase == "relaunched with ENFORCE_EAGER=true"
    assert "MAX_NUM_BATCHED_TOKENS left to vLLM's default" in eager.reason


GiB = 2**30


@pytest.mark.parametrize(
    "device_total_bytes,capped",
    [
        (None, False),  # unknown card: leave vLLM's default alone
        (24 * GiB, False),  # default 2048
        (80 * GiB, False),  # default 8192 (2048 on an A100)
        (int(159.9 * GiB), False),
        (160 * GiB, True),  # default 16384
        (192 * GiB, True),
    ],
)
def test_unset_batched_tokens_are_capped_only_where_vllms_default_is_larger(
    device_total_bytes: int | None, capped: bool
) -> None:
    diagnosis = diagnose(Failure.of(OOM, MODEL, env=BASE))
    step = next_launch(BASE, [Attempt(env=BASE, diagnosis=diagnosis)], device_total_bytes=device_total_bytes)
    assert isinstance(step, Relaunch) and step.profile == "eager"
    assert ("MAX_NUM_BATCHED_TOKENS" in step.overrides) is capped
    if capped:
        assert step.overrides["MAX_NUM_BATCHED_TOKENS"] == "8192"
        assert step.tried_phrase == "relaunched with ENFORCE_EAGER=true and MAX_NUM_BATCHED_TOKENS=8192"


def test_the_device_size_is_used_when_the_ladder_replays_earlier_steps() -> None:
    env = {**BASE, "MAX_NUM_SEQS": "256"}
    big = 180 * GiB
    first = diagnose(Failure.of(OOM, MODEL, env=env))
    step1 = next_launch(env, [Attempt(env=env, diagnosis=first)], device_total_bytes=big)
    assert isinstance(step1, Relaunch) and step1.profile == "max_num_seqs=32"
    env2 = {**env, **{k: v for k, v in step1.overrides.items() if v is not None}}
    attempts = [Attempt(env=env, diagnosis=first), Attempt(env=env2, diagnosis=diagnose(Failure.of(OOM, MODEL, env=env2)))]
    step2 = next_launch(env, attempts, device_total_bytes=big)
    assert isinstance(step2, Relaunch)
    assert step2.overrides == {"MAX_NUM_SEQS": "32", "ENFORCE_EAGER": "true", "MAX_NUM_BATCHED_TOKENS": "8192"}


def test_never_a_fourth_launch() -> None:
    run = launch_until_stop({**BASE, "MAX_NUM_SEQS": "256"}, [OOM, OOM, OOM, OOM])
    assert len(run.envs) == MAX_LAUNCHES == 3
    assert run.stop is not None


@pytest.mark.parametrize("max_launches", [1, 2])
def test_a_smaller_budget_is_respected(max_launches: int) -> None:
    env = {**BASE, "MAX_NUM_SEQS": "256"}
    attempts = [Attempt(env=env, diagnosis=diagnose(Failure.of(OOM, MODEL)))] * max_launches
    assert isinstance(next_launch(env, attempts, max_launches=max_launches), Stop)


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


@pytest.mark.parametrize("value,expected", [("0", None), ("", None), ("16384", "8192"), ("8193", "8192"), ("8192", None)])
def test_only_a_batched_tokens_value_above_8192_is_capped(value: str, expected: str | None) -> None:
    # 0 means unset: vLLM's default then, like an unset variable.
    step = one({**BASE, "MAX_NUM_BATCHED_TOKENS": value}, OOM)
    assert isinstance(step, Relaunch) and step.overrides.get("MAX_NUM_BATCHED_TOKENS") == expected


@pytest.mark.parametrize("tokens", ["8192", None])
def test_a_step_whose_knobs_are_all_there_is_skipped(tokens: str | None) -> None:
    # Step 1 applies; step 2 would change nothing (eager already on, batch budget tight or vLLM's default).
    env = {**BASE, "MAX_NUM_SEQS": "256", "ENFORCE_EAGER": "true"}
    if tokens is not None:
        env["MAX_NUM_BATCHED_TOKENS"] = tokens
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
    assert [t.phrase for t in run.tried] == [
        "relaunched with MAX_NUM_SEQS=32",
        "relaunched with ENFORCE_EAGER=true",
    ]
    final_env = run.envs[-1]
    message = classify(Failure.of(OOM, MODEL, env=final_env, tried=run.tried))
    assert message is not None
    assert "Already tried: relaunched with MAX_NUM_SEQS=32; relaunched with ENFORCE_EAGER=true." in message
    assert "set ENFORCE_EAGER" not in message and "set MAX_NUM_SEQS" not in message
    assert "MAX_NUM_BATCHED_TOKENS" not in message
    assert "set MAX_MODEL_LEN <= 77392" in message


# --- a KV cache size the user fixed ------------------------------------------------------

REAL = Path(__file__).resolve().parents[1] / "support" / "real_texts"
TINY = ".cache/tiny-llama"


def real(name: str) -> str:
    return (REAL / f"{name}.txt").read_text()


@pytest.mark.parametrize(
    "case,env",
    [
        ("kv_too_small", {"MAX_MODEL_LEN": "512", "KV_CACHE_MEMORY_BYTES": "262144"}),
        ("no_kv_memory", {"MAX_MODEL_LEN": "512", "KV_CACHE_MEMORY_BYTES": "131072"}),
        ("auto_fit", {"MAX_MODEL_LEN": "auto", "KV_CACHE_MEMORY_BYTES": "131072"}),
    ],
)
def test_a_real_cpu_kv_shortfall_with_a_fixed_kv_size_is_launched_once(case: str, env: dict[str, str]) -> None:
    # MAX_NUM_SEQS=256 and ENFORCE_EAGER unset: both memory steps would have something to change.
    base = {"MODEL_NAME": TINY, "MAX_NUM_SEQS": "256", "MAX_NUM_BATCHED_TOKENS": "16384", **env}
    run = launch_until_stop(base, [real(case)] * 3)
    assert run.relaunches == [] and len(run.envs) == 1
    assert run.stop is not None and "KV_CACHE_MEMORY_BYTES" in run.stop.reason


@pytest.mark.parametrize(
    "env",
    [
        {"KV_CACHE_MEMORY_BYTES": "8G"},
        {"VLLM_EXTRA_ARGS": "--kv-cache-memory-bytes=8589934592"},
        {"VLLM_EXTRA_ARGS": "--kv-cache-memory 8G --max-num-seqs 256"},
    ],
)
@pytest.mark.parametrize("text", [OOM, t.NO_CACHE_BLOCKS, t.CANNOT_AUTO_FIT])
def test_a_gpu_kv_shortfall_with_a_fixed_kv_size_is_not_relaunched(env: dict[str, str], text: str) -> None:
    assert isinstance(one({**BASE, "MAX_NUM_SEQS": "256", **env}, text), Stop)


def test_the_cpu_kv_space_variable_fixes_the_size_only_on_the_cpu_engine() -> None:
    env = {"MODEL_NAME": TINY, "MAX_MODEL_LEN": "512", "MAX_NUM_SEQS": "256", "VLLM_CPU_KVCACHE_SPACE": "1"}
    assert isinstance(one(env, real("kv_too_small")), Stop)
    # On a GPU vLLM ignores it: the ladder runs.
    assert isinstance(one({**BASE, "MAX_NUM_SEQS": "256", "VLLM_CPU_KVCACHE_SPACE": "1"}, OOM), Relaunch)


@pytest.mark.parametrize("text", [OOM_GRAPHS, t.SAMPLER_WARMUP_OOM])
def test_activation_shortfalls_still_relaunch_with_a_fixed_kv_size(text: str) -> None:
    # Fewer sequences and no graphs free memory outside the KV cache, whatever its size.
    step = one({**BASE, "MAX_NUM_SEQS": "256", "KV_CACHE_MEMORY_BYTES": "8G"}, text)
    assert isinstance(step, Relaunch) and step.overrides == {"MAX_NUM_SEQS": "32"}


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


@pytest.mark.parametrize("text", [t.UNKNOWN_FAILURE, t.HUB_UNREACHABLE])
def test_a_fault_that_may_pass_relaunches_the_same_configuration_once(text: str) -> None:
    run = launch_until_stop(BASE, [text, text, text])
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
    ],
)
def test_causes_a_relaunch_cannot_fix_stop(text: str) -> None:
    assert isinstance(one({**BASE, "MAX_NUM_SEQS": "256", "MODEL_REVISION": "abc"}, text), Stop)


def test_next_launch_needs_an_attempt() -> None:
    with pytest.raises(ValueError):
        next_launch(BASE, [])


@pytest.mark.parametrize(
    "case,model", [("missing_local_path", "/nonexistent/path"), ("offline_uncached_repo", "acme/does-not-exist-xyz")]
)
def test_a_missing_model_is_never_relaunched(case: str, model: str) -> None:
    env = {"MODEL_NAME": model, "HF_HUB_OFFLINE": "1", "MAX_NUM_SEQS": "256"}
    run = launch_until_stop(env, [real(case)] * 3)
    assert run.relaunches == [] and run.stop is not None
    assert run.stop.reason.startswith(("model_path_missing", "offline_not_cached"))


# --- an out-of-memory death while serving walks the same ladder (issue 12) -------------------


def _oom_death() -> Diagnosis:
    return Diagnosis(kind="runtime_oom", message="out of memory while serving", evidence="test")


def test_after_an_oom_death_the_ladder_goes_seqs_then_eager_then_nothing_left() -> None:
    base = {**BASE, "MAX_NUM_SEQS": "64"}
    climb = Ladder(LaunchProfile.parse(base))
    first = climb.after_death(_oom_death())
    assert first is not None and (first.profile, first.overrides) == ("max_num_seqs=32", {"MAX_NUM_SEQS": "32"})
    second = climb.after_death(_oom_death())
    assert second is not None and second.profile == "eager"
    assert second.overrides == {"MAX_NUM_SEQS": "32", "ENFORCE_EAGER": "true"}
    assert climb.after_death(_oom_death()) is None
    assert climb.profile.enforce_eager is True and climb.profile.max_num_seqs == 32


def test_after_an_oom_death_a_step_startup_took_is_not_taken_again() -> None:
    # Started on the eager profile already (the startup ladder or the capacity plan chose it).
    climb = Ladder(LaunchProfile.parse(BASE))
    climb.start_on([
        Relaunch({"MAX_NUM_SEQS": "32"}, "max_num_seqs=32", "plan", Tried({"MAX_NUM_SEQS": "32"}), step="seqs",
                 change=ProfileChange(max_num_seqs=32)),
        Relaunch({"MAX_NUM_SEQS": "32", "ENFORCE_EAGER": "true"}, "eager", "plan", Tried({"ENFORCE_EAGER": "true"}), step="eager",
                 change=ProfileChange(enforce_eager=True)),
    ])
    assert climb.after_death(_oom_death()) is None