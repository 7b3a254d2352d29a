"""The relaunch ladder's promises, held over generated configurations, plan choices and failures.

Hypothesis drives the real `Ladder` the way `launcher.start_engine` does: the first launch on the
profile the capacity plan chose (its steps, walked on a throwaway ladder as `capacity.first_launch`
walks it), then after each failed launch the ladder's answer, until it stops or a launch serves.
Whatever the configuration and the failures:

- never more than `MAX_LAUNCHES` launches;
- no launch after a memory failure asks for more memory than the one before (batch, batched
  tokens, context), and eager mode is never turned back off;
- every change a launch carries (against the user's configuration) appears in `tried`;
- a cause the ladder has no step for is answered, never relaunched.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vllm_worker.config.profile import LaunchProfile, ProfileChange
from vllm_worker.diagnosis.verdict import TRANSIENT_KINDS, Diagnosis
from vllm_worker.engine.ladder import LARGEST_DEFAULT_BATCH_FROM_BYTES, MAX_LAUNCHES, Ladder, Relaunch, Stop

GiB = 2**30
# The causes the ladder has a step for; every other kind is answered at once.
STEPPED = {"revision_not_found", "memory_held", "profiling_race", "memory_shortfall", *TRANSIENT_KINDS}
UNSTEPPED = ["model_not_found", "bad_argument", "gated_repo", "engine_died", "unsupported_architecture"]
MEMORY_DETAILS = ["kv_too_small", "no_kv_memory", "auto_fit", "out_of_memory", "sampler_warmup", "weights_load",
                  "cpu_kv_explicit"]

configurations = st.fixed_dictionaries(
    {"MODEL_NAME": st.just("acme/m")},
    optional={
        "MAX_NUM_SEQS": st.sampled_from(["", "0", "8", "16", "32", "64", "128", "256", "512"]),
        "MAX_CONCURRENCY": st.sampled_from(["1", "8", "30", "64", "200"]),
        "ENFORCE_EAGER": st.sampled_from(["true", "false", ""]),
        "MAX_NUM_BATCHED_TOKENS": st.sampled_from(["0", "2048", "8192", "16k", "65536"]),
        "MAX_MODEL_LEN": st.sampled_from(["4096", "32k", "auto"]),
        "MODEL_REVISION": st.just("abc123"),
        "KV_CACHE_MEMORY_BYTES": st.just("4G"),
        "VLLM_EXTRA_ARGS": st.sampled_from(["--max-num-seqs 16", "--enforce-eager", "--no-enforce-eager",
                                            "--max-num-batched-tokens 4096"]),
    },
)


@st.composite
def diagnoses(draw: st.DrawFn) -> Diagnosis | None:
    kind = draw(st.sampled_from(["memory_shortfall"] * 4 + sorted(STEPPED - {"memory_shortfall"}) + UNSTEPPED + ["?"]))
    if kind == "?":
        return None  # a failure the diagnosis did not recognise
    detail = draw(st.sampled_from(MEMORY_DETAILS)) if kind == "memory_shortfall" else None
    facts = {"device": "CPU"} if kind == "memory_shortfall" and draw(st.booleans()) and draw(st.booleans()) else {}
    return Diagnosis(kind=kind, message=f"{kind} happened", evidence="generated", detail=detail, facts=facts)


def plan_steps(base: LaunchProfile, device: int | None, walk: int, context: bool) -> list[Relaunch]:
    """The steps the capacity plan would start on: its throwaway ladder walked `walk` memory steps."""
    shortfall = Diagnosis(kind="memory_shortfall", message="predicted", evidence="capacity plan", detail="kv_too_small")
    climb = Ladder(base, device_total_bytes=device)
    launch = base
    for _ in range(walk):
        if isinstance(climb.after_failure(launch, shortfall), Stop):
            break
        launch = climb.profile
    steps = list(climb.taken)
    if context and base.max_model_len is None:
        from vllm_worker.diagnosis.verdict import Tried

        overrides: dict[str, str | None] = {**(steps[-1].overrides if steps else {}), "MAX_MODEL_LEN": "auto"}
        steps.append(Relaunch(overrides, "context_auto", "plan", Tried({"MAX_MODEL_LEN": "auto"}, how="first_launch"),
                              step="context", change=ProfileChange(context_auto=True)))
    return steps


def batched_tokens(profile: LaunchProfile, device: int | None) -> int:
    """The most batched tokens a launch may ask for: the value, else the top of vLLM's default for the card."""
    if profile.max_num_batched_tokens is not None:
        return profile.max_num_batched_tokens
    return 16384 if device is not None and device >= LARGEST_DEFAULT_BATCH_FROM_BYTES else 8192


def extra_batch(profile: LaunchProfile) -> bool:
    return "max-num-batched-tokens" in profile.extra_args_flags or "max-num-seqs" in profile.extra_args_flags


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    env=configurations,
    device=st.sampled_from([None, 24 * GiB, 80 * GiB, 180 * GiB]),
    walk=st.integers(0, 2),
    context=st.booleans(),
    failures=st.lists(diagnoses(), min_size=1, max_size=5),
    memory_wait=st.booleans(),
)
def test_the_ladder_keeps_its_promises(
    env: dict[str, str], device: int | None, walk: int, context: bool, failures: list[Diagnosis | None],
    memory_wait: bool,
) -> None:
    base = LaunchProfile.parse(env)
    climb = Ladder(base, device_total_bytes=device, memory_wait=memory_wait)
    profile = climb.start_on(plan_steps(base, device, walk, context))
    launched: list[LaunchProfile] = []
    answers: list[Any] = []
    for diagnosis in failures:
        launched.append(profile)
        step = climb.after_failure(profile, diagnosis)
        answers.append(step)
        before, profile = profile, climb.profile
        if isinstance(step, Stop):
            break

        # A cause the ladder has no step for is answered, never relaunched.
        assert diagnosis is not None and diagnosis.kind in STEPPED, (diagnosis, step)
        assert len(launched) < MAX_LAUNCHES
        if diagnosis.kind == "memory_shortfall":
            # No more memory than the launch before: fewer or as many sequences, batched tokens and context.
            assert profile.effective_max_num_seqs() <= before.effective_max_num_seqs()
            assert batched_tokens(profile, device) <= batched_tokens(before, device)
            assert profile.max_model_len == before.max_model_len
            assert (profile.env, profile.name) != (before.env, before.name), "a memory step that changes nothing"
        if before.enforce_eager is True:
            assert profile.enforce_eager is True, "eager turned back off"
        if step.profile == "same":
            assert profile.env == before.env
    if not isinstance(answers[-1], Stop):
        launched.append(profile)  # the launch the last answer asks for

    # Never more than three launches (the one that would follow the last answer included).
    assert len(launched) <= MAX_LAUNCHES
    # Every change a launch carried against the user's configuration is in `tried`, as data.
    for launch in launched:
        for name in {*launch.env, *base.env}:
            if launch.env.get(name) != base.env.get(name):
                assert any(t.changes.get(name, "<absent>") == launch.env.get(name) for t in climb.tried), (
                    name, launch.env.get(name), [t.phrase for t in climb.tried]
                )
    # The notice every response carries names the same tried list.
    notice = climb.notice()
    if notice is not None:
        assert notice["tried"] == [t.phrase for t in climb.tried]
