"""The image against the checkout: its size, its build time, and a cold start to the first answered job.

In one run (root, a Docker engine from scripts/image/engine.sh):
- the base (scripts/image/base.sh): seconds, and whether it came from the cache;
- the worker image (the Dockerfile on that base): build seconds with `--no-cache` (every worker
  layer built again, the worker's install from PyPI included), and its size beside the base's;
- from `docker run` (the image's ENTRYPOINT, host network, the tiny model in the Hugging Face cache
  on a tmpfs volume at /runpod-volume) to the first job answered through the control-plane stand-in,
  against the same start from the checkout (`vllm-worker run` from .venv, `vllm serve` from
  .venv-engine, the same cache), alternated `--rounds` times so a warming page cache favours neither.

    sudo .venv/bin/python bench/image.py [--rounds N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from huggingface_hub import snapshot_download  # noqa: E402

from tests.support import docker_engine, engine_env  # noqa: E402
from tests.support.control_plane import ControlPlane  # noqa: E402
from tests.support.docker_engine import Container  # noqa: E402
from tests.support.hub_stub import HubStub  # noqa: E402
from tests.support.worker_proc import WorkerProcess  # noqa: E402

IMAGE = "vllm-worker:bench"
REPO = "acme/tiny-llama"
JOB = {"openai_route": "/v1/completions", "openai_input": {"prompt": "Hello", "max_tokens": 4, "min_tokens": 4}}


def timed(command: list[str], env: dict[str, str]) -> tuple[float, str]:
    began = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{(done.stdout + done.stderr)[-4000:]}")
    return time.perf_counter() - began, done.stderr + done.stdout  # stdout last: its last line is the result


def size_mb(engine: docker_engine.Engine, image: str) -> float:
    return int(engine.run("image", "inspect", "--format", "{{.Size}}", image).stdout) / 1e6


def settings(cp: ControlPlane) -> dict[str, str]:
    env = engine_env.tiny_worker_env(
        REPO, VLLM_COMMAND=None, HF_HUB_OFFLINE=None, TRANSFORMERS_OFFLINE=None,
        HF_ENDPOINT=f"http://127.0.0.1:{engine_env.free_port()}",
    )
    return {**cp.env(sdk_checks=True), **env}


def image_start(engine: docker_engine.Engine, volume: Path) -> float:
    with ControlPlane(worker_id="bench-image") as cp:
        job = cp.submit(JOB)
        container = Container(engine, IMAGE, settings(cp), volume=volume)
        began = time.perf_counter()
        container.start()
        try:
            result = cp.result(job, timeout=engine_env.BOOT_TIMEOUT)
            took = time.perf_counter() - began
        finally:
            container.remove()
    if "error" in result:
        raise SystemExit(f"the container answered {result}")
    return took


def checkout_start(volume: Path, workdir: Path) -> float:
    with ControlPlane(worker_id="bench-checkout") as cp:
        job = cp.submit(JOB)
        env = {
            **settings(cp),
            "VLLM_COMMAND": f"{engine_env.VLLM_BIN} serve",
            "RUNPOD_MODEL_CACHE": str(volume / "huggingface-cache" / "hub"),
            "HF_HOME": str(workdir / "hf-home"),
        }
        began = time.perf_counter()
        worker = WorkerProcess(env, control_plane=cp, workdir=workdir).start()
        try:
            result = cp.result(job, timeout=engine_env.BOOT_TIMEOUT)
            took = time.perf_counter() - began
        finally:
            worker.stop(timeout=60)
    if "error" in result:
        raise SystemExit(f"the checkout's worker answered {result}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()

    engine = docker_engine.start_engine()
    env = engine.env()
    base_s, base_out = timed(["bash", "scripts/image/base.sh"], env)
    base = base_out.strip().splitlines()[-1]
    print(f"base {base}: {base_s:.1f} s ({'cached' if 'cached' in base_out else 'built'}), {size_mb(engine, base):.0f} MB")
    build_s, _ = timed(["bash", "scripts/image/build.sh", "--no-cache"], {**env, "IMAGE": IMAGE})
    image_mb = size_mb(engine, IMAGE)
    print(f"worker image {IMAGE}: built in {build_s:.1f} s (--no-cache, base cached), {image_mb:.0f} MB "
          f"({image_mb - size_mb(engine, base):.0f} MB over the base)")

    model = engine_env.make_tiny_model()
    volume = Path(tempfile.mkdtemp(prefix="bench-volume-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2g", "tmpfs", str(volume)], check=True)
    try:
        with HubStub() as hub:
            hub.add_repo(REPO, files={p.name: p.read_bytes() for p in model.iterdir() if p.is_file()})
            snapshot_download(REPO, cache_dir=volume / "huggingface-cache" / "hub", endpoint=hub.endpoint)
        image_s, checkout_s = [], []
        for round_ in range(args.rounds):
            image_s.append(image_start(engine, volume))
            with tempfile.TemporaryDirectory() as workdir:
                checkout_s.append(checkout_start(volume, Path(workdir)))
            print(f"round {round_ + 1}: first job answered {image_s[-1]:.1f} s after `docker run`, "
                  f"{checkout_s[-1]:.1f} s after the checkout's start")
        print(f"docker run to the first answered job: median {statistics.median(image_s):.1f} s; "
              f"from the checkout: {statistics.median(checkout_s):.1f} s (load average {os.getloadavg()[0]:.1f})")
    finally:
        subprocess.run(["umount", "-l", str(volume)], check=False)
        volume.rmdir()
        engine.run("rmi", "-f", IMAGE, check=False)
        docker_engine.stop_engine(engine)


if __name__ == "__main__":
    main()
