"""The Dockerfile's worker install, run here: a dependency missing from pyproject.toml, a module
left out of the COPY lines or a broken console script fails CI instead of the image build.

The commands are taken from the Dockerfile itself (the COPY lines that fill the source folder and
the RUN that creates the venv), with only the two paths moved into a temporary folder, so the
test and the image cannot drift apart. It needs the package index, as the image build does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.support.dockerfile import instructions

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
WORKER_VENV = "/opt/worker"
WORKER_SRC = "/opt/worker-src"


def stage_sources(steps: list[tuple[str, str]], staged: Path) -> None:
    """Do what the COPY lines into WORKER_SRC do, leaving out what .dockerignore leaves out."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    copies = 0
    for instr, args in steps:
        if instr != "COPY":
            continue
        *sources, dest = args.split()
        if not dest.startswith(WORKER_SRC):
            continue
        target = staged / dest[len(WORKER_SRC) :].strip("/")
        for source in sources:
            origin = ROOT / source
            if origin.is_dir():
                shutil.copytree(origin, target if not dest.endswith("/") else target / origin.name, ignore=ignore)
            else:
                into = target / origin.name if dest.endswith("/") else target
                into.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(origin, into)
            copies += 1
    assert copies, f"no COPY into {WORKER_SRC} in the Dockerfile"


def install_command(steps: list[tuple[str, str]], venv: Path, staged: Path) -> str:
    runs = [args for instr, args in steps if instr == "RUN" and f"-m venv {WORKER_VENV}" in args]
    assert len(runs) == 1, "the Dockerfile must create the worker venv in exactly one RUN"
    # WORKER_SRC starts with WORKER_VENV: move it first.
    return runs[0].replace(WORKER_SRC, "\0").replace(WORKER_VENV, str(venv)).replace("\0", str(staged))


def test_dockerfile_install_gives_a_working_vllm_worker(tmp_path: Path) -> None:
    steps = instructions(DOCKERFILE.read_text())
    staged, venv = tmp_path / "worker-src", tmp_path / "worker"
    stage_sources(steps, staged)
    command = install_command(steps, venv, staged)
    assert str(venv) in command and str(staged) in command

    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    built = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    assert built.returncode == 0, f"$ {command}\n{built.stdout[-4000:]}\n{built.stderr[-4000:]}"

    # The ENTRYPOINT's program, from the venv alone (not this checkout's src/).
    helped = subprocess.run([str(venv / "bin" / "vllm-worker"), "--help"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert helped.returncode == 0, helped.stdout + helped.stderr
    assert "usage: vllm-worker" in helped.stdout and "run" in helped.stdout

    # The worker's venv must not carry an engine of its own: `vllm serve` is the image's.
    probe = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import importlib.util as u, vllm_worker; print(u.find_spec('vllm'), u.find_spec('torch'), vllm_worker.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.returncode == 0, probe.stderr
    vllm_spec, torch_spec, location = probe.stdout.split()
    assert (vllm_spec, torch_spec) == ("None", "None")
    assert location.startswith(str(venv)), f"vllm_worker imported from {location}, not from the venv"
