"""Why the engine failed to start, in words a user can act on.

A user of the worker sees nothing but a job's error response, so when `vllm serve`
dies the worker turns the last few hundred lines of its output into one message: the
cause, the value that caused it, what the worker already tried and the fixes that
remain. vLLM's own last lines are secondary ("EngineCore failed to start.", "Engine core
initialization failed. See root cause above."): the root cause is an exception further
up, often printed twice, among INFO lines of a start that got far. `rules` holds
the wordings of every known cause (one table, many versions); the last specific match
names the cause, and a cause that lives only in vLLM's root exception (a driver, NCCL, a
missing library, unreadable model files) is read from that line alone.

`diagnose` returns None for a failure no rule knows; `explain` never does: it answers
with vLLM's own root exception and exit code, because a worker that exits on an unknown
failure is restarted by the platform into the same failure, the crash loop this project
exists to end.

The Hub-access sentences live in `hub`, shared with `preflight`, so a wrong
MODEL_NAME reads the same whether the pre-flight caught it or vLLM crashed on it.
"""

from __future__ import annotations

import re
from typing import Callable, Sequence

from vllm_worker.diagnosis import hub as hub_errors
from vllm_worker.diagnosis import refused_settings
from vllm_worker.diagnosis import rules as failure_rules
from vllm_worker.diagnosis.memory import memory_held_diagnosis, memory_shortfall_diagnosis, profiling_race_diagnosis
from vllm_worker.diagnosis.rules import Hit, clean_lines, find_hits, last_words, root_error, root_hit
from vllm_worker.diagnosis.verdict import Context, Diagnosis, Failure, Tried, answer, compose, evidence_of, scrubbed

# kind -> what it means. Every Diagnosis.kind of a failed start is one of these.
KINDS: dict[str, str] = {
    "memory_shortfall": "the model, context and batch do not fit in the device's memory",
    "memory_held": "another process holds device memory the engine needs (not a sizing problem)",
    "profiling_race": "device memory changed while vLLM was measuring it during start-up",
    "max_model_len_too_large": "MAX_MODEL_LEN is above the model's own limit",
    "bad_arguments": "vLLM rejected its command line or a flag's value",
    "tensor_parallel": "TENSOR_PARALLEL_SIZE does not fit the model's layout or the machine's GPUs",
    "dtype_unsupported": "the GPU cannot compute in the model's dtype",
    "quantization_unsupported": "the GPU or backend cannot run the checkpoint's quantization",
    "repo_not_found": "the Hub repository does not exist or is invisible to the token",
    "model_path_missing": "MODEL_NAME is a local path that does not exist in the container (nor a Hub repository id)",
    "offline_not_cached": "the Hub is switched off (HF_HUB_OFFLINE) and the model is not in the local cache",
    "hub_unreachable": "the Hub could not be reached and the model is not in the local cache",
    "gated_repo": "the Hub repository is gated and the token has no access",
    "revision_not_found": "the branch, tag or commit does not exist in the repository",
    "unauthorized": "the Hub refused the credentials",
    "unsupported_architecture": "vLLM 0.32 cannot run the model's architecture",
    "trust_remote_code": "the model needs its repository's own Python code",
    "disk_full": "the disk ran out of space",
    "model_files_broken": "the model's files are incomplete or unreadable",
    "missing_library": "a library of the engine's environment is missing or broken (an image problem)",
    "host_fault": "a fault of the machine's GPU, driver or interconnect, not of the settings",
    "engine_command": "VLLM_COMMAND cannot be started",
    "unknown": "a failure the worker has no rule for, answered with vLLM's own root error",
}

SUPPORTED_MODELS_URL = "https://docs.vllm.ai/en/latest/models/supported_models.html"


# --- entry points ---------------------------------------------------------------


def diagnose(failure: Failure) -> Diagnosis | None:
    """The root cause of a failed start, from the tail of the engine's output; None if no rule knows it."""
    lines = clean_lines(failure.output)
    hits = find_hits(lines)
    chosen: list[Hit] = [hit for hit in hits if not hit.rule.weak and hit.rule.tier == 0]
    chosen = chosen or [hit for hit in hits if hit.rule.tier == 1]
    if not chosen:
        root = root_error(lines)
        hit = root_hit(root) if root is not None else None
        if hit is None and root is None:
            # No exception at all: the last lines may still name a fault (an NCCL WARN, a driver message).
            hit = next((h for h in map(root_hit, reversed(last_words(lines, 5))) if h is not None), None)
        chosen = [hit] if hit is not None else hits
    if not chosen:
        return None
    kind = chosen[-1].rule.kind
    ctx = Context(
        lines=lines,
        hits=[hit for hit in chosen if hit.rule.kind == kind],
        model=failure.model or failure.profile.model,
        revision=failure.revision,
        exit_code=failure.exit_code,
        tried=failure.tried,
        weights_bytes=failure.weights_bytes,
        profile=failure.profile,
    )
    return scrubbed(_BUILDERS[kind](ctx), failure.profile.env)


def explain(failure: Failure) -> Diagnosis:
    """The one entry for a failed start: like `diagnose`, but never None (an unknown failure is
    answered with vLLM's own root error)."""
    diagnosis = diagnose(failure)
    if diagnosis is not None:
        return diagnosis
    return scrubbed(unknown_failure(failure.output, failure.exit_code, failure.tried), failure.profile.env)


def classify(failure: Failure) -> str | None:
    """The message for a failed start, or None when the cause is not recognised."""
    diagnosis = diagnose(failure)
    return diagnosis.message if diagnosis else None


def memory_shortfall(failure: Failure) -> bool:
    """Whether the start failed because the configuration does not fit in memory."""
    diagnosis = diagnose(failure)
    return diagnosis is not None and diagnosis.kind == "memory_shortfall"


def memory_held(failure: Failure) -> bool:
    """Whether the start failed because another process holds the memory it needs."""
    diagnosis = diagnose(failure)
    return diagnosis is not None and diagnosis.kind == "memory_held"


# --- what no rule knows, and the worker's own edges ----------------------------------------------


def _exit_phrase(exit_code: int | None) -> str:
    if exit_code is None:
        return ""
    if exit_code < 0:
        return f" (killed by signal {-exit_code})"
    return f" (exit code {exit_code})"


def unknown_failure(output: str, exit_code: int | None, tried: Sequence[Tried] = ()) -> Diagnosis:
    """vLLM failed for a reason no rule knows: its own root error, so the user still reads the cause."""
    lines = clean_lines(output)
    root = root_error(lines)
    if root is None:
        words = last_words(lines)
        if not words:
            cause = (
                f"vLLM exited{_exit_phrase(exit_code)} before printing anything, so it never started: "
                f"check that VLLM_COMMAND starts vLLM's OpenAI server (unset, it is 'vllm serve')"
            )
            return Diagnosis(
                kind="unknown",
                message=compose(cause, tried, []),
                evidence="",
                variable="VLLM_COMMAND",
                facts={"exit_code": str(exit_code)},
            )
        root = " | ".join(evidence_of(word) for word in words)
    cause = (
        f"vLLM failed to start: {evidence_of(root)}{_exit_phrase(exit_code)}. The worker does not know this "
        f"failure, so it did not relaunch the engine and answers every job with this"
    )
    fixes = [
        "if the error names a setting or the model, change that variable",
        "if it names the GPU, its driver or CUDA, terminate this worker so the platform starts a fresh one "
        "on another machine (the engine's full output is in the worker's log)",
    ]
    return Diagnosis(
        kind="unknown",
        message=compose(cause, tried, fixes),
        evidence=evidence_of(root),
        facts={"exit_code": str(exit_code)} if exit_code is not None else {},
    )


def engine_command_failure(command: Sequence[str], reason: str, configured: bool = True) -> Diagnosis:
    """The engine command could not be started at all (missing, not executable): no vLLM output to read.

    configured: VLLM_COMMAND was set; unset, the default `vllm serve` is missing from the image itself.
    """
    shown = " ".join(command)
    if configured:
        cause = f"The engine command VLLM_COMMAND={shown!r} cannot be started: {reason}"
        fixes = [
            "set VLLM_COMMAND to the command that runs vLLM's OpenAI server in this image (e.g. "
            "'/opt/venv/bin/vllm serve'), or unset it to use 'vllm serve'",
        ]
    else:
        cause = f"vLLM is not installed where the worker looks: the default engine command {shown!r} cannot be started: {reason}"
        fixes = ["run the worker's image, or set VLLM_COMMAND to the command that runs vLLM's OpenAI server"]
    return Diagnosis(
        kind="engine_command",
        message=compose(cause, (), fixes),
        evidence=reason,
        variable="VLLM_COMMAND",
        value=shown,
    )


# --- message builders ------------------------------------------------------------------------------


# --- model code ----------------------------------------------------------------------------


def _unsupported_architecture(ctx: Context) -> Diagnosis:
    hit = ctx.hits[-1]
    line = hit.line
    subject = ctx.subject
    m = re.search(r"Model architectures? \[?([^\]]+?)\]? (?:are|is) not supported for now", line)
    until = re.search(r"Model architecture (\S+) was supported in vLLM until (v[\w.]+)", line)
    plugin = re.search(r"Model architecture (\S+) is not supported in-tree anymore\. Please install the plugin at (\S+?) if", line)
    model_type = re.search(r"has model type `?([\w.-]+)`? but Transformers does not recognize", line, re.IGNORECASE)
    if model_type is None and "CONFIG_MAPPING" in line:
        # transformers' own lookup of config.json's model_type failed: the KeyError names it.
        model_type = ctx.search(r"KeyError: '([^']+)'")
    no_impl = re.search(r"(\S+) has no vLLM implementation", line)
    if hit.rule.detail == "weight_names":
        return _weight_names(ctx)
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
        value = m.group(1).replace("'", "") if m else no_impl.group(1) if no_impl else "(unknown)"
        cause = f"{subject} uses the architecture {value}, which vLLM 0.32 does not support"
        fixes = [f"choose a model with a supported architecture ({SUPPORTED_MODELS_URL})"]
    return answer(ctx, "unsupported_architecture", cause,
        [f"set MODEL_NAME to another model: {fixes[0][0].lower()}{fixes[0][1:]}"], line=line, variable="MODEL_NAME",
        value=value)


def _weight_names(ctx: Context) -> Diagnosis:
    """A checkpoint tensor vLLM's implementation has no parameter for (a KeyError in load_weights)."""
    line = ctx.hits[-1].line
    name = re.search(r"KeyError: '([^']+)'|parameter named '?([\w.-]+?)'? in (\w+)", line)
    tensor = (name.group(1) or name.group(2)) if name else "(unknown)"
    resolved = ctx.search(r"Resolved architecture: (\w+)") or ctx.search(r"architectures?=\[?'(\w+)'")
    module = ctx.search(r"models/(\w+)\.py\"?, line \d+, in load_weights")
    architecture = resolved.group(1) if resolved else (name.group(3) if name and name.group(3) else None)
    what = architecture or (f"its {module.group(1)} implementation" if module else "its architecture")
    cause = (
        f"{ctx.subject}'s checkpoint holds a weight named {tensor!r} that vLLM 0.32's loader for {what} does not "
        f"know: the checkpoint's layout (a quantization's extra tensors, or keys saved by another library version) is "
        f"not the one this vLLM release loads"
    )
    fixes = [
        "run a vLLM release that supports this checkpoint (the model card names the version it was tested with)",
        "or set MODEL_REVISION to a revision saved in the layout vLLM loads, or MODEL_NAME to another checkpoint of "
        "the same model (the original, or one quantized with a method vLLM 0.32 lists)",
    ]
    return answer(ctx, "unsupported_architecture", cause, fixes, line=line, variable="MODEL_NAME",
                  value=architecture or tensor, detail="weight_names")


def _trust_remote_code(ctx: Context) -> Diagnosis:
    hit = ctx.hits[-1]
    subject = ctx.subject
    part = "tokenizer" if ctx.search(r"Failed to load the tokenizer") else (
        "processor" if ctx.search(r"Failed to load the processor") else "model"
    )
    already = ctx.profile.trust_remote_code is True
    if already:
        cause = (
            f"{subject} needs its repository's own Python code for its {part}, and it could not be loaded "
            f"although TRUST_REMOTE_CODE is true"
        )
        fixes = ["check that the repository's code works with the Transformers version in this image, or choose another model"]
    else:
        cause = f"{subject} needs to run its repository's own Python code for its {part}, which the worker does not allow by default"
        fixes = ["set TRUST_REMOTE_CODE=true if you trust that code"]
    return answer(ctx, "trust_remote_code", cause, fixes, line=hit.line, variable="TRUST_REMOTE_CODE",
        value=ctx.profile.written("TRUST_REMOTE_CODE"))


def _disk_full(ctx: Context) -> Diagnosis:
    hit = ctx.hits[-1]
    m = re.search(r"No space left on device: '([^']+)'", hit.line)
    where = f" (writing {m.group(1)})" if m else ""
    cause = f"The disk ran out of space while starting {ctx.subject if ctx.model else 'the model'}{where}"
    fixes = [
        "give the endpoint a larger container disk, or a network volume big enough for the model's files, "
        "or choose a smaller model"
    ]
    return answer(ctx, "disk_full", cause, fixes, line=hit.line, value=m.group(1) if m else None)

# snake_case words of vLLM's config that name a worker variable, most specific first.
# --- the Hub could not be reached, the model's files, the image, the machine -------------------------


def _root_of(ctx: Context) -> str:
    return evidence_of(ctx.hits[-1].line)


def _model_files_broken(ctx: Context) -> Diagnosis:
    subject = ctx.subject if ctx.model else "the model"
    cause = f"vLLM could not read the files of {subject}: {_root_of(ctx)}{_exit_phrase(ctx.exit_code)}"
    fixes = [
        "make MODEL_NAME (and MODEL_REVISION) point at a complete Hugging Face checkpoint (config.json, "
        "tokenizer files, safetensors weights)",
        "if a download was interrupted, delete the model's folder from the cache or network volume so it is "
        "downloaded again",
    ]
    if ctx.hits[-1].rule.detail == "chat_template":
        fixes.insert(0, "if CHAT_TEMPLATE is set, correct or unset it; otherwise set CHAT_TEMPLATE to a template that parses")
    return Diagnosis(
        kind="model_files_broken",
        message=compose(cause, ctx.tried, fixes),
        evidence=_root_of(ctx),
        variable="MODEL_NAME",
        value=ctx.model,
    )


def _missing_library(ctx: Context) -> Diagnosis:
    cause = (
        f"vLLM failed to start because a library of its Python environment is missing or broken: "
        f"{_root_of(ctx)}{_exit_phrase(ctx.exit_code)}. This is a problem of the image, not of the settings"
    )
    fixes = [
        "use the worker's published image unchanged; if VLLM_COMMAND points at your own vLLM installation or "
        "you built your own image, install the missing package there (vLLM 0.32 and its pinned dependencies)",
    ]
    if ctx.search(r"trust_remote_code|transformers_modules"):
        fixes.append("the model's own code imports it: choose a model that runs without extra packages")
    return Diagnosis(
        kind="missing_library",
        message=compose(cause, ctx.tried, fixes),
        evidence=_root_of(ctx),
        variable="VLLM_COMMAND",
    )


_HOST_WHAT = {
    "nccl": "the GPUs' communication library (NCCL)",
    "driver": "the GPU driver or CUDA setup of this machine",
    "device": "this machine's GPU",
    "arch": (
        "this GPU's support: the engine's compiled kernels (CUDA's or Triton's) cannot run on it, built for another "
        "architecture or by a CUDA newer than its driver"
    ),
    "cpu": "this machine's CPU: it lacks an instruction set the engine was built for",
}


def host_fault_words(detail: str | None) -> str:
    """The one wording of a fault of the machine, at start or while serving (`runtime`): which part failed."""
    return f"a fault in {_HOST_WHAT.get(detail or 'device', 'this machine')}, not in the settings"


def _host_fault(ctx: Context) -> Diagnosis:
    detail = ctx.hits[-1].rule.detail or "device"
    cause = f"vLLM failed to start because of {host_fault_words(detail)}: {_root_of(ctx)}{_exit_phrase(ctx.exit_code)}"
    fixes = [
        "terminate this worker (the endpoint's Workers tab) so the platform starts a fresh one, usually on "
        "another machine",
    ]
    if detail == "arch":
        fixes.append("choose a GPU type this image supports (the worker's image supports Ampere, Ada and Hopper cards)")
        fixes.append("if the card is one of those, allow only CUDA versions at least the image's in the endpoint's settings")
    if detail == "driver":
        fixes.append("if it happens on every machine, allow only CUDA versions this image supports in the endpoint's settings")
    if detail == "nccl" and ctx.profile.tensor_parallel_size > 1:
        fixes.append("if it persists with several GPUs, set NCCL_P2P_DISABLE=1 to avoid the GPU-to-GPU path that fails on some hosts")
    return Diagnosis(
        kind="host_fault",
        message=compose(cause, ctx.tried, fixes),
        evidence=_root_of(ctx),
        detail=detail,
    )


_BUILDERS: dict[str, Callable[[Context], Diagnosis]] = {
    "memory_shortfall": memory_shortfall_diagnosis,
    "memory_held": memory_held_diagnosis,
    "profiling_race": profiling_race_diagnosis,
    "max_model_len_too_large": refused_settings.max_model_len,
    "bad_arguments": refused_settings.bad_arguments,
    "tensor_parallel": refused_settings.tensor_parallel,
    "dtype_unsupported": refused_settings.dtype_unsupported,
    "quantization_unsupported": refused_settings.quantization_unsupported,
    "repo_not_found": hub_errors.repo_not_found,
    "model_path_missing": hub_errors.model_path_missing,
    "offline_not_cached": hub_errors.offline_not_cached,
    "hub_unreachable": hub_errors.hub_unreachable,
    "gated_repo": hub_errors.gated_repo,
    "revision_not_found": hub_errors.revision_not_found,
    "unauthorized": hub_errors.unauthorized,
    "unsupported_architecture": _unsupported_architecture,
    "trust_remote_code": _trust_remote_code,
    "disk_full": _disk_full,
    "model_files_broken": _model_files_broken,
    "missing_library": _missing_library,
    "host_fault": _host_fault,
}
# Every rule names a kind with a builder; "engine_command" and "unknown" are answered without rules.
assert failure_rules.KINDS_WITH_RULES <= set(_BUILDERS) and set(_BUILDERS) | {"engine_command", "unknown"} == set(KINDS)
