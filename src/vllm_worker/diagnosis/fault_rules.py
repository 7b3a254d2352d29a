"""The wordings of faults that are not the settings: the machine, the image's software, the model's files.

One family of `rules.RULES` (the table callers see), kept in its own data module so the table
stays readable; `Rule`, the type of every row, lives here too. Each row names the versions and
sources its wording was read in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property


@dataclass(frozen=True)
class Rule:
    """One wording of one cause.

    kind: the cause (a key of `startup_errors.KINDS`). pattern: a regular expression, matched
    case-insensitively; a plain space in it matches any run of whitespace. detail: which
    wording, where the message depends on it. weak: names the cause only when no other rule
    matched (a 401 line is also part of a gated-repo chain). seen: versions and sources.
    scope: "any" line, or only the "root" exception line. tier: 0, or 1 for the machine's faults.
    """

    kind: str
    pattern: str
    detail: str | None = None
    weak: bool = False
    seen: str = ""
    # "root": matched only against vLLM's root exception line (see `root_error`), for causes whose
    # words also appear in harmless warnings of a good start (an ImportError caught and logged).
    scope: str = "any"
    # 1: a fault of the machine; names the cause only when no tier-0 rule matched (an NCCL error in
    # one rank after an out-of-memory in another is the out-of-memory's echo).
    tier: int = 0

    @cached_property
    def regex(self) -> re.Pattern[str]:
        return re.compile(flexible_spaces(self.pattern), re.IGNORECASE)


def flexible_spaces(pattern: str) -> str:
    """Plain spaces outside character classes become \\s+ (retyped and re-wrapped text)."""
    out: list[str] = []
    in_class = escaped = False
    for char in pattern:
        if escaped:
            out.append(char)
            escaped = False
        elif char == "\\":
            out.append(char)
            escaped = True
        elif char == "[":
            in_class = True
            out.append(char)
        elif char == "]":
            in_class = False
            out.append(char)
        elif char == " " and not in_class:
            out.append(r"\s+")
        else:
            out.append(char)
    return "".join(out)


FAULT_RULES: tuple[Rule, ...] = (
    # --- faults that may be the machine's ----------------------------------------------------------
    Rule(
        "host_fault",
        r"NCCL error|ncclInternalError|ncclUnhandledCudaError|ncclSystemError|ncclRemoteError|NCCL WARN"
        r"|DistBackendError|Watchdog caught collective operation timeout|NCCL communicator was aborted",
        "nccl",
        tier=1,
        seen="torch.distributed / NCCL (all versions)",
    ),
    Rule(
        "host_fault",
        r"Found no NVIDIA driver on your system|NVIDIA driver on your system is too old"
        r"|CUDA driver version is insufficient|No CUDA GPUs are available|no CUDA-capable device is detected"
        r"|CUDA error: system not yet initialized|cudaErrorSystemNotReady|Failed to infer device type"
        r"|Failed to initialize NVML|NVML_SUCCESS == r INTERNAL ASSERT FAILED|forward compatibility was attempted"
        r"|cudaErrorNoDevice|cudaErrorInsufficientDriver|No HIP GPUs are available|hipErrorNoDevice"
        r"|CUDA driver initialization failed|Unexpected error from cudaGetDeviceCount|CUDA unknown error"
        r"|DeferredCudaCallError|NVMLError|AmdSmi\w*Exception|AMDSMI_STATUS_|No supported device detected"
        r"|No (?:CUDA|ROCm|XPU|TPU|HPU|NPU)[- ]capable device|Failed to get global TPU topology|Device acquire failed",
        "driver",
        tier=1,
        seen="torch CUDA init, NVML, vLLM platform detection (all versions)",
    ),
    # Before the device rule: "CUDA error: no kernel image ..." is the architecture, not a failing device.
    Rule(
        "host_fault",
        r"no kernel image is available for execution on the device|no binary for gpu|hipErrorNoBinaryForGpu"
        r"|sm_\d+ is not compatible with the current PyTorch installation|device kernel image is invalid"
        r"|CUDA_ERROR_INVALID_IMAGE|cudaErrorInvalidKernelImage|CUDA_ERROR_NO_BINARY_FOR_GPU|cudaErrorNoKernelImageForDevice",
        "arch",
        seen="CUDA runtime/driver errors 200 and 209 (cudaErrorInvalidKernelImage, cudaErrorNoKernelImageForDevice) as "
        "torch and Triton's driver (\"Triton Error [CUDA]: device kernel image is invalid\") print them; HIP's "
        "hipErrorNoBinaryForGpu: kernels built for another GPU architecture, or by a CUDA newer than the driver",
        tier=1,
    ),
    Rule(
        "host_fault",
        r"uncorrectable ECC error|an illegal memory access was encountered|unspecified launch failure"
        r"|device\(s\) is/are busy or unavailable|cudaErrorDevicesUnavailable|cudaErrorECCUncorrectable"
        r"|CUDA error: (?:misaligned address|an illegal instruction|unknown error|launch failure)"
        r"|GPU is lost|has fallen off the bus|hipErrorIllegalAddress|HSA_STATUS_ERROR|is_gds_supported\(\d+\) failed"
        r"|UR_RESULT_ERROR_DEVICE_LOST|cudaErrorLaunchFailure|DEVICE_LOST"
        r"|(?:CUDA|HIP) error: (?!out of memory)[a-z]",
        "device",
        tier=1,
        seen="CUDA/HIP runtime errors of a failing or busy device",
    ),
    Rule(
        "host_fault",
        r"\bIllegal instruction\b(?: +\(core dumped\))?|SIGILL",
        "cpu",
        seen="a CPU without an instruction set the engine was built for (AVX-512 on the CPU backend)",
        tier=1,
    ),
    # --- the image's software ------------------------------------------------------------------------
    Rule(
        "missing_library",
        r"^(?:\S+\.)?ModuleNotFoundError: No module named|^(?:\S+\.)?ImportError: |undefined symbol: "
        r"|cannot open shared object file|DLL load failed|is not installed\. Please install",
        seen="Python import errors and the dynamic loader",
        scope="root",
    ),
    Rule(
        "missing_library",
        r"'_OpNamespace' '_\w*C\w*' object has no attribute",
        "compiled_ops",
        seen="torch/_ops.py _OpNamespace.__getattr__: an op of vLLM's compiled extension (_C, _C_utils, _moe_C) "
        "is missing, the extension was built for another platform or not at all",
        scope="root",
    ),
    Rule(
        "missing_library",
        r"DeepGEMM backend is (?:not available or outdated|unavailable)"
        r"|requires the CUDA flash attention extensions|libcuda\.so cannot found",
        seen="vllm/utils/deep_gemm.py _missing (\"not available or outdated\" to 0.2x, \"unavailable in the current "
        "vLLM environment\" in 0.32); vllm/vllm_flash_attn/__init__.py; triton backends/nvidia/driver.py libcuda_dirs",
        scope="root",
    ),
    # The compiler and linker print these on their own lines, before the Python error that wraps
    # them (a triton or Inductor build step); weak, so a named cause in the same output wins.
    Rule(
        "missing_library",
        r"fatal error: '?[\w./+-]+\.h'?(?:: No such file or directory| file not found)"
        r"|\bld(?:\.\w+)?: cannot find -l[\w.+-]+",
        "toolchain",
        weak=True,
        seen="GCC and clang for a missing header, GNU ld for a missing library (wordings checked with gcc 12/binutils)",
    ),
    Rule(
        "missing_library",
        r"CalledProcessError: Command '\['[^']*?\b(?:gcc|g\+\+|cc|c\+\+|clang(?:\+\+)?)'",
        "toolchain",
        weak=True,
        seen="torch/_inductor and triton's runtime build: the C compiler of the image failed on a generated file",
    ),
    # --- the model's files cannot be read ----------------------------------------------------------
    # The safetensors binding's wording, also when vLLM logs it as an ERROR line instead of the root.
    Rule(
        "model_files_broken",
        r"Error while deserializing header: \w+",
        seen="safetensors (Rust binding, all versions; 0.8 checked): SafeTensorError variants such as "
        "InvalidHeaderDeserialization, MetadataIncompleteBuffer, HeaderTooLarge",
    ),
    Rule(
        "model_files_broken",
        r"SafetensorError|Error while deserializing header|HeaderTooLarge|incomplete metadata, file not fully covered"
        r"|JSONDecodeError|Can't load tokenizer for|Unrecognized model in \S+"
        r"|does not appear to have a file named|Can't load the configuration of|is not a valid JSON file"
        r"|Error parsing line|UnicodeDecodeError: 'utf-8' codec can't decode",
        seen="safetensors, json, transformers loading (all versions)",
        scope="root",
    ),
    Rule(
        "model_files_broken",
        r"Failed to load the tokenizer|No tokenizer file found",
        "tokenizer",
        seen="vllm transformers_utils/tokenizer.py get_tokenizer (0.1-0.x; 0.32's trust_remote_code variant is matched "
        "by that rule first); mistral_common tokens/tokenizers/utils.py and transformers tokenization_mistral_common.py",
        scope="root",
    ),
    Rule(
        "model_files_broken",
        r"^(?:jinja2\.exceptions\.)?Template(?:Syntax|Assertion)Error: ",
        "chat_template",
        seen="jinja2/exceptions.py: the chat template (the model's tokenizer_config.json or CHAT_TEMPLATE) does not parse",
        scope="root",
    ),
)
