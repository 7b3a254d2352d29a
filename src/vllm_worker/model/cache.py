"""Serve a model that is already on disk instead of downloading it again.

With model caching on, Runpod puts the model in Hugging Face's cache layout under
`/runpod-volume/huggingface-cache/hub` before the worker starts, and a network volume used
by Runpod's official vLLM worker holds its downloads there too. Downloading again costs
minutes of every cold start, so before the pre-flight the worker looks for the requested
model and revision in that cache and in `HF_HUB_CACHE`; a complete snapshot is served
offline (HF_HUB_OFFLINE=1 with HF_HUB_CACHE pointed at the cache that holds it), with no
Hub round trip for it. An incomplete snapshot (a download cut short) is not trusted: the
worker then downloads as usual.

Pure except for reading the filesystem; it imports nothing of the worker's.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from vllm_worker.config.profile import LaunchProfile

RUNPOD_CACHE = "/runpod-volume/huggingface-cache/hub"
# Where the Runpod cache is looked for (tests point it elsewhere).
RUNPOD_CACHE_VARIABLE = "RUNPOD_MODEL_CACHE"
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


@dataclass(frozen=True)
class CachedModel:
    """A complete snapshot of `repo` at `commit`, found under the Hugging Face cache `root`."""

    repo: str
    revision: str | None
    commit: str
    snapshot: Path
    root: Path
    source: str  # "Runpod model cache" or "HF_HUB_CACHE"

    def status(self) -> dict[str, str]:
        return {"source": self.source, "repo": self.repo, "commit": self.commit, "path": str(self.snapshot)}

    def log_line(self) -> str:
        at = f" at {self.revision!r}" if self.revision else ""
        return (
            f"serving {self.repo}{at} (commit {self.commit[:12]}) from the {self.source} at {self.snapshot}: "
            f"no download, the Hub is not asked for it (HF_HUB_OFFLINE=1)"
        )


def cache_roots(env: Mapping[str, str]) -> list[tuple[str, Path]]:
    """The Hugging Face hub caches to look in, in order: Runpod's, then the one the engine would use."""
    roots = [("Runpod model cache", Path(env.get(RUNPOD_CACHE_VARIABLE) or RUNPOD_CACHE))]
    hub = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
    if not hub:
        home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or os.path.join(env.get("HOME", "~"), ".cache"), "huggingface")
        hub = os.path.join(home, "hub")
    path = Path(hub).expanduser()
    if all(path != root for _, root in roots):
        roots.append(("HF_HUB_CACHE", path))
    return roots


def _repo_folder(root: Path, repo: str) -> Path:
    return root / ("models--" + repo.replace("/", "--"))


def _commit_of(folder: Path, revision: str | None) -> str | None:
    wanted = revision or "main"
    if _COMMIT.match(wanted):
        return wanted
    ref = folder / "refs" / wanted
    try:
        commit = ref.read_text().strip()
    except OSError:
        return None
    return commit if _COMMIT.match(commit) else None


def snapshot_complete(snapshot: Path) -> bool:
    """Whether a snapshot can be served as is: config, every linked file present, all weight shards there."""
    if not (snapshot / "config.json").is_file():
        return False
    files = [p for p in snapshot.rglob("*") if not p.is_dir()]
    # A link whose blob is missing (a download cut short) makes the snapshot unusable.
    if any(not p.exists() for p in files):
        return False
    for index_name in _INDEXES:
        index = snapshot / index_name
        if index.is_file():
            try:
                shards = set(json.loads(index.read_text())["weight_map"].values())
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                return False
            return all((snapshot / shard).is_file() for shard in shards)
    return any(p.name.endswith(_WEIGHT_SUFFIXES) for p in files)


def find(repo: str, revision: str | None, roots: list[tuple[str, Path]]) -> CachedModel | None:
    """The first complete snapshot of `repo` at `revision` in `roots`; None when none is complete."""
    for source, root in roots:
        folder = _repo_folder(root, repo)
        commit = _commit_of(folder, revision)
        if commit is None:
            continue
        snapshot = folder / "snapshots" / commit
        if snapshot_complete(snapshot):
            return CachedModel(repo, revision, commit, snapshot, root, source)
    return None


def _is_repo_id(value: str) -> bool:
    return value.count("/") == 1 and not value.startswith((".", "/", "~")) and not Path(value).exists()


def lookup(profile: LaunchProfile) -> CachedModel | None:
    """The cached snapshot to serve for this configuration, or None (download as usual).

    Only when the model, and a separate tokenizer repository if one is set, are both complete in
    the same cache: offline, a missing tokenizer could not be fetched either.
    """
    model = profile.model
    if not model or not _is_repo_id(model) or profile.baked_model_path:
        return None
    roots = cache_roots(profile.env)
    found = find(model, profile.revision, roots)
    if found is None:
        return None
    tokenizer = profile.tokenizer
    if tokenizer and tokenizer != model and _is_repo_id(tokenizer):
        folder = _repo_folder(found.root, tokenizer)
        commit = _commit_of(folder, profile.tokenizer_revision)
        if commit is None or not (folder / "snapshots" / commit).is_dir():
            return None
    return found


def offline_env(env: Mapping[str, str], cached: CachedModel) -> dict[str, str]:
    """The configuration that serves `cached` without the Hub: offline, with the cache that holds it."""
    served = dict(env)
    served["HF_HUB_OFFLINE"] = "1"
    served["HF_HUB_CACHE"] = str(cached.root)
    return served
