"""Every Hub cause's sentence, word for word: the cause, the value, the fix and the URL a user reads.

Elsewhere the Hub sentences are compared with the functions that build them, which proves the
pre-flight and a crashed vLLM say the same thing but not what they say: a lost fix or a wrong
URL would pass there. Here each cause's full sentence is written out, reached the way a user
meets it: vLLM's (or huggingface_hub's) own output of that failure, read by `explain`. The
pre-flight's literal sentences are in tests/integration/test_preflight.py.
"""

from __future__ import annotations

import pytest

from tests.support import vllm_texts as t
from vllm_worker.diagnosis.startup_errors import explain
from vllm_worker.diagnosis.verdict import Failure

TOKEN = {"HF_TOKEN": "hf_0123456789abcdef"}
REVISION = "0123456789abcdef0123456789abcdef01234567"
# huggingface_hub/_snapshot_download.py, HF_HUB_OFFLINE=1 and the snapshot not in the cache
OFFLINE = t.engine_core_crash(
    "huggingface_hub.errors.LocalEntryNotFoundError: Cannot find an appropriate cached snapshot folder for the "
    "specified revision on the local disk and outgoing traffic has been disabled. To enable repo look-ups and "
    "downloads online, set 'HF_HUB_OFFLINE=0' as environment variable."
)


def validation_error(repo_id: str) -> str:
    """huggingface_hub/utils/_validators.py validate_repo_id, for a MODEL_NAME vLLM took for a repository id."""
    return (
        "huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name' or "
        f"'namespace/repo_name': '{repo_id}'. Use `repo_type` argument if needed."
    )


# cause -> (output, MODEL_NAME, env, MODEL_REVISION, the sentence)
SENTENCES: dict[str, tuple[str, str, dict[str, str], str | None, str]] = {
    "repo_not_found": (
        t.REPO_NOT_FOUND, "acme/missing-model", {}, None,
        "MODEL_NAME='acme/missing-model' was not found on the Hugging Face Hub: check the spelling (owner/name, "
        "case-sensitive); if the repository is private, set HF_TOKEN to a token of an account that can read it.",
    ),
    "gated_repo, no token": (
        t.GATED_REPO, "acme/gated-model", {}, None,
        "MODEL_NAME='acme/gated-model' is a gated repository and HF_TOKEN is not set: accept the model's terms at "
        "https://huggingface.co/acme/gated-model and set HF_TOKEN to a read token of that account.",
    ),
    "gated_repo, a token without access": (
        t.GATED_REPO_403, "acme/gated-model", TOKEN, None,
        "MODEL_NAME='acme/gated-model' is a gated repository and the account of HF_TOKEN has not been granted "
        "access: accept the model's terms at https://huggingface.co/acme/gated-model with that account (approval "
        "can take a while), or use a token of an account that has access.",
    ),
    "revision_not_found": (
        t.REVISION_NOT_FOUND, "acme/gone-model", {"MODEL_NAME": "acme/gone-model", "MODEL_REVISION": REVISION}, REVISION,
        f"MODEL_REVISION='{REVISION}' does not exist in 'acme/gone-model': set it to an existing branch, tag or "
        "commit of that repository, or unset it to use the default branch.",
    ),
    "unauthorized, a token": (
        t.UNAUTHORIZED, "acme/some-model", TOKEN, None,
        "The Hugging Face Hub rejected HF_TOKEN while fetching MODEL_NAME='acme/some-model': the token is invalid, "
        "expired or revoked; set HF_TOKEN to a valid read token.",
    ),
    "unauthorized, no token": (
        t.UNAUTHORIZED, "acme/some-model", {}, None,
        "The Hugging Face Hub refused anonymous access to MODEL_NAME='acme/some-model': if the repository is "
        "private or gated, set HF_TOKEN to a read token of an account that can read it; otherwise check the name.",
    ),
    "hub_unreachable": (
        t.HUB_UNREACHABLE, "acme/m", {}, None,
        "vLLM could not reach the Hugging Face Hub to download MODEL_NAME='acme/m', and the model is not in this "
        "container's Hugging Face cache: this is a network problem of the host or the Hub, not of the settings. "
        "If it persists, terminate this worker so the platform starts a fresh one, or bake the model into the "
        "image or a network volume so no download is needed.",
    ),
    "offline_not_cached": (
        OFFLINE, "acme/m", {"HF_HUB_OFFLINE": "1"}, None,
        "MODEL_NAME='acme/m' is not in this container's Hugging Face cache, and HF_HUB_OFFLINE=1 forbids "
        "downloading it: unset HF_HUB_OFFLINE so the worker can download it from the Hub (and check the name: the "
        "worker's Hub check is also skipped while offline), or bake the model into the image or mount a volume "
        "whose Hugging Face cache (HF_HOME) already holds it.",
    ),
    "model_path_missing": (
        validation_error("/runpod-volume/models/x"), "/runpod-volume/models/x", {"MODEL_NAME": "/runpod-volume/models/x"}, None,
        "MODEL_NAME='/runpod-volume/models/x' does not exist in this container, so vLLM cannot load the model "
        "from it: if the model is on a network volume, attach the volume to the endpoint and point MODEL_NAME at "
        "the model's directory under its mount point (/runpod-volume on Runpod Serverless); otherwise correct "
        "the path, or set MODEL_NAME to a Hugging Face repository id such as 'Qwen/Qwen3-0.6B'.",
    ),
    "model_path_missing, not a repository id either": (
        validation_error("acme/m x"), "acme/m x", {"MODEL_NAME": "acme/m x"}, None,
        "MODEL_NAME='acme/m x' is neither a directory in this container nor a valid Hugging Face repository id "
        "(owner/name, with letters, digits, '-', '_' and '.'): correct it.",
    ),
}


@pytest.mark.parametrize("cause", sorted(SENTENCES))
def test_the_hub_sentence_word_for_word(cause: str) -> None:
    output, model, env, revision, sentence = SENTENCES[cause]
    diagnosis = explain(Failure.of(output, model, revision=revision, env=env, exit_code=1))
    assert diagnosis.kind == cause.split(",")[0]
    assert diagnosis.message == sentence
