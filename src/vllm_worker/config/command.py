"""The `vllm serve` command rendered from a launch profile: `build_args`.

`LaunchProfile.parse` has read and folded the variables once (config/profile.py), and a ladder step
changes the profile's typed fields (`LaunchProfile.changed`); this module only renders a profile: the
model and the worker's own flags, each of its `options` as the argument(s) vLLM's parser takes (checked
as vLLM would check them, by `args_builder`'s table and `flag_messages`), the worker's MAX_NUM_SEQS
default (the profile's one rule), then VLLM_EXTRA_ARGS (`extra_args_words`) last, so its flags win.
It takes no environment: the profile is the whole input.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from vllm_worker.config import flag_messages
from vllm_worker.config.args_builder import (
    CONFIG_FILE,
    CONFIG_FILE_ACCEPTED,
    FLAGS,
    LONG_ALIASES,
    NOT_FROM_ENV,
    OPTIONS,
    REMOVED_NOTES,
    RESERVED_IN_EXTRA_ARGS,
    SHORT_OPTIONS,
    ZERO_MEANS_UNSET,
    ArgsError,
    Kind,
    flag_for,
)
from vllm_worker.config.engine_env import engine_environment
from vllm_worker.config.env import BOOL_ACCEPTED, EXTRA_ARGS, bool_word
from vllm_worker.config.profile import LaunchProfile, Option
from vllm_worker.config.secrets import mask, mask_text
from vllm_worker.config.settings import Settings


@dataclass
class BuiltArgs:
    """The command that starts the engine, and what the worker needs to know about it."""

    argv: list[str]
    served_model_name: str
    engine_env: dict[str, str]
    warnings: list[str] = field(default_factory=list)

    def masked(self) -> str:
        """The command line as it may be logged."""
        return mask(self.argv, self.engine_env)


def build_args(profile: LaunchProfile, settings: Settings, caches: Mapping[str, str] | None = None) -> BuiltArgs:
    """The `vllm serve` argv and environment rendered from a launch profile; ArgsError if unusable,
    the profile's refusal first. `caches`: the compile-cache variables to give the engine
    (engine_env.cache_variables)."""
    if profile.refusal is not None:
        raise ArgsError(profile.refusal.variable, profile.refusal.value, profile.refusal.accepted, message=str(profile.refusal))
    warnings: list[str] = list(profile.fold_warnings)
    baked = profile.baked_model_path
    model_name = profile.model
    if baked is None and model_name is None:
        raise ArgsError(
            "MODEL_NAME",
            "",
            "",
            message="MODEL_NAME is not set: set it to the Hugging Face model to serve, such as 'Qwen/Qwen3-0.6B'.",
        )
    model = baked or model_name
    assert model is not None

    options = {option.name: option for option in profile.options}
    extra = _extra_args(profile)
    extra_flags = _flags_in(extra)
    config = _config_file(profile, extra_flags)

    if baked is not None:
        # The baked directory is the revision that was downloaded at build time.
        # Named as the user set them (MODEL_REVISION, the official worker's name, sets REVISION).
        dropped = [option.source for name in ("REVISION", "CODE_REVISION") if (option := options.pop(name, None))]
        if "TOKENIZER" not in options and (tokenizer_revision := options.pop("TOKENIZER_REVISION", None)):
            dropped.append(tokenizer_revision.source)
        if dropped:
            warnings.append(f"{', '.join(dropped)} ignored: the model is baked into the image at {baked}.")
        if "SERVED_MODEL_NAME" not in options and model_name is not None:
            # Clients keep asking for the Hub name, not the path inside the image.
            options["SERVED_MODEL_NAME"] = Option("SERVED_MODEL_NAME", model_name, "MODEL_NAME", model_name)

    for name in ZERO_MEANS_UNSET:
        if name in options and _is_zero(options[name].value):
            del options[name]
    # A config file may set max-num-seqs, and the command line would override it.
    if "MAX_NUM_SEQS" not in options and "--max-num-seqs" not in extra_flags and not config:
        default = str(profile.effective_max_num_seqs())
        options["MAX_NUM_SEQS"] = Option("MAX_NUM_SEQS", default, "MAX_CONCURRENCY", default)

    for name, reason in NOT_FROM_ENV.items():
        if reason is not None and profile.written(name) is not None:
            warnings.append(f"{name} is not passed to vLLM as {OPTIONS[name]['flag']}: {reason}.")

    argv = [*settings.vllm_command, model, "--host", settings.vllm_host, "--port", str(settings.vllm_port), *config]
    for name, kind in FLAGS.items():
        option = options.get(name)
        if option is None:
            continue
        if kind == "removed":  # (left at the official form's default, the profile holds no such option)
            warnings.append(f"{name}={option.value!r} is ignored: vLLM 0.32 has no {flag_for(name)} ({REMOVED_NOTES[name]}).")
            continue
        flag = OPTIONS[name]["flag"]
        if flag in extra_flags or (kind == "pair" and "--no-" + flag[2:] in extra_flags):
            warnings.append(f"{option.source} sets {flag}, but {EXTRA_ARGS} sets it too; the {EXTRA_ARGS} value wins.")
        argv += _option_args(option, kind)
        note = OPTIONS[name].get("deprecated")
        if note:
            warnings.append(f"{option.source}: {note}")
    argv += extra
    warnings += profile.notices
    seqs, most = profile.known_max_num_seqs(), profile.max_concurrency
    if not settings.adaptive_concurrency and seqs is not None and seqs < most:
        # With adaptation on, serving.intake takes no more than MAX_NUM_SEQS and one.
        warnings.append(
            f"MAX_NUM_SEQS={seqs} is below MAX_CONCURRENCY={most} with ADAPTIVE_CONCURRENCY=false: the worker takes "
            f"{most} jobs and vLLM runs {seqs} of them at once, so {most - seqs} wait inside vLLM, where the endpoint's "
            f"autoscaler does not see them; set MAX_CONCURRENCY={seqs}, or ADAPTIVE_CONCURRENCY=true."
        )

    served = options.get("SERVED_MODEL_NAME")
    served_model_name = ([*_list_values(served), model] if served else [model])[0]
    return BuiltArgs(
        argv=argv, served_model_name=served_model_name, engine_env=engine_environment(profile.env, caches), warnings=warnings
    )


# --- how one value becomes vLLM's arguments --------------------------------------------------


def _is_zero(value: str) -> bool:
    try:
        return int(value) == 0
    except ValueError:
        return False


def _split_words(option: Option) -> list[str]:
    try:
        return shlex.split(option.value)
    except ValueError:
        raise ArgsError(
            option.source,
            option.shown,
            "its quotes are unbalanced; quote values the way a shell would, e.g. --flag 'a b'",
        ) from None


def _list_values(option: Option) -> list[str]:
    """One argument per shell word, or per element of a JSON array; a JSON object is one argument."""
    value = option.value
    if value[0] == "{":
        return [value]
    if value[0] == "[":
        try:
            items = json.loads(value)
        except ValueError:
            items = None  # not JSON: a glob such as '[0-9]*.bin' is a shell word
        if isinstance(items, list):
            return [item if isinstance(item, str) else json.dumps(item) for item in items]
    return _split_words(option)


def _extra_args(profile: LaunchProfile) -> list[str]:
    """VLLM_EXTRA_ARGS as the argv's last words; ArgsError for unbalanced quotes or a flag the worker owns."""
    if profile.extra_args_words is None:
        raw = profile.written(EXTRA_ARGS) or ""
        raise ArgsError(
            EXTRA_ARGS,
            mask_text(raw, profile.secrets),
            "its quotes are unbalanced; quote values the way a shell would, e.g. --flag 'a b'",
        )
    words = list(profile.extra_args_words)
    for flag in _flags_in(words):
        if flag in RESERVED_IN_EXTRA_ARGS:
            shown = mask_text(profile.written(EXTRA_ARGS) or "", profile.secrets)
            raise ArgsError(EXTRA_ARGS, shown, f"{RESERVED_IN_EXTRA_ARGS[flag]}; remove {flag} from {EXTRA_ARGS}")
    return words


def _flags_in(words: Iterable[str]) -> set[str]:
    """Long flag names in an argument list, normalized as vLLM's parser does."""
    flags: set[str] = set()
    for word in words:
        if word.startswith("--") and len(word) > 2:
            flag = "--" + word[2:].split("=", 1)[0].split(".", 1)[0].replace("_", "-")
            flags.add(LONG_ALIASES.get(flag, flag))
        elif word in SHORT_OPTIONS:
            flags.add(SHORT_OPTIONS[word])
        elif word.startswith("-O") and word != "-O":  # vLLM reads -O3 as --optimization-level 3
            flags.add("--optimization-level")
    return flags


def _config_file(profile: LaunchProfile, extra_flags: set[str]) -> list[str]:
    """`--config FILE` for VLLM_CONFIG_FILE (the name Runpod's worker documents)."""
    path = profile.written(CONFIG_FILE)
    if path is None:
        return []
    if path.split(".")[-1] not in ("yaml", "yml"):  # vLLM refuses any other name with a traceback
        raise ArgsError(CONFIG_FILE, path, CONFIG_FILE_ACCEPTED,
                        message=flag_messages.invalid_value(CONFIG_FILE, path, "--config", CONFIG_FILE_ACCEPTED))
    if "--config" in extra_flags:
        raise ArgsError(CONFIG_FILE, path, f"{EXTRA_ARGS} passes --config too, and vLLM reads only one config "
                        f"file; remove one of them")
    # vLLM requires `--config` and the path as two arguments, and puts the file's settings
    # before the command line's, so every variable still overrides the file.
    return ["--config", path]


def _checked(set_option: Option, option: Mapping[str, Any], items: list[str]) -> None:
    """ArgsError when vLLM's parser or its config would refuse these argument(s)."""
    accepted = flag_messages.problem(option, items)
    if accepted is None:
        return
    source, shown, flag = set_option.source, set_option.shown, option["flag"]
    raise ArgsError(source, shown, f"{flag} takes {accepted}",
                    message=flag_messages.invalid_value(source, shown, flag, accepted))


def _option_args(set_option: Option, kind: Kind) -> list[str]:
    """The arguments one option becomes (checked as vLLM would check them)."""
    option = OPTIONS[set_option.name]
    flag = option["flag"]
    value, source = set_option.value, set_option.source
    if kind in ("pair", "store_true"):
        on = bool_word(value)
        if on is None:
            raise ArgsError(source, value, BOOL_ACCEPTED)
        if kind == "pair":
            return [flag if on else "--no-" + flag[2:]]
        return [flag] if on else []
    if kind == "list":
        items = _list_values(set_option)
        _checked(set_option, option, items)
        return [flag, *items]
    if kind == "append":
        items = _split_words(set_option)
        _checked(set_option, option, items)
        return [arg for item in items for arg in (flag, item)]
    _checked(set_option, option, [value])
    return [f"{flag}={value}"] if value.startswith("-") else [flag, value]
