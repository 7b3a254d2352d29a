"""What a `vllm serve` option accepts, in words, and whether a value is one of those.

A user reads nothing but a job's error, so a value vLLM would refuse must be answered
with the variable, the value and what the option takes, and the same words must serve
whether the worker notices it before launch (`args_builder`) or vLLM refuses it after
(`startup_errors`). Both work from one option entry of src/vllm_worker/config/vllm_flags.json,
which scripts/gen_flag_table.py reads from vLLM 0.32's own parser.

`problem()` checks only what vLLM's parser (types, choices) and its config fields'
declared bounds reject for every model; anything else is the engine's to judge. Its
conversions mirror vLLM 0.32's argument types by behaviour (checked against the real
parser in tests/engine/test_flag_table.py), never by importing them.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Callable, Mapping

Option = Mapping[str, Any]

_SUFFIXED = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")
_JSON_OBJECT_TEXT = re.compile(r"(?s)^\s*{.*}\s*$")
_JSON_STRING = re.compile(r'("(?:[^"\\]|\\.)*")')
_BARE_SUFFIXED = re.compile(r"\b\d+(?:\.\d+)?[kKmMgGtT]\b")
_NUMERIC = ("int", "float", "human_int", "human_int_or_auto")
# How many choices a message lists before it sends the user to `vllm serve --help`.
_MAX_LISTED = 24


class _Invalid(ValueError):
    pass


def invalid_value(variable: str, value: str, flag: str, accepted: str) -> str:
    """The sentence for a value an option does not take: `VAR='v' is not valid: --flag takes ....`

    The shape of every worker sentence about a bad setting (SettingsError, ArgsError).
    """
    return f"{variable}={value!r} is not valid: {flag} takes {accepted}."


def human_int(text: str) -> int:
    """A whole number, or one with a k/m/g/t (x1000^n) or K/M/G/T (x1024^n, whole numbers only) suffix."""
    text = text.strip()
    m = _SUFFIXED.fullmatch(text)
    if m is None:
        return int(text)
    number, suffix = m.groups()
    power = "kmgt".index(suffix.lower()) + 1
    if suffix.islower():
        return int(float(number) * 1000**power)
    if "." in number:
        raise _Invalid(text)
    return int(number) * 1024**power


def _human_int_or_auto(text: str) -> int:
    text = text.strip()
    if text == "-1" or text.lower() == "auto":
        return -1
    return human_int(text)


def _json_config(text: str) -> Any:
    """vLLM reads a config object as JSON whose bare numbers may carry a k/M/... suffix."""
    parts = _JSON_STRING.split(text)
    for i in range(0, len(parts), 2):
        parts[i] = _BARE_SUFFIXED.sub(lambda m: str(human_int(m.group())), parts[i])
    value = json.loads("".join(parts))
    if not isinstance(value, dict):
        raise _Invalid(text)
    return value


def _json_or_str(text: str) -> Any:
    return json.loads(text) if _JSON_OBJECT_TEXT.match(text) else text


_CONVERT: dict[str, Callable[[str], Any]] = {
    "int": int,
    "float": float,
    "human_int": human_int,
    "human_int_or_auto": _human_int_or_auto,
    "json": json.loads,
    "json_or_str": _json_or_str,
    "json_config": _json_config,
}


def convert(option: Option, text: str) -> Any:
    """The value vLLM's parser makes of one argument; ValueError where it refuses it."""
    if option.get("optional") and text in ("", "None"):
        return None
    converter = _CONVERT.get(option["type"])
    if converter is None:
        value: Any = text
    else:
        try:
            value = converter(text)
        except (ValueError, ArithmeticError):  # JSONDecodeError is a ValueError
            raise _Invalid(text) from None
    if option.get("normalize") == "lower_underscore":
        value = value.lower().replace("-", "_")
    choices = option.get("choices")
    if choices is not None and value not in choices:
        raise _Invalid(text)
    bounds = option.get("range")
    if bounds and isinstance(value, (int, float)) and not _within(value, bounds):
        raise _Invalid(text)
    return value


def _within(value: float, bounds: Mapping[str, float]) -> bool:
    if isinstance(value, float) and math.isnan(value):
        return False
    return (
        ("ge" not in bounds or value >= bounds["ge"])
        and ("gt" not in bounds or value > bounds["gt"])
        and ("le" not in bounds or value <= bounds["le"])
        and ("lt" not in bounds or value < bounds["lt"])
    )


def problem(option: Option, items: list[str]) -> str | None:
    """None when vLLM's parser and config would take these argument(s); else what the option takes."""
    if not items:
        return describe(option)
    for item in items:
        try:
            if "item_fields" in option:
                _adapter(option["item_fields"], item)
            else:
                convert(option, item)
        except ValueError:
            return describe(option)
    return None


def _adapter(fields: Mapping[str, list[str]], item: str) -> None:
    """One --lora-modules argument: `name=path`, or a JSON object with the adapter's fields."""
    if item in ("", "None") or ("=" in item and "," not in item):  # vLLM skips an empty (None) one
        return
    value = json.loads(item)
    if not isinstance(value, dict) or not set(fields["required"]) <= set(value) <= {*fields["required"], *fields["optional"]}:
        raise _Invalid(item)


def _number_words(type_name: str, bounds: Mapping[str, float]) -> str:
    whole = type_name != "float"
    noun = "a whole number" if whole else "a number"
    shown = {k: (int(v) if whole or float(v).is_integer() else v) for k, v in bounds.items()}
    low = ("ge", shown["ge"]) if "ge" in shown else ("gt", shown["gt"]) if "gt" in shown else None
    high = ("le", shown["le"]) if "le" in shown else ("lt", shown["lt"]) if "lt" in shown else None
    if low and high and low[0] == "ge" and high[0] == "le":
        return f"{noun} from {low[1]} to {high[1]}"
    parts = []
    if low:
        parts.append(f"at least {low[1]}" if low[0] == "ge" else f"greater than {low[1]}")
    if high:
        parts.append(f"at most {high[1]}" if high[0] == "le" else f"less than {high[1]}")
    return f"{noun} ({' and '.join(parts)})" if parts else noun


def _choices_words(choices: list[Any], flag: str) -> str:
    shown = [str(c) for c in choices]
    if len(shown) > _MAX_LISTED:
        return f"one of {len(shown)} names, such as {', '.join(shown[:6])} (`vllm serve --help={flag[2:]}` lists them all)"
    return "one of " + ", ".join(shown)


def describe(option: Option) -> str:
    """What the option takes, as the end of 'FLAG takes ...'."""
    type_name = option["type"]
    flag = option["flag"]
    if "item_fields" in option:
        fields = option["item_fields"]
        named = " and ".join(f'"{f}"' for f in fields["required"])
        optional = f" (optional: {', '.join(fields['optional'])})" if fields["optional"] else ""
        return (
            f"adapters as space-separated name=path pairs (e.g. sql=org/sql-lora), or as a JSON array of "
            f"objects with {named}{optional}, e.g. '[{{\"name\": \"sql\", \"path\": \"org/sql-lora\"}}]'"
        )
    if option.get("choices"):
        text = _choices_words(list(option["choices"]), flag)
        if option.get("normalize") == "lower_underscore":
            text += " (any case; '-' for '_')"
    elif type_name in _NUMERIC:
        bounds = dict(option.get("range") or {})
        if type_name == "human_int_or_auto" and bounds.get("ge") == -1:
            del bounds["ge"]  # -1 is how vLLM spells auto
        text = _number_words("float" if type_name == "float" else "int", bounds)
        if type_name in ("human_int", "human_int_or_auto"):
            text += ", optionally with a suffix such as 8k (x1000) or 8K (x1024)"
        if type_name == "human_int_or_auto":
            text += ", or auto"
    elif type_name == "json":
        text = "valid JSON, e.g. '{\"key\": 1}' or '[\"a\", \"b\"]'"
    elif type_name == "json_config":
        text = "a JSON object, e.g. '{\"key\": \"value\"}'"
    elif type_name == "json_or_str":
        text = "a JSON object (a value starting with '{') or a plain string"
    else:
        text = "a string"
    if option.get("kind") in ("list", "append"):
        text = f"one or more space-separated values, each {text}"
    return text
