"""Settings are parsed once; a bad value is one sentence naming the variable, the value and what is accepted."""

import pytest

from vllm_worker.config import settings
from vllm_worker.config.settings import SettingsError, load, multiple_of_8_at_least


def test_defaults() -> None:
    s = load({})
    assert s.max_concurrency == 30
    assert s.vllm_port == 8000
    assert s.vllm_command == ("vllm", "serve")
    assert s.vllm_host == "127.0.0.1"


def test_values_are_parsed() -> None:
    s = load(
        {
            "MAX_CONCURRENCY": " 12 ",
            "VLLM_PORT": "8123",
            "VLLM_COMMAND": "/opt/engine/bin/vllm serve",
            "REQUEST_TIMEOUT": "2.5",
            "VLLM_STARTUP_TIMEOUT": "90",
        }
    )
    assert (s.max_concurrency, s.vllm_port, s.request_timeout, s.startup_timeout) == (12, 8123, 2.5, 90.0)
    assert s.vllm_command == ("/opt/engine/bin/vllm", "serve")


def test_empty_value_means_default() -> None:
    assert load({"MAX_CONCURRENCY": ""}).max_concurrency == 30


@pytest.mark.parametrize(
    ("name", "value", "accepted_word"),
    [
        ("MAX_CONCURRENCY", "abc", "whole number"),
        ("MAX_CONCURRENCY", "0", "whole number"),
        ("MAX_CONCURRENCY", "-3", "whole number"),
        ("VLLM_PORT", "70000", "port"),
        ("REQUEST_TIMEOUT", "0", "seconds"),
        ("REQUEST_TIMEOUT", "nan", "seconds"),
        ("VLLM_STARTUP_TIMEOUT", "soon", "seconds"),
        ("VLLM_COMMAND", "vllm 'serve", "quotes"),
    ],
)
def test_bad_value_is_one_sentence(name: str, value: str, accepted_word: str) -> None:
    with pytest.raises(SettingsError) as caught:
        load({name: value})
    message = str(caught.value)
    assert message.startswith(f"{name}={value!r} is not valid: ")
    assert accepted_word in message
    assert message.endswith(".") and "\n" not in message
    assert caught.value.variable == name


def test_every_documented_variable_is_read() -> None:
    for name in settings.DOCUMENTED:
        with pytest.raises(SettingsError):
            load({name: "not-a-valid-value-\"'"})


@pytest.mark.parametrize(("n", "expected"), [(1, 8), (8, 8), (9, 16), (30, 32), (32, 32), (33, 40)])
def test_multiple_of_8(n: int, expected: int) -> None:
    assert multiple_of_8_at_least(n) == expected


def test_memory_wait_settings() -> None:
    s = load({})
    assert (s.gpu_memory_wait, s.engine_device) == (True, "auto")
    s = load({"GPU_MEMORY_WAIT": "off", "ENGINE_DEVICE": " CPU "})
    assert (s.gpu_memory_wait, s.engine_device) == (False, "cpu")
    assert load({"GPU_MEMORY_WAIT": "Yes", "ENGINE_DEVICE": "cuda"}).gpu_memory_wait is True
    with pytest.raises(SettingsError, match=r"^ENGINE_DEVICE='tpu' is not valid: one of auto, cuda, cpu\.$"):
        load({"ENGINE_DEVICE": "tpu"})
    with pytest.raises(SettingsError, match="true or false"):
        load({"GPU_MEMORY_WAIT": "maybe"})


def test_default_max_tokens() -> None:
    assert load({}).default_max_tokens is None  # unset: a job without max_tokens runs to the end of the context
    assert load({"DEFAULT_MAX_TOKENS": " 2048 "}).default_max_tokens == 2048
    assert settings.DOCUMENTED["DEFAULT_MAX_TOKENS"][0] is None
    for bad in ("0", "-5", "1.5", "all"):
        with pytest.raises(SettingsError) as caught:
            load({"DEFAULT_MAX_TOKENS": bad})
        assert str(caught.value) == (
            f"DEFAULT_MAX_TOKENS={bad!r} is not valid: a whole number greater than 0 (the max_tokens a prompt or "
            "messages job gets when it names none), or unset for up to the end of the context."
        )
