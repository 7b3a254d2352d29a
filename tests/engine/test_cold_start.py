"""A cold start paid once: two workers started one after the other on one network volume folder.

The real vLLM CPU engine with torch.compile on, through the worker, the model fetched by vLLM
itself from the Hub stand-in (slowed, so the download is long enough to be watched). Each start
gets a fresh HOME and TMPDIR, as a fresh container would: what the second finds, it finds on the
volume. The first must show its download's progress and find the caches cold; the second must
find the model on the volume (no download) and the caches warm, though the AOT artifact the first
left is torn on purpose. Both report their phases. Presence is asserted, never times.

A read-only volume folder must not fail a start: one warning, and the engine comes up (eager: the
cheapest start that proves it).
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import pytest

from tests.support import engine_env
from tests.support.control_plane import ControlPlane
from tests.support.hub_stub import HubStub
from tests.support.volumes import read_only_volume
from tests.support.worker_proc import WorkerProcess

pytestmark = pytest.mark.engine

REPO = "acme/tiny-llama"
RATE = 40_000  # bytes per second: the tiny model's 0.9 MB of weights take ~23 s, two progress lines


def parameter_count(safetensors: Path) -> int:
    data = safetensors.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    return sum(math.prod(t["shape"]) for name, t in header.items() if name != "__metadata__")


def start(env: dict[str, str], workdir: Path) -> tuple[dict[str, Any], str]:
    """One worker start: its status job's answer once it serves, and its log."""
    workdir.mkdir()
    (workdir / "tmp").mkdir()
    env = {**env, "TMPDIR": str(workdir / "tmp"), "VLLM_PORT": str(engine_env.free_port())}
    with ControlPlane() as cp, WorkerProcess(env, control_plane=cp, workdir=workdir) as worker:
        status = cp.result(cp.submit({"route": "/worker/status"}), timeout=engine_env.BOOT_TIMEOUT)
        log = worker.log()
    assert "error" not in status, status
    [report] = status["output"]
    assert report["ready"] is True and report["fatal"] is None, (report, log[-4000:])
    return report, log


def test_the_second_start_on_a_volume_finds_the_model_and_warm_caches(tiny_model: Path, tmp_path: Path) -> None:
    volume = tmp_path / "volume"
    hub_cache = volume / "huggingface-cache" / "hub"
    volume.mkdir()
    files = {p.name: p.read_bytes() for p in tiny_model.iterdir() if p.is_file() and not p.name.startswith(".")}
    params = parameter_count(tiny_model / "model.safetensors")
    with HubStub() as hub:
        hub.add_repo(REPO, files=files, safetensors={"parameters": {"BF16": params}, "total": params})
        hub.slow_downloads(RATE)
        env = engine_env.tiny_worker_env(
            REPO,
            HF_HUB_OFFLINE=None,
            TRANSFORMERS_OFFLINE=None,
            HF_ENDPOINT=hub.endpoint,
            BASE_PATH=str(volume),
            HF_HUB_CACHE=str(hub_cache),
            RUNPOD_MODEL_CACHE=str(hub_cache),
            ENFORCE_EAGER="false",
            MAX_CONCURRENCY="2",
        )
        cold, cold_log = start(env, tmp_path / "first")

    # A torn AOT artifact (a writer that died mid-write) must not break the next start.
    [artifact] = (volume / "engine-cache" / "vllm").glob("torch_compile_cache/torch_aot_compile/*/rank_*/model")
    artifact.write_bytes(artifact.read_bytes()[: artifact.stat().st_size // 2])
    warm, warm_log = start(env, tmp_path / "second")

    # The first start: downloaded with progress shown, compiled into the volume.
    assert f"downloading {REPO}: " in cold_log and f"of about {2 * params / 1e6:.1f} MB" in cold_log
    assert cold["download"]["bytes"] > 0 and cold["download"]["expected_bytes"] == 2 * params
    assert cold["compile_caches"]["expected"] == "cold" and cold["compile_caches"]["found"] == "cold"
    assert cold["compile_caches"]["folder"] == str(volume / "engine-cache")
    [first] = cold["startup_phases"]["launches"]
    assert {"import_config", "download", "weights_load", "torch_compile", "engine_init", "ready"} <= set(first)
    assert "graph_capture" not in first  # the CPU engine captures no graphs: absent, not zero
    assert {"settings", "preflight", "plan"} <= set(cold["startup_phases"]["worker"])
    assert "startup phases, launch 1: settings" in cold_log and "compile caches cold" in cold_log

    # The second: the model from the volume, the caches warm, phases again.
    assert f"downloading {REPO}" not in warm_log and warm["download"] is None
    assert warm["compile_caches"]["expected"] == "warm" and warm["compile_caches"]["found"] == "warm"
    assert "Compiling model again due to a load failure" in warm_log
    [second] = warm["startup_phases"]["launches"]
    assert {"import_config", "weights_load", "torch_compile", "engine_init", "ready"} <= set(second)
    assert "download" not in second
    assert "compile caches warm" in warm_log

    for log in (cold_log, warm_log):
        assert "Unknown vLLM environment variable detected" not in log


def test_a_read_only_volume_costs_one_warning_and_the_start_goes_on(tiny_model: Path, tmp_path: Path) -> None:
    with read_only_volume(tmp_path / "volume") as volume:
        env = engine_env.tiny_worker_env(tiny_model, BASE_PATH=str(volume), MAX_CONCURRENCY="2")
        report, log = start(env, tmp_path / "worker")
    warnings = [line for line in log.splitlines() if "cannot keep the engine's compile caches" in line]
    assert len(warnings) == 1 and "WARNING" in warnings[0], warnings
    assert report["compile_caches"]["folder"] is None
    assert report["compile_caches"]["warning"] is not None
