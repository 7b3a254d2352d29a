"""A model already in Runpod's cache is served with the Hub unreachable: no download, real engine.

The cache is laid out by the real `huggingface_hub.snapshot_download` (the tiny model served by
the Hub stand-in, downloaded into a temporary root, as Runpod's model caching does before a
worker starts); then the stand-in is closed and the worker starts with HF_ENDPOINT pointing at
a port nothing listens on. The worker must find the snapshot, serve it offline with the real
vLLM CPU engine, answer a job, and say in its log and status job which cache served it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from huggingface_hub import snapshot_download

from tests.support import engine_env
from tests.support.control_plane import ControlPlane
from tests.support.hub_stub import HubStub
from tests.support.worker_proc import WorkerProcess

pytestmark = pytest.mark.engine

REPO = "acme/tiny-llama"


def test_a_cached_model_is_served_offline_with_the_hub_unreachable(tiny_model: Path, tmp_path: Path) -> None:
    root = tmp_path / "runpod-volume" / "huggingface-cache" / "hub"
    files = {p.name: p.read_bytes() for p in tiny_model.iterdir() if p.is_file()}
    with HubStub() as hub:
        hub.add_repo(REPO, files=files)
        snapshot = Path(snapshot_download(REPO, cache_dir=root, endpoint=hub.endpoint))
    unreachable = f"http://127.0.0.1:{engine_env.free_port()}"

    env = engine_env.tiny_worker_env(
        REPO,
        HF_HUB_OFFLINE=None,
        TRANSFORMERS_OFFLINE=None,
        HF_ENDPOINT=unreachable,
        RUNPOD_MODEL_CACHE=str(root),
        HF_HOME=str(tmp_path / "hf-home"),
        MAX_CONCURRENCY="2",
    )
    with ControlPlane() as cp, WorkerProcess(env, control_plane=cp, workdir=tmp_path) as worker:
        job = cp.submit({"prompt": "Hello", "sampling_params": {"max_tokens": 4, "ignore_eos": True}})
        result = cp.result(job, timeout=engine_env.BOOT_TIMEOUT)
        status = cp.result(cp.submit({"route": "/worker/status"}), timeout=60)
        log = worker.log()

    assert "error" not in result, result
    [answer] = result["output"]
    assert answer["usage"]["completion_tokens"] == 4
    assert answer["model"] == REPO
    [report] = status["output"]
    assert report["model_cache"] == {
        "source": "Runpod model cache",
        "repo": REPO,
        "commit": snapshot.name,
        "path": str(snapshot),
    }
    assert f"serving {REPO} (commit {snapshot.name[:12]}) from the Runpod model cache" in log
    # Nothing was fetched: the engine ran offline against the snapshot.
    assert "Max retries exceeded" not in log and "couldn't connect" not in log.lower()
