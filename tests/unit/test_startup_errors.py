"""The startup classifier on real-shaped engine output (tests/support/vllm_texts.py).

Each text carries the exact wording of vLLM 0.32 (or the transformers /
huggingface_hub / torch text it surfaces) inside the log shape the worker's tail
really has: INFO lines of a start that got far, the root cause printed twice, and
"Engine core initialization failed" last.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support import vllm_texts as t
from vllm_worker.diagnosis import runtime
from vllm_worker.diagnosis.hub import invalid_model_name_message, model_path_missing_message, offline_not_cached_message, repo_not_found_message, unauthorized_message
from vllm_worker.diagnosis import verdict
from vllm_worker.diagnosis.verdict import Failure, Tried
from vllm_worker.diagnosis import startup_errors
from vllm_worker.model.preflight import GATED_REPO, REPO_NOT_FOUND, REVISION_NOT_FOUND, UNAUTHORIZED, Target, failure_message
from vllm_worker.diagnosis.startup_errors import KINDS, classify, diagnose, memory_held, memory_shortfall

MODEL = "acme/m"

MEMORY_SHORTFALL = {
    "KV_TOO_SMALL_WITH_ESTIMATE": "kv_too_small",
    "KV_TOO_SMALL_NO_ESTIMATE": "kv_too_small",
    "NO_CACHE_BLOCKS": "no_kv_memory",
    "CANNOT_AUTO_FIT": "auto_fit",
    "TORCH_OOM_AT_LOAD": "weights_load",
    "TORCH_OOM": "out_of_memory",
    "CUDA_ERROR_OOM": "out_of_memory",
    "SAMPLER_WARMUP_OOM": "sampler_warmup",
    "CPU_KV_NO_ROOM": "cpu_kv_no_room",
    "CPU_KV_EXPLICIT_TOO_BIG": "cpu_kv_explicit",
    "CPU_ALLOCATOR_OOM": "cpu_out_of_memory",
}

OTHER_CAUSES = {
    "FREE_MEMORY_LESS_THAN_DESIRED": "memory_held",
    "FREE_MEMORY_LESS_THAN_BUDGET": "memory_held",
    "CPU_AVAILABLE_LESS_THAN_DESIRED": "memory_held",
    "PROFILING_RACE": "profiling_race",
    "MAX_MODEL_LEN_TOO_LARGE": "max_model_len_too_large",
    "ARGPARSE_INVALID_INT": "bad_arguments",
    "ARGPARSE_INVALID_CHOICE": "bad_arguments",
    "ARGPARSE_UNRECOGNIZED": "bad_arguments",
    "PYDANTIC_FIELD_ERROR": "bad_arguments",
    "REPO_NOT_FOUND": "repo_not_found",
    "REPO_NOT_FOUND_401": "repo_not_found",
    "GATED_REPO": "gated_repo",
    "GATED_REPO_403": "gated_repo",
    "GATED_REPO_HAS_FILE": "gated_repo",
    "REPO_NOT_FOUND_HAS_FILE": "repo_not_found",
    "REVISION_NOT_FOUND": "revision_not_found",
    "UNAUTHORIZED": "unauthorized",
    "UNSUPPORTED_ARCHITECTURE": "unsupported_architecture",
    "PREVIOUSLY_SUPPORTED_ARCHITECTURE": "unsupported_architecture",
    "UNKNOWN_MODEL_TYPE": "unsupported_architecture",
    "TRUST_REMOTE_CODE": "trust_remote_code",
    "TRUST_REMOTE_CODE_TOKENIZER": "trust_remote_code",
    "DISK_FULL": "disk_full",
}

NOT_CLASSIFIED = ["SUCCESS_GPU", "SUCCESS_CPU", "NOISE_ONLY"]
# Known since the field corpus (issue 9): answered with their cause, one in-place relaunch each.
TRANSIENT = {"UNKNOWN_FAILURE": "host_fault", "HUB_UNREACHABLE": "hub_unreachable"}


# --- every cause -------------------------------------------------------------------


@pytest.mark.parametrize("name,detail", sorted(MEMORY_SHORTFALL.items()))
def test_memory_shortfall_wordings(name: str, detail: str) -> None:
    text = getattr(t, name)
    diagnosis = diagnose(Failure.of(text, MODEL))
    assert diagnosis is not None
    assert (diagnosis.kind, diagnosis.detail) == ("memory_shortfall", detail)
    assert memory_shortfall(Failure.of(text))
    assert not memory_held(Failure.of(text))


@pytest.mark.parametrize("name,kind", sorted(OTHER_CAUSES.items()))
def test_other_causes(name: str, kind: str) -> None:
    text = getattr(t, name)
    diagnosis = diagnose(Failure.of(text, MODEL, exit_code=2 if name.startswith("ARGPARSE") else 1))
    assert diagnosis is not None
    assert diagnosis.kind == kind
    assert not memory_shortfall(Failure.of(text))
    assert diagnosis.message == classify(Failure.of(text, MODEL, exit_code=2 if name.startswith("ARGPARSE") else 1))


@pytest.mark.parametrize("name", sorted([*MEMORY_SHORTFALL, *OTHER_CAUSES]))
def test_every_diagnosis_is_a_documented_kind_with_evidence(name: str) -> None:
    diagnosis = diagnose(Failure.of(getattr(t, name), MODEL))
    assert diagnosis is not None and diagnosis.kind in KINDS
    # Evidence is the line that gave the cause away, without vLLM's log prefix.
    assert diagnosis.evidence and "pid=" not in diagnosis.evidence
    assert len(diagnosis.evidence) <= 400


@pytest.mark.parametrize("name", NOT_CLASSIFIED)
def test_success_noise_and_unknown_are_not_classified(name: str) -> None:
    text = getattr(t, name)
    assert diagnose(Failure.of(text, MODEL)) is None
    assert classify(Failure.of(text, MODEL)) is None
    assert not memory_shortfall(Failure.of(text))
    assert not memory_held(Failure.of(text))


@pytest.mark.parametrize("name,kind", sorted(TRANSIENT.items()))
def test_faults_that_may_pass_are_named_and_never_memory(name: str, kind: str) -> None:
    text = getattr(t, name)
    diagnosis = diagnose(Failure.of(text, MODEL, exit_code=1))
    assert diagnosis is not None and diagnosis.kind == kind
    assert kind in verdict.TRANSIENT_KINDS
    assert not memory_shortfall(Failure.of(text)) and "out of memory" not in diagnosis.message


def test_empty_output_is_not_classified() -> None:
    assert diagnose(Failure.of("")) is None


def test_success_info_lines_around_a_failure_do_not_change_the_cause() -> None:
    # A relaunch's output holds a healthy-looking prefix (the "Free memory on device (" INFO line,
    # KV cache size, "to avoid OOM") before the real failure.
    text = t.SUCCESS_GPU + "\n" + t.TRUST_REMOTE_CODE
    diagnosis = diagnose(Failure.of(text, MODEL))
    assert diagnosis is not None and diagnosis.kind == "trust_remote_code"


@pytest.mark.parametrize("name", ["NO_CACHE_BLOCKS", "FREE_MEMORY_LESS_THAN_DESIRED", "PROFILING_RACE"])
def test_root_cause_is_found_above_the_secondary_noise(name: str) -> None:
    text = getattr(t, name)
    last = text.strip().splitlines()[-1]
    assert "Engine core initialization failed" in last
    assert "EngineCore failed to start." in text
    diagnosis = diagnose(Failure.of(text, MODEL))
    assert diagnosis is not None
    assert "Engine" not in diagnosis.evidence


def test_a_hub_warning_earlier_does_not_hide_a_later_memory_failure() -> None:
    warning = t.vllm_log(
        "Cannot connect to Hugging Face Hub. Skipping file download for 'generation_config.json':\n"
        "huggingface_hub.errors.HfHubHTTPError: 401 Client Error. (Request ID: Root=1-abc)",
        level="WARNING",
        where="repo_utils.py:410",
        proc="APIServer pid=1",
    )
    diagnosis = diagnose(Failure.of(warning + "\n" + t.NO_CACHE_BLOCKS, MODEL))
    assert diagnosis is not None and diagnosis.kind == "memory_shortfall"


# --- memory shortfall messages --------------------------------------------------------


def test_kv_too_small_with_estimate_gives_the_length_that_fits() -> None:
    diagnosis = diagnose(Failure.of(t.KV_TOO_SMALL_WITH_ESTIMATE, MODEL, env={"MODEL_NAME": MODEL}))
    assert diagnosis is not None
    assert diagnosis.estimated_max_len == 77392
    assert "this GPU can serve about 77392 tokens; set MAX_MODEL_LEN <= 77392" in diagnosis.message
    assert "131072" in diagnosis.message and "MAX_MODEL_LEN is not set" in diagnosis.message
    assert "MODEL_NAME='acme/m'" in diagnosis.message


def test_kv_too_small_names_an_explicit_max_model_len() -> None:
    env = {"MODEL_NAME": MODEL, "MAX_MODEL_LEN": "131072"}
    message = classify(Failure.of(t.KV_TOO_SMALL_WITH_ESTIMATE, MODEL, env=env))
    assert message is not None and "at MAX_MODEL_LEN=131072" in message


def test_kv_too_small_without_estimate_has_no_made_up_number() -> None:
    diagnosis = diagnose(Failure.of(t.KV_TOO_SMALL_NO_ESTIMATE, MODEL, env={"MAX_MODEL_LEN": "32768"}))
    assert diagnosis is not None
    assert diagnosis.estimated_max_len is None
    assert "can serve about" not in diagnosis.message
    assert "lower MAX_MODEL_LEN (now 32768)" in diagnosis.message


def test_fresh_failure_lists_every_knob_that_is_still_loose() -> None:
    env = {"MODEL_NAME": MODEL, "MAX_NUM_SEQS": "256", "MAX_CONCURRENCY": "30"}
    message = classify(Failure.of(t.KV_TOO_SMALL_WITH_ESTIMATE, MODEL, env=env))
    assert message is not None
    assert "set MAX_NUM_SEQS=32" in message
    assert "set ENFORCE_EAGER=true" in message
    # Unset, vLLM's default (2048 on most cards) is already below the 8192 cap.
    assert "MAX_NUM_BATCHED_TOKENS" not in message
    assert "Already tried" not in message
    looser = classify(Failure.of(t.KV_TOO_SMALL_WITH_ESTIMATE, MODEL, env={**env, "MAX_NUM_BATCHED_TOKENS": "16384"}))
    assert looser is not None and "lower MAX_NUM_BATCHED_TOKENS to 8192 (now 16384)" in looser


def test_message_after_both_relaunches_says_what_ran_and_lists_only_what_remains() -> None:
    tried = [
        Tried({"MAX_NUM_SEQS": "32"}),
        Tried({"ENFORCE_EAGER": "true", "MAX_NUM_BATCHED_TOKENS": "8192"}),
    ]
    env = {
        "MODEL_NAME": MODEL,
        "MAX_NUM_SEQS": "32",
        "ENFORCE_EAGER": "true",
        "MAX_NUM_BATCHED_TOKENS": "8192",
    }
    message = classify(Failure.of(t.KV_TOO_SMALL_WITH_ESTIMATE, MODEL, env=env, tried=tried))
    assert message is not None
    assert "Already tried: relaunched with MAX_NUM_SEQS=32; relaunched with ENFORCE_EAGER=true and MAX_NUM_BATCHED_TOKENS=8192." in message
    for applied in ("set MAX_NUM_SEQS", "set ENFORCE_EAGER", "set MAX_NUM_BATCHED_TOKENS"):
        assert applied not in message
    assert "set MAX_MODEL_LEN <= 77392" in message
    assert "quantized checkpoint" in message


def test_a_knob_named_in_tried_is_not_suggested_even_if_env_lacks_it() -> None:
    message = classify(Failure.of(t.NO_CACHE_BLOCKS, MODEL, env={}, tried=[Tried({"ENFORCE_EAGER": "true", "MAX_NUM_BATCHED_TOKENS": "8192"})]))
    assert message is not None
    assert "set ENFORCE_EAGER" not in message and "set MAX_NUM_BATCHED_TOKENS" not in message


@pytest.mark.parametrize(
    "env,expected",
    [
        ({"MAX_NUM_BATCHED_TOKENS": "4096"}, False),  # the user's tighter value is kept
        ({"MAX_NUM_BATCHED_TOKENS": "8192"}, False),
        ({"MAX_NUM_BATCHED_TOKENS": "0"}, False),  # 0 means unset: vLLM's default, at most 8192 on most cards
        ({"MAX_NUM_BATCHED_TOKENS": "16384"}, True),
        ({}, False),
    ],
)
def test_batched_tokens_suggested_only_when_above_8192(env: dict[str, str], expected: bool) -> None:
    message = classify(Failure.of(t.NO_CACHE_BLOCKS, MODEL, env=env))
    assert message is not None
    assert ("MAX_NUM_BATCHED_TOKENS" in message) is expected
    assert "set MAX_NUM_BATCHED_TOKENS=8192" not in message
    if expected:
        assert "lower MAX_NUM_BATCHED_TOKENS to 8192 (now 16384)" in message


@pytest.mark.parametrize(
    "env,expected",
    [
        ({"ENFORCE_EAGER": "true"}, False),
        ({"ENFORCE_EAGER": "1"}, False),
        ({"ENFORCE_EAGER": "false"}, True),
        ({}, True),
    ],
)
def test_eager_suggested_only_when_not_already_on(env: dict[str, str], expected: bool) -> None:
    message = classify(Failure.of(t.NO_CACHE_BLOCKS, MODEL, env=env))
    assert message is not None
    assert ("set ENFORCE_EAGER=true" in message) is expected


@pytest.mark.parametrize(
    "env,expected",
    [
        ({}, False),  # the worker default is already MAX_CONCURRENCY rounded up to 8
        ({"MAX_NUM_SEQS": "32"}, False),
        ({"MAX_NUM_SEQS": "16"}, False),
        ({"MAX_NUM_SEQS": "0"}, False),
        ({"MAX_NUM_SEQS": "256"}, True),
        ({"MAX_NUM_SEQS": "64", "MAX_CONCURRENCY": "64"}, False),
        ({"MAX_NUM_SEQS": "128", "MAX_CONCURRENCY": "64"}, True),
    ],
)
def test_max_num_seqs_suggested_only_above_concurrency(env: dict[str, str], expected: bool) -> None:
    message = classify(Failure.of(t.TORCH_OOM, MODEL, env=env))
    assert message is not None
    assert ("set MAX_NUM_SEQS=" in message) is expected


def test_utilization_advice_never_points_at_a_value_already_there() -> None:
    assert "raise GPU_MEMORY_UTILIZATION from 0.92 to 0.95" in (classify(Failure.of(t.NO_CACHE_BLOCKS, MODEL, env={})) or "")
    message = classify(Failure.of(t.NO_CACHE_BLOCKS, MODEL, env={"GPU_MEMORY_UTILIZATION": "0.95"}))
    assert message is not None and "GPU_MEMORY_UTILIZATION" not in message


def test_kv_dtype_advice_only_when_kv_cache_is_not_already_fp8() -> None:
    assert "KV_CACHE_DTYPE=fp8" in (classify(Failure.of(t.KV_TOO_SMALL_WITH_ESTIMATE, MODEL, env={})) or "")
    assert "KV_CACHE_DTYPE" not in (classify(Failure.of(t.KV_TOO_SMALL_WITH_ESTIMATE, MODEL, env={"KV_CACHE_DTYPE": "fp8"})) or "")


def test_cannot_auto_fit_is_a_memory_shortfall() -> None:
    # Under MAX_MODEL_LEN=auto this check runs before "No available memory for the cache blocks".
    diagnosis = diagnose(Failure.of(t.CANNOT_AUTO_FIT, MODEL, env={"MAX_MODEL_LEN": "auto"}))
    assert diagnosis is not None and diagnosis.kind == "memory_shortfall"
    assert "MAX_MODEL_LEN=auto could not fit even one token" in diagnosis.message


def test_sampler_warmup_names_the_batch_and_the_knob() -> None:
    message = classify(Failure.of(t.SAMPLER_WARMUP_OOM, MODEL, env={"MAX_NUM_SEQS": "256"}))
    assert message is not None
    assert "256 sequences" in message and "set MAX_NUM_SEQS=32" in message


def test_weights_that_do_not_fit_get_no_batch_or_graph_advice() -> None:
    message = classify(Failure.of(t.TORCH_OOM_AT_LOAD, MODEL, env={"MAX_NUM_SEQS": "256"}))
    assert message is not None
    assert "loading its weights" in message
    for knob in ("MAX_NUM_SEQS", "ENFORCE_EAGER", "MAX_NUM_BATCHED_TOKENS", "MAX_MODEL_LEN"):
        assert knob not in message
    assert "TENSOR_PARALLEL_SIZE" in message


# --- memory held / race -------------------------------------------------------------------


@pytest.mark.parametrize("name", ["FREE_MEMORY_LESS_THAN_DESIRED", "FREE_MEMORY_LESS_THAN_BUDGET", "CPU_AVAILABLE_LESS_THAN_DESIRED"])
def test_memory_held_is_not_a_sizing_problem(name: str) -> None:
    text = getattr(t, name)
    diagnosis = diagnose(Failure.of(text, MODEL, env={"GPU_MEMORY_UTILIZATION": "0.92"}))
    assert diagnosis is not None and diagnosis.kind == "memory_held"
    assert memory_held(Failure.of(text)) and not memory_shortfall(Failure.of(text))
    assert "GPU_MEMORY_UTILIZATION" not in diagnosis.message
    assert "not a problem with the model or its settings" in diagnosis.message


def test_memory_held_message_gives_the_numbers() -> None:
    message = classify(Failure.of(t.FREE_MEMORY_LESS_THAN_DESIRED, MODEL))
    assert message is not None
    assert "only 10.48 of 79.19 GiB was free on GPU cuda:0" in message and "72.85 GiB" in message


def test_memory_held_message_says_the_wait_already_ran() -> None:
    tried = [Tried(how="after_wait")]
    message = classify(Failure.of(t.FREE_MEMORY_LESS_THAN_DESIRED, MODEL, tried=tried))
    assert message is not None and "Already tried: waited for the memory to be released and relaunched with the same settings." in message


def test_the_info_line_of_a_successful_start_is_not_memory_held() -> None:
    info = [line for line in t.SUCCESS_GPU.splitlines() if "Free memory on device (" in line]
    assert len(info) == 1
    assert diagnose(Failure.of(info[0])) is None


def test_profiling_race_message() -> None:
    diagnosis = diagnose(Failure.of(t.PROFILING_RACE, MODEL))
    assert diagnosis is not None
    assert "from 61.2 to 63.71 GiB" in diagnosis.message
    assert "GPU_MEMORY_UTILIZATION" not in diagnosis.message


# --- configuration -----------------------------------------------------------------------


def test_max_model_len_above_the_model_limit() -> None:
    diagnosis = diagnose(Failure.of(t.MAX_MODEL_LEN_TOO_LARGE, MODEL, env={"MAX_MODEL_LEN": "200000"}))
    assert diagnosis is not None
    assert (diagnosis.variable, diagnosis.value) == ("MAX_MODEL_LEN", "200000")
    assert "MAX_MODEL_LEN=200000" in diagnosis.message
    assert "set MAX_MODEL_LEN to 131072 or less" in diagnosis.message
    assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN" not in diagnosis.message


def test_argparse_invalid_value_names_the_variable_and_value() -> None:
    diagnosis = diagnose(Failure.of(t.ARGPARSE_INVALID_INT, MODEL, exit_code=2, env={"MAX_NUM_SEQS": "abc"}))
    assert diagnosis is not None
    assert (diagnosis.variable, diagnosis.value) == ("MAX_NUM_SEQS", "abc")
    assert "MAX_NUM_SEQS='abc'" in diagnosis.message and "invalid int value" in diagnosis.message


def test_argparse_invalid_choice_lists_the_choices() -> None:
    message = classify(Failure.of(t.ARGPARSE_INVALID_CHOICE, MODEL, exit_code=2, env={"DTYPE": "float7"}))
    assert message is not None
    assert "DTYPE='float7'" in message and "'bfloat16'" in message


def test_unrecognized_arguments_point_at_vllm_extra_args() -> None:
    env = {"VLLM_EXTRA_ARGS": "--bogus-flag 1"}
    diagnosis = diagnose(Failure.of(t.ARGPARSE_UNRECOGNIZED, MODEL, exit_code=2, env=env))
    assert diagnosis is not None
    assert "--bogus-flag 1" in diagnosis.message and "VLLM_EXTRA_ARGS" in diagnosis.message


def test_pydantic_field_error_names_the_variable() -> None:
    diagnosis = diagnose(Failure.of(t.PYDANTIC_FIELD_ERROR, MODEL, env={"GPU_MEMORY_UTILIZATION": "1.5"}))
    assert diagnosis is not None
    assert (diagnosis.variable, diagnosis.value) == ("GPU_MEMORY_UTILIZATION", "1.5")
    assert "less than or equal to 1" in diagnosis.message


def test_architecture_messages_name_the_architecture() -> None:
    assert "FooBarForCausalLM" in (classify(Failure.of(t.UNSUPPORTED_ARCHITECTURE, MODEL)) or "")
    assert "v0.10.2" in (classify(Failure.of(t.PREVIOUSLY_SUPPORTED_ARCHITECTURE, MODEL)) or "")
    assert "'acme_unknown'" in (classify(Failure.of(t.UNKNOWN_MODEL_TYPE, MODEL)) or "")
    # The supported list vLLM prints is hundreds of names long; the message is not.
    assert len(classify(Failure.of(t.UNSUPPORTED_ARCHITECTURE, MODEL)) or "") < 400


def test_trust_remote_code_fix_only_when_not_already_set() -> None:
    assert "set TRUST_REMOTE_CODE=true" in (classify(Failure.of(t.TRUST_REMOTE_CODE, MODEL)) or "")
    message = classify(Failure.of(t.TRUST_REMOTE_CODE, MODEL, env={"TRUST_REMOTE_CODE": "true"}))
    assert message is not None and "set TRUST_REMOTE_CODE=true" not in message


def test_disk_full_names_the_path() -> None:
    diagnosis = diagnose(Failure.of(t.DISK_FULL, MODEL))
    assert diagnosis is not None
    assert "/root/.cache/huggingface/hub/models--acme--big-model" in diagnosis.message
    assert "larger container disk" in diagnosis.message


# --- Hub access: the pre-flight's sentences --------------------------------------------


def test_repo_not_found_reads_like_the_preflight() -> None:
    for text in (t.REPO_NOT_FOUND, t.REPO_NOT_FOUND_401):
        expected = failure_message(REPO_NOT_FOUND, Target("acme/missing-model", None), False)
        assert classify(Failure.of(text, "acme/missing-model")) == expected
        # The repository comes from the log when the caller does not pass one.
        assert classify(Failure.of(text)) == expected


@pytest.mark.parametrize("token_set", [False, True])
def test_gated_repo_reads_like_the_preflight(token_set: bool) -> None:
    env = {"HF_TOKEN": "hf_0123456789abcdef"} if token_set else {}
    expected = failure_message(GATED_REPO, Target("acme/gated-model", None), token_set)
    text = t.GATED_REPO_403 if token_set else t.GATED_REPO
    assert classify(Failure.of(text, "acme/gated-model", env=env)) == expected


def test_revision_not_found_reads_like_the_preflight() -> None:
    revision = "0123456789abcdef0123456789abcdef01234567"
    env = {"MODEL_NAME": "acme/gone-model", "MODEL_REVISION": revision}
    diagnosis = diagnose(Failure.of(t.REVISION_NOT_FOUND, "acme/gone-model", revision=revision, env=env))
    assert diagnosis is not None
    assert diagnosis.message == failure_message(REVISION_NOT_FOUND, Target("acme/gone-model", revision), False)
    assert (diagnosis.repo, diagnosis.revision) == ("acme/gone-model", revision)


def test_revision_pinned_by_vllm_itself_is_not_blamed_on_model_revision() -> None:
    message = classify(Failure.of(t.REVISION_NOT_FOUND, "acme/gone-model", env={"MODEL_NAME": "acme/gone-model"}))
    assert message is not None
    assert "MODEL_REVISION=" not in message and "disappeared" in message


def test_unauthorized_reads_like_the_preflight() -> None:
    env = {"HF_TOKEN": "hf_0123456789abcdef"}
    expected = failure_message(UNAUTHORIZED, Target("acme/some-model", None), True)
    assert classify(Failure.of(t.UNAUTHORIZED, "acme/some-model", env=env)) == expected


def test_the_log_names_the_repo_else_the_caller_does() -> None:
    only_status = "Invalid credentials in Authorization header"
    assert classify(Failure.of(only_status, "acme/passed")) == unauthorized_message("acme/passed")


def test_a_failing_tokenizer_repo_is_named_by_its_own_variable() -> None:
    env = {"MODEL_NAME": "acme/m", "TOKENIZER_NAME": "acme/missing-model"}
    message = classify(Failure.of(t.REPO_NOT_FOUND, "acme/m", env=env))
    assert message == repo_not_found_message("acme/missing-model", "TOKENIZER_NAME")


def test_the_repository_is_read_from_every_hub_wording() -> None:
    assert (diagnose(Failure.of(t.GATED_REPO_HAS_FILE)) or pytest.fail()).repo == "acme/gated-model"
    assert (diagnose(Failure.of(t.REPO_NOT_FOUND_HAS_FILE)) or pytest.fail()).repo == "acme/missing-model"
    assert (diagnose(Failure.of(t.UNAUTHORIZED)) or pytest.fail()).repo == "acme/some-model"


def test_a_401_inside_a_gated_or_missing_repo_chain_is_not_unauthorized() -> None:
    assert "'401 Unauthorized'" in t.GATED_REPO and "401 Client Error" in t.REPO_NOT_FOUND_401
    assert (diagnose(Failure.of(t.GATED_REPO)) or pytest.fail()).kind == "gated_repo"
    assert (diagnose(Failure.of(t.REPO_NOT_FOUND_401)) or pytest.fail()).kind == "repo_not_found"


def test_a_bare_401_line_after_the_specific_one_does_not_win() -> None:
    # vLLM's retry logger (vllm/transformers_utils/repo_utils.py:124) repeats the status line last.
    status_again = t.vllm_log(
        "Error retrieving file list: 401 Client Error. (Request ID: Root=1-abc)",
        level="ERROR",
        where="repo_utils.py:124",
        proc="APIServer pid=1",
    )
    for text, kind in ((t.GATED_REPO, "gated_repo"), (t.REPO_NOT_FOUND_401, "repo_not_found")):
        diagnosis = diagnose(Failure.of(text + "\n" + status_again))
        assert diagnosis is not None and diagnosis.kind == kind
    # Alone, the status line is all there is to go on.
    alone = diagnose(Failure.of(status_again, "acme/m"))
    assert alone is not None and alone.kind == "unauthorized"


# --- secrets ----------------------------------------------------------------------------


TOKEN = "hf_SuperSecretValue123"


@pytest.mark.parametrize("name", sorted([*MEMORY_SHORTFALL, *OTHER_CAUSES]))
def test_hf_token_value_never_appears(name: str) -> None:
    env = {"HF_TOKEN": TOKEN, "MODEL_NAME": MODEL}
    diagnosis = diagnose(Failure.of(getattr(t, name), MODEL, env=env))
    assert diagnosis is not None
    assert TOKEN not in diagnosis.message and TOKEN not in diagnosis.evidence


def test_a_secret_echoed_by_argparse_is_masked() -> None:
    text = f"usage: vllm serve [model_tag] [options]\nvllm: error: unrecognized arguments: --api-key {TOKEN}"
    env = {"HF_TOKEN": TOKEN, "VLLM_EXTRA_ARGS": f"--api-key {TOKEN}"}
    diagnosis = diagnose(Failure.of(text, MODEL, exit_code=2, env=env))
    assert diagnosis is not None
    assert TOKEN not in diagnosis.message and TOKEN not in diagnosis.evidence and TOKEN not in str(diagnosis.value)
    assert "***" in diagnosis.message


def test_values_of_ordinary_variables_are_not_mistaken_for_secrets() -> None:
    env = {"MAX_NUM_BATCHED_TOKENS": "16384", "TOKENIZER_NAME": "acme/tok"}
    message = classify(Failure.of(t.NO_CACHE_BLOCKS, MODEL, env=env))
    assert message is not None and "(now 16384)" in message


# --- real vLLM 0.32 CPU-engine output (tests/support/real_texts) ---------------------------

REAL = Path(__file__).resolve().parents[1] / "support" / "real_texts"
TINY = ".cache/tiny-llama"
# The worker configuration each capture ran with (tests/support/real_texts/README.md).
REAL_ENV = {"MODEL_NAME": TINY, "ENFORCE_EAGER": "true", "DTYPE": "bfloat16", "HF_HUB_OFFLINE": "1"}


def real(name: str) -> str:
    return (REAL / f"{name}.txt").read_text()


@pytest.mark.parametrize(
    "case,kv,length",
    [("kv_too_small", "262144", "512"), ("no_kv_memory", "131072", "512"), ("auto_fit", "131072", "auto")],
)
def test_a_real_cpu_kv_shortfall_with_a_fixed_kv_size_names_the_cpu_and_that_size(case: str, kv: str, length: str) -> None:
    env = {**REAL_ENV, "KV_CACHE_MEMORY_BYTES": kv, "MAX_MODEL_LEN": length, "MAX_NUM_SEQS": "256", "MAX_NUM_BATCHED_TOKENS": "16384"}
    diagnosis = diagnose(Failure.of(real(case), env=env))

    assert diagnosis is not None and (diagnosis.kind, diagnosis.detail) == ("memory_shortfall", case)
    assert diagnosis.facts["device"] == "CPU"
    assert (diagnosis.variable, diagnosis.value) == ("KV_CACHE_MEMORY_BYTES", kv)
    message = diagnosis.message
    assert "CPU" in message and "GPU" not in message and "CUDA" not in message
    assert f"KV_CACHE_MEMORY_BYTES={kv} ({int(kv) // 1024} KiB)" in message
    assert f"raise KV_CACHE_MEMORY_BYTES (now {kv})" in message
    # vLLM printed "0.0 GiB" for both figures: they say nothing and are not repeated.
    assert "0.0 GiB" in real(case) or case != "kv_too_small"
    assert " 0 GiB" not in message and "0.0 GiB" not in message
    # A fixed KV size: batch, graphs and utilization cannot change how much it holds.
    for knob in ("MAX_NUM_SEQS", "ENFORCE_EAGER", "MAX_NUM_BATCHED_TOKENS", "GPU_MEMORY_UTILIZATION"):
        assert knob not in message


def test_a_real_cpu_kv_too_small_gives_the_length_that_fits_its_kv_size() -> None:
    env = {**REAL_ENV, "KV_CACHE_MEMORY_BYTES": "262144", "MAX_MODEL_LEN": "512"}
    diagnosis = diagnose(Failure.of(real("kv_too_small"), env=env))
    assert diagnosis is not None and diagnosis.estimated_max_len == 128
    assert diagnosis.message.startswith(f"MODEL_NAME={TINY!r} does not fit in the CPU KV cache set by KV_CACHE_MEMORY_BYTES=262144")
    assert "at MAX_MODEL_LEN=512: one full-length sequence needs more KV cache than that" in diagnosis.message
    assert "set MAX_MODEL_LEN <= 128, about what KV_CACHE_MEMORY_BYTES=262144 holds" in diagnosis.message


def test_the_cpu_engine_is_recognised_from_its_output_alone() -> None:
    # No env at all: vLLM's own lines (device_config=cpu, "GiB for KV cache on node 0") tell.
    for case in ("kv_too_small", "no_kv_memory", "auto_fit"):
        diagnosis = diagnose(Failure.of(real(case)))
        assert diagnosis is not None and diagnosis.facts["device"] == "CPU", case
        assert "GPU" not in diagnosis.message, case
        assert "KV_CACHE_MEMORY_BYTES or VLLM_CPU_KVCACHE_SPACE" in diagnosis.message


@pytest.mark.parametrize("name", [*MEMORY_SHORTFALL])
def test_gpu_texts_are_never_taken_for_the_cpu_engine(name: str) -> None:
    diagnosis = diagnose(Failure.of(getattr(t, name), MODEL))
    assert diagnosis is not None
    assert diagnosis.facts["device"] == ("CPU" if name.startswith("CPU_") else "GPU")


def test_a_real_cpu_reservation_too_small_points_at_the_utilization() -> None:
    env = {**REAL_ENV, "MAX_MODEL_LEN": "512", "GPU_MEMORY_UTILIZATION": "0.01"}
    diagnosis = diagnose(Failure.of(real("cpu_kv_no_room"), env=env))
    assert diagnosis is not None and diagnosis.detail == "cpu_kv_no_room"
    assert "raise GPU_MEMORY_UTILIZATION from 0.01 to 0.95" in diagnosis.message


def test_the_cpu_kv_space_variable_is_named_when_it_set_the_size() -> None:
    env = {**REAL_ENV, "MAX_MODEL_LEN": "512", "VLLM_CPU_KVCACHE_SPACE": "1"}
    message = classify(Failure.of(real("kv_too_small"), env=env))
    assert message is not None and "VLLM_CPU_KVCACHE_SPACE=1 (1 GiB)" in message
    assert "raise VLLM_CPU_KVCACHE_SPACE (now 1)" in message


def test_a_gpu_kv_shortfall_with_a_fixed_kv_size_names_it_with_vllms_figures() -> None:
    env = {"MODEL_NAME": MODEL, "KV_CACHE_MEMORY_BYTES": "8G", "MAX_NUM_SEQS": "256"}
    diagnosis = diagnose(Failure.of(t.KV_TOO_SMALL_WITH_ESTIMATE, MODEL, env=env))
    assert diagnosis is not None and diagnosis.facts["device"] == "GPU"
    message = diagnosis.message
    assert "does not fit in the GPU KV cache set by KV_CACHE_MEMORY_BYTES=8G (8 GiB)" in message
    assert "set MAX_MODEL_LEN <= 77392, about what KV_CACHE_MEMORY_BYTES=8G holds" in message
    assert "raise KV_CACHE_MEMORY_BYTES (now 8G)" in message
    for knob in ("MAX_NUM_SEQS", "ENFORCE_EAGER", "MAX_NUM_BATCHED_TOKENS", "GPU_MEMORY_UTILIZATION"):
        assert knob not in message


def test_a_kv_size_in_extra_args_is_named_there() -> None:
    env = {"MODEL_NAME": MODEL, "VLLM_EXTRA_ARGS": "--kv-cache-memory-bytes=8G --max-num-seqs 16"}
    diagnosis = diagnose(Failure.of(t.NO_CACHE_BLOCKS, MODEL, env=env))
    assert diagnosis is not None and diagnosis.variable == "VLLM_EXTRA_ARGS"
    assert "--kv-cache-memory-bytes 8G in VLLM_EXTRA_ARGS" in diagnosis.message
    assert "GPU_MEMORY_UTILIZATION" not in diagnosis.message


def test_room_outside_a_fixed_kv_cache_comes_from_a_smaller_kv_size_not_the_utilization() -> None:
    message = classify(Failure.of(t.SAMPLER_WARMUP_OOM, MODEL, env={"KV_CACHE_MEMORY_BYTES": "20G"}))
    assert message is not None
    assert "lower KV_CACHE_MEMORY_BYTES (now 20G) to leave more room outside the KV cache" in message
    assert "GPU_MEMORY_UTILIZATION" not in message


def test_gib_figures_that_vllm_rounded_to_zero_are_not_quoted() -> None:
    text = t.KV_TOO_SMALL_WITH_ESTIMATE
    found = re.search(r"\(([\d.]+) GiB KV cache is needed, which is larger than the available KV cache memory \(([\d.]+) GiB\)", text)
    assert found is not None
    tiny = text.replace(f"({found.group(1)} GiB KV", "(0.0 GiB KV").replace(f"memory ({found.group(2)} GiB)", "memory (0.0 GiB)")
    diagnosis = diagnose(Failure.of(tiny, MODEL, env={"MAX_MODEL_LEN": "131072"}))
    assert diagnosis is not None
    assert "0 GiB" not in diagnosis.message
    assert "one full-length sequence needs more KV cache than is left after the weights and activations" in diagnosis.message
    assert "this GPU can serve about 77392 tokens" in diagnosis.message


def test_cuda_graphs_are_not_blamed_when_eager_mode_is_on() -> None:
    assert "CUDA graphs" in (classify(Failure.of(t.NO_CACHE_BLOCKS, MODEL, env={})) or "")
    assert "CUDA graphs" not in (classify(Failure.of(t.NO_CACHE_BLOCKS, MODEL, env={"ENFORCE_EAGER": "true"})) or "x CUDA graphs")


# --- model files: a missing local path, an uncached repo with the Hub off -------------------


def test_a_real_missing_local_path_is_explained() -> None:
    env = {**REAL_ENV, "MODEL_NAME": "/nonexistent/path"}
    diagnosis = diagnose(Failure.of(real("missing_local_path"), env=env, exit_code=1))
    assert diagnosis is not None and diagnosis.kind == "model_path_missing"
    assert (diagnosis.variable, diagnosis.value) == ("MODEL_NAME", "/nonexistent/path")
    assert diagnosis.message == model_path_missing_message("/nonexistent/path")
    assert "MODEL_NAME='/nonexistent/path' does not exist in this container" in diagnosis.message
    assert "network volume" in diagnosis.message and "repository id" in diagnosis.message
    # The path comes from vLLM's words when the caller does not know it.
    assert (diagnose(Failure.of(real("missing_local_path"))) or pytest.fail()).value == "/nonexistent/path"


def _hf_validation_text(reference: str) -> str:
    """huggingface_hub's own words for a reference it cannot take for a repo id, as vLLM's traceback ends."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(reference)
    except HFValidationError as error:
        return f"huggingface_hub.errors.HFValidationError: {error}"
    raise AssertionError(f"{reference!r} is a valid repo id")


@pytest.mark.parametrize("path", ["/models", "/runpod-volume/models/llama", "./model", "models/acme/llama", "../x"])
def test_every_validator_wording_for_a_path_is_a_missing_path(path: str) -> None:
    diagnosis = diagnose(Failure.of(_hf_validation_text(path), env={"MODEL_NAME": path}))
    assert diagnosis is not None and diagnosis.kind == "model_path_missing"
    assert diagnosis.message == model_path_missing_message(path)


def test_a_malformed_repo_id_is_not_called_a_path() -> None:
    diagnosis = diagnose(Failure.of(_hf_validation_text("acme/My Model"), env={"MODEL_NAME": "acme/My Model"}))
    assert diagnosis is not None and diagnosis.kind == "model_path_missing"
    assert diagnosis.message == invalid_model_name_message("acme/My Model")


def test_a_missing_tokenizer_path_names_its_own_variable() -> None:
    env = {"MODEL_NAME": "acme/m", "TOKENIZER_NAME": "/tok/missing"}
    diagnosis = diagnose(Failure.of(_hf_validation_text("/tok/missing"), env=env))
    assert diagnosis is not None and diagnosis.variable == "TOKENIZER_NAME"
    assert "TOKENIZER_NAME='/tok/missing'" in diagnosis.message


def test_a_real_uncached_repo_with_the_hub_offline_is_explained() -> None:
    env = {**REAL_ENV, "MODEL_NAME": "acme/does-not-exist-xyz"}
    diagnosis = diagnose(Failure.of(real("offline_uncached_repo"), env=env, exit_code=1))
    assert diagnosis is not None and diagnosis.kind == "offline_not_cached"
    assert diagnosis.repo == "acme/does-not-exist-xyz"
    assert diagnosis.message == offline_not_cached_message("acme/does-not-exist-xyz")
    assert "MODEL_NAME='acme/does-not-exist-xyz'" in diagnosis.message
    assert "unset HF_HUB_OFFLINE" in diagnosis.message and "bake the model" in diagnosis.message
    # huggingface_hub does not name the repository: vLLM's argument line does.
    assert (diagnose(Failure.of(real("offline_uncached_repo"))) or pytest.fail()).repo == "acme/does-not-exist-xyz"


def test_the_offline_variable_that_is_set_is_the_one_named(tmp_path: Path) -> None:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    # huggingface_hub's own error for a repo in no cache with downloads off (no network involved).
    with pytest.raises(LocalEntryNotFoundError) as caught:
        snapshot_download("acme/absent", local_files_only=True, cache_dir=tmp_path)
    text = f"huggingface_hub.errors.LocalEntryNotFoundError: {caught.value}"
    env = {"MODEL_NAME": "acme/absent", "TRANSFORMERS_OFFLINE": "1", "MODEL_REVISION": "v2"}
    diagnosis = diagnose(Failure.of(text, env=env))
    assert diagnosis is not None and diagnosis.kind == "offline_not_cached"
    assert "TRANSFORMERS_OFFLINE=1 forbids downloading it" in diagnosis.message
    assert "MODEL_NAME='acme/absent' at revision 'v2'" in diagnosis.message


@pytest.mark.parametrize("case", ["missing_local_path", "offline_uncached_repo", "kv_too_small", "no_kv_memory", "auto_fit"])
def test_real_texts_are_documented_kinds_and_never_leak_the_token(case: str) -> None:
    env = {**REAL_ENV, "HF_TOKEN": TOKEN}
    diagnosis = diagnose(Failure.of(real(case) + f"\nusing token {TOKEN}", env=env))
    assert diagnosis is not None and diagnosis.kind in KINDS
    assert TOKEN not in diagnosis.message and TOKEN not in diagnosis.evidence


def test_every_kind_has_its_entry_in_the_troubleshooting_guide() -> None:
    guide = (Path(__file__).resolve().parents[2] / "docs" / "troubleshooting.md").read_text()
    for kind in [*KINDS, *runtime.RUNTIME_KINDS]:
        assert f"(`{kind}`)" in guide, kind


# --- wording drift, the root error, weights that cannot fit (issue 9) ---------------------------


def test_wrapped_and_retyped_lines_still_name_the_cause() -> None:
    line = "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`."
    wrapped = [
        f"> {line}",
        f"vllm-1  | {line}",
        f"2025-01-02T03:04:05.123Z {line}",
        f"| (EngineCore_DP0 pid=7) ERROR 01-02 03:04:05 [core.py:1] {line}",
        f"`{line}`",
        line.lower(),
        # hard-wrapped mid-word at 60 columns
        line[:60] + "\n" + line[60:],
    ]
    for text in wrapped:
        diagnosis = diagnose(Failure.of(text))
        assert diagnosis is not None and diagnosis.detail == "no_kv_memory", text


def test_a_match_only_in_the_next_line_belongs_to_that_line() -> None:
    from vllm_worker.diagnosis.rules import clean_lines, find_hits

    lines = clean_lines("x" * 50 + "\nNo available memory for the cache blocks")
    assert [hit.index for hit in find_hits(lines)] == [1]


def test_the_root_error_is_the_innermost_of_the_last_chain_without_wrappers() -> None:
    from vllm_worker.diagnosis.rules import clean_lines, root_error

    text = "\n".join(
        [
            "WARNING harmless: ValueError: caught earlier",
            "Traceback (most recent call last):",
            "KeyError: 'rope_scaling'",
            "",
            "The above exception was the direct cause of the following exception:",
            "",
            "RuntimeError: could not build the model",
            "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
        ]
    )
    assert root_error(clean_lines(text)) == "KeyError: 'rope_scaling'"
    worker = "Exception: Worker failed with error 'weird thing happened', please check the stack trace above for the root cause"
    assert root_error(clean_lines(worker)) == "weird thing happened"


def test_an_unknown_failure_is_answered_with_the_root_error_and_exit_code() -> None:
    text = "Traceback (most recent call last):\nRuntimeError: the flux capacitor is misaligned\nEngineCore failed to start."
    assert diagnose(Failure.of(text)) is None
    diagnosis = startup_errors.explain(Failure.of(text, exit_code=1))
    assert diagnosis.kind == "unknown"
    assert diagnosis.message.startswith("vLLM failed to start: RuntimeError: the flux capacitor is misaligned (exit code 1).")
    assert "does not know this failure" in diagnosis.message


def test_an_engine_that_printed_nothing_is_answered_naming_vllm_command() -> None:
    diagnosis = startup_errors.explain(Failure.of("", exit_code=3))
    assert diagnosis.kind == "unknown" and "VLLM_COMMAND" in diagnosis.message and "exit code 3" in diagnosis.message


def test_harmless_import_warnings_of_a_good_start_are_not_the_cause() -> None:
    text = (
        "WARNING 01-02 03:04:05 [__init__.py:1] Failed to import from vllm._C with "
        "ImportError('libcuda.so.1: cannot open shared object file: No such file or directory')\n"
        "Traceback (most recent call last):\nRuntimeError: the flux capacitor is misaligned"
    )
    assert startup_errors.explain(Failure.of(text, exit_code=1)).kind == "unknown"


_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 896.00 MiB. GPU 0 has a total capacity of "
    "23.53 GiB of which 214.06 MiB is free."
)


def test_an_oom_while_loading_weights_is_not_relaunched_and_names_the_card() -> None:
    loading = "\n".join(
        [
            "INFO 01-02 03:04:05 [gpu_model_runner.py:1] Starting to load model acme/huge...",
            "Traceback (most recent call last):",
            '  File "/x/vllm/v1/worker/gpu_model_runner.py", line 1, in load_model',
            _OOM,
        ]
    )
    diagnosis = diagnose(Failure.of(loading, MODEL, weights_bytes=28 * 2**30))
    assert diagnosis is not None and diagnosis.detail == "weights_load"
    assert "23.53 GiB in all" in diagnosis.message and "28 GiB per GPU" in diagnosis.message
    after = loading.replace("in load_model", "in profile_run") + "\n"
    after = "INFO Model loading took 14.2 GiB memory and 3 seconds\n" + after.replace("Starting to load model", "x")
    assert diagnose(Failure.of(after, MODEL)).detail == "out_of_memory"  # type: ignore[union-attr]


def test_weights_larger_than_the_card_make_any_oom_a_weights_oom() -> None:
    assert diagnose(Failure.of(_OOM, MODEL)).detail == "out_of_memory"  # type: ignore[union-attr]
    assert diagnose(Failure.of(_OOM, MODEL, weights_bytes=30 * 2**30)).detail == "weights_load"  # type: ignore[union-attr]


def test_engine_command_failure_names_the_variable() -> None:
    diagnosis = startup_errors.engine_command_failure(["vlm", "serve"], "'vlm' was not found on PATH")
    assert diagnosis.kind == "engine_command"
    assert diagnosis.message.startswith("The engine command VLLM_COMMAND='vlm serve' cannot be started")


def test_a_missing_default_engine_command_does_not_tell_to_unset_it() -> None:
    diagnosis = startup_errors.engine_command_failure(["vllm", "serve"], "'vllm' was not found on the PATH", configured=False)
    assert diagnosis.message.startswith("vLLM is not installed where the worker looks")
    assert "unset" not in diagnosis.message


# --- issue 25: the four kinds of miss, from their libraries' wordings (real lines, with their URLs) -----

# vLLM's quantized layers checking one GPU's shard of a split layer (marlin_utils, fp8 block, awq/gptq).
WEIGHT_SHARD = {
    # https://github.com/vllm-project/vllm/issues/13640 (vLLM 0.7.2, Qwen2.5-VL-72B-AWQ at TP 2)
    "marlin min_thread_k": "ValueError: Weight input_size_per_partition = 14784 is not divisible by min_thread_k = 128. "
    "Consider reducing tensor_parallel_size or running with --quantization gptq.",
    # https://github.com/vllm-project/llm-compressor/issues/57 (vLLM 0.5.1, a multiprocessing worker's relay)
    "marlin relayed": "(VllmWorkerProcess pid=14679) ERROR 08-05 23:29:38 multiproc_worker_utils.py:226] Exception in "
    "worker VllmWorkerProcess while processing method load_model: Weight input_size_per_partition = 7392 is not "
    "divisible by min_thread_k = 128., Traceback (most recent call last):",
    # https://github.com/vllm-project/vllm/issues/13980 (AWQ/GPTQ, V0 multiprocessing engine)
    "awq not aligned": "ERROR 02-28 01:21:51 engine.py:400] ValueError: The input size is not aligned with the "
    "quantized weight shape. This can be caused by too large tensor parallel size.",
}


@pytest.mark.parametrize("name", sorted(WEIGHT_SHARD))
def test_a_split_a_quantized_kernel_cannot_take_is_named_with_a_smaller_split_as_the_fix(name: str) -> None:
    diagnosis = explain_with(WEIGHT_SHARD[name], {"TENSOR_PARALLEL_SIZE": "2"})
    assert diagnosis.kind == "tensor_parallel", diagnosis.message
    assert "TENSOR_PARALLEL_SIZE=2 splits a quantized layer" in diagnosis.message
    assert "set TENSOR_PARALLEL_SIZE lower" in diagnosis.message
    # Not the old answer of the "too large tensor parallel size" wording: the GPUs are there.
    assert "more GPUs than this worker has" not in diagnosis.message


# vllm/distributed/utils.py ensure_divisibility: the assert's message is only the two numbers.
BARE_DIVISIBILITY = {
    "under a rank prefix": "[rank0]: AssertionError: 32768 is not divisible by 3",  # vllm#6385
    "bare": "AssertionError: 250682 is not divisible by 8",  # vllm#440
}


@pytest.mark.parametrize("name", sorted(BARE_DIVISIBILITY))
def test_a_bare_divisibility_assert_is_a_tensor_parallel_layout(name: str) -> None:
    diagnosis = explain_with(t.engine_core_crash(BARE_DIVISIBILITY[name]), {"TENSOR_PARALLEL_SIZE": "3"})
    assert diagnosis.kind == "tensor_parallel", diagnosis.message
    assert diagnosis.message.startswith("TENSOR_PARALLEL_SIZE=3 does not fit the layout")


def test_a_divisibility_sentence_inside_other_words_is_not_taken_for_the_assert() -> None:
    # The bare rule takes the whole line only; a sentence that merely contains the words is another cause.
    text = t.engine_core_crash("ValueError: chunk 12 is not divisible by 5 in the user's own preprocessing step")
    assert diagnose(Failure.of(text, MODEL, exit_code=1)) is None


# CUDA errors 200/209 as torch and Triton's driver print them: kernels built for another architecture.
KERNEL_IMAGE = {
    # https://github.com/triton-lang/triton/issues/2971 (Triton's driver.utils.load_binary)
    "triton load_binary": 'File "/usr/local/lib/python3.9/site-packages/triton/compiler/compiler.py", line 285, in '
    "_init_handles\nRuntimeError: Triton Error [CUDA]: device kernel image is invalid.",
    # https://github.com/genmoai/mochi/issues/112 (through torch.compile's Inductor, as vLLM's compile runs it)
    "triton under inductor": "torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised:\n"
    "RuntimeError: Triton Error [CUDA]: device kernel image is invalid",
}


@pytest.mark.parametrize("name", sorted(KERNEL_IMAGE))
def test_an_invalid_kernel_image_is_this_gpus_architecture_not_a_failing_device(name: str) -> None:
    diagnosis = explain_with(t.engine_core_crash(KERNEL_IMAGE[name]), {})
    assert (diagnosis.kind, diagnosis.detail) == ("host_fault", "arch"), diagnosis.message
    assert "built for another architecture or by a CUDA newer than its driver" in diagnosis.message
    assert "choose a GPU type this image supports" in diagnosis.message


def test_cudas_no_kernel_image_line_is_the_architecture_too() -> None:
    # torch's C10_CUDA_CHECK wording: "CUDA error: ..." used to be taken for a failing device first.
    text = t.engine_core_crash("RuntimeError: CUDA error: no kernel image is available for execution on the device")
    assert explain_with(text, {}).detail == "arch"


# huggingface_hub utils/_validators.py validate_repo_id, in the wordings of several versions and wrappers.
REPO_ID_REFUSED = {
    # https://github.com/bytedance-iaas/vllm/issues/76 (vLLM 0.7.3's config.py retry wrapper, no class name)
    "vLLM's file-list retry": "ERROR 03-06 11:03:54 config.py:100] Error retrieving file list: Repo id must be in the "
    "form 'repo_name' or 'namespace/repo_name': '/home/Models/Qwen2.5-7B-Instruct-GPTQ-Int4/'. Use `repo_type` "
    "argument if needed",
    # https://github.com/vllm-project/vllm/issues/5727 (the wording before huggingface_hub 1.0)
    "old alphanumeric": "huggingface_hub.errors.HFValidationError: Repo id must use alphanumeric chars or '-', '_', "
    "'.', '--' and '..' are forbidden, '-' and '.' cannot start or end the name, max length is 96: '/model'.",
    # https://github.com/gpustack/gpustack/issues/1268 (vLLM's engine.py logging the message without its class)
    "engine log without class": "ERROR 02-20 10:13:40 engine.py:389] Repo id must be in the form 'repo_name' or "
    "'namespace/repo_name': '/data/models/cache/model_scope/deepseek-ai/DeepSeek-R1-Distill-Llama-70B'. Use "
    "`repo_type` argument if needed.",
}


@pytest.mark.parametrize("name", sorted(REPO_ID_REFUSED))
def test_a_repo_id_the_validator_refuses_names_the_path_that_does_not_exist(name: str) -> None:
    diagnosis = explain_with(REPO_ID_REFUSED[name], {})
    assert diagnosis.kind == "model_path_missing", diagnosis.message
    path = re.findall(r"'(/[^']*)'", REPO_ID_REFUSED[name])[-1]
    assert f"MODEL_NAME={path!r} does not exist in this container" in diagnosis.message


def test_the_validators_current_wordings_are_known() -> None:
    # huggingface_hub 2.4 (this repository's .venv), utils/_validators.py: two of its sentences.
    for line in (
        "huggingface_hub.errors.HFValidationError: Repo id must use alphanumeric chars, '-', '_' or '.'. The name "
        "cannot start or end with '-' or '.' and the maximum length is 96: 'my model'.",
        "huggingface_hub.errors.HFValidationError: Repo id must be a string, not <class 'NoneType'>: 'None'.",
    ):
        assert explain_with(t.engine_core_crash(line), {}).kind == "model_path_missing", line


# vLLM's load_weights meeting a checkpoint tensor its implementation has no parameter for.
WEIGHT_NAMES = {
    # https://github.com/vllm-project/vllm/issues/23025 (GLM-4.5-Air, the 0.10 V1 worker's prefix)
    "glm4_moe": "\n".join([
        '(VllmWorker rank=0 pid=3781015) ERROR 08-16 11:45:16 [multiproc_executor.py:511]   File "/home/datnvt/.conda/'
        'envs/vllm/lib/python3.12/site-packages/vllm/model_executor/models/glm4_moe.py", line 531, in load_weights',
        "(VllmWorker rank=0 pid=3781015) ERROR 08-16 11:45:16 [multiproc_executor.py:511]     param = "
        "params_dict[name_mapped]",
        "(VllmWorker rank=0 pid=3781015) ERROR 08-16 11:45:16 [multiproc_executor.py:511] KeyError: "
        "'layers.1.mlp.experts.w13_weight'",
    ]),
    # https://github.com/vllm-project/llm-compressor/issues/959 (a compressed checkpoint's scales)
    "qwen2 weight_scale": "\n".join([
        'ERROR 12-05 20:24:46 engine.py:366]   File "/data/projects/hcece/miniconda3/envs/vllm_wjy_python3.10/lib/'
        'python3.10/site-packages/vllm/model_executor/models/qwen2.py", line 371, in load_weights',
        "ERROR 12-05 20:24:46 engine.py:366]     param = params_dict[name]",
        "ERROR 12-05 20:24:46 engine.py:366] KeyError: 'layers.0.mlp.down_proj.weight_scale'",
    ]),
}


@pytest.mark.parametrize("name", sorted(WEIGHT_NAMES))
def test_a_key_error_in_load_weights_names_the_model_the_architecture_and_what_to_try(name: str) -> None:
    diagnosis = startup_errors.explain(Failure.of(WEIGHT_NAMES[name], "acme/checkpoint", exit_code=1))
    assert (diagnosis.kind, diagnosis.detail) == ("unsupported_architecture", "weight_names"), diagnosis.message
    tensor = re.search(r"KeyError: '([^']+)'", WEIGHT_NAMES[name]).group(1)
    assert f"MODEL_NAME='acme/checkpoint''s checkpoint holds a weight named {tensor!r}" in diagnosis.message
    assert f"its {name.split()[0]} implementation" in diagnosis.message
    assert "run a vLLM release that supports this checkpoint" in diagnosis.message
    assert "set MODEL_REVISION to a revision" in diagnosis.message


def test_the_architecture_vllm_resolved_is_named_when_the_log_has_it() -> None:
    text = t.vllm_log("Resolved architecture: Glm4MoeForCausalLM", where="model.py:684") + "\n" + WEIGHT_NAMES["glm4_moe"]
    assert "loader for Glm4MoeForCausalLM does not know" in startup_errors.explain(Failure.of(text, "acme/c", exit_code=1)).message


def test_a_key_error_that_is_not_a_weight_name_is_not_a_checkpoint_layout() -> None:
    # transformers' config lookup raises KeyError: 'qwen3_moe' (a model type, no dotted path): not this rule.
    text = t.engine_core_crash("KeyError: 'qwen3_moe'")
    assert startup_errors.explain(Failure.of(text, MODEL, exit_code=1)).detail != "weight_names"


# --- issue 22 item 7: the NCCL rule's wordings and its tier, on the diagnosis (real lines) ---------------

# https://github.com/vllm-project/vllm/issues/5458: torch's NCCL watchdog at a TP start, no other NCCL wording.
NCCL_WATCHDOG = "\n".join([
    "[rank0]:[E ProcessGroupNCCL.cpp:563] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, "
    "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600086 milliseconds before timing out.",
    "[rank0]:[E ProcessGroupNCCL.cpp:1537] [PG 0 Rank 0] Timeout at NCCL work: 1, last enqueued NCCL work: 1, last "
    "completed NCCL work: 0.",
])


def test_the_nccl_watchdog_timeout_is_a_fault_of_the_machines_interconnect() -> None:
    diagnosis = explain_with(NCCL_WATCHDOG, {"TENSOR_PARALLEL_SIZE": "2"})
    assert (diagnosis.kind, diagnosis.detail) == ("host_fault", "nccl"), diagnosis.message
    assert "NCCL_P2P_DISABLE=1" in diagnosis.message


def test_an_nccl_echo_after_an_out_of_memory_in_another_rank_leaves_the_memory_as_the_cause() -> None:
    # The tier: NCCL names the cause only when no settings cause matched. The out-of-memory line is
    # vllm#372's (torch's allocator), the NCCL lines vllm#5458's, in the order a TP start prints them.
    oom = (
        "OutOfMemoryError: CUDA out of memory. Tried to allocate 294.00 MiB (GPU 0; 22.19 GiB total capacity; 21.35 "
        "GiB already allocated; 46.50 MiB free; 21.35 GiB reserved in total by PyTorch)"
    )
    diagnosis = explain_with(oom + "\n" + NCCL_WATCHDOG, {"TENSOR_PARALLEL_SIZE": "2"})
    assert diagnosis.kind == "memory_shortfall", diagnosis.message
    # The same NCCL lines before a settings cause that is not memory: the settings cause still wins.
    divisible = "[rank0]: AssertionError: 32768 is not divisible by 3"  # vllm#6385
    assert explain_with(divisible + "\n" + NCCL_WATCHDOG, {"TENSOR_PARALLEL_SIZE": "3"}).kind == "tensor_parallel"


def explain_with(output: str, env: dict[str, str]) -> "verdict.Diagnosis":
    return startup_errors.explain(Failure.of(output, exit_code=1, env=env))
