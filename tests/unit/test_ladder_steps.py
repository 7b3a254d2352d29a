"""The ladder's steps as the user reads them: the reason every response names, the warnings, what `tried` records.

A relaunch's `reason` is the degraded profile's reason in every job's `worker` object and in the log,
its warnings are logged loudly, and `tried` is what a later failure's message says the worker did on
its own: each is asserted whole here, on the real `Ladder`. Also the knobs VLLM_EXTRA_ARGS sets, in
any spelling, which a step leaves alone (vLLM reads that flag last, so a step there would change
nothing and say it did).
"""

from __future__ import annotations

from typing import Mapping

from vllm_worker.config.profile import LaunchProfile
from vllm_worker.diagnosis.verdict import Diagnosis, Tried
from vllm_worker.engine.ladder import Ladder, Relaunch, Stop

OOM = Diagnosis(kind="memory_shortfall", message="m", evidence="e", detail="out_of_memory")
REVISION_GONE = Diagnosis(kind="revision_not_found", message="r", evidence="e")
MEMORY_HELD = Diagnosis(kind="memory_held", message="h", evidence="e")
BASE = {"MODEL_NAME": "acme/m"}


def first_step(env: Mapping[str, str], diagnosis: Diagnosis = OOM, device_total_bytes: int | None = None) -> Relaunch | Stop:
    climb = Ladder(LaunchProfile.parse({**BASE, **env}), device_total_bytes=device_total_bytes)
    return climb.after_failure(climb.start_on(None), diagnosis)


def relaunch(env: Mapping[str, str], diagnosis: Diagnosis = OOM) -> Relaunch:
    step = first_step(env, diagnosis)
    assert isinstance(step, Relaunch), step
    return step


def test_the_seqs_steps_reason_names_the_batch_it_leaves_and_the_one_it_takes() -> None:
    step = relaunch({"MAX_NUM_SEQS": "256", "MAX_CONCURRENCY": "20"})
    assert step.reason == (
        "out of memory with MAX_NUM_SEQS=256; relaunching with MAX_NUM_SEQS=24 (enough for MAX_CONCURRENCY=20), "
        "CUDA graphs kept"
    )


def test_the_eager_steps_reason_names_what_it_changes_and_what_it_leaves_to_batched_tokens() -> None:
    assert relaunch({}).reason == (
        "out of memory; relaunching with ENFORCE_EAGER=true (MAX_NUM_BATCHED_TOKENS left to vLLM's default): "
        "less memory, slower replies"
    )
    assert relaunch({"MAX_NUM_BATCHED_TOKENS": "4096"}).reason == (
        "out of memory; relaunching with ENFORCE_EAGER=true (MAX_NUM_BATCHED_TOKENS=4096 kept): less memory, slower replies"
    )
    # Capped, the cap is in the list of changes and no note follows it.
    assert relaunch({"MAX_NUM_BATCHED_TOKENS": "16384"}).reason == (
        "out of memory; relaunching with ENFORCE_EAGER=true and MAX_NUM_BATCHED_TOKENS=8192: less memory, slower replies"
    )


def test_an_explicit_enforce_eager_false_overridden_is_warned_in_one_whole_sentence() -> None:
    assert relaunch({"ENFORCE_EAGER": "false"}).warnings == [
        "ENFORCE_EAGER=false is OVERRIDDEN to true for this relaunch: the configuration does not fit "
        "in memory with CUDA graphs; replies will be slower"
    ]


def test_eager_mode_set_in_vllm_extra_args_either_way_is_not_a_step() -> None:
    # MAX_NUM_SEQS is the worker's default already and batched tokens are vLLM's: eager was the only step left.
    for extra in ("--no-enforce-eager", "--enforce-eager=false"):
        step = first_step({"VLLM_EXTRA_ARGS": extra})
        assert step == Stop("every memory relaunch step was used or would change nothing"), extra


def test_batched_tokens_set_in_vllm_extra_args_are_kept_and_said_to_be() -> None:
    step = relaunch({"VLLM_EXTRA_ARGS": "--max-num-batched-tokens 65536"})
    assert step.overrides == {"ENFORCE_EAGER": "true"}
    assert step.reason == (
        "out of memory; relaunching with ENFORCE_EAGER=true (MAX_NUM_BATCHED_TOKENS=65536 kept): less memory, slower replies"
    )


def test_a_vanished_pinned_revision_is_unpinned_with_its_reason_and_a_warning_for_each_variable() -> None:
    step = relaunch({"MODEL_REVISION": "abc123", "TOKENIZER_REVISION": "t1"}, REVISION_GONE)
    assert step.reason == "the pinned revision vanished; relaunching without MODEL_REVISION, TOKENIZER_REVISION"
    assert step.warnings == [
        "MODEL_REVISION='abc123' no longer exists on the Hub; relaunching without it, so the repository's default branch is served",
        "TOKENIZER_REVISION='t1' no longer exists on the Hub; relaunching without it, so the repository's default branch is served",
    ]
    assert step.tried_phrase == "relaunched without MODEL_REVISION, TOKENIZER_REVISION"


def test_a_revision_vllm_resolved_itself_is_fetched_again_and_said_so() -> None:
    step = relaunch({}, REVISION_GONE)
    assert step.reason == "the revision vLLM resolved vanished during the download; relaunching to resolve it again"
    assert step.warnings == [] and step.overrides == {}
    assert (step.tried, step.tried_phrase) == (Tried(how="refetch"), "relaunched once to fetch the current revision")


def test_memory_held_is_recorded_as_waited_for_or_not_as_the_worker_was_told() -> None:
    for memory_wait, tried in ((True, Tried(how="after_wait")), (False, Tried(how="no_wait"))):
        climb = Ladder(LaunchProfile.parse(BASE), memory_wait=memory_wait)
        step = climb.after_failure(climb.start_on(None), MEMORY_HELD)
        assert isinstance(step, Relaunch) and step.wait_for_memory
        assert climb.tried == [tried], memory_wait
    assert Tried(how="no_wait").phrase == "relaunched with the same settings, without waiting for memory (GPU_MEMORY_WAIT=false)"


def test_a_relaunch_of_the_same_configuration_leaves_the_profile_as_configured() -> None:
    # The status job and every response name the profile: waiting for memory degrades nothing.
    climb = Ladder(LaunchProfile.parse({**BASE, "MAX_NUM_SEQS": "256"}))
    step = climb.after_failure(climb.start_on(None), MEMORY_HELD)
    assert isinstance(step, Relaunch) and step.profile == "same"
    assert (climb.step, climb.notice(), climb.profile.name) == (None, None, "as configured")


def test_the_profile_a_step_launches_is_named_after_the_step() -> None:
    climb = Ladder(LaunchProfile.parse({**BASE, "MAX_NUM_SEQS": "256"}))
    climb.after_failure(climb.start_on(None), OOM)
    assert (climb.profile.name, climb.profile.overrides) == ("max_num_seqs=32", {"MAX_NUM_SEQS": "32"})
    climb.after_failure(climb.profile, OOM)
    assert (climb.profile.name, climb.profile.overrides) == ("eager", {"MAX_NUM_SEQS": "32", "ENFORCE_EAGER": "true"})
