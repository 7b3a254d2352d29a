"""builder/download_model.py, the image's model-baking step, run as the Dockerfile runs it.

The script runs as a process with the real huggingface_hub client against the Hub stand-in on
127.0.0.1 (HF_ENDPOINT), with the build's inputs: build args as environment variables and the
HF_TOKEN build secret as a file (absent when no secret was given). A failure must end the build
with a non-zero exit and one sentence, never a traceback, and the token must never be printed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.hub_stub import HubStub
from vllm_worker.diagnosis.hub import gated_repo_message, repo_not_found_message, revision_not_found_message, unauthorized_message
from vllm_worker.diagnosis import startup_errors

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "builder" / "download_model.py"
TOKEN_WITH_ACCESS = "hf_bakeaccess0123456789abcdef"
TOKEN_WITHOUT_ACCESS = "hf_bakenoaccess0123456789abcdef"
PREFIX = "Cannot bake the model into the image: "
HINT = " At build time HF_TOKEN is the build secret of that name: docker build --secret id=HF_TOKEN,env=HF_TOKEN ..."

FULL_REPO = {
    "config.json": '{"architectures": ["LlamaForCausalLM"]}',
    "generation_config.json": "{}",
    "tokenizer.json": '{"model": {}}',
    "tokenizer_config.json": "{}",
    "special_tokens_map.json": "{}",
    "tokenizer.model": b"sentencepiece",
    "merges.txt": "a b",
    "chat_template.jinja": "{{ messages }}",
    "modeling_custom.py": "class Custom: ...",
    "model.safetensors.index.json": '{"weight_map": {}}',
    "model-00001-of-00002.safetensors": b"\x01" * 300,
    "model-00002-of-00002.safetensors": b"\x02" * 200,
    "pytorch_model.bin": b"\x03" * 500,
    "original/consolidated.00.pth": b"\x04" * 500,
    "original/params.json": "{}",
    "flax_model.msgpack": b"\x05" * 100,
    "tf_model.h5": b"\x06" * 100,
    "model.onnx": b"\x07" * 100,
    "README.md": "# card",
    ".gitattributes": "*.safetensors filter=lfs",
}
BAKED_FROM_FULL = {
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "merges.txt",
    "chat_template.jinja",
    "modeling_custom.py",
    "model.safetensors.index.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
}


@pytest.fixture
def hub() -> Iterator[HubStub]:
    with HubStub(tokens=[TOKEN_WITHOUT_ACCESS]) as stub:
        stub.add_repo("org/full", files=FULL_REPO, branches=("main", "v2"))
        stub.add_repo("org/pytorch-only", files={"config.json": "{}", "pytorch_model.bin": b"\x01" * 64, "flax_model.msgpack": b"\x02" * 64})
        stub.add_repo(
            "org/mistral",
            files={
                "params.json": "{}",
                "tekken.json": "{}",
                "consolidated.safetensors": b"\x01" * 64,
                "config.json": "{}",
                "model-00001-of-00001.safetensors": b"\x02" * 64,
                "model.safetensors.index.json": "{}",
            },
        )
        stub.add_repo("org/tokenizer", files={"tokenizer.json": "{}", "tokenizer_config.json": "{}", "model.safetensors": b"\x01" * 64})
        stub.add_repo("org/no-weights", files={"config.json": "{}", "model.gguf": b"\x01" * 64})
        stub.add_repo(
            "org/gated",
            files={"config.json": "{}", "model.safetensors": b"\x01" * 64},
            gated="manual",
            authorized_tokens=[TOKEN_WITH_ACCESS],
        )
        yield stub


def bake(hub: HubStub, tmp_path: Path, token: str | None = None, **build_args: str) -> subprocess.CompletedProcess[str]:
    """Run the download step as the Dockerfile does, with the worker package importable."""
    secret = tmp_path / "secrets" / "HF_TOKEN"
    if token is not None:
        secret.parent.mkdir(parents=True, exist_ok=True)
        secret.write_text(token + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN") and not k.startswith("HF_")}
    env.update(
        HF_ENDPOINT=hub.endpoint,
        HF_HOME=str(tmp_path / "hf-build"),
        HF_HUB_DISABLE_TELEMETRY="1",
        PYTHONPATH=str(ROOT / "src"),
        **build_args,
    )
    return subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--model-dir", str(tmp_path / "models" / "model"),
            "--tokenizer-dir", str(tmp_path / "models" / "tokenizer"),
            "--record", str(tmp_path / "baked-model.json"),
            "--token-file", str(secret),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def baked_files(directory: Path) -> set[str]:
    return {
        str(p.relative_to(directory))
        for p in directory.rglob("*")
        if p.is_file() and ".cache" not in p.relative_to(directory).parts
    }


def assert_fails_with(result: subprocess.CompletedProcess[str], sentence: str) -> None:
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr == PREFIX + sentence + "\n", result.stderr
    assert "Traceback" not in result.stdout + result.stderr


def assert_no_secret(result: subprocess.CompletedProcess[str]) -> None:
    for token in (TOKEN_WITH_ACCESS, TOKEN_WITHOUT_ACCESS):
        assert token not in result.stdout + result.stderr


# --- what is baked ------------------------------------------------------------------------------


def test_bakes_safetensors_and_support_files_only(hub: HubStub, tmp_path: Path) -> None:
    result = bake(hub, tmp_path, MODEL_NAME="org/full")
    assert result.returncode == 0, result.stderr
    model_dir = tmp_path / "models" / "model"
    assert baked_files(model_dir) == BAKED_FROM_FULL
    for name in BAKED_FROM_FULL:
        expected = FULL_REPO[name]
        assert (model_dir / name).read_bytes() == (expected.encode() if isinstance(expected, str) else expected)
    record = json.loads((tmp_path / "baked-model.json").read_text())
    assert record["model"]["repo"] == "org/full"
    assert record["model"]["revision"] == hub._repo("org/full").sha
    assert record["model"]["path"] == str(model_dir)
    assert "tokenizer" not in record
    # Skipped files were never requested, not downloaded and deleted.
    fetched = {r.path.split("/resolve/", 1)[1].split("/", 1)[1] for r in hub.calls("/org/full/resolve/", "GET")}
    assert fetched <= BAKED_FROM_FULL


def test_repo_without_safetensors_bakes_its_pytorch_weights(hub: HubStub, tmp_path: Path) -> None:
    result = bake(hub, tmp_path, MODEL_NAME="org/pytorch-only")
    assert result.returncode == 0, result.stderr
    assert baked_files(tmp_path / "models" / "model") == {"config.json", "pytorch_model.bin"}


def test_mistral_format_repo_is_not_baked_twice(hub: HubStub, tmp_path: Path) -> None:
    # vLLM's load_format=auto loads consolidated*.safetensors when a repo has it.
    result = bake(hub, tmp_path, MODEL_NAME="org/mistral")
    assert result.returncode == 0, result.stderr
    assert baked_files(tmp_path / "models" / "model") == {
        "params.json",
        "tekken.json",
        "config.json",
        "consolidated.safetensors",
        "model.safetensors.index.json",
    }


def test_revision_is_resolved_and_recorded(hub: HubStub, tmp_path: Path) -> None:
    result = bake(hub, tmp_path, MODEL_NAME="org/full", MODEL_REVISION="v2")
    assert result.returncode == 0, result.stderr
    v2 = hub._repo("org/full").revisions["v2"]
    assert v2 != hub._repo("org/full").sha
    assert json.loads((tmp_path / "baked-model.json").read_text())["model"]["revision"] == v2
    assert v2 in result.stdout
    # Every file comes from the one commit the revision named when the build ran.
    assert {r.path.split("/")[4] for r in hub.calls("/org/full/resolve/")} == {v2}


def test_tokenizer_is_baked_without_weights(hub: HubStub, tmp_path: Path) -> None:
    result = bake(hub, tmp_path, MODEL_NAME="org/full", TOKENIZER_NAME="org/tokenizer")
    assert result.returncode == 0, result.stderr
    assert baked_files(tmp_path / "models" / "tokenizer") == {"tokenizer.json", "tokenizer_config.json"}
    assert json.loads((tmp_path / "baked-model.json").read_text())["tokenizer"]["repo"] == "org/tokenizer"


def test_quantization_is_recorded(hub: HubStub, tmp_path: Path) -> None:
    result = bake(hub, tmp_path, MODEL_NAME="org/full", QUANTIZATION="fp8")
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "baked-model.json").read_text())["quantization"] == "fp8"


def test_no_model_name_bakes_nothing(hub: HubStub, tmp_path: Path) -> None:
    result = bake(hub, tmp_path, MODEL_NAME="")
    assert result.returncode == 0, result.stderr
    assert "nothing baked" in result.stdout
    assert not (tmp_path / "models").exists() and not (tmp_path / "baked-model.json").exists()
    assert hub.requests == []


# --- failures end the build with one sentence ---------------------------------------------------


def test_gated_repo_without_token_fails_the_build(hub: HubStub, tmp_path: Path) -> None:
    result = bake(hub, tmp_path, MODEL_NAME="org/gated")
    assert_fails_with(result, gated_repo_message("org/gated", "MODEL_NAME", token_set=False) + HINT)
    assert not (tmp_path / "baked-model.json").exists()


def test_gated_repo_with_a_token_without_access_fails_the_build(hub: HubStub, tmp_path: Path) -> None:
    result = bake(hub, tmp_path, token=TOKEN_WITHOUT_ACCESS, MODEL_NAME="org/gated")
    assert_fails_with(result, gated_repo_message("org/gated", "MODEL_NAME", token_set=True) + HINT)
    assert_no_secret(result)


def test_gated_repo_with_the_build_secret_is_baked(hub: HubStub, tmp_path: Path) -> None:
    result = bake(hub, tmp_path, token=TOKEN_WITH_ACCESS, MODEL_NAME="org/gated")
    assert result.returncode == 0, result.stderr
    assert baked_files(tmp_path / "models" / "model") == {"config.json", "model.safetensors"}
    assert_no_secret(result)
    assert TOKEN_WITH_ACCESS not in (tmp_path / "baked-model.json").read_text()
    assert {r.token for r in hub.calls("/org/gated/resolve/")} == {TOKEN_WITH_ACCESS}


def test_invalid_token_fails_the_build(hub: HubStub, tmp_path: Path) -> None:
    result = bake(hub, tmp_path, token="hf_unknown0123456789abcdef", MODEL_NAME="org/full")
    assert_fails_with(result, unauthorized_message("org/full", "MODEL_NAME", token_set=True) + HINT)
    assert "hf_unknown0123456789abcdef" not in result.stdout + result.stderr


def test_bad_revision_fails_the_build(hub: HubStub, tmp_path: Path) -> None:
    result = bake(hub, tmp_path, MODEL_NAME="org/full", MODEL_REVISION="no-such-branch")
    assert_fails_with(result, revision_not_found_message("org/full", "no-such-branch", "MODEL_REVISION"))


def test_bad_tokenizer_revision_names_the_tokenizer_variables(hub: HubStub, tmp_path: Path) -> None:
    result = bake(hub, tmp_path, MODEL_NAME="org/full", TOKENIZER_NAME="org/tokenizer", TOKENIZER_REVISION="gone")
    assert_fails_with(result, revision_not_found_message("org/tokenizer", "gone", "TOKENIZER_REVISION"))


@pytest.mark.parametrize("name", ["org/missing", "org/with space"])
def test_missing_or_malformed_repo_fails_the_build(hub: HubStub, tmp_path: Path, name: str) -> None:
    result = bake(hub, tmp_path, MODEL_NAME=name)
    assert_fails_with(result, repo_not_found_message(name, "MODEL_NAME") + HINT)


def test_repo_without_loadable_weights_fails_the_build(hub: HubStub, tmp_path: Path) -> None:
    result = bake(hub, tmp_path, MODEL_NAME="org/no-weights")
    assert result.returncode == 1
    assert result.stderr.startswith(PREFIX + "MODEL_NAME='org/no-weights' has no weights the worker can bake")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_revision_without_a_name_fails_the_build(hub: HubStub, tmp_path: Path) -> None:
    result = bake(hub, tmp_path, MODEL_REVISION="v2")
    assert_fails_with(result, "MODEL_REVISION='v2' was given without MODEL_NAME: set MODEL_NAME too, or drop MODEL_REVISION.")
    assert hub.requests == []


def test_hub_server_error_fails_the_build_with_a_sentence(hub: HubStub, tmp_path: Path) -> None:
    hub.fail(500, times=None, path_prefix="/api/models/org/full")
    result = bake(hub, tmp_path, MODEL_NAME="org/full")
    assert_fails_with(result, "The Hugging Face Hub answered HTTP 500 while fetching MODEL_NAME='org/full': retry the build later.")
