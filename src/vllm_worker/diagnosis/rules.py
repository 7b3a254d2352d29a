"""Which cause a failed start's output shows: the wordings, as one table, and how lines are read.

vLLM's failure texts drift between versions (a device name added, a typo fixed, V0 and V1
messages, argparse printed under another program name, pydantic's "Value error, ..."), and
the logs users paste arrive wrapped by other programs (process prefixes, timestamps, CI
`| ` gutters, markdown `> ` quotes, backticks, lines hard-wrapped, retyped in lower case).
So each cause is anchored on the fragments of its wordings that stayed stable across
versions, matched case-insensitively on lines stripped of those wrappers, and a wording
split over two lines still matches. `RULES` is data (the machine's, the image's and the
model files' families are in `fault_rules`, with the `Rule` type): every rule names the versions and
sources it was seen in, and the field corpus in tests/field/ checks them.

When no rule matches, `root_error` finds vLLM's own root exception (the innermost raised
error of the last chain, wrappers such as "Engine core initialization failed" skipped), so
the worker can still answer with vLLM's words instead of exiting.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from vllm_worker.diagnosis.fault_rules import FAULT_RULES, Rule

# A line longer than this is cut before matching: one line of megabytes must not stall a scan.
MAX_LINE_CHARS = 8192
_DEV = r"(?: \S+)?"  # an optional device name ("cuda:0"), present in some versions only


# Order matters only within one line: the first rule that matches a line names it.
_SETTINGS_RULES: tuple[Rule, ...] = (
    # --- memory held by another process / a profiling race ------------------------------------
    Rule(
        "memory_held",
        rf"Free memory on device{_DEV} \(\s*[\d.]+\s*/\s*[\d.]+ GiB\) on startup is less than",
        seen="0.10-0.32 vllm/v1/worker/utils.py request_memory; device name from 0.11",
    ),
    Rule(
        "memory_held",
        r"Available memory on node \S+ \([\d.]+/[\d.]+ GiB\) on startup is less than desired",
        seen="0.32 vllm/v1/worker/cpu_worker.py",
    ),
    Rule(
        "memory_held",
        r"less than desired GPU memory utilization .*(?:reduce|used by other processes)",
        seen="0.9-0.32 the same check, device figures lost to wrapping",
    ),
    Rule(
        "profiling_race",
        r"Error in memory profiling\.? Initial free memory",
        seen="0.6-0.32 worker/gpu_worker.py (an assert in V0, a ValueError in V1)",
    ),
    # --- memory shortfall ---------------------------------------------------------------------
    Rule(
        "memory_shortfall",
        r"To serve at least one request with the models?'?s max seq len",
        "kv_too_small",
        seen="0.8-0.32 vllm/v1/core/kv_cache_utils.py (\"models's\" until 0.10)",
    ),
    Rule(
        "memory_shortfall",
        r"max seq len \(\d+\) is larger than the maximum number of tokens that can be stored in KV cache",
        "kv_too_small",
        seen="0.4-0.10 V0 vllm/worker/worker.py raise_if_cache_size_invalid",
    ),
    Rule(
        "memory_shortfall",
        r"No available memory for the cache blocks",
        "no_kv_memory",
        seen="0.4-0.32 V0 worker.py, V1 kv_cache_utils.py",
    ),
    Rule(
        "memory_shortfall",
        r"Cannot auto-fit max_model_len",
        "auto_fit",
        seen="0.32 vllm/v1/core/kv_cache_utils.py (seed 001)",
    ),
    Rule(
        "memory_shortfall",
        r"out of memory occurred when warming up (?:the )?(?:sampler|pooler)",
        "sampler_warmup",
        seen="0.6-0.32 worker/gpu_model_runner.py _dummy_sampler_run",
    ),
    Rule(
        "memory_shortfall",
        r"Failed to load model - not enough GPU memory",
        "weights_load",
        seen="0.32 vllm/v1/worker/gpu_model_runner.py load_model",
    ),
    Rule(
        "memory_shortfall",
        r"on kv cache allocation is less than requested memory for kv \(-?[\d.]+/",
        "cpu_kv_no_room",
        seen="0.32 vllm/v1/worker/cpu_worker.py",
    ),
    Rule(
        "memory_shortfall",
        r"on kv cache allocation is less than requested memory for kv",
        "cpu_kv_explicit",
        seen="0.32 vllm/v1/worker/cpu_worker.py",
    ),
    Rule(
        "memory_shortfall",
        r"DefaultCPUAllocator: (?:can't|not enough memory)",
        "cpu_out_of_memory",
        seen="torch c10 DefaultCPUAllocator on the CPU backend",
    ),
    Rule(
        "memory_shortfall",
        r"(?:CUDA|HIP|XPU|NPU|MPS) out of memory|(?:CUDA|HIP) error: out of memory|OutOfMemoryError"
        r"|UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY|Ran out of memory in memory space hbm"
        r"|RESOURCE_EXHAUSTED: .*(?:Error allocating|Attempting to (?:allocate|reserve)|Ran out of memory in memory space)"
        r"|hipErrorOutOfMemory|cudaErrorMemoryAllocation|out of memory trying to allocate",
        "out_of_memory",
        seen="torch CUDA/HIP/XPU allocators (all versions), XLA on TPU, Level Zero on XPU",
    ),
    Rule(
        "memory_shortfall",
        r"(?:Not enough|insufficient) (?:GPU |device )?memory (?:to|for) (?:load|fit|run|allocate|serve)",
        "out_of_memory",
        seen="quantization kernels and offloading checks of several versions",
    ),
    # --- the context is longer than the model's ------------------------------------------------
    Rule(
        "max_model_len_too_large",
        r"User-specified max_model_len \(\d+\) is greater than (?:the )?derived max_model_len",
        seen="0.4-0.32 vllm/config (_get_and_verify_max_len)",
    ),
    Rule(
        "max_model_len_too_large",
        r"max_model_len \(\d+\) is greater than (?:the )?(?:model's )?(?:max_position_embeddings|derived)",
        seen="older wordings of the same check",
    ),
    # --- the command line and config values -----------------------------------------------------
    Rule(
        "bad_arguments",
        r"^(?:usage: )?[\w./-]+(?:\.py)?(?: [\w-]+)?: error: (?:argument|unrecognized arguments|the following arguments"
        r"|ambiguous option)",
        "argparse",
        seen="argparse of every entry point: vllm serve, vllm, api_server.py, __main__.py",
    ),
    Rule(
        "bad_arguments",
        r"^Input should .*\[type=[\w.]+, input_value=",
        "field",
        seen="0.9-0.32 pydantic field constraints on vllm/config dataclasses",
    ),
    Rule(
        "bad_arguments",
        r"Unknown quantization method: |Invalid (?:kv[_ ]cache[_ ])?dtype|Unknown (?:kv[_ ]cache[_ ])?dtype"
        r"|gpu_memory_utilization must be|GPU memory utilization must be|Unsupported (?:kv_cache_dtype|KV cache dtype)"
        r"|max_num_batched_tokens \(\d+\) is smaller than max_model_len|got an unexpected keyword argument '\w+'"
        r"|Unknown load format|Invalid load format|Unsupported dtype:",
        "config_value",
        seen="0.4-0.32 vllm/config value checks",
    ),
    Rule(
        "bad_arguments",
        r"torch\.\w+ is not supported for quantization method \w+",
        "dtype_for_quantization",
        seen="0.4-0.32 quantization configs' get_supported_act_dtypes check",
    ),
    Rule(
        "bad_arguments",
        r"Quantization method specified in the model config \(\w+\) does not match",
        "quantization_mismatch",
        seen="0.4-0.32 vllm/config (_verify_quantization)",
    ),
    Rule(
        "bad_arguments",
        r"you should provide the model as a positional argument or in a config file instead of via the `--model`",
        "model_flag",
        seen="0.8-0.32 vllm/entrypoints/cli/serve.py",
    ),
    # --- the parallel layout -------------------------------------------------------------------
    Rule(
        "tensor_parallel",
        r"number of attention heads \(\d+\) must be divisible by tensor parallel size",
        "heads",
        seen="0.4-0.32 vllm/config verify_with_parallel_config",
    ),
    Rule(
        "tensor_parallel",
        r"must be divisible by (?:the )?(?:tensor|pipeline) parallel size|is not divisible by (?:tensor|tp)",
        "divisible",
        seen="several versions and quantized layers",
    ),
    Rule(
        "tensor_parallel",
        r"^assert .*%\s*(?:self\.)?(?:tp_size|tp_world_size|tensor_parallel_size|world_size)\b",
        "divisible",
        seen="model code asserting its heads divide by the TP size (chatglm and others, printed above a bare AssertionError)",
    ),
    Rule(
        "tensor_parallel",
        r"^(?:AssertionError: )?\d+ is not divisible by \d+\.?$",
        "divisible",
        seen="vllm/distributed/utils.py ensure_divisibility, an assert whose message is only the two numbers (all "
        "versions): the whole line, with or without its class",
    ),
    Rule(
        "tensor_parallel",
        r"(?:size_per_partition|partition_size|output_size of gate's and up's weight|size_[nk]) = \d+,? is not "
        r"divisible by (?:min_thread_[nk]|weight quantization block_[nk]|group_size)"
        r"|(?:input|output) size is not aligned with the quantized weight shape",
        "weight_shard",
        seen="vLLM's quantized layers checking one GPU's shard: marlin_utils / gptq_marlin (min_thread_n, min_thread_k, "
        "group_size; 0.5-0.32), fp8 block quantization (block_n; 0.6-0.32), awq and gptq (not aligned; 0.2-0.32), the "
        "Marlin kernels (size_n)",
    ),
    Rule(
        "tensor_parallel",
        r"number of required GPUs exceeds the total number of available GPUs"
        r"|World size \(\d+\) is larger than the number of available GPUs"
        r"|tensor_parallel_size \(\d+\) (?:is larger than|exceeds) the number of (?:available )?GPUs"
        r"|(?:Tensor|Pipeline) parallel size \(\d+\) cannot be larger than the number of available GPUs"
        r"|max local gpu count|(?:CUDA|HIP) error: invalid device ordinal"
        r"|invalid device ordinal",
        "gpus",
        seen="0.4-0.32 ray and multiprocessing executors",
    ),
    # --- the GPU cannot run the dtype or the quantization ----------------------------------------
    Rule(
        "dtype_unsupported",
        r"Bfloat16 is only supported on GPUs with compute capability",
        seen="0.4-0.32 platforms/cuda.py (check_and_update / _check_if_gpu_supports_dtype)",
    ),
    Rule(
        "dtype_unsupported",
        r"(?:FP8|float8|fp8 e4m3|fp8_e4m3) (?:is|are) (?:only|not) supported on GPUs with compute capability"
        r"|does not support (?:the )?(?:bfloat16|bf16|float8)",
        seen="several versions",
    ),
    Rule(
        "quantization_unsupported",
        r"quantization method \S+ is not supported for the current GPU",
        seen="0.4-0.32 vllm/model_executor/model_loader (_get_quantization_config)",
    ),
    Rule(
        "quantization_unsupported",
        r"\S+ quantization is currently not supported in (?:ROCm|XPU|TPU|CPU|HPU)"
        r"|Quantization scheme is not supported for|Min(?:imum)? capability: \d+\W+Current capability: \d+"
        r"|_scaled_mm is only supported on|No compressed-tensors compatible scheme was found"
        r"|quantization (?:method )?\S+ is not supported (?:on|for) (?:the )?(?:CPU|XPU|TPU|HPU|ROCm|current platform)"
        r"|float8_e4m3fn\S* (?:is )?(?:not|only) supported|GPU is required to quantize or run quantize model"
        r"|bitsandbytes was compiled without GPU support|quantization is (?:currently )?only supported on"
        r"|(?:Marlin|Machete|CUTLASS) .*requires (?:a GPU with )?compute capability"
        r"|does not support (?:BitsAndBytes|bitsandbytes|GGUF|AWQ|GPTQ|FP8|\w+) quantization",
        seen="several versions and platforms",
    ),
    Rule(
        "quantization_unsupported",
        r"type fp8e4nv not supported in this architecture",
        "fp8_type",
        seen="triton on GPUs older than Ada (fp8 checkpoints, or an fp8 KV cache: the builder tells which)",
    ),
    # --- the Hub -----------------------------------------------------------------------------------
    Rule(
        "gated_repo",
        r"You are trying to access a gated repo|Cannot access gated repo for url|is a gated repository\. Make sure"
        r"|GatedRepoError|Please enable access to public gated repositories"
        r"|403 Client Error: Forbidden for url: https?://huggingface\.co/",
        seen="transformers utils/hub.py, huggingface_hub errors (all versions)",
    ),
    Rule("gated_repo", r"Access to model \S+ is restricted", seen="huggingface_hub utils/_http.py"),
    Rule(
        "gated_repo",
        r"No supported config format found in \S+",
        "no_config",
        seen="0.7-0.9 vllm/transformers_utils/config.py: config.json unreadable, typically a gated repo without a token",
    ),
    # A token the Hub refuses: said beside "Repository Not Found" too, and then it is the cause.
    Rule("unauthorized", r"Invalid credentials in Authorization header|Invalid user token", seen="huggingface_hub"),
    Rule(
        "revision_not_found",
        r"is not a valid git identifier|Revision Not Found for url|RevisionNotFoundError|has no (?:valid )?revision"
        r"|404 Client Error.*for url: https?://\S+/api/models/[^/\s]+/[^/\s]+/revision/(?!main\b)\S+",
        seen="transformers utils/hub.py, huggingface_hub errors",
    ),
    Rule(
        "repo_not_found",
        r"is not a local folder and is not a valid model identifier|Repository Not Found for url"
        r"|is not a local folder or a valid repository name|RepositoryNotFoundError"
        r"|Invalid repository ID or local directory specified",
        seen="transformers utils/hub.py, huggingface_hub, vllm/transformers_utils/config.py (0.7-0.10)",
    ),
    Rule(
        "repo_not_found",
        r"404 Client Error.*for url: https?://[^\s]+/(?:resolve/[^\s/]+/config\.json|api/models/)",
        seen="huggingface_hub raise_for_status on config.json or the model info",
    ),
    Rule(
        "model_path_missing",
        r"Repo id must be in the form 'repo_name' or 'namespace/repo_name'|Repo id must use alphanumeric chars"
        r"|Repo id must be a string, not|Cannot have -- or \.\. in repo_id|Repo_id cannot end by '\.git'",
        seen="huggingface_hub utils/_validators.py validate_repo_id, 0.2x to 2.4 (\"alphanumeric chars or '-', '_', '.', "
        "'--' and '..' are forbidden\" before 1.0, \"alphanumeric chars, '-', '_' or '.'\" after; \"must be a string\" "
        "in 2.x), with or without its class, and inside vLLM's own wrappers (\"Error retrieving file list: ...\")",
    ),
    Rule(
        "model_path_missing",
        r"Incorrect path_or_model_id: '[^']*'",
        "path_or_model_id",
        seen="transformers utils/hub.py cached_files (4.4x): a path or id that is neither",
    ),
    Rule(
        "offline_not_cached",
        r"(?:Cannot find an appropriate cached snapshot folder for the specified revision on the local disk"
        r"|Cannot find the requested files in the (?:disk )?cache) and outgoing traffic has been disabled"
        r"|OfflineModeIsEnabled|offline mode is enabled\. To disable it",
        seen="huggingface_hub _snapshot_download.py, file_download.py",
    ),
    Rule(
        "offline_not_cached",
        r"Cache directory not found: \S+",
        "no_cache_dir",
        seen="huggingface_hub _snapshot_download.py, file_download.py",
    ),
    Rule(
        "hub_unreachable",
        r"We couldn't connect to '?https?://huggingface\.co'? to load (?:this file|the files)"
        r"|Connection error, and we cannot find the requested files in the cached path"
        r"|We have no connection or you passed local_files_only"
        r"|(?:NameResolutionError|Temporary failure in name resolution|Failed to resolve|ConnectError|ReadTimeout"
        r"|ProxyError|SSLError|Network is unreachable|Connection refused).*(?:huggingface|hf\.co)"
        r"|An error happened while trying to locate the files? on the Hub and we cannot find the"
        r"|(?:MaxRetryError|ConnectionError|ConnectTimeout).*huggingface\.co"
        r"|LocalEntryNotFoundError: (?:An error happened|Connection error)",
        seen="transformers utils/hub.py, huggingface_hub (all versions)",
    ),
    Rule(
        "unauthorized",
        r"invalid header '?Authorization|Invalid (?:leading whitespace|return character).* in header value"
        r"|Illegal header value b?'Bearer",
        "token_format",
        seen="HTTP clients refusing a token with a newline or spaces (requests, h11, Rust clients)",
    ),
    Rule("unauthorized", r"401 Client Error|'401 Unauthorized'", weak=True, seen="huggingface_hub raise_for_status"),
    # --- the model's code ------------------------------------------------------------------------
    Rule(
        "unsupported_architecture",
        r"Model architectures? .+ (?:are|is) not supported for now",
        seen="0.4-0.32 vllm/model_executor/models/registry.py",
    ),
    Rule("unsupported_architecture", r"Model architecture \S+ was supported in vLLM until", seen="0.32 registry.py"),
    Rule("unsupported_architecture", r"Model architecture \S+ is not supported in-tree anymore", seen="0.32 registry.py"),
    Rule(
        "unsupported_architecture",
        r"has model type `?[\w.-]+`? but Transformers does not recognize this architecture",
        seen="transformers configuration_auto.py",
    ),
    Rule(
        "unsupported_architecture",
        r"has no vLLM implementation and the Transformers implementation is not compatible with vLLM"
        r"|Unrecognized configuration class .* for this kind of AutoModel|does not support the '?\w+'? (?:task|runner)"
        r"|config_class = CONFIG_MAPPING\[config_dict\[.model_type.\]\]"
        r"|Cannot find model module\. '\S+' is not a registered model",
        seen="0.8-0.32 registry.py / transformers backend",
    ),
    Rule(
        "unsupported_architecture",
        r"^KeyError: '(?:[\w-]+\.){2,}[\w-]+'$",
        "weight_names",
        seen="vllm/model_executor/models/*.py load_weights (0.2-0.32): params_dict[name] for a checkpoint tensor the "
        "implementation has no parameter for, e.g. a quantization's scales or another key layout",
    ),
    Rule(
        "unsupported_architecture",
        r"There is no module or parameter named '?[\w.-]+'? in \w+",
        "weight_names",
        seen="vllm/model_executor/models/utils.py AutoWeightsLoader._load_module (0.7-0.32), the same cause",
    ),
    Rule(
        "trust_remote_code",
        r"contains custom code which must be executed|references custom code contained in"
        r"|(?:pass the argument|set the option) `trust_remote_code=True`"
        r"|consider setting `trust_remote_code=True`|requires you to execute the (?:configuration|tokenizer|modeling) file",
        seen="transformers dynamic_module_utils.py, vllm/transformers_utils",
    ),
    Rule(
        "disk_full",
        r"No space left on device|os error 28|\[Errno 28\]|Not enough free disk space to download the file",
        seen="ENOSPC from Python or Rust I/O; huggingface_hub's free-space check before a download",
    ),
    # pydantic's wrapper of any validator's ValueError: last, so the wrapped wording names the cause first.
    Rule(
        "bad_arguments",
        r"^Value error, ",
        "value_error",
        seen="0.10-0.32 pydantic validators on vllm/config dataclasses",
    ),
    # --- faults that may be the machine's, the image's software, unreadable model files: fault_rules
)
# The one table: the causes a setting, the Hub or the model's code fix first, then the faults.
RULES: tuple[Rule, ...] = _SETTINGS_RULES + FAULT_RULES

KINDS_WITH_RULES = frozenset(rule.kind for rule in RULES)


# --- reading lines -------------------------------------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
# Wrappers some program put in front of a line; stripped repeatedly, outermost first.
_PREFIXES: tuple[re.Pattern[str], ...] = tuple(
    re.compile(p)
    for p in (
        r"^\s*(?:>\s?)+",  # markdown quotes
        r"^\s*[|│┃]\s?(?=\S)",  # CI and table gutters
        r"^\s*`{1,3}(?:\w+\s*$)?",  # backticks, code fences
        r"^\s*\d+[:.]\s*(?=\d{4}-\d\d-\d\d)",  # line numbers of a log viewer before a timestamp
        r"^\s*\[?\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d| ?UTC)?\]?\s*",  # timestamps
        r"^\s*[\w.-]+(?:[-_]\d+)?\s+\|\s",  # docker compose "service-1  | "
        # "(EngineCore_DP0 pid=412) ", "(RayWorker pid=1, ip=...)", 0.8-0.10's "(VllmWorker rank=0 pid=7) "
        r"^\s*\((?:[\w.:=-]+ ){0,2}pid=\d+(?:, ip=[\d.:a-f]+)?\)\s*",
        r"^\s*\[rank\d+\]:\s?",  # torch.distributed
        r"^\s*\[\d+,\d+\]<std(?:out|err)>:\s?",  # mpirun
        # vLLM's logger: "ERROR 11-29 15:35:30 [core.py:1510] " and the older "ERROR 05-01 12:00:00 core.py:100] "
        r"^\s*(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\s+\[?[\w./-]+(?::\d+)?\]\s?",
        r"^\s*(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s*:\s+(?=\S)",  # uvicorn / logging basicConfig
    )
)
_MAX_PREFIX_PASSES = 8


def clean_line(line: str) -> str:
    """One output line without ANSI colours or the wrappers of the programs that relayed it."""
    text = _ANSI.sub("", line[:MAX_LINE_CHARS]).replace("\r", "")
    for _ in range(_MAX_PREFIX_PASSES):
        before = text
        for prefix in _PREFIXES:
            text = prefix.sub("", text, count=1)
        if text == before:
            break
    text = text.strip()
    return text.strip("`").strip() if text.endswith("`") else text


def clean_lines(output: str) -> list[str]:
    return [clean_line(line) for line in output.splitlines()]


@dataclass(frozen=True)
class Hit:
    """A rule that matched: the line (joined with the next one when the wording spans both)."""

    index: int
    line: str
    rule: Rule
    match: re.Match[str]


# Joins are tried only from a line long enough to have been wrapped, over at most this many lines.
_WRAP_MIN_CHARS = 20
_WRAP_MAX_LINES = 4


def find_hits(lines: Sequence[str]) -> list[Hit]:
    """Every line that shows a cause, in order; a line matched by no rule alone is tried joined with the next."""
    hits: list[Hit] = []
    for index, line in enumerate(lines):
        hit = _match(index, line, len(line))
        if hit is None and len(line) >= _WRAP_MIN_CHARS:
            hit = _match_wrapped(lines, index)
        if hit is not None:
            hits.append(hit)
    return hits


def _match_wrapped(lines: Sequence[str], index: int) -> Hit | None:
    """A wording hard-wrapped over the next lines (at a space, or mid-word)."""
    own = len(lines[index])
    spaced = glued = lines[index]
    for following in lines[index + 1 : index + _WRAP_MAX_LINES]:
        if not following:
            return None
        spaced, glued = f"{spaced} {following}", glued + following
        for joined in (glued, spaced):
            hit = _match(index, joined, own)
            if hit is not None:
                return hit
    return None


def root_hit(line: str) -> Hit | None:
    """The root-scope rule that the root exception line matches, if any."""
    for rule in RULES:
        if rule.scope == "root":
            match = rule.regex.search(line)
            if match:
                return Hit(-1, line, rule, match)
    return None


def _match(index: int, text: str, own: int) -> Hit | None:
    for rule in RULES:
        if rule.scope != "any":
            continue
        match = rule.regex.search(text)
        # A match that lies wholly in the next line belongs to that line.
        if match and match.start() < own:
            return Hit(index, text, rule, match)
    return None


# --- the root exception -------------------------------------------------------------------------

_EXCEPTION = re.compile(
    r"^(?:[A-Za-z_][\w]*\.)*(?:[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failure|Fault)|AssertionError|KeyError)"
    r"(?:\([\w.]+\))?(?::\s*(?P<text>.*))?$"
)
_WORKER_FAILED = re.compile(r"Worker failed with error '(?P<inner>.+)', please check the stack trace above", re.I)
# Lines that wrap the root cause instead of being it.
_WRAPPERS = re.compile(
    r"Engine core initialization failed|Engine process failed to start|EngineCore failed to start"
    r"|See root cause above|check the stack trace above|RayTaskError|CalledProcessError|EngineDeadError"
    r"|failed to be inspected|^SystemExit|^KeyboardInterrupt|CancelledError|^(?:\S+\.)?ChildProcessError"
    r"|Engine core proc \S+ died|APIServer failed|Failed core proc",
    re.I,
)
_CHAIN = re.compile(
    r"The above exception was the direct cause of the following exception|During handling of the above exception"
)


def root_error(lines: Sequence[str]) -> str | None:
    """vLLM's own root exception line of the last error chain, without its wrappers; None when there is none."""
    candidates: list[tuple[int, str]] = []
    for index, line in enumerate(lines):
        inner = _WORKER_FAILED.search(line)
        if inner:
            candidates.append((index, inner.group("inner").strip()))
        elif _EXCEPTION.match(line) and not _WRAPPERS.search(line):
            candidates.append((index, line))
    if not candidates:
        return None
    position = len(candidates) - 1
    # Walk the chain back: the exception printed before "direct cause of" is the inner one.
    while position > 0:
        previous_index = candidates[position - 1][0]
        between = lines[previous_index + 1 : candidates[position][0]]
        if any(_CHAIN.search(line) for line in between):
            position -= 1
        else:
            break
    return candidates[position][1]


def last_words(lines: Sequence[str], count: int = 3) -> list[str]:
    """The engine's last non-empty lines, for a failure with no exception at all."""
    return [line for line in lines if line.strip()][-count:]
