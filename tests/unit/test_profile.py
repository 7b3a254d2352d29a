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
    profile = LaunchProfile.parse({"MAX_NUM_SEQS": "abc", "ENFORCE_EAGER": "maybe", "MAX_CONCURRENCY": "x"})
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
