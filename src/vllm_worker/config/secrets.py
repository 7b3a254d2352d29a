"""One rule for secrets: which variables and flags hold a credential, and how a text loses them.

HF_TOKEN, HUGGING_FACE_HUB_TOKEN and any variable or flag whose last word names a credential
(`*_API_KEY`, `--hf-token`, `*_SECRET`, a password) hold one. The logged argv (`mask`), a
refused value's sentence (`args_builder`), a diagnosis (`diagnosis.verdict.scrubbed`), the
pre-flight's warnings and the capacity plan's log line all pass through `mask_text`, so a secret
never reaches a log line, a logged argv or a job's answer, whichever path wrote it.
"""

from __future__ import annotations

import os
import re
import shlex
from typing import Mapping, Sequence

MASK = "***"

_SECRET_WORDS = ("token", "key", "secret", "password", "passwd", "apikey", "credential", "credentials")
_SECRET_ENV_NAMES = frozenset({"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"})
# Shorter values are masked only where a whole argument equals them: replacing
# "1" inside every argument would garble the log without protecting anything.
_MIN_SUBSTRING_SECRET = 4


def is_secret_name(name: str) -> bool:
    """A flag or variable whose value is a credential: its last word names one.

    The last word, not any word: --max-num-batched-tokens and
    --long-prefill-token-threshold carry numbers, --tokenizer a repo id.
    """
    words = [w for w in re.split(r"[-_.]+", name.lower()) if w]
    if not words:
        return False
    return words[-1] in _SECRET_WORDS or any(w in ("secret", "password", "passwd") for w in words)


def secret_values(env: Mapping[str, str]) -> list[str]:
    """The values of the variables that hold a credential (HF_TOKEN, *_API_KEY, ...), longest first."""
    secrets = []
    for name, value in env.items():
        if (name in _SECRET_ENV_NAMES or is_secret_name(name)) and value.strip():
            secrets.append(value.strip())
    # Longest first, so a secret that contains another is masked whole.
    return sorted(set(secrets), key=len, reverse=True)


def mask_text(text: str, secrets: Sequence[str]) -> str:
    """`text` with every secret value, and the value of every secret-named flag, replaced by '***'."""
    for secret in secrets:
        if len(secret) >= _MIN_SUBSTRING_SECRET:
            text = text.replace(secret, MASK)
    # Quotes around the value stay: in a quoting error they are the point.
    return re.sub(
        r"(?<!\S)(--?[\w.-]+)(=|\s+)([\"']?)([^\s\"']+)",
        lambda m: m.group(1) + m.group(2) + m.group(3) + MASK if is_secret_name(m.group(1).lstrip("-")) else m.group(0),
        text,
    )


def mask(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """`argv` as one shell-quoted line with credentials replaced by '***'.

    Masks the values of secret-looking flags (--api-key, --hf-token, ...), and
    every occurrence of a secret variable's value (HF_TOKEN, *_API_KEY, ...) taken
    from `env` (default: the worker's own environment).
    """
    secrets = secret_values(os.environ if env is None else env)
    out: list[str] = []
    in_secret = False
    for arg in argv:
        if arg.startswith("-") and not _looks_negative_number(arg):
            name, eq, _ = arg.partition("=")
            secret_flag = is_secret_name(name.lstrip("-"))
            if eq and secret_flag:
                out.append(f"{name}={MASK}")
                in_secret = False
                continue
            in_secret = secret_flag and not eq
            out.append(_mask_arg(arg, secrets))
        elif in_secret:
            out.append(MASK)  # nargs="+" flags such as --api-key take several values
        else:
            out.append(_mask_arg(arg, secrets))
    return shlex.join(out)


def _mask_arg(arg: str, secrets: Sequence[str]) -> str:
    for secret in secrets:
        if arg == secret:
            return MASK
        if len(secret) >= _MIN_SUBSTRING_SECRET:
            arg = arg.replace(secret, MASK)
    return arg


def _looks_negative_number(arg: str) -> bool:
    try:
        float(arg)
    except ValueError:
        return False
    return True
