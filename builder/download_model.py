"""Bake a Hugging Face model (and optionally a separate tokenizer) into the image at build time.

Why: a baked model is on the container's disk the moment the worker starts, so a cold start
neither waits for a download nor depends on the Hub being reachable. The build is the only
moment a bad name, a gated repository or a vanished revision can be caught before any user
sees it, so every such case ends the build with one sentence naming the cause and the fix
(the same sentences the worker's pre-flight uses), not a traceback.

Inputs come from the Dockerfile's build args (environment variables MODEL_NAME, MODEL_REVISION,
TOKENIZER_NAME, TOKENIZER_REVISION, QUANTIZATION) and the HF_TOKEN build secret, read from a
file so it never becomes part of an image layer. Only the files vLLM loads are fetched: config
and tokenizer files, and safetensors weights (PyTorch .bin/.pt only when a repository has no
safetensors). The result is recorded as JSON for people debugging an image; the worker itself
reads the BAKED_MODEL_PATH / BAKED_TOKENIZER_PATH variables the Dockerfile sets.

Run with the worker venv's python (it has huggingface_hub and vllm_worker's messages).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Mapping, Sequence

from huggingface_hub import HfApi, snapshot_download
from huggingface_hub.errors import (
    DisabledRepoError,
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import disable_progress_bars

from vllm_worker.diagnosis.hub import gated_repo_message, repo_not_found_message, revision_not_found_message, unauthorized_message

# Files vLLM reads besides the weights: configs, tokenizers (sentencepiece, tiktoken, vocab/merges),
# chat templates, and the Python of models that need TRUST_REMOTE_CODE.
SUPPORT_PATTERNS = ["*.json", "*.model", "*.txt", "*.tiktoken", "*.jinja", "*.py", "tokenizer*"]
SAFETENSORS = ["*.safetensors"]
MISTRAL = ["consolidated*.safetensors"]
PYTORCH = ["*.bin", "*.pt"]
# Never needed by vLLM: other frameworks' weights and the unconverted checkpoints some repos ship.
ALWAYS_IGNORED = ["original/*", "*.h5", "*.msgpack", "*.onnx", "*.onnx_data", "*.ot", "*.tflite", "*.pth"]

BUILD_SECRET_HINT = (
    " At build time HF_TOKEN is the build secret of that name: "
    "docker build --secret id=HF_TOKEN,env=HF_TOKEN ..."
)


class BakeError(Exception):
    """The model cannot be baked; the text is the one sentence the build shows."""


@dataclass(frozen=True)
class Baked:
    repo: str
    revision: str  # the commit the requested revision resolved to
    path: str
    files: int
    bytes: int


def weight_patterns(filenames: Sequence[str]) -> tuple[list[str], list[str]]:
    """(allow, ignore) patterns for a model repo, choosing the weights vLLM's default loader would load.

    Mistral-format checkpoints (consolidated*.safetensors) win when present, as with vLLM's
    load_format=auto, so a repo shipping both formats is not downloaded twice; then any
    safetensors; PyTorch .bin/.pt only when a repo has no safetensors at all.
    """
    names = [name.rsplit("/", 1)[-1] for name in filenames]
    if any(fnmatch.fnmatch(name, "consolidated*.safetensors") for name in names):
        return SUPPORT_PATTERNS + MISTRAL, ALWAYS_IGNORED + PYTORCH
    if any(fnmatch.fnmatch(name, "*.safetensors") for name in names):
        return SUPPORT_PATTERNS + SAFETENSORS, ALWAYS_IGNORED + PYTORCH
    return SUPPORT_PATTERNS + PYTORCH, ALWAYS_IGNORED


def _read_token(token_file: Path | None) -> str | None:
    if token_file is None or not token_file.is_file():
        return None
    token = token_file.read_text().strip()
    return token or None


def hub_error_message(
    exc: BaseException, repo: str, revision: str | None, name_var: str, revision_var: str, token_set: bool
) -> str:
    """The sentence for a Hub failure, shared with the worker's pre-flight wording."""
    if isinstance(exc, GatedRepoError):
        return gated_repo_message(repo, name_var, token_set=token_set) + BUILD_SECRET_HINT
    if isinstance(exc, RevisionNotFoundError):
        return revision_not_found_message(repo, revision or "main", revision_var)
    if isinstance(exc, (RepositoryNotFoundError, DisabledRepoError, HFValidationError)):
        return repo_not_found_message(repo, name_var) + BUILD_SECRET_HINT
    if isinstance(exc, HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else None
        if status in (401, 403):
            return unauthorized_message(repo, name_var, token_set=token_set) + BUILD_SECRET_HINT
        return f"The Hugging Face Hub answered HTTP {status} while fetching {name_var}={repo!r}: retry the build later."
    if isinstance(exc, LocalEntryNotFoundError):
        return f"Could not download {name_var}={repo!r}: the Hugging Face Hub could not be reached from the build; check the builder's network and retry."
    return f"Could not download {name_var}={repo!r}: {type(exc).__name__}: {exc}; check the builder's network and retry."


def bake(
    repo: str,
    revision: str | None,
    local_dir: Path,
    token: str | None,
    name_var: str,
    revision_var: str,
    weights: bool,
) -> Baked:
    """Download one repository's files into local_dir; raise BakeError with the sentence on failure."""
    api = HfApi()
    token_arg: str | bool = token if token else False  # never fall back to a token stored on the builder
    try:
        info = api.model_info(repo, revision=revision, token=token_arg)
        filenames = [s.rfilename for s in (info.siblings or [])]
        if weights:
            allow, ignore = weight_patterns(filenames)
        else:
            allow, ignore = SUPPORT_PATTERNS, ALWAYS_IGNORED + SAFETENSORS + PYTORCH
        commit = info.sha or revision or "main"
        snapshot_download(
            repo,
            revision=commit,
            local_dir=local_dir,
            allow_patterns=allow,
            ignore_patterns=ignore,
            token=token_arg,
        )
    except Exception as exc:  # Hub, HTTP and transport errors alike: the build must end in a sentence
        raise BakeError(hub_error_message(exc, repo, revision, name_var, revision_var, token is not None)) from exc

    files = [p for p in local_dir.rglob("*") if p.is_file() and ".cache" not in p.relative_to(local_dir).parts]
    if weights and not any(fnmatch.fnmatch(p.name, pat) for p in files for pat in SAFETENSORS + PYTORCH):
        raise BakeError(
            f"{name_var}={repo!r} has no weights the worker can bake (safetensors, or PyTorch .bin/.pt) "
            f"at revision {commit}: choose a repository that has them, or deploy without a baked model."
        )
    return Baked(repo=repo, revision=commit, path=str(local_dir), files=len(files), bytes=sum(p.stat().st_size for p in files))


def run(env: Mapping[str, str], model_dir: Path, tokenizer_dir: Path, record: Path, token_file: Path | None) -> str:
    """Bake what the build args ask for and write the record; returns the summary line."""

    def arg(name: str) -> str | None:
        value = env.get(name, "").strip()
        return value or None

    model, tokenizer = arg("MODEL_NAME"), arg("TOKENIZER_NAME")
    for revision_var, name_var in (("MODEL_REVISION", "MODEL_NAME"), ("TOKENIZER_REVISION", "TOKENIZER_NAME")):
        if arg(revision_var) and not arg(name_var):
            raise BakeError(f"{revision_var}={arg(revision_var)!r} was given without {name_var}: set {name_var} too, or drop {revision_var}.")
    if model is None and tokenizer is None:
        return "no MODEL_NAME build arg: nothing baked; the worker will download MODEL_NAME at run time."

    token = _read_token(token_file)
    result: dict[str, object] = {"quantization": arg("QUANTIZATION")}
    lines = []
    if model is not None:
        baked = bake(model, arg("MODEL_REVISION"), model_dir, token, "MODEL_NAME", "MODEL_REVISION", weights=True)
        result["model"] = asdict(baked)
        lines.append(f"baked MODEL_NAME={model} at {baked.revision} into {baked.path} ({baked.files} files, {baked.bytes / 1e9:.2f} GB)")
    if tokenizer is not None:
        baked = bake(tokenizer, arg("TOKENIZER_REVISION"), tokenizer_dir, token, "TOKENIZER_NAME", "TOKENIZER_REVISION", weights=False)
        result["tokenizer"] = asdict(baked)
        lines.append(f"baked TOKENIZER_NAME={tokenizer} at {baked.revision} into {baked.path} ({baked.files} files)")
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(result, indent=2) + "\n")
    return "; ".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Download MODEL_NAME (and TOKENIZER_NAME) into the image.")
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--tokenizer-dir", type=Path, required=True)
    parser.add_argument("--record", type=Path, required=True, help="JSON file describing what was baked")
    parser.add_argument("--token-file", type=Path, default=None, help="file holding HF_TOKEN (the build secret)")
    args = parser.parse_args(argv)
    disable_progress_bars()  # a build log keeps every carriage-return frame; the summary line says enough
    try:
        print(run(os.environ, args.model_dir, args.tokenizer_dir, args.record, args.token_file), flush=True)
    except BakeError as exc:
        print(f"Cannot bake the model into the image: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
