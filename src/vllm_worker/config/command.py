"""The `vllm serve` command rendered from a launch profile: `build_args`.

`LaunchProfile.parse` has read and folded the variables once (config/profile.py); this module
only renders them: the model and the worker's own flags, each table variable as the argument(s)
vLLM's parser takes (checked as vLLM would check them, by `args_builder`'s table), the worker's
MAX_NUM_SEQS default (the profile's one rule), then VLLM_EXTRA_ARGS last, so its flags win.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from vllm_worker.config import official_worker
from vllm_worker.config.args_builder import (
    EXTRA_ARGS,
    FLAGS,
    NOT_FROM_ENV,
    OPTIONS,
    REMOVED_NOTES,
    ZERO_MEANS_UNSET,
    ArgsError,
    _config_file,
    _extra_args,
    _flags_in,
    _is_zero,
    _list_values,
    _option_args,
    flag_for,
    lookalike_warnings,
)
from vllm_worker.config.engine_env import engine_environment
from vllm_worker.config.profile import LaunchProfile
from vllm_worker.config.secrets import mask
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
    env = profile.env
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

    values, sources = dict(profile.flags), dict(profile.flag_sources)
    extra = _extra_args(env)
    extra_flags = _flags_in(extra)
    config = _config_file(env, extra_flags)

    if baked is not None:
        # The baked directory is the revision that was downloaded at build time.
        # Named as the user set them (MODEL_REVISION, the official worker's name, sets REVISION).
        dropped = [sources[name] for name in ("REVISION", "CODE_REVISION") if values.pop(name, None) is not None]
        if "TOKENIZER" not in values and values.pop("TOKENIZER_REVISION", None) is not None:
            dropped.append(sources["TOKENIZER_REVISION"])
        if dropped:
            warnings.append(f"{', '.join(dropped)} ignored: the model is baked into the image at {baked}.")
        if "SERVED_MODEL_NAME" not in values and model_name is not None:
            # Clients keep asking for the Hub name, not the path inside the image.
            values["SERVED_MODEL_NAME"], sources["SERVED_MODEL_NAME"] = model_name, "MODEL_NAME"

    for name in ZERO_MEANS_UNSET:
        if name in values and _is_zero(values[name]):
            del values[name]
    # A config file may set max-num-seqs, and the command line would override it.
    if "MAX_NUM_SEQS" not in values and "--max-num-seqs" not in extra_flags and not config:
        values["MAX_NUM_SEQS"] = str(profile.effective_max_num_seqs())
        sources["MAX_NUM_SEQS"] = "MAX_CONCURRENCY"

    for name, reason in NOT_FROM_ENV.items():
        if reason is not None and profile.written(name) is not None:
            warnings.append(f"{name} is not passed to vLLM as {OPTIONS[name]['flag']}: {reason}.")

    argv = [*settings.vllm_command, model, "--host", settings.vllm_host, "--port", str(settings.vllm_port), *config]
    for name, kind in FLAGS.items():
        if name not in values:
            continue
        value = values[name]
        if kind == "removed":
            if not official_worker.at_form_default(name, value):  # the official Hub form writes its defaults
                warnings.append(f"{name}={value!r} is ignored: vLLM 0.32 has no {flag_for(name)} ({REMOVED_NOTES[name]}).")
            continue
        flag = OPTIONS[name]["flag"]
        source = sources.get(name, name)
        if flag in extra_flags or (kind == "pair" and "--no-" + flag[2:] in extra_flags):
            warnings.append(f"{source} sets {flag}, but {EXTRA_ARGS} sets it too; the {EXTRA_ARGS} value wins.")
        argv += _option_args(name, kind, value, source, env)
        note = OPTIONS[name].get("deprecated")
        if note:
            warnings.append(f"{source}: {note}")
    argv += extra
    warnings += official_worker.notices(env)
    warnings += lookalike_warnings(env)
    seqs, most = profile.known_max_num_seqs(), profile.max_concurrency
    if not settings.adaptive_concurrency and seqs is not None and seqs < most:
        # With adaptation on, serving.intake takes no more than MAX_NUM_SEQS and one.
        warnings.append(
            f"MAX_NUM_SEQS={seqs} is below MAX_CONCURRENCY={most} with ADAPTIVE_CONCURRENCY=false: the worker takes "
            f"{most} jobs and vLLM runs {seqs} of them at once, so {most - seqs} wait inside vLLM, where the endpoint's "
            f"autoscaler does not see them; set MAX_CONCURRENCY={seqs}, or ADAPTIVE_CONCURRENCY=true."
        )

    served = values.get("SERVED_MODEL_NAME")
    served_model_name = ([*_list_values("SERVED_MODEL_NAME", served, env), model] if served else [model])[0]
    return BuiltArgs(
        argv=argv, served_model_name=served_model_name, engine_env=engine_environment(env, caches), warnings=warnings
    )


