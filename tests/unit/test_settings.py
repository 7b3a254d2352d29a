"""Settings are parsed once; a bad value is one sentence naming the variable, the value and what is accepted."""

import pytest

from vllm_worker.config import settings
from vllm_worker.config.profile import LaunchProfile
from vllm_worker.config.settings import SettingsError, load, multiple_of_8_at_least

PROFILE_READS = {"MAX_CONCURRENCY"}


def test_defaults() -> None:
    s = load({})
    assert s.vllm_port == 8000
    assert s.vllm_command == ("vllm", "serve")
    assert s.vllm_host == "127.0.0.1"


def test_values_are_parsed() -> None:
    s = load(
        {
            "WORKER_REFRESH_LIMIT": " 12 ",
            "VLLM_PORT": "8123",
            "VLLM_COMMAND": "/opt/engine/bin/vllm serve",
            "REQUEST_TIMEOUT": "2.5",
            "VLLM_STARTUP_TIMEOUT": "90",
        }
    )
    assert (s.refresh_limit, s.vllm_port, s.request_timeout, s.startup_timeout) == (12, 8123, 2.5, 90.0)
    assert s.vllm_command == ("/opt/engine/bin/vllm", "serve")


def test_empty_value_means_default() -> None:
    assert load({"WORKER_REFRESH_LIMIT": ""}).refresh_limit == 3


@pytest.mark.parametrize(
    ("name", "value", "accepted_word"),
    [
        ("WORKER_REFRESH_LIMIT", "abc", "whole number"),
        ("WORKER_REFRESH_LIMIT", "-3", "whole number"),
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
    """Each variable of the README's worker table is read once: here, or (MAX_CONCURRENCY, which also sets the
    default MAX_NUM_SEQS) into the launch profile, and a value neither can use is refused by the one that reads it."""
    bad = "not-a-valid-value-\"'"
    for name in settings.DOCUMENTED:
        refusal = LaunchProfile.parse({name: bad}).refusal
        if name in PROFILE_READS:
            load({name: bad})  # not read here: read twice, the two could disagree
            assert refusal is not None and refusal.variable == name
        else:
            with pytest.raises(SettingsError):
                load({name: bad})
            assert refusal is None


@pytest.mark.parametrize("value", ["abc", "0", "-3", "4097", "2.5", " many "])
def test_a_max_concurrency_out_of_range_is_refused_by_the_profile_in_one_sentence(value: str) -> None:
    profile = LaunchProfile.parse({"MAX_CONCURRENCY": value})
    assert str(profile.refusal) == f"MAX_CONCURRENCY={value!r} is not valid: a whole number from 1 to 4096."
    assert profile.max_concurrency == 30  # until the refusal is answered, the default stands in
    # Quoted as written, blanks and all, as every refused value is (config.env.RefusedValue).


@pytest.mark.parametrize(("value", "read"), [(" 12 ", 12), ("1", 1), ("4096", 4096), ("", 30)])
def test_max_concurrency_is_read_once_into_the_profile(value: str, read: int) -> None:
    profile = LaunchProfile.parse({"MAX_CONCURRENCY": value})
    assert (profile.max_concurrency, profile.refusal) == (read, None)
    assert not hasattr(load({"MAX_CONCURRENCY": value}), "max_concurrency")


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
