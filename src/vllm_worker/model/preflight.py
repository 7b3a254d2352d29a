"""Check the model reference against the Hugging Face Hub before vLLM is launched.

A typo in MODEL_NAME, a gated model without access, or a MODEL_REVISION that does
not exist otherwise surfaces only after a full cold start, when `vllm serve` dies
while downloading. One metadata call (`HfApi.model_info`, no weights) answers the
same question in a fraction of a second, so the worker can refuse to launch and
answer every job with the cause instead.

Only definitive answers stop the boot: the repository does not exist (or is
private and invisible to the token), it is gated and the token has no access, the
revision does not exist, or the Hub refused the credentials. Anything that may go
away on its own (429, 5xx, timeouts, DNS, TLS, connection errors) is logged and the
boot goes on: vLLM makes its own attempt, and a flaky network must never be
reported as a wrong model name. The sentences are the ones `startup_errors` uses
after a crash, so a user sees the same text whichever path found the cause.

The check runs only when vLLM will fetch the model from the Hub by repo id: it is
skipped for baked models, offline mode, ModelScope, local paths, URL-style sources
(`s3://`, `gs://`, `az://`, `http(s)://`, `hf://`...: none is a Hub repo id, so
another loader, or vLLM's own error, is the authority) and config-file deploys
(the launched model may not be MODEL_NAME).
"""

from __future__ import annotations

import logging
import os
import ssl
import time
from dataclasses import dataclass, field
from typing import Any, Sequence, cast

from vllm_worker.config.profile import LaunchProfile
from vllm_worker.config.secrets import mask_text
from vllm_worker.diagnosis.hub import (
    gated_repo_message,
    model_path_missing_message,
    repo_not_found_message,
    revision_not_found_message,
    unauthorized_message,
)

logger = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "https://huggingface.co"
DEFAULT_TIMEOUT = 10.0

# Kinds of a definitive answer; each has one shared message.
REPO_NOT_FOUND = "repo_not_found"
GATED_REPO = "gated_repo"
REVISION_NOT_FOUND = "revision_not_found"
UNAUTHORIZED = "unauthorized"

# Flags in VLLM_EXTRA_ARGS that change what is launched, so MODEL_NAME / MODEL_REVISION /
# TOKENIZER_* may not be what vLLM fetches.
_REFERENCE_FLAGS = ("--config", "--model", "--revision", "--tokenizer", "--tokenizer-revision", "--hf-config-path")
# Fields the decision needs; always requested when a caller asks for more (`expand`).
_DECISION_FIELDS = ("sha", "gated", "private")


@dataclass(frozen=True)
class Target:
    """One Hub reference vLLM will fetch, and the variables a message must name."""

    repo: str
    revision: str | None
    repo_variable: str = "MODEL_NAME"
    revision_variable: str = "MODEL_REVISION"


@dataclass(frozen=True)
class ModelSummary:
    """What the metadata call said about MODEL_NAME (for later planning, e.g. capacity)."""

    repo: str
    revision: str | None
    sha: str | None
    gated: str | bool | None
    private: bool | None
    safetensors_parameters: dict[str, int] | None = None  # dtype -> count, only when expanded
    safetensors_total: int | None = None


@dataclass
class PreflightResult:
    ok: bool
    skipped_reason: str | None = None
    message: str | None = None  # the one sentence every job is answered with when not ok
    kind: str | None = None
    warnings: list[str] = field(default_factory=list)
    model_info_summary: ModelSummary | None = None
    calls: int = 0  # Hub requests made
    elapsed: float = 0.0


# --------------------------------------------------------------------------- decisions


def hub_endpoint(profile: LaunchProfile) -> str:
    """The Hub the model comes from: HF_ENDPOINT as set, else huggingface.co (what vLLM's huggingface_hub reads)."""
    return (profile.hf_endpoint or DEFAULT_ENDPOINT).rstrip("/")


def is_url(reference: str) -> bool:
    return "://" in reference


def is_local_path(reference: str) -> bool:
    """True for what vLLM would load from disk rather than the Hub."""
    if reference in (".", "..", "~") or reference.startswith(("/", "./", "../", "~/")):
        return True
    # vLLM's own test (Path(model).exists()): a relative directory that exists here.
    return os.path.exists(reference)


def missing_local_path(profile: LaunchProfile) -> tuple[str, str] | None:
    """(variable, path) when the model is given as a filesystem path that is not there.

    vLLM would take such a value for a Hub repository id and fail after its own start-up;
    checked before the skip rules, since an offline or baked deploy can have a wrong path too.
    """
    for variable, value in (("BAKED_MODEL_PATH", profile.baked_model_path), ("MODEL_NAME", profile.model)):
        if value is None:
            continue
        if value.startswith(("/", "./", "../", "~/")) and not os.path.exists(os.path.expanduser(value)):
            return variable, value
        return None
    return None


def should_skip(profile: LaunchProfile) -> str | None:
    """Why the pre-flight must not run for this deploy, or None when it should."""
    if profile.baked_model_path is not None:
        return "BAKED_MODEL_PATH is set: the model is baked into the image"
    if profile.offline is not None:
        return f"{profile.offline} is set: the Hub is not used"
    if profile.modelscope:
        return "VLLM_USE_MODELSCOPE is set: the model comes from ModelScope, not the Hub"
    if profile.config_file is not None:
        return f"{profile.config_file} is set: the launched model comes from a config file"
    words = profile.extra_args_words
    if words is None:
        return "VLLM_EXTRA_ARGS cannot be parsed, so what is launched is unknown"
    for word in words:
        flag = word.split("=", 1)[0]
        if flag in _REFERENCE_FLAGS:
            return f"VLLM_EXTRA_ARGS sets {flag}: the launched model may not be MODEL_NAME"
    model = profile.model
    if model is None:
        return "MODEL_NAME is not set"
    if is_url(model):
        return "MODEL_NAME is a URL, not a Hugging Face repo id"
    if is_local_path(model):
        return "MODEL_NAME is a local path"
    return None


def targets(profile: LaunchProfile) -> list[Target]:
    """The Hub references vLLM will fetch, in order, without duplicates, each with the variable
    the user set for it (MODEL_REVISION or vLLM's own REVISION, TOKENIZER_NAME or TOKENIZER).

    Mirrors vLLM's defaults: the tokenizer is the model unless one is set, and its revision is
    the model's unless TOKENIZER_REVISION is set.
    """
    model = profile.model
    if model is None:
        return []
    revision = profile.revision
    revision_variable = profile.variable("REVISION") or "MODEL_REVISION"
    found = [Target(model, revision, "MODEL_NAME", revision_variable)]
    tokenizer_name = profile.tokenizer
    tokenizer_revision = profile.tokenizer_revision
    tokenizer = tokenizer_name or model
    if is_url(tokenizer) or is_local_path(tokenizer):
        return found
    tokenizer_target = Target(
        tokenizer,
        tokenizer_revision or revision,
        (profile.variable("TOKENIZER") or "TOKENIZER_NAME") if tokenizer_name else "MODEL_NAME",
        "TOKENIZER_REVISION" if tokenizer_revision else revision_variable,
    )
    if (tokenizer_target.repo, tokenizer_target.revision) != (model, revision):
        found.append(tokenizer_target)
    return found


def _ssl_cause(exc: BaseException) -> bool:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ssl.SSLError) or "SSL" in type(current).__name__:
            return True
        text = str(current)
        if "CERTIFICATE_VERIFY_FAILED" in text or "SSL:" in text or "TLS" in text:
            return True
        current = current.__cause__ or current.__context__
    return False


_DNS_MARKERS = (
    "Name or service not known",
    "nodename nor servname",
    "Temporary failure in name resolution",
    "No address associated with hostname",
    "getaddrinfo failed",
)


def classify_hub_error(exc: BaseException) -> tuple[str, bool]:
    """(kind, definitive) for an exception raised by a Hub call.

    Definitive means vLLM would fail the same way on every attempt. Anything not
    recognised is treated as transient: a wrong "not found" costs a user more than
    a boot that fails later with vLLM's own message.
    """
    import httpx2
    from huggingface_hub.errors import (
        DisabledRepoError,
        GatedRepoError,
        HfHubHTTPError,
        HFValidationError,
        OfflineModeIsEnabled,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if isinstance(exc, GatedRepoError):  # before its parent RepositoryNotFoundError
        return GATED_REPO, True
    if isinstance(exc, RepositoryNotFoundError):
        return REPO_NOT_FOUND, True
    if isinstance(exc, RevisionNotFoundError):
        return REVISION_NOT_FOUND, True
    if isinstance(exc, HFValidationError):  # not a valid repo id, so it cannot exist on the Hub
        return REPO_NOT_FOUND, True
    if isinstance(exc, OfflineModeIsEnabled):
        return "offline", False
    if isinstance(exc, (DisabledRepoError, RemoteEntryNotFoundError)):
        return "http_error", False
    if isinstance(exc, HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else None
        if status in (401, 403):
            return UNAUTHORIZED, True
        if status == 429:
            return "rate_limited", False
        if status is not None and status >= 500:
            return "server_error", False
        return "http_error", False
    if isinstance(exc, httpx2.TimeoutException):
        return "timeout", False
    if isinstance(exc, httpx2.ConnectError):
        if any(marker in str(exc) for marker in _DNS_MARKERS):
            return "dns", False
        if _ssl_cause(exc):
            return "tls", False
        return "connection", False
    if isinstance(exc, httpx2.TransportError):
        return ("tls", False) if _ssl_cause(exc) else ("network", False)
    if isinstance(exc, ssl.SSLError):
        return "tls", False
    if isinstance(exc, OSError):
        return "network", False
    return "unexpected", False


def failure_message(kind: str, target: Target, token_set: bool) -> str | None:
    """The shared sentence for a definitive kind, or None when there is none."""
    if kind == REPO_NOT_FOUND:
        return repo_not_found_message(target.repo, target.repo_variable)
    if kind == GATED_REPO:
        return gated_repo_message(target.repo, target.repo_variable, token_set=token_set)
    if kind == REVISION_NOT_FOUND and target.revision is not None:
        return revision_not_found_message(target.repo, target.revision, target.revision_variable)
    if kind == UNAUTHORIZED:
        return unauthorized_message(target.repo, target.repo_variable, token_set=token_set)
    return None


# --------------------------------------------------------------------------- the calls


def _describe(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    if status is not None:
        return f"HTTP {status}"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _auth_check(endpoint: str, repo: str, token: str, timeout: float) -> None:
    """`HfApi.auth_check` with a timeout.

    `auth_check` takes no timeout and the shared client has none, so a hanging Hub
    would hang the boot; this is the same request (same path, headers and error
    mapping through `hf_raise_for_status`) on the same client, bounded.
    """
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    headers = build_hf_headers(token=token, library_name="vllm-worker")
    response = get_session().get(f"{endpoint}/api/models/{repo}/auth-check", headers=headers, timeout=timeout)
    hf_raise_for_status(response)


def run(
    profile: LaunchProfile,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    expand: Sequence[str] = (),
) -> PreflightResult:
    """Check MODEL_NAME (and the tokenizer reference when it differs) on the Hub.

    At most two requests per reference (metadata, then `auth-check` for a gated repo
    when a token is set), each bounded by `timeout`, no retries; after the first
    transient failure no further call is made. `expand` asks the metadata call for more
    fields (e.g. "safetensors" for capacity planning); the decision fields are added.
    """
    started = time.monotonic()
    missing = missing_local_path(profile)
    if missing is not None:
        message = model_path_missing_message(missing[1], missing[0])
        logger.error("Model pre-flight failed: %s", message)
        return PreflightResult(ok=False, kind="model_path_missing", message=message)
    reason = should_skip(profile)
    if reason is not None:
        logger.info("Model pre-flight skipped: %s.", reason)
        return PreflightResult(ok=True, skipped_reason=reason)

    from huggingface_hub import HfApi

    token = profile.hf_token
    endpoint = hub_endpoint(profile)
    # token=False everywhere without HF_TOKEN: no token file from ~/.cache, so the
    # answer depends only on the environment vLLM is given.
    api = HfApi(endpoint=endpoint, token=False, library_name="vllm-worker")
    fields = sorted(set(expand) | set(_DECISION_FIELDS)) if expand else None
    plan = targets(profile)
    result = PreflightResult(ok=True)

    for index, target in enumerate(plan):
        try:
            result.calls += 1
            info = api.model_info(
                target.repo, revision=target.revision, timeout=timeout, expand=cast(Any, fields), token=token or False
            )
            if index == 0:
                result.model_info_summary = _summary(target, info)
            if info.gated and token is not None:
                result.calls += 1
                _auth_check(endpoint, target.repo, token, timeout)
        except Exception as exc:  # noqa: BLE001 - every failure is classified; none may crash the boot
            kind, definitive = classify_hub_error(exc)
            refusal = failure_message(kind, target, token_set=token is not None) if definitive else None
            if refusal is not None:
                return _failed(result, kind, refusal, started)
            warning = _scrub(
                f"Model pre-flight could not check {target.repo_variable}={target.repo!r} on the Hub "
                f"({kind}: {_describe(exc)}); starting vLLM anyway.",
                token,
            )
            logger.warning("%s", warning)
            result.warnings.append(warning)
            break  # the Hub is not answering well: no further calls
        if info.gated and token is None:
            # Gated files need an authenticated account that accepted the terms: without a
            # token the answer is known without asking auth-check.
            return _failed(result, GATED_REPO, gated_repo_message(target.repo, target.repo_variable), started)
    else:
        logger.info("Model pre-flight passed for %s.", ", ".join(f"{t.repo_variable}={t.repo}" for t in plan))
    result.elapsed = time.monotonic() - started
    return result


def _failed(result: PreflightResult, kind: str, message: str, started: float) -> PreflightResult:
    result.ok = False
    result.kind = kind
    result.message = message
    result.elapsed = time.monotonic() - started
    logger.info("Model pre-flight found a definitive problem (%s); vLLM will not be launched.", kind)
    return result


def _summary(target: Target, info: object) -> ModelSummary:
    safetensors = getattr(info, "safetensors", None)
    return ModelSummary(
        repo=target.repo,
        revision=target.revision,
        sha=getattr(info, "sha", None),
        gated=getattr(info, "gated", None),
        private=getattr(info, "private", None),
        safetensors_parameters=dict(safetensors.parameters) if safetensors is not None else None,
        safetensors_total=safetensors.total if safetensors is not None else None,
    )


def _scrub(text: str, token: str | None) -> str:
    """The one secrets rule (config.secrets), with the token the pre-flight used."""
    return mask_text(text, [token]) if token else text
