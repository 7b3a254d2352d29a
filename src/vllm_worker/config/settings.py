"""The worker's own settings, parsed once from the environment and validated.

Users configure the worker only through environment variables and read nothing
but a job's error response, so a bad value must not crash the container with a
traceback: `load()` raises `SettingsError`, whose text is one sentence naming the
variable, the value and what is accepted, and `main` answers every job with it.

Variables that become `vllm serve` flags are `args_builder`'s business, not this
module's; so is MAX_CONCURRENCY, read once into `LaunchProfile.max_concurrency`
(config/profile.py), since it also sets the default MAX_NUM_SEQS. Its line in
DOCUMENTED stays here with the other worker variables of the README's table.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass
from typing import Callable, Mapping, TypeVar

from vllm_worker.config.env import RefusedValue, bool_word, value

T = TypeVar("T")


class SettingsError(RefusedValue):
    """A worker variable holds a value the worker cannot use."""


@dataclass(frozen=True)
class Settings:
    """Everything the worker itself reads from the environment."""

    vllm_port: int = 8000
    vllm_host: str = "127.0.0.1"
    vllm_command: tuple[str, ...] = ("vllm", "serve")
    startup_timeout: float = 3600.0
    request_timeout: float = 600.0
    ready_timeout: float = 300.0
    stop_grace: float = 10.0
    gpu_memory_wait_timeout: float = 300.0
    log_tail_lines: int = 400
    gpu_memory_wait: bool = True
    engine_device: str = "auto"
    default_max_tokens: int | None = None
    hang_timeout: float = 60.0
    vllm_command_set: bool = False  # VLLM_COMMAND was set (not the default `vllm serve`)
    startup_timeout_set: bool = False  # VLLM_STARTUP_TIMEOUT was set: kept as set, not raised to the start's forecast
    base_path: str = "/runpod-volume"
    # Runpod documents 5 s between SIGTERM and SIGKILL (Pods pricing page, spot instances:
    # https://docs.runpod.io/pods/pricing, in runpod/docs until commit 8e5aebdb, May 2026) and
    # names no other figure; 3 s of running jobs leaves 2 s to post the stopping sentence.
    drain_timeout: float = 3.0
    refresh_limit: int = 3
    adaptive_concurrency: bool = True
    intake_buffer: int | None = None  # INTAKE_BUFFER; None: serving.intake.buffer_for derives it


# name -> (default as documented, None when unset; description); README's table is checked against this.
DOCUMENTED: dict[str, tuple[str | None, str]] = {
    "BASE_PATH": (
        "/runpod-volume",
        "where a network volume is mounted; when it is, the engine's compile caches are kept on it",
    ),
    "MAX_CONCURRENCY": ("30", "jobs one worker runs at once; also the default MAX_NUM_SEQS (rounded up to a multiple of 8)"),
    "VLLM_PORT": ("8000", "loopback port of the supervised `vllm serve`"),
    "VLLM_COMMAND": ("vllm serve", "command that starts the engine (shell words)"),
    "VLLM_STARTUP_TIMEOUT": ("3600", "seconds the engine may take to download, load and become ready"),
    "REQUEST_TIMEOUT": ("600", "seconds one job may wait for the engine's answer"),
    "WORKER_READY_TIMEOUT": ("300", "seconds a job waits for an engine that is being (re)started"),
    "VLLM_STOP_GRACE": ("10", "seconds between SIGTERM and SIGKILL when the engine is stopped"),
    "GPU_MEMORY_WAIT_TIMEOUT": ("300", "seconds to wait for GPU memory held by a previous process to be released"),
    "ENGINE_LOG_TAIL_LINES": ("400", "lines of the engine's output kept for diagnosing a failure"),
    "GPU_MEMORY_WAIT": (
        "true",
        "before every launch, wait until the memory vLLM checks at startup is free; false launches at once",
    ),
    "ENGINE_DEVICE": (
        "auto",
        "whose memory that wait reads: auto or cuda (the GPUs, through NVML or nvidia-smi), "
        "cpu (the host memory vLLM's CPU backend checks)",
    ),
    "ENGINE_HANG_TIMEOUT": (
        "60",
        "seconds the serving engine may leave its health check unanswered before it counts as hung, "
        "is killed and restarted in place",
    ),
    "DRAIN_TIMEOUT": (
        "3",
        "seconds running jobs may still finish after the platform's SIGTERM; a job still running then is "
        "answered that the worker is being stopped and can be sent again (Runpod documents 5 s between "
        "SIGTERM and SIGKILL)",
    ),
    "WORKER_REFRESH_LIMIT": (
        "3",
        "fresh workers the endpoint's workers may ask the platform for within an hour after a fault of the "
        "machine; counted on the network volume (BASE_PATH/.vllm-worker); 0 never asks",
    ),
    "ADAPTIVE_CONCURRENCY": (
        "true",
        "take only as many jobs as the engine can start now (read from its /metrics every second), up to "
        "MAX_CONCURRENCY (or MAX_NUM_SEQS and one more, where lower), so the rest wait in the endpoint's queue "
        "where the autoscaler sees them; false takes MAX_CONCURRENCY whatever the engine can run",
    ),
    "DEFAULT_MAX_TOKENS": (
        None,
        "max_tokens of a prompt or messages job that names none; unset: up to the end of the context",
    ),
    "INTAKE_BUFFER": (
        None,
        "with ADAPTIVE_CONCURRENCY, jobs kept waiting inside vLLM past what its KV cache holds to their end, so a "
        "request that ends is refilled by vLLM at once; unset: what ends in a take's round trip, 1 or 2",
    ),
}

ENGINE_DEVICES = ("auto", "cuda", "cpu")


def multiple_of_8_at_least(n: int) -> int:
    """Smallest multiple of 8 that is >= n (the worker's default MAX_NUM_SEQS)."""
    return max(8, math.ceil(n / 8) * 8)


def read_setting(env: Mapping[str, str], name: str, default: T, convert: Callable[[str], T], accepted: str) -> T:
    """One variable: `default` when unset or blank, else `convert` of its value; SettingsError (the value as
    written) when that fails. The launch profile reads MAX_CONCURRENCY with it too."""
    raw = value(env, name)
    if raw is None:
        return default
    try:
        return convert(raw)
    except ValueError:
        raise SettingsError(name, env[name], accepted) from None


def whole_in(low: int, high: int | None = None) -> Callable[[str], int]:
    """A converter for `read_setting`: a whole number from `low` to `high`."""
    def convert(raw: str) -> int:
        value = int(raw)
        if value < low or (high is not None and value > high):
            raise ValueError(raw)
        return value

    return convert


def _positive_seconds(raw: str) -> float:
    value = float(raw)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(raw)
    return value


def _seconds_or_zero(raw: str) -> float:
    value = float(raw)
    if not math.isfinite(value) or value < 0:
        raise ValueError(raw)
    return value


def _bool(raw: str) -> bool:
    word = bool_word(raw)
    if word is None:
        raise ValueError(raw)
    return word


def _one_of(choices: tuple[str, ...]) -> Callable[[str], str]:
    def convert(raw: str) -> str:
        if raw.lower() not in choices:
            raise ValueError(raw)
        return raw.lower()

    return convert


def _absolute_path(raw: str) -> str:
    if not raw.startswith("/"):
        raise ValueError(raw)
    return raw.rstrip("/") or "/"


def _command(raw: str) -> tuple[str, ...]:
    words = tuple(shlex.split(raw))
    if not words:
        raise ValueError(raw)
    return words


def load(env: Mapping[str, str]) -> Settings:
    """Parse and validate the worker's variables; raise SettingsError on the first bad one."""
    seconds = "a number of seconds greater than 0"
    return Settings(
        vllm_port=read_setting(env, "VLLM_PORT", 8000, whole_in(1, 65535), "a port number from 1 to 65535"),
        vllm_command=read_setting(
            env, "VLLM_COMMAND", ("vllm", "serve"), _command, "a command line such as 'vllm serve', with balanced quotes"
        ),
        startup_timeout=read_setting(env, "VLLM_STARTUP_TIMEOUT", 3600.0, _positive_seconds, seconds),
        request_timeout=read_setting(env, "REQUEST_TIMEOUT", 600.0, _positive_seconds, seconds),
        ready_timeout=read_setting(env, "WORKER_READY_TIMEOUT", 300.0, _positive_seconds, seconds),
        stop_grace=read_setting(env, "VLLM_STOP_GRACE", 10.0, _positive_seconds, seconds),
        gpu_memory_wait_timeout=read_setting(env, "GPU_MEMORY_WAIT_TIMEOUT", 300.0, _positive_seconds, seconds),
        log_tail_lines=read_setting(env, "ENGINE_LOG_TAIL_LINES", 400, whole_in(10, 100000), "a whole number from 10 to 100000"),
        gpu_memory_wait=read_setting(env, "GPU_MEMORY_WAIT", True, _bool, "true or false (also 1/0, yes/no, on/off)"),
        engine_device=read_setting(env, "ENGINE_DEVICE", "auto", _one_of(ENGINE_DEVICES), "one of " + ", ".join(ENGINE_DEVICES)),
        default_max_tokens=read_setting(
            env,
            "DEFAULT_MAX_TOKENS",
            None,
            whole_in(1),
            "a whole number greater than 0 (the max_tokens a prompt or messages job gets when it names none), "
            "or unset for up to the end of the context",
        ),
        hang_timeout=read_setting(env, "ENGINE_HANG_TIMEOUT", 60.0, _positive_seconds, seconds),
        base_path=read_setting(env, "BASE_PATH", "/runpod-volume", _absolute_path, "an absolute path such as /runpod-volume"),
        drain_timeout=read_setting(env, "DRAIN_TIMEOUT", 3.0, _seconds_or_zero, "a number of seconds, 0 or more"),
        refresh_limit=read_setting(env, "WORKER_REFRESH_LIMIT", 3, whole_in(0, 1000), "a whole number from 0 to 1000"),
        adaptive_concurrency=read_setting(env, "ADAPTIVE_CONCURRENCY", True, _bool, "true or false (also 1/0, yes/no, on/off)"),
        intake_buffer=read_setting(env, "INTAKE_BUFFER", None, whole_in(0, 64), "a whole number from 0 to 64, or unset"),
        vllm_command_set=value(env, "VLLM_COMMAND") is not None,
        startup_timeout_set=value(env, "VLLM_STARTUP_TIMEOUT") is not None,
    )
