"""The sentences for a model that cannot be fetched, shared by `preflight` and `startup_errors`.

A wrong MODEL_NAME must read the same whether the Hub pre-flight caught it in a second
or vLLM crashed on it after a cold start, so both paths build their answer here. This
module sits at the bottom of the package: it imports nothing of the worker's.
"""

from __future__ import annotations


def repo_not_found_message(repo: str, variable: str = "MODEL_NAME") -> str:
    """The repository does not exist on the Hub (or is private and invisible to the token)."""
    return (
        f"{variable}={repo!r} was not found on the Hugging Face Hub: check the spelling "
        f"(owner/name, case-sensitive); if the repository is private, set HF_TOKEN to a token "
        f"of an account that can read it."
    )


def gated_repo_message(repo: str, variable: str = "MODEL_NAME", token_set: bool = False) -> str:
    """The repository is gated and the token (or its absence) does not grant access."""
    if token_set:
        fix = (
            f"the account of HF_TOKEN has not been granted access: accept the model's terms "
            f"at https://huggingface.co/{repo} with that account (approval can take a while), "
            f"or use a token of an account that has access"
        )
    else:
        fix = (
            f"HF_TOKEN is not set: accept the model's terms at https://huggingface.co/{repo} "
            f"and set HF_TOKEN to a read token of that account"
        )
    return f"{variable}={repo!r} is a gated repository and {fix}."


def revision_not_found_message(repo: str, revision: str, variable: str = "MODEL_REVISION") -> str:
    """The branch, tag or commit does not exist in the repository (e.g. lost to a force-push)."""
    return (
        f"{variable}={revision!r} does not exist in {repo!r}: set it to an existing branch, "
        f"tag or commit of that repository, or unset it to use the default branch."
    )


def unauthorized_message(repo: str, variable: str = "MODEL_NAME", token_set: bool = False) -> str:
    """The Hub refused the credentials (401)."""
    if token_set:
        return (
            f"The Hugging Face Hub rejected HF_TOKEN while fetching {variable}={repo!r}: the token "
            f"is invalid, expired or revoked; set HF_TOKEN to a valid read token."
        )
    return (
        f"The Hugging Face Hub refused anonymous access to {variable}={repo!r}: if the repository "
        f"is private or gated, set HF_TOKEN to a read token of an account that can read it; "
        f"otherwise check the name."
    )


def looks_like_path(reference: str) -> bool:
    """Whether MODEL_NAME reads as a filesystem path rather than an owner/name repository id."""
    return reference in (".", "..", "~") or reference.startswith(("/", "./", "../", "~/")) or reference.count("/") > 1


# Sentences whose only parts are the names and values they quote: one template each.
_MODEL_PATH_MISSING = (
    "{variable}={path!r} does not exist in this container, so vLLM cannot load the model from it: if the model "
    "is on a network volume, attach the volume to the endpoint and point {variable} at the model's directory "
    "under its mount point (/runpod-volume on Runpod Serverless); otherwise correct the path, or set {variable} "
    "to a Hugging Face repository id such as 'Qwen/Qwen3-0.6B'."
)
_INVALID_MODEL_NAME = (
    "{variable}={value!r} is neither a directory in this container nor a valid Hugging Face repository id "
    "(owner/name, with letters, digits, '-', '_' and '.'): correct it."
)
_OFFLINE_NOT_CACHED = (
    "{variable}={repo!r}{at} is not in this container's Hugging Face cache, and {offline}={offline_value} forbids "
    "downloading it: unset {offline} so the worker can download it from the Hub (and check the name: the "
    "worker's Hub check is also skipped while offline), or bake the model into the image or mount a volume whose "
    "Hugging Face cache (HF_HOME) already holds it."
)
_HUB_UNREACHABLE = (
    "vLLM could not reach the Hugging Face Hub to download {variable}={repo!r}, and the model is not in this "
    "container's Hugging Face cache: this is a network problem of the host or the Hub, not of the settings. If it "
    "persists, terminate this worker so the platform starts a fresh one, or bake the model into the image or a "
    "network volume so no download is needed."
)


def model_path_missing_message(path: str, variable: str = "MODEL_NAME") -> str:
    """A local model path that is not there (vLLM then takes it for a Hub repository id and rejects it)."""
    return _MODEL_PATH_MISSING.format(path=path, variable=variable)


def invalid_model_name_message(value: str, variable: str = "MODEL_NAME") -> str:
    """Neither a directory in the container nor a well-formed Hub repository id."""
    return _INVALID_MODEL_NAME.format(value=value, variable=variable)


def offline_not_cached_message(
    repo: str, variable: str = "MODEL_NAME", offline: str = "HF_HUB_OFFLINE", offline_value: str = "1",
    revision: str | None = None,
) -> str:
    """The Hub is switched off and the repository (at that revision) is not in the local cache."""
    at = f" at revision {revision!r}" if revision else ""
    return _OFFLINE_NOT_CACHED.format(variable=variable, repo=repo, at=at, offline=offline, offline_value=offline_value)


def hub_unreachable_message(repo: str, variable: str = "MODEL_NAME") -> str:
    """The Hub could not be reached and the model is not in the local cache (a network fault, often passing)."""
    return _HUB_UNREACHABLE.format(variable=variable, repo=repo)
