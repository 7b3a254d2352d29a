"""The launch configuration is parsed in one place into typed knobs that every decision reads."""

from __future__ import annotations

from vllm_worker.config.profile import LaunchProfile


def test_numbers_booleans_and_zero_meaning_unset() -> None:
    profile = LaunchProfile.parse(
        {"MAX_NUM_SEQS": "0", "MAX_NUM_BATCHED_TOKENS": "16384", "ENFORCE_EAGER": "yes", "GPU_MEMORY_UTILIZATION": "0.9",
         "TENSOR_PARALLEL_SIZE": "2", "KV_CACHE_DTYPE": "FP8", "MAX_CONCURRENCY": "10", "TRUST_REMOTE_CODE": "off"}
    )
    assert profile.max_num_seqs is None and profile.effective_max_num_seqs() == 16
    assert profile.max_num_batched_tokens == 16384
    assert profile.enforce_eager is True and profile.trust_remote_code is False
    assert (profile.gpu_memory_utilization, profile.tensor_parallel_size, profile.kv_cache_dtype) == (0.9, 2, "fp8")


def test_unreadable_values_count_as_unset_and_defaults_apply() -> None:
    profile = LaunchProfile.parse({"MAX_NUM_SEQS": "abc", "ENFORCE_EAGER": "maybe"})
    assert profile.max_num_seqs is None and profile.enforce_eager is None
    assert profile.max_concurrency == 30 and profile.effective_max_num_seqs() == 32
    assert (profile.tensor_parallel_size, profile.kv_cache_dtype, profile.offline) == (1, "auto", None)


def test_the_kv_cache_size_vllm_reads_last_wins() -> None:
    env = {"KV_CACHE_MEMORY_BYTES": "8G", "VLLM_EXTRA_ARGS": "--kv-cache-memory-bytes 4G --max-num-seqs 8",
           "VLLM_CPU_KVCACHE_SPACE": "2"}
    profile = LaunchProfile.parse(env)
    assert profile.kv_cache is not None and (profile.kv_cache.variable, profile.kv_cache.size_bytes) == ("VLLM_EXTRA_ARGS", 4 * 2**30)
    cpu = profile.kv_cache_for(cpu=True)
    assert cpu is not None and (cpu.variable, cpu.size_bytes) == ("VLLM_CPU_KVCACHE_SPACE", 2 * 2**30)
    assert profile.extra_args_flags == {"kv-cache-memory-bytes", "max-num-seqs"}


def test_offline_names_the_variable_that_switched_the_hub_off() -> None:
    assert LaunchProfile.parse({"TRANSFORMERS_OFFLINE": "1"}).offline == "TRANSFORMERS_OFFLINE"
    assert LaunchProfile.parse({"HF_HUB_OFFLINE": "0"}).offline is None


# --- what a user sees, pinned: blank and 0 are unset, an unreadable value is refused with its sentence ---

import pytest  # noqa: E402

from vllm_worker.capacity import memory_budget  # noqa: E402
from vllm_worker.capacity.gpus import CARDS  # noqa: E402
from vllm_worker.config import command, settings as settings_mod  # noqa: E402
from vllm_worker.config.args_builder import ArgsError  # noqa: E402
from vllm_worker.config.profile import PARSES, UTILIZATION_CEILING, LARGEST_CARD_MIB, SMALLEST_CUDA_CONTEXT_MIB  # noqa: E402

SETTINGS = settings_mod.load({"MODEL_NAME": "org/m"})


def _argv(**env: str) -> list[str]:
    return command.build_args(LaunchProfile.parse({"MODEL_NAME": "org/m", **env}), SETTINGS).argv


@pytest.mark.parametrize("value", ["", "   ", "0"])
def test_blank_and_zero_are_unset_in_the_argv_the_plan_and_the_ladder(value: str) -> None:
    from vllm_worker.capacity.plan_settings import knobs_for

    for name in ("MAX_NUM_SEQS", "MAX_NUM_BATCHED_TOKENS", "MAX_MODEL_LEN"):
        profile = LaunchProfile.parse({"MODEL_NAME": "org/m", name: value})
        argv = command.build_args(profile, SETTINGS).argv
        assert argv.count("--max-num-seqs") == 1 and argv[argv.index("--max-num-seqs") + 1] == "32"
        assert "--max-num-batched-tokens" not in argv and "--max-model-len" not in argv
        assert (profile.max_num_seqs, profile.max_num_batched_tokens, profile.context_tokens) == (None, None, None)
        knobs = knobs_for(profile, worker_seqs=True)
        assert (knobs.max_num_seqs, knobs.max_num_batched_tokens, knobs.max_model_len) == (32, None, None)


@pytest.mark.parametrize(
    "name,value,sentence",
    [
        ("MAX_NUM_SEQS", "abc", "MAX_NUM_SEQS='abc' is not valid: --max-num-seqs takes a whole number (at least 1)."),
        ("GPU_MEMORY_UTILIZATION", "abc",
         "GPU_MEMORY_UTILIZATION='abc' is not valid: --gpu-memory-utilization takes a number (greater than 0 and at most 1)."),
        ("GPU_MEMORY_UTILIZATION", "1.5",
         "GPU_MEMORY_UTILIZATION='1.5' is not valid: --gpu-memory-utilization takes a number (greater than 0 and at most 1)."),
        ("GPU_MEMORY_UTILIZATION", "0",
         "GPU_MEMORY_UTILIZATION='0' is not valid: --gpu-memory-utilization takes a number (greater than 0 and at most 1)."),
        ("ENFORCE_EAGER", "maybe", "ENFORCE_EAGER='maybe' is not valid: use true or false (also 1/0, yes/no, on/off)."),
        ("MAX_MODEL_LEN", "lots",
         "MAX_MODEL_LEN='lots' is not valid: --max-model-len takes a whole number, optionally with a suffix such as "
         "8k (x1000) or 8K (x1024), or auto."),
        ("TENSOR_PARALLEL_SIZE", "two",
         "TENSOR_PARALLEL_SIZE='two' is not valid: --tensor-parallel-size takes a whole number (at least 1)."),
    ],
)
def test_an_unreadable_value_is_refused_with_its_sentence(name: str, value: str, sentence: str) -> None:
    with pytest.raises(ArgsError) as refused:
        _argv(**{name: value})
    assert str(refused.value) == sentence


@pytest.mark.parametrize("value", ["1.0", "1", "0.999"])
def test_a_utilization_no_card_has_free_is_refused_before_launch(value: str) -> None:
    profile = LaunchProfile.parse({"MODEL_NAME": "org/m", "GPU_MEMORY_UTILIZATION": value})
    assert profile.refusal is not None
    sentence = str(profile.refusal)
    assert sentence.startswith(f"GPU_MEMORY_UTILIZATION={value!r} is not valid: no GPU has that share")
    assert "set it to 0.95 or lower" in sentence and sentence.count(".") >= 1 and "\n" not in sentence
    with pytest.raises(ArgsError) as refused:
        command.build_args(profile, SETTINGS)
    assert str(refused.value) == sentence


def test_a_utilization_below_the_ceiling_launches_and_a_fixed_kv_size_needs_none() -> None:
    assert "--gpu-memory-utilization" in _argv(GPU_MEMORY_UTILIZATION="0.99")
    # With the KV cache size fixed, vLLM does not check the utilization's share, so nothing is refused.
    assert LaunchProfile.parse({"GPU_MEMORY_UTILIZATION": "1.0", "KV_CACHE_MEMORY_BYTES": "4G"}).refusal is None


def test_the_utilization_ceiling_follows_the_capacity_plans_cards_and_cuda_context() -> None:
    assert LARGEST_CARD_MIB == max(card.total_bytes for card in CARDS) // 2**20
    assert SMALLEST_CUDA_CONTEXT_MIB * 2**20 == memory_budget.CUDA_CONTEXT_BYTES - memory_budget.CUDA_CONTEXT_ERROR
    largest = max(card.total_bytes for card in CARDS)
    assert UTILIZATION_CEILING * largest <= largest - SMALLEST_CUDA_CONTEXT_MIB * 2**20


def test_two_spellings_that_disagree_are_refused_once_in_the_profile() -> None:
    profile = LaunchProfile.parse({"MODEL_NAME": "org/m", "MODEL_REVISION": "a", "REVISION": "b"})
    assert profile.refusal is not None and "set only one of them" in str(profile.refusal)


def test_the_extra_args_win_in_the_typed_fields_and_come_last_in_the_argv() -> None:
    profile = LaunchProfile.parse({"MODEL_NAME": "org/m", "MAX_NUM_SEQS": "64", "VLLM_EXTRA_ARGS": "--max-num-seqs 8"})
    assert profile.max_num_seqs == 8
    argv = command.build_args(profile, SETTINGS).argv
    assert argv[-2:] == ["--max-num-seqs", "8"] and argv[argv.index("--max-num-seqs") + 1] == "64"


def test_batched_tokens_are_read_as_vllm_reads_them() -> None:
    assert LaunchProfile.parse({"MAX_NUM_BATCHED_TOKENS": "8k"}).max_num_batched_tokens == 8000
    assert LaunchProfile.parse({"MAX_NUM_BATCHED_TOKENS": "8K"}).max_num_batched_tokens == 8192


def test_parse_counter_counts() -> None:
    before = PARSES.count
    LaunchProfile.parse({})
    assert PARSES.count == before + 1


def test_an_override_that_removes_a_variable_not_set_changes_nothing() -> None:
    from vllm_worker.config.profile import apply_overrides

    assert apply_overrides({"MODEL_NAME": "acme/m"}, {"CODE_REVISION": None, "MAX_NUM_SEQS": "8"}) == {
        "MODEL_NAME": "acme/m", "MAX_NUM_SEQS": "8",
    }


def test_a_change_that_turns_eager_off_is_the_profile_enforce_eager_false_parses_to() -> None:
    # No ladder step turns graphs back on today; the typed change must still say "false" where it means it.
    from vllm_worker.config.profile import ProfileChange

    change = ProfileChange(enforce_eager=False)
    assert change.variables() == {"ENFORCE_EAGER": "false"}
    off = LaunchProfile.parse({"MODEL_NAME": "acme/m", "ENFORCE_EAGER": "true"}).changed("graphs", change, change.variables())
    parsed = LaunchProfile.parse({"MODEL_NAME": "acme/m", "ENFORCE_EAGER": "false"})
    assert (off.enforce_eager, off.env, off.options) == (False, parsed.env, parsed.options)
