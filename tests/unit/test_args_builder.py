"""env -> `vllm serve` argv: the flag table, kinds, aliases, precedence, defaults, value checks,
look-alike warnings and secrets."""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path

import pytest

from vllm_worker.config import args_builder

from vllm_worker.config import flag_messages
from vllm_worker.config import command, secrets
from vllm_worker.config.secrets import mask
from vllm_worker.config.profile import LaunchProfile
from vllm_worker.config.args_builder import (
    ALIASES,
    FLAGS,
    LEGACY_ALIASES,
    NOT_FROM_ENV,
    OPTIONS,
    REMOVED_NOTES,
    SHORT_OPTIONS,
    WORKER_VARIABLES,
    ZERO_MEANS_UNSET,
    ArgsError,
    flag_for,
    is_true,
    lookalike_warnings,
    option_for,
    parse_bool,
)
from vllm_worker.config.settings import DOCUMENTED, Settings, SettingsError, load
from vllm_worker.config.engine_env import cache_variables

SETTINGS = Settings()
TOKEN = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"


def build(settings: Settings = SETTINGS, **env: str):
    return _build({"MODEL_NAME": "org/model", **env}, settings)


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
        assert kind in ("value", "optional_value", "list", "append", "pair", "store_true", "removed"), (name, kind)


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
        _build({}, SETTINGS)
    assert info.value.variable == "MODEL_NAME"
    assert str(info.value).startswith("MODEL_NAME is not set")
    assert isinstance(info.value, ValueError)


def test_blank_model_name_is_missing():
    with pytest.raises(ArgsError, match="MODEL_NAME"):
        _build({"MODEL_NAME": "   "}, SETTINGS)


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
    argv_a = _build(env_a, SETTINGS).argv
    assert argv_a == _build(env_b, SETTINGS).argv
    order = list(FLAGS)
    names = sorted(("TOOL_CALL_PARSER", "MAX_MODEL_LEN", "ENFORCE_EAGER"), key=order.index)
    positions = [argv_a.index(flag_for(name)) for name in names]
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


def test_a_baked_model_names_every_revision_it_ignores_as_the_user_set_it_and_keeps_a_served_name_given():
    built = build(BAKED_MODEL_PATH="/models/model", MODEL_REVISION="abc", CODE_REVISION="def", TOKENIZER_REVISION="ghi")
    assert "MODEL_REVISION, CODE_REVISION, TOKENIZER_REVISION ignored: the model is baked into the image at /models/model." in built.warnings
    assert "REVISION ignored: the model is baked into the image at /models/model." in build(
        BAKED_MODEL_PATH="/models/model", REVISION="abc").warnings
    assert build(BAKED_MODEL_PATH="/models/model", CODE_REVISION="def").warnings.count(
        "CODE_REVISION ignored: the model is baked into the image at /models/model.") == 1
    mine = build(BAKED_MODEL_PATH="/models/model", SERVED_MODEL_NAME="mine")
    assert without_default_seqs(mine.argv) == ["--served-model-name", "mine"] and mine.served_model_name == "mine"
    # The Hub name it serves under comes from MODEL_NAME, and the warning of a second one says so.
    twice = build(BAKED_MODEL_PATH="/models/model", VLLM_EXTRA_ARGS="--served-model-name other")
    assert "MODEL_NAME sets --served-model-name, but VLLM_EXTRA_ARGS sets it too; the VLLM_EXTRA_ARGS value wins." in twice.warnings


def test_a_removed_variable_at_the_official_forms_default_is_silent():
    assert not [w for w in build(SCHEDULER_DELAY_FACTOR="0").warnings if "SCHEDULER_DELAY_FACTOR" in w]
    assert [w for w in build(SCHEDULER_DELAY_FACTOR="0.5").warnings if w.startswith("SCHEDULER_DELAY_FACTOR='0.5' is ignored")]


def test_baked_model_keeps_tokenizer_revision_of_a_separate_tokenizer():
    built = build(BAKED_MODEL_PATH="/models/model", TOKENIZER_NAME="org/tok", TOKENIZER_REVISION="ghi")
    assert ["--tokenizer-revision", "ghi"] == built.argv[built.argv.index("--tokenizer-revision"):][:2]


def test_baked_model_without_model_name():
    built = _build({"BAKED_MODEL_PATH": "/models/model"}, SETTINGS)
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
    built = build(MAX_CONCURRENCY=str(concurrency))
    rest = flags_after_port(built.argv)
    assert rest == ["--max-num-seqs", str(seqs)]


def test_explicit_max_num_seqs_is_kept():
    built = build(MAX_CONCURRENCY="30", MAX_NUM_SEQS="256")
    assert flags_after_port(built.argv) == ["--max-num-seqs", "256"]


def test_max_num_seqs_below_max_concurrency_with_adaptation_off_is_warned_about():
    off = Settings(adaptive_concurrency=False)
    assert build(off, MAX_NUM_SEQS="8").warnings == [
        "MAX_NUM_SEQS=8 is below MAX_CONCURRENCY=30 with ADAPTIVE_CONCURRENCY=false: the worker takes 30 jobs and "
        "vLLM runs 8 of them at once, so 22 wait inside vLLM, where the endpoint's autoscaler does not see them; "
        "set MAX_CONCURRENCY=8, or ADAPTIVE_CONCURRENCY=true."
    ]
    assert "MAX_NUM_SEQS=4 is below" in build(off, VLLM_EXTRA_ARGS="--max-num-seqs 4").warnings[0]
    assert build(off, MAX_NUM_SEQS="30").warnings == []  # not below
    assert build(off).warnings == []  # the worker's default: 32
    assert build(MAX_NUM_SEQS="8").warnings == []  # adapting: taken no more than 9


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
    built = _build(env, SETTINGS)
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
    built = _build(env, SETTINGS)
    assert TOKEN not in built.masked() and "sk-abc" not in built.masked()
    env["VLLM_EXTRA_ARGS"] = f"--api-key sk-abcdef --x 'unclosed {TOKEN}"
    with pytest.raises(ArgsError) as info:
        _build(env, SETTINGS)
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


def test_the_platforms_variables_stay_out_of_the_engine_env():
    env = {
        "MODEL_NAME": "org/model",
        "HF_TOKEN": TOKEN,
        "RUNPOD_AI_API_KEY": "rp-api-key-value",
        "RUNPOD_WEBHOOK_GET_JOB": "https://api.runpod.ai/v2/ep/job-take/$ID",
        "RUNPOD_WEBHOOK_POST_OUTPUT": "https://api.runpod.ai/v2/ep/job-done/$RUNPOD_POD_ID/$ID",
        "RUNPOD_POD_ID": "pod-1",
    }
    built = _build(env, SETTINGS)
    assert built.engine_env == {"MODEL_NAME": "org/model", "HF_TOKEN": TOKEN}


def test_the_workers_own_variables_stay_out_of_the_engine_env_and_the_caches_go_in():
    env = {
        "MODEL_NAME": "org/model",
        "HF_TOKEN": TOKEN,
        "VLLM_COMMAND": "vllm serve",
        "VLLM_PORT": "8123",
        "VLLM_STARTUP_TIMEOUT": "60",
        "MAX_CONCURRENCY": "4",
        "BASE_PATH": "/vol",
        "VLLM_EXTRA_ARGS": "--seed 1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "TRITON_CACHE_DIR": "/mine/triton",
    }
    caches = cache_variables("/vol/engine-cache", env)
    assert caches == {
        "VLLM_CACHE_ROOT": "/vol/engine-cache/vllm",
        "TORCHINDUCTOR_CACHE_DIR": "/vol/engine-cache/torchinductor",
    }
    built = _build(env, SETTINGS, caches)
    assert built.engine_env == {
        "MODEL_NAME": "org/model",
        "HF_TOKEN": TOKEN,
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "TRITON_CACHE_DIR": "/mine/triton",
        **caches,
    }
    assert "--seed" in built.argv
    assert TOKEN not in built.masked()


# --- the table is vLLM's parser, as data -----------------------------------------------

KINDS = {"value", "optional_value", "list", "append", "pair", "store_true"}
TYPES = {"int", "float", "str", "bool", "human_int", "human_int_or_auto", "json", "json_or_str", "json_config", "other"}
ROOT = Path(__file__).resolve().parents[2]


def test_table_loads_with_every_serve_option():
    assert args_builder.TABLE["vllm"].startswith("0.32")
    assert len(OPTIONS) >= 250
    for name, option in OPTIONS.items():
        assert option["flag"] == flag_for(name), name
        assert option["kind"] in KINDS, (name, option["kind"])
        assert option["type"] in TYPES, (name, option["type"])
        assert set(option.get("range", {})) <= {"ge", "gt", "le", "lt"}, name


def test_the_table_is_package_data_so_an_installed_worker_finds_it():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert args_builder.TABLE_FILE in pyproject["tool"]["setuptools"]["package-data"]["vllm_worker.config"]
    assert (ROOT / "src" / "vllm_worker" / "config" / args_builder.TABLE_FILE).is_file()


def test_options_the_old_hand_written_table_missed_are_settable():
    built = build(KV_TRANSFER_CONFIG='{"kv_connector": "x"}', ENABLE_SLEEP_MODE="true", API_SERVER_COUNT="2",
                  MAMBA_CACHE_DTYPE="float32")
    rest = without_default_seqs(built.argv)
    assert rest[rest.index("--kv-transfer-config") + 1] == '{"kv_connector": "x"}'
    assert "--enable-sleep-mode" in rest
    assert rest[rest.index("--api-server-count") + 1] == "2"
    assert rest[rest.index("--mamba-cache-dtype") + 1] == "float32"


def _sample(option: dict) -> str:
    """A value the option takes, by its kind and type."""
    if option["kind"] in ("pair", "store_true"):
        return "true"
    if "item_fields" in option:
        return "a=org/a"
    if option.get("choices"):
        return str(option["choices"][0])
    return {"int": "1", "float": "0.5", "human_int": "1", "human_int_or_auto": "1", "json": "{}",
            "json_config": "{}"}.get(option["type"], "x")


@pytest.mark.parametrize("name", [n for n, k in FLAGS.items() if k != "removed"])
def test_every_option_is_set_by_its_upper_snake_name(name):
    built = build(**{name: _sample(OPTIONS[name])})
    assert flag_for(name) in built.argv or f"{flag_for(name)}=" in " ".join(built.argv)


def test_vllms_second_spelling_of_an_option_is_an_alias():
    assert ALIASES["DEVICE_MEMORY_UTILIZATION"] == "GPU_MEMORY_UTILIZATION"
    built = build(DEVICE_MEMORY_UTILIZATION="0.8", VLLM_EXTRA_ARGS="--device-memory-utilization 0.7")
    assert built.argv[built.argv.index("--gpu-memory-utilization") + 1] == "0.8"
    assert built.warnings == ["DEVICE_MEMORY_UTILIZATION sets --gpu-memory-utilization, but VLLM_EXTRA_ARGS sets it too; "
                              "the VLLM_EXTRA_ARGS value wins."]


def test_removed_names_are_not_live_options():
    assert set(REMOVED_NOTES).isdisjoint(OPTIONS)


def test_names_kept_off_the_command_line_are_real_options():
    assert set(NOT_FROM_ENV) <= set(OPTIONS)
    for name in ("HOST", "PORT", "UDS", "MODEL", "CONFIG", "HF_TOKEN", "API_KEY", "HEADLESS"):
        assert name in NOT_FROM_ENV and name not in FLAGS


def test_every_secret_looking_option_is_kept_off_the_command_line():
    valued = [name for name, option in OPTIONS.items() if option["kind"] not in ("pair", "store_true")]
    secret = [name for name in valued if secrets.is_secret_name(name)]
    assert secret and set(secret) <= set(NOT_FROM_ENV)


def test_worker_names_never_shadow_an_option():
    for name in (*DOCUMENTED, *WORKER_VARIABLES, *ALIASES, *LEGACY_ALIASES):
        assert name not in OPTIONS or name in NOT_FROM_ENV, name


def test_short_options_come_from_the_table():
    assert SHORT_OPTIONS["-tp"] == "--tensor-parallel-size"
    assert SHORT_OPTIONS["-q"] == "--quantization"
    assert all(flag in {o["flag"] for o in OPTIONS.values()} for flag in SHORT_OPTIONS.values())


@pytest.mark.parametrize("name", ["HOST", "PORT", "MODEL", "CONFIG", "LOG_LEVEL", "MASTER_ADDR", "NODE_RANK"])
def test_ordinary_variables_that_spell_an_option_are_ignored_quietly(name):
    built = build(**{name: "info"})
    assert built.argv[:7] == ["vllm", "serve", "org/model", "--host", "127.0.0.1", "--port", "8000"]
    assert without_default_seqs(built.argv) == []
    assert built.warnings == []


@pytest.mark.parametrize("name", ["HEADLESS", "GRPC", "TOKENS_ONLY", "SSL_KEYFILE", "UDS", "API_KEY"])
def test_options_that_cut_the_worker_off_are_dropped_with_a_warning(name):
    built = build(**{name: "secret-looking-value-1"} if name != "API_KEY" else {name: "sk-abcdefgh"})
    assert without_default_seqs(built.argv) == []
    (warning,) = built.warnings
    assert warning.startswith(f"{name} is not passed to vLLM as {flag_for(name)}: ")
    assert "sk-abcdefgh" not in warning and "secret-looking-value-1" not in warning


def test_a_deprecated_option_is_passed_with_its_note():
    built = build(DISABLE_CASCADE_ATTN="true")
    assert "--disable-cascade-attn" in built.argv
    assert built.warnings == [f"DISABLE_CASCADE_ATTN: {OPTIONS['DISABLE_CASCADE_ATTN']['deprecated']}"]
    assert "is deprecated" in built.warnings[0]


def test_append_kind_repeats_the_flag():
    built = build(MIDDLEWARE="a.b c.d")
    assert without_default_seqs(built.argv) == ["--middleware", "a.b", "--middleware", "c.d"]


def test_list_kind_takes_a_json_array_as_one_argument_per_element():
    built = build(CUDAGRAPH_CAPTURE_SIZES="[1, 2, 4]", IGNORE_PATTERNS="[0-9]*.bin")
    rest = without_default_seqs(built.argv)
    assert rest[rest.index("--cudagraph-capture-sizes") + 1:][:3] == ["1", "2", "4"]
    assert rest[rest.index("--ignore-patterns") + 1] == "[0-9]*.bin"  # not JSON: a shell word


# --- values checked before launch -------------------------------------------------------

REJECTED = {
    "MAX_NUM_SEQS": ("abc", "--max-num-seqs takes a whole number (at least 1)"),
    "GPU_MEMORY_UTILIZATION": ("1.5", "--gpu-memory-utilization takes a number (greater than 0 and at most 1)"),
    "DTYPE": ("float13", "--dtype takes one of auto, bfloat16, float, float16, float32, half"),
    "KV_CACHE_DTYPE": ("fp7", "--kv-cache-dtype takes one of auto, bfloat16, float16, fp8, "),
    "TENSOR_PARALLEL_SIZE": ("0", "--tensor-parallel-size takes a whole number (at least 1)"),
}


@pytest.mark.parametrize("name", list(REJECTED))
def test_bad_values_are_answered_naming_variable_value_and_what_is_accepted(name):
    value, accepted = REJECTED[name]
    with pytest.raises(ArgsError) as info:
        build(**{name: value})
    assert str(info.value).startswith(f"{name}={value!r} is not valid: {accepted}")
    assert str(info.value).endswith(".")
    assert (info.value.variable, info.value.value) == (name, value)
    # The shape of every other bad-setting sentence.
    assert str(info.value) == str(SettingsError(name, value, info.value.accepted))


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("MAX_NUM_SEQS", "64"), ("GPU_MEMORY_UTILIZATION", "0.99"), ("GPU_MEMORY_UTILIZATION", "0.95"), ("DTYPE", "half"),
        ("KV_CACHE_DTYPE", "fp8"), ("TENSOR_PARALLEL_SIZE", "2"), ("MAX_MODEL_LEN", "auto"), ("MAX_MODEL_LEN", "32K"),
        ("MAX_MODEL_LEN", "-1"), ("MAX_NUM_BATCHED_TOKENS", "8k"), ("MAX_NUM_BATCHED_TOKENS", "1.5k"),
        ("QUANTIZATION", "None"), ("MOE_BACKEND", "Deep-Gemm"), ("MAX_LORA_RANK", "16"), ("SEED", "-1"),
        ("SPECULATIVE_CONFIG", '{"method": "ngram", "num_speculative_tokens": 3}'),
        ("COMPILATION_CONFIG", '{"max_cudagraph_capture_size": 8k}'), ("HF_OVERRIDES", "plain-string"),
        ("MAX_LORAS", "0"),  # LoRAConfig is built only with ENABLE_LORA: vLLM takes it, so must the worker
    ],
)
def test_values_vllm_takes_pass(name, value):
    build(**{name: value})


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("MAX_MODEL_LEN", "1.5K"), ("MAX_MODEL_LEN", "-2"), ("MAX_NUM_BATCHED_TOKENS", "lots"), ("MAX_LORA_RANK", "17"),
        ("WATERMARK", "1"), ("CPU_OFFLOAD_GB", "-1"), ("GPU_MEMORY_UTILIZATION", "nan"), ("MOE_BACKEND", "nope"),
        ("SPECULATIVE_CONFIG", "{bad"), ("COMPILATION_CONFIG", "[1]"), ("ALLOWED_ORIGINS", "*"),
        ("CUDAGRAPH_CAPTURE_SIZES", "1 2 x"), ("CUDAGRAPH_CAPTURE_SIZES", "[]"), ("SCHEDULING_POLICY", "FCFS"),
    ],
)
def test_values_vllm_refuses_are_refused(name, value):
    with pytest.raises(ArgsError) as info:
        build(**{name: value})
    assert info.value.variable == name
    assert str(info.value).startswith(f"{name}={value!r} is not valid: {OPTIONS[name]['flag']} takes ")


def test_a_rejected_value_names_the_variable_the_user_set():
    with pytest.raises(ArgsError) as info:
        build(Settings(), MAX_NUM_SEQS="0x10")
    assert info.value.variable == "MAX_NUM_SEQS"


def test_zero_still_means_unset_and_is_not_checked():
    built = build(MAX_NUM_SEQS="0", MAX_NUM_BATCHED_TOKENS="0")
    assert flags_after_port(built.argv) == ["--max-num-seqs", "32"]


def test_a_rejected_value_keeps_secrets_out_of_the_message():
    env = {"HF_TOKEN": TOKEN, "MODEL_LOADER_EXTRA_CONFIG": f'{{"token": "{TOKEN}",}}'}
    with pytest.raises(ArgsError) as info:
        build(**env)
    assert TOKEN not in str(info.value) and TOKEN not in info.value.value
    assert str(info.value).startswith("MODEL_LOADER_EXTRA_CONFIG=")


def test_vllm_extra_args_are_left_to_the_engine():
    built = build(VLLM_EXTRA_ARGS="--max-num-seqs abc --dtype float13")
    assert built.argv[-4:] == ["--max-num-seqs", "abc", "--dtype", "float13"]


def test_describe_and_invalid_value_share_one_sentence():
    option = OPTIONS["GPU_MEMORY_UTILIZATION"]
    assert flag_messages.describe(option) == "a number (greater than 0 and at most 1)"
    assert flag_messages.invalid_value("GPU_MEMORY_UTILIZATION", "2", "--gpu-memory-utilization", "x") == (
        "GPU_MEMORY_UTILIZATION='2' is not valid: --gpu-memory-utilization takes x."
    )
    assert flag_messages.problem(option, ["0.5"]) is None
    assert flag_messages.problem(option, ["0"]) == flag_messages.describe(option)


@pytest.mark.parametrize(("text", "number"), [("8k", 8000), ("8K", 8192), ("1.5k", 1500), ("2M", 2 * 2**20),
                                             ("25.6k", 25600), (" 12 ", 12), ("1_000", 1000)])
def test_human_readable_numbers(text, number):
    assert flag_messages.human_int(text) == number


@pytest.mark.parametrize("text", ["1.5K", "k", "8kb", "", "1e3"])
def test_human_readable_numbers_refused(text):
    with pytest.raises(ValueError):
        flag_messages.human_int(text)


# --- VLLM_CONFIG_FILE ---------------------------------------------------------------------


def test_config_file_becomes_config_after_the_worker_owned_flags():
    built = build(VLLM_CONFIG_FILE="/runpod-volume/serve.yaml", ENFORCE_EAGER="true")
    assert built.argv[7:10] == ["--config", "/runpod-volume/serve.yaml", "--enforce-eager"]
    assert built.warnings == []


def test_config_file_keeps_its_own_max_num_seqs():
    assert "--max-num-seqs" not in build(VLLM_CONFIG_FILE="c.yml").argv
    built = build(VLLM_CONFIG_FILE="c.yml", MAX_NUM_SEQS="16")
    assert built.argv[built.argv.index("--max-num-seqs") + 1] == "16"


@pytest.mark.parametrize("path", ["/c.json", "/serve.yaml.bak", "config"])
def test_config_file_must_be_yaml(path):
    with pytest.raises(ArgsError) as info:
        build(VLLM_CONFIG_FILE=path)
    assert str(info.value) == (
        f"VLLM_CONFIG_FILE={path!r} is not valid: --config takes the path of a YAML file, whose name vLLM "
        f"requires to end in .yaml or .yml."
    )


def test_config_file_and_config_in_extra_args_conflict():
    with pytest.raises(ArgsError) as info:
        build(VLLM_CONFIG_FILE="/a.yaml", VLLM_EXTRA_ARGS="--config /b.yaml")
    assert info.value.variable == "VLLM_CONFIG_FILE"
    assert "reads only one config file" in str(info.value)


# --- LORA_MODULES ---------------------------------------------------------------------------


def test_lora_modules_json_array_becomes_one_argument_per_adapter():
    adapters = [{"name": "x", "path": "org/adapter"}, {"name": "y", "path": "/loras/y", "base_model_name": "org/m"}]
    built = build(LORA_MODULES=json.dumps(adapters))
    rest = without_default_seqs(built.argv)
    assert rest[0] == "--lora-modules"
    assert [json.loads(arg) for arg in rest[1:]] == adapters


@pytest.mark.parametrize(
    "value",
    [
        '[{"name": "x"}]',  # no path
        '[{"name": "x", "path": "p", "rank": 8}]',  # a field vLLM's LoRAModulePath does not have
        "[1]",  # not an object
        "[]",
        "org/adapter",  # neither name=path nor JSON
        '{"path": "p"}',
    ],
)
def test_lora_modules_vllm_would_refuse_are_refused(value):
    with pytest.raises(ArgsError) as info:
        build(LORA_MODULES=value)
    assert info.value.variable == "LORA_MODULES"
    assert '"name" and "path"' in str(info.value)


# --- look-alikes ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "meant", "what"),
    [
        ("MAX_NUM_SEQ", "MAX_NUM_SEQS", "vLLM's --max-num-seqs"),
        ("GPU_MEMORY_UTILISATION", "GPU_MEMORY_UTILIZATION", "vLLM's --gpu-memory-utilization"),
        ("MAX_MODEL_LENGTH", "MAX_MODEL_LEN", "vLLM's --max-model-len"),
        ("ENABLE_PREFIX_CACHE", "ENABLE_PREFIX_CACHING", "vLLM's --enable-prefix-caching"),
        ("max_num_seqs", "MAX_NUM_SEQS", "vLLM's --max-num-seqs"),
        ("max-model-len", "MAX_MODEL_LEN", "vLLM's --max-model-len"),
        ("MAX_CONCURENCY", "MAX_CONCURRENCY", "a worker setting"),
        ("MODEL_REVISON", "MODEL_REVISION", "vLLM's --revision"),
    ],
)
def test_a_look_alike_is_warned_naming_the_closest_name(name, meant, what):
    built = build(**{name: "s3cr3t-value"})
    assert built.warnings == [
        f"{name} is set but is not a variable the worker reads, so it has no effect; did you mean {meant} ({what})?"
    ]
    assert "s3cr3t-value" not in built.warnings[0]
    assert "s3cr3t-value" not in built.argv


# Variable names of real containers: this machine, Runpod's serverless and pod environments,
# NVIDIA's CUDA images, the vLLM image, Hugging Face, torch.distributed launchers.
ORDINARY_ENV = [
    "PATH", "HOME", "HOSTNAME", "PWD", "SHELL", "TERM", "LANG", "LC_ALL", "TZ", "SHLVL", "DEBIAN_FRONTEND",
    "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONPATH", "PIP_NO_CACHE_DIR", "UV_SYSTEM_PYTHON",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "AWS_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "no_proxy",
    "CUDA_VERSION", "CUDA_HOME", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES",
    "NVIDIA_REQUIRE_CUDA", "NV_CUDA_CUDART_VERSION", "NV_LIBNCCL_PACKAGE", "NCCL_VERSION", "NCCL_DEBUG",
    "LD_LIBRARY_PATH", "LIBRARY_PATH", "TORCH_CUDA_ARCH_LIST", "PYTORCH_CUDA_ALLOC_CONF", "OMP_NUM_THREADS",
    "MKL_NUM_THREADS", "TOKENIZERS_PARALLELISM", "TRANSFORMERS_CACHE", "TRANSFORMERS_OFFLINE", "MAX_JOBS",
    "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "HF_HUB_ENABLE_HF_TRANSFER", "HF_ENDPOINT", "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN", "VLLM_USAGE_SOURCE", "VLLM_WORKER_MULTIPROC_METHOD", "VLLM_LOGGING_LEVEL",
    "VLLM_CONFIG_ROOT", "VLLM_CPU_KVCACHE_SPACE", "VLLM_USE_V1",
    "RUNPOD_POD_ID", "RUNPOD_ENDPOINT_ID", "RUNPOD_GPU_COUNT", "RUNPOD_AI_API_KEY", "RUNPOD_WEBHOOK_GET_JOB",
    "RUNPOD_LOG_LEVEL", "RUNPOD_DC_ID", "RUNPOD_POD_HOSTNAME", "PUBLIC_KEY", "JUPYTER_PASSWORD",
    "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK", "NNODES", "PRIMARY_ADDR",
    "HOST", "PORT", "MODEL", "CONFIG", "LOG_LEVEL", "CI", "DO_NOT_TRACK", "OPENAI_API_KEY",
    "MODEL_NAME", "BAKED_MODEL_PATH", "VLLM_EXTRA_ARGS", "VLLM_CONFIG_FILE", "MODEL_REVISION", "TOKENIZER_NAME",
    "GITHUB_ACTIONS", "RUNNER_OS", "RUNNER_TEMP", "RUNNER_ARCH", "RUNNER_NAME", "MAMBA_ROOT_PREFIX", "CONDA_PREFIX",
    "VIRTUAL_ENV", "PYENV_ROOT", "CARGO_HOME", "RUSTUP_HOME", "GOPATH", "JAVA_HOME", "AWS_REGION",
    *DOCUMENTED,
]


def test_ordinary_environment_variables_draw_no_look_alike_warning():
    env = {name: "1" for name in ORDINARY_ENV}
    assert lookalike_warnings(env) == []


def test_unset_and_exact_names_draw_no_look_alike_warning():
    assert lookalike_warnings({"MAX_NUM_SEQ": "  ", "MAX_NUM_SEQS": "8", "SWAP_SPACE": "4"}) == []


# --- for startup_errors: the option vLLM names in its refusal ------------------------------


@pytest.mark.parametrize(
    ("said", "name"),
    [("--max-num-seqs", "MAX_NUM_SEQS"), ("-tp", "TENSOR_PARALLEL_SIZE"), ("--no-enforce-eager", "ENFORCE_EAGER"),
     ("gpu_memory_utilization", "GPU_MEMORY_UTILIZATION"), ("cache_config.block_size", "BLOCK_SIZE"),
     ("--device-memory-utilization", "GPU_MEMORY_UTILIZATION")],
)
def test_option_for_what_vllm_names(said, name):
    assert option_for(said) is OPTIONS[name]


def test_option_for_something_that_is_no_option():
    assert option_for("--no-such-flag") is None and option_for("model_config") is None


def _build(env, settings, caches=None):  # type: ignore[no-untyped-def]
    """The argv the worker renders for `env`: parsed into its launch profile, then rendered."""
    return command.build_args(LaunchProfile.parse(env), settings, caches)
