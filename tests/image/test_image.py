"""The image a user deploys, built here and run the way the platform runs it.

The image is built by `make image`'s script (scripts/image/build.sh) from this checkout's Dockerfile,
on the CPU stand-in for `vllm/vllm-openai:v0.32.0` (scripts/image/base.sh: vLLM 0.32's CPU build in a
Debian base, `vllm serve` on PATH, the venv module there; docs/deploy.md says what it differs in).
Every container here is started as the platform starts a worker: the image's own ENTRYPOINT (the
worker is PID 1), host network, a network volume (a tmpfs of its own, another filesystem than the
container's) mounted at /runpod-volume with the tiny model in the Hugging Face cache layout, the
control-plane stand-in on 127.0.0.1 through the RUNPOD_WEBHOOK_* variables, and the SDK's production
start with its checks on. The engine is the image's own `vllm serve`.

One container serves the jobs, the status job, the engine's death and finally `docker stop` (one
boot, one relaunch); the wrong model, the baked model and the local test run have their own.
Needs root and Docker (scripts/image/engine.sh installs Debian's docker.io): skipped without, a
failure under CI=true.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from huggingface_hub import snapshot_download

from tests.support import docker_engine, engine_env, vllm_metrics
from tests.support.control_plane import ControlPlane
from tests.support.docker_engine import Container, Engine
from tests.support.hub_stub import HubStub

IMAGE = "vllm-worker:local"
BAKED_IMAGE = "vllm-worker:test-baked"
REPO = "acme/tiny-llama"
PRIVATE_REPO = "acme/private-tiny-llama"
READY = "engine ready; taking jobs"
BOOT_S = engine_env.BOOT_TIMEOUT
SETTLE_S = 60.0
# A frozen engine's job is checked for an answer after this: one vLLM ended just before the freeze is posted by then.
SETTLE_FROZEN_S = 3.0
# docker stop's grace: Runpod documents 5 s between its SIGTERM and its SIGKILL.
PLATFORM_GRACE_S = 5
STATUS = {"route": "/worker/status"}


def prompt_job(tokens: int, stream: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"prompt": "hello " * 20, "max_tokens": tokens, "min_tokens": tokens, "temperature": 0}
    if stream:
        body["stream"] = True
    return {"openai_route": "/v1/completions", "openai_input": body}


def zombies(container: Container) -> list[dict[str, Any]]:
    return [p for p in container.processes() if p["state"] == "Z"]


def engines(container: Container) -> list[dict[str, Any]]:
    """The engine the worker leads: its child running `vllm serve`, leading its own process group."""
    return [
        p for p in container.processes()
        if p["ppid"] == 1 and p["pgrp"] == p["pid"] and " serve " in f" {p['cmd']} " and p["state"] != "Z"
    ]


# --- the engine, the image, the volume ------------------------------------------------------------


@pytest.fixture(scope="module")
def docker() -> Iterator[Engine]:
    engine = docker_engine.start_engine()
    try:
        yield engine
    finally:
        docker_engine.stop_engine(engine)


@pytest.fixture(scope="module")
def image(docker: Engine) -> str:
    docker.build(IMAGE)
    return IMAGE


@pytest.fixture(scope="module")
def tiny_files() -> dict[str, bytes]:
    engine_env.require_engine()
    model = engine_env.make_tiny_model()
    return {p.name: p.read_bytes() for p in model.iterdir() if p.is_file()}


@pytest.fixture(scope="module")
def volume(tiny_files: dict[str, bytes]) -> Iterator[Path]:
    """A network volume: a filesystem of its own (tmpfs), the tiny model in its Hugging Face cache."""
    root = Path(tempfile.mkdtemp(prefix="vllm-worker-volume-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2g", "tmpfs", str(root)], check=True)
    try:
        with HubStub() as hub:
            hub.add_repo(REPO, files=tiny_files)
            snapshot_download(REPO, cache_dir=root / "huggingface-cache" / "hub", endpoint=hub.endpoint)
        yield root
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)
        root.rmdir()


def unreachable_hub() -> str:
    return f"http://127.0.0.1:{engine_env.free_port()}"


def worker_env(cp: ControlPlane | None, **overrides: str | None) -> dict[str, str]:
    """The variables the platform and the user give the container: the endpoint's (none for the local
    test), the tiny model's settings on the CPU engine (the image's own `vllm serve`), and a Hub
    nothing may reach."""
    settings: dict[str, str | None] = {
        "VLLM_COMMAND": None,
        "HF_HUB_OFFLINE": None,
        "TRANSFORMERS_OFFLINE": None,
        "HF_ENDPOINT": unreachable_hub(),
        "MAX_MODEL_LEN": "2048",
        "WORKER_READY_TIMEOUT": str(int(BOOT_S)),
        **overrides,
    }
    env = engine_env.tiny_worker_env(REPO, **settings)
    return {**(cp.env(sdk_checks=True) if cp is not None else {}), **env}


@dataclass
class Serving:
    cp: ControlPlane
    container: Container
    port: int


@pytest.fixture(scope="module")
def serving(docker: Engine, image: str, volume: Path) -> Iterator[Serving]:
    with ControlPlane(worker_id="worker-image") as cp:
        env = worker_env(cp)
        container = Container(docker, image, env, volume=volume).start()
        try:
            container.wait_for_log(READY, timeout=BOOT_S)
            yield Serving(cp, container, int(env["VLLM_PORT"]))
        finally:
            container.remove()


# --- one container: jobs, status, the engine's death, docker stop ------------------------------------


def test_the_worker_is_pid_1_and_runs_the_images_own_vllm_serve(serving: Serving) -> None:
    procs = {p["pid"]: p for p in serving.container.processes()}
    # The worker itself, not a shell or wrapper around it: PID 1 is what receives the runtime's SIGTERM.
    assert re.fullmatch(r"/opt/worker/bin/python3?(\.\d+)? /opt/worker/bin/vllm-worker run", procs[1]["cmd"]), procs[1]
    [engine] = engines(serving.container)
    # `vllm` from the base's PATH, run by the base's system Python (not the worker's venv).
    assert re.search(r"^/usr/bin/python3\S* /usr/local/bin/vllm serve ", engine["cmd"]), engine["cmd"]
    log = serving.container.logs()
    assert "is not a network volume" not in log  # /runpod-volume is a mount of another filesystem
    assert "Fitness check failed" not in log and "the runpod SDK's fitness checks are not run" in log


def test_a_plain_and_a_streamed_job_are_answered_whole(serving: Serving) -> None:
    cp = serving.cp
    plain = cp.result(cp.submit(prompt_job(12)), timeout=BOOT_S)
    streamed_job = cp.submit(prompt_job(12, stream=True))
    streamed = cp.result(streamed_job, timeout=BOOT_S)

    assert "error" not in plain, plain
    [completion] = plain["output"]
    assert completion["object"] == "text_completion" and completion["model"] == REPO
    assert completion["usage"]["completion_tokens"] == 12
    assert "error" not in streamed, streamed
    text = "".join(part for part in cp.stream_outputs(streamed_job) if isinstance(part, str))
    data = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]" and data.count("[DONE]") == 1
    chunks = [json.loads(d) for d in data[:-1]]
    assert {c["model"] for c in chunks} == {REPO}
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0].get("finish_reason")] == ["length"]


def test_the_status_job_shows_the_model_served_from_the_volumes_cache(serving: Serving) -> None:
    status = serving.cp.result(serving.cp.submit(STATUS), timeout=SETTLE_S)
    [report] = status["output"]
    assert report["model_cache"]["source"] == "Runpod model cache"
    assert report["model_cache"]["repo"] == REPO
    assert report["model_cache"]["path"].startswith("/runpod-volume/huggingface-cache/hub/models--acme--tiny-llama/snapshots/")


def running_in_engine(port: int) -> float:
    """vLLM's count of requests running; 0 while no engine answers (one being relaunched)."""
    try:
        return vllm_metrics.metric(port, "vllm:num_requests_running")
    except OSError:  # urllib's URLError is one: refused while the engine restarts
        return 0.0


def frozen_in_flight(serving: Serving, leader: int, job: str) -> bool:
    """SIGSTOP of the engine's process group from the host, as soon as vLLM runs the job; True when the job
    is still unanswered SETTLE_FROZEN_S later (then it is frozen in flight), else SIGCONT and False.

    From the host, not `docker exec`: a clean-clone CI run (2026-12-07) killed the engine through `docker exec`
    after its 1,500-token job had ended, and the worker rightly had nothing to continue."""
    deadline = time.monotonic() + SETTLE_S
    while running_in_engine(serving.port) < 1:
        assert time.monotonic() < deadline, "the job never ran in the engine"
        time.sleep(0.05)
    os.killpg(leader, signal.SIGSTOP)
    time.sleep(SETTLE_FROZEN_S)
    if serving.cp.results_posted(job):
        os.killpg(leader, signal.SIGCONT)
        return False
    return True


def test_the_engine_killed_in_the_container_is_healed_in_place_and_pid_1_leaves_no_zombie(serving: Serving) -> None:
    cp, container = serving.cp, serving.container
    [engine] = engines(container)
    group = {p["pid"] for p in container.processes() if p["pgrp"] == engine["pid"] and p["pid"] != engine["pid"]}
    assert group, "the engine runs no process of its own beside its API server"
    leader = container.host_pid(engine["pid"])
    for _ in range(3):
        job = cp.submit(prompt_job(1500))
        if frozen_in_flight(serving, leader, job):
            break
        cp.result(job, timeout=BOOT_S)  # answered before the freeze: another job, frozen sooner
    else:
        raise AssertionError("in 3 tries the job was always answered before the engine was frozen")
    # Only the API server: its engine core and worker are orphaned, re-parented to PID 1 (the worker),
    # and exit or are killed with the group; only PID 1 can wait for them then. They go on (SIGCONT) as
    # they would have after the API server alone was killed.
    os.kill(leader, signal.SIGKILL)
    os.killpg(leader, signal.SIGCONT)

    result = cp.result(job, timeout=BOOT_S)

    assert "error" not in result, str(result)[:600]
    [completion] = result["output"]
    assert completion["usage"]["completion_tokens"] == 1500
    assert "continued" in (completion.get("worker") or {}), completion.get("worker")
    [relaunched] = engines(container)
    assert relaunched["pid"] != engine["pid"]
    assert container.running()
    assert zombies(container) == []
    assert group.isdisjoint(p["pid"] for p in container.processes()), "an orphan of the killed engine is still in the table"


def test_docker_stop_with_two_jobs_in_flight_drains_answers_both_and_the_container_exits_0(serving: Serving) -> None:
    """Last of the container's tests: it stops it. The default DRAIN_TIMEOUT (3 s) is shorter than the jobs."""
    cp, container = serving.cp, serving.container
    jobs = [cp.submit(prompt_job(1800)), cp.submit(prompt_job(1800, stream=True))]
    deadline = time.monotonic() + SETTLE_S
    while running_in_engine(serving.port) < 2:
        assert time.monotonic() < deadline, "the two jobs never ran in the engine together"
        time.sleep(0.1)

    container.stop(PLATFORM_GRACE_S)
    state = container.state()
    results = [cp.results_posted(job) for job in jobs]
    log = container.logs()
    print("\n".join(line for line in log.splitlines()[-300:] if "vllm_worker:" in line))  # the stop's timeline, for -s

    assert state["Running"] is False and state["OOMKilled"] is False
    # 0: the worker exited by itself within the grace; the runtime's SIGKILL would read 137 (the worker's lines say
    # where the window went: the cut, the engine's SIGKILL, the exit).
    assert state["ExitCode"] == 0, (state, "\n".join(line for line in log.splitlines() if "vllm_worker:" in line)[-3000:])
    assert re.search(r"taking no more jobs; 2 running may finish", log), log[-3000:]
    assert re.search(r"the worker exits \d+\.\d s after the platform's signal", log), log[-3000:]
    for posted in results:
        assert len(posted) == 1, posted
        [result] = posted
        assert set(result) == {"error"}, str(result)[:400]
        assert "stopped by the platform" in result["error"] and "DRAIN_TIMEOUT=3 seconds" in result["error"]
        assert "send it again" in result["error"]
    assert container.engine.run("top", container.name, check=False).returncode != 0  # no process left in it


# --- a wrong model ------------------------------------------------------------------------------


def test_a_wrong_model_name_is_answered_on_every_job_and_the_container_keeps_running(
    docker: Engine, image: str, volume: Path
) -> None:
    with HubStub() as hub, ControlPlane(worker_id="worker-wrong-model") as cp:
        hub.add_repo(REPO, files={"config.json": "{}"})
        env = worker_env(cp, MODEL_NAME="acme/tiny-lama", HF_ENDPOINT=hub.endpoint)
        container = Container(docker, image, env, volume=volume).start()
        try:
            first = cp.result(cp.submit(prompt_job(4)), timeout=SETTLE_S)
            second = cp.result(cp.submit(prompt_job(4, stream=True)), timeout=SETTLE_S)
            running = container.running()
            procs = container.processes()
        finally:
            container.remove()

    assert first == second and set(first) == {"error"}, first
    assert "MODEL_NAME='acme/tiny-lama' was not found on the Hugging Face Hub" in first["error"]
    assert running
    assert [p for p in procs if "vllm serve" in p["cmd"] or " serve " in f" {p['cmd']} "] == []
    assert [p for p in procs if p["state"] == "Z"] == []


# --- a baked model -------------------------------------------------------------------------------


def saved_image_holds(docker: Engine, image: str, *needles: bytes) -> set[bytes]:
    """Which of the byte strings `docker save` of the image (every layer, its config and history) holds."""
    proc = subprocess.Popen([docker_engine.DOCKER, "save", image], env=docker.env(), stdout=subprocess.PIPE)
    assert proc.stdout is not None
    found: set[bytes] = set()
    keep = max(len(n) for n in needles)
    tail = b""
    while chunk := proc.stdout.read(1 << 20):
        window = tail + chunk
        found.update(n for n in needles if n in window)
        tail = window[-keep:]
    assert proc.wait() == 0
    return found


def test_a_baked_model_is_served_with_the_hub_unreachable_and_the_token_is_in_no_layer(
    docker: Engine, image: str, tiny_files: dict[str, bytes], tmp_path: Path
) -> None:
    token = "hf_" + secrets.token_hex(17)
    secret = tmp_path / "hf-token"
    secret.write_text(token)
    with HubStub() as hub:
        hub.add_repo(PRIVATE_REPO, files=tiny_files, private=True, authorized_tokens=[token])
        output = docker.build(
            BAKED_IMAGE,
            "--build-arg", f"MODEL_NAME={PRIVATE_REPO}",
            "--build-arg", f"HF_ENDPOINT={hub.endpoint}",
            "--secret", f"id=HF_TOKEN,src={secret}",
        )
        downloads = [c for c in hub.calls("/") if "resolve" in c.path]
    assert downloads, f"the build downloaded nothing from the Hub stand-in:\n{output[-3000:]}"
    assert {c.token for c in downloads} == {token}, "the build secret did not reach the download step"

    try:
        # The model's config is in a layer, and found there: the search reads the layers' bytes.
        weights_config = tiny_files["config.json"]
        found = saved_image_holds(docker, BAKED_IMAGE, token.encode(), weights_config)
        assert found == {weights_config}, "the token is in a layer of the image" if token.encode() in found else found
        inspected = docker.run("inspect", BAKED_IMAGE).stdout + docker.run("history", "--no-trunc", BAKED_IMAGE).stdout
        assert token not in inspected
        with ControlPlane(worker_id="worker-baked") as cp:
            env = worker_env(cp, MODEL_NAME=None)  # the image's own MODEL_NAME
            container = Container(docker, BAKED_IMAGE, env).start()
            try:
                result = cp.result(cp.submit(prompt_job(6)), timeout=BOOT_S)
                log = container.logs()
            finally:
                container.remove()
    finally:
        docker.run("rmi", "-f", BAKED_IMAGE, check=False)

    assert "error" not in result, str(result)[:600]
    [completion] = result["output"]
    assert completion["model"] == PRIVATE_REPO and completion["usage"]["completion_tokens"] == 6
    assert token not in log
    assert "/opt/models/model" in log


# --- the README's local test --------------------------------------------------------------------


def test_the_readmes_one_job_local_test_runs_inside_the_image(docker: Engine, image: str, volume: Path) -> None:
    """`vllm-worker --test_input '{...}'`, as the README has it, as the image's arguments."""
    readme = (docker_engine.REPO_ROOT / "README.md").read_text()
    match = re.search(r"`vllm-worker --test_input '(\{.*?\})'`", readme)
    assert match, "the README's one-job local test is not where this test reads it"
    job = match.group(1)
    env = worker_env(None)
    command = ["run", "--rm", "--network", "host", "--shm-size", docker_engine.SHM_SIZE, "-v", f"{volume}:/runpod-volume"]
    for key, value in env.items():
        command += ["-e", f"{key}={value}"]
    done = docker.run(*command, image, "--test_input", job, timeout=BOOT_S + 120, check=False)

    assert done.returncode == 0, (str(done.stdout) + str(done.stderr))[-3000:]
    result = json.loads(str(done.stdout).strip().splitlines()[-1])
    assert set(result) == {"output"}, result
    [completion] = result["output"]
    assert 1 <= completion["usage"]["completion_tokens"] <= json.loads(job)["input"]["max_tokens"]
