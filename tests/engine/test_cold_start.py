"""A cold start paid once: workers started one after the other on one network volume folder.

The real vLLM CPU engine through the worker, the model fetched by vLLM itself from the Hub
stand-in (slowed, so the download is long enough to be watched). Each start gets a fresh HOME and
TMPDIR, as a fresh container would: what a start finds, it finds on the volume. The first start
downloads (its progress shown); it runs eager, because vLLM keys its compile cache on the model's
snapshot folder once the model is served from the volume, so the downloading start's compile would
not serve the later ones anyway. The second start finds the model and compiles (caches cold); the
third finds the caches warm, though the AOT artifact the second left is torn on purpose. All
report their phases. Presence is asserted, never times.

A read-only volume folder must not fail a start: one warning, and the engine comes up (eager: the
cheapest start that proves it).
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.support import engine_env
from tests.support.control_plane import ControlPlane
from tests.support.hub_stub import HubStub
from tests.support.volumes import network_volume, read_only_volume
from tests.support.worker_proc import WorkerProcess

pytestmark = pytest.mark.engine

REPO = "acme/tiny-llama-wide"
# huggingface_hub writes a download to disk in 10 MiB chunks: a model of ~37 MB (the tiny Llama made
# wider), served at 1.5 MB/s, takes ~25 s and lands in steps the 10 s progress lines can see.
RATE = 1_500_000
WIDE = {"layers": 2, "hidden_size": 1024, "intermediate_size": 2048, "heads": 16, "kv_heads": 2, "head_dim": 64}


def start(env: dict[str, str], workdir: Path) -> tuple[dict[str, Any], str]:
    """One worker start: its status job's answer once it serves, and its log."""
    workdir.mkdir()
    # A short TMPDIR of its own: vLLM binds IPC sockets there, whose path may not pass 107 bytes.
    tmp = Path(tempfile.mkdtemp(prefix="cold-"))
    env = {**env, "TMPDIR": str(tmp), "VLLM_PORT": str(engine_env.free_port())}
    try:
        with ControlPlane() as cp, WorkerProcess(env, control_plane=cp, workdir=workdir) as worker:
            status = cp.result(cp.submit({"route": "/worker/status"}), timeout=engine_env.BOOT_TIMEOUT)
            log = worker.log()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    assert "error" not in status, status
    [report] = status["output"]
    if report["ready"] is not True or report["fatal"] is not None:
        pytest.fail(f"the worker did not start: {report['fatal']}\n{log[-6000:]}", pytrace=False)
    return report, log


@pytest.fixture
def volume(tmp_path: Path) -> Iterator[Path]:
    """A filesystem mounted at BASE_PATH, as a network volume is (a plain folder is no volume to the worker)."""
    with network_volume(tmp_path / "volume") as mounted:
        yield mounted


def test_starts_on_one_volume_download_once_and_compile_once(tmp_path: Path, volume: Path) -> None:
    tiny_model = engine_env.make_tiny_model(tmp_path / "model", **WIDE)
    hub_cache = volume / "huggingface-cache" / "hub"
    files = {p.name: p.read_bytes() for p in tiny_model.iterdir() if p.is_file() and not p.name.startswith(".")}
    params = engine_env.parameter_count(tiny_model / "model.safetensors")
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
            MAX_CONCURRENCY="2",
        )
        # 1. The model is not on the volume: vLLM downloads it (eager: the compile is the next starts' part). The
        # endpoint's RUNPOD_INIT_TIMEOUT is set below what the download alone takes: the worker says so at once.
        fetched, fetched_log = start({**env, "RUNPOD_INIT_TIMEOUT": "20"}, tmp_path / "first")
    compiled_env = {**env, "ENFORCE_EAGER": "false"}
    # 2. The model is on the volume now; torch.compile on, the caches empty.
    cold, cold_log = start(compiled_env, tmp_path / "second")
    # A torn AOT artifact (a writer that died mid-write) must not break the next start.
    [artifact] = (volume / "engine-cache" / "vllm").glob("torch_compile_cache/torch_aot_compile/*/rank_*/model")
    artifact.write_bytes(artifact.read_bytes()[: artifact.stat().st_size // 2])
    # 3. The same configuration again: the caches are warm.
    warm, warm_log = start(compiled_env, tmp_path / "third")

    progress = [line for line in fetched_log.splitlines() if f"downloading {REPO}: " in line]
    assert progress and all(f"of about {2 * params / 1e6:.1f} MB" in line for line in progress), progress
    assert fetched["download"]["bytes"] > 0 and fetched["download"]["expected_bytes"] == 2 * params
    [first] = fetched["startup_phases"]["launches"]
    assert {"import_config", "download", "weights_load", "engine_init", "ready"} <= set(first)
    assert "torch_compile" not in first and "graph_capture" not in first  # eager, CPU: absent, not zero
    assert {"settings", "preflight", "plan"} <= set(fetched["startup_phases"]["worker"])
    assert fetched["compile_caches"]["folder"] == str(volume / "engine-cache")
    assert fetched["compile_caches"]["found"] is None

    for report, log in ((cold, cold_log), (warm, warm_log)):
        assert f"downloading {REPO}" not in log and report["download"] is None
        [launch] = report["startup_phases"]["launches"]
        assert {"import_config", "weights_load", "torch_compile", "engine_init", "ready"} <= set(launch)
        assert "download" not in launch
        assert "startup phases, launch 1: settings" in log
    assert cold["compile_caches"]["expected"] == "cold" and cold["compile_caches"]["found"] == "cold"
    assert "compile caches cold" in cold_log
    assert warm["compile_caches"]["expected"] == "warm" and warm["compile_caches"]["found"] == "warm"
    assert "Compiling model again due to a load failure" in warm_log and "compile caches warm" in warm_log

    for log in (fetched_log, cold_log, warm_log):
        assert "Unknown vLLM environment variable detected" not in log

    # The start's forecast: made before the download from the Hub's listing and a read of it, the limit's warning
    # logged before the engine is launched, with the value to set; then set against the start at ready.
    predicted = fetched["start_forecast"]["predicted"]
    print("forecasts (predicted before the download, actual):", [
        (r["start_forecast"]["predicted"]["seconds_to_ready"], r["start_forecast"]["actual"]["seconds_to_ready"])
        for r in (fetched, cold, warm)
    ])  # fmt: skip
    assert predicted["bytes_to_fetch"] == sum(len(data) for data in files.values())  # every file here is one vLLM fetches
    assert predicted["rate_from"] == "a read of the Hub" and predicted["bytes_per_second"] == pytest.approx(RATE, rel=0.25)
    assert predicted["limit_seconds"] == 20.0 and fetched["start_forecast"]["over_limit"] is True
    lines = fetched_log.splitlines()
    [warning] = [i for i, line in enumerate(lines) if "This start is predicted to take about" in line]
    launch = next(i for i, line in enumerate(lines) if "launch 1: " in line)
    assert warning < launch and "past RUNPOD_INIT_TIMEOUT=20 " in lines[warning]
    assert re.search(r"To fix: set RUNPOD_INIT_TIMEOUT=\d+ on the endpoint", lines[warning])
    assert "start forecast (before the download): ready about" in fetched_log
    assert fetched["start_forecast"]["actual"]["seconds_to_ready"] > 0
    # The real engine's first line with the weights on disk splits the start that downloaded: it is recorded.
    actual = fetched["start_forecast"]["actual"]
    assert actual["after_download"] is not None and actual["download"] > 0, actual
    # The later starts fetch nothing; the third is predicted from the second's start of the same configuration.
    for report in (cold, warm):
        assert report["start_forecast"]["predicted"]["bytes_to_fetch"] == 0
    assert cold["start_forecast"]["predicted"]["after_download_from"].endswith("none recorded")
    assert warm["start_forecast"]["predicted"]["after_download_from"] == "the last ready start of this configuration on the volume"
    assert "This start is predicted" not in cold_log + warm_log
    # The engine answered the worker's own request before the first job, at every start.
    for log in (fetched_log, cold_log, warm_log):
        assert "warm-up request: 8 tokens answered in" in log


def test_a_read_only_volume_costs_one_warning_and_the_start_goes_on(tiny_model: Path, tmp_path: Path) -> None:
    with read_only_volume(tmp_path / "volume") as volume:
        env = engine_env.tiny_worker_env(tiny_model, BASE_PATH=str(volume), MAX_CONCURRENCY="2")
        report, log = start(env, tmp_path / "worker")
    warnings = [line for line in log.splitlines() if "cannot keep the engine's compile caches" in line]
    assert len(warnings) == 1 and "WARNING" in warnings[0], warnings
    assert report["compile_caches"]["folder"] is None
    assert report["compile_caches"]["warning"] is not None
