"""Serve a model that is already on disk instead of downloading it again.

With model caching on, Runpod puts the model in Hugging Face's cache layout under
`/runpod-volume/huggingface-cache/hub` before the worker starts, and a network volume used
by Runpod's official vLLM worker holds its downloads there too. Downloading again costs
minutes of every cold start, so before the pre-flight the worker looks for the requested
model and revision in that cache and in `HF_HUB_CACHE`; a complete snapshot is served
offline (HF_HUB_OFFLINE=1 with HF_HUB_CACHE pointed at the cache that holds it), with no
Hub round trip for it. An incomplete snapshot (a download cut short) is not trusted: the
worker then downloads as usual.

Runpod's model cache may store a repo's folder lower-cased (`models--org--name` for `Org/Name`,
runpod-workers/worker-vllm#310), which an exact-case lookup misses, and huggingface_hub, asked
for `Org/Name` offline, would miss too. The folder is found whatever its case, and the engine is
given a view of the cache (`case_view`: a folder of symlinks) where it has its exact name, so
the model is still asked for, and served, as MODEL_NAME.

Pure except for the filesystem: it reads the caches, and `offline_env` writes that view under
the system's temporary folder, never into the cache itself. It imports nothing of the worker's.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass, replace
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
    # Repo folders stored under another case than huggingface_hub looks for: (exact name, the folder).
    renamed: tuple[tuple[str, Path], ...] = ()

    def status(self) -> dict[str, str]:
        return {"source": self.source, "repo": self.repo, "commit": self.commit, "path": str(self.snapshot)}

    def log_line(self) -> str:
        at = f" at {self.revision!r}" if self.revision else ""
        case = "".join(
            f"; its folder {folder.name} differs from {exact} only in case, so the engine reads the cache "
            f"through a view that has the exact name"
            for exact, folder in self.renamed
        )
        return (
            f"serving {self.repo}{at} (commit {self.commit[:12]}) from the {self.source} at {self.snapshot}: "
            f"no download, the Hub is not asked for it (HF_HUB_OFFLINE=1){case}"
        )


def cache_roots(profile: LaunchProfile) -> list[tuple[str, Path]]:
    """The Hugging Face hub caches to look in, in order: Runpod's, then the one the engine would use."""
    roots = [("Runpod model cache", Path(profile.written(RUNPOD_CACHE_VARIABLE) or RUNPOD_CACHE))]
    hub = profile.written("HF_HUB_CACHE") or profile.written("HUGGINGFACE_HUB_CACHE")
    if not hub:
        cache_home = profile.written("XDG_CACHE_HOME") or os.path.join(profile.written("HOME") or "~", ".cache")
        hub = os.path.join(profile.written("HF_HOME") or os.path.join(cache_home, "huggingface"), "hub")
    path = Path(hub).expanduser()
    if all(path != root for _, root in roots):
        roots.append(("HF_HUB_CACHE", path))
    return roots


def _folder_name(repo: str) -> str:
    return "models--" + repo.replace("/", "--")


def _repo_folder(root: Path, repo: str) -> Path:
    """The repo's folder under `root`: its exact name, else a folder whose name differs only in case."""
    exact = root / _folder_name(repo)
    if exact.is_dir():
        return exact
    wanted = exact.name.lower()
    try:
        same = sorted(entry for entry in root.iterdir() if entry.name.lower() == wanted and entry.is_dir())
    except OSError:
        return exact
    return same[0] if same else exact


def _renamed(repo: str, folder: Path) -> tuple[tuple[str, Path], ...]:
    return () if folder.name == _folder_name(repo) else ((_folder_name(repo), folder),)


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
            return CachedModel(repo, revision, commit, snapshot, root, source, _renamed(repo, folder))
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
    roots = cache_roots(profile)
    found = find(model, profile.revision, roots)
    if found is None:
        return None
    tokenizer = profile.tokenizer
    if tokenizer and tokenizer != model and _is_repo_id(tokenizer):
        folder = _repo_folder(found.root, tokenizer)
        commit = _commit_of(folder, profile.tokenizer_revision)
        if commit is None or not (folder / "snapshots" / commit).is_dir():
            return None
        found = replace(found, renamed=found.renamed + _renamed(tokenizer, folder))
    return found


def case_view(cached: CachedModel, parent: Path | None = None) -> Path:
    """A hub cache that shows `cached.root` with its renamed repo folders under their exact names.

    A new folder (under `parent`, default the system's temporary folder) of symlinks to every entry
    of the cache, plus one per renamed folder: the cache itself may be a read-only volume.
    """
    view = Path(tempfile.mkdtemp(prefix="vllm-worker-hub-cache-", dir=parent))
    for entry in cached.root.iterdir():
        (view / entry.name).symlink_to(entry)
    for exact, folder in cached.renamed:
        (view / exact).symlink_to(folder)
    return view


def offline_env(env: Mapping[str, str], cached: CachedModel, view_parent: Path | None = None) -> dict[str, str]:
    """The configuration that serves `cached` without the Hub: offline, with the cache that holds it
    (through `case_view` when a repo folder's case differs)."""
    served = dict(env)
    served["HF_HUB_OFFLINE"] = "1"
    served["HF_HUB_CACHE"] = str(case_view(cached, view_parent) if cached.renamed else cached.root)
    return served
