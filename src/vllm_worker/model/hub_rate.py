"""What the engine will download and how fast, asked before it launches: the repository's files, one short read.

The start's prediction (engine.start_forecast) needs the bytes vLLM will fetch and the rate of the link,
before the download, so a start that will pass the platform's limit is said at once rather than after
it was cut. The files come from the Hub's tree of the revision the pre-flight resolved (one call: names
and sizes); the rate from one ranged read of the first PROBE_BYTES of the largest weights file, timed from
its first byte to its last, so the round trip and a redirect do not count as slowness. Both are bounded by
a timeout and neither stops a start: a failure gives None, and the prediction waits for the download's own
rate. The token is sent as vLLM sends it and never logged.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Mapping

log = logging.getLogger("vllm_worker")

PROBE_BYTES = 8 * 2**20
PROBE_TIMEOUT_S = 10.0  # to the first byte
PROBE_READ_S = 3.0  # of reading at most: on a slow link what came in that long times it well enough
# What vLLM fetches of a repository (model_executor/model_loader/weight_utils.py: the first weights format
# found, safetensors first), beside the small files it reads (config, tokenizer, generation config).
_WEIGHT_FORMATS = (".safetensors", ".bin", ".pt")
_SMALL = (".json", ".txt", ".model", ".tiktoken", ".jinja")


def fetched_files(sizes: Mapping[str, int]) -> dict[str, int]:
    """The files vLLM downloads of a repository of these files: one weights format (safetensors where there are
    any), and the small files beside them (top level only, as vLLM's allow patterns)."""
    top = {name: size for name, size in sizes.items() if "/" not in name}
    weights: dict[str, int] = {}
    for suffix in _WEIGHT_FORMATS:
        weights = {name: size for name, size in top.items() if name.endswith(suffix)}
        if weights:
            break
    small = {name: size for name, size in top.items() if name.endswith(_SMALL)}
    return {**small, **weights}


def largest_weights(files: Mapping[str, int]) -> str | None:
    weights = [name for name in files if name.endswith(_WEIGHT_FORMATS)]
    return max(weights, key=lambda name: (files[name], name)) if weights else None


def list_files(endpoint: str, repo: str, revision: str | None, token: str | None) -> dict[str, int] | None:
    """The repository's files and their sizes at `revision`; None when the Hub does not say."""
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    try:
        api = HfApi(endpoint=endpoint, token=token or False, library_name="vllm-worker")
        entries = api.list_repo_tree(repo, revision=revision, recursive=True, token=token or False)
        return {entry.path: int(entry.size) for entry in entries if isinstance(entry, RepoFile)}
    except Exception as error:  # noqa: BLE001 - a prediction's input, never a reason to stop a start
        log.info("start forecast: the Hub did not list %s's files (%s)", repo, type(error).__name__)
        return None


def probe_rate(
    endpoint: str,
    repo: str,
    revision: str | None,
    filename: str,
    token: str | None,
    size: int,
    timeout: float = PROBE_TIMEOUT_S,
    clock: Callable[[], float] = time.monotonic,
) -> float | None:
    """Bytes a second of one ranged read of `filename`'s first PROBE_BYTES (or all of a smaller file, or what came
    in PROBE_READ_S), from its first byte to its last; None when the read fails or is too short to time."""
    from huggingface_hub import get_session, hf_hub_url

    wanted = max(1, min(PROBE_BYTES, size))
    headers = {"Range": f"bytes=0-{wanted - 1}"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    url = hf_hub_url(repo, filename, revision=revision or "main", endpoint=endpoint)
    got, first = 0, None
    try:
        with get_session().stream("GET", url, headers=headers, timeout=timeout, follow_redirects=True) as response:
            if response.status_code not in (200, 206):
                return None
            for chunk in response.iter_bytes(chunk_size=64 * 1024):
                now = clock()
                if first is None:
                    first = now  # the first chunk's bytes arrived with the round trip: not timed
                else:
                    got += len(chunk)
                if got + 64 * 1024 >= wanted or now - first >= PROBE_READ_S:
                    break
            end = clock()
    except Exception as error:  # noqa: BLE001 - as above
        log.info("start forecast: a read of %s from the Hub failed (%s)", filename, type(error).__name__)
        return None
    if first is None or got <= 0 or end <= first:
        return None
    return got / (end - first)
