"""The Hub listing (.runpod/hub.json, tests.json), the README's variable table and the worker agree.

A Hub user configures the worker only through the form hub.json describes, so a key nothing
reads is a setting that silently does nothing, a README variable missing from the form is one a
Hub user cannot set, and a default that differs between the form and the README is a default
the user was told wrongly. These checks keep the three in step.

README format parsed here: under a heading containing "Environment variables" (and its
subheadings), markdown table rows whose first cell names the variable in backticks
(`MAX_MODEL_LEN`; several backticked names in one cell share the row) and whose second cell is
the default: a literal such as 30, false, auto, vllm serve (backticks around it are allowed),
or, for a variable left unset by default, a cell in parentheses such as "(required)",
"(the model's)", "(none)", or an empty cell, "-" or "—".
"""

from __future__ import annotations

import ast
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from vllm_worker.config import args_builder

from vllm_worker.serving import handler

from vllm_worker.config import settings

ROOT = Path(__file__).resolve().parents[2]
HUB = ROOT / ".runpod" / "hub.json"
TESTS = ROOT / ".runpod" / "tests.json"
README = ROOT / "README.md"
DOCKERFILE = ROOT / "Dockerfile"

# Pools listed in Runpod's GPU types reference for Hub listings.
GPU_POOLS = {"AMPERE_16", "AMPERE_24", "ADA_24", "AMPERE_48", "ADA_48_PRO", "AMPERE_80", "ADA_80_PRO", "HOPPER_141"}
INPUT_TYPES = {"string", "number", "boolean", "huggingface"}
CATEGORIES = {"audio", "embedding", "language", "video", "image"}
REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


def hub() -> dict[str, Any]:
    return json.loads(HUB.read_text())


def hub_env() -> dict[str, dict[str, Any]]:
    return {entry["key"]: entry for entry in hub()["config"]["env"]}


def hub_default(entry: dict[str, Any]) -> Any:
    return entry.get("input", {}).get("default", entry.get("value"))


def same_default(a: Any, b: Any) -> bool:
    """Compare defaults the way the worker reads them: as environment strings."""
    if a is None or b is None:
        return a is b
    if isinstance(a, bool) or isinstance(b, bool):
        return str(a).lower() == str(b).lower()
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return str(a) == str(b)


def worker_string_constants() -> set[str]:
    """Every string literal in the worker's source: a variable the worker reads is spelled there."""
    found: set[str] = set()
    for path in (ROOT / "src" / "vllm_worker").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.add(node.value)
    return found


def image_env_names() -> set[str]:
    """Variables the Dockerfile sets with ENV: the image's business, not the Hub form's."""
    names: set[str] = set()
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    for line in text.splitlines():
        if line.strip().upper().startswith("ENV "):
            names.update(re.findall(r"([A-Z_][A-Z0-9_]*)=", line))
    return names


def readme_table(text: str) -> dict[str, str | None]:
    """Variable -> default literal (None: no literal default) from the README's env table."""
    rows: dict[str, str | None] = {}
    inside, level = False, 0
    for line in text.splitlines():
        heading = re.match(r"^(#+)\s+(.*)$", line)
        if heading:
            depth = len(heading.group(1))
            if "environment variables" in heading.group(2).lower():
                inside, level = True, depth
                continue
            if inside and depth <= level:
                inside = False
            continue
        if not inside or not line.strip().startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2:
            continue
        names = re.findall(r"`([A-Z][A-Z0-9_]*)`", cells[0])
        if not names:
            continue
        for name in names:
            rows[name] = readme_default(cells[1])
    return rows


def readme_default(cell: str) -> str | None:
    """The literal default of a README cell, or None when the variable is unset by default."""
    text = cell.strip()
    if text in ("", "-", "—") or (text.startswith("(") and text.endswith(")")):
        return None
    return text.replace("`", "").strip()


def readme_rows() -> dict[str, str | None]:
    if not README.exists():
        if os.environ.get("CI") == "true":
            pytest.fail("README.md is missing: its environment-variable table must exist in CI")
        pytest.skip("README.md not written yet")
    rows = readme_table(README.read_text())
    assert rows, "README.md has no 'Environment variables' table with `VARIABLE` | default rows"
    return rows


# --- the listing's shape -------------------------------------------------------------


def test_hub_json_has_the_fields_the_hub_requires() -> None:
    data = hub()
    for field in ("title", "description", "type", "category", "config"):
        assert data.get(field), f"hub.json lacks {field}"
    assert data["type"] == "serverless"
    assert data["category"] in CATEGORIES
    config = data["config"]
    assert config["runsOn"] == "GPU"
    assert isinstance(config["containerDiskInGb"], int) and config["containerDiskInGb"] >= 20
    assert isinstance(config["gpuCount"], int) and config["gpuCount"] >= 1
    pools = [p.strip() for p in config["gpuIds"].split(",")]
    unknown = [p for p in pools if p.lstrip("-") not in GPU_POOLS and not p.startswith("-")]
    assert pools and not unknown, f"unknown GPU pools in gpuIds: {unknown}"
    assert config["allowedCudaVersions"] and all(re.fullmatch(r"\d+\.\d+", v) for v in config["allowedCudaVersions"])


def test_cuda_versions_are_those_the_base_image_needs() -> None:
    # vllm/vllm-openai v0.32 is built on CUDA 13.0 (vLLM 0.32's VLLM_MAIN_CUDA_VERSION): hosts
    # whose driver stops at CUDA 12.x cannot run it, so no 12.x may be listed.
    for name, versions in (("hub.json", hub()["config"]["allowedCudaVersions"]), ("tests.json", json.loads(TESTS.read_text())["config"]["allowedCudaVersions"])):
        assert all(float(v) >= 13.0 for v in versions), f"{name} allows CUDA versions older than the image's 13.0: {versions}"


def test_env_entries_are_well_formed() -> None:
    keys = [entry["key"] for entry in hub()["config"]["env"]]
    assert len(keys) == len(set(keys)), "a key is listed twice in hub.json"
    for key, entry in hub_env().items():
        assert ("input" in entry) != ("value" in entry), f"{key}: needs exactly one of input or value"
        spec = entry.get("input")
        if spec is None:
            continue
        assert spec.get("name") and spec.get("description"), f"{key}: input needs a name and a description"
        assert spec["type"] in INPUT_TYPES, f"{key}: unknown input type {spec['type']!r}"
        default = spec.get("default")
        if spec["type"] == "boolean":
            assert isinstance(default, bool), f"{key}: a boolean input needs a true/false default"
            for word in (spec["trueValue"], spec["falseValue"]):
                # What the Hub writes into the environment must be a word the worker reads.
                assert args_builder.parse_bool(key, word) is (word == spec["trueValue"]), f"{key}: {word!r}"
        elif spec["type"] == "number" and default is not None:
            assert isinstance(default, (int, float)) and not isinstance(default, bool), f"{key}: {default!r}"
        if "options" in spec:
            values = [o["value"] for o in spec["options"]]
            assert all(o.get("label") for o in spec["options"]), f"{key}: every option needs a label"
            assert default is None or default in values, f"{key}: default {default!r} is not one of its options"


def test_model_name_is_the_required_huggingface_input() -> None:
    spec = hub_env()["MODEL_NAME"]["input"]
    assert spec["type"] == "huggingface" and spec.get("required") is True and "default" not in spec


def test_secrets_have_no_default() -> None:
    for key, entry in hub_env().items():
        if re.search(r"(^|_)(TOKEN|KEY|SECRET|PASSWORD)$", key):
            assert hub_default(entry) in (None, ""), f"{key} must not ship a value in hub.json"


def test_presets_set_only_listed_keys_and_real_repo_ids() -> None:
    env = hub_env()
    presets = hub()["config"]["presets"]
    assert 2 <= len(presets) <= 3
    for preset in presets:
        assert preset["name"] and preset["defaults"].get("MODEL_NAME")
        assert REPO_ID.match(preset["defaults"]["MODEL_NAME"]), preset
        assert set(preset["defaults"]) <= set(env), f"{preset['name']}: sets keys hub.json does not list"


# --- every key is read, nothing stale ---------------------------------------------------


def test_every_hub_key_is_read_by_the_worker_or_is_a_vllm_flag() -> None:
    constants = worker_string_constants()
    unread = []
    for key in hub_env():
        kind = args_builder.FLAGS.get(key)
        if key in settings.DOCUMENTED or key in args_builder.ALIASES or (kind is not None and kind != "removed"):
            continue
        if kind is None and key in constants and key not in args_builder.LEGACY_ALIASES:
            continue  # read by name, e.g. MODEL_NAME, HF_TOKEN, VLLM_EXTRA_ARGS
        unread.append(key)
    assert not unread, f"hub.json lists keys nothing reads (or that vLLM 0.32 removed): {unread}"


def test_worker_settings_defaults_match_the_worker() -> None:
    env = hub_env()
    for name, (default, _meaning) in settings.DOCUMENTED.items():
        if name in env:
            assert same_default(hub_default(env[name]), default), f"{name}: hub.json {hub_default(env[name])!r}, worker {default!r}"


def test_readme_parser_reads_the_documented_format() -> None:
    text = "\n".join(
        [
            "# vllm-worker",
            "| `NOT_HERE` | `1` | outside the section |",
            "## Environment variables",
            "### Model",
            "| Variable | Default | Meaning |",
            "| --- | --- | --- |",
            "| `MODEL_NAME` | (required) | the model |",
            "| `MAX_CONCURRENCY` | 30 | jobs at once |",
            "| `VLLM_COMMAND` | `vllm serve` | the engine |",
            "| `MODEL_REVISION`, `REVISION` | — | branch |",
            "| `HF_TOKEN` |  | token |",
            "## Deploying",
            "| `ALSO_NOT` | `2` | after the section |",
        ]
    )
    assert readme_table(text) == {
        "MODEL_NAME": None,
        "MAX_CONCURRENCY": "30",
        "VLLM_COMMAND": "vllm serve",
        "MODEL_REVISION": None,
        "REVISION": None,
        "HF_TOKEN": None,
    }


# Documented for development and tests, kept off the Hub form on purpose: VLLM_PORT is the loopback
# port between the worker and its own engine inside the container, which no client reaches, so a
# Hub user can only break the hand-off by changing it; VLLM_COMMAND swaps the engine binary, which
# the image fixes (the demo and the tests point it at .venv-engine's vllm).
INTERNAL = {"VLLM_PORT", "VLLM_COMMAND"}


def test_every_readme_variable_is_in_the_hub_form() -> None:
    rows = readme_rows()
    env = hub_env()
    missing = sorted(name for name in rows if name not in env and name not in image_env_names() and name not in INTERNAL)
    assert not missing, f"README documents variables the Hub form lacks: {missing}"


def test_internal_knobs_are_documented_but_not_offered_on_the_form() -> None:
    rows = readme_rows()
    offered = sorted(INTERNAL & set(hub_env()))
    assert not offered, f"hub.json offers internal knobs a Hub user should not set: {offered}"
    assert INTERNAL <= set(rows), f"README's table lacks the internal knobs {sorted(INTERNAL - set(rows))}"


def test_every_hub_input_is_documented_in_the_readme() -> None:
    rows = readme_rows()
    undocumented = sorted(key for key, entry in hub_env().items() if "input" in entry and key not in rows)
    assert not undocumented, f"hub.json offers inputs README's table does not explain: {undocumented}"


def test_lora_modules_example_is_the_json_array_form() -> None:
    # The form's example is what Hub users copy: the JSON array of {"name", "path"} objects that
    # Runpod's own vLLM worker documents.
    description = hub_env()["LORA_MODULES"]["input"]["description"]
    example = json.loads(description[description.index("[") : description.rindex("]") + 1])
    assert isinstance(example, list) and example
    assert all(set(item) == {"name", "path"} and REPO_ID.match(item["path"]) for item in example), example


def test_readme_and_hub_defaults_agree() -> None:
    rows = readme_rows()
    wrong = []
    for name, entry in hub_env().items():
        if name not in rows:
            continue
        ours = hub_default(entry)
        if ours is None:
            continue  # the form leaves it unset, so whatever the README says applies
        if not same_default(ours, rows[name]):
            wrong.append(f"{name}: hub.json {ours!r}, README {rows[name]!r}")
    assert not wrong, "defaults disagree: " + "; ".join(wrong)


def test_readme_worker_defaults_match_the_worker() -> None:
    rows = readme_rows()
    for name, (default, _meaning) in settings.DOCUMENTED.items():
        assert name in rows, f"README's table lacks the worker variable {name}"
        assert same_default(rows[name], default), f"{name}: README {rows[name]!r}, worker {default!r}"


# --- tests.json ------------------------------------------------------------------------------


def test_tests_json_runs_a_prompt_job_and_an_openai_route_job() -> None:
    data = json.loads(TESTS.read_text())
    config = data["config"]
    assert config["gpuTypeId"] and config["gpuCount"] == 1
    env = {e["key"]: e["value"] for e in config["env"]}
    assert REPO_ID.match(env["MODEL_NAME"])
    assert all(isinstance(v, str) for v in env.values()), "test env values are strings, as in a real environment"
    assert "HF_TOKEN" not in env, "a public model needs no token, and a token must not be committed"
    routes = set()
    for test in data["tests"]:
        assert test["name"] and isinstance(test["timeout"], int) and test["timeout"] > 0
        # The worker's own input parser must accept the job as written.
        request = handler.normalize_input(test["input"], env["MODEL_NAME"])
        assert request.body is not None and request.body["model"] == env["MODEL_NAME"]
        assert not request.stream, "the Hub's test expects one response, not a stream"
        routes.add((request.path, "openai_route" in test["input"]))
    assert ("/v1/completions", False) in routes, "no prompt job"
    assert ("/v1/chat/completions", True) in routes, "no openai_route chat job"


def test_the_hub_finds_its_three_files_and_the_handler_runs_the_worker() -> None:
    """The Hub's publishing check wants handler.py, Dockerfile and README.md at the root (or in .runpod/)."""
    import subprocess
    import sys

    for name in ("handler.py", "Dockerfile", "README.md"):
        assert (ROOT / name).is_file(), name
    shown = subprocess.run(
        [sys.executable, str(ROOT / "handler.py"), "--help"], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert shown.returncode == 0, shown.stderr
    assert "vllm-worker" in shown.stdout
