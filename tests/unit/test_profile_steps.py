"""A ladder step's profile is the profile the step's environment parses to.

A step (fewer sequences, eager, an unpinned revision, MAX_MODEL_LEN=auto from the capacity plan)
changes a profile's typed fields; it must come to exactly what the user would get by writing the
step's variables into the environment and starting again: every field, the `vllm serve` argv, its
warnings, its environment and its refusals. Hypothesis drives the real `Ladder` over generated
configurations and failures, and holds each profile it makes against a fresh parse of
`apply_overrides(base, step.overrides)`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from vllm_worker.config.args_builder import ArgsError
from vllm_worker.config.command import build_args
from vllm_worker.config.env import RefusedValue
from vllm_worker.config.profile import PARSES, LaunchProfile, ProfileChange, apply_overrides
from vllm_worker.config.settings import Settings
from vllm_worker.diagnosis.verdict import Diagnosis
from vllm_worker.engine.ladder import REVISION_VARIABLES, Ladder, Stop

GiB = 2**30

configurations = st.fixed_dictionaries(
    {},
    optional={
        "MODEL_NAME": st.sampled_from(["acme/m", " acme/m "]),
        "BAKED_MODEL_PATH": st.just("/models/m"),
        "MAX_CONCURRENCY": st.sampled_from(["", "1", "4", "8", "30", "31", "200", "0", "abc"]),
        "MAX_NUM_SEQS": st.sampled_from(["", "0", "8", "032", "64", "256", "abc", " 512 "]),
        "ENFORCE_EAGER": st.sampled_from(["", "true", "false", "0", "Yes", "maybe"]),
        "MAX_NUM_BATCHED_TOKENS": st.sampled_from(["", "0", "2048", "8192", "16k", "16K", "65536", "x"]),
        "MAX_MODEL_LEN": st.sampled_from(["", "0", "4096", "32k", "auto", "-1"]),
        "MODEL_REVISION": st.sampled_from(["", "abc123"]),
        "REVISION": st.sampled_from(["abc123", "other"]),
        "TOKENIZER_NAME": st.just("acme/tok"),
        "TOKENIZER_REVISION": st.just("t1"),
        "CODE_REVISION": st.just("c1"),
        "SERVED_MODEL_NAME": st.sampled_from(["alias", "a b"]),
        "OPENAI_SERVED_MODEL_NAME_OVERRIDE": st.just("legacy"),
        "TENSOR_PARALLEL_SIZE": st.sampled_from(["2", "x"]),
        "GPU_MEMORY_UTILIZATION": st.sampled_from(["0.9", "0.999", "1.5", "abc"]),
        "KV_CACHE_MEMORY_BYTES": st.sampled_from(["4G", "lots"]),
        "KV_CACHE_DTYPE": st.sampled_from(["fp8", "FP8"]),
        "VLLM_CONFIG_FILE": st.sampled_from(["/c.yaml", "/c.json"]),
        "HF_TOKEN": st.just("hf_secret123"),
        "SPECULATIVE_MODEL": st.just("acme/draft"),
        "NUM_SPECULATIVE_TOKENS": st.sampled_from(["3", "x"]),
        "MAX_NUM_SEQ": st.just("8"),
        "SWAP_SPACE": st.just("4"),
        "API_KEY": st.just("k"),
        "VLLM_EXTRA_ARGS": st.lists(
            st.sampled_from([
                "--max-num-seqs 16", "--enforce-eager", "--no-enforce-eager", "--max-num-batched-tokens=4096",
                "--revision v2", "-tp 2", "--kv-cache-memory-bytes 2G", "--max-model-len 2048", "--config /x.yaml",
                "--port 9", "'unbalanced", "--seed 3",
            ]),
            max_size=3,
        ).map(" ".join),
    },
)

DIAGNOSES = [
    Diagnosis(kind="memory_shortfall", message="m", evidence="e", detail="kv_too_small"),
    Diagnosis(kind="memory_shortfall", message="m", evidence="e", detail="out_of_memory"),
    Diagnosis(kind="revision_not_found", message="r", evidence="e"),
    Diagnosis(kind="memory_held", message="h", evidence="e"),
    Diagnosis(kind="nccl", message="n", evidence="e"),
]


def fields(profile: LaunchProfile) -> dict[str, Any]:
    """Every field of a profile, a refusal as its class and sentence (exceptions compare by identity)."""
    view: dict[str, Any] = {}
    for f in dataclasses.fields(profile):
        value = getattr(profile, f.name)
        if isinstance(value, RefusedValue):
            value = (type(value).__name__, value.variable, value.value, value.accepted, str(value))
        elif isinstance(value, dict):
            value = dict(value)
        view[f.name] = value
    return view


def rendered(profile: LaunchProfile, adaptive: bool) -> Any:
    """What `build_args` makes of a profile: the argv, its warnings, the served name, the engine's
    environment; or the refusal's sentence."""
    try:
        built = build_args(profile, Settings(adaptive_concurrency=adaptive), {"VLLM_CACHE_ROOT": "/c"})
    except ArgsError as error:
        return ("refused", error.variable, error.value, str(error))
    return (built.argv, built.warnings, built.served_model_name, built.engine_env, built.masked())


def same_as_parsed(step_profile: LaunchProfile, base: LaunchProfile, adaptive: bool) -> None:
    parsed = LaunchProfile.parse(
        apply_overrides(base.env, step_profile.overrides), step_profile.name, step_profile.overrides
    )
    assert fields(step_profile) == fields(parsed)
    assert rendered(step_profile, adaptive) == rendered(parsed, adaptive)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    env=configurations,
    device=st.sampled_from([None, 24 * GiB, 180 * GiB]),
    failures=st.lists(st.sampled_from(DIAGNOSES), min_size=1, max_size=4),
    death=st.booleans(),
    adaptive=st.booleans(),
)
def test_a_ladder_step_is_the_profile_its_environment_parses_to(
    env: dict[str, str], device: int | None, failures: list[Diagnosis], death: bool, adaptive: bool
) -> None:
    base = LaunchProfile.parse(env)
    # A refused configuration is answered before anything is launched or planned: no step is taken from it.
    assume(base.refusal is None)
    climb = Ladder(base, device_total_bytes=device)
    profile = climb.start_on(())
    for diagnosis in failures:
        step = climb.after_failure(profile, diagnosis)
        if isinstance(step, Stop):
            break
        profile = climb.profile
        same_as_parsed(profile, base, adaptive)
    if death:
        oom = Diagnosis(kind="runtime_oom", message="o", evidence="e")
        if climb.after_death(oom) is not None:
            same_as_parsed(climb.profile, base, adaptive)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(
    env=configurations,
    seqs=st.sampled_from([None, 8, 32]),
    eager=st.sampled_from([None, True]),
    batched=st.sampled_from([None, 8192]),
    gpus=st.sampled_from([None, 2, 4]),
    context_auto=st.booleans(),
    unpin=st.booleans(),
    adaptive=st.booleans(),
)
def test_every_typed_change_is_the_profile_its_variables_parse_to(
    env: dict[str, str], seqs: int | None, eager: bool | None, batched: int | None, gpus: int | None,
    context_auto: bool, unpin: bool, adaptive: bool,
) -> None:
    """`LaunchProfile.changed` over every knob a step (or the plan's hardware fixes) changes, alone or together."""
    base = LaunchProfile.parse(env)
    assume(base.refusal is None)
    pinned = tuple(name for name in REVISION_VARIABLES if base.written(name) is not None) if unpin else ()
    change = ProfileChange(max_num_seqs=seqs, enforce_eager=eager, max_num_batched_tokens=batched,
                           tensor_parallel_size=gpus, context_auto=context_auto, unpinned=pinned)
    same_as_parsed(base.changed("step", change, change.variables()), base, adaptive)


def test_a_profile_of_two_launches_is_parsed_once() -> None:
    """The ladder's steps change the profile: the configuration is the only parse of a start."""
    base = LaunchProfile.parse({"MODEL_NAME": "acme/m", "MAX_NUM_SEQS": "256", "MODEL_REVISION": "abc"})
    before = PARSES.count
    climb = Ladder(base)
    oom = Diagnosis(kind="memory_shortfall", message="m", evidence="e", detail="kv_too_small")
    for diagnosis in (oom, Diagnosis(kind="revision_not_found", message="r", evidence="e")):
        assert not isinstance(climb.after_failure(climb.profile, diagnosis), Stop)
    assert (climb.profile.max_num_seqs, climb.profile.revision, climb.profile.written("MODEL_REVISION")) == (32, None, None)
    assert PARSES.count == before
