"""Real-shaped excerpts of `vllm serve` output (vLLM 0.32.0), for the classifier's tests.

Every exception text below is copied from the vLLM 0.32 / transformers 5.19 /
huggingface_hub 2.4 / torch sources installed in `.venv-engine` (file and line in the
comment above each), or was printed by those libraries when `EngineArgs(...)
.create_engine_config()` ran here against a local Hub stand-in (marked "captured").
The surrounding lines follow vLLM's own log format (vllm/logger.py `_FORMAT`,
vllm/logging_utils/formatter.py `NewLineFormatter`: every line of a multi-line
record, traceback included, carries the prefix), and the failure shapes follow
vllm/v1/engine/core.py:1510 ("EngineCore failed to start.", then the exception)
and vllm/v1/engine/utils.py:1431 (the API server's "Engine core initialization
failed"), which is what the worker's tail ends with after a root cause.

GPU-only texts cannot be produced on this machine; they are built from the source
strings with plausible numbers. Real CPU-engine output is added by the engine tests.
"""

from __future__ import annotations

SP = "/usr/local/lib/python3.12/dist-packages"


def vllm_log(message: str, *, level: str = "INFO", where: str = "core.py:1510", proc: str = "EngineCore_DP0 pid=412") -> str:
    """One vLLM log record, every line prefixed the way vLLM's NewLineFormatter does it."""
    prefix = f"({proc}) {level} 11-29 15:35:30 [{where}] "
    return "\n".join(prefix + line for line in message.split("\n"))


# --- a successful start (GPU): none of these lines may be classified ----------

SUCCESS_GPU = "\n".join(
    [
        vllm_log("vLLM API server version 0.32.0", where="utils.py:299", proc="APIServer pid=1"),
        vllm_log("Resolved architecture: LlamaForCausalLM", where="model.py:733", proc="APIServer pid=1"),
        vllm_log("Using max model len 131072", where="model.py:2152", proc="APIServer pid=1"),
        # vllm/v1/worker/gpu_model_runner.py:5150
        vllm_log("Model loading took 14.99 GiB memory and 9.412373 seconds", where="gpu_model_runner.py:5150"),
        # vllm/v1/worker/gpu_worker.py:759
        vllm_log("Available KV cache memory: 52.13 GiB", where="gpu_worker.py:759"),
        # vllm/v1/worker/gpu_worker.py:774 (mentions OOM and --gpu-memory-utilization on a healthy start)
        vllm_log(
            "CUDA graph memory profiling is enabled (default since v0.21.0). The current "
            "--gpu-memory-utilization=0.9200 is equivalent to --gpu-memory-utilization=0.9112 without "
            "CUDA graph memory profiling. To maintain the same effective KV cache size as before, increase "
            "--gpu-memory-utilization to 0.9288. To disable, set VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0.",
            where="gpu_worker.py:774",
        ),
        # vllm/v1/core/kv_cache_utils.py:2327
        vllm_log(
            "GPU KV cache size: 426,880 tokens, Maximum concurrency for 131,072 tokens per request: 3.26x",
            where="kv_cache_utils.py:2327",
        ),
        # vllm/v1/worker/gpu_model_runner.py:6582
        vllm_log("Graph capturing finished in 3 secs, took 0.41 GiB", where="gpu_model_runner.py:6582"),
        # vllm/v1/worker/gpu_worker.py:1012 (logged at :1034): the INFO line every successful GPU start prints
        vllm_log(
            "Free memory on device (78.62/79.19 GiB) on startup. Desired GPU memory utilization is "
            "(0.92, 72.85 GiB). Actual usage is 15.27 GiB for consumed memory (weights + non-torch), "
            "5.04 GiB for peak activation, and 0.41 GiB for CUDAGraph memory. Replace "
            "gpu_memory_utilization config with `--kv-cache-memory=55563466342` (51.75 GiB) to fit into "
            "requested memory, or `--kv-cache-memory=62902571622` (58.58 GiB) to fully utilize gpu memory. "
            "Current kv cache memory in use is 52.13 GiB.",
            where="gpu_worker.py:1034",
            proc="EngineCore_DP0 pid=412",
        ),
        # vllm/v1/engine/core.py:403
        vllm_log("init engine (profile, create kv cache, warmup model) took 41.27 s", where="core.py:403"),
        vllm_log("Starting vLLM server on http://127.0.0.1:8000", where="api_server.py:2031", proc="APIServer pid=1"),
        "INFO:     Application startup complete.",
    ]
)

# A successful CPU start (vllm/v1/worker/cpu_worker.py:260 and kv_cache_utils.py:2327).
SUCCESS_CPU = "\n".join(
    [
        vllm_log(
            "Auto set (4.91/23.43) GiB for KV cache on node 0, with 21.09 GiB requested memory for the "
            "worker. 0.83 GiB memory was consumed by non-kv usages.",
            where="cpu_worker.py:260",
        ),
        vllm_log(
            "CPU KV cache size: 42,880 tokens, Maximum concurrency for 2,048 tokens per request: 20.94x",
            where="kv_cache_utils.py:2327",
        ),
        "INFO:     Application startup complete.",
    ]
)


def engine_core_crash(exception_lines: str, *, before: str = "") -> str:
    """An engine-core start failure as the worker's tail shows it.

    The engine core logs the exception under "EngineCore failed to start."
    (vllm/v1/engine/core.py:1510), the multiprocessing bootstrap prints it again, and
    the API server ends with "Engine core initialization failed"
    (vllm/v1/engine/utils.py:1431): the root cause is never on the last line.
    """
    logged = (
        "EngineCore failed to start.\n"
        "Traceback (most recent call last):\n"
        f'  File "{SP}/vllm/v1/engine/core.py", line 1491, in run_engine_core\n'
        "    engine_core = EngineCoreProc(*args, engine_index=dp_rank, **kwargs)\n"
        "                  ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
        f"{exception_lines}"
    )
    parts = [before] if before else []
    parts += [
        vllm_log(logged, level="ERROR"),
        "Process EngineCore_DP0:",
        "Traceback (most recent call last):",
        '  File "/usr/lib/python3.12/multiprocessing/process.py", line 314, in _bootstrap',
        "    self.run()",
        exception_lines,
        vllm_log("EngineCore failed to start.", level="ERROR", where="core.py:1510"),
        "Traceback (most recent call last):",
        f'  File "{SP}/vllm/entrypoints/openai/api_server.py", line 2120, in run_server',
        "    async with build_async_engine_client(args) as engine_client:",
        f'  File "{SP}/vllm/v1/engine/utils.py", line 1431, in wait_for_engine_startup',
        "    raise RuntimeError(",
        # vllm/v1/engine/utils.py:1431
        "RuntimeError: Engine core initialization failed. See root cause above. "
        "Failed core proc(s): {'EngineCore_DP0': 1}",
    ]
    return "\n".join(parts)


# --- memory shortfall (GPU) ---------------------------------------------------

# vllm/v1/core/kv_cache_utils.py:1030 (with the estimate of :1025)
KV_TOO_SMALL_WITH_ESTIMATE = engine_core_crash(
    "ValueError: To serve at least one request with the model's max seq len (131072), (16.0 GiB KV "
    "cache is needed, which is larger than the available KV cache memory (9.45 GiB). Based on the "
    "available memory, the estimated maximum model length is 77392. Try increasing "
    "`gpu_memory_utilization` (which also controls CPU memory on the CPU backend) or decreasing "
    "`max_model_len` when initializing the engine. See "
    "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.",
    before=SUCCESS_GPU.split("\n")[3],
)

# vllm/v1/core/kv_cache_utils.py:1030 without the estimate (estimated_max_len == 0)
KV_TOO_SMALL_NO_ESTIMATE = engine_core_crash(
    "ValueError: To serve at least one request with the model's max seq len (32768), (4.0 GiB KV "
    "cache is needed, which is larger than the available KV cache memory (0.0 GiB). Try increasing "
    "`gpu_memory_utilization` (which also controls CPU memory on the CPU backend) or decreasing "
    "`max_model_len` when initializing the engine. See "
    "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
)

# vllm/v1/core/kv_cache_utils.py:1009
NO_CACHE_BLOCKS = engine_core_crash(
    "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
    "when initializing the engine (this flag also controls CPU memory reservation on the CPU backend, "
    "despite its name). See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more "
    "details."
)

# vllm/v1/core/kv_cache_utils.py:2454 (MAX_MODEL_LEN=auto; runs before the :1010 check)
CANNOT_AUTO_FIT = engine_core_crash(
    "ValueError: Cannot auto-fit max_model_len: not enough GPU memory available to serve even a "
    "single token. Try increasing `gpu_memory_utilization`."
)

# vllm/v1/worker/gpu_model_runner.py:5140 logs this, then torch's CUDA allocator
# (c10/cuda/CUDACachingAllocator.cpp, torch 2.x) raises torch.OutOfMemoryError.
TORCH_OOM_AT_LOAD = engine_core_crash(
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 896.00 MiB. GPU 0 has a total "
    "capacity of 23.53 GiB of which 214.06 MiB is free. Including non-PyTorch memory, this process has "
    "23.30 GiB memory in use. Of the allocated memory 22.89 GiB is allocated by PyTorch, and 12.31 MiB "
    "is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
    "Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
    before=vllm_log(
        "Failed to load model - not enough GPU memory. Try lowering --gpu-memory-utilization to free "
        "memory for weights, increasing --tensor-parallel-size, or using --quantization. See "
        "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more tips. (original error: "
        "CUDA out of memory. Tried to allocate 896.00 MiB. GPU 0 has a total capacity of 23.53 GiB of "
        "which 214.06 MiB is free.)",
        level="ERROR",
        where="gpu_model_runner.py:5147",
    ),
)

# torch's CUDA allocator during graph capture / profiling (no "Failed to load model" before it)
TORCH_OOM = engine_core_crash(
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
    "of 31.36 GiB of which 1.12 GiB is free. Including non-PyTorch memory, this process has 30.23 GiB "
    "memory in use."
)

# c10/cuda/CUDAException.h C10_CUDA_CHECK (cudaErrorMemoryAllocation's text is "out of memory")
CUDA_ERROR_OOM = engine_core_crash(
    "RuntimeError: CUDA error: out of memory\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
    "below might be incorrect.\n"
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions."
)

# vllm/v1/worker/gpu_model_runner.py:5990 (_dummy_sampler_run, called from gpu_worker.py:1058)
SAMPLER_WARMUP_OOM = engine_core_crash(
    "RuntimeError: CUDA out of memory occurred when warming up sampler with 256 dummy requests. Please "
    "try lowering `max_num_seqs` or `gpu_memory_utilization` when initializing the engine."
)

# --- memory shortfall (CPU backend) ---------------------------------------------

# vllm/v1/worker/cpu_worker.py:241 (requested_memory_for_kv <= 0: the weights took the reservation)
CPU_KV_NO_ROOM = engine_core_crash(
    "ValueError: Available memory on node 0 (18.92/23.43 GiB) on kv cache allocation is less than "
    "requested memory for kv (-0.37/4.69 GiB). Reduce CPU memory used by other processes."
)

# vllm/v1/worker/cpu_worker.py:219 (explicit KV size: VLLM_CPU_KVCACHE_SPACE / --kv-cache-memory-bytes)
CPU_KV_EXPLICIT_TOO_BIG = engine_core_crash(
    "ValueError: Available memory on node 0 (18.92/23.43 GiB) on kv cache allocation is less than "
    "requested memory for kv (40.0 GiB). Decrease --kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE, or "
    "reduce CPU memory used by other processes."
)

# torch's CPU allocator, c10/core/impl/alloc_cpu.cpp (string in torch/lib/libc10.so)
CPU_ALLOCATOR_OOM = engine_core_crash(
    "RuntimeError: [enforce fail at alloc_cpu.cpp:121] data. DefaultCPUAllocator: can't allocate memory: "
    "you tried to allocate 34359738368 bytes. Error code 12 (Cannot allocate memory)"
)

# --- memory held by another process --------------------------------------------

# vllm/v1/worker/utils.py:762 (request_memory), raised from gpu_worker.py init_device
FREE_MEMORY_LESS_THAN_DESIRED = engine_core_crash(
    "ValueError: Free memory on device cuda:0 (10.48/79.19 GiB) on startup is less than desired GPU "
    "memory utilization (0.92, 72.85 GiB). Decrease GPU memory utilization or reduce GPU memory used by "
    "other processes."
)

# vllm/v1/worker/utils.py:741 (externally held weights)
FREE_MEMORY_LESS_THAN_BUDGET = engine_core_crash(
    "ValueError: Free memory on device cuda:0 (20.11/79.19 GiB) on startup is less than the engine's "
    "budget after excluding external process's weights (0.92, 40.2 GiB). Decrease GPU memory "
    "utilization or reduce GPU memory used by other processes."
)

# vllm/v1/worker/cpu_worker.py:83
CPU_AVAILABLE_LESS_THAN_DESIRED = engine_core_crash(
    "ValueError: Available memory on node 0 (6.12/23.43 GiB) on startup is less than desired CPU memory "
    "utilization (0.9, 21.09 GiB). On the CPU backend, the `--gpu-memory-utilization` flag controls the "
    "fraction of CPU memory reserved (despite its name). To resolve: decrease `--gpu-memory-utilization` "
    "(e.g. `--gpu-memory-utilization 0.5`) or reduce CPU memory used by other processes."
)

# --- memory profiling race -------------------------------------------------------

# vllm/v1/worker/gpu_worker.py:719 (an assert: AssertionError)
PROFILING_RACE = engine_core_crash(
    "AssertionError: Error in memory profiling. Initial free memory 61.2 GiB, current free memory "
    "63.71 GiB. This happens when other processes sharing the same container release GPU memory while "
    "vLLM is profiling during initialization. To fix this, ensure consistent GPU memory allocation or "
    "isolate vLLM in its own container."
)

# --- raised in the API server process (config validation, Hub access) ------------

_CREATE_CONFIG = (
    "Traceback (most recent call last):\n"
    f'  File "{SP}/vllm/engine/arg_utils.py", line 2240, in create_engine_config\n'
    "    model_config = self.create_model_config()\n"
    "                   ^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
    f'  File "{SP}/vllm/engine/arg_utils.py", line 1955, in create_model_config\n'
    "    return ModelConfig(\n"
    "           ^^^^^^^^^^^^\n"
    f'  File "{SP}/pydantic/_internal/_dataclasses.py", line 121, in __init__\n'
    "    s.__pydantic_validator__.validate_python(ArgsKwargs(args, kwargs), self_instance=s)\n"
)

# captured; raised at vllm/config/model.py:2662, wrapped by pydantic
MAX_MODEL_LEN_TOO_LARGE = (
    vllm_log("Resolved architecture: LlamaForCausalLM", where="model.py:733", proc="APIServer pid=1")
    + "\n"
    + _CREATE_CONFIG
    + "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
    "  Value error, User-specified max_model_len (200000) is greater than the derived max_model_len "
    "(max_position_embeddings=131072.0 or model_max_length=None in model's config.json). To allow "
    "overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. VLLM_ALLOW_LONG_MAX_MODEL_LEN "
    "must be used with extreme caution. If the model uses relative position encoding (RoPE), positions "
    "exceeding derived_max_model_len lead to nan. If the model uses absolute position encoding, positions "
    "exceeding derived_max_model_len will cause a CUDA array out-of-bounds error. [type=value_error, "
    "input_value=ArgsKwargs((), {'model': ...nderer_num_workers': 1}), input_type=ArgsKwargs]\n"
    "    For further information visit https://errors.pydantic.dev/2.14/v/value_error"
)

# captured (`vllm serve` exits 2): argparse in vllm/entrypoints/cli/main.py's parser
ARGPARSE_INVALID_INT = (
    "usage: vllm serve [model_tag] [options]\n"
    "vllm serve: error: argument --max-num-seqs: invalid int value: 'abc'"
)
ARGPARSE_INVALID_CHOICE = (
    "usage: vllm serve [model_tag] [options]\n"
    "vllm serve: error: argument --dtype: invalid choice: 'float7' (choose from 'auto', 'bfloat16', "
    "'float', 'float16', 'float32', 'half')"
)
ARGPARSE_UNRECOGNIZED = (
    "usage: vllm [-h] [-v]\n"
    "            {chat,complete,serve,launch,bench,collect-env,download-kernels,preload,run-batch,snapshot}\n"
    "            ...\n"
    "vllm: error: unrecognized arguments: --bogus-flag 1"
)

# captured; pydantic field constraint of vllm/config/cache.py:102 (gpu_memory_utilization le=1)
PYDANTIC_FIELD_ERROR = (
    vllm_log("Using max model len 2048", where="model.py:2152", proc="APIServer pid=1")
    + "\n"
    + "Traceback (most recent call last):\n"
    + f'  File "{SP}/vllm/engine/arg_utils.py", line 2262, in create_engine_config\n'
    + "    cache_config = CacheConfig(\n"
    + "pydantic_core._pydantic_core.ValidationError: 1 validation error for CacheConfig\n"
    "gpu_memory_utilization\n"
    "  Input should be less than or equal to 1 [type=less_than_equal, input_value=1.5, input_type=float]\n"
    "    For further information visit https://errors.pydantic.dev/2.14/v/less_than_equal"
)

# captured; vllm/model_executor/models/registry.py:1205 (list of supported architectures shortened)
UNSUPPORTED_ARCHITECTURE = (
    _CREATE_CONFIG + "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
    "  Value error, Model architectures ['FooBarForCausalLM'] are not supported for now. Supported "
    "architectures: dict_keys(['AfmoeForCausalLM', 'ApertusForCausalLM', 'LlamaForCausalLM', "
    "'TransformersForSequenceClassification', 'TransformersMultiModalForSequenceClassification']) "
    "[type=value_error, input_value=ArgsKwargs((), {'model': ...nderer_num_workers': 1}), "
    "input_type=ArgsKwargs]\n"
    "    For further information visit https://errors.pydantic.dev/2.14/v/value_error"
)

# vllm/model_executor/models/registry.py:1189
PREVIOUSLY_SUPPORTED_ARCHITECTURE = (
    "ValueError: Model architecture MPTForCausalLM was supported in vLLM until v0.10.2, and is not "
    "supported anymore. Please use an older version of vLLM if you want to use this model architecture."
)

# captured; transformers/models/auto/configuration_auto.py:430, logged by
# vllm/transformers_utils/repo_utils.py:124 and then wrapped by pydantic
UNKNOWN_MODEL_TYPE = (
    vllm_log(
        "Error parsing config for acme/new-model: The checkpoint you are trying to load has model type "
        "`acme_unknown` but Transformers does not recognize this architecture. This could be because of "
        "an issue with the checkpoint, or because your version of Transformers is out of date.\n\n"
        "You can update Transformers with the command `pip install --upgrade transformers`. If this does "
        "not work, and the checkpoint is very new, then there may not be a release version that supports "
        "this model yet. In this case, you can get the most up-to-date code by installing Transformers "
        "from source with the command `pip install git+https://github.com/huggingface/transformers.git`",
        level="ERROR",
        where="repo_utils.py:124",
        proc="APIServer pid=1",
    )
    + "\n"
    + _CREATE_CONFIG
    + "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
    "  Value error, The checkpoint you are trying to load has model type `acme_unknown` but Transformers "
    "does not recognize this architecture. This could be because of an issue with the checkpoint, or "
    "because your version of Transformers is out of date."
)

# captured; transformers/dynamic_module_utils.py:788 (vLLM passes trust_remote_code=False)
TRUST_REMOTE_CODE = (
    _CREATE_CONFIG + "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
    "  Value error, The repository acme/custom-model contains custom code which must be executed to "
    "correctly load the model. You can inspect the repository content at https://hf.co/acme/custom-model .\n"
    " You can inspect the repository content at https://hf.co/acme/custom-model.\n"
    "Please pass the argument `trust_remote_code=True` to allow custom code to be run. "
    "[type=value_error, input_value=ArgsKwargs((), {'model': ...nderer_num_workers': 1}), "
    "input_type=ArgsKwargs]"
)

# vllm/tokenizers/hf.py:207 (the tokenizer's class lives in the repository's code)
TRUST_REMOTE_CODE_TOKENIZER = (
    "RuntimeError: Failed to load the tokenizer. If the tokenizer is a custom tokenizer not yet available "
    "in the HuggingFace transformers library, consider setting `trust_remote_code=True` in LLM or using "
    "the `--trust-remote-code` flag in the CLI. If the model was created with a newer version of "
    "transformers, consider upgrading: `uv pip install --upgrade transformers`"
)

# captured: huggingface_hub/utils/_http.py:953 then transformers/utils/hub.py:569
REPO_NOT_FOUND = (
    "huggingface_hub.errors.RepositoryNotFoundError: 404 Client Error. (Request ID: Root=1-abc)\n"
    "Repository Not Found for url: https://huggingface.co/acme/missing-model/resolve/main/config.json.\n"
    "Please make sure you specified the correct `repo_id` and `repo_type`.\n"
    "If you are trying to access a private or gated repo, make sure you are authenticated and your token "
    "has the required permissions.\n"
    "For more details, see https://huggingface.co/docs/huggingface_hub/authentication\n"
    "\n"
    "The above exception was the direct cause of the following exception:\n"
    "\n"
    "Traceback (most recent call last):\n"
    f'  File "{SP}/transformers/utils/hub.py", line 569, in cached_files\n'
    "    raise OSError(\n"
    "OSError: acme/missing-model is not a local folder and is not a valid model identifier listed on "
    "'https://huggingface.co/models'\n"
    "If this is a private repository, make sure to pass a token having permission to this repo either by "
    "logging in with `hf auth login` or by passing `token=<your_token>`"
)

# The real Hub answers 401 (not 404) for a missing repo without a token; the error
# code header still says RepoNotFound (huggingface_hub/utils/_http.py:933-953).
REPO_NOT_FOUND_401 = REPO_NOT_FOUND.replace("404 Client Error", "401 Client Error")

# captured (no token): huggingface_hub/utils/_http.py:892 then transformers/utils/hub.py:610
GATED_REPO = (
    "httpx2.HTTPStatusError: Client error '401 Unauthorized' for url "
    "'https://huggingface.co/acme/gated-model/resolve/main/config.json'\n"
    "For more information check: https://developer.mozilla.org/en-US/docs/Web/HTTP/Status/401\n"
    "\n"
    "The above exception was the direct cause of the following exception:\n"
    "\n"
    "huggingface_hub.errors.GatedRepoError: 401 Client Error. (Request ID: Root=1-abc)\n"
    "Cannot access gated repo for url https://huggingface.co/acme/gated-model/resolve/main/config.json.\n"
    "Access to model acme/gated-model is restricted. You must have access to it and be authenticated to "
    "access it. Please log in.\n"
    "\n"
    "The above exception was the direct cause of the following exception:\n"
    "\n"
    "OSError: You are trying to access a gated repo.\n"
    "Make sure to have access to it at https://huggingface.co/acme/gated-model.\n"
    "401 Client Error. (Request ID: Root=1-abc)\n"
    "Cannot access gated repo for url https://huggingface.co/acme/gated-model/resolve/main/config.json.\n"
    "Access to model acme/gated-model is restricted. You must have access to it and be authenticated to "
    "access it. Please log in."
)

# captured (token without access): 403 with the Hub's "not in the authorized list" message
GATED_REPO_403 = (
    "OSError: You are trying to access a gated repo.\n"
    "Make sure to have access to it at https://huggingface.co/acme/gated-model.\n"
    "403 Client Error. (Request ID: Root=1-abc)\n"
    "Cannot access gated repo for url https://huggingface.co/acme/gated-model/resolve/main/config.json.\n"
    "Access to model acme/gated-model is restricted and you are not in the authorized list. Visit "
    "https://huggingface.co/acme/gated-model to ask for access."
)

# transformers/utils/hub.py:707 and :714 (`has_file`, used when probing a repository's files)
GATED_REPO_HAS_FILE = (
    "OSError: acme/gated-model is a gated repository. Make sure to request access at "
    "https://huggingface.co/acme/gated-model and pass a token having permission to this repo either by "
    "logging in with `hf auth login` or by passing `token=<your_token>`."
)
REPO_NOT_FOUND_HAS_FILE = "OSError: acme/missing-model is not a local folder or a valid repository name on 'https://hf.co'."

# captured: huggingface_hub/utils/_http.py:882 then transformers/utils/hub.py:576
REVISION_NOT_FOUND = (
    "huggingface_hub.errors.RevisionNotFoundError: 404 Client Error. (Request ID: Root=1-abc)\n"
    "Revision Not Found for url: "
    "https://huggingface.co/acme/gone-model/resolve/0123456789abcdef0123456789abcdef01234567/config.json.\n"
    "Invalid rev id: 0123456789abcdef0123456789abcdef01234567\n"
    "\n"
    "The above exception was the direct cause of the following exception:\n"
    "\n"
    "OSError: 0123456789abcdef0123456789abcdef01234567 is not a valid git identifier (branch name, tag name "
    "or commit id) that exists for this model name. Check the model page at "
    "'https://huggingface.co/acme/gone-model' for available revisions."
)

# captured (HF_TOKEN rejected): huggingface_hub/utils/_http.py:996 then transformers/utils/hub.py:630
UNAUTHORIZED = (
    "huggingface_hub.errors.HfHubHTTPError: Client error '401 Unauthorized' for url "
    "'https://huggingface.co/acme/some-model/resolve/main/config.json' (Request ID: Root=1-abc)\n"
    "For more information check: https://developer.mozilla.org/en-US/docs/Web/HTTP/Status/401\n"
    "Invalid credentials in Authorization header\n"
    "\n"
    "The above exception was the direct cause of the following exception:\n"
    "\n"
    "OSError: There was a specific connection error when trying to load acme/some-model:\n"
    "Client error '401 Unauthorized' for url 'https://huggingface.co/acme/some-model/resolve/main/config.json' "
    "(Request ID: Root=1-abc)\n"
    "For more information check: https://developer.mozilla.org/en-US/docs/Web/HTTP/Status/401\n"
    "Invalid credentials in Authorization header"
)

# transformers/utils/hub.py:620: no network. Transient: must not be classified.
HUB_UNREACHABLE = (
    "OSError: We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find them in "
    "the cached files.\n"
    "Check your internet connection or see how to run the library in offline mode at "
    "'https://huggingface.co/docs/transformers/installation#offline-mode'."
)

# --- disk full ---------------------------------------------------------------------

# Python's OSError for ENOSPC while huggingface_hub writes the download
DISK_FULL = (
    f'  File "{SP}/huggingface_hub/file_download.py", line 1712, in _download_to_tmp_and_move\n'
    "    http_get(\n"
    "OSError: [Errno 28] No space left on device: "
    "'/root/.cache/huggingface/hub/models--acme--big-model/blobs/3f1e.incomplete'"
)

# --- unrecognised ------------------------------------------------------------------

UNKNOWN_FAILURE = engine_core_crash(
    "RuntimeError: NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, unhandled system "
    "error (run with NCCL_DEBUG=INFO for details), NCCL version 2.27.3"
)

# The secondary lines alone (vllm/v1/engine/core.py:1510, vllm/v1/engine/utils.py:1431).
NOISE_ONLY = "\n".join(
    [
        vllm_log("EngineCore failed to start.", level="ERROR"),
        "RuntimeError: Engine core initialization failed. See root cause above. "
        "Failed core proc(s): {'EngineCore_DP0': 1}",
    ]
)

# --- a fault of the machine while serving ------------------------------------------------

# Verbatim, the first five lines of the log in https://github.com/vllm-project/vllm/issues/9321
# (October 2024, vLLM version not stated, TP>1): an engine that had served for a long time
# (NCCL work 203441) dies on one request as torch.distributed's watchdog takes the process down.
NCCL_WATCHDOG_WHILE_SERVING = "\n".join(
    [
        "[rank2]:[E1012 22:31:23.331871748 ProcessGroupNCCL.cpp:607] [Rank 2] Watchdog caught collective operation "
        "timeout: WorkNCCL(SeqNum=203441, OpType=GATHER, NumelIn=32064, NumelOut=0, Timeout(ms)=600000) ran for "
        "600085 milliseconds before timing out.",
        "[rank2]:[E1012 22:31:23.332127235 ProcessGroupNCCL.cpp:1664] [PG 3 Rank 2] Exception (either an error or "
        "timeout) detected by watchdog at work: 203441, last enqueued NCCL work: 203441, last completed NCCL work: "
        "203440.",
        "[rank2]:[E1012 22:31:23.332166455 ProcessGroupNCCL.cpp:1709] [PG 3 Rank 2] Timeout at NCCL work: 203441, "
        "last enqueued NCCL work: 203441, last completed NCCL work: 203440.",
        "[rank2]:[E1012 22:31:23.332195576 ProcessGroupNCCL.cpp:621] [Rank 2] Some NCCL operations have failed or "
        "timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on "
        "corrupted/incomplete data.",
        "[rank2]:[E1012 22:31:23.332219360 ProcessGroupNCCL.cpp:627] [Rank 2] To avoid data inconsistency, we are "
        "taking the entire process down.",
    ]
)
