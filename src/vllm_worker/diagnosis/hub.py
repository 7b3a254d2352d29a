"""The messages for a model that could not be fetched: the Hub said no, or could not be reached.

The sentences come first, shared with the pre-flight (`model.preflight`) and the image's
download (`builder/download_model.py`), so a wrong MODEL_NAME reads the same whether the Hub
pre-flight caught it in a second or vLLM crashed on it after a cold start; then the builders
that find, in vLLM's output, which repository, revision and variable they are about.
"""

from __future__ import annotations

import re
from typing import Callable, Sequence
from urllib.parse import unquote

from vllm_worker.diagnosis.verdict import Context, Diagnosis, answer, answer_shared, compose, evidence_of, tried_sentence

# --- Hub access -----------------------------------------------------------------------------

# --- the sentences, shared with the pre-flight ---------------------------------------------


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


# --- which repository, revision and variable vLLM's output names -------------------------

_URL_REPO = re.compile(r"https?://[^\s'\"]+?/(?:api/models/)?([\w.-]+/[\w.-]+)/(?:resolve|revision|tree)/([^/\s'\"]+)")


def _repo_from(ctx: Context, patterns: Sequence[str]) -> str | None:
    for pattern in patterns:
        m = ctx.search(pattern)
        if m:
            return m.group(1).rstrip(".")
    m = ctx.search(_URL_REPO.pattern)
    return m.group(1) if m else None


def _repo_variable(ctx: Context, repo: str) -> str:
    if repo != ctx.model:
        for name in ("TOKENIZER_NAME", "TOKENIZER"):
            if ctx.profile.written(name) == repo:
                return name
    return "MODEL_NAME"


def _hub(ctx: Context, kind: str, patterns: Sequence[str], sentence: Callable[[str, str], str]) -> Diagnosis:
    repo = _repo_from(ctx, patterns) or ctx.model or "(unknown)"
    variable = _repo_variable(ctx, repo)
    return answer_shared(ctx, kind, sentence(repo, variable), variable=variable, value=repo, repo=repo)


def repo_not_found(ctx: Context) -> Diagnosis:
    return _hub(
        ctx,
        "repo_not_found",
        [r"(\S+) is not a local folder and is not a valid model identifier", r"(\S+) is not a local folder or a valid repository name"],
        lambda repo, variable: repo_not_found_message(repo, variable),
    )


def gated_repo(ctx: Context) -> Diagnosis:
    if ctx.hits[-1].rule.detail == "no_config":
        return _no_config(ctx)
    return _hub(
        ctx,
        "gated_repo",
        [r"Access to model (\S+) is restricted", r"access to it at https?://huggingface\.co/([^\s'\"]+)", r"(\S+) is a gated repository"],
        lambda repo, variable: gated_repo_message(repo, variable, ctx.token_set),
    )


def _no_config(ctx: Context) -> Diagnosis:
    """vLLM could not read config.json at all: a gated repository read without access, most often."""
    m = ctx.search(r"No supported config format found in (\S+)")
    repo = (m.group(1).rstrip(".") if m else None) or ctx.model or "(unknown)"
    variable = _repo_variable(ctx, repo)
    token = "HF_TOKEN has no access to it" if ctx.token_set else "HF_TOKEN is not set"
    message = (
        f"vLLM could not read the config.json of {variable}={repo!r}: most often the repository is gated and "
        f"{token}. To fix: accept the model's terms at https://huggingface.co/{repo} and set HF_TOKEN to a read "
        f"token of that account; if the repository is not gated, check the name and that it holds a config.json."
    )
    return answer_shared(ctx, "gated_repo", message, detail="no_config", variable=variable, value=repo, repo=repo)


_MODEL_VARIABLES = ("MODEL_NAME", "BAKED_MODEL_PATH", "TOKENIZER_NAME", "TOKENIZER")


def _model_variable(ctx: Context, reference: str) -> str:
    """Which variable holds `reference` (the model unless it is the tokenizer's or the baked path)."""
    return next((name for name in _MODEL_VARIABLES if ctx.profile.written(name) == reference), "MODEL_NAME")


def model_path_missing(ctx: Context) -> Diagnosis:
    hit = ctx.hits[-1]
    m = re.search(r"(?:path_or_model_id|'namespace/repo_name'|max length is 96|in repo_id|by '\.git'|not \w+): '([^']*)'",
                  hit.line) or re.search(
        r"'([^']*)'\.?(?: Use `repo_type` argument if needed\.)?\s*$", hit.line
    )
    reference = m.group(1) if m else ctx.model or "(unknown)"
    variable = _model_variable(ctx, reference)
    if hit.rule.detail == "path_or_model_id" and not looks_like_path(reference):
        # A well-formed id that could not be fetched, or nothing at all.
        return answer_shared(ctx, "repo_not_found", repo_not_found_message(reference, variable), line=hit.line,
                             variable=variable, value=reference, repo=reference)
    if looks_like_path(reference):
        message = model_path_missing_message(reference, variable)
    else:
        message = invalid_model_name_message(reference, variable)
    return answer_shared(ctx, "model_path_missing", message, line=hit.line, variable=variable, value=reference)




def offline_not_cached(ctx: Context) -> Diagnosis:
    hit = ctx.hits[-1]
    # huggingface_hub does not name the repository; vLLM's "non-default args" line does.
    said = ctx.search(r"non-default args: \{.*?'model': '([^']+)'")
    repo = ctx.model or (said.group(1) if said else None) or "(unknown)"
    variable = _model_variable(ctx, repo)
    offline = ctx.profile.offline
    offline_value = ctx.profile.written(offline) if offline else None
    revision = ctx.profile.written("MODEL_REVISION") if variable == "MODEL_NAME" else None
    missing_dir = ctx.search(r"Cache directory not found: (\S+?)\.?(?:\s|$)")
    if missing_dir:
        message = (
            f"The Hugging Face cache directory {missing_dir.group(1)} does not exist, so vLLM cannot find "
            f"{variable}={repo!r} in it: point HF_HOME or HF_HUB_CACHE at the cache that holds the model (a network "
            f"volume is mounted at /runpod-volume), or unset HF_HUB_OFFLINE so the worker can download it."
        )
    else:
        message = offline_not_cached_message(
            repo, variable, offline or "HF_HUB_OFFLINE", offline_value or "1", revision=revision
        )
    return answer_shared(ctx, "offline_not_cached", message, line=hit.line, variable=offline or "HF_HUB_OFFLINE",
                         value=offline_value, repo=repo, revision=revision)


def unauthorized(ctx: Context) -> Diagnosis:
    if ctx.hits[-1].rule.detail == "token_format":
        cause = "HF_TOKEN is not a valid HTTP header value: it contains a newline, a space or quotes"
        return answer(ctx, "unauthorized", cause,
            ["set HF_TOKEN to the token alone (hf_...), with nothing around it"], detail="token_format",
            variable="HF_TOKEN")
    return _hub(
        ctx,
        "unauthorized",
        [r"error when trying to load (\S+?):?$"],
        lambda repo, variable: unauthorized_message(repo, variable, ctx.token_set),
    )


_REVISION_VARIABLES = ("MODEL_REVISION", "REVISION", "TOKENIZER_REVISION", "CODE_REVISION")


def revision_not_found(ctx: Context) -> Diagnosis:
    said = ctx.search(r"(\S+) is not a valid git identifier .*?huggingface\.co/([^'\s]+)'")
    url = ctx.search(_URL_REPO.pattern)
    repo = (said.group(2) if said else None) or (url.group(1) if url else None) or ctx.model or "(unknown)"
    revision = (said.group(1) if said else None) or (unquote(url.group(2)) if url else None) or ctx.revision or "(unknown)"
    variable = next((name for name in _REVISION_VARIABLES if ctx.profile.written(name) == revision), None)
    if variable is None:
        variable = next((name for name in _REVISION_VARIABLES if ctx.profile.written(name) is not None), None)
    if variable is not None:
        message = revision_not_found_message(repo, revision, variable) + tried_sentence(ctx.tried)
    else:
        # No revision was pinned: vLLM resolved the default branch to a commit that vanished meanwhile.
        message = compose(
            f"Revision {revision!r} of {repo!r} disappeared while vLLM was fetching it (the repository was "
            f"probably force-pushed while the worker started)",
            ctx.tried,
            ["restart the worker to fetch the current revision, or pin MODEL_REVISION to a commit that stays"],
        )
    return Diagnosis(
        kind="revision_not_found",
        message=message,
        evidence=evidence_of(ctx.hits[-1].line),
        variable=variable,
        value=revision,
        repo=repo,
        revision=revision,
    )



def hub_unreachable(ctx: Context) -> Diagnosis:
    said = ctx.search(r"non-default args: \{.*?'model': '([^']+)'")
    named = ctx.search(r"it looks like (\S+) is not the path to a directory")
    repo = ctx.model or (named.group(1) if named else None) or (said.group(1) if said else None) or "(unknown)"
    variable = _model_variable(ctx, repo)
    if looks_like_path(repo) or (named and "/" not in repo):
        # Not a Hub id (owner/name): a local directory that is not there, which no download can fix.
        return answer_shared(ctx, "model_path_missing", model_path_missing_message(repo, variable), variable=variable,
                             value=repo)
    return answer_shared(ctx, "hub_unreachable", hub_unreachable_message(repo, variable), variable=variable, value=repo, repo=repo)
