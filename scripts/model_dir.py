"""A generated model folder: written so that a reader never sees half of it, and known complete.

Shared by make_tiny_model.py and make_demo_model.py (run as scripts from this folder, so they
import it as `model_dir`). A folder is complete when its `.complete` mark matches what the
generator would write now (its own source and this module's included) and its files are there.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterable, Mapping

COMPLETE_MARK = ".complete"


def generator_id(script: Path) -> str:
    """Changes whenever the generating script or this module changes, so a stale folder is rebuilt."""
    digest = hashlib.sha256(Path(script).read_bytes() + Path(__file__).read_bytes())
    return digest.hexdigest()[:16]


def is_complete(out: Path, mark: Mapping[str, object], required: Iterable[str]) -> bool:
    try:
        found = json.loads((out / COMPLETE_MARK).read_text())
    except (OSError, ValueError):
        return False
    return found == dict(mark) and all((out / name).is_file() for name in required)


def write_atomically(out: Path, mark: Mapping[str, object], write: Callable[[Path], None]) -> Path:
    """`write(staging)` fills a folder beside `out`, which then replaces `out` in one rename."""
    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        write(staging)
        for path in (staging, *staging.iterdir()):
            path.chmod(0o755 if path.is_dir() else 0o644)
        (staging / COMPLETE_MARK).write_text(json.dumps(dict(mark), sort_keys=True) + "\n")
        if out.exists():
            shutil.rmtree(out)
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out
