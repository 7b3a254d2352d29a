"""env -> `vllm serve` argv: kinds, aliases, precedence, defaults and secrets."""

from __future__ import annotations

import re
import shlex

import pytest

from vllm_worker import args_builder
from vllm_worker.args_builder import (
    ALIASES,
    FLAGS,
    LEGACY_ALIASES,
    REMOVED_NOTES,
    ZERO_MEANS_UNSET,
    ArgsError,
    build_args,
    flag_for,
    is_true,
    mask,
    parse_bool,
)
from vllm_worker.settings import Settings, SettingsError, load

SETTINGS = Settings()
TOKEN = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"


def build(settings: Settings = SETTINGS, **env: str):
    return build_args({"MODEL_NAME": "org/model", **env}, settings)


def flags_after_port(argv: list[str]) -> list[str]:
    """The part of argv after `--port N`: what the table and VLLM_EXTRA_ARGS produced."""
    return argv[argv.index("--port") + 2 :]


def without_default_seqs(argv: list[str]) -> list[str]:
    rest = flags_after_port(argv)
    i = rest.index("--max-num-seqs")
    return rest[:i] + rest[i + 2 :]


# --- the table itself -------------------------------------------------------


def test_table_names_are_upper_snake_and_kinds_known():
    for name, kind in FLAGS.items():
        assert re.fullmatch(r"[A-Z][A-Z0-9]*(_[A-Z0-9]+)*", name), name
        assert kind in ("value", "list", "pair", "store_true", "removed"), (name, kind)


def test_every_removed_entry_has_a_note_and_only_those():
    removed = {name for name, kind in FLAGS.items() if kind == "removed"}
    assert removed == set(REMOVED_NOTES)


def test_table_covers_what_a_worker_user_needs():
    live = [name for name, kind in FLAGS.items() if kind != "removed"]
    assert len(live) >= 60
    for name in (
        "MAX_MODEL_LEN", "GPU_MEMORY_UTILIZATION", "MAX_NUM_SEQS", "MAX_NUM_BATCHED_TOKENS", "ENFORCE_EAGER",
        "KV_CACHE_DTYPE", "TENSOR_PARALLEL_SIZE", "QUANTIZATION", "TRUST_REMOTE_CODE", "ENABLE_PREFIX_CACHING",
        "ENABLE_CHUNKED_PREFILL", "ENABLE_LORA", "LORA_MODULES", "CHAT_TEMPLATE", "ENABLE_AUTO_TOOL_CHOICE",
        "TOOL_CALL_PARSER", "REASONING_PARSER", "STRUCTURED_OUTPUTS_CONFIG", "ENABLE_LOG_REQUESTS",
    ):
        assert FLAGS[name] != "removed", name


def test_worker_owned_and_secret_flags_are_not_in_the_table():
    for name in ("HF_TOKEN", "API_KEY", "HOST", "PORT", "UDS", "MODEL", "MODEL_NAME", "CONFIG", "HEADLESS"):
        assert name not in FLAGS, name


def test_aliases_point_at_live_table_entries():
    for alias, name in {**ALIASES, **LEGACY_ALIASES}.items():
        assert alias not in FLAGS
        assert FLAGS[name] != "removed", alias


def test_flag_for():
    assert flag_for("MAX_MODEL_LEN") == "--max-model-len"


# --- the command line's fixed head -------------------------------------------


def test_argv_starts_with_command_model_host_port():
    built = build()
    assert built.argv[:7] == ["vllm", "serve", "org/model", "--host", "127.0.0.1", "--port", "8000"]


def test_argv_uses_settings_command_and_port():
    settings = load({"VLLM_COMMAND": "python -m vllm.entrypoints.cli.main serve", "VLLM_PORT": "9123"})
    built = build(settings)
    assert built.argv[:8] == ["python", "-m", "vllm.entrypoints.cli.main", "serve", "org/model", "--host",
                              "127.0.0.1", "--port"]
    assert built.argv[8] == "9123"


def test_missing_model_name_is_an_error_naming_it():
    with pytest.raises(ArgsError) as info:
        build_args({}, SETTINGS)
    assert info.value.variable == "MODEL_NAME"
    assert str(info.value).startswith("MODEL_NAME is not set")
    assert isinstance(info.value, ValueError)


def test_blank_model_name_is_missing():
    with pytest.raises(ArgsError, match="MODEL_NAME"):
        build_args({"MODEL_NAME": "   "}, SETTINGS)


# --- kinds -------------------------------------------------------------------


def test_value_kind():
    built = build(MAX_MODEL_LEN="4096", GPU_MEMORY_UTILIZATION=" 0.85 ")
    rest = without_default_seqs(built.argv)
    assert rest == ["--max-model-len", "4096", "--gpu-memory-utilization", "0.85"]


def test_value_starting_with_dash_is_attached_with_equals():
    built = build(SEED="-1")
    assert "--seed=-1" in built.argv


def test_empty_value_is_unset():
    built = build(MAX_MODEL_LEN="", ENFORCE_EAGER="  ", QUANTIZATION="")
    assert without_default_seqs(built.argv) == []


@pytest.mark.parametrize("word", ["true", "TRUE", "1", "yes", "On", " true "])
def test_pair_true(word):
    built = build(ENFORCE_EAGER=word)
    assert "--enforce-eager" in built.argv
    assert "--no-enforce-eager" not in built.argv


@pytest.mark.parametrize("word", ["false", "False", "0", "no", "OFF"])
def test_pair_false(word):
    built = build(ENABLE_PREFIX_CACHING=word)
    assert "--no-enable-prefix-caching" in built.argv
    assert "--enable-prefix-caching" not in built.argv


def test_store_true():
    assert "--disable-log-stats" in build(DISABLE_LOG_STATS="yes").argv
    assert without_default_seqs(build(DISABLE_LOG_STATS="no").argv) == []


@pytest.mark.parametrize("name", ["ENFORCE_EAGER", "DISABLE_LOG_STATS", "TRUST_REMOTE_CODE"])
def test_invalid_boolean_names_variable_and_value(name):
    with pytest.raises(ArgsError) as info:
        build(**{name: "maybe"})
    assert str(info.value) == f"{name}='maybe' is not valid: use true or false (also 1/0, yes/no, on/off)."
    assert (info.value.variable, info.value.value) == (name, "maybe")


def test_list_kind_splits_like_shell_words():
    built = build(LORA_MODULES="sql=org/sql-lora 'chat=/loras/my chat'")
    rest = without_default_seqs(built.argv)
    assert rest == ["--lora-modules", "sql=org/sql-lora", "chat=/loras/my chat"]


def test_list_kind_keeps_json_whole():
    value = '{"name": "sql", "path": "org/sql-lora", "base_model_name": "org/model"}'
    built = build(LORA_MODULES=value)
    assert without_default_seqs(built.argv) == ["--lora-modules", value]


def test_list_kind_bad_quoting_names_the_variable():
    with pytest.raises(ArgsError) as info:
        build(IGNORE_PATTERNS="'*.pt")
    assert info.value.variable == "IGNORE_PATTERNS"
    assert "quotes are unbalanced" in str(info.value)


def test_removed_is_dropped_with_a_warning_naming_the_replacement():
    built = build(SWAP_SPACE="4", GUIDED_DECODING_BACKEND="outlines")
    assert without_default_seqs(built.argv) == []
    assert not any("swap" in a or "guided" in a for a in built.argv)
    swap = next(w for w in built.warnings if w.startswith("SWAP_SPACE"))
    assert "'4'" in swap and "--swap-space" in swap
    guided = next(w for w in built.warnings if w.startswith("GUIDED_DECODING_BACKEND"))
    assert "STRUCTURED_OUTPUTS_CONFIG" in guided


def test_removed_boolean_is_not_validated():
    built = build(DISABLE_LOG_REQUESTS="maybe")
    assert any("ENABLE_LOG_REQUESTS" in w for w in built.warnings)


def test_flags_follow_table_order_whatever_the_env_order():
    env_a = {"MODEL_NAME": "m", "TOOL_CALL_PARSER": "hermes", "MAX_MODEL_LEN": "1024", "ENFORCE_EAGER": "1"}
    env_b = dict(reversed(list(env_a.items())))
    argv_a = build_args(env_a, SETTINGS).argv
    assert argv_a == build_args(env_b, SETTINGS).argv
    positions = [argv_a.index(f) for f in ("--max-model-len", "--enforce-eager", "--tool-call-parser")]
    assert positions == sorted(positions)


# --- aliases -----------------------------------------------------------------


def test_aliases_map_to_their_flags():
    built = build(
        MODEL_REVISION="abc123",
        TOKENIZER_NAME="org/tok",
        TOKENIZER_REVISION="def456",
        SERVED_MODEL_NAME="my-model",
    )
    rest = without_default_seqs(built.argv)
    assert rest == [
        "--tokenizer", "org/tok",
        "--revision", "abc123",
        "--tokenizer-revision", "def456",
        "--served-model-name", "my-model",
    ]
    assert built.served_model_name == "my-model"
    assert built.warnings == []


def test_served_model_name_defaults_to_model_name():
    built = build()
    assert built.served_model_name == "org/model"
    assert "--served-model-name" not in built.argv


def test_several_served_names_first_is_the_one_the_handler_uses():
    built = build(SERVED_MODEL_NAME="primary secondary")
    assert without_default_seqs(built.argv) == ["--served-model-name", "primary", "secondary"]
    assert built.served_model_name == "primary"


def test_legacy_served_name_is_used_with_a_deprecation_warning():
    built = build(OPENAI_SERVED_MODEL_NAME_OVERRIDE="legacy")
    assert without_default_seqs(built.argv) == ["--served-model-name", "legacy"]
    assert built.served_model_name == "legacy"
    assert any("OPENAI_SERVED_MODEL_NAME_OVERRIDE is deprecated" in w for w in built.warnings)


def test_new_served_name_wins_over_legacy():
    built = build(SERVED_MODEL_NAME="new", OPENAI_SERVED_MODEL_NAME_OVERRIDE="legacy")
    assert without_default_seqs(built.argv) == ["--served-model-name", "new"]
    assert built.served_model_name == "new"
    assert any("OPENAI_SERVED_MODEL_NAME_OVERRIDE" in w and "ignored" in w for w in built.warnings)


def test_alias_and_flag_name_agreeing_is_fine():
    built = build(MODEL_REVISION="abc", REVISION="abc")
    assert without_default_seqs(built.argv) == ["--revision", "abc"]


def test_alias_and_flag_name_disagreeing_is_an_error():
    with pytest.raises(ArgsError) as info:
        build(MODEL_REVISION="abc", REVISION="def")
    message = str(info.value)
    assert "REVISION='def'" in message and "MODEL_REVISION='abc'" in message


# --- baked model -------------------------------------------------------------


def test_baked_model_path_is_the_positional_and_keeps_the_hub_name():
    built = build(BAKED_MODEL_PATH="/models/model", MODEL_REVISION="abc", CODE_REVISION="def",
                  TOKENIZER_REVISION="ghi")
    assert built.argv[2] == "/models/model"
    assert "--revision" not in built.argv
    assert "--code-revision" not in built.argv
    assert "--tokenizer-revision" not in built.argv
    assert without_default_seqs(built.argv) == ["--served-model-name", "org/model"]
    assert built.served_model_name == "org/model"
    assert any("/models/model" in w for w in built.warnings)


def test_baked_model_keeps_tokenizer_revision_of_a_separate_tokenizer():
    built = build(BAKED_MODEL_PATH="/models/model", TOKENIZER_NAME="org/tok", TOKENIZER_REVISION="ghi")
    assert ["--tokenizer-revision", "ghi"] == built.argv[built.argv.index("--tokenizer-revision"):][:2]


def test_baked_model_without_model_name():
    built = build_args({"BAKED_MODEL_PATH": "/models/model"}, SETTINGS)
    assert built.argv[2] == "/models/model"
    assert built.served_model_name == "/models/model"
    assert "--served-model-name" not in built.argv


# --- VLLM_EXTRA_ARGS -----------------------------------------------------------


def test_extra_args_are_appended_last_and_win():
    built = build(MAX_MODEL_LEN="4096", VLLM_EXTRA_ARGS="--max-model-len 8192 --override-generation-config '{\"a\": 1}'")
    assert built.argv[-4:] == ["--max-model-len", "8192", "--override-generation-config", '{"a": 1}']
    assert built.argv.index("4096") < built.argv.index("8192")
    assert any("MAX_MODEL_LEN" in w and "VLLM_EXTRA_ARGS value wins" in w for w in built.warnings)


def test_extra_args_override_noticed_in_vllm_spellings():
    built = build(ENFORCE_EAGER="true", TENSOR_PARALLEL_SIZE="2", VLLM_EXTRA_ARGS="--no-enforce_eager -tp 4")
    noted = {w.split()[0] for w in built.warnings}
    assert noted == {"ENFORCE_EAGER", "TENSOR_PARALLEL_SIZE"}


def test_extra_args_bad_quoting_is_a_clear_error():
    with pytest.raises(ArgsError) as info:
        build(VLLM_EXTRA_ARGS="--chat-template '{{ messages }}")
    assert info.value.variable == "VLLM_EXTRA_ARGS"
    assert str(info.value).startswith("VLLM_EXTRA_ARGS=")
    assert "quotes are unbalanced" in str(info.value)


@pytest.mark.parametrize("extra", ["--port 9000", "--host=0.0.0.0", "--uds /tmp/s", "--model other/model"])
def test_extra_args_may_not_take_over_worker_owned_flags(extra):
    with pytest.raises(ArgsError) as info:
        build(VLLM_EXTRA_ARGS=extra)
    assert info.value.variable == "VLLM_EXTRA_ARGS"
    assert extra.split()[0].split("=")[0] in str(info.value)


def test_empty_extra_args():
    assert build(VLLM_EXTRA_ARGS="  ").argv == build().argv


# --- defaults and zero-means-unset -------------------------------------------


@pytest.mark.parametrize(("concurrency", "seqs"), [(30, 32), (1, 8), (33, 40), (8, 8), (64, 64)])
def test_default_max_num_seqs_from_concurrency(concurrency, seqs):
    built = build(Settings(max_concurrency=concurrency))
    rest = flags_after_port(built.argv)
    assert rest == ["--max-num-seqs", str(seqs)]


def test_explicit_max_num_seqs_is_kept():
    built = build(Settings(max_concurrency=30), MAX_NUM_SEQS="256")
    assert flags_after_port(built.argv) == ["--max-num-seqs", "256"]


def test_max_num_seqs_in_extra_args_suppresses_the_default():
    built = build(VLLM_EXTRA_ARGS="--max-num-seqs 4")
    assert flags_after_port(built.argv) == ["--max-num-seqs", "4"]
    assert built.warnings == []


def test_zero_means_unset():
    built = build(MAX_NUM_BATCHED_TOKENS="0", MAX_MODEL_LEN="0", NUM_GPU_BLOCKS_OVERRIDE="0", MAX_NUM_SEQS="0")
    assert flags_after_port(built.argv) == ["--max-num-seqs", "32"]


def test_zero_is_a_value_for_other_flags():
    built = build(SEED="0", CPU_OFFLOAD_GB="0", MAX_NUM_BATCHED_TOKENS="8192")
    rest = without_default_seqs(built.argv)
    assert rest == ["--seed", "0", "--cpu-offload-gb", "0", "--max-num-batched-tokens", "8192"]
    assert "SEED" not in ZERO_MEANS_UNSET and "CPU_OFFLOAD_GB" not in ZERO_MEANS_UNSET


# --- secrets -------------------------------------------------------------------


def test_hf_token_only_in_the_engine_env():
    env = {"MODEL_NAME": "org/model", "HF_TOKEN": TOKEN, "ENFORCE_EAGER": "true"}
    built = build_args(env, SETTINGS)
    assert not any(TOKEN in a for a in built.argv)
    assert "--hf-token" not in built.argv
    assert built.engine_env["HF_TOKEN"] == TOKEN
    assert built.engine_env == env
    built.engine_env["X"] = "1"
    assert "X" not in env


def test_mask_hides_secret_flag_values_in_every_form():
    argv = ["vllm", "serve", "m", "--hf-token", TOKEN, "--api-key", "key-one", "key-two",
            "--enforce-eager", "--hf_token=" + TOKEN, "--client-secret", "s3", "--db-password=pw"]
    line = mask(argv, env={})
    for secret in (TOKEN, "key-one", "key-two", "s3", "pw"):
        assert secret not in shlex.split(line)
        assert secret not in line
    assert shlex.split(line) == ["vllm", "serve", "m", "--hf-token", "***", "--api-key", "***", "***",
                                 "--enforce-eager", "--hf_token=***", "--client-secret", "***",
                                 "--db-password=***"]


def test_mask_hides_the_hf_token_value_anywhere():
    argv = ["vllm", "serve", "m", "--model-loader-extra-config", f'{{"url": "https://x/?t={TOKEN}"}}']
    line = mask(argv, env={"HF_TOKEN": TOKEN})
    assert TOKEN not in line
    assert "***" in line


def test_mask_reads_the_worker_environment_by_default(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("RUNPOD_AI_API_KEY", "rp-api-key-value")
    line = mask(["vllm", "serve", "m", "--x", TOKEN, "--y", "rp-api-key-value"])
    assert TOKEN not in line and "rp-api-key-value" not in line


def test_mask_keeps_ordinary_values_that_merely_mention_tokens():
    argv = ["vllm", "serve", "m", "--tokenizer", "org/tok", "--max-num-batched-tokens", "8192",
            "--long-prefill-token-threshold", "512", "--max-num-seqs", "-1"]
    assert mask(argv, env={"MAX_NUM_BATCHED_TOKENS": "8192"}) == shlex.join(argv)


def test_extra_args_secret_is_masked_in_the_log_line_and_in_errors():
    env = {"MODEL_NAME": "m", "HF_TOKEN": TOKEN, "VLLM_EXTRA_ARGS": f"--hf-token {TOKEN} --api-key sk-abc"}
    built = build_args(env, SETTINGS)
    assert TOKEN not in built.masked() and "sk-abc" not in built.masked()
    env["VLLM_EXTRA_ARGS"] = f"--api-key sk-abcdef --x 'unclosed {TOKEN}"
    with pytest.raises(ArgsError) as info:
        build_args(env, SETTINGS)
    assert TOKEN not in str(info.value) and "sk-abcdef" not in str(info.value)
    assert TOKEN not in info.value.value


# --- boolean helpers -----------------------------------------------------------


def test_parse_bool_and_is_true():
    assert parse_bool("X", "Yes") is True
    assert parse_bool("X", "off") is False
    assert parse_bool("X", "") is None
    assert parse_bool("X", None) is None
    assert is_true("1") and not is_true("0") and not is_true(None) and not is_true("")
    with pytest.raises(ArgsError, match=r"^ENFORCE_EAGER='maybe' is not valid"):
        is_true("maybe", "ENFORCE_EAGER")


def test_error_sentence_matches_settings_error():
    args_error = ArgsError("X", "v", "use y")
    assert str(args_error) == str(SettingsError("X", "v", "use y"))
    assert args_builder.BOOL_ACCEPTED.startswith("use true or false")


def test_the_platforms_credentials_and_queue_urls_stay_out_of_the_engine_env():
    env = {
        "MODEL_NAME": "org/model",
        "HF_TOKEN": TOKEN,
        "RUNPOD_AI_API_KEY": "rp-api-key-value",
        "RUNPOD_WEBHOOK_GET_JOB": "https://api.runpod.ai/v2/ep/job-take/$ID",
        "RUNPOD_WEBHOOK_POST_OUTPUT": "https://api.runpod.ai/v2/ep/job-done/$RUNPOD_POD_ID/$ID",
        "RUNPOD_POD_ID": "pod-1",
    }
    built = build_args(env, SETTINGS)
    assert built.engine_env == {"MODEL_NAME": "org/model", "HF_TOKEN": TOKEN, "RUNPOD_POD_ID": "pod-1"}
