"""Why the engine failed to start, in words a user can act on.

A user of the worker sees nothing but a job's error response, so when `vllm serve`
dies the worker turns the last few hundred lines of its output into one message: the
cause, the value that caused it, what the worker already tried and the fixes that
remain. vLLM's own last lines are secondary ("EngineCore failed to start.", "Engine core
initialization failed. See root cause above."): the root cause is an exception further
up, often printed twice, among INFO lines of a start that got far. `failure_rules` holds
the wordings of every known cause (one table, many versions); the last specific match
names the cause, and a cause that lives only in vLLM's root exception (a driver, NCCL, a
missing library, unreadable model files) is read from that line alone.

`diagnose` returns None for a failure no rule knows; `explain` never does: it answers
with vLLM's own root exception and exit code, because a worker that exits on an unknown
failure is restarted by the platform into the same failure, the crash loop this project
exists to end.

The Hub-access sentences live in `hub_messages`, shared with `preflight`, so a wrong
MODEL_NAME reads the same whether the pre-flight caught it or vLLM crashed on it.
"""

from __future__ import annotations

import re
from typing import Callable, Mapping, Sequence
from urllib.parse import unquote

from vllm_worker import args_builder, failure_rules, flag_messages
from vllm_worker.diagnosis import (  # noqa: F401  (re-exported for recovery, capacity and tests)
    DEFAULT_GPU_MEMORY_UTILIZATION,
    DEFAULT_MAX_CONCURRENCY,
    EAGER_MAX_BATCHED_TOKENS,
    HIGHEST_ADVISED_UTILIZATION,
    TRANSIENT_KINDS,
    Context,
    Diagnosis,
    KvCacheSize,
    LaunchProfile,
    compose,
    env_value,
    evidence_of,
    scrubbed,
    size_text,
    tried_sentence,
)
from vllm_worker.failure_rules import Hit, clean_lines, find_hits, last_words, root_error, root_hit
from vllm_worker.hub_messages import (  # noqa: F401  (re-exported: one sentence per cause)
    gated_repo_message,
    hub_unreachable_message,
    invalid_model_name_message,
    looks_like_path,
    model_path_missing_message,
    offline_not_cached_message,
    repo_not_found_message,
    revision_not_found_message,
    unauthorized_message,
)
from vllm_worker.runtime_errors import ENGINE_DEAD_TEXT, RUNTIME_KINDS, SERVING_MARKER, runtime_failure  # noqa: F401
from vllm_worker.shortfall import memory_held_diagnosis, memory_shortfall_diagnosis, profiling_race_diagnosis

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


def diagnose(
    output: str,
    model: str | None = None,
    *,
    revision: str | None = None,
    exit_code: int | None = None,
    env: Mapping[str, str] | None = None,
    tried: Sequence[str] = (),
    weights_bytes: int | None = None,
) -> Diagnosis | None:
    """The root cause of a failed start, from the tail of the engine's output; None if no rule knows it.

    `model`/`revision` are used when the output does not name the repository; `env` is
    the launch configuration that failed (it decides which fixes remain); `tried` lists
    what the worker already did, as phrases ("relaunched with MAX_NUM_SEQS=32");
    `weights_bytes`: the checkpoint's size when the capacity plan knows it.
    """
    env = dict(env or {})
    lines = clean_lines(output)
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
        model=model or env_value(env, "MODEL_NAME"),
        revision=revision,
        exit_code=exit_code,
        env=env,
        tried=tuple(tried),
        weights_bytes=weights_bytes,
        profile=LaunchProfile.parse(env),
    )
    return scrubbed(_BUILDERS[kind](ctx), env)


def explain(
    output: str,
    model: str | None = None,
    *,
    revision: str | None = None,
    exit_code: int | None = None,
    env: Mapping[str, str] | None = None,
    tried: Sequence[str] = (),
    weights_bytes: int | None = None,
) -> Diagnosis:
    """Like `diagnose`, but never None: an unknown failure is answered with vLLM's root error."""
    diagnosis = diagnose(
        output, model, revision=revision, exit_code=exit_code, env=env, tried=tried, weights_bytes=weights_bytes
    )
    if diagnosis is not None:
        return diagnosis
    return scrubbed(unknown_failure(output, exit_code, tried), dict(env or {}))


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


# --- what no rule knows, and the worker's own edges ----------------------------------------------


def _exit_phrase(exit_code: int | None) -> str:
    if exit_code is None:
        return ""
    if exit_code < 0:
        return f" (killed by signal {-exit_code})"
    return f" (exit code {exit_code})"


def unknown_failure(output: str, exit_code: int | None, tried: Sequence[str] = ()) -> Diagnosis:
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


# --- MAX_MODEL_LEN ----------------------------------------------------------------------


def _number(text: str) -> int | None:
    try:
        return int(float(text))
    except ValueError:
        return None


def _max_model_len(ctx: Context) -> Diagnosis:
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
        message=compose(cause, ctx.tried, fixes),
        evidence=evidence_of(hit.line),
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


def _bad_arguments(ctx: Context) -> Diagnosis:
    # argparse's line names the flag; a pydantic line after it only explains the value.
    hit = next((h for h in reversed(ctx.hits) if h.rule.detail == "argparse"), ctx.hits[-1])
    argparse = re.search(r"^(?:usage: )?[\w./-]+(?: [\w-]+)?: error: (.+)$", hit.line, re.IGNORECASE)
    if argparse:
        error = argparse.group(1).strip()
        unrecognized = re.match(r"unrecognized arguments: (.+)", error)
        if unrecognized:
            args = unrecognized.group(1)
            flags = [word for word in args.split() if word.startswith("-")]
            found = {_variable_for_flag(flag, ctx.env) for flag in flags}
            sources = sorted(name for name in found if name is not None)
            if not sources:
                # The worker itself passes only flags vLLM 0.32 knows: the rest came in VLLM_EXTRA_ARGS.
                sources = [_EXTRA_ARGS]
            where = " and ".join(sources)
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
                option = args_builder.option_for(flag)
                if found and found != _EXTRA_ARGS and value is not None and option is not None:
                    # The pre-launch check's sentence, with vLLM's own words after it.
                    accepted = flag_messages.invalid_value(variable, value, option["flag"], flag_messages.describe(option))
                    cause = f"{accepted.rstrip('.')} (vLLM said: {flag_match.group(2)})"
                else:
                    cause = f"vLLM rejected {shown} ({flag}: {flag_match.group(2)})"
                fixes = [f"correct {variable} or unset it" if found else f"correct the variable that sets {flag}"]
            else:
                variable, value = None, None
                cause = f"vLLM rejected its command line: {error}"
                fixes = ["correct the variable that produced it"]
        return Diagnosis(
            kind="bad_arguments",
            message=compose(cause, ctx.tried, fixes),
            evidence=evidence_of(hit.line),
            variable=variable,
            value=value,
        )
    if hit.rule.detail == "model_flag":
        cause = "VLLM_EXTRA_ARGS passes the model with --model, which `vllm serve` refuses"
        return Diagnosis(
            kind="bad_arguments",
            message=compose(cause, ctx.tried, ["remove --model from VLLM_EXTRA_ARGS; the worker passes MODEL_NAME itself"]),
            evidence=evidence_of(hit.line),
            variable="VLLM_EXTRA_ARGS",
        )
    if hit.rule.detail == "dtype_for_quantization" and ctx.search(r"not supported on CPU, casting to bfloat16"):
        # The CPU backend computes in bfloat16 only: no DTYPE makes a float16-only quantization run there.
        cause = f"The CPU backend cannot run the quantization of {ctx.subject if ctx.model else 'the model'}: {evidence_of(hit.line)}"
        return Diagnosis(
            kind="quantization_unsupported",
            message=compose(cause, ctx.tried, ["set MODEL_NAME to an unquantized checkpoint, or run on a GPU"]),
            evidence=evidence_of(hit.line),
            variable="MODEL_NAME",
            value=ctx.model,
        )
    if hit.rule.detail in ("value_error", "config_value", "quantization_mismatch", "dtype_for_quantization"):
        return _config_value(ctx, hit)
    # pydantic field constraint: "<field>\n  Input should ... [type=..., input_value=V, ...]"
    problems: list[str] = []
    first_variable: str | None = None
    first_value: str | None = None
    for h in ctx.hits:
        if h.rule.detail != "field":
            continue
        m = re.search(r"^\s*(Input should .*?) \[type=[\w.]+, input_value=(.*?), input_type=\w+\]", h.line)
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
        cause = f"vLLM rejected a setting: {evidence_of(hit.line)}"
        fixes = ["correct the variable that sets it"]
    return Diagnosis(
        kind="bad_arguments",
        message=compose(cause, ctx.tried, fixes),
        evidence=evidence_of(hit.line),
        variable=first_variable,
        value=first_value,
    )


# --- Hub access -----------------------------------------------------------------------------

_URL_REPO = re.compile(r"https?://[^\s'\"]+?/(?:api/models/)?([\w.-]+/[\w.-]+)/(?:resolve|revision|tree)/([^/\s'\"]+)")


def _repo_from(ctx: Context, patterns: Sequence[str]) -> str | None:
    for pattern in patterns:
        m = ctx.search(pattern)
        if m:
            return m.group(1).rstrip(".")
    m = ctx.search(_URL_REPO.pattern)
    return m.group(1) if m else None


def _repo_variable(ctx: Context, repo: str) -> str:
    if repo != ctx.model:
        for name in ("TOKENIZER_NAME", "TOKENIZER"):
            if env_value(ctx.env, name) == repo:
                return name
    return "MODEL_NAME"


def _hub(ctx: Context, kind: str, patterns: Sequence[str], sentence: Callable[[str, str], str]) -> Diagnosis:
    repo = _repo_from(ctx, patterns) or ctx.model or "(unknown)"
    variable = _repo_variable(ctx, repo)
    message = sentence(repo, variable) + tried_sentence(ctx.tried)
    return Diagnosis(
        kind=kind,
        message=message,
        evidence=evidence_of(ctx.hits[-1].line),
        variable=variable,
        value=repo,
        repo=repo,
    )


def _repo_not_found(ctx: Context) -> Diagnosis:
    return _hub(
        ctx,
        "repo_not_found",
        [r"(\S+) is not a local folder and is not a valid model identifier", r"(\S+) is not a local folder or a valid repository name"],
        lambda repo, variable: repo_not_found_message(repo, variable),
    )


def _gated_repo(ctx: Context) -> Diagnosis:
    if ctx.hits[-1].rule.detail == "no_config":
        return _no_config(ctx)
    return _hub(
        ctx,
        "gated_repo",
        [r"Access to model (\S+) is restricted", r"access to it at https?://huggingface\.co/([^\s'\"]+)", r"(\S+) is a gated repository"],
        lambda repo, variable: gated_repo_message(repo, variable, ctx.token_set),
    )


def _no_config(ctx: Context) -> Diagnosis:
    """vLLM could not read config.json at all: a gated repository read without access, most often."""
    m = ctx.search(r"No supported config format found in (\S+)")
    repo = (m.group(1).rstrip(".") if m else None) or ctx.model or "(unknown)"
    variable = _repo_variable(ctx, repo)
    token = "HF_TOKEN has no access to it" if ctx.token_set else "HF_TOKEN is not set"
    message = (
        f"vLLM could not read the config.json of {variable}={repo!r}: most often the repository is gated and "
        f"{token}. To fix: accept the model's terms at https://huggingface.co/{repo} and set HF_TOKEN to a read "
        f"token of that account; if the repository is not gated, check the name and that it holds a config.json."
    )
    return Diagnosis(
        kind="gated_repo",
        message=message + tried_sentence(ctx.tried),
        evidence=evidence_of(ctx.hits[-1].line),
        detail="no_config",
        variable=variable,
        value=repo,
        repo=repo,
    )


_MODEL_VARIABLES = ("MODEL_NAME", "BAKED_MODEL_PATH", "TOKENIZER_NAME", "TOKENIZER")


def _model_variable(ctx: Context, reference: str) -> str:
    """Which variable holds `reference` (the model unless it is the tokenizer's or the baked path)."""
    return next((name for name in _MODEL_VARIABLES if env_value(ctx.env, name) == reference), "MODEL_NAME")


def _model_path_missing(ctx: Context) -> Diagnosis:
    hit = ctx.hits[-1]
    m = re.search(r"path_or_model_id: '([^']*)'", hit.line) or re.search(
        r"'([^']*)'\.?(?: Use `repo_type` argument if needed\.)?\s*$", hit.line
    )
    reference = m.group(1) if m else ctx.model or "(unknown)"
    variable = _model_variable(ctx, reference)
    if hit.rule.detail == "path_or_model_id" and not looks_like_path(reference):
        # A well-formed id that could not be fetched, or nothing at all.
        return Diagnosis(
            kind="repo_not_found",
            message=repo_not_found_message(reference, variable) + tried_sentence(ctx.tried),
            evidence=evidence_of(hit.line),
            variable=variable,
            value=reference,
            repo=reference,
        )
    if looks_like_path(reference):
        message = model_path_missing_message(reference, variable)
    else:
        message = invalid_model_name_message(reference, variable)
    return Diagnosis(
        kind="model_path_missing",
        message=message + tried_sentence(ctx.tried),
        evidence=evidence_of(hit.line),
        variable=variable,
        value=reference,
    )




def _offline_not_cached(ctx: Context) -> Diagnosis:
    hit = ctx.hits[-1]
    # huggingface_hub does not name the repository; vLLM's "non-default args" line does.
    said = ctx.search(r"non-default args: \{.*?'model': '([^']+)'")
    repo = ctx.model or (said.group(1) if said else None) or "(unknown)"
    variable = _model_variable(ctx, repo)
    offline = ctx.profile.offline
    offline_value = env_value(ctx.env, offline) if offline else None
    revision = env_value(ctx.env, "MODEL_REVISION") if variable == "MODEL_NAME" else None
    missing_dir = ctx.search(r"Cache directory not found: (\S+?)\.?(?:\s|$)")
    if missing_dir:
        message = (
            f"The Hugging Face cache directory {missing_dir.group(1)} does not exist, so vLLM cannot find "
            f"{variable}={repo!r} in it: point HF_HOME or HF_HUB_CACHE at the cache that holds the model (a network "
            f"volume is mounted at /runpod-volume), or unset HF_HUB_OFFLINE so the worker can download it."
        )
    else:
        message = offline_not_cached_message(
            repo, variable, offline or "HF_HUB_OFFLINE", offline_value or "1", revision=revision
        )
    return Diagnosis(
        kind="offline_not_cached",
        message=message + tried_sentence(ctx.tried),
        evidence=evidence_of(hit.line),
        variable=offline or "HF_HUB_OFFLINE",
        value=offline_value,
        repo=repo,
        revision=revision,
    )


def _unauthorized(ctx: Context) -> Diagnosis:
    if ctx.hits[-1].rule.detail == "token_format":
        cause = "HF_TOKEN is not a valid HTTP header value: it contains a newline, a space or quotes"
        return Diagnosis(
            kind="unauthorized",
            message=compose(cause, ctx.tried, ["set HF_TOKEN to the token alone (hf_...), with nothing around it"]),
            evidence=evidence_of(ctx.hits[-1].line),
            detail="token_format",
            variable="HF_TOKEN",
        )
    return _hub(
        ctx,
        "unauthorized",
        [r"error when trying to load (\S+?):?$"],
        lambda repo, variable: unauthorized_message(repo, variable, ctx.token_set),
    )


_REVISION_VARIABLES = ("MODEL_REVISION", "REVISION", "TOKENIZER_REVISION", "CODE_REVISION")


def _revision_not_found(ctx: Context) -> Diagnosis:
    said = ctx.search(r"(\S+) is not a valid git identifier .*?huggingface\.co/([^'\s]+)'")
    url = ctx.search(_URL_REPO.pattern)
    repo = (said.group(2) if said else None) or (url.group(1) if url else None) or ctx.model or "(unknown)"
    revision = (said.group(1) if said else None) or (unquote(url.group(2)) if url else None) or ctx.revision or "(unknown)"
    variable = next((name for name in _REVISION_VARIABLES if env_value(ctx.env, name) == revision), None)
    if variable is None:
        variable = next((name for name in _REVISION_VARIABLES if env_value(ctx.env, name) is not None), None)
    if variable is not None:
        message = revision_not_found_message(repo, revision, variable) + tried_sentence(ctx.tried)
    else:
        # No revision was pinned: vLLM resolved the default branch to a commit that vanished meanwhile.
        message = compose(
            f"Revision {revision!r} of {repo!r} disappeared while vLLM was fetching it (the repository was "
            f"probably force-pushed while the worker started)",
            ctx.tried,
            ["restart the worker to fetch the current revision, or pin MODEL_REVISION to a commit that stays"],
        )
    return Diagnosis(
        kind="revision_not_found",
        message=message,
        evidence=evidence_of(ctx.hits[-1].line),
        variable=variable,
        value=revision,
        repo=repo,
        revision=revision,
    )


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
    return Diagnosis(
        kind="unsupported_architecture",
        message=compose(cause, ctx.tried, [f"set MODEL_NAME to another model: {fixes[0][0].lower()}{fixes[0][1:]}"]),
        evidence=evidence_of(line),
        variable="MODEL_NAME",
        value=value,
    )


def _trust_remote_code(ctx: Context) -> Diagnosis:
    hit = ctx.hits[-1]
    subject = ctx.subject
    part = "tokenizer" if ctx.search(r"Failed to load the tokenizer") else "processor" if ctx.search(r"Failed to load the processor") else "model"
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
    return Diagnosis(
        kind="trust_remote_code",
        message=compose(cause, ctx.tried, fixes),
        evidence=evidence_of(hit.line),
        variable="TRUST_REMOTE_CODE",
        value=env_value(ctx.env, "TRUST_REMOTE_CODE"),
    )


def _disk_full(ctx: Context) -> Diagnosis:
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
        message=compose(cause, ctx.tried, fixes),
        evidence=evidence_of(hit.line),
        value=m.group(1) if m else None,
    )

# snake_case words of vLLM's config that name a worker variable, most specific first.
_CONFIG_WORDS = (
    "kv_cache_dtype",
    "max_num_batched_tokens",
    "max_model_len",
    "max_num_seqs",
    "gpu_memory_utilization",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "kv_cache_memory_bytes",
    "quantization",
    "load_format",
    "dtype",
)
_TEXT_VARIABLES = (
    (r"kv[_ ]cache[_ ]dtype", "KV_CACHE_DTYPE"),
    (r"quantization", "QUANTIZATION"),
    (r"load[_ ]format", "LOAD_FORMAT"),
    (r"\bdtype\b", "DTYPE"),
)


def _variable_in(text: str) -> str | None:
    """The worker variable a vLLM config message is about, from the config words it uses."""
    lowered = text.lower()
    for word in _CONFIG_WORDS:
        if re.search(rf"\b{word}\b", lowered):
            return word.upper()
    for pattern, variable in _TEXT_VARIABLES:
        if re.search(pattern, lowered):
            return variable
    return None


def _config_value(ctx: Context, hit: Hit) -> Diagnosis:
    """A config value vLLM refused in its own validation (pydantic's "Value error, ...", a ValueError)."""
    text = hit.line
    m = re.search(r"Value error, (.*?)\s*\[type=value_error", text, re.IGNORECASE)
    reason = (m.group(1) if m else re.sub(r"^(?:[\w.]+(?:Error|Exception): )", "", text)).strip()
    field_line = ctx.lines[hit.index - 1].strip() if hit.index > 0 else ""
    variable = None
    if re.fullmatch(r"[a-z_][\w.]*", field_line):
        variable = field_line.split(".")[-1].upper()
    if hit.rule.detail == "quantization_mismatch":
        variable = "QUANTIZATION"
    if hit.rule.detail == "dtype_for_quantization":
        variable = "DTYPE"
    variable = variable or _variable_in(reason)
    value = env_value(ctx.env, variable) if variable else None
    shown = f"{variable}={value!r}" if variable and value is not None else (variable or "a setting")
    cause = f"vLLM rejected {shown}: {evidence_of(reason).rstrip('.')}"
    if hit.rule.detail == "dtype_for_quantization":
        fixes = ["set DTYPE to one the quantization supports (DTYPE=half for float16)"]
    elif hit.rule.detail == "quantization_mismatch":
        fixes = ["unset QUANTIZATION so vLLM reads the method from the checkpoint, or set it to the checkpoint's method"]
    elif variable:
        fixes = [f"correct {variable} or unset it"]
    else:
        fixes = ["correct the variable that sets it"]
    return Diagnosis(
        kind="bad_arguments",
        message=compose(cause, ctx.tried, fixes),
        evidence=evidence_of(hit.line),
        variable=variable,
        value=value,
    )


# --- the parallel layout, the GPU's abilities ------------------------------------------------------


def _divisors(number: int, limit: int = 8) -> list[int]:
    return [d for d in range(1, min(number, limit) + 1) if number % d == 0]


def _tensor_parallel(ctx: Context) -> Diagnosis:
    hit = ctx.hits[-1]
    tp = env_value(ctx.env, "TENSOR_PARALLEL_SIZE")
    heads = ctx.search(r"attention heads \((\d+)\) must be divisible by tensor parallel size \((\d+)\)")
    if heads:
        size = tp or heads.group(2)
        choices = ", ".join(str(d) for d in _divisors(int(heads.group(1))))
        cause = (
            f"TENSOR_PARALLEL_SIZE={size} does not divide the {heads.group(1)} attention heads of "
            f"{ctx.subject if ctx.model else 'the model'}"
        )
        fixes = [f"set TENSOR_PARALLEL_SIZE to one of {choices} (with that many GPUs per worker)"]
        value = size
    elif hit.rule.detail == "gpus":
        shown = f"TENSOR_PARALLEL_SIZE={tp}" if tp else "TENSOR_PARALLEL_SIZE (times PIPELINE_PARALLEL_SIZE)"
        cause = f"{shown} asks for more GPUs than this worker has"
        fixes = [
            "set TENSOR_PARALLEL_SIZE to the number of GPUs per worker of the endpoint, "
            "or give the endpoint that many GPUs per worker"
        ]
        value = tp
    else:
        shown = f"TENSOR_PARALLEL_SIZE={tp}" if tp else "TENSOR_PARALLEL_SIZE"
        cause = f"{shown} does not fit the layout of {ctx.subject if ctx.model else 'the model'}: {evidence_of(hit.line)}"
        fixes = ["set TENSOR_PARALLEL_SIZE to a power of two that divides the model's attention heads (1, 2, 4 or 8)"]
        value = tp
    return Diagnosis(
        kind="tensor_parallel",
        message=compose(cause, ctx.tried, fixes),
        evidence=evidence_of(hit.line),
        variable="TENSOR_PARALLEL_SIZE",
        value=value,
    )


def _capability(text: str) -> str:
    """'75' or '7.5' -> '7.5'."""
    return text if "." in text else f"{text[:-1]}.{text[-1]}"


def _dtype_unsupported(ctx: Context) -> Diagnosis:
    hit = ctx.hits[-1]
    gpu = ctx.search(r"Your (.+?) GPU has compute capability ([\d.]+)")
    where = f"This GPU ({gpu.group(1)}, compute capability {gpu.group(2)})" if gpu else "This GPU"
    dtype = env_value(ctx.env, "DTYPE")
    uses = f"DTYPE={dtype}" if dtype else f"the dtype of {ctx.subject if ctx.model else 'the model'} (bfloat16)"
    cause = f"{where} cannot compute in bfloat16, which {uses} asks for"
    fixes = ["set DTYPE=half (float16)", "or choose a GPU of compute capability 8.0 or more (Ampere or newer)"]
    return Diagnosis(
        kind="dtype_unsupported",
        message=compose(cause, ctx.tried, fixes),
        evidence=evidence_of(hit.line),
        variable="DTYPE",
        value=dtype,
    )


_KV_FP8 = r"reshape_and_cache|kv_cache_dtype[=:'\" ]+fp8|KV_CACHE_DTYPE=fp8|--kv-cache-dtype[= ]fp8"


def _quantization_unsupported(ctx: Context) -> Diagnosis:
    hit = ctx.hits[-1]
    kv_fp8 = (env_value(ctx.env, "KV_CACHE_DTYPE") or "").lower().startswith("fp8")
    if hit.rule.detail == "fp8_type" and (kv_fp8 or ctx.search(_KV_FP8)):
        cause = "This GPU cannot store the KV cache in fp8 (its Triton kernels support fp8e4nv from Ada/Hopper on)"
        return Diagnosis(
            kind="dtype_unsupported",
            message=compose(cause, ctx.tried, ["unset KV_CACHE_DTYPE (or set it to auto)", "or choose an Ada or Hopper GPU"]),
            evidence=evidence_of(hit.line),
            variable="KV_CACHE_DTYPE",
            value=env_value(ctx.env, "KV_CACHE_DTYPE"),
        )
    method = ctx.search(r"quantization method (\S+) is not supported for the current GPU")
    caps = ctx.search(r"Minimum capability: (\d+)\.? Current capability: (\d+)")
    setting = env_value(ctx.env, "QUANTIZATION")
    name = method.group(1) if method else (setting or "of the checkpoint")
    needs = (
        f": it needs compute capability {_capability(caps.group(1))}, this GPU has {_capability(caps.group(2))}"
        if caps
        else f": {evidence_of(hit.line)}"
    )
    cause = f"This GPU cannot run the quantization {name} of {ctx.subject if ctx.model else 'the model'}{needs}"
    fixes = []
    if setting:
        fixes.append(f"unset QUANTIZATION (now {setting}) if the checkpoint is not quantized that way")
    fixes.append(
        "choose a GPU that supports it, or set MODEL_NAME to a checkpoint in another quantization "
        "(AWQ or GPTQ run on older GPUs)"
    )
    return Diagnosis(
        kind="quantization_unsupported",
        message=compose(cause, ctx.tried, fixes),
        evidence=evidence_of(hit.line),
        variable="QUANTIZATION" if setting else "MODEL_NAME",
        value=setting or ctx.model,
    )


# --- the Hub could not be reached, the model's files, the image, the machine -------------------------


def _hub_unreachable(ctx: Context) -> Diagnosis:
    said = ctx.search(r"non-default args: \{.*?'model': '([^']+)'")
    named = ctx.search(r"it looks like (\S+) is not the path to a directory")
    repo = ctx.model or (named.group(1) if named else None) or (said.group(1) if said else None) or "(unknown)"
    variable = _model_variable(ctx, repo)
    if looks_like_path(repo) or (named and "/" not in repo):
        # Not a Hub id (owner/name): a local directory that is not there, which no download can fix.
        return Diagnosis(
            kind="model_path_missing",
            message=model_path_missing_message(repo, variable) + tried_sentence(ctx.tried),
            evidence=evidence_of(ctx.hits[-1].line),
            variable=variable,
            value=repo,
        )
    return Diagnosis(
        kind="hub_unreachable",
        message=hub_unreachable_message(repo, variable) + tried_sentence(ctx.tried),
        evidence=evidence_of(ctx.hits[-1].line),
        variable=variable,
        value=repo,
        repo=repo,
    )


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
    "arch": "this GPU's support: the engine's kernels were not built for its architecture",
    "cpu": "this machine's CPU: it lacks an instruction set the engine was built for",
}


def _host_fault(ctx: Context) -> Diagnosis:
    detail = ctx.hits[-1].rule.detail or "device"
    cause = (
        f"vLLM failed to start because of a fault in {_HOST_WHAT.get(detail, 'this machine')}, not in the settings: "
        f"{_root_of(ctx)}{_exit_phrase(ctx.exit_code)}"
    )
    fixes = [
        "terminate this worker (the endpoint's Workers tab) so the platform starts a fresh one, usually on "
        "another machine",
    ]
    if detail == "arch":
        fixes.append("choose a GPU type this image supports (the worker's image supports Ampere, Ada and Hopper cards)")
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
    "max_model_len_too_large": _max_model_len,
    "bad_arguments": _bad_arguments,
    "tensor_parallel": _tensor_parallel,
    "dtype_unsupported": _dtype_unsupported,
    "quantization_unsupported": _quantization_unsupported,
    "repo_not_found": _repo_not_found,
    "model_path_missing": _model_path_missing,
    "offline_not_cached": _offline_not_cached,
    "hub_unreachable": _hub_unreachable,
    "gated_repo": _gated_repo,
    "revision_not_found": _revision_not_found,
    "unauthorized": _unauthorized,
    "unsupported_architecture": _unsupported_architecture,
    "trust_remote_code": _trust_remote_code,
    "disk_full": _disk_full,
    "model_files_broken": _model_files_broken,
    "missing_library": _missing_library,
    "host_fault": _host_fault,
}
# Every rule names a kind with a builder; "engine_command" and "unknown" are answered without rules.
assert failure_rules.KINDS_WITH_RULES <= set(_BUILDERS) and set(_BUILDERS) | {"engine_command", "unknown"} == set(KINDS)
