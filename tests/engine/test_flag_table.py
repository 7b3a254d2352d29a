"""args_builder's flag table against vLLM 0.32's real `vllm serve` parser.

The worker never imports vLLM, so the parser is built in the engine venv by a
subprocess, the same way `vllm` builds it (a root FlexibleArgumentParser with
the `serve` subcommand), and reports every option and how the worker's argv
parses. A renamed, removed or re-kinded flag fails here, not at a user's startup.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from vllm_worker.args_builder import (
    ALIASES,
    FLAGS,
    LEGACY_ALIASES,
    RESERVED_IN_EXTRA_ARGS,
    SHORT_OPTIONS,
    build_args,
    flag_for,
)
from vllm_worker.settings import Settings

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]
ENGINE_PYTHON = ROOT / ".venv-engine" / "bin" / "python"
SETTINGS = Settings()

PROBE = textwrap.dedent(
    """
    import argparse, dataclasses, json, sys

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
        if action.nargs == 0:
            return type(action).__name__
        if action.nargs in ("+", "*"):
            return "list"
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

    parsed = []
    for argv in request["parse"]:
        try:
            parsed.append({"ok": vars(root.parse_args(argv))})
        except SystemExit as exc:
            parsed.append({"error": exc.code})

    with open(sys.argv[1], "w") as out:
        json.dump(
            {"options": options, "unknown": unknown, "parsed": parsed},
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


def names(kind: str) -> list[str]:
    return [name for name, k in FLAGS.items() if k == kind]


def serve_argv(env: dict[str, str]) -> list[str]:
    """The worker's argv as the `vllm` entry point sees it (`serve ...`)."""
    argv = build_args(env, SETTINGS).argv
    assert argv[: len(SETTINGS.vllm_command)] == list(SETTINGS.vllm_command)
    return ["serve", *argv[len(SETTINGS.vllm_command) :]]


ALL_TRUE = {"MODEL_NAME": "org/model", **{n: "true" for n in names("pair") + names("store_true")}}
ALL_FALSE = {"MODEL_NAME": "org/model", **{n: "false" for n in names("pair") + names("store_true")}}
LORA_JSON = '{"name": "chat", "path": "/loras/chat"}'
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
    "SWAP_SPACE": "4",
    "HF_TOKEN": "hf_NotARealTokenButLongEnough0123",
    "VLLM_EXTRA_ARGS": "--max-model-len 8192 --no-enforce-eager",
}
LORA_AS_JSON = {"MODEL_NAME": "org/model", "LORA_MODULES": LORA_JSON}
PARSE = [ALL_TRUE, ALL_FALSE, TYPICAL, LORA_AS_JSON]


@pytest.fixture(scope="module")
def real_parser(tmp_path_factory: pytest.TempPathFactory) -> dict:
    python = engine_python()
    out = tmp_path_factory.mktemp("parser") / "parser.json"
    request = {
        "unknown": [flag_for(n) for n in names("removed")],
        "parse": [serve_argv(env) for env in PARSE],
    }
    result = subprocess.run(
        [str(python), "-c", PROBE, str(out)],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert result.returncode == 0, f"probing vLLM's parser failed:\n{result.stdout}\n{result.stderr}"
    data = json.loads(out.read_text())
    data["by_flag"] = {s: o for o in data["options"] for s in o["option_strings"]}
    data["by_dest"] = {o["dest"]: o for o in data["options"]}
    return data


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


def test_every_removed_entry_is_really_gone(real_parser):
    still_there = [flag for flag, unknown in real_parser["unknown"].items() if not unknown]
    assert still_there == []
    assert len(real_parser["unknown"]) == len(names("removed"))


def test_alias_and_worker_flags_exist(real_parser):
    assert "model_tag" in real_parser["by_dest"]
    for name in {**ALIASES, **LEGACY_ALIASES}.values():
        assert flag_for(name) in real_parser["by_flag"], name
    for flag in ("--host", "--port", *RESERVED_IN_EXTRA_ARGS):
        assert flag in real_parser["by_flag"], flag


def test_short_options_belong_to_their_flags(real_parser):
    for short, long in SHORT_OPTIONS.items():
        assert short in real_parser["by_flag"][long]["option_strings"], short


def test_all_booleans_true_parse_to_true(real_parser):
    parsed = real_parser["parsed"][PARSE.index(ALL_TRUE)]
    assert "ok" in parsed, parsed
    ns = parsed["ok"]
    for name in names("pair") + names("store_true"):
        assert ns[real_parser["by_flag"][flag_for(name)]["dest"]] is True, name


def test_all_booleans_false_parse_to_false(real_parser):
    parsed = real_parser["parsed"][PARSE.index(ALL_FALSE)]
    assert "ok" in parsed, parsed
    ns = parsed["ok"]
    for name in names("pair") + names("store_true"):
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
    assert ns["hf_token"] is None  # HF_TOKEN travels in the environment only
    defaults = real_parser["parsed"][PARSE.index(LORA_AS_JSON)]["ok"]
    assert ns["max_num_batched_tokens"] == defaults["max_num_batched_tokens"]  # 0 means unset


def test_lora_module_as_json_parses(real_parser):
    parsed = real_parser["parsed"][PARSE.index(LORA_AS_JSON)]
    assert "ok" in parsed, parsed
    assert [(m["name"], m["path"]) for m in parsed["ok"]["lora_modules"]] == [("chat", "/loras/chat")]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
