"""The messages for a setting vLLM refused: the context length, a flag's value, the parallel
layout, a dtype or quantization the GPU cannot run.

Each names the variable to change and the value it had; a value vLLM's parser rejects reads
like the worker's own pre-launch check (`flag_messages`), with vLLM's words after it.
"""

from __future__ import annotations

import re

from vllm_worker.config import args_builder, flag_messages
from vllm_worker.config.profile import LaunchProfile
from vllm_worker.diagnosis.rules import Hit
from vllm_worker.diagnosis.verdict import Context, Diagnosis, answer, evidence_of

# --- MAX_MODEL_LEN ----------------------------------------------------------------------


def _number(text: str) -> int | None:
    try:
        return int(float(text))
    except ValueError:
        return None


def max_model_len(ctx: Context) -> Diagnosis:
    hit = ctx.hits[-1]
    m = re.search(
        r"User-specified max_model_len \((\d+)\) is greater than the derived max_model_len "
        r"\((\w+)=([\d.]+|None) or model_max_length=([\d.]+|None)",
        hit.line,
    )
    # vLLM's own figure is what it rejected; the env may hold an alias or an extra-args override.
    value = (m.group(1) if m else None) or ctx.profile.written("MAX_MODEL_LEN")
    limits = [n for n in ((_number(m.group(3)), _number(m.group(4))) if m else ()) if n is not None]
    limit = max(limits) if limits else None
    if limit is not None and m:
        source = f"{m.group(2)} in its config.json"
        cause = f"MAX_MODEL_LEN={value} is longer than the {limit}-token context of {ctx.subject if ctx.model else 'the model'} ({source})"
        fixes = [f"set MAX_MODEL_LEN to {limit} or less, or unset it to use the model's full context"]
    else:
        cause = f"MAX_MODEL_LEN={value} is larger than the model's own limit"
        fixes = ["lower MAX_MODEL_LEN, or unset it to use the model's full context"]
    return answer(ctx, "max_model_len_too_large", cause, fixes, line=hit.line, variable="MAX_MODEL_LEN",
        value=value, facts={"limit": str(limit)} if limit is not None else {})


# --- command line -------------------------------------------------------------------------

_EXTRA_ARGS = "VLLM_EXTRA_ARGS"


def _variable_for_flag(flag: str, profile: LaunchProfile) -> str | None:
    """Which of the user's variables put `flag` on the command line, if one can tell."""
    name = flag.lstrip("-").replace("-", "_").upper()
    if name.startswith("NO_") and profile.written(name[3:]) is not None:
        name = name[3:]
    if profile.written(name) is not None:
        return name
    if any(word == flag or word.startswith(flag + "=") for word in profile.extra_args_words or ()):
        return _EXTRA_ARGS
    return None


def bad_arguments(ctx: Context) -> Diagnosis:
    # argparse's line names the flag; a pydantic line after it only explains the value.
    hit = next((h for h in reversed(ctx.hits) if h.rule.detail == "argparse"), ctx.hits[-1])
    argparse = re.search(r"^(?:usage: )?[\w./-]+(?: [\w-]+)?: error: (.+)$", hit.line, re.IGNORECASE)
    if argparse:
        error = argparse.group(1).strip()
        unrecognized = re.match(r"unrecognized arguments: (.+)", error)
        if unrecognized:
            args = unrecognized.group(1)
            flags = [word for word in args.split() if word.startswith("-")]
            found = {_variable_for_flag(flag, ctx.profile) for flag in flags}
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
                set_by = _variable_for_flag(flag, ctx.profile)
                variable = set_by or flag.lstrip("-").replace("-", "_").upper()
                value = ctx.profile.written(variable)
                shown = f"{variable}={value!r}" if value is not None and variable != _EXTRA_ARGS else variable
                option = args_builder.option_for(flag)
                if set_by and set_by != _EXTRA_ARGS and value is not None and option is not None:
                    # The pre-launch check's sentence, with vLLM's own words after it.
                    accepted = flag_messages.invalid_value(variable, value, option["flag"], flag_messages.describe(option))
                    cause = f"{accepted.rstrip('.')} (vLLM said: {flag_match.group(2)})"
                else:
                    cause = f"vLLM rejected {shown} ({flag}: {flag_match.group(2)})"
                fixes = [f"correct {variable} or unset it" if set_by else f"correct the variable that sets {flag}"]
            else:
                variable, value = None, None
                cause = f"vLLM rejected its command line: {error}"
                fixes = ["correct the variable that produced it"]
        return answer(ctx, "bad_arguments", cause, fixes, line=hit.line, variable=variable, value=value)
    if hit.rule.detail == "model_flag":
        cause = "VLLM_EXTRA_ARGS passes the model with --model, which `vllm serve` refuses"
        return answer(ctx, "bad_arguments", cause,
            ["remove --model from VLLM_EXTRA_ARGS; the worker passes MODEL_NAME itself"], line=hit.line,
            variable="VLLM_EXTRA_ARGS")
    if hit.rule.detail == "dtype_for_quantization" and ctx.search(r"not supported on CPU, casting to bfloat16"):
        # The CPU backend computes in bfloat16 only: no DTYPE makes a float16-only quantization run there.
        cause = f"The CPU backend cannot run the quantization of {ctx.subject if ctx.model else 'the model'}: {evidence_of(hit.line)}"
        return answer(ctx, "quantization_unsupported", cause,
            ["set MODEL_NAME to an unquantized checkpoint, or run on a GPU"], line=hit.line, variable="MODEL_NAME",
            value=ctx.model)
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
        value = ctx.profile.written(variable) or m.group(2)
        first_variable = first_variable or variable
        first_value = first_value or value
        problems.append(f"{variable}={value} ({m.group(1)[0].lower() + m.group(1)[1:]})")
    if problems:
        cause = f"vLLM rejected {' and '.join(problems)}"
        fixes = [f"correct {'them' if len(problems) > 1 else first_variable} or unset {'them' if len(problems) > 1 else 'it'}"]
    else:
        cause = f"vLLM rejected a setting: {evidence_of(hit.line)}"
        fixes = ["correct the variable that sets it"]
    return answer(ctx, "bad_arguments", cause, fixes, line=hit.line, variable=first_variable, value=first_value)



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
    value = ctx.profile.written(variable) if variable else None
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
    return answer(ctx, "bad_arguments", cause, fixes, line=hit.line, variable=variable, value=value)


# --- the parallel layout, the GPU's abilities ------------------------------------------------------


def _divisors(number: int, limit: int = 8) -> list[int]:
    return [d for d in range(1, min(number, limit) + 1) if number % d == 0]


def tensor_parallel(ctx: Context) -> Diagnosis:
    hit = ctx.hits[-1]
    tp = ctx.profile.written("TENSOR_PARALLEL_SIZE")
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
    elif hit.rule.detail == "weight_shard":
        shown = f"TENSOR_PARALLEL_SIZE={tp}" if tp else "TENSOR_PARALLEL_SIZE"
        cause = (
            f"{shown} splits a quantized layer of {ctx.subject if ctx.model else 'the model'} into shards its kernel "
            f"cannot take: {evidence_of(hit.line)}"
        )
        fixes = [
            "set TENSOR_PARALLEL_SIZE lower (1 always fits the layout; a split works when each GPU's share of the "
            "layer is a multiple of the kernel's tile)",
            "or set MODEL_NAME to a checkpoint quantized for this split (some publish one padded for TP 2 or 4)",
        ]
        value = tp
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
    return answer(ctx, "tensor_parallel", cause, fixes, line=hit.line, variable="TENSOR_PARALLEL_SIZE", value=value)


def _capability(text: str) -> str:
    """'75' or '7.5' -> '7.5'."""
    return text if "." in text else f"{text[:-1]}.{text[-1]}"


def dtype_unsupported(ctx: Context) -> Diagnosis:
    hit = ctx.hits[-1]
    gpu = ctx.search(r"Your (.+?) GPU has compute capability ([\d.]+)")
    where = f"This GPU ({gpu.group(1)}, compute capability {gpu.group(2)})" if gpu else "This GPU"
    dtype = ctx.profile.written("DTYPE")
    uses = f"DTYPE={dtype}" if dtype else f"the dtype of {ctx.subject if ctx.model else 'the model'} (bfloat16)"
    cause = f"{where} cannot compute in bfloat16, which {uses} asks for"
    fixes = ["set DTYPE=half (float16)", "or choose a GPU of compute capability 8.0 or more (Ampere or newer)"]
    return answer(ctx, "dtype_unsupported", cause, fixes, line=hit.line, variable="DTYPE", value=dtype)


_KV_FP8 = r"reshape_and_cache|kv_cache_dtype[=:'\" ]+fp8|KV_CACHE_DTYPE=fp8|--kv-cache-dtype[= ]fp8"


def quantization_unsupported(ctx: Context) -> Diagnosis:
    hit = ctx.hits[-1]
    kv_fp8 = ctx.profile.kv_cache_dtype.startswith("fp8")
    if hit.rule.detail == "fp8_type" and (kv_fp8 or ctx.search(_KV_FP8)):
        cause = "This GPU cannot store the KV cache in fp8 (its Triton kernels support fp8e4nv from Ada/Hopper on)"
        return answer(ctx, "dtype_unsupported", cause,
            ["unset KV_CACHE_DTYPE (or set it to auto)", "or choose an Ada or Hopper GPU"], line=hit.line,
            variable="KV_CACHE_DTYPE", value=ctx.profile.written("KV_CACHE_DTYPE"))
    method = ctx.search(r"quantization method (\S+) is not supported for the current GPU")
    caps = ctx.search(r"Minimum capability: (\d+)\.? Current capability: (\d+)")
    setting = ctx.profile.written("QUANTIZATION")
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
    return answer(ctx, "quantization_unsupported", cause, fixes, line=hit.line,
        variable="QUANTIZATION" if setting else "MODEL_NAME", value=setting or ctx.model)
