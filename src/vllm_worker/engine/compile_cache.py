"""The engine's compile caches on the network volume: a cold start paid once.

Every cold start of a container begins with vLLM's torch.compile cache, Inductor's and
Triton's empty: they live in the container (`~/.cache/vllm`, `/tmp/torchinductor_<user>`)
and die with it. When a network volume is mounted at BASE_PATH (a mount point: a folder the
image's HF_HOME made on the container's disk is not one, and caches there would die with the
container just the same), `prepare` points them at
`BASE_PATH/engine-cache` (config.engine_env decides the variables), so the next worker
that starts the same configuration loads what the first one compiled.

What can go wrong on a volume shared by workers that start at once, and who handles it:
- torch writes Inductor's entries through a temporary file and a rename, and skips an
  entry it cannot unpickle; vLLM writes its AOT artifact the same way and compiles again,
  with one warning, when it cannot load it. Those need nothing from the worker.
- vLLM writes `vllm_compile_cache.py` (its index of compiled graphs) in place and parses it
  with `ast.literal_eval` at the next start: a file torn by a writer that died or is still
  writing fails that start. `repair` parses each index before a launch and removes a torn
  one (vLLM then compiles those graphs again), with one log line.
- A read-only or full volume must not fail a start: the caches then stay in the container,
  with one warning.

Whether a start will find the caches warm is known from a mark the worker leaves after a
start of the same configuration (its argv, less host and port) came up with them: the
capacity plan then leaves out the cold-compile term. Whether it did is read from the
engine's own lines (engine.startup_phases).
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Sequence

from vllm_worker.config.engine_env import cache_variables, vllm_cache_root
from vllm_worker.config.versions import VLLM_VERSION

log = logging.getLogger("vllm_worker")

CACHE_FOLDER = "engine-cache"
MARKS_FOLDER = "vllm-worker-ready"
START_SUFFIX = ".start.json"  # beside a mark: the engine's start after its download (engine.start_forecast)
# Below this much free space the caches stay in the container: one configuration's artifacts
# are about 150 MB on the CPU engine here and hundreds of MB on GPUs, and a volume that fills
# up during a compile would fail that start.
MIN_FREE_BYTES = 2 << 30
_PROBE_BYTES = 64 << 10
# Options whose values change between starts of the same configuration.
_VOLATILE_FLAGS = ("--port", "--host")

Expected = Literal["warm", "cold", "unknown"]


@dataclass
class CacheSetup:
    """Where this worker's engine keeps its compile caches, and what the worker expects to find."""

    root: Path | None = None  # the cache folder on the volume; None: the container's defaults
    env: dict[str, str] = field(default_factory=dict)  # variables for the engine's environment
    expected: Expected = "unknown"  # "warm": a start of this configuration left them; "unknown": no volume
    warning: str | None = None  # why a mounted volume is not used
    repaired: list[str] = field(default_factory=list)  # torn entries removed before the launch
    served_from: str | None = None  # the on-disk snapshot the model is served from, part of the key
    # The engine's start before its download and after it, at the last ready start of this configuration
    # (engine.start_forecast; a start that fetched is split at its first line with the weights on disk).
    recorded_start: tuple[float, float] | None = None

    def status(self) -> dict[str, Any]:
        return {
            "folder": str(self.root) if self.root else None,
            "expected": self.expected,
            "repaired": list(self.repaired),
            "warning": self.warning,
        }


def fingerprint(argv: Sequence[str], served_from: str | None = None) -> str:
    """The configuration a compile cache belongs to: the vLLM release, the argv less the options that
    vary per start, and the snapshot folder a cached model is served from (offline, vLLM resolves the
    repo id to that folder and keys its cache on it, so the start that downloads a model and the starts
    that find it on the volume compile under two keys). vLLM's own key is finer; a mark that says warm
    wrongly only costs the plan its cold-compile allowance."""
    kept: list[str] = []
    skip = False
    for word in argv:
        if skip:
            skip = False
            continue
        if word in _VOLATILE_FLAGS:
            skip = True
            continue
        if word.split("=", 1)[0] in _VOLATILE_FLAGS:
            continue
        kept.append(word)
    return hashlib.sha256("\0".join([VLLM_VERSION, served_from or "", *kept]).encode()).hexdigest()[:32]


def unusable_volume_message(base_path: str, problem: str) -> str:
    return (
        f"the network volume at BASE_PATH={base_path} cannot keep the engine's compile caches ({problem}): "
        f"they stay in the container and this start compiles as on a fresh one; "
        f"attach a writable volume with free space, or set BASE_PATH to a writable folder"
    )


def prepare(
    base_path: str,
    env: Mapping[str, str],
    argv: Sequence[str],
    served_from: str | None = None,
    mounted: Callable[[str], bool] = os.path.ismount,
) -> CacheSetup:
    """The cache folders for this worker's launches; never raises (a volume problem is a warning).
    `served_from`: the cached snapshot the model is served from (model.cache), if any. Without a
    volume mounted at `base_path` the container's defaults stay (main says so once)."""
    if not mounted(base_path):
        return CacheSetup()
    root = Path(base_path) / CACHE_FOLDER
    problem = _probe(root)
    if problem is not None:
        return CacheSetup(warning=unusable_volume_message(base_path, problem))
    setup = CacheSetup(root=root, env=cache_variables(str(root), env), expected="cold", served_from=served_from)
    setup.repaired = repair(Path(vllm_cache_root(str(root), env)))
    mark = root / MARKS_FOLDER / fingerprint(argv, served_from)
    if mark.exists():
        setup.expected = "warm"
    setup.recorded_start = _recorded_start(root / MARKS_FOLDER / (fingerprint(argv) + START_SUFFIX))
    return setup


def _recorded_start(path: Path) -> tuple[float, float] | None:
    """The seconds a record of a start holds (before the download, after it); None where there is none or it is
    unreadable."""
    try:
        record = json.loads(path.read_text())
        before, after = record.get("before_download_s", 0.0), record.get("after_download_s")
    except (OSError, ValueError, AttributeError):
        return None
    figures = (before, after)
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in figures) or after <= 0 or before < 0:
        return None
    return float(before), float(after)


def record_start(setup: CacheSetup, argv: Sequence[str], seconds: tuple[float, float] | None) -> None:
    """Keep what this ready start took before and after its download, for the next start's forecast. Never raises."""
    if setup.root is None or seconds is None or seconds[1] <= 0:
        return
    marks = setup.root / MARKS_FOLDER
    try:
        marks.mkdir(parents=True, exist_ok=True)
        temporary = marks / f".{uuid.uuid4().hex}.tmp"
        record = {"before_download_s": round(seconds[0], 1), "after_download_s": round(seconds[1], 1)}
        temporary.write_text(json.dumps(record) + "\n")
        # Keyed by the configuration alone: the start that downloads and the starts that find the model on the volume
        # (whose compile caches vLLM keys apart) take about as long after the download.
        os.replace(temporary, marks / (fingerprint(argv) + START_SUFFIX))
    except OSError as error:
        log.info("start forecast: could not record this start's time (%s)", error)


def _probe(root: Path) -> str | None:
    """Why `root` cannot hold the caches (read-only, no space, not a folder), or None."""
    probe = root / f".probe-{uuid.uuid4().hex}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(root).free
        if free < MIN_FREE_BYTES:
            return f"{free / (1 << 20):.0f} MiB free, less than the {MIN_FREE_BYTES >> 30} GiB the caches may need"
        with open(probe, "wb") as handle:
            handle.write(b"\0" * _PROBE_BYTES)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as error:
        return f"{type(error).__name__}: {error.strerror or error}"
    finally:
        try:
            probe.unlink()
        except OSError:
            pass
    return None


def repair(vllm_cache_root: Path) -> list[str]:
    """Remove the torn indexes of vLLM's compile cache (`vllm_compile_cache.py` that does not parse).

    The index sits at torch_compile_cache/<hash>/rank_<i>_<j>/<prefix>/; the walk stays at that
    depth, so a large Inductor cache on a network volume is not listed.
    """
    removed: list[str] = []
    for index in sorted(vllm_cache_root.glob("torch_compile_cache/*/rank_*/*/vllm_compile_cache.py")):
        try:
            ast.literal_eval(index.read_text())
            continue
        except (OSError, UnicodeDecodeError):
            problem = "unreadable"
        except (SyntaxError, ValueError, MemoryError, RecursionError) as error:
            problem = f"{type(error).__name__}"
        try:
            index.unlink()
        except OSError:
            continue
        removed.append(str(index))
        log.warning("compile cache: removed the torn index %s (%s); vLLM compiles those graphs again", index, problem)
    return removed


def record_ready(setup: CacheSetup, argv: Sequence[str], state: str | None) -> None:
    """After a ready start that compiled or loaded (`state` from the engine's lines), leave the mark
    that says the next start of this configuration will find the caches warm. Never raises."""
    if setup.root is None or state is None:
        return
    marks = setup.root / MARKS_FOLDER
    target = marks / fingerprint(argv, setup.served_from)
    try:
        marks.mkdir(parents=True, exist_ok=True)
        temporary = marks / f".{uuid.uuid4().hex}.tmp"
        temporary.write_text("ready\n")
        os.replace(temporary, target)
    except OSError as error:
        log.info("compile cache: could not mark the caches warm for this configuration (%s)", error)
