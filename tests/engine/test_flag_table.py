"""args_builder's flag table and value checks against vLLM 0.32's real `vllm serve` parser.

The worker never imports vLLM, so the parser is built in the engine venv by a subprocess,
the same way `vllm` builds it (a root FlexibleArgumentParser with the `serve` subcommand):

- the checked-in table (src/vllm_worker/config/vllm_flags.json) must be what
  scripts/gen_flag_table.py writes for the installed vLLM, so a vLLM upgrade fails here
  until the table is regenerated;
- the worker's argv must parse as meant (every boolean both ways, aliases, lists, the
  LORA_MODULES array form, VLLM_CONFIG_FILE);
- the worker's pre-launch value check must never refuse what vLLM takes: every value
  it refuses, for every option, over a sweep of probe values, is refused by vLLM too
  (by the parser, or by the configuration vLLM builds from it), and every value it
  takes, the parser takes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from unittest import mock

import pytest

from vllm_worker.config import flag_messages
from vllm_worker.config import command
from vllm_worker.config import profile as profile_mod
from vllm_worker.config.profile import LaunchProfile
from vllm_worker.config.args_builder import (
    ALIASES,
    FLAGS,
    LEGACY_ALIASES,
    OPTIONS,
    RESERVED_IN_EXTRA_ARGS,
    SHORT_OPTIONS,
    TABLE_FILE,
    ArgsError,
    flag_for,
)
from vllm_worker.config.settings import Settings

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]
ENGINE_PYTHON = ROOT / ".venv-engine" / "bin" / "python"
GENERATOR = ROOT / "scripts" / "gen_flag_table.py"
CHECKED_IN = ROOT / "src" / "vllm_worker" / "config" / TABLE_FILE
SETTINGS = Settings()

# A model directory with only a config.json: enough for vLLM to build its configuration.
MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "head_dim": 64,
    "max_position_embeddings": 2048,
    "vocab_size": 512,
    "rms_norm_eps": 1e-05,
    "torch_dtype": "bfloat16",
}

PROBE = textwrap.dedent(
    """
    import argparse, contextlib, dataclasses, io, json, sys

    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.cli.serve import cmd_init
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    request = json.load(sys.stdin)
    root = FlexibleArgumentParser(description="vLLM CLI")
    subparsers = root.add_subparsers(required=False, dest="subparser")
    (serve_cmd,) = cmd_init()
    serve = serve_cmd.subparser_init(subparsers)

    def kind(action):
        if isinstance(action, argparse.BooleanOptionalAction):
            return "pair"
        if isinstance(action, argparse._StoreTrueAction):
            return "store_true"
        if isinstance(action, argparse._AppendAction):
            return "append"
        if action.nargs == 0:
            return type(action).__name__
        if action.nargs in ("+", "*"):
            return "list"
        if action.nargs == "?":
            return "optional_value"
        return "value"

    options = [
        {"dest": a.dest, "option_strings": a.option_strings, "kind": kind(a)}
        for a in serve._actions
    ]

    unknown = {}
    for flag in request["unknown"]:
        try:
            _, extras = serve.parse_known_args([flag, "1"])
            unknown[flag] = flag in extras
        except SystemExit:
            unknown[flag] = False  # matched an option (or a prefix of one) and failed on its value

    def parse(argv):
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                return root.parse_args(argv), None
        except SystemExit:
            lines = err.getvalue().strip().splitlines() or ["exit"]
            return None, next((line for line in lines if ": error: " in line), lines[-1])
        except Exception as exc:  # vLLM raises ValueError for a config file it will not read
            return None, f"{type(exc).__name__}: {exc}"

    def configure(ns):
        ns.model = ns.model_tag
        try:
            with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
                AsyncEngineArgs.from_cli_args(ns).create_engine_config()
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return None

    parsed = []
    for argv in request["parse"]:
        ns, error = parse(argv)
        parsed.append({"ok": vars(ns)} if ns is not None else {"error": error})

    checks = []
    for check in request["checks"]:
        ns, error = parse(check["argv"])
        result = {"parse_error": error, "config_error": None}
        if ns is not None and check["config"]:
            result["config_error"] = configure(ns)
        checks.append(result)

    with open(sys.argv[1], "w") as out:
        json.dump(
            {"options": options, "unknown": unknown, "parsed": parsed, "checks": checks},
            out,
            default=lambda o: dataclasses.asdict(o) if dataclasses.is_dataclass(o) else repr(o),
        )
    """
)


def engine_python() -> Path:
    """The engine venv's interpreter; skip without it, except in CI where a skip must fail."""
    if not ENGINE_PYTHON.exists():
        reason = f"{ENGINE_PYTHON} is missing: create .venv-engine with vLLM 0.32 to run engine tests"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    return ENGINE_PYTHON


def names(*kinds: str) -> list[str]:
    return [name for name, k in FLAGS.items() if k in kinds]


def serve_argv(env: dict[str, str]) -> list[str]:
    """The worker's argv as the `vllm` entry point sees it (`serve ...`)."""
    argv = _build(env, SETTINGS).argv
    assert argv[: len(SETTINGS.vllm_command)] == list(SETTINGS.vllm_command)
    return ["serve", *argv[len(SETTINGS.vllm_command) :]]


# --- what the worker builds, parsed by vLLM -----------------------------------------------

ALL_TRUE = {"MODEL_NAME": "org/model", **{n: "true" for n in names("pair", "store_true")}}
ALL_FALSE = {"MODEL_NAME": "org/model", **{n: "false" for n in names("pair", "store_true")}}
LORA_JSON = '{"name": "chat", "path": "/loras/chat"}'
LORA_ARRAY = [{"name": "x", "path": "org/adapter"}, {"name": "y", "path": "/loras/y", "base_model_name": "org/model"}]
TYPICAL = {
    "MODEL_NAME": "org/model",
    "MODEL_REVISION": "abc123",
    "TOKENIZER_NAME": "org/tokenizer",
    "TOKENIZER_REVISION": "def456",
    "SERVED_MODEL_NAME": "primary secondary",
    "MAX_MODEL_LEN": "4096",
    "GPU_MEMORY_UTILIZATION": "0.5",
    "MAX_NUM_BATCHED_TOKENS": "0",
    "ENFORCE_EAGER": "true",
    "SEED": "-1",
    "ENABLE_LORA": "true",
    "LORA_MODULES": "sql=org/sql-lora 'docs=/loras/my docs'",
    "IGNORE_PATTERNS": "*.pt original/*",
    "CUDAGRAPH_CAPTURE_SIZES": "1 2 4",
    "LIMIT_MM_PER_PROMPT": '{"image": 2}',
    "OVERRIDE_GENERATION_CONFIG": '{"temperature": 0.2}',
    "KV_TRANSFER_CONFIG": '{"kv_connector": "ExampleConnector", "kv_role": "kv_both"}',
    "ENABLE_SLEEP_MODE": "true",
    "API_SERVER_COUNT": "2",
    "MAMBA_CACHE_DTYPE": "float32",
    "MIDDLEWARE": "a.b c.d",
    "SWAP_SPACE": "4",
    "HF_TOKEN": "hf_NotARealTokenButLongEnough0123",
    "VLLM_EXTRA_ARGS": "--max-model-len 8192 --no-enforce-eager",
}
LORA_AS_JSON = {"MODEL_NAME": "org/model", "LORA_MODULES": LORA_JSON}
LORA_AS_ARRAY = {"MODEL_NAME": "org/model", "LORA_MODULES": json.dumps(LORA_ARRAY)}
PARSE = [ALL_TRUE, ALL_FALSE, TYPICAL, LORA_AS_JSON, LORA_AS_ARRAY]
# Runpod's worker documents the array form and passes it verbatim: vLLM 0.32 refuses that.
RAW_ARRAY_ARGV = ["serve", "org/model", "--lora-modules", json.dumps(LORA_ARRAY)]


# --- the value sweep ----------------------------------------------------------------------

PROBE_VALUES = [
    "abc", "x-y", "1.5", "0", "-1", "1", "2", "-2", "7", "17", "65536", "1e3", "0.5", "1k", "1K", "1.5K", "8k",
    "auto", "AUTO", "None", "nan", "inf", "true", "{", "{}", '{"a": 1}', "[1]", "[]", "3", "a=b", "a b",
    '{"name": "n", "path": "p"}', '{"max_cudagraph_capture_size": 8k}',
]
# The five a user sends most often, answered in milliseconds by the worker.
NAMED_BAD = {
    "MAX_NUM_SEQS": "abc",
    "GPU_MEMORY_UTILIZATION": "1.5",
    "DTYPE": "float13",
    "KV_CACHE_DTYPE": "fp7",
    "TENSOR_PARALLEL_SIZE": "0",
}
NAMED_GOOD = {
    "MAX_NUM_SEQS": "64",
    "GPU_MEMORY_UTILIZATION": "0.5",
    "DTYPE": "float32",
    "KV_CACHE_DTYPE": "auto",
    "TENSOR_PARALLEL_SIZE": "1",
}


def sweep_values(name: str) -> list[str]:
    option = OPTIONS[name]
    values = list(PROBE_VALUES)
    for choice in option.get("choices", [])[:3]:
        values += [str(choice), str(choice).upper(), str(choice).replace("_", "-")]
    return values


def worker_verdict(env: dict[str, str]) -> list[str] | str:
    """The argv the worker would launch, or the sentence it answers instead."""
    try:
        return serve_argv(env)
    except ArgsError as exc:
        return str(exc)


def unchecked_argv(env: dict[str, str]) -> list[str]:
    """The argv the worker would launch without its value check: what vLLM would have been given."""
    with mock.patch.object(flag_messages, "problem", lambda option, items: None), \
            mock.patch.object(profile_mod, "_utilization_refusal", lambda value, text, variable: None):
        return serve_argv(env)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model")
    (path / "config.json").write_text(json.dumps(MODEL_CONFIG))
    return path


@pytest.fixture(scope="module")
def config_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("config") / "serve.yaml"
    path.write_text("max-num-seqs: 7\nmax-model-len: 256\nenforce-eager: true\n")
    return path


@pytest.fixture(scope="module")
def cases(model_dir: Path, config_file: Path) -> list[dict]:
    """Every (variable, value) the checks compare: the sweep, the named ones, VLLM_CONFIG_FILE."""
    out = []
    base = {"MODEL_NAME": str(model_dir)}
    sweep = names("value", "optional_value", "list", "append")
    for name in sweep:
        for value in sweep_values(name):
            out.append({"name": name, "value": value, "env": {**base, name: value}, "source": "sweep"})
    for name, value in {**NAMED_BAD}.items():
        out.append({"name": name, "value": value, "env": {**base, name: value}, "source": "named_bad"})
    for name, value in NAMED_GOOD.items():
        out.append({"name": name, "value": value, "env": {**base, name: value}, "source": "named_good"})
    for path in ("/etc/serve.json", str(config_file)):
        env = {**base, "VLLM_CONFIG_FILE": path, "MAX_MODEL_LEN": "128"}
        argv = ["serve", str(model_dir), "--host", "127.0.0.1", "--port", "8000", "--config", path,
                "--max-model-len", "128"]
        out.append({"name": "VLLM_CONFIG_FILE", "value": path, "env": env, "source": "config_file", "argv": argv})
    for case in out:
        case["worker"] = worker_verdict(case["env"])
        if "argv" not in case:
            case["argv"] = case["worker"] if isinstance(case["worker"], list) else unchecked_argv(case["env"])
    return out


@pytest.fixture(scope="module")
def real_parser(tmp_path_factory: pytest.TempPathFactory, cases: list[dict]) -> dict:
    python = engine_python()
    out = tmp_path_factory.mktemp("parser") / "parser.json"
    checks = [
        {"argv": case["argv"], "config": not isinstance(case["worker"], list) or case["source"] != "sweep"}
        for case in cases
    ]
    request = {
        "unknown": [flag_for(n) for n in names("removed")],
        "parse": [serve_argv(env) for env in PARSE] + [RAW_ARRAY_ARGV],
        "checks": checks,
    }
    result = subprocess.run(
        [str(python), "-c", PROBE, str(out)],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"},
    )
    assert result.returncode == 0, f"probing vLLM's parser failed:\n{result.stdout}\n{result.stderr}"
    data = json.loads(out.read_text())
    data["by_flag"] = {s: o for o in data["options"] for s in o["option_strings"]}
    data["by_dest"] = {o["dest"]: o for o in data["options"]}
    for case, check in zip(cases, data["checks"]):
        case["vllm"] = check
    return data


# --- the table is the parser's -------------------------------------------------------------


def test_checked_in_table_is_what_the_generator_writes_for_this_vllm(tmp_path: Path):
    python = engine_python()
    fresh = tmp_path / TABLE_FILE
    result = subprocess.run(
        [str(python), str(GENERATOR), "--out", str(fresh)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert fresh.read_text() == CHECKED_IN.read_text(), (
        f"vLLM's `vllm serve` options changed: run `.venv-engine/bin/python {GENERATOR.relative_to(ROOT)}` "
        f"and review the diff of {CHECKED_IN.relative_to(ROOT)}"
    )


def test_every_live_entry_exists_with_the_same_kind(real_parser):
    mismatches = {}
    for name, kind in FLAGS.items():
        if kind == "removed":
            continue
        option = real_parser["by_flag"].get(flag_for(name))
        found = option["kind"] if option else "missing"
        if found != kind:
            mismatches[name] = f"table says {kind}, vLLM 0.32 has {found}"
    assert mismatches == {}


def test_every_option_of_the_parser_is_in_the_table(real_parser):
    long_flags = {s for o in real_parser["options"] for s in o["option_strings"] if s.startswith("--") and s != "--help"}
    table_flags = {f for o in OPTIONS.values() for f in (o["flag"], *o.get("aliases", ()))}
    assert {f for f in long_flags if not f.startswith("--no-")} - table_flags == set()


def test_every_removed_entry_is_really_gone(real_parser):
    still_there = [flag for flag, unknown in real_parser["unknown"].items() if not unknown]
    assert still_there == []
    assert len(real_parser["unknown"]) == len(names("removed"))


def test_alias_and_worker_flags_exist(real_parser):
    assert "model_tag" in real_parser["by_dest"]
    for name in {**ALIASES, **LEGACY_ALIASES}.values():
        assert flag_for(name) in real_parser["by_flag"], name
    for flag in ("--host", "--port", "--config", *RESERVED_IN_EXTRA_ARGS):
        assert flag in real_parser["by_flag"], flag


def test_short_options_belong_to_their_flags(real_parser):
    for short, long in SHORT_OPTIONS.items():
        assert short in real_parser["by_flag"][long]["option_strings"], short


# --- the worker's argv parses as meant --------------------------------------------------------


def test_all_booleans_true_parse_to_true(real_parser):
    parsed = real_parser["parsed"][PARSE.index(ALL_TRUE)]
    assert "ok" in parsed, parsed
    ns = parsed["ok"]
    for name in names("pair", "store_true"):
        assert ns[real_parser["by_flag"][flag_for(name)]["dest"]] is True, name


def test_all_booleans_false_parse_to_false(real_parser):
    parsed = real_parser["parsed"][PARSE.index(ALL_FALSE)]
    assert "ok" in parsed, parsed
    ns = parsed["ok"]
    for name in names("pair", "store_true"):
        assert ns[real_parser["by_flag"][flag_for(name)]["dest"]] is False, name


def test_typical_configuration_parses_as_meant(real_parser):
    parsed = real_parser["parsed"][PARSE.index(TYPICAL)]
    assert "ok" in parsed, parsed
    ns = parsed["ok"]
    assert ns["subparser"] == "serve"
    assert ns["model_tag"] == "org/model"
    assert (ns["host"], ns["port"]) == (SETTINGS.vllm_host, SETTINGS.vllm_port)
    assert ns["revision"] == "abc123"
    assert ns["tokenizer"] == "org/tokenizer"
    assert ns["tokenizer_revision"] == "def456"
    assert ns["served_model_name"] == ["primary", "secondary"]
    assert ns["max_model_len"] == 8192  # VLLM_EXTRA_ARGS wins
    assert ns["enforce_eager"] is False  # VLLM_EXTRA_ARGS wins
    assert ns["gpu_memory_utilization"] == 0.5
    assert ns["max_num_seqs"] == 32  # the worker's default for MAX_CONCURRENCY=30
    assert ns["seed"] == -1
    assert ns["enable_lora"] is True
    assert [(m["name"], m["path"]) for m in ns["lora_modules"]] == [("sql", "org/sql-lora"), ("docs", "/loras/my docs")]
    assert ns["ignore_patterns"] == ["*.pt", "original/*"]
    assert ns["cudagraph_capture_sizes"] == [1, 2, 4]
    assert ns["limit_mm_per_prompt"] == {"image": 2}
    assert ns["override_generation_config"] == {"temperature": 0.2}
    assert "ExampleConnector" in str(ns["kv_transfer_config"])
    assert ns["enable_sleep_mode"] is True
    assert ns["api_server_count"] == 2
    assert ns["mamba_cache_dtype"] == "float32"
    assert ns["middleware"] == ["a.b", "c.d"]
    assert ns["hf_token"] is None  # HF_TOKEN travels in the environment only
    defaults = real_parser["parsed"][PARSE.index(LORA_AS_JSON)]["ok"]
    assert ns["max_num_batched_tokens"] == defaults["max_num_batched_tokens"]  # 0 means unset


def test_lora_module_as_json_parses(real_parser):
    parsed = real_parser["parsed"][PARSE.index(LORA_AS_JSON)]
    assert "ok" in parsed, parsed
    assert [(m["name"], m["path"]) for m in parsed["ok"]["lora_modules"]] == [("chat", "/loras/chat")]


def test_lora_modules_in_runpods_array_form_parse_as_each_adapter(real_parser):
    parsed = real_parser["parsed"][PARSE.index(LORA_AS_ARRAY)]
    assert "ok" in parsed, parsed
    got = [(m["name"], m["path"], m["base_model_name"]) for m in parsed["ok"]["lora_modules"]]
    assert got == [("x", "org/adapter", None), ("y", "/loras/y", "org/model")]
    # Passed on verbatim, as Runpod's worker does, vLLM 0.32 refuses the array.
    raw = real_parser["parsed"][-1]
    assert "error" in raw and "--lora-modules" in raw["error"], raw


def test_config_file_is_read_and_the_variables_still_win(real_parser, cases, config_file):
    (case,) = [c for c in cases if c["source"] == "config_file" and c["value"] == str(config_file)]
    assert isinstance(case["worker"], list), case["worker"]
    assert case["vllm"]["parse_error"] is None and case["vllm"]["config_error"] is None, case["vllm"]


def test_config_file_that_is_not_yaml_is_refused_by_both(real_parser, cases):
    (case,) = [c for c in cases if c["source"] == "config_file" and c["value"].endswith(".json")]
    assert case["worker"].startswith("VLLM_CONFIG_FILE='/etc/serve.json' is not valid: --config takes")
    assert "yaml" in case["vllm"]["parse_error"], case["vllm"]


# --- the pre-launch check agrees with vLLM ------------------------------------------------------


def _vllm_refused(case: dict) -> str | None:
    """vLLM's refusal, when it names the option (so it is about this value)."""
    option = OPTIONS[case["name"]]
    parse_error = case["vllm"]["parse_error"]
    if parse_error is not None:
        return parse_error if option["flag"] in parse_error else None
    config_error = case["vllm"]["config_error"]
    if config_error is not None and option["dest"] in config_error:
        return config_error
    return None


@pytest.mark.parametrize("name", list(NAMED_BAD))
def test_the_named_bad_values_are_refused_by_vllm_too(real_parser, cases, name):
    (case,) = [c for c in cases if c["source"] == "named_bad" and c["name"] == name]
    assert isinstance(case["worker"], str) and case["worker"].startswith(f"{name}={NAMED_BAD[name]!r} is not valid")
    assert _vllm_refused(case), case["vllm"]


@pytest.mark.parametrize("name", list(NAMED_GOOD))
def test_good_values_are_taken_by_both(real_parser, cases, name):
    (case,) = [c for c in cases if c["source"] == "named_good" and c["name"] == name]
    assert isinstance(case["worker"], list), case["worker"]
    assert case["vllm"] == {"parse_error": None, "config_error": None}


def _no_card_has_it(case: dict) -> bool:
    """A utilization vLLM's parser takes but no card has free once CUDA has started: refused on purpose."""
    if case["name"] != "GPU_MEMORY_UTILIZATION":
        return False
    try:
        return float(case["value"]) >= profile_mod.UTILIZATION_CEILING
    except ValueError:
        return False


def test_the_worker_never_refuses_a_value_vllm_takes(real_parser, cases):
    wrong = [
        (c["name"], c["value"], c["worker"], c["vllm"])
        for c in cases
        if c["source"] == "sweep" and isinstance(c["worker"], str) and not _vllm_refused(c) and not _no_card_has_it(c)
    ]
    refused = [c for c in cases if c["source"] == "sweep" and isinstance(c["worker"], str)]
    assert len(refused) > 500  # the sweep does probe refusals
    assert wrong == []


def test_every_value_the_worker_takes_the_parser_takes(real_parser, cases):
    # Field names inside JSON configs are checked by vLLM's pydantic models only: the engine judges.
    wrong = [
        (c["name"], c["value"], c["vllm"]["parse_error"])
        for c in cases
        if c["source"] == "sweep"
        and isinstance(c["worker"], list)
        and c["vllm"]["parse_error"] is not None
        and OPTIONS[c["name"]]["type"] != "json_config"
    ]
    assert wrong == []


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))



def _build(env, settings, caches=None):  # type: ignore[no-untyped-def]
    """The argv the worker renders for `env`: parsed into its launch profile, then rendered."""
    return command.build_args(LaunchProfile.parse(env), settings, caches)
