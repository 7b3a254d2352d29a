"""The pre-flight's pure decisions: when it runs, what it checks, and which Hub answers stop the boot.

Hub errors are produced by huggingface_hub's own `hf_raise_for_status` from responses
shaped like the Hub's (status + X-Error-Code / X-Error-Message), so the table below
tests the mapping the worker actually sees, without any network.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import httpx2
import pytest
from huggingface_hub.errors import HFValidationError, OfflineModeIsEnabled
from huggingface_hub.utils import hf_raise_for_status

from vllm_worker.config.profile import LaunchProfile
from vllm_worker.diagnosis.hub import gated_repo_message, repo_not_found_message, revision_not_found_message, unauthorized_message
from vllm_worker.diagnosis.verdict import Failure
from vllm_worker.diagnosis import startup_errors
from vllm_worker.model.preflight import (
    GATED_REPO,
    REPO_NOT_FOUND,
    REVISION_NOT_FOUND,
    UNAUTHORIZED,
    Target,
    classify_hub_error,
    failure_message,
    should_skip,
    targets,
)

HUB = {"MODEL_NAME": "org/model"}


# --------------------------------------------------------------------------- should_skip


@pytest.mark.parametrize(
    ("extra", "mentions"),
    [
        ({"BAKED_MODEL_PATH": "/models/baked"}, "BAKED_MODEL_PATH"),
        ({"HF_HUB_OFFLINE": "1"}, "HF_HUB_OFFLINE"),
        ({"HF_HUB_OFFLINE": "true"}, "HF_HUB_OFFLINE"),
        ({"HF_HUB_OFFLINE": "YES"}, "HF_HUB_OFFLINE"),
        ({"TRANSFORMERS_OFFLINE": "on"}, "TRANSFORMERS_OFFLINE"),
        ({"VLLM_USE_MODELSCOPE": "True"}, "VLLM_USE_MODELSCOPE"),
        ({"VLLM_CONFIG_FILE": "/config/vllm.yaml"}, "VLLM_CONFIG_FILE"),
        ({"MODEL_CONFIG": "/config/model.yaml"}, "MODEL_CONFIG"),
        ({"VLLM_EXTRA_ARGS": "--config /config/vllm.yaml"}, "--config"),
        ({"VLLM_EXTRA_ARGS": "--max-num-seqs 8 --config=/c.yaml"}, "--config"),
        ({"VLLM_EXTRA_ARGS": "--revision v2"}, "--revision"),
        ({"VLLM_EXTRA_ARGS": "--tokenizer other/tok"}, "--tokenizer"),
        ({"VLLM_EXTRA_ARGS": "--model other/model"}, "--model"),
        ({"VLLM_EXTRA_ARGS": "--served-model-name 'unbalanced"}, "VLLM_EXTRA_ARGS"),
    ],
)
def test_deploys_that_do_not_fetch_model_name_from_the_hub_are_skipped(extra: dict, mentions: str) -> None:
    reason = should_skip(LaunchProfile.parse({**HUB, **extra}))
    assert reason is not None and mentions in reason


@pytest.mark.parametrize(
    "model",
    ["/models/llama", "./llama", "../llama", "~/llama", ".", "/runpod-volume/model.gguf"],
)
def test_local_paths_are_skipped(model: str) -> None:
    assert should_skip(LaunchProfile.parse({"MODEL_NAME": model})) == "MODEL_NAME is a local path"


def test_an_existing_relative_directory_is_a_local_path(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "org" / "model").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert should_skip(LaunchProfile.parse({"MODEL_NAME": "org/model"})) == "MODEL_NAME is a local path"
    assert should_skip(LaunchProfile.parse({"MODEL_NAME": "org/other"})) is None


@pytest.mark.parametrize(
    "model",
    ["s3://bucket/llama", "gs://bucket/llama", "az://container/llama", "https://example.com/m", "hf://org/model"],
)
def test_url_style_sources_are_skipped(model: str) -> None:
    assert should_skip(LaunchProfile.parse({"MODEL_NAME": model})) == "MODEL_NAME is a URL, not a Hugging Face repo id"


def test_missing_model_name_is_left_to_the_argument_builder() -> None:
    assert should_skip(LaunchProfile.parse({})) == "MODEL_NAME is not set"
    assert should_skip(LaunchProfile.parse({"MODEL_NAME": "  "})) == "MODEL_NAME is not set"


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"HF_HUB_OFFLINE": "0"},
        {"TRANSFORMERS_OFFLINE": "false"},
        {"BAKED_MODEL_PATH": ""},
        {"VLLM_USE_MODELSCOPE": "false"},
        {"VLLM_EXTRA_ARGS": "--max-num-seqs 8 --enable-prefix-caching"},
        {"VLLM_EXTRA_ARGS": "--config-format hf"},
        {"HF_TOKEN": "hf_secret", "MODEL_REVISION": "main"},
    ],
)
def test_hub_deploys_are_checked(extra: dict) -> None:
    assert should_skip(LaunchProfile.parse({**HUB, **extra})) is None


# --------------------------------------------------------------------------- targets


def test_only_the_model_when_the_tokenizer_is_the_model() -> None:
    assert targets(LaunchProfile.parse({"MODEL_NAME": "org/m", "MODEL_REVISION": "v1"})) == [Target("org/m", "v1")]
    assert targets(LaunchProfile.parse({"MODEL_NAME": "org/m", "TOKENIZER_NAME": "org/m"})) == [Target("org/m", None)]
    assert targets(LaunchProfile.parse({})) == []


def test_a_tokenizer_revision_alone_checks_the_model_repo_at_that_revision() -> None:
    assert targets(LaunchProfile.parse({"MODEL_NAME": "org/m", "TOKENIZER_REVISION": "tok-v2"})) == [
        Target("org/m", None),
        Target("org/m", "tok-v2", "MODEL_NAME", "TOKENIZER_REVISION"),
    ]


def test_a_separate_tokenizer_inherits_model_revision_like_vllm_does() -> None:
    env = {"MODEL_NAME": "org/m", "MODEL_REVISION": "v1", "TOKENIZER_NAME": "org/tok"}
    assert targets(LaunchProfile.parse(env)) == [Target("org/m", "v1"), Target("org/tok", "v1", "TOKENIZER_NAME", "MODEL_REVISION")]
    env["TOKENIZER_REVISION"] = "t1"
    assert targets(LaunchProfile.parse(env))[1] == Target("org/tok", "t1", "TOKENIZER_NAME", "TOKENIZER_REVISION")


def test_a_local_or_url_tokenizer_is_not_checked() -> None:
    assert targets(LaunchProfile.parse({"MODEL_NAME": "org/m", "TOKENIZER_NAME": "/tokenizers/t"})) == [Target("org/m", None)]
    assert targets(LaunchProfile.parse({"MODEL_NAME": "org/m", "TOKENIZER_NAME": "s3://b/t"})) == [Target("org/m", None)]


def test_token_comes_from_hf_token_then_the_legacy_name() -> None:
    assert LaunchProfile.parse({"HF_TOKEN": "a", "HUGGING_FACE_HUB_TOKEN": "b"}).hf_token == "a"
    assert LaunchProfile.parse({"HF_TOKEN": " ", "HUGGING_FACE_HUB_TOKEN": "b"}).hf_token == "b"
    assert LaunchProfile.parse({}).hf_token is None


# --------------------------------------------------------------------------- classify_hub_error

URL = "https://huggingface.co/api/models/org/model"


def hub_error(status: int, code: str | None = None, message: str | None = None, url: str = URL) -> Exception:
    headers = {}
    if code is not None:
        headers["X-Error-Code"] = code
    if message is not None:
        headers["X-Error-Message"] = message
    response = httpx2.Response(status, headers=headers, json={"error": message or "x"}, request=httpx2.Request("GET", url))
    with pytest.raises(Exception) as raised:
        hf_raise_for_status(response)
    return raised.value


@pytest.mark.parametrize(
    ("status", "code", "message", "expected"),
    [
        (401, "RepoNotFound", "Repository not found", (REPO_NOT_FOUND, True)),
        (404, "RepoNotFound", "Repository not found", (REPO_NOT_FOUND, True)),
        (401, "GatedRepo", "Access to model org/model is restricted.", (GATED_REPO, True)),
        (403, "GatedRepo", "Access to model org/model is restricted.", (GATED_REPO, True)),
        (404, "RevisionNotFound", "Invalid rev id: nope", (REVISION_NOT_FOUND, True)),
        (401, None, "Invalid credentials in Authorization header", (UNAUTHORIZED, True)),
        (403, None, "Forbidden", (UNAUTHORIZED, True)),
        (429, None, "rate limited", ("rate_limited", False)),
        (500, None, None, ("server_error", False)),
        (502, None, None, ("server_error", False)),
        (503, None, None, ("server_error", False)),
        (504, None, None, ("server_error", False)),
        (400, None, "bad", ("http_error", False)),
        (404, None, None, ("http_error", False)),
        (404, "EntryNotFound", "Entry not found", ("http_error", False)),
        (403, None, "Access to this resource is disabled.", ("http_error", False)),
    ],
)
def test_hub_http_answers(status: int, code: str | None, message: str | None, expected: tuple[str, bool]) -> None:
    assert classify_hub_error(hub_error(status, code, message)) == expected


def test_an_anonymous_401_on_a_plain_http_endpoint_without_code_is_unauthorized() -> None:
    # huggingface_hub only reads a bare 401 as "repo not found" on https endpoints.
    assert classify_hub_error(hub_error(401, url="http://127.0.0.1:9/api/models/org/model")) == (UNAUTHORIZED, True)


def _connect_error(text: str, cause: BaseException | None = None) -> httpx2.ConnectError:
    error = httpx2.ConnectError(text)
    error.__cause__ = cause
    return error


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (httpx2.ConnectTimeout("timed out"), ("timeout", False)),
        (httpx2.ReadTimeout("timed out"), ("timeout", False)),
        (httpx2.PoolTimeout("timed out"), ("timeout", False)),
        (_connect_error("[Errno -2] Name or service not known"), ("dns", False)),
        (_connect_error("[Errno -3] Temporary failure in name resolution"), ("dns", False)),
        (
            _connect_error("handshake failed", ssl.SSLCertVerificationError(1, "CERTIFICATE_VERIFY_FAILED")),
            ("tls", False),
        ),
        (_connect_error("[Errno 111] Connection refused"), ("connection", False)),
        (httpx2.RemoteProtocolError("Server disconnected"), ("network", False)),
        (httpx2.ReadError("reset"), ("network", False)),
        (ssl.SSLError("wrong version number"), ("tls", False)),
        (OfflineModeIsEnabled("offline"), ("offline", False)),
        (ConnectionResetError(), ("network", False)),
        (HFValidationError("Repo id must be in the form 'repo_name' or 'namespace/repo_name'"), (REPO_NOT_FOUND, True)),
        (ValueError("unexpected"), ("unexpected", False)),
        (KeyError("id"), ("unexpected", False)),
    ],
)
def test_transport_and_other_errors(exc: BaseException, expected: tuple[str, bool]) -> None:
    assert classify_hub_error(exc) == expected


# --------------------------------------------------------------------------- messages


def test_messages_are_the_shared_sentences_naming_the_variable() -> None:
    tok = Target("org/tok", "t1", "TOKENIZER_NAME", "TOKENIZER_REVISION")
    assert failure_message(REPO_NOT_FOUND, tok, False) == repo_not_found_message("org/tok", "TOKENIZER_NAME")
    assert failure_message(GATED_REPO, tok, True) == gated_repo_message(
        "org/tok", "TOKENIZER_NAME", token_set=True
    )
    assert failure_message(REVISION_NOT_FOUND, tok, False) == revision_not_found_message(
        "org/tok", "t1", "TOKENIZER_REVISION"
    )
    assert failure_message(UNAUTHORIZED, Target("org/m", None), True) == unauthorized_message(
        "org/m", "MODEL_NAME", token_set=True
    )


def test_a_missing_revision_nobody_asked_for_has_no_message() -> None:
    assert failure_message(REVISION_NOT_FOUND, Target("org/m", None), False) is None
    assert failure_message("server_error", Target("org/m", None), False) is None


# --- a model given as a path that is not there -----------------------------------------------


def test_missing_local_path_is_answered_with_the_post_crash_sentence() -> None:
    from vllm_worker.model import preflight

    # What the real CPU engine printed for this path (tests/support/real_texts/README.md).
    real = (Path(__file__).parents[1] / "support" / "real_texts" / "missing_local_path.txt").read_text()
    env = {"MODEL_NAME": "/nonexistent/path", "HF_HUB_OFFLINE": "1"}
    result = preflight.run(LaunchProfile.parse(env))
    after_crash = startup_errors.diagnose(Failure.of(real, env["MODEL_NAME"], env=env))
    assert (result.ok, result.kind) == (False, "model_path_missing")
    assert after_crash is not None and after_crash.kind == "model_path_missing"
    assert result.message == after_crash.message


def test_existing_local_path_and_hub_ids_are_not_missing(tmp_path: Path) -> None:
    from vllm_worker.model import preflight

    assert preflight.missing_local_path(LaunchProfile.parse({"MODEL_NAME": str(tmp_path)})) is None
    assert preflight.missing_local_path(LaunchProfile.parse({"MODEL_NAME": "org/model"})) is None
    assert preflight.missing_local_path(LaunchProfile.parse({"BAKED_MODEL_PATH": str(tmp_path), "MODEL_NAME": "/nope"})) is None
    assert preflight.missing_local_path(LaunchProfile.parse({"BAKED_MODEL_PATH": "/no/such/dir"})) == ("BAKED_MODEL_PATH", "/no/such/dir")
