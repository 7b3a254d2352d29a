"""How one environment string is read: the words every reader of the configuration shares.

Users write values by hand in a web form, so " 32 ", "True" and "" all occur. These few rules
("strip; blank is unset", the true/false words, vLLM's human-readable integers, shell words for
VLLM_EXTRA_ARGS) are decided here once, and `Reader` applies them to a profile's folded values;
`settings`, `command` and `profile` decide what an unreadable value means for their own variables.
"""

from __future__ import annotations

import re
import shlex
from typing import Mapping


class RefusedValue(ValueError):
    """A variable holds a value the worker cannot use; str() is the one sentence naming the variable,
    the value and what is accepted, which every job is answered with."""

    def __init__(self, variable: str, value: str, accepted: str, message: str | None = None) -> None:
        self.variable = variable
        self.value = value
        self.accepted = accepted
        super().__init__(message or f"{variable}={value!r} is not valid: {accepted}.")


TRUE_WORDS = frozenset({"true", "1", "yes", "on"})
FALSE_WORDS = frozenset({"false", "0", "no", "off"})
BOOL_ACCEPTED = "use true or false (also 1/0, yes/no, on/off)"
EXTRA_ARGS = "VLLM_EXTRA_ARGS"


def value(env: Mapping[str, str], name: str) -> str | None:
    """A variable's value without surrounding blanks; None when unset or blank."""
    raw = env.get(name)
    if raw is None or str(raw).strip() == "":
        return None
    return str(raw).strip()


def bool_word(text: str | None) -> bool | None:
    """True or False for a boolean word; None when `text` is unset, blank or not such a word."""
    word = (text or "").strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    return None


def parse_human_int(text: str) -> int:
    """vLLM's human_readable_int (utils/argparse_utils.py): '1k' = 1000, '1K' = 1024; ValueError otherwise."""
    stripped = text.strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", stripped)
    if m:
        number, suffix = m.groups()
        if suffix.islower():
            return int(float(number) * 10 ** (3 * ("kmgt".index(suffix) + 1)))
        return int(number) * 2 ** (10 * ("KMGT".index(suffix) + 1))
    return int(stripped)


def shell_words(text: str) -> list[str] | None:
    """`text` split as a shell would; None when its quotes are unbalanced."""
    try:
        return shlex.split(text)
    except ValueError:
        return None


class Reader:
    """Typed reads of a profile's folded values by the rules above; what cannot be read is kept
    (name -> value) in `unreadable`, not guessed."""

    def __init__(self, values: Mapping[str, str]) -> None:
        self.values = values
        self.unreadable: dict[str, str] = {}

    def text(self, name: str) -> str | None:
        return self.values.get(name)

    def whole(self, name: str, *, human: bool = False) -> int | None:
        """A whole number ("8k" with human); None when unset, 0 (0 means unset) or unreadable."""
        text = self.values.get(name)
        if text is None:
            return None
        try:
            number = parse_human_int(text) if human else int(text)
        except ValueError:
            self.unreadable[name] = text
            return None
        return number if number != 0 else None

    def number(self, name: str) -> float | None:
        text = self.values.get(name)
        if text is None:
            return None
        try:
            return float(text)
        except ValueError:
            self.unreadable[name] = text
            return None

    def switch(self, name: str) -> bool | None:
        text = self.values.get(name)
        if text is None:
            return None
        word = bool_word(text)
        if word is None:
            self.unreadable[name] = text
        return word
