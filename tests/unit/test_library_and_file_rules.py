"""A missing library and unreadable model files are named, from the wordings of the libraries that say so.

Each text below is the message as its library's source builds it (torch's `_OpNamespace`,
vLLM's DeepGEMM wrapper and flash-attention package, triton's libcuda lookup, GCC and GNU ld
as this machine's toolchain prints them, the safetensors binding, vLLM's and mistral_common's
tokenizer loaders, jinja2), inside the log shape the worker's tail has. The field corpus
(tests/field/startup_failures) checks the same rules on what people posted.
"""

from __future__ import annotations

import pytest

from tests.support import vllm_texts as t
from tests.support.vllm_texts import SP, vllm_log
from vllm_worker.diagnosis.startup_errors import explain
from vllm_worker.diagnosis.verdict import Failure

LIBRARY = {
    # torch/_ops.py _OpNamespace.__getattr__: f"'_OpNamespace' '{self.name}' object has no attribute '{op_name}'"
    "compiled op missing": t.engine_core_crash(
        "AttributeError: '_OpNamespace' '_C' object has no attribute 'rms_norm'"
    ),
    # vllm/utils/deep_gemm.py _missing, vLLM 0.32
    "DeepGEMM (0.32)": t.engine_core_crash(
        "RuntimeError: DeepGEMM backend is unavailable in the current vLLM environment, or the available "
        "DeepGEMM package does not provide the required APIs for these kernels."
    ),
    # the same placeholder before it was reworded
    "DeepGEMM (earlier)": t.engine_core_crash(
        "RuntimeError: DeepGEMM backend is not available or outdated. Please install or update the `deep_gemm` "
        "to a newer version to enable FP8 kernels."
    ),
    # vllm/vllm_flash_attn/__init__.py, relayed by the multiprocessing executor's wrapper
    "flash-attention extensions": t.engine_core_crash(
        "RuntimeError: Worker failed with error 'vllm.vllm_flash_attn requires the CUDA flash attention extensions "
        "(_vllm_fa2_C or _vllm_fa3_C). On ROCm, use upstream flash_attn.', please check the stack trace above for "
        "the root cause"
    ),
    # triton/backends/nvidia/driver.py libcuda_dirs
    "libcuda for triton": t.engine_core_crash("AssertionError: libcuda.so cannot found!\n"),
    # GCC, building triton's launcher stub; no Python exception follows in the tail
    "a header": "\n".join(
        [
            vllm_log("Loading weights took 2.10 seconds", where="default_loader.py:291"),
            "/tmp/tmpab12cd34/main.c:5:10: fatal error: Python.h: No such file or directory",
            "    5 | #include <Python.h>",
            "      |          ^~~~~~~~~~",
            "compilation terminated.",
        ]
    ),
    # GNU ld, linking the same stub
    "a shared library for the linker": t.engine_core_crash(
        "torch._inductor.exc.InductorError: CalledProcessError: Command '['/usr/bin/gcc', '/tmp/tmpx/main.c', "
        "'-O3', '-shared', '-fPIC', '-lcuda', '-o', '/tmp/tmpx/cuda_utils.so']' returned non-zero exit status 1.",
        before="/usr/bin/ld: cannot find -lcuda: No such file or directory\ncollect2: error: ld returned 1 exit status",
    ),
}

FILES = {
    # safetensors' binding, logged by vLLM as an ERROR line above the traceback
    "safetensors header": "\n".join(
        [
            vllm_log("Error while deserializing header: MetadataIncompleteBuffer", level="ERROR", where="engine.py:448"),
            vllm_log("Traceback (most recent call last):", level="ERROR", where="engine.py:448"),
            vllm_log(f'  File "{SP}/vllm/engine/multiprocessing/engine.py", line 82, in __init__', level="ERROR", where="engine.py:448"),
        ]
    ),
    # vllm/transformers_utils/tokenizer.py get_tokenizer (early versions)
    "tokenizer": t.engine_core_crash(
        "RuntimeError: Failed to load the tokenizer. If you are using a LLaMA-based model, use "
        "'hf-internal-testing/llama-tokenizer' instead of the original tokenizer."
    ),
    # transformers tokenization_mistral_common.py from_pretrained
    "mistral tokenizer file": t.engine_core_crash("ValueError: No tokenizer file found in directory: /models/acme"),
    # jinja2/exceptions.py, the chat template
    "chat template": t.engine_core_crash(
        "jinja2.exceptions.TemplateSyntaxError: expected token 'end of print statement', got 'name'"
    ),
    # jinja2's other compile-time error, a filter the template's environment lacks; the line as posted in
    # https://github.com/GoSecure/malboxes/issues/80 (jinja2's own words; a chat template fails the same way)
    "chat template assertion": t.engine_core_crash(
        "jinja2.exceptions.TemplateAssertionError: no filter named 'tojson'"
    ),
}


@pytest.mark.parametrize("name", sorted(LIBRARY))
def test_a_missing_or_broken_library_is_named_as_an_image_problem(name: str) -> None:
    diagnosis = explain(Failure.of(LIBRARY[name], "acme/m", exit_code=1))
    assert diagnosis.kind == "missing_library", (diagnosis.kind, diagnosis.message)
    assert "This is a problem of the image, not of the settings" in diagnosis.message
    assert diagnosis.evidence


@pytest.mark.parametrize("name", sorted(FILES))
def test_unreadable_model_files_are_named(name: str) -> None:
    diagnosis = explain(Failure.of(FILES[name], "acme/m", exit_code=1))
    assert diagnosis.kind == "model_files_broken", (diagnosis.kind, diagnosis.message)
    assert diagnosis.message.startswith("vLLM could not read the files of MODEL_NAME='acme/m': ")
    assert diagnosis.evidence


def test_a_compiler_line_does_not_hide_a_memory_failure_in_the_same_output() -> None:
    text = "/tmp/t/main.c:5:10: fatal error: Python.h: No such file or directory\n" + t.TORCH_OOM
    assert explain(Failure.of(text, "acme/m", exit_code=1)).kind == "memory_shortfall"


def test_a_compiled_op_of_another_namespace_is_not_called_a_missing_library() -> None:
    text = t.engine_core_crash("AttributeError: '_OpNamespace' 'aten' object has no attribute 'no_such_op'")
    assert explain(Failure.of(text, "acme/m", exit_code=1)).kind == "unknown"


@pytest.mark.parametrize("name", ["chat template", "chat template assertion"])
def test_a_chat_template_that_does_not_parse_points_at_chat_template(name: str) -> None:
    diagnosis = explain(Failure.of(FILES[name], "acme/m", exit_code=1))
    assert diagnosis.kind == "model_files_broken", diagnosis.message
    message = diagnosis.message
    assert "To fix: if CHAT_TEMPLATE is set, correct or unset it; otherwise set CHAT_TEMPLATE to a template that parses" in message
