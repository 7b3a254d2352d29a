"""The start's forecast against the start: time to ready predicted before the download, again once its rate is
known, and as it was, over a run of starts (issue 44).

A Hub stand-in on 127.0.0.1 serves a tiny Llama made wide (about 60 MB of weights) at `--rate` bytes a second.
Each pair of starts: a cold one on a fresh network volume (a tmpfs mounted at BASE_PATH: vLLM downloads the
model into its Hugging Face cache there), then a warm one on the same volume (the model is found there and
served offline). The real vLLM CPU engine through `vllm-worker run` and the SDK's job loop against the
control-plane stand-in; each start's figures come from its status job's `start_forecast`. Prints each start
and how many were within +-25 % (before the download) and +-15 % (once the rate was measured; starts that
download) of the actual time to ready.

    .venv/bin/python bench/start_forecast.py [--pairs 5] [--rate 2000000]
"""

from __future__ import annotations

import argparse
import platform
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support import engine_env  # noqa: E402
from tests.support.control_plane import ControlPlane  # noqa: E402
from tests.support.hub_stub import HubStub  # noqa: E402
from tests.support.volumes import network_volume  # noqa: E402
from tests.support.worker_proc import WorkerProcess  # noqa: E402

REPO = "acme/tiny-llama-wider"
WIDER = {"layers": 4, "hidden_size": 1024, "intermediate_size": 3072, "heads": 16, "kv_heads": 2, "head_dim": 64}


def start(env: dict[str, str], workdir: Path) -> dict[str, Any]:
    workdir.mkdir(parents=True)
    tmp = Path(tempfile.mkdtemp(prefix="fc-"))
    env = {**env, "TMPDIR": str(tmp), "VLLM_PORT": str(engine_env.free_port())}
    try:
        with ControlPlane() as cp, WorkerProcess(env, control_plane=cp, workdir=workdir):
            status = cp.result(cp.submit({"route": "/worker/status"}), timeout=engine_env.BOOT_TIMEOUT)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    [report] = status["output"]
    if report["ready"] is not True:
        raise SystemExit(f"a start failed: {report['fatal']}")
    return dict(report["start_forecast"])


def error(predicted: float | None, actual: float) -> float | None:
    return None if predicted is None else (predicted - actual) / actual


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--rate", type=float, default=2_000_000)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="start-forecast-"))
    model = engine_env.make_tiny_model(scratch / "model", **WIDER)
    files = {p.name: p.read_bytes() for p in model.iterdir() if p.is_file() and not p.name.startswith(".")}
    params = engine_env.parameter_count(model / "model.safetensors")
    size = sum(len(data) for data in files.values())
    print(f"{platform.node()}: {REPO}, {size / 1e6:.1f} MB served at {args.rate / 1e6:.2f} MB/s, {args.pairs} pairs of starts")
    rows: list[tuple[str, float | None, float | None, float]] = []
    with HubStub() as hub:
        hub.add_repo(REPO, files=files, safetensors={"parameters": {"BF16": params}, "total": params})
        hub.slow_downloads(args.rate)
        for pair in range(args.pairs):
            with network_volume(scratch / f"volume-{pair}") as volume:
                cache = volume / "huggingface-cache" / "hub"
                env = engine_env.tiny_worker_env(
                    REPO, HF_HUB_OFFLINE=None, TRANSFORMERS_OFFLINE=None, HF_ENDPOINT=hub.endpoint, BASE_PATH=str(volume),
                    HF_HUB_CACHE=str(cache), RUNPOD_MODEL_CACHE=str(cache), ENGINE_DEVICE="cpu", MAX_CONCURRENCY="2",
                )  # fmt: skip
                for kind in ("cold", "warm"):
                    figures = start(env, scratch / f"start-{pair}-{kind}")
                    actual = figures["actual"]["seconds_to_ready"]
                    before = figures["predicted"]["seconds_to_ready"]
                    rated = (figures["with_download_rate"] or {}).get("seconds_to_ready")
                    rows.append((kind, before, rated, actual))
                    print(
                        f"pair {pair + 1} {kind}: actual {actual:.1f} s; predicted before the download {before} s "
                        f"({error(before, actual):+.1%}), with its rate {rated} s"
                        + (f" ({error(rated, actual):+.1%})" if rated is not None else "")
                        + f"; rate read {figures['predicted']['bytes_per_second']} B/s; after the download from "
                        f"{figures['predicted']['after_download_from']!r}",
                        flush=True,
                    )
    within_25 = sum(1 for _, before, _, actual in rows if before is not None and abs(error(before, actual) or 0) <= 0.25)
    rated_rows = [(rated, actual) for kind, _, rated, actual in rows if rated is not None]
    within_15 = sum(1 for rated, actual in rated_rows if abs(error(rated, actual) or 0) <= 0.15)
    print(f"before the download: {within_25} of {len(rows)} starts within +-25 %")
    print(f"with the download's rate: {within_15} of {len(rated_rows)} downloading starts within +-15 %")
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
