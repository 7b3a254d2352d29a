"""What the engine will fetch and how fast (model.hub_rate), asked of a Hub stand-in on 127.0.0.1 through huggingface_hub."""

from __future__ import annotations

import logging

import pytest

from tests.support.engine_env import free_port
from tests.support.hub_stub import HubStub
from vllm_worker.model import hub_rate

REPO = "acme/big"
SHARD = 24 << 20


@pytest.fixture
def hub() -> HubStub:
    with HubStub(tokens=["hf_reader_token_123"]) as stub:
        stub.add_repo(
            REPO,
            files={
                "config.json": "{}",
                "tokenizer.json": "{}",
                "model-00001-of-00002.safetensors": b"a" * SHARD,
                "model-00002-of-00002.safetensors": b"b" * (SHARD // 2),
                "pytorch_model.bin": b"c" * 1000,
                "original/consolidated.pth": b"d" * 5000,
                "README.md": "# big",
            },
        )
        yield stub


def test_the_files_vllm_fetches_are_one_weights_format_and_the_small_files_beside_it(hub: HubStub) -> None:
    listed = hub_rate.list_files(hub.endpoint, REPO, None, None)
    assert listed is not None and listed["original/consolidated.pth"] == 5000
    fetched = hub_rate.fetched_files(listed)
    assert fetched == {
        "config.json": 2, "tokenizer.json": 2,
        "model-00001-of-00002.safetensors": SHARD, "model-00002-of-00002.safetensors": SHARD // 2,
    }  # fmt: skip
    assert hub_rate.largest_weights(fetched) == "model-00001-of-00002.safetensors"
    assert hub_rate.fetched_files({"pytorch_model.bin": 9, "config.json": 1, "a/b.safetensors": 3}) == {
        "config.json": 1, "pytorch_model.bin": 9,
    }  # fmt: skip
    assert hub_rate.largest_weights({"config.json": 5}) is None


@pytest.mark.parametrize("rate", [2e6, 6e6])
def test_a_read_of_the_largest_file_gives_the_links_rate(hub: HubStub, rate: float) -> None:
    hub.slow_downloads(rate)
    measured = hub_rate.probe_rate(hub.endpoint, REPO, None, "model-00001-of-00002.safetensors", None, SHARD)
    assert measured is not None and measured == pytest.approx(rate, rel=0.25)
    [read] = hub.calls("/acme/big/resolve/")
    assert read.status == 206  # a range of the file (a few MB), never the whole of it


def test_a_private_repository_is_read_with_the_token_and_the_token_is_never_logged(
    hub: HubStub, caplog: pytest.LogCaptureFixture
) -> None:
    hub.add_repo("acme/private", files={"model.safetensors": b"p" * (1 << 20)}, private=True, authorized_tokens={"hf_reader_token_123"})
    with caplog.at_level(logging.INFO, logger="vllm_worker"):
        assert hub_rate.list_files(hub.endpoint, "acme/private", None, None) is None  # invisible without it
        assert hub_rate.probe_rate(hub.endpoint, "acme/private", None, "model.safetensors", None, 1 << 20) is None
        listed = hub_rate.list_files(hub.endpoint, "acme/private", None, "hf_reader_token_123")
        rate = hub_rate.probe_rate(hub.endpoint, "acme/private", None, "model.safetensors", "hf_reader_token_123", 1 << 20)
    assert listed == {"model.safetensors": 1 << 20} and rate is not None and rate > 0
    assert "hf_reader_token_123" not in caplog.text
    assert "did not list acme/private's files" in caplog.text


def test_a_hub_that_does_not_answer_gives_no_figure_and_no_error() -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    assert hub_rate.list_files(endpoint, REPO, None, None) is None
    assert hub_rate.probe_rate(endpoint, REPO, None, "model.safetensors", None, 10) is None


def test_a_file_the_revision_does_not_hold_gives_no_rate(hub: HubStub) -> None:
    assert hub_rate.probe_rate(hub.endpoint, REPO, None, "missing.safetensors", None, 10) is None
