"""Every variable of Runpod's official vLLM worker takes effect here or is answered: none is dropped silently.

The names are those of the official worker's Hub form (`.runpod/hub.json`), its README's
variable tables and its configuration reference, stored as a list with the commit they were
read from (tests/field/official_worker/names.json). Each one, set on its own to a value that is
not the form's default, must change the `vllm serve` command as the table says (the option it
names, with the value), change the worker's own settings, reach the engine's environment, or
draw a warning that names it (the log and the status job carry the launch's warnings).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_worker.config import args_builder, command, official_worker, settings
from vllm_worker.config.profile import LaunchProfile
from vllm_worker.config.official_worker import OFFICIAL

NAMES_FILE = Path(__file__).resolve().parents[1] / "field" / "official_worker" / "names.json"
NAMES = json.loads(NAMES_FILE.read_text())
ALL_NAMES = sorted({*NAMES["hub_json"], *NAMES["readme"], *NAMES["configuration_md"]})
BASE = {"MODEL_NAME": "org/model"}

# A value other than the official form's default for each of its variables.
NOT_DEFAULT: dict[str, str] = {
    "MODEL_NAME": "org/other-model",
    "MODEL_REVISION": "v2",
    "TOKENIZER": "org/tokenizer",
    "TOKENIZER_NAME": "org/tokenizer",
    "TOKENIZER_REVISION": "v1",
    "TOKENIZER_MODE": "slow",
    "SKIP_TOKENIZER_INIT": "true",
    "TRUST_REMOTE_CODE": "true",
    "DOWNLOAD_DIR": "/runpod-volume/weights",
    "LOAD_FORMAT": "safetensors",
    "DTYPE": "half",
    "KV_CACHE_DTYPE": "fp8",
    "MAX_MODEL_LEN": "4096",
    "DISTRIBUTED_EXECUTOR_BACKEND": "ray",
    "RAY_WORKERS_USE_NSIGHT": "true",
    "PIPELINE_PARALLEL_SIZE": "2",
    "TENSOR_PARALLEL_SIZE": "2",
    "MAX_PARALLEL_LOADING_WORKERS": "2",
    "ENABLE_PREFIX_CACHING": "true",
    "DISABLE_SLIDING_WINDOW": "true",
    "SEED": "7",
    "MAX_NUM_SEQS": "64",
    "MAX_LOGPROBS": "5",
    "DISABLE_LOG_STATS": "true",
    "QUANTIZATION": "awq",
    "ENABLE_LORA": "true",
    "MAX_LORAS": "2",
    "MAX_LORA_RANK": "32",
    "LORA_DTYPE": "float16",
    "MAX_CPU_LORAS": "4",
    "FULLY_SHARDED_LORAS": "true",
    "DEVICE": "cpu",
    "SCHEDULER_DELAY_FACTOR": "0.5",
    "ENABLE_CHUNKED_PREFILL": "false",
    "SPECULATIVE_CONFIG": '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}',
    "SPECULATIVE_METHOD": "eagle3",
    "SPECULATIVE_MODEL": "org/draft",
    "NUM_SPECULATIVE_TOKENS": "3",
    "NGRAM_PROMPT_LOOKUP_MAX": "4",
    "MODEL_LOADER_EXTRA_CONFIG": '{"enable_multithread_load": true}',
    "ENABLE_LOG_REQUESTS": "true",
    "CUSTOM_CHAT_TEMPLATE": "{% for m in messages %}{{ m.content }}{% endfor %}",
    "GPU_MEMORY_UTILIZATION": "0.8",
    "BLOCK_SIZE": "32",
    "ENFORCE_EAGER": "true",
    "DISABLE_CUSTOM_ALL_REDUCE": "true",
    "DEFAULT_BATCH_SIZE": "10",
    "DEFAULT_MIN_BATCH_SIZE": "2",
    "DEFAULT_BATCH_SIZE_GROWTH_FACTOR": "2",
    "RAW_OPENAI_OUTPUT": "false",
    "OPENAI_RESPONSE_ROLE": "narrator",
    "OPENAI_SERVED_MODEL_NAME_OVERRIDE": "my-model",
    "MAX_CONCURRENCY": "8",
    "ENABLE_EXPERT_PARALLEL": "true",
    "BASE_PATH": "/workspace",
    "ENABLE_AUTO_TOOL_CHOICE": "true",
    "TOOL_CALL_PARSER": "hermes",
    "REASONING_PARSER": "qwen3",
    "PYTORCH_ALLOC_CONF": "expandable_segments:False",
    "VLLM_USE_DEEP_GEMM": "1",
    "HF_TOKEN": "hf_not_a_real_token",
    "VLLM_EXTRA_ARGS": "--max-num-batched-tokens 4096",
    "VLLM_CONFIG_FILE": "/runpod-volume/vllm.yaml",
    "VLLM_PORT": "8100",
    "VLLM_STARTUP_TIMEOUT": "1800",
    "REQUEST_TIMEOUT": "1200",
}


def build(env: dict[str, str]) -> tuple[command.BuiltArgs, settings.Settings]:
    loaded = settings.load(env)
    return command.build_args(LaunchProfile.parse(env), loaded), loaded


def has_flag(argv: list[str], flag: str, value: str | None) -> bool:
    """`flag` in argv, followed by `value` when one is given."""
    return any(arg == flag and (value is None or argv[i + 1 : i + 2] == [value]) for i, arg in enumerate(argv))


def flag_args(name: str, value: str) -> tuple[str, str | None]:
    """The argument(s) a vLLM option variable set to `value` is expected to become."""
    option = args_builder.OPTIONS[name]
    if option["kind"] in ("pair", "store_true"):
        on = args_builder.parse_bool(name, value)
        return (option["flag"] if on else "--no-" + option["flag"][2:]), None
    return option["flag"], value


def test_the_stored_names_come_from_the_official_repository() -> None:
    assert NAMES["repository"] == "https://github.com/runpod-workers/worker-vllm"
    assert len(NAMES["commit"]) == 40 and all(NAMES["commit"] in url for url in NAMES["sources"].values())
    assert len(NAMES["hub_json"]) == len(set(NAMES["hub_json"])) == 60


def test_every_official_name_is_in_the_table_and_has_a_test_value() -> None:
    assert sorted(set(ALL_NAMES) - set(OFFICIAL)) == []
    assert sorted(set(ALL_NAMES) - set(NOT_DEFAULT)) == []
    same = [n for n in ALL_NAMES if OFFICIAL[n].default is not None and official_worker._same(NOT_DEFAULT[n], OFFICIAL[n].default)]
    assert same == [], f"test values equal to the form's default: {same}"


@pytest.mark.parametrize("name", ALL_NAMES)
def test_no_official_variable_is_dropped_silently(name: str) -> None:
    entry, value = OFFICIAL[name], NOT_DEFAULT[name]
    before, before_settings = build(BASE)
    after, after_settings = build({**BASE, name: value})
    naming = [w for w in after.warnings if name in w]
    # Only a variable the worker answers may be named in a warning that says it does nothing.
    if entry.how not in ("answered", "removed"):
        assert not [w for w in naming if "no effect" in w or "is ignored" in w or "did you mean" in w], naming

    if entry.how == "option":
        flag, expected = flag_args(entry.target or name, value)
        assert has_flag(after.argv, flag, expected) and not has_flag(before.argv, flag, expected), after.argv
    elif entry.how == "alias":
        if name == "MODEL_NAME":
            assert after.argv[len(after_settings.vllm_command)] == value
        else:
            flag = "--config" if entry.target == "CONFIG" else args_builder.OPTIONS[entry.target or ""]["flag"]
            assert has_flag(after.argv, flag, value) and not has_flag(before.argv, flag, None), after.argv
    elif entry.how == "folded":
        spec = json.loads(after.argv[after.argv.index("--speculative-config") + 1])
        assert spec[entry.target or ""] == (value if entry.target in ("method", "model") else int(value)), spec
    elif entry.how == "worker":
        assert after_settings != before_settings or after.argv[-len(value.split()) :] == value.split()
    elif entry.how == "engine_env":
        assert after.engine_env.get(name) == value and name not in " ".join(after.argv)
    elif entry.how == "volume":
        # BASE_PATH is the volume's root, which the image's caches live under: known, never answered as dropped.
        assert naming == []
    else:
        assert entry.how in ("answered", "removed")
        assert len(naming) == 1, after.warnings
        assert naming[0].startswith(f"{name}={value!r}") and ("no effect" in naming[0] or "is ignored" in naming[0])


def test_the_official_form_at_its_defaults_starts_without_a_word() -> None:
    """The Hub form writes every default into the endpoint; the defaults of the answered ones ask for nothing."""
    hub_defaults = {n: OFFICIAL[n].default for n in NAMES["hub_json"] if OFFICIAL[n].default is not None}
    built, _ = build({**BASE, **hub_defaults})  # type: ignore[arg-type]
    assert built.warnings == []
    assert has_flag(built.argv, "--response-role", "assistant")
    assert "--speculative-config" not in built.argv


# --- the speculative-decoding variables, folded into --speculative-config


def spec_of(env: dict[str, str]) -> dict[str, object]:
    argv = build({**BASE, **env})[0].argv
    return json.loads(argv[argv.index("--speculative-config") + 1])


def test_a_draft_model_and_its_token_count_make_one_config() -> None:
    assert spec_of({"SPECULATIVE_MODEL": "org/draft", "NUM_SPECULATIVE_TOKENS": "5", "SPECULATIVE_METHOD": "draft_model"}) == {
        "method": "draft_model",
        "model": "org/draft",
        "num_speculative_tokens": 5,
    }


def test_ngram_window_sizes_alone_mean_the_ngram_method() -> None:
    assert spec_of({"NGRAM_PROMPT_LOOKUP_MAX": "4", "NUM_SPECULATIVE_TOKENS": "3"}) == {
        "num_speculative_tokens": 3,
        "prompt_lookup_max": 4,
        "method": "ngram",
    }
    # With a draft model named, the window sizes are passed on and the method is left to vLLM.
    assert "method" not in spec_of({"NGRAM_PROMPT_LOOKUP_MAX": "4", "SPECULATIVE_MODEL": "org/draft"})


def test_zero_and_blank_mean_unset_as_the_form_leaves_them() -> None:
    built, _ = build({**BASE, "NUM_SPECULATIVE_TOKENS": "0", "SPECULATIVE_METHOD": "", "NGRAM_PROMPT_LOOKUP_MAX": "0"})
    assert "--speculative-config" not in built.argv


def test_folded_fields_join_speculative_config() -> None:
    spec = spec_of({"SPECULATIVE_CONFIG": '{"model": "org/draft", "draft_tensor_parallel_size": 1}', "NUM_SPECULATIVE_TOKENS": "4"})
    assert spec == {"model": "org/draft", "draft_tensor_parallel_size": 1, "num_speculative_tokens": 4}
    # The same value in both places is no conflict.
    assert spec_of({"SPECULATIVE_CONFIG": '{"num_speculative_tokens": 4}', "NUM_SPECULATIVE_TOKENS": "4"}) == {"num_speculative_tokens": 4}


@pytest.mark.parametrize(
    ("env", "sentence"),
    [
        (
            {"SPECULATIVE_CONFIG": '{"num_speculative_tokens": 3}', "NUM_SPECULATIVE_TOKENS": "5"},
            "NUM_SPECULATIVE_TOKENS='5' is not valid: SPECULATIVE_CONFIG sets num_speculative_tokens to 3; set it in one place only.",
        ),
        (
            {"NUM_SPECULATIVE_TOKENS": "three"},
            "NUM_SPECULATIVE_TOKENS='three' is not valid: a whole number greater than 0 (it becomes num_speculative_tokens of SPECULATIVE_CONFIG).",
        ),
        (
            {"SPECULATIVE_CONFIG": "[1, 2]", "SPECULATIVE_MODEL": "org/draft"},
            "SPECULATIVE_CONFIG='[1, 2]' is not valid: a JSON object, to be combined with SPECULATIVE_MODEL.",
        ),
        (
            {"SPEC_TOKENS": "3", "NUM_SPECULATIVE_TOKENS": "3"},
            "NUM_SPECULATIVE_TOKENS='3' is not valid: SPEC_TOKENS sets the same speculative-config field (num_speculative_tokens); set only one of them.",
        ),
    ],
)
def test_a_speculative_value_the_worker_cannot_fold_is_refused_before_launch(env: dict[str, str], sentence: str) -> None:
    with pytest.raises(args_builder.ArgsError) as caught:
        build({**BASE, **env})
    assert str(caught.value) == sentence


def test_an_unknown_speculative_method_is_answered_from_vllms_choices() -> None:
    with pytest.raises(args_builder.ArgsError) as caught:
        build({**BASE, "SPECULATIVE_METHOD": "eagle4", "SPECULATIVE_MODEL": "org/draft"})
    assert str(caught.value).startswith("SPECULATIVE_METHOD='eagle4'")
    assert "--spec-method takes one of" in str(caught.value)


def test_vllm_extra_args_still_wins_over_the_folded_config() -> None:
    built, _ = build({**BASE, "SPECULATIVE_MODEL": "org/draft", "VLLM_EXTRA_ARGS": "--speculative-config '{\"method\": \"ngram\"}'"})
    assert any(w.startswith("SPECULATIVE_MODEL sets --speculative-config, but VLLM_EXTRA_ARGS sets it too") for w in built.warnings)


# --- OPENAI_RESPONSE_ROLE is vLLM's --response-role


def test_openai_response_role_and_response_role_are_one_option() -> None:
    assert has_flag(build({**BASE, "OPENAI_RESPONSE_ROLE": "bot"})[0].argv, "--response-role", "bot")
    assert has_flag(build({**BASE, "OPENAI_RESPONSE_ROLE": "bot", "RESPONSE_ROLE": "bot"})[0].argv, "--response-role", "bot")
    with pytest.raises(args_builder.ArgsError, match="disagrees with OPENAI_RESPONSE_ROLE='bot'"):
        build({**BASE, "OPENAI_RESPONSE_ROLE": "bot", "RESPONSE_ROLE": "narrator"})


def test_answered_variables_at_the_forms_default_stay_quiet_whatever_the_spelling() -> None:
    quiet = {"DEVICE": "AUTO", "RAW_OPENAI_OUTPUT": "True", "DEFAULT_BATCH_SIZE": "50.0", "DEFAULT_MIN_BATCH_SIZE": "1"}
    assert official_worker.notices(quiet) == []
    assert len(official_worker.notices({**quiet, "RAW_OPENAI_OUTPUT": "0"})) == 1


def test_the_migration_guide_says_what_becomes_of_every_official_variable() -> None:
    guide = (Path(__file__).resolve().parents[2] / "docs" / "migration.md").read_text()
    missing = [name for name in ALL_NAMES if f"`{name}`" not in guide]
    assert missing == [], f"docs/migration.md does not mention {missing}"
