"""What a diagnosis reads and answers, and the pieces every message builder shares.

One input (`Failure`: the output's tail, the launch profile, the exit code, the steps
already tried, the weights' size) and one answer (`Diagnosis`). `startup_errors` (what failed
a start), `memory` (the memory messages: a shortfall, memory held by others, the profiling
race) and `runtime` (an engine that died while serving) compose their sentences the same way
(`compose`): the cause, what the worker already tried, then the fixes that remain.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from vllm_worker.config.profile import LaunchProfile
from vllm_worker.config.secrets import mask_text, secret_values
from vllm_worker.diagnosis.rules import Hit

_GIB = 2**30

# A memory relaunch step lowers MAX_NUM_BATCHED_TOKENS to at most this (see `engine.ladder`).
EAGER_MAX_BATCHED_TOKENS = 8192
# The most GPU_MEMORY_UTILIZATION the worker ever advises (vLLM's default is
# DEFAULT_GPU_MEMORY_UTILIZATION): above it, CUDA context and fragmentation have no room left.
HIGHEST_ADVISED_UTILIZATION = 0.95
# Causes that may pass on another try or another machine: relaunched once in place, then answered.
TRANSIENT_KINDS = frozenset({"host_fault", "hub_unreachable"})

SUPPORTED_MODELS_URL = "https://docs.vllm.ai/en/latest/models/supported_models.html"

_EVIDENCE_CHARS = 400


@dataclass(frozen=True)
class Diagnosis:
    """The root cause of a failed start.

    kind: one of KINDS. message: what the job response says. evidence: the line that
    gave the cause away (vLLM's log prefix removed, shortened). detail: which wording,
    for memory shortfalls ("kv_too_small", "no_kv_memory", "auto_fit", "sampler_warmup",
    "weights_load", "out_of_memory", "cpu_kv_no_room", "cpu_kv_explicit", "cpu_out_of_memory").
    """

    kind: str
    message: str
    evidence: str
    detail: str | None = None
    estimated_max_len: int | None = None
    variable: str | None = None
    value: str | None = None
    repo: str | None = None
    revision: str | None = None
    facts: dict[str, str] = field(default_factory=dict)



# --- knobs a memory relaunch can still turn (shared with `engine.ladder`) -----------


def size_text(size_bytes: int) -> str:
    """Bytes for a reader: '256 KiB', '64 MiB', '2.5 GiB'."""
    for unit, scale in (("GiB", _GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if size_bytes >= scale:
            return f"{round(size_bytes / scale, 2):g} {unit}"
    return f"{size_bytes} bytes"



@dataclass(frozen=True)
class Failure:
    """A launch that failed: what every diagnosis reads.

    output: the tail of the engine's output. profile: the launch configuration that failed (it
    decides which fixes remain). tried: what the worker already did, as phrases ("relaunched with
    MAX_NUM_SEQS=32"), as data. weights_bytes: the checkpoint's size when the capacity plan knows it.
    model/revision: the reference when the output does not name it (default: the profile's).
    """

    output: str
    profile: LaunchProfile = field(default_factory=lambda: LaunchProfile.parse({}))
    exit_code: int | None = None
    tried: tuple[Tried, ...] = ()
    weights_bytes: int | None = None
    model: str | None = None
    revision: str | None = None

    @classmethod
    def of(
        cls,
        output: str,
        model: str | None = None,
        *,
        revision: str | None = None,
        exit_code: int | None = None,
        env: Mapping[str, str] | None = None,
        tried: Sequence[Tried] = (),
        weights_bytes: int | None = None,
    ) -> "Failure":
        """A failure of a launch whose configuration is still a mapping of variables."""
        return cls(output, LaunchProfile.parse(env or {}), exit_code, tuple(tried), weights_bytes, model, revision)


@dataclass(frozen=True)
class Context:
    """What a message builder reads: the failure, its cleaned output and the hits that named its cause."""

    lines: list[str]
    hits: list[Hit]
    model: str | None
    revision: str | None
    exit_code: int | None
    tried: tuple[Tried, ...]
    weights_bytes: int | None = None
    profile: LaunchProfile = field(default_factory=lambda: LaunchProfile.parse({}))

    @property
    def subject(self) -> str:
        return f"MODEL_NAME={self.model!r}" if self.model else "The model"

    @property
    def token_set(self) -> bool:
        return self.profile.token_set

    def search(self, pattern: str) -> re.Match[str] | None:
        """The last match of `pattern` in the whole output."""
        found = None
        for found in re.finditer(pattern, "\n".join(self.lines), re.IGNORECASE):
            pass
        return found


def evidence_of(line: str) -> str:
    line = line.strip()
    return line if len(line) <= _EVIDENCE_CHARS else line[: _EVIDENCE_CHARS - 3] + "..."



# --- message assembly -----------------------------------------------------------


@dataclass(frozen=True)
class Tried:
    """A launch the worker already made on its own, as data: the knobs it changed, to what (None:
    removed), and how. Only `phrase` turns it into words, so a message or a restart sentence asks
    "was MAX_NUM_SEQS changed?" of `changes`, never of a sentence.

    how: "changed" (relaunched with `changes`), "first_launch" (the capacity plan's first launch),
    "same" (relaunched with the same settings), "after_wait" (the same, after waiting for memory),
    "no_wait" (the same, GPU_MEMORY_WAIT=false), "refetch" (to resolve a vanished revision again).
    """

    changes: Mapping[str, str | None] = field(default_factory=dict)
    how: str = "changed"

    @property
    def phrase(self) -> str:
        if self.how == "same":
            return "relaunched once with the same settings"
        if self.how == "after_wait":
            return "waited for the memory to be released and relaunched with the same settings"
        if self.how == "no_wait":
            return "relaunched with the same settings, without waiting for memory (GPU_MEMORY_WAIT=false)"
        if self.how == "refetch":
            return "relaunched once to fetch the current revision"
        verb = "launched" if self.how == "first_launch" else "relaunched"
        removed = [name for name, value in self.changes.items() if value is None]
        if removed and len(removed) == len(self.changes):
            return f"{verb} without {', '.join(removed)}"
        return f"{verb} with {changes_text(self.changes)}"


def changes_text(changes: Mapping[str, str | None]) -> str:
    """`{"ENFORCE_EAGER": "true", "MAX_NUM_BATCHED_TOKENS": "8192"}` -> "ENFORCE_EAGER=true and MAX_NUM_BATCHED_TOKENS=8192"."""
    return " and ".join(f"{name}={value}" if value is not None else f"no {name}" for name, value in changes.items())


def tried_sentence(tried: Sequence[Tried]) -> str:
    return f" Already tried: {'; '.join(t.phrase for t in tried)}." if tried else ""


def changed(tried: Sequence[Tried], variable: str) -> bool:
    """Whether a launch the worker made on its own already changed `variable`."""
    return any(variable in t.changes for t in tried)


def compose(cause: str, tried: Sequence[Tried], fixes: Sequence[str]) -> str:
    text = cause.rstrip(".") + "." + tried_sentence(tried)
    if fixes:
        text += f" To fix: {'; or '.join(fixes)}."
    return text


def gib(value: str) -> str:
    return f"{float(value):g}"


# What only the CPU engine prints: its config line, its KV sizing lines (cpu_worker.py:220-258),
# its KV capacity line and the platform choice (platforms/__init__.py). Not "CPU backend": vLLM's
# own GPU error texts say "(which also controls CPU memory on the CPU backend)".
_CPU_ENGINE = (
    r"(?m)device_config=cpu\b|GiB for KV cache on node \S+|Available memory on node \S+ \("
    r"|^CPU KV cache size: |Automatically detected platform cpu\."
)


def device_of(ctx: Context) -> str:
    cpu = any(hit.rule.detail and hit.rule.detail.startswith("cpu_") for hit in ctx.hits)
    return "CPU" if cpu or ctx.search(_CPU_ENGINE) else "GPU"



# --- secrets ---------------------------------------------------------------------------------

def scrubbed(diagnosis: Diagnosis, env: Mapping[str, str]) -> Diagnosis:
    """The diagnosis with any secret value from the environment masked (argparse echoes arguments):
    config.secrets' one rule, the same the logged argv is masked by."""
    secrets = secret_values(env)

    def clean(text: str | None) -> str | None:
        return mask_text(text, secrets) if text is not None else None

    return Diagnosis(
        kind=diagnosis.kind,
        message=clean(diagnosis.message) or "",
        evidence=clean(diagnosis.evidence) or "",
        detail=diagnosis.detail,
        estimated_max_len=diagnosis.estimated_max_len,
        variable=diagnosis.variable,
        value=clean(diagnosis.value),
        repo=diagnosis.repo,
        revision=diagnosis.revision,
        facts=dict(diagnosis.facts),
    )



def answer(ctx: Context, kind: str, cause: str, fixes: Sequence[str], *, line: str | None = None, **fields: Any) -> Diagnosis:
    """The one way a message builder finishes: the cause, what the worker already tried, the fixes that
    remain; the evidence is the line that named the cause (the last hit's unless `line` is given)."""
    evidence = evidence_of(line if line is not None else ctx.hits[-1].line)
    return Diagnosis(kind=kind, message=compose(cause, ctx.tried, fixes), evidence=evidence, **fields)


def answer_shared(ctx: Context, kind: str, sentence: str, *, line: str | None = None, **fields: Any) -> Diagnosis:
    """`answer` for a cause whose whole sentence is shared with the pre-flight (`hub`):
    the same words whichever path found it, then what the worker already tried."""
    evidence = evidence_of(line if line is not None else ctx.hits[-1].line)
    return Diagnosis(kind=kind, message=sentence + tried_sentence(ctx.tried), evidence=evidence, **fields)
