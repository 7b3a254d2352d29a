"""Why the engine failed to start, in words a user can act on.

A user of the worker sees nothing but a job's error response, so when `vllm serve`
dies the worker must turn the last few hundred lines of its output into one
message: the cause, the value that caused it, what the worker already tried and
the fixes that remain. vLLM's own last lines are secondary ("EngineCore failed to
start.", "Engine core initialization failed. See root cause above."): the root
cause is an exception further up, often printed twice, and a failure in the engine
core is surrounded by INFO lines of a start that got far (some of them mention
free memory, KV cache size or OOM). So every line is matched against wordings
taken from vLLM 0.32's sources (and the transformers / huggingface_hub / torch
texts it surfaces); the last specific match names the cause.

Anything not recognised is `None`: the platform restarts the worker, which may fix
a flaky host, and the caller reports vLLM's own last lines.

The Hub-access sentences are shared with `preflight`, so a wrong MODEL_NAME reads
the same whether the pre-flight caught it or vLLM crashed on it.
"""

from __future__ import annotations

import re
import shlex
import signal
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence
from urllib.parse import unquote

from vllm_worker.args_builder import ArgsError, parse_bool
from vllm_worker.settings import multiple_of_8_at_least

# kind -> what it means. Every Diagnosis.kind is one of these.
KINDS: dict[str, str] = {
    "memory_shortfall": "the model, context and batch do not fit in the device's memory",
    "memory_held": "another process holds device memory the engine needs (not a sizing problem)",
    "profiling_race": "device memory changed while vLLM was measuring it during start-up",
    "max_model_len_too_large": "MAX_MODEL_LEN is above the model's own limit",
    "bad_arguments": "vLLM rejected its command line or a flag's value",
    "repo_not_found": "the Hub repository does not exist or is invisible to the token",
    "model_path_missing": "MODEL_NAME is a local path that does not exist in the container (nor a Hub repository id)",
    "offline_not_cached": "the Hub is switched off (HF_HUB_OFFLINE) and the model is not in the local cache",
    "gated_repo": "the Hub repository is gated and the token has no access",
    "revision_not_found": "the branch, tag or commit does not exist in the repository",
    "unauthorized": "the Hub refused the credentials",
    "unsupported_architecture": "vLLM 0.32 cannot run the model's architecture",
    "trust_remote_code": "the model needs its repository's own Python code",
    "disk_full": "the disk ran out of space",
}

# A memory relaunch step lowers MAX_NUM_BATCHED_TOKENS to at most this (see `recovery`).
EAGER_MAX_BATCHED_TOKENS = 8192
# vLLM 0.32's default --gpu-memory-utilization (vllm/config/cache.py) and the most the
# worker ever advises: above it, CUDA context and fragmentation have no room left.
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92
HIGHEST_ADVISED_UTILIZATION = 0.95
DEFAULT_MAX_CONCURRENCY = 30

SUPPORTED_MODELS_URL = "https://docs.vllm.ai/en/latest/models/supported_models.html"

_EVIDENCE_CHARS = 400


@dataclass(frozen=True)
class Diagnosis:
    """The root cause of a failed start.

    kind: one of KINDS. message: what the job response says. evidence: the line that
    gave the cause away (vLLM's log prefix removed, shortened). detail: which wording,
    for memory shortfalls ("kv_too_small", "no_kv_memory", "auto_fit", "sampler_warmup",
    "weights_load", "out_of_memory", "cpu_kv_no_room", "cpu_kv_explicit", "cpu_out_of_memory").
    """

    kind: str
    message: str
    evidence: str
    detail: str | None = None
    estimated_max_len: int | None = None
    variable: str | None = None
    value: str | None = None
    repo: str | None = None
    revision: str | None = None
    facts: dict[str, str] = field(default_factory=dict)


# --- shared Hub-access sentences (also used by preflight) ---------------------


def repo_not_found_message(repo: str, variable: str = "MODEL_NAME") -> str:
    """The repository does not exist on the Hub (or is private and invisible to the token)."""
    return (
        f"{variable}={repo!r} was not found on the Hugging Face Hub: check the spelling "
        f"(owner/name, case-sensitive); if the repository is private, set HF_TOKEN to a token "
        f"of an account that can read it."
    )


def gated_repo_message(repo: str, variable: str = "MODEL_NAME", token_set: bool = False) -> str:
    """The repository is gated and the token (or its absence) does not grant access."""
    if token_set:
        fix = (
            f"the account of HF_TOKEN has not been granted access: accept the model's terms "
            f"at https://huggingface.co/{repo} with that account (approval can take a while), "
            f"or use a token of an account that has access"
        )
    else:
        fix = (
            f"HF_TOKEN is not set: accept the model's terms at https://huggingface.co/{repo} "
            f"and set HF_TOKEN to a read token of that account"
        )
    return f"{variable}={repo!r} is a gated repository and {fix}."


def revision_not_found_message(repo: str, revision: str, variable: str = "MODEL_REVISION") -> str:
    """The branch, tag or commit does not exist in the repository (e.g. lost to a force-push)."""
    return (
        f"{variable}={revision!r} does not exist in {repo!r}: set it to an existing branch, "
        f"tag or commit of that repository, or unset it to use the default branch."
    )


def unauthorized_message(repo: str, variable: str = "MODEL_NAME", token_set: bool = False) -> str:
    """The Hub refused the credentials (401)."""
    if token_set:
        return (
            f"The Hugging Face Hub rejected HF_TOKEN while fetching {variable}={repo!r}: the token "
            f"is invalid, expired or revoked; set HF_TOKEN to a valid read token."
        )
    return (
        f"The Hugging Face Hub refused anonymous access to {variable}={repo!r}: if the repository "
        f"is private or gated, set HF_TOKEN to a read token of an account that can read it; "
        f"otherwise check the name."
    )


# --- the model's files: a local path, or the Hub switched off (also for preflight) ---


def looks_like_path(reference: str) -> bool:
    """Whether MODEL_NAME reads as a filesystem path rather than an owner/name repository id."""
    return reference in (".", "..", "~") or reference.startswith(("/", "./", "../", "~/")) or reference.count("/") > 1


def model_path_missing_message(path: str, variable: str = "MODEL_NAME") -> str:
    """A local model path that is not there (vLLM then takes it for a Hub repository id and rejects it)."""
    return (
        f"{variable}={path!r} does not exist in this container, so vLLM cannot load the model from it: "
        f"if the model is on a network volume, attach the volume to the endpoint and point {variable} at "
        f"the model's directory under its mount point (/runpod-volume on Runpod Serverless); otherwise "
        f"correct the path, or set {variable} to a Hugging Face repository id such as 'Qwen/Qwen3-0.6B'."
    )


def invalid_model_name_message(value: str, variable: str = "MODEL_NAME") -> str:
    """Neither a directory in the container nor a well-formed Hub repository id."""
    return (
        f"{variable}={value!r} is neither a directory in this container nor a valid Hugging Face repository "
        f"id (owner/name, with letters, digits, '-', '_' and '.'): correct it."
    )


def offline_not_cached_message(
    repo: str,
    variable: str = "MODEL_NAME",
    offline: str = "HF_HUB_OFFLINE",
    offline_value: str = "1",
    revision: str | None = None,
) -> str:
    """The Hub is switched off and the repository (at that revision) is not in the local cache."""
    at = f" at revision {revision!r}" if revision else ""
    return (
        f"{variable}={repo!r}{at} is not in this container's Hugging Face cache, and {offline}={offline_value} "
        f"forbids downloading it: unset {offline} so the worker can download it from the Hub (and check the "
        f"name: the worker's Hub check is also skipped while offline), or bake the model into the image or "
        f"mount a volume whose Hugging Face cache (HF_HOME) already holds it."
    )


# --- knobs a memory relaunch can still turn (shared with `recovery`) -----------


def env_value(env: Mapping[str, str], name: str) -> str | None:
    """A variable's value, None when unset or blank."""
    value = env.get(name)
    if value is None or value.strip() == "":
        return None
    return value.strip()


def env_bool(env: Mapping[str, str], name: str) -> bool | None:
    """True/False for a boolean variable; None when unset, blank or unreadable."""
    try:
        return parse_bool(name, env.get(name))
    except ArgsError:
        return None


def env_int(env: Mapping[str, str], name: str) -> int | None:
    """A whole-number variable; None when unset, blank, unreadable or 0 (0 means unset)."""
    value = env_value(env, name)
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        return None
    return number if number != 0 else None


_GIB = 2**30
_KV_SIZE_FLAGS = ("--kv-cache-memory-bytes", "--kv-cache-memory")
_CPU_KV_SPACE = "VLLM_CPU_KVCACHE_SPACE"


@dataclass(frozen=True)
class KvCacheSize:
    """A KV cache size the user fixed: vLLM uses it as is, so no batch, graph or utilization
    setting changes how many tokens the cache holds.

    variable: KV_CACHE_MEMORY_BYTES, VLLM_EXTRA_ARGS (its --kv-cache-memory-bytes) or, on the CPU
    engine, VLLM_CPU_KVCACHE_SPACE (GiB; vLLM lets it win over the flag). value: as written;
    None when only vLLM's log said the size was explicit. size_bytes: None when unreadable.
    """

    variable: str
    value: str | None
    size_bytes: int | None

    @property
    def setting(self) -> str:
        if self.value is None:
            return self.variable
        if self.variable == _EXTRA_ARGS_NAME:
            return f"{self.value} in {_EXTRA_ARGS_NAME}"
        return f"{self.variable}={self.value}"

    @property
    def raise_fix(self) -> str:
        if self.variable == _EXTRA_ARGS_NAME:
            return f"raise the {self.value} in {_EXTRA_ARGS_NAME}"
        now = f" (now {self.value})" if self.value is not None else ""
        return f"raise {self.variable}{now}"


_EXTRA_ARGS_NAME = "VLLM_EXTRA_ARGS"


def _parse_bytes(text: str) -> int | None:
    from vllm_worker.capacity import parse_human_int

    try:
        return parse_human_int(text)
    except ValueError:
        return None


def explicit_kv_cache_size(env: Mapping[str, str], cpu: bool = False) -> KvCacheSize | None:
    """The KV cache size the launch fixed, if any (the last one vLLM reads wins)."""
    if cpu:
        space = env_value(env, _CPU_KV_SPACE)
        if space is not None:
            return KvCacheSize(_CPU_KV_SPACE, space, int(space) * _GIB if space.isdigit() else None)
    extra = env_value(env, _EXTRA_ARGS_NAME)
    if extra is not None:
        try:
            words = shlex.split(extra)
        except ValueError:
            words = extra.split()
        found: tuple[str, str] | None = None
        for i, word in enumerate(words):
            flag, eq, value = word.partition("=")
            if flag.replace("_", "-") in _KV_SIZE_FLAGS:
                if not eq:
                    value = words[i + 1] if i + 1 < len(words) else ""
                found = (flag, value)
        if found is not None:
            return KvCacheSize(_EXTRA_ARGS_NAME, f"{found[0]} {found[1]}", _parse_bytes(found[1]))
    value = env_value(env, "KV_CACHE_MEMORY_BYTES")
    if value is not None:
        return KvCacheSize("KV_CACHE_MEMORY_BYTES", value, _parse_bytes(value))
    return None


def size_text(size_bytes: int) -> str:
    """Bytes for a reader: '256 KiB', '64 MiB', '2.5 GiB'."""
    for unit, scale in (("GiB", _GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if size_bytes >= scale:
            return f"{round(size_bytes / scale, 2):g} {unit}"
    return f"{size_bytes} bytes"


def max_concurrency_of(env: Mapping[str, str]) -> int:
    """MAX_CONCURRENCY as the worker reads it (settings validated it before any launch)."""
    value = env_int(env, "MAX_CONCURRENCY")
    return value if value is not None and value > 0 else DEFAULT_MAX_CONCURRENCY


def effective_max_num_seqs(env: Mapping[str, str], max_concurrency: int) -> int:
    """MAX_NUM_SEQS the engine ran with: the variable, else the worker's default."""
    value = env_int(env, "MAX_NUM_SEQS")
    return value if value is not None else multiple_of_8_at_least(max_concurrency)


# --- matching -----------------------------------------------------------------

# "(EngineCore_DP0 pid=412) ERROR 11-29 15:35:30 [core.py:1510] " (vllm/logger.py _FORMAT)
_VLLM_PREFIX = re.compile(r"^\s*\([\w.:-]+ pid=\d+\) [A-Z]+ \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]*\] ?")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@dataclass(frozen=True)
class _Rule:
    kind: str
    pattern: re.Pattern[str]
    detail: str | None = None
    # Weak rules name a cause only when no specific wording is present (a 401 line is
    # also part of a gated-repo or missing-repo chain).
    weak: bool = False


def _rule(kind: str, pattern: str, detail: str | None = None, weak: bool = False) -> _Rule:
    return _Rule(kind, re.compile(pattern), detail, weak)


# Order matters only within one line: the first rule that matches a line names it.
_RULES: tuple[_Rule, ...] = (
    # memory held by another process (vllm/v1/worker/utils.py:741,762; cpu_worker.py:83).
    # The INFO line of a successful start reads "Free memory on device (x/y GiB) on startup."
    _rule("memory_held", r"Free memory on device \S+ \([\d.]+/[\d.]+ GiB\) on startup is less than"),
    _rule("memory_held", r"Available memory on node \S+ \([\d.]+/[\d.]+ GiB\) on startup is less than desired"),
    # profiling race (vllm/v1/worker/gpu_worker.py:719)
    _rule("profiling_race", r"Error in memory profiling\. Initial free memory"),
    # memory shortfall
    _rule("memory_shortfall", r"To serve at least one request with the model's max seq len", "kv_too_small"),
    _rule("memory_shortfall", r"No available memory for the cache blocks", "no_kv_memory"),
    _rule("memory_shortfall", r"Cannot auto-fit max_model_len", "auto_fit"),
    _rule("memory_shortfall", r"out of memory occurred when warming up (?:sampler|pooler)", "sampler_warmup"),
    _rule("memory_shortfall", r"Failed to load model - not enough GPU memory", "weights_load"),
    _rule(
        "memory_shortfall",
        r"on kv cache allocation is less than requested memory for kv \(-?[\d.]+/",
        "cpu_kv_no_room",
    ),
    _rule("memory_shortfall", r"on kv cache allocation is less than requested memory for kv", "cpu_kv_explicit"),
    _rule("memory_shortfall", r"DefaultCPUAllocator: can't allocate memory", "cpu_out_of_memory"),
    _rule("memory_shortfall", r"(?:CUDA|HIP) out of memory|CUDA error: out of memory|OutOfMemoryError", "out_of_memory"),
    # MAX_MODEL_LEN above the model's limit (vllm/config/model.py:2662)
    _rule("max_model_len_too_large", r"User-specified max_model_len \(\d+\) is greater than the derived max_model_len"),
    # command line (argparse exits 2) and pydantic field constraints
    _rule("bad_arguments", r"^vllm(?: [\w-]+)?: error: ", "argparse"),
    _rule("bad_arguments", r"^\s+Input should .*\[type=[\w.]+, input_value=", "field"),
    # Hub access (transformers/utils/hub.py, huggingface_hub/utils/_http.py)
    _rule("gated_repo", r"You are trying to access a gated repo|Cannot access gated repo for url|is a gated repository\. Make sure"),
    _rule("gated_repo", r"Access to model \S+ is restricted"),
    _rule("revision_not_found", r"is not a valid git identifier|Revision Not Found for url|RevisionNotFoundError"),
    _rule(
        "repo_not_found",
        r"is not a local folder and is not a valid model identifier|Repository Not Found for url"
        r"|is not a local folder or a valid repository name",
    ),
    # a local path that does not exist: vLLM 0.32 hands it to snapshot_download, whose repo-id
    # check rejects it (huggingface_hub/utils/_validators.py validate_repo_id)
    _rule(
        "model_path_missing",
        r"HFValidationError: (?:Repo id must be in the form 'repo_name' or 'namespace/repo_name'"
        r"|Repo id must use alphanumeric chars|Cannot have -- or \.\. in repo_id|Repo_id cannot end by '\.git')",
    ),
    # HF_HUB_OFFLINE=1 and no cached snapshot (huggingface_hub/_snapshot_download.py, file_download.py)
    _rule(
        "offline_not_cached",
        r"(?:Cannot find an appropriate cached snapshot folder for the specified revision on the local disk"
        r"|Cannot find the requested files in the disk cache) and outgoing traffic has been disabled",
    ),
    _rule("unauthorized", r"Invalid credentials in Authorization header"),
    _rule("unauthorized", r"401 Client Error|'401 Unauthorized'", weak=True),
    # architecture (vllm/model_executor/models/registry.py:1189,1197,1205; transformers configuration_auto.py:430)
    _rule("unsupported_architecture", r"Model architectures? .+ (?:are|is) not supported for now"),
    _rule("unsupported_architecture", r"Model architecture \S+ was supported in vLLM until"),
    _rule("unsupported_architecture", r"Model architecture \S+ is not supported in-tree anymore"),
    _rule("unsupported_architecture", r"has model type `[^`]+` but Transformers does not recognize this architecture"),
    # custom code (transformers/dynamic_module_utils.py:788; vllm/tokenizers/hf.py, processor.py, config.py)
    _rule(
        "trust_remote_code",
        r"contains custom code which must be executed|references custom code contained in"
        r"|Please (?:pass the argument|set the option) `trust_remote_code=True`"
        r"|consider setting `trust_remote_code=True`",
    ),
    # disk full (ENOSPC from Python or Rust I/O)
    _rule("disk_full", r"No space left on device|os error 28"),
)


@dataclass(frozen=True)
class _Hit:
    index: int
    line: str
    rule: _Rule
    match: re.Match[str]


@dataclass(frozen=True)
class _Context:
    lines: list[str]
    hits: list[_Hit]
    model: str | None
    revision: str | None
    exit_code: int | None
    env: Mapping[str, str]
    tried: tuple[str, ...]

    @property
    def subject(self) -> str:
        return f"MODEL_NAME={self.model!r}" if self.model else "The model"

    @property
    def token_set(self) -> bool:
        return env_value(self.env, "HF_TOKEN") is not None or env_value(self.env, "HUGGING_FACE_HUB_TOKEN") is not None

    def search(self, pattern: str) -> re.Match[str] | None:
        """The last match of `pattern` in the whole output."""
        found = None
        for found in re.finditer(pattern, "\n".join(self.lines)):
            pass
        return found


def _clean(line: str) -> str:
    return _VLLM_PREFIX.sub("", _ANSI.sub("", line)).rstrip()


def _evidence(line: str) -> str:
    line = line.strip()
    return line if len(line) <= _EVIDENCE_CHARS else line[: _EVIDENCE_CHARS - 3] + "..."


# --- entry points ---------------------------------------------------------------


def diagnose(
    output: str,
    model: str | None = None,
    *,
    revision: str | None = None,
    exit_code: int | None = None,
    env: Mapping[str, str] | None = None,
    tried: Sequence[str] = (),
) -> Diagnosis | None:
    """The root cause of a failed start, from the tail of the engine's output; None if unknown.

    `model`/`revision` are used when the output does not name the repository; `env` is
    the launch configuration that failed (it decides which fixes remain); `tried` lists
    what the worker already did, as phrases ("relaunched with MAX_NUM_SEQS=32").
    """
    env = dict(env or {})
    lines = [_clean(line) for line in output.splitlines()]
    hits: list[_Hit] = []
    for index, line in enumerate(lines):
        for rule in _RULES:
            match = rule.pattern.search(line)
            if match:
                hits.append(_Hit(index, line, rule, match))
                break
    strong = [hit for hit in hits if not hit.rule.weak]
    pool = strong or hits
    if not pool:
        return None
    kind = pool[-1].rule.kind
    ctx = _Context(
        lines=lines,
        hits=[hit for hit in hits if hit.rule.kind == kind],
        model=model or env_value(env, "MODEL_NAME"),
        revision=revision,
        exit_code=exit_code,
        env=env,
        tried=tuple(tried),
    )
    diagnosis = _BUILDERS[kind](ctx)
    return _scrubbed(diagnosis, env)


def classify(
    output: str,
    model: str | None = None,
    *,
    revision: str | None = None,
    exit_code: int | None = None,
    env: Mapping[str, str] | None = None,
    tried: Sequence[str] = (),
) -> str | None:
    """The message for a failed start, or None when the cause is not recognised."""
    diagnosis = diagnose(output, model, revision=revision, exit_code=exit_code, env=env, tried=tried)
    return diagnosis.message if diagnosis else None


def memory_shortfall(output: str) -> bool:
    """Whether the start failed because the configuration does not fit in memory."""
    diagnosis = diagnose(output)
    return diagnosis is not None and diagnosis.kind == "memory_shortfall"


def memory_held(output: str) -> bool:
    """Whether the start failed because another process holds the memory it needs."""
    diagnosis = diagnose(output)
    return diagnosis is not None and diagnosis.kind == "memory_held"


# --- message assembly -----------------------------------------------------------


def _tried_sentence(tried: Sequence[str]) -> str:
    return f" Already tried: {'; '.join(tried)}." if tried else ""


def _compose(cause: str, tried: Sequence[str], fixes: Sequence[str]) -> str:
    text = cause.rstrip(".") + "." + _tried_sentence(tried)
    if fixes:
        text += f" To fix: {'; or '.join(fixes)}."
    return text


def _gib(value: str) -> str:
    return f"{float(value):g}"


# What only the CPU engine prints: its config line, its KV sizing lines (cpu_worker.py:220-258),
# its KV capacity line and the platform choice (platforms/__init__.py). Not "CPU backend": vLLM's
# own GPU error texts say "(which also controls CPU memory on the CPU backend)".
_CPU_ENGINE = (
    r"(?m)device_config=cpu\b|GiB for KV cache on node \S+|Available memory on node \S+ \("
    r"|^CPU KV cache size: |Automatically detected platform cpu\."
)


def _device(ctx: _Context) -> str:
    cpu = any(hit.rule.detail and hit.rule.detail.startswith("cpu_") for hit in ctx.hits)
    return "CPU" if cpu or ctx.search(_CPU_ENGINE) else "GPU"


# --- memory shortfall -------------------------------------------------------------

_DETAIL_PRIORITY = (
    "kv_too_small",
    "auto_fit",
    "no_kv_memory",
    "sampler_warmup",
    "weights_load",
    "cpu_kv_explicit",
    "cpu_kv_no_room",
    "cpu_out_of_memory",
    "out_of_memory",
)


def _tried_mentions(tried: Sequence[str], variable: str) -> bool:
    return any(f"{variable}=" in phrase for phrase in tried)


def _knob_fixes(ctx: _Context, observed_seqs: int | None = None) -> list[str]:
    """The relaunch knobs (see `recovery`) that are still left to turn."""
    fixes: list[str] = []
    max_concurrency = max_concurrency_of(ctx.env)
    target = multiple_of_8_at_least(max_concurrency)
    seqs = effective_max_num_seqs(ctx.env, max_concurrency)
    if observed_seqs is not None and env_int(ctx.env, "MAX_NUM_SEQS") is None:
        seqs = observed_seqs
    if seqs > target and not _tried_mentions(ctx.tried, "MAX_NUM_SEQS"):
        fixes.append(f"set MAX_NUM_SEQS={target} (now {seqs}; MAX_CONCURRENCY={max_concurrency} needs no more)")
    if env_bool(ctx.env, "ENFORCE_EAGER") is not True and not _tried_mentions(ctx.tried, "ENFORCE_EAGER"):
        fixes.append("set ENFORCE_EAGER=true (no CUDA graphs: less memory, slower replies)")
    # Only a value above the cap: unset, vLLM's own default is 2048 on most cards, and 8192 would raise it.
    tokens = env_int(ctx.env, "MAX_NUM_BATCHED_TOKENS")
    if tokens is not None and tokens > EAGER_MAX_BATCHED_TOKENS and not _tried_mentions(ctx.tried, "MAX_NUM_BATCHED_TOKENS"):
        fixes.append(f"lower MAX_NUM_BATCHED_TOKENS to {EAGER_MAX_BATCHED_TOKENS} (now {tokens})")
    return fixes


def _utilization(env: Mapping[str, str]) -> float:
    value = env_value(env, "GPU_MEMORY_UTILIZATION")
    try:
        return float(value) if value is not None else DEFAULT_GPU_MEMORY_UTILIZATION
    except ValueError:
        return DEFAULT_GPU_MEMORY_UTILIZATION


def _raise_utilization_fix(env: Mapping[str, str]) -> list[str]:
    current = _utilization(env)
    if current < HIGHEST_ADVISED_UTILIZATION:
        return [f"raise GPU_MEMORY_UTILIZATION from {current:g} to {HIGHEST_ADVISED_UTILIZATION:g}"]
    return []


def _kv_dtype_fix(env: Mapping[str, str]) -> list[str]:
    value = (env_value(env, "KV_CACHE_DTYPE") or "auto").lower()
    if value == "auto":
        return ["set KV_CACHE_DTYPE=fp8 (halves KV-cache memory; check output quality)"]
    return []


def _hardware_fix(env: Mapping[str, str], device: str) -> str:
    if device == "CPU":
        return "use a machine with more memory or a smaller or quantized checkpoint"
    tp = env_int(env, "TENSOR_PARALLEL_SIZE") or 1
    more = f"more GPUs (TENSOR_PARALLEL_SIZE is {tp})" if tp > 1 else "several GPUs with TENSOR_PARALLEL_SIZE"
    return f"use a GPU with more memory, {more}, or a smaller or quantized checkpoint"


def _context_description(ctx: _Context, model_len: str | None) -> str:
    explicit = env_value(ctx.env, "MAX_MODEL_LEN")
    if explicit is not None and explicit not in ("0", "-1") and explicit.lower() != "auto":
        return f"MAX_MODEL_LEN={explicit}"
    if model_len:
        return f"the model's full context of {model_len} tokens (MAX_MODEL_LEN is not set)"
    return "the model's full context (MAX_MODEL_LEN is not set)"


def _gib_known(text: str) -> bool:
    """vLLM rounds GiB to 2 decimals: below 0.005 GiB it prints 0.0, which says nothing."""
    return float(text) > 0


def _memory_shortfall(ctx: _Context) -> Diagnosis:
    details = {hit.rule.detail for hit in ctx.hits}
    detail = next(d for d in _DETAIL_PRIORITY if d in details)
    hit = next(h for h in reversed(ctx.hits) if h.rule.detail == detail)
    device = _device(ctx)
    subject = ctx.subject
    facts: dict[str, str] = {"device": device}
    estimate: int | None = None
    fixes: list[str] = []
    hardware = True
    variable: str | None = "MODEL_NAME" if ctx.model else None
    value: str | None = ctx.model
    kv = explicit_kv_cache_size(ctx.env, cpu=device == "CPU")
    if kv is None and device == "CPU" and ctx.search(r"Explicitly set \([\d.]+/[\d.]+\) GiB for KV cache"):
        kv = KvCacheSize(f"KV_CACHE_MEMORY_BYTES or {_CPU_KV_SPACE}", None, None)
    if kv is not None:
        facts["kv_cache_variable"] = kv.variable
    kv_size = f" ({size_text(kv.size_bytes)})" if kv is not None and kv.size_bytes is not None else ""

    if detail == "kv_too_small":
        m = ctx.search(
            r"max seq len \((\d+)\), \(([\d.]+) GiB KV cache is needed, which is larger than the available "
            r"KV cache memory \(([\d.]+) GiB\)"
        )
        e = ctx.search(r"the estimated maximum model length is (\d+)")
        estimate = int(e.group(1)) if e and int(e.group(1)) > 0 else None
        model_len = m.group(1) if m else None
        where = _context_description(ctx, model_len)
        numbers = m is not None and _gib_known(m.group(2)) and _gib_known(m.group(3))
        if m:
            facts.update(max_model_len=m.group(1), needed_gib=m.group(2), available_gib=m.group(3))
        if kv is not None:
            # The size is the user's: memory, batch and graphs do not change it.
            need = (
                f"{_gib(m.group(2))} GiB of KV cache, more than the {_gib(m.group(3))} GiB it provides"
                if m and numbers
                else "more KV cache than that"
            )
            cause = (
                f"{subject} does not fit in the {device} KV cache set by {kv.setting}{kv_size} at {where}: "
                f"one full-length sequence needs {need}"
            )
            fixes.append(f"{kv.raise_fix} until a full-length sequence fits, or unset it so vLLM sizes the KV cache from the free memory")
            if estimate is not None:
                fixes.append(f"set MAX_MODEL_LEN <= {estimate}, about what {kv.setting} holds")
            variable, value, hardware = kv.variable, kv.value, False
        else:
            if m and numbers:
                need = (
                    f"{_gib(m.group(2))} GiB of KV cache, but only {_gib(m.group(3))} GiB is left after the "
                    f"weights and activations"
                )
            elif m or estimate is not None:
                need = "more KV cache than is left after the weights and activations"
            else:
                need = ""
            if need:
                cause = f"{subject} does not fit in {device} memory at {where}: one full-length sequence needs {need}"
            else:
                cause = f"{subject} does not fit in {device} memory at {where}: the KV cache cannot hold one full-length sequence"
            if estimate is not None:
                fixes.append(f"this {device} can serve about {estimate} tokens; set MAX_MODEL_LEN <= {estimate}")
        if estimate is None:
            if where.startswith("MAX_MODEL_LEN="):
                fixes.append(f"lower MAX_MODEL_LEN (now {where.split('=', 1)[1]})")
            else:
                fixes.append("set MAX_MODEL_LEN to a shorter context (or MAX_MODEL_LEN=auto to fit what the memory holds)")
        if kv is None:
            if device == "GPU":
                fixes += _knob_fixes(ctx)
            # On the CPU engine the same variable sets the share of the node's memory vLLM reserves.
            fixes += _raise_utilization_fix(ctx.env)
        fixes += _kv_dtype_fix(ctx.env)
    elif detail in ("no_kv_memory", "auto_fit"):
        how = " (MAX_MODEL_LEN=auto could not fit even one token)" if detail == "auto_fit" else ""
        if kv is not None:
            cause = (
                f"{subject} has no room for its KV cache{how}: the {device} KV cache size set by "
                f"{kv.setting}{kv_size} is too small to hold even one block"
            )
            fixes.append(f"{kv.raise_fix}, or unset it so vLLM sizes the KV cache from the free memory")
            variable, value, hardware = kv.variable, kv.value, False
        else:
            graphs = device == "GPU" and env_bool(ctx.env, "ENFORCE_EAGER") is not True
            cause = (
                f"{subject} leaves no {device} memory for the KV cache{how}: the weights, activations"
                f"{' and CUDA graphs' if graphs else ''} take the whole memory budget"
            )
            if device == "GPU":
                fixes += _knob_fixes(ctx)
            fixes += _raise_utilization_fix(ctx.env)
    elif detail == "sampler_warmup":
        m = ctx.search(r"warming up (?:sampler|pooler)(?: \(task=[^)]*\))? with (\d+) dummy requests")
        n = m.group(1) if m else str(effective_max_num_seqs(ctx.env, max_concurrency_of(ctx.env)))
        facts["sequences"] = n
        cause = (
            f"{subject} ran out of GPU memory while warming up the sampler for {n} sequences at once "
            f"(the memory left outside the KV cache is too small for that batch)"
        )
        fixes += _knob_fixes(ctx, int(n))
        fixes.append(_room_outside_kv_fix(ctx.env, kv))
    elif detail == "weights_load":
        m = ctx.search(r"Tried to allocate ([\d.]+ [KMG]iB)")
        tail = f" (tried to allocate {m.group(1)} more)" if m else ""
        cause = f"{subject} does not fit on this GPU: loading its weights ran out of GPU memory{tail}"
        # Graph and batch knobs act after loading: only a smaller checkpoint or more memory helps.
    elif detail == "cpu_kv_explicit":
        m = ctx.search(r"on kv cache allocation is less than requested memory for kv \(([\d.]+) GiB\)")
        a = ctx.search(r"Available memory on node \S+ \(([\d.]+)/([\d.]+) GiB\) on kv cache")
        want = f"{_gib(m.group(1))} GiB" if m else "the requested size"
        free = f" only {_gib(a.group(1))} GiB is available" if a else " there is not that much free memory"
        cause = f"The KV cache size set for the CPU backend ({want}) does not fit:{free}"
        if kv is not None and kv.value is not None:
            name = "--kv-cache-memory-bytes in VLLM_EXTRA_ARGS" if kv.variable == _EXTRA_ARGS_NAME else kv.variable
            fixes.append(f"lower {name} (now {kv.value})")
            variable, value = kv.variable, kv.value
        else:
            fixes.append("lower VLLM_CPU_KVCACHE_SPACE or KV_CACHE_MEMORY_BYTES")
    elif detail == "cpu_kv_no_room":
        cause = f"{subject} leaves no CPU memory for the KV cache: the weights took the whole memory reservation"
        fixes += _raise_utilization_fix(ctx.env)
    elif detail == "cpu_out_of_memory":
        m = ctx.search(r"you tried to allocate (\d+) bytes")
        tail = f" (an allocation of {int(m.group(1)) / 2**30:.1f} GiB failed)" if m else ""
        cause = f"{subject} ran out of CPU memory while starting{tail}"
        fixes += _kv_dtype_fix(ctx.env)
    else:
        m = ctx.search(r"Tried to allocate ([\d.]+ [KMG]iB)")
        tail = f" (tried to allocate {m.group(1)} more)" if m else ""
        cause = f"{subject} ran out of GPU memory while starting{tail}"
        fixes += _knob_fixes(ctx)
        if kv is not None:
            fixes.append(_room_outside_kv_fix(ctx.env, kv))
    if hardware:
        fixes.append(_hardware_fix(ctx.env, device))
    return Diagnosis(
        kind="memory_shortfall",
        message=_compose(cause, ctx.tried, fixes),
        evidence=_evidence(hit.line),
        detail=detail,
        estimated_max_len=estimate,
        variable=variable,
        value=value,
        facts=facts,
    )


def _room_outside_kv_fix(env: Mapping[str, str], kv: KvCacheSize | None) -> str:
    """More room for activations: with a fixed KV size only that size frees it, not the utilization."""
    if kv is not None:
        now = f" (now {kv.value})" if kv.value is not None else ""
        name = "--kv-cache-memory-bytes in VLLM_EXTRA_ARGS" if kv.variable == _EXTRA_ARGS_NAME else kv.variable
        return f"lower {name}{now} to leave more room outside the KV cache"
    current = _utilization(env)
    return f"lower GPU_MEMORY_UTILIZATION from {current:g} to {max(0.5, round(current - 0.05, 2)):g} to leave more room outside the KV cache"


# --- memory held / profiling race ---------------------------------------------------


def _memory_held(ctx: _Context) -> Diagnosis:
    hit = ctx.hits[-1]
    gpu = re.search(
        r"Free memory on device (\S+) \(([\d.]+)/([\d.]+) GiB\) on startup is less than .*?\(([\d.]+), ([\d.]+) GiB\)",
        hit.line,
    )
    cpu = re.search(
        r"Available memory on node (\S+) \(([\d.]+)/([\d.]+) GiB\) on startup is less than .*?\(([\d.]+), ([\d.]+) GiB\)",
        hit.line,
    )
    m = gpu or cpu
    where = ("GPU " + m.group(1) if gpu else "NUMA node " + m.group(1)) if m else "the device"
    facts: dict[str, str] = {}
    if m:
        facts = {"device": m.group(1), "free_gib": m.group(2), "total_gib": m.group(3), "needed_gib": m.group(5)}
        numbers = (
            f": only {_gib(m.group(2))} of {_gib(m.group(3))} GiB was free on {where} when vLLM started, "
            f"and it needs {_gib(m.group(5))} GiB"
        )
    else:
        numbers = f": {where} had less free memory than vLLM needs when it started"
    device = "machine" if cpu and not gpu else "GPU"
    cause = (
        f"Memory on this {device} is held by another process{numbers}. This is not a problem with the "
        f"model or its settings: typically a previous engine that has not exited yet, or another program "
        f"on the same {device}"
    )
    fixes = [
        f"if it persists, stop whatever else uses this {device}, or terminate this worker so the platform "
        f"starts a fresh one on another machine",
    ]
    return Diagnosis(
        kind="memory_held",
        message=_compose(cause, ctx.tried, fixes),
        evidence=_evidence(hit.line),
        facts=facts,
    )


def _profiling_race(ctx: _Context) -> Diagnosis:
    hit = ctx.hits[-1]
    m = re.search(r"Initial free memory ([\d.]+) GiB, current free memory ([\d.]+) GiB", hit.line)
    numbers = f" (free memory went from {_gib(m.group(1))} to {_gib(m.group(2))} GiB)" if m else ""
    cause = (
        f"GPU memory changed while vLLM was measuring it during start-up{numbers}: another process on the "
        f"same GPU released memory meanwhile. This is not a problem with the model or its settings"
    )
    fixes = ["make sure nothing else runs on this GPU, or terminate this worker so the platform starts a fresh one"]
    return Diagnosis(
        kind="profiling_race",
        message=_compose(cause, ctx.tried, fixes),
        evidence=_evidence(hit.line),
        facts={"initial_free_gib": m.group(1), "current_free_gib": m.group(2)} if m else {},
    )


# --- MAX_MODEL_LEN ----------------------------------------------------------------------


def _number(text: str) -> int | None:
    try:
        return int(float(text))
    except ValueError:
        return None


def _max_model_len(ctx: _Context) -> Diagnosis:
    hit = ctx.hits[-1]
    m = re.search(
        r"User-specified max_model_len \((\d+)\) is greater than the derived max_model_len "
        r"\((\w+)=([\d.]+|None) or model_max_length=([\d.]+|None)",
        hit.line,
    )
    # vLLM's own figure is what it rejected; the env may hold an alias or an extra-args override.
    value = (m.group(1) if m else None) or env_value(ctx.env, "MAX_MODEL_LEN")
    limits = [n for n in ((_number(m.group(3)), _number(m.group(4))) if m else ()) if n is not None]
    limit = max(limits) if limits else None
    if limit is not None and m:
        source = f"{m.group(2)} in its config.json"
        cause = f"MAX_MODEL_LEN={value} is longer than the {limit}-token context of {ctx.subject if ctx.model else 'the model'} ({source})"
        fixes = [f"set MAX_MODEL_LEN to {limit} or less, or unset it to use the model's full context"]
    else:
        cause = f"MAX_MODEL_LEN={value} is larger than the model's own limit"
        fixes = ["lower MAX_MODEL_LEN, or unset it to use the model's full context"]
    return Diagnosis(
        kind="max_model_len_too_large",
        message=_compose(cause, ctx.tried, fixes),
        evidence=_evidence(hit.line),
        variable="MAX_MODEL_LEN",
        value=value,
        facts={"limit": str(limit)} if limit is not None else {},
    )


# --- command line -------------------------------------------------------------------------

_EXTRA_ARGS = "VLLM_EXTRA_ARGS"


def _variable_for_flag(flag: str, env: Mapping[str, str]) -> str | None:
    """Which of the user's variables put `flag` on the command line, if one can tell."""
    name = flag.lstrip("-").replace("-", "_").upper()
    if name.startswith("NO_") and env_value(env, name[3:]) is not None:
        name = name[3:]
    if env_value(env, name) is not None:
        return name
    extra = env_value(env, _EXTRA_ARGS) or ""
    if re.search(rf"(?:^|\s){re.escape(flag)}(?:[=\s]|$)", extra):
        return _EXTRA_ARGS
    return None


def _bad_arguments(ctx: _Context) -> Diagnosis:
    hit = ctx.hits[-1]
    argparse = re.search(r"^vllm(?: [\w-]+)?: error: (.+)$", hit.line)
    if argparse:
        error = argparse.group(1).strip()
        unrecognized = re.match(r"unrecognized arguments: (.+)", error)
        if unrecognized:
            args = unrecognized.group(1)
            flags = [word for word in args.split() if word.startswith("-")]
            found = {_variable_for_flag(flag, ctx.env) for flag in flags}
            sources = sorted(name for name in found if name is not None)
            if not sources and env_value(ctx.env, _EXTRA_ARGS) is not None:
                sources = [_EXTRA_ARGS]
            where = " and ".join(sources) if sources else "the variable that sets them"
            cause = f"vLLM 0.32 does not recognize the argument(s) {args}"
            fixes = [f"remove or respell them in {where} (`vllm serve --help` lists the flags)"]
            variable, value = (sources[0] if sources else None), args
        else:
            flag_match = re.match(r"argument (\S+?)(?:/\S+)?: (.+)", error)
            if flag_match:
                flag = flag_match.group(1)
                found = _variable_for_flag(flag, ctx.env)
                variable = found or flag.lstrip("-").replace("-", "_").upper()
                value = env_value(ctx.env, variable)
                shown = f"{variable}={value!r}" if value is not None and variable != _EXTRA_ARGS else variable
                cause = f"vLLM rejected {shown} ({flag}: {flag_match.group(2)})"
                fixes = [f"correct {variable} or unset it" if found else f"correct the variable that sets {flag}"]
            else:
                variable, value = None, None
                cause = f"vLLM rejected its command line: {error}"
                fixes = ["correct the variable that produced it"]
        return Diagnosis(
            kind="bad_arguments",
            message=_compose(cause, ctx.tried, fixes),
            evidence=_evidence(hit.line),
            variable=variable,
            value=value,
        )
    # pydantic field constraint: "<field>\n  Input should ... [type=..., input_value=V, ...]"
    problems: list[str] = []
    first_variable: str | None = None
    first_value: str | None = None
    for h in ctx.hits:
        if h.rule.detail != "field":
            continue
        m = re.search(r"^\s+(Input should .*?) \[type=[\w.]+, input_value=(.*?), input_type=\w+\]", h.line)
        field_name = ctx.lines[h.index - 1].strip() if h.index > 0 else ""
        if not m or not re.fullmatch(r"[\w.]+", field_name):
            continue
        variable = field_name.split(".")[-1].upper()
        value = env_value(ctx.env, variable) or m.group(2)
        first_variable = first_variable or variable
        first_value = first_value or value
        problems.append(f"{variable}={value} ({m.group(1)[0].lower() + m.group(1)[1:]})")
    if problems:
        cause = f"vLLM rejected {' and '.join(problems)}"
        fixes = [f"correct {'them' if len(problems) > 1 else first_variable} or unset {'them' if len(problems) > 1 else 'it'}"]
    else:
        cause = f"vLLM rejected a setting: {_evidence(hit.line)}"
        fixes = ["correct the variable that sets it"]
    return Diagnosis(
        kind="bad_arguments",
        message=_compose(cause, ctx.tried, fixes),
        evidence=_evidence(hit.line),
        variable=first_variable,
        value=first_value,
    )


# --- Hub access -----------------------------------------------------------------------------

_URL_REPO = re.compile(r"https?://[^\s'\"]+?/(?:api/models/)?([\w.-]+/[\w.-]+)/(?:resolve|revision|tree)/([^/\s'\"]+)")


def _repo_from(ctx: _Context, patterns: Sequence[str]) -> str | None:
    for pattern in patterns:
        m = ctx.search(pattern)
        if m:
            return m.group(1).rstrip(".")
    m = ctx.search(_URL_REPO.pattern)
    return m.group(1) if m else None


def _repo_variable(ctx: _Context, repo: str) -> str:
    if repo != ctx.model:
        for name in ("TOKENIZER_NAME", "TOKENIZER"):
            if env_value(ctx.env, name) == repo:
                return name
    return "MODEL_NAME"


def _hub(ctx: _Context, kind: str, patterns: Sequence[str], sentence: Callable[[str, str], str]) -> Diagnosis:
    repo = _repo_from(ctx, patterns) or ctx.model or "(unknown)"
    variable = _repo_variable(ctx, repo)
    message = sentence(repo, variable) + _tried_sentence(ctx.tried)
    return Diagnosis(
        kind=kind,
        message=message,
        evidence=_evidence(ctx.hits[-1].line),
        variable=variable,
        value=repo,
        repo=repo,
    )


def _repo_not_found(ctx: _Context) -> Diagnosis:
    return _hub(
        ctx,
        "repo_not_found",
        [r"(\S+) is not a local folder and is not a valid model identifier", r"(\S+) is not a local folder or a valid repository name"],
        lambda repo, variable: repo_not_found_message(repo, variable),
    )


def _gated_repo(ctx: _Context) -> Diagnosis:
    return _hub(
        ctx,
        "gated_repo",
        [r"Access to model (\S+) is restricted", r"access to it at https?://huggingface\.co/([^\s'\"]+)", r"(\S+) is a gated repository"],
        lambda repo, variable: gated_repo_message(repo, variable, ctx.token_set),
    )


_MODEL_VARIABLES = ("MODEL_NAME", "BAKED_MODEL_PATH", "TOKENIZER_NAME", "TOKENIZER")


def _model_variable(ctx: _Context, reference: str) -> str:
    """Which variable holds `reference` (the model unless it is the tokenizer's or the baked path)."""
    return next((name for name in _MODEL_VARIABLES if env_value(ctx.env, name) == reference), "MODEL_NAME")


def _model_path_missing(ctx: _Context) -> Diagnosis:
    hit = ctx.hits[-1]
    m = re.search(r"'([^']*)'\.?(?: Use `repo_type` argument if needed\.)?\s*$", hit.line)
    reference = m.group(1) if m else ctx.model or "(unknown)"
    variable = _model_variable(ctx, reference)
    if looks_like_path(reference):
        message = model_path_missing_message(reference, variable)
    else:
        message = invalid_model_name_message(reference, variable)
    return Diagnosis(
        kind="model_path_missing",
        message=message + _tried_sentence(ctx.tried),
        evidence=_evidence(hit.line),
        variable=variable,
        value=reference,
    )


_OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def _offline_not_cached(ctx: _Context) -> Diagnosis:
    hit = ctx.hits[-1]
    # huggingface_hub does not name the repository; vLLM's "non-default args" line does.
    said = ctx.search(r"non-default args: \{.*?'model': '([^']+)'")
    repo = ctx.model or (said.group(1) if said else None) or "(unknown)"
    variable = _model_variable(ctx, repo)
    offline = next((name for name in _OFFLINE_VARIABLES if env_bool(ctx.env, name) is True), None)
    offline_value = env_value(ctx.env, offline) if offline else None
    revision = env_value(ctx.env, "MODEL_REVISION") if variable == "MODEL_NAME" else None
    message = offline_not_cached_message(
        repo, variable, offline or "HF_HUB_OFFLINE", offline_value or "1", revision=revision
    )
    return Diagnosis(
        kind="offline_not_cached",
        message=message + _tried_sentence(ctx.tried),
        evidence=_evidence(hit.line),
        variable=offline or "HF_HUB_OFFLINE",
        value=offline_value,
        repo=repo,
        revision=revision,
    )


def _unauthorized(ctx: _Context) -> Diagnosis:
    return _hub(
        ctx,
        "unauthorized",
        [r"error when trying to load (\S+?):?$"],
        lambda repo, variable: unauthorized_message(repo, variable, ctx.token_set),
    )


_REVISION_VARIABLES = ("MODEL_REVISION", "REVISION", "TOKENIZER_REVISION", "CODE_REVISION")


def _revision_not_found(ctx: _Context) -> Diagnosis:
    said = ctx.search(r"(\S+) is not a valid git identifier .*?huggingface\.co/([^'\s]+)'")
    url = ctx.search(_URL_REPO.pattern)
    repo = (said.group(2) if said else None) or (url.group(1) if url else None) or ctx.model or "(unknown)"
    revision = (said.group(1) if said else None) or (unquote(url.group(2)) if url else None) or ctx.revision or "(unknown)"
    variable = next((name for name in _REVISION_VARIABLES if env_value(ctx.env, name) == revision), None)
    if variable is None:
        variable = next((name for name in _REVISION_VARIABLES if env_value(ctx.env, name) is not None), None)
    if variable is not None:
        message = revision_not_found_message(repo, revision, variable) + _tried_sentence(ctx.tried)
    else:
        # No revision was pinned: vLLM resolved the default branch to a commit that vanished meanwhile.
        message = _compose(
            f"Revision {revision!r} of {repo!r} disappeared while vLLM was fetching it (the repository was "
            f"probably force-pushed while the worker started)",
            ctx.tried,
            ["restart the worker to fetch the current revision, or pin MODEL_REVISION to a commit that stays"],
        )
    return Diagnosis(
        kind="revision_not_found",
        message=message,
        evidence=_evidence(ctx.hits[-1].line),
        variable=variable,
        value=revision,
        repo=repo,
        revision=revision,
    )


# --- model code ----------------------------------------------------------------------------


def _unsupported_architecture(ctx: _Context) -> Diagnosis:
    hit = ctx.hits[-1]
    line = hit.line
    subject = ctx.subject
    m = re.search(r"Model architectures? \[?([^\]]+?)\]? (?:are|is) not supported for now", line)
    until = re.search(r"Model architecture (\S+) was supported in vLLM until (v[\w.]+)", line)
    plugin = re.search(r"Model architecture (\S+) is not supported in-tree anymore\. Please install the plugin at (\S+?) if", line)
    model_type = re.search(r"has model type `([^`]+)` but Transformers does not recognize", line)
    if until:
        value = until.group(1)
        cause = f"{subject} uses the architecture {value}, which vLLM removed after {until.group(2)}"
        fixes = [f"choose a model with an architecture vLLM 0.32 supports ({SUPPORTED_MODELS_URL})"]
    elif plugin:
        value = plugin.group(1)
        cause = f"{subject} uses the architecture {value}, which vLLM 0.32 runs only through a plugin ({plugin.group(2)})"
        fixes = [f"choose a model with an architecture vLLM 0.32 supports in-tree ({SUPPORTED_MODELS_URL})"]
    elif model_type:
        value = model_type.group(1)
        cause = (
            f"{subject} has the model type {value!r}, which the Transformers library in this image does not "
            f"know (the checkpoint is newer than this image, or its config.json is broken)"
        )
        fixes = [f"choose a model with an architecture vLLM 0.32 supports ({SUPPORTED_MODELS_URL})"]
    else:
        value = m.group(1).replace("'", "") if m else "(unknown)"
        cause = f"{subject} uses the architecture {value}, which vLLM 0.32 does not support"
        fixes = [f"choose a model with a supported architecture ({SUPPORTED_MODELS_URL})"]
    return Diagnosis(
        kind="unsupported_architecture",
        message=_compose(cause, ctx.tried, fixes),
        evidence=_evidence(line),
        variable="MODEL_NAME" if ctx.model else None,
        value=value,
    )


def _trust_remote_code(ctx: _Context) -> Diagnosis:
    hit = ctx.hits[-1]
    subject = ctx.subject
    part = "tokenizer" if ctx.search(r"Failed to load the tokenizer") else "processor" if ctx.search(r"Failed to load the processor") else "model"
    already = env_bool(ctx.env, "TRUST_REMOTE_CODE") is True
    if already:
        cause = (
            f"{subject} needs its repository's own Python code for its {part}, and it could not be loaded "
            f"although TRUST_REMOTE_CODE is true"
        )
        fixes = ["check that the repository's code works with the Transformers version in this image, or choose another model"]
    else:
        cause = f"{subject} needs to run its repository's own Python code for its {part}, which the worker does not allow by default"
        fixes = ["set TRUST_REMOTE_CODE=true if you trust that code"]
    return Diagnosis(
        kind="trust_remote_code",
        message=_compose(cause, ctx.tried, fixes),
        evidence=_evidence(hit.line),
        variable="TRUST_REMOTE_CODE",
        value=env_value(ctx.env, "TRUST_REMOTE_CODE"),
    )


def _disk_full(ctx: _Context) -> Diagnosis:
    hit = ctx.hits[-1]
    m = re.search(r"No space left on device: '([^']+)'", hit.line)
    where = f" (writing {m.group(1)})" if m else ""
    cause = f"The disk ran out of space while starting {ctx.subject if ctx.model else 'the model'}{where}"
    fixes = [
        "give the endpoint a larger container disk, or a network volume big enough for the model's files, "
        "or choose a smaller model"
    ]
    return Diagnosis(
        kind="disk_full",
        message=_compose(cause, ctx.tried, fixes),
        evidence=_evidence(hit.line),
        value=m.group(1) if m else None,
    )


_BUILDERS: dict[str, Callable[[_Context], Diagnosis]] = {
    "memory_shortfall": _memory_shortfall,
    "memory_held": _memory_held,
    "profiling_race": _profiling_race,
    "max_model_len_too_large": _max_model_len,
    "bad_arguments": _bad_arguments,
    "repo_not_found": _repo_not_found,
    "model_path_missing": _model_path_missing,
    "offline_not_cached": _offline_not_cached,
    "gated_repo": _gated_repo,
    "revision_not_found": _revision_not_found,
    "unauthorized": _unauthorized,
    "unsupported_architecture": _unsupported_architecture,
    "trust_remote_code": _trust_remote_code,
    "disk_full": _disk_full,
}
assert set(_BUILDERS) == set(KINDS)


# --- the engine died while serving ------------------------------------------------------------

# Why an engine that had started and served stopped. Not startup kinds: `recovery`'s ladder never sees these.
RUNTIME_KINDS: dict[str, str] = {
    "runtime_oom": "the engine started fine and then ran out of memory on a request",
    "engine_died": "the engine stopped while serving, for a reason other than memory",
}

# vLLM logs this once its API server listens (vllm/entrypoints/openai/api_server.py); what
# follows it in the tail happened while serving.
SERVING_MARKER = "Starting vLLM server on"
# vllm/v1/engine/exceptions.py:16, EngineDeadError: in-flight requests are answered with it.
ENGINE_DEAD_TEXT = "EngineCore encountered an issue"

_RUNTIME_OOM_GPU = re.compile(r"(?:CUDA|HIP) out of memory|CUDA error: out of memory|OutOfMemoryError")
_RUNTIME_OOM_CPU = re.compile(r"DefaultCPUAllocator: can't allocate memory")
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception)(?::|$)")


def _serving_lines(output: str) -> list[str]:
    lines = [_clean(line) for line in output.splitlines()]
    starts = [i for i, line in enumerate(lines) if SERVING_MARKER in line]
    return lines[starts[-1] + 1 :] if starts else lines


def _how_it_stopped(exit_code: int | None) -> str:
    if exit_code is None:
        return "reported itself dead (its /health answered 503, EngineDeadError)"
    if exit_code < 0:
        try:
            name = f" ({signal.Signals(-exit_code).name})"
        except ValueError:
            name = ""
        return f"was killed by signal {-exit_code}{name}"
    return f"exited with code {exit_code}"


def _root_line(lines: Sequence[str]) -> str | None:
    """vLLM's last exception line that is not the EngineDeadError every request gets."""
    for line in reversed(lines):
        text = line.strip()
        if _EXCEPTION_LINE.match(text) and ENGINE_DEAD_TEXT not in text:
            return text
    return None


def _runtime_oom_fixes(output: str, env: Mapping[str, str]) -> list[str]:
    fixes: list[str] = []
    tokens = env_int(env, "MAX_NUM_BATCHED_TOKENS")
    if tokens is None or tokens <= 0:
        chosen = re.findall(r"max_num_batched_tokens=(\d+)", output)
        tokens = int(chosen[-1]) if chosen else None
        where = "vLLM's choice" if tokens else None
    else:
        where = "set"
    if tokens:
        fixes.append(
            f"lower MAX_NUM_BATCHED_TOKENS (now {tokens}, {where}), e.g. to {max(256, tokens // 2)}, "
            f"to cap the prompt tokens processed in one step"
        )
    else:
        fixes.append("set MAX_NUM_BATCHED_TOKENS (e.g. 2048) to cap the prompt tokens processed in one step")
    length = env_value(env, "MAX_MODEL_LEN")
    if length is None or not length.isdigit() or int(length) <= 0:
        used = re.findall(r"Using max model len (\d+)", output)
        length = used[-1] if used else None
    context = f"the {length}-token context the engine accepts" if length else "the context the engine accepts"
    fixes.append(f"cap the prompt length your clients send, well below {context}")
    max_concurrency = max_concurrency_of(env)
    seqs = effective_max_num_seqs(env, max_concurrency)
    fixes.append(f"lower MAX_NUM_SEQS (now {seqs}) so fewer sequences share one step")
    return fixes


def runtime_failure(output: str, env: Mapping[str, str] | None = None, *, exit_code: int | None = None) -> Diagnosis:
    """Why an engine that was serving stopped, from the tail of its output.

    exit_code: the engine process's status (negative: the signal that killed it), or None when
    the process is alive but vLLM's /health answers 503. A memory failure after a good start is
    "runtime_oom", with the limits that bound one step's memory; anything else is "engine_died",
    naming how it stopped and vLLM's last exception line.
    """
    env = dict(env or {})
    lines = _serving_lines(output)
    text = "\n".join(lines)
    how = _how_it_stopped(exit_code)
    cpu = next((line for line in reversed(lines) if _RUNTIME_OOM_CPU.search(line)), None)
    gpu = next((line for line in reversed(lines) if _RUNTIME_OOM_GPU.search(line)), None)
    oom = cpu or gpu
    if oom is not None:
        device = "CPU" if cpu else "GPU"
        m = re.search(r"Tried to allocate ([\d.]+ [KMG]iB)", text)
        b = re.search(r"you tried to allocate (\d+) bytes", text)
        asked = f" (one allocation of {m.group(1)} failed)" if m else ""
        if not m and b:
            asked = f" (one allocation of {int(b.group(1)) / 2**30:.1f} GiB failed)"
        cause = (
            f"The engine ran out of {device} memory while serving requests{asked} and stopped. It had started "
            f"and served with these settings, so the KV cache is not the problem: one step needed more memory "
            f"than was left outside it, typically for a very long prompt or many prompts prefilled at once"
        )
        diagnosis = Diagnosis(
            kind="runtime_oom",
            message=_compose(cause, (), _runtime_oom_fixes(output, env)),
            evidence=_evidence(oom),
            facts={"device": device},
        )
    else:
        root = _root_line(lines)
        last = f"; its last error was: {_evidence(root)}" if root else ""
        cause = f"The engine {how} while serving requests{last}"
        diagnosis = Diagnosis(kind="engine_died", message=cause.rstrip(".") + ".", evidence=_evidence(root or ""))
    if exit_code is not None:
        diagnosis.facts["exit_code"] = str(exit_code)
    return _scrubbed(diagnosis, env)


# --- secrets ---------------------------------------------------------------------------------

# HF_TOKEN, *_API_KEY, ...; not MAX_NUM_BATCHED_TOKENS or TOKENIZER_NAME.
_SECRET_NAMES = re.compile(r"(?:^|_)(?:TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIALS?)(?:_|$)", re.IGNORECASE)
_MIN_SECRET_CHARS = 8


def _scrubbed(diagnosis: Diagnosis, env: Mapping[str, str]) -> Diagnosis:
    """The diagnosis with any secret value from the environment masked (argparse echoes arguments)."""
    secrets = sorted(
        {v.strip() for k, v in env.items() if _SECRET_NAMES.search(k) and v and len(v.strip()) >= _MIN_SECRET_CHARS},
        key=len,
        reverse=True,
    )
    if not secrets:
        return diagnosis

    def clean(text: str | None) -> str | None:
        if text is None:
            return None
        for secret in secrets:
            text = text.replace(secret, "***")
        return text

    return Diagnosis(
        kind=diagnosis.kind,
        message=clean(diagnosis.message) or "",
        evidence=clean(diagnosis.evidence) or "",
        detail=diagnosis.detail,
        estimated_max_len=diagnosis.estimated_max_len,
        variable=diagnosis.variable,
        value=clean(diagnosis.value),
        repo=diagnosis.repo,
        revision=diagnosis.revision,
        facts=dict(diagnosis.facts),
    )
