"""Finding a model already on disk, in a cache laid out by the real huggingface_hub.

Runpod's model cache and a network volume shared with the official worker are Hugging Face
hub caches. The layouts here are made by `huggingface_hub.snapshot_download` itself, against
the Hub stand-in, so what `model_cache` reads is what the client writes: refs, snapshots of
links into blobs, and a download cut short.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest
from huggingface_hub import snapshot_download

from tests.support.hub_stub import HubStub
from vllm_worker.config.profile import LaunchProfile
from vllm_worker.model import cache as model_cache

pytestmark = pytest.mark.integration

INDEX = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
FILES = {
    "config.json": json.dumps({"model_type": "llama"}),
    "tokenizer.json": "{}",
    "model.safetensors.index.json": json.dumps(INDEX),
    "model-00001-of-00002.safetensors": b"\x01" * 64,
    "model-00002-of-00002.safetensors": b"\x02" * 64,
}


@pytest.fixture
def hub() -> Iterator[HubStub]:
    with HubStub() as stub:
        stub.add_repo("org/model", files=FILES, branches=("main", "v2"))
        stub.add_repo("org/tokenizer", files={"tokenizer.json": "{}", "config.json": "{}"})
        yield stub


def download(hub: HubStub, root: Path, repo: str, revision: str | None = None) -> Path:
    return Path(snapshot_download(repo, revision=revision, cache_dir=root, endpoint=hub.endpoint))


def env_for(root: Path, **extra: str) -> dict[str, str]:
    return {"RUNPOD_MODEL_CACHE": str(root), "HF_HUB_CACHE": str(root / "unused"), "MODEL_NAME": "org/model", **extra}


def test_a_complete_snapshot_is_found_and_served_offline(hub: HubStub, tmp_path: Path) -> None:
    snapshot = download(hub, tmp_path, "org/model")
    found = model_cache.lookup(LaunchProfile.parse(env_for(tmp_path)))
    assert found is not None
    assert (found.snapshot, found.root, found.source) == (snapshot, tmp_path, "Runpod model cache")
    assert found.commit == snapshot.name
    served = model_cache.offline_env(env_for(tmp_path), found)
    assert served["HF_HUB_OFFLINE"] == "1" and served["HF_HUB_CACHE"] == str(tmp_path)


def test_a_revision_is_found_by_branch_and_by_commit(hub: HubStub, tmp_path: Path) -> None:
    snapshot = download(hub, tmp_path, "org/model", revision="v2")
    assert model_cache.lookup(LaunchProfile.parse(env_for(tmp_path, MODEL_REVISION="v2"))).snapshot == snapshot  # type: ignore[union-attr]
    assert model_cache.lookup(LaunchProfile.parse(env_for(tmp_path, MODEL_REVISION=snapshot.name))).snapshot == snapshot  # type: ignore[union-attr]
    # main was never downloaded here.
    assert model_cache.lookup(LaunchProfile.parse(env_for(tmp_path))) is None


def test_the_hf_hub_cache_is_searched_after_runpods(hub: HubStub, tmp_path: Path) -> None:
    own = tmp_path / "own"
    snapshot = download(hub, own, "org/model")
    found = model_cache.lookup(LaunchProfile.parse({"RUNPOD_MODEL_CACHE": str(tmp_path / "none"), "HF_HUB_CACHE": str(own), "MODEL_NAME": "org/model"}))
    assert found is not None and (found.snapshot, found.source) == (snapshot, "HF_HUB_CACHE")


def test_a_download_cut_short_is_not_trusted(hub: HubStub, tmp_path: Path) -> None:
    snapshot = download(hub, tmp_path, "org/model")
    (snapshot / "model-00002-of-00002.safetensors").resolve().unlink()  # the blob is gone, the link dangles
    assert model_cache.lookup(LaunchProfile.parse(env_for(tmp_path))) is None


def test_a_missing_shard_is_not_trusted(hub: HubStub, tmp_path: Path) -> None:
    snapshot = download(hub, tmp_path, "org/model")
    (snapshot / "model-00001-of-00002.safetensors").unlink()
    assert model_cache.lookup(LaunchProfile.parse(env_for(tmp_path))) is None


def test_a_separate_tokenizer_must_be_cached_too(hub: HubStub, tmp_path: Path) -> None:
    download(hub, tmp_path, "org/model")
    assert model_cache.lookup(LaunchProfile.parse(env_for(tmp_path, TOKENIZER_NAME="org/tokenizer"))) is None
    download(hub, tmp_path, "org/tokenizer")
    assert model_cache.lookup(LaunchProfile.parse(env_for(tmp_path, TOKENIZER_NAME="org/tokenizer"))) is not None


def test_local_paths_and_baked_models_are_not_looked_up(hub: HubStub, tmp_path: Path) -> None:
    download(hub, tmp_path, "org/model")
    assert model_cache.lookup(LaunchProfile.parse(env_for(tmp_path, MODEL_NAME=str(tmp_path)))) is None
    assert model_cache.lookup(LaunchProfile.parse(env_for(tmp_path, BAKED_MODEL_PATH="/models/model"))) is None


def test_the_default_roots_are_runpods_then_hf_home(tmp_path: Path) -> None:
    roots = model_cache.cache_roots(LaunchProfile.parse({"HF_HOME": str(tmp_path / "hf")}))
    assert roots == [
        ("Runpod model cache", Path("/runpod-volume/huggingface-cache/hub")),
        ("HF_HUB_CACHE", tmp_path / "hf" / "hub"),
    ]


# --- a folder stored under another case (Runpod's model cache may lower-case `Org/Name`: worker-vllm#310)


def test_a_lower_cased_folder_is_found_and_read_offline_under_the_requested_name(hub: HubStub, tmp_path: Path) -> None:
    root = tmp_path / "cache"
    snapshot = download(hub, root, "org/model")  # stored as models--org--model
    env = env_for(root, MODEL_NAME="Org/Model")

    found = model_cache.lookup(LaunchProfile.parse(env))
    assert found is not None
    assert (found.repo, found.snapshot, found.commit) == ("Org/Model", snapshot, snapshot.name)
    assert found.renamed == (("models--Org--Model", root / "models--org--model"),)
    assert "models--org--model differs from models--Org--Model only in case" in found.log_line()

    served = model_cache.offline_env(env, found, view_parent=tmp_path)
    view = Path(served["HF_HUB_CACHE"])
    assert served["HF_HUB_OFFLINE"] == "1" and view.parent == tmp_path and view != root
    # The real huggingface_hub, offline, finds the model under the name the user asked for.
    resolved = Path(snapshot_download("Org/Model", cache_dir=view, local_files_only=True))
    assert resolved == view / "models--Org--Model" / "snapshots" / snapshot.name
    assert json.loads((resolved / "config.json").read_text()) == {"model_type": "llama"}
    # The cache itself is untouched: still one folder, lower-cased.
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("models--")) == ["models--org--model"]


def test_the_exact_case_folder_wins_and_needs_no_view(hub: HubStub, tmp_path: Path) -> None:
    snapshot = download(hub, tmp_path, "org/model")
    found = model_cache.lookup(LaunchProfile.parse(env_for(tmp_path)))
    assert found is not None and found.renamed == () and found.snapshot == snapshot
    assert model_cache.offline_env(env_for(tmp_path), found)["HF_HUB_CACHE"] == str(tmp_path)


def test_a_lower_cased_tokenizer_folder_is_shown_under_its_name_too(hub: HubStub, tmp_path: Path) -> None:
    root = tmp_path / "cache"
    download(hub, root, "org/model")
    download(hub, root, "org/tokenizer")
    found = model_cache.lookup(LaunchProfile.parse(env_for(root, MODEL_NAME="Org/Model", TOKENIZER_NAME="Org/Tokenizer")))
    assert found is not None
    assert [exact for exact, _ in found.renamed] == ["models--Org--Model", "models--Org--Tokenizer"]
    view = Path(model_cache.offline_env(env_for(root), found, view_parent=tmp_path)["HF_HUB_CACHE"])
    assert Path(snapshot_download("Org/Tokenizer", cache_dir=view, local_files_only=True)).joinpath("tokenizer.json").is_file()
