"""The pre-flight with the real huggingface_hub client against a Hub stand-in on 127.0.0.1.

The stand-in answers with the Hub's status codes and X-Error-Code headers; the env
mapping given to `preflight.run` carries HF_ENDPOINT, exactly as the worker's
environment would.
"""

from __future__ import annotations

import logging
import socket
from typing import Iterator

import pytest

from tests.support.hub_stub import HubStub, StubRepo
from vllm_worker.config.profile import LaunchProfile
from vllm_worker.model import preflight

TOKEN_WITH_ACCESS = "hf_withaccess0123456789"
TOKEN_WITHOUT_ACCESS = "hf_noaccess0123456789"
SECRETS = (TOKEN_WITH_ACCESS, TOKEN_WITHOUT_ACCESS, "hf_unknown0123456789")
FAST = 0.5  # seconds per call for the hang cases


@pytest.fixture
def hub() -> Iterator[HubStub]:
    with HubStub(tokens=[TOKEN_WITHOUT_ACCESS]) as stub:
        stub.add_repo(
            "org/public",
            files={"config.json": "{}", "model.safetensors": b"\0" * 64},
            branches=("main", "v1"),
            safetensors={"parameters": {"BF16": 494032768}, "total": 494032768},
        )
        stub.add_repo("org/tokenizer", files={"tokenizer.json": "{}"})
        stub.add_repo("org/gated", files={"config.json": "{}"}, gated="manual", authorized_tokens=[TOKEN_WITH_ACCESS])
        stub.add_repo("org/private", files={"config.json": "{}"}, private=True, authorized_tokens=[TOKEN_WITH_ACCESS])
        yield stub


def env_for(hub: HubStub, **values: str) -> dict[str, str]:
    return {"HF_ENDPOINT": hub.endpoint, **values}


def assert_no_secret(result: preflight.PreflightResult, caplog: pytest.LogCaptureFixture) -> None:
    texts = [result.message or "", *result.warnings, caplog.text]
    for secret in SECRETS:
        assert all(secret not in text for text in texts)


# --------------------------------------------------------------------------- definitive answers


def test_valid_public_model_passes_with_one_metadata_call(hub: HubStub) -> None:
    result = preflight.run(LaunchProfile.parse(env_for(hub, MODEL_NAME="org/public")))
    assert (result.ok, result.message, result.kind, result.warnings) == (True, None, None, [])
    assert result.skipped_reason is None
    assert [(r.method, r.path) for r in hub.requests] == [("GET", "/api/models/org/public")]
    assert hub.requests[0].token is None  # no implicit token from a token file
    summary = result.model_info_summary
    assert summary is not None
    assert (summary.repo, summary.gated, summary.private) == ("org/public", False, False)
    assert summary.sha == hub.repo("org/public").sha


def test_revision_branch_and_commit_pass(hub: HubStub) -> None:
    repo: StubRepo = hub.repo("org/public")
    for revision in ("v1", repo.revisions["v1"]):
        result = preflight.run(LaunchProfile.parse(env_for(hub, MODEL_NAME="org/public", MODEL_REVISION=revision)))
        assert result.ok and result.model_info_summary is not None
        assert result.model_info_summary.sha == repo.revisions["v1"]
    assert [r.path for r in hub.requests] == [
        "/api/models/org/public/revision/v1",
        f"/api/models/org/public/revision/{repo.revisions['v1']}",
    ]


@pytest.mark.parametrize("token", [None, TOKEN_WITHOUT_ACCESS])
def test_nonexistent_repo(hub: HubStub, token: str | None, caplog: pytest.LogCaptureFixture) -> None:
    env = env_for(hub, MODEL_NAME="org/does-not-exist")
    if token:
        env["HF_TOKEN"] = token
    result = preflight.run(LaunchProfile.parse(env))
    assert not result.ok
    assert result.kind == preflight.REPO_NOT_FOUND
    assert result.message == (
        "MODEL_NAME='org/does-not-exist' was not found on the Hugging Face Hub: check the spelling "
        "(owner/name, case-sensitive); if the repository is private, set HF_TOKEN to a token of an "
        "account that can read it."
    )
    assert [r.status for r in hub.requests] == [404 if token else 401]
    assert_no_secret(result, caplog)


def test_malformed_repo_id_is_not_found_without_a_call(hub: HubStub) -> None:
    result = preflight.run(LaunchProfile.parse(env_for(hub, MODEL_NAME="org/with space")))
    assert (result.ok, result.kind) == (False, preflight.REPO_NOT_FOUND)
    assert result.message == (
        "MODEL_NAME='org/with space' was not found on the Hugging Face Hub: check the spelling "
        "(owner/name, case-sensitive); if the repository is private, set HF_TOKEN to a token of an "
        "account that can read it."
    )
    assert hub.requests == []


def test_gated_without_token(hub: HubStub) -> None:
    result = preflight.run(LaunchProfile.parse(env_for(hub, MODEL_NAME="org/gated")))
    assert (result.ok, result.kind) == (False, preflight.GATED_REPO)
    assert result.message == (
        "MODEL_NAME='org/gated' is a gated repository and HF_TOKEN is not set: accept the model's terms "
        "at https://huggingface.co/org/gated and set HF_TOKEN to a read token of that account."
    )
    assert [r.path for r in hub.requests] == ["/api/models/org/gated"]


def test_gated_with_a_token_that_has_access(hub: HubStub, caplog: pytest.LogCaptureFixture) -> None:
    result = preflight.run(LaunchProfile.parse(env_for(hub, MODEL_NAME="org/gated", HF_TOKEN=TOKEN_WITH_ACCESS)))
    assert (result.ok, result.message, result.warnings) == (True, None, [])
    assert [(r.path, r.token, r.status) for r in hub.requests] == [
        ("/api/models/org/gated", TOKEN_WITH_ACCESS, 200),
        ("/api/models/org/gated/auth-check", TOKEN_WITH_ACCESS, 200),
    ]
    assert result.model_info_summary is not None and result.model_info_summary.gated == "manual"
    assert_no_secret(result, caplog)


def test_gated_with_a_token_without_access(hub: HubStub, caplog: pytest.LogCaptureFixture) -> None:
    result = preflight.run(LaunchProfile.parse(env_for(hub, MODEL_NAME="org/gated", HF_TOKEN=TOKEN_WITHOUT_ACCESS)))
    assert (result.ok, result.kind) == (False, preflight.GATED_REPO)
    assert result.message == (
        "MODEL_NAME='org/gated' is a gated repository and the account of HF_TOKEN has not been granted "
        "access: accept the model's terms at https://huggingface.co/org/gated with that account (approval "
        "can take a while), or use a token of an account that has access."
    )
    assert [r.status for r in hub.calls("/api/models/org/gated/auth-check")] == [403]
    assert_no_secret(result, caplog)


def test_legacy_token_variable_is_honoured(hub: HubStub) -> None:
    result = preflight.run(LaunchProfile.parse(env_for(hub, MODEL_NAME="org/gated", HUGGING_FACE_HUB_TOKEN=TOKEN_WITH_ACCESS)))
    assert result.ok
    assert {r.token for r in hub.requests} == {TOKEN_WITH_ACCESS}


def test_private_repo_without_token_reads_as_not_found(hub: HubStub) -> None:
    result = preflight.run(LaunchProfile.parse(env_for(hub, MODEL_NAME="org/private")))
    assert (result.ok, result.kind) == (False, preflight.REPO_NOT_FOUND)
    assert result.message == (
        "MODEL_NAME='org/private' was not found on the Hugging Face Hub: check the spelling (owner/name, "
        "case-sensitive); if the repository is private, set HF_TOKEN to a token of an account that can "
        "read it."
    )
    assert [r.status for r in hub.requests] == [401]


def test_private_repo_with_a_token_that_can_read_it(hub: HubStub) -> None:
    result = preflight.run(LaunchProfile.parse(env_for(hub, MODEL_NAME="org/private", HF_TOKEN=TOKEN_WITH_ACCESS)))
    assert result.ok and result.model_info_summary is not None and result.model_info_summary.private is True
    assert len(hub.requests) == 1


def test_rejected_token(hub: HubStub, caplog: pytest.LogCaptureFixture) -> None:
    result = preflight.run(LaunchProfile.parse(env_for(hub, MODEL_NAME="org/public", HF_TOKEN="hf_unknown0123456789")))
    assert (result.ok, result.kind) == (False, preflight.UNAUTHORIZED)
    assert result.message == (
        "The Hugging Face Hub rejected HF_TOKEN while fetching MODEL_NAME='org/public': the token is "
        "invalid, expired or revoked; set HF_TOKEN to a valid read token."
    )
    assert_no_secret(result, caplog)


def test_bad_model_revision(hub: HubStub) -> None:
    result = preflight.run(LaunchProfile.parse(env_for(hub, MODEL_NAME="org/public", MODEL_REVISION="no-such-rev")))
    assert (result.ok, result.kind) == (False, preflight.REVISION_NOT_FOUND)
    assert result.message == (
        "MODEL_REVISION='no-such-rev' does not exist in 'org/public': set it to an existing branch, tag "
        "or commit of that repository, or unset it to use the default branch."
    )
    assert [r.path for r in hub.requests] == ["/api/models/org/public/revision/no-such-rev"]


def test_bad_tokenizer_name(hub: HubStub) -> None:
    result = preflight.run(LaunchProfile.parse(env_for(hub, MODEL_NAME="org/public", TOKENIZER_NAME="org/no-tokenizer")))
    assert (result.ok, result.kind) == (False, preflight.REPO_NOT_FOUND)
    assert result.message == (
        "TOKENIZER_NAME='org/no-tokenizer' was not found on the Hugging Face Hub: check the spelling "
        "(owner/name, case-sensitive); if the repository is private, set HF_TOKEN to a token of an "
        "account that can read it."
    )
    assert [r.path for r in hub.requests] == ["/api/models/org/public", "/api/models/org/no-tokenizer"]


def test_bad_tokenizer_revision(hub: HubStub) -> None:
    env = env_for(hub, MODEL_NAME="org/public", TOKENIZER_NAME="org/tokenizer", TOKENIZER_REVISION="nope")
    result = preflight.run(LaunchProfile.parse(env))
    assert (result.ok, result.kind) == (False, preflight.REVISION_NOT_FOUND)
    assert result.message == (
        "TOKENIZER_REVISION='nope' does not exist in 'org/tokenizer': set it to an existing branch, tag "
        "or commit of that repository, or unset it to use the default branch."
    )
    assert "TOKENIZER_REVISION" in result.message


def test_good_tokenizer_is_checked_too(hub: HubStub) -> None:
    result = preflight.run(LaunchProfile.parse(env_for(hub, MODEL_NAME="org/public", MODEL_REVISION="v1", TOKENIZER_NAME="org/public")))
    assert result.ok and len(hub.requests) == 1  # same repo and revision: one call
    hub.reset_requests()
    result = preflight.run(LaunchProfile.parse(env_for(hub, MODEL_NAME="org/public", TOKENIZER_NAME="org/tokenizer")))
    assert result.ok
    assert [r.path for r in hub.requests] == ["/api/models/org/public", "/api/models/org/tokenizer"]


def test_expand_hook_brings_safetensors_counts(hub: HubStub) -> None:
    result = preflight.run(LaunchProfile.parse(env_for(hub, MODEL_NAME="org/public")), expand=["safetensors"])
    summary = result.model_info_summary
    assert result.ok and summary is not None
    assert (summary.safetensors_total, summary.safetensors_parameters) == (494032768, {"BF16": 494032768})
    assert summary.gated is False and summary.sha == hub.repo("org/public").sha
    assert sorted(hub.requests[0].query["expand"]) == ["gated", "private", "safetensors", "sha"]


# --------------------------------------------------------------------------- transient answers


@pytest.mark.parametrize(("status", "kind"), [(429, "rate_limited"), (500, "server_error"), (503, "server_error")])
def test_transient_status_is_a_warning_and_no_retry(
    hub: HubStub, status: int, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    hub.fail(status, times=None)
    env = env_for(hub, MODEL_NAME="org/gated", TOKENIZER_NAME="org/tokenizer", HF_TOKEN=TOKEN_WITH_ACCESS)
    with caplog.at_level(logging.WARNING, logger="vllm_worker.model.preflight"):
        result = preflight.run(LaunchProfile.parse(env))
    assert (result.ok, result.message, result.kind) == (True, None, None)
    assert len(result.warnings) == 1 and kind in result.warnings[0] and "org/gated" in result.warnings[0]
    assert result.warnings[0] in caplog.text
    assert [r.status for r in hub.requests] == [status]  # no retry, no tokenizer call after it
    assert_no_secret(result, caplog)


def test_transient_failure_of_auth_check_is_a_warning(hub: HubStub) -> None:
    hub.fail(502, path_prefix="/api/models/org/gated/auth-check")
    result = preflight.run(LaunchProfile.parse(env_for(hub, MODEL_NAME="org/gated", HF_TOKEN=TOKEN_WITHOUT_ACCESS)))
    assert result.ok and "server_error" in result.warnings[0]


def test_hanging_hub_times_out_into_a_warning(hub: HubStub) -> None:
    hub.hang(times=None)
    result = preflight.run(LaunchProfile.parse(env_for(hub, MODEL_NAME="org/public")), timeout=FAST)
    assert result.ok and len(result.warnings) == 1 and "timeout" in result.warnings[0]
    assert len(hub.requests) == 1


def test_hanging_auth_check_is_bounded_too(hub: HubStub) -> None:
    hub.hang(path_prefix="/api/models/org/gated/auth-check")
    result = preflight.run(LaunchProfile.parse(env_for(hub, MODEL_NAME="org/gated", HF_TOKEN=TOKEN_WITH_ACCESS)), timeout=FAST)
    assert result.ok and "timeout" in result.warnings[0]


def test_unresolvable_endpoint_is_a_warning() -> None:
    result = preflight.run(LaunchProfile.parse({"HF_ENDPOINT": "http://nonexistent.invalid", "MODEL_NAME": "org/public"}), timeout=FAST)
    assert result.ok and len(result.warnings) == 1 and "dns" in result.warnings[0]


def test_refused_connection_is_a_warning() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: connections are refused
        result = preflight.run(LaunchProfile.parse({"HF_ENDPOINT": f"http://127.0.0.1:{port}", "MODEL_NAME": "org/public"}), timeout=FAST)
    assert result.ok and "connection" in result.warnings[0]


# --------------------------------------------------------------------------- skips


@pytest.mark.parametrize(
    "extra",
    [
        {"BAKED_MODEL_PATH": "{tmp}/models/baked"},
        {"HF_HUB_OFFLINE": "1"},
        {"TRANSFORMERS_OFFLINE": "1"},
        {"VLLM_USE_MODELSCOPE": "true"},
        {"VLLM_CONFIG_FILE": "/config/vllm.yaml"},
        {"MODEL_CONFIG": "/config/model.yaml"},
        {"VLLM_EXTRA_ARGS": "--config /config/vllm.yaml"},
        {"MODEL_NAME": "{tmp}/runpod-volume/models/llama"},
        {"MODEL_NAME": "./llama"},
        {"MODEL_NAME": "s3://bucket/llama"},
        {"MODEL_NAME": "https://example.com/llama"},
    ],
)
def test_skips_make_no_call(hub: HubStub, extra: dict[str, str], tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # Local paths exist (a missing one is a definitive failure of its own, tested below).
    monkeypatch.chdir(tmp_path)
    extra = {key: value.replace("{tmp}", str(tmp_path)) for key, value in extra.items()}
    for key in ("BAKED_MODEL_PATH", "MODEL_NAME"):
        if extra.get(key, "").startswith(("/", "./")):
            (tmp_path / extra[key]).mkdir(parents=True)
    env = env_for(hub, MODEL_NAME="org/does-not-exist", HF_TOKEN=TOKEN_WITH_ACCESS)
    env.update(extra)
    result = preflight.run(LaunchProfile.parse(env))
    assert result.ok and result.skipped_reason is not None and result.message is None
    assert hub.requests == []


@pytest.mark.parametrize("extra", [{"MODEL_NAME": "/no/such/model"}, {"BAKED_MODEL_PATH": "/no/such/baked"}])
def test_a_missing_local_path_is_answered_without_a_call(hub: HubStub, extra: dict[str, str]) -> None:
    env = env_for(hub, MODEL_NAME="org/public", HF_TOKEN=TOKEN_WITH_ACCESS)
    env.update(extra)
    result = preflight.run(LaunchProfile.parse(env))
    assert (result.ok, result.kind) == (False, "model_path_missing")
    [(variable, path)] = extra.items()
    assert result.message is not None and f"{variable}={path!r} does not exist" in result.message
    assert hub.requests == []


def test_no_implicit_token_from_a_token_file(hub: HubStub, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from huggingface_hub import constants
    from huggingface_hub.utils import get_token

    token_file = tmp_path / "token"
    token_file.write_text(TOKEN_WITH_ACCESS)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(token_file))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    assert get_token() == TOKEN_WITH_ACCESS  # the client would pick it up by default
    result = preflight.run(LaunchProfile.parse(env_for(hub, MODEL_NAME="org/gated")))
    assert (result.ok, result.kind) == (False, preflight.GATED_REPO)
    assert [r.token for r in hub.requests] == [None]


def test_stand_in_serves_what_snapshot_download_needs(hub: HubStub, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # The stand-in is shared with the image-build download tests; keep it honest here.
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError

    hub.add_repo("org/tiny", files={"config.json": '{"a": 1}', "weights/model.safetensors": b"\x01" * 300})
    path = snapshot_download("org/tiny", endpoint=hub.endpoint, local_dir=tmp_path / "tiny", token=False)
    assert (tmp_path / "tiny" / "config.json").read_text() == '{"a": 1}'
    assert (tmp_path / "tiny" / "weights" / "model.safetensors").read_bytes() == b"\x01" * 300
    assert str(path) == str((tmp_path / "tiny").resolve())
    downloads = hub.calls("/org/tiny/resolve/", method="GET")
    assert sorted(r.path.rsplit("/", 1)[-1] for r in downloads) == ["config.json", "model.safetensors"]

    snapshot_download("org/gated", endpoint=hub.endpoint, local_dir=tmp_path / "g", token=TOKEN_WITH_ACCESS)
    assert (tmp_path / "g" / "config.json").read_text() == "{}"
    with pytest.raises(GatedRepoError):
        snapshot_download("org/gated", endpoint=hub.endpoint, local_dir=tmp_path / "g2", token=False)
