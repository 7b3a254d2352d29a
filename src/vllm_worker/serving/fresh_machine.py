"""When a fresh machine is the fix: the worker asks the platform for one, within a bound its endpoint shares.

Some failures are the machine's, not the configuration's: a fault of the GPU, its driver or NCCL
that survived its one relaunch, memory another process still holds after the wait, restarts spent
on such faults. A fresh worker, usually on another machine, is the fix, and the runpod SDK can ask
the platform for one after a job (`refresh_worker`), so no person has to terminate the worker.

The bound: a fault every machine shares (a driver older than the image needs) would otherwise
replace workers without end. Nothing of a worker survives its replacement but a network volume,
which every worker of the endpoint mounts at the same place, so the fresh workers asked for are
counted there (BASE_PATH/.vllm-worker/fresh-workers.json, a list of timestamps), endpoint-wide, over the last
hour. At WORKER_REFRESH_LIMIT the worker stops asking and its answer says fresh machines did not
help. Where no network volume is mounted at BASE_PATH, the worker cannot count, so it does not ask
either, and says so: an unbounded replacement loop would cost more than one click. A volume is a
mount point (`os.path.ismount`): the image's HF_HOME lies under BASE_PATH, so without a volume the
engine's download creates BASE_PATH on the container's own disk, and a ledger there would die with
each container and count every fault as the first. The same holds where the file cannot be written.

A cause in the configuration never asks: a fresh worker would fail the same way.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

log = logging.getLogger("vllm_worker")

# Failures whose fix is another machine (diagnosis kinds); everything else is the configuration's or unknown.
# "gpu_check": a GPU that failed the worker's own allocation test before any launch (engine.machine_checks).
FRESH_MACHINE_KINDS = frozenset({"host_fault", "memory_held", "profiling_race", "gpu_check"})
WINDOW_S = 3600.0
STATE_FOLDER = ".vllm-worker"
LEDGER_FILE = "fresh-workers.json"


@dataclass(frozen=True)
class Decision:
    """What to do about a failure: ask for a fresh worker or not, and the sentence jobs are answered with."""

    refresh: bool
    sentence: str


def decide(message: str, kind: str | None, recent: int | None, limit: int, base_path: str, problem: str = "") -> Decision:
    """Pure: whether to ask for a fresh worker after a failure diagnosed as `kind`, and the answer.

    recent: fresh workers asked for by the endpoint's workers within the last hour; None when they
    cannot be counted (`problem` says why).
    """
    if kind not in FRESH_MACHINE_KINDS or limit == 0:
        return Decision(False, message)
    if recent is None:
        return Decision(
            False,
            f"{message} The worker did not ask the platform for a fresh worker itself: it counts the fresh "
            f"workers it asks for on the network volume, and no writable volume is mounted at "
            f"BASE_PATH={base_path} ({problem}); attach a network volume so it can.",
        )
    if recent >= limit:
        return Decision(
            False,
            f"{message} Fresh machines did not help: the endpoint's workers already asked for {recent} fresh "
            f"workers after a fault of the machine within the last hour (WORKER_REFRESH_LIMIT={limit}), so the "
            f"cause is likely one every machine shares, such as a driver older than the image needs; this "
            f"worker does not ask for another.",
        )
    return Decision(
        True,
        f"{message} The worker has asked the platform for a fresh worker, usually on another machine "
        f"({recent + 1} of at most {limit} within an hour, WORKER_REFRESH_LIMIT), so nothing needs "
        f"terminating by hand; send the job again.",
    )


def recent_count(stamps: Sequence[float], now: float, window_s: float = WINDOW_S) -> int:
    return sum(1 for at in stamps if 0 <= now - at < window_s)


class Ledger:
    """The fresh workers the endpoint's workers asked for: one JSON file on the shared volume."""

    def __init__(self, base_path: str, clock: Callable[[], float] = time.time) -> None:
        self.dir = Path(base_path) / STATE_FOLDER
        self.path = self.dir / LEDGER_FILE
        self.clock = clock

    def record_if_below(self, limit: int, cause: str) -> tuple[int | None, bool, str]:
        """(recent count before this one, recorded, problem): appends a stamp when under `limit`.

        Read and write under one lock, so two workers failing together count each other.
        """
        try:
            # Never the mount point itself: without a volume there, nothing of this survives the worker.
            self.dir.mkdir(exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:
            return None, False, error.strerror or type(error).__name__
        try:
            with os.fdopen(fd, "r+", encoding="utf-8") as f:
                fcntl.flock(f, fcntl.LOCK_EX)
                entries = _entries(f.read())
                now = self.clock()
                entries = [e for e in entries if now - e["at"] < WINDOW_S]
                recent = recent_count([e["at"] for e in entries], now)
                if recent >= limit:
                    return recent, False, ""
                entries.append({"at": now, "cause": cause, "worker": os.environ.get("RUNPOD_POD_ID", "")})
                f.seek(0)
                f.truncate()
                f.write(json.dumps({"fresh_workers": entries}))
                f.flush()
                return recent, True, ""
        except OSError as error:
            return None, False, error.strerror or type(error).__name__


def _entries(text: str) -> list[dict[str, Any]]:
    try:
        data = json.loads(text) if text.strip() else {}
    except ValueError:
        return []
    entries = data.get("fresh_workers") if isinstance(data, dict) else None
    return [e for e in entries or [] if isinstance(e, dict) and isinstance(e.get("at"), (int, float))]


def not_a_volume(base_path: str) -> str:
    """Why BASE_PATH is not a network volume, when nothing is mounted there."""
    if os.path.isdir(base_path):
        return "it is a folder of the container's disk, not a mounted volume"
    return "nothing is mounted there"


def answer(
    message: str,
    kind: str | None,
    limit: int,
    base_path: str,
    ask: Callable[[], None],
    mounted: Callable[[str], bool] = os.path.ismount,
) -> Decision:
    """Decide for a failure, record the fresh worker in the ledger, and ask the platform for it (`ask`)."""
    if kind not in FRESH_MACHINE_KINDS or limit == 0:
        return decide(message, kind, 0, limit, base_path)
    if mounted(base_path):
        recent, recorded, problem = Ledger(base_path).record_if_below(limit, kind)
    else:
        recent, recorded, problem = None, False, not_a_volume(base_path)
    decision = decide(message, kind, recent, limit, base_path, problem)
    if decision.refresh and recorded:
        log.warning("a fault of the machine (%s): asking the platform for a fresh worker after the next job", kind)
        ask()
    elif kind in FRESH_MACHINE_KINDS:
        log.warning("a fault of the machine (%s), and no fresh worker is asked for: %s", kind, decision.sentence)
    return decision
