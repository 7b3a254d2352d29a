"""Why an engine that had started and served stopped.

Separate from `startup_errors`: a death while serving is never walked up the startup
ladder's footprint knobs by its words alone (the configuration did start), and its
message names how the process stopped and vLLM's last error.

A death whose output names a fault of the machine (the startup's own host-fault rules: NCCL,
the driver, an ECC error, a GPU fallen off the bus) is that same cause, `host_fault`, in the
startup's words: the configuration served, the machine failed. It is restarted in place once;
a second fault of the machine on the same worker (`fresh_worker_now`) is a fresh worker's to
fix, asked for within the endpoint-wide bound of `serving.fresh_machine`.
"""

from __future__ import annotations

import re
import signal
from typing import Sequence

from vllm_worker.config.profile import LaunchProfile
from vllm_worker.diagnosis.rules import Hit, clean_lines, find_hits
from vllm_worker.diagnosis.startup_errors import host_fault_words
from vllm_worker.diagnosis.verdict import Diagnosis, Failure, Tried, changes_text, compose, evidence_of, scrubbed

# --- the engine died while serving ------------------------------------------------------------

# Why an engine that had started and served stopped. Not startup kinds: `engine.ladder`'s ladder never sees these.
# A fault of the machine while serving is the startup kind MACHINE_FAULT instead, the same cause.
RUNTIME_KINDS: dict[str, str] = {
    "runtime_oom": "the engine started fine and then ran out of memory on a request",
    "engine_died": "the engine stopped while serving, for a reason other than memory",
    "engine_hung": "the engine answered nothing, not even its health check, for ENGINE_HANG_TIMEOUT seconds",
}

# vLLM logs this once its API server listens (vllm/entrypoints/openai/api_server.py); what
# follows it in the tail happened while serving.
SERVING_MARKER = "Starting vLLM server on"
# vllm/v1/engine/exceptions.py:16, EngineDeadError: in-flight requests are answered with it.
ENGINE_DEAD_TEXT = "EngineCore encountered an issue"

_RUNTIME_OOM_GPU = re.compile(r"(?:CUDA|HIP) out of memory|CUDA error: out of memory|OutOfMemoryError")
_RUNTIME_OOM_CPU = re.compile(r"DefaultCPUAllocator: can't allocate memory")
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception)(?::|$)")


MACHINE_FAULT = "host_fault"


def _serving_lines(output: str) -> list[str]:
    lines = clean_lines(output)
    starts = [i for i, line in enumerate(lines) if SERVING_MARKER in line]
    return lines[starts[-1] + 1 :] if starts else lines


def _how_it_stopped(exit_code: int | None) -> str:
    if exit_code is None:
        return "reported itself dead (its /health answered 503, EngineDeadError)"
    if exit_code < 0:
        try:
            name = f" ({signal.Signals(-exit_code).name})"
        except ValueError:
            name = ""
        return f"was killed by signal {-exit_code}{name}"
    return f"exited with code {exit_code}"


def _root_line(lines: Sequence[str]) -> str | None:
    """vLLM's last exception line that is not the EngineDeadError every request gets."""
    for line in reversed(lines):
        text = line.strip()
        if _EXCEPTION_LINE.match(text) and ENGINE_DEAD_TEXT not in text:
            return text
    return None


def _machine_fault(lines: Sequence[str]) -> Hit | None:
    """The last line naming a fault of the machine, by the startup's rules and their tiers: none when a
    cause of the settings or the software is named too (an NCCL error in one rank is then its echo)."""
    hits = find_hits(lines)
    if any(hit.rule.tier == 0 and not hit.rule.weak for hit in hits):
        return None
    faults = [hit for hit in hits if hit.rule.kind == MACHINE_FAULT]
    return faults[-1] if faults else None


def _runtime_oom_fixes(output: str, profile: LaunchProfile) -> list[str]:
    fixes: list[str] = []
    tokens = profile.max_num_batched_tokens
    if tokens is None or tokens <= 0:
        chosen = re.findall(r"max_num_batched_tokens=(\d+)", output)
        tokens = int(chosen[-1]) if chosen else None
        where = "vLLM's choice" if tokens else None
    else:
        where = "set"
    if tokens:
        fixes.append(
            f"lower MAX_NUM_BATCHED_TOKENS (now {tokens}, {where}), e.g. to {max(256, tokens // 2)}, "
            f"to cap the prompt tokens processed in one step"
        )
    else:
        fixes.append("set MAX_NUM_BATCHED_TOKENS (e.g. 2048) to cap the prompt tokens processed in one step")
    length = profile.written("MAX_MODEL_LEN")
    if length is None or not length.isdigit() or int(length) <= 0:
        used = re.findall(r"Using max model len (\d+)", output)
        length = used[-1] if used else None
    context = f"the {length}-token context the engine accepts" if length else "the context the engine accepts"
    fixes.append(f"cap the prompt length your clients send, well below {context}")
    seqs = profile.effective_max_num_seqs()
    fixes.append(f"lower MAX_NUM_SEQS (now {seqs}) so fewer sequences share one step")
    return fixes


def runtime_failure(failure: Failure) -> Diagnosis:
    """Why an engine that was serving stopped, from the tail of its output.

    failure.exit_code: the engine process's status (negative: the signal that killed it), or None when
    the process is alive but vLLM's /health answers 503. A memory failure after a good start is
    "runtime_oom", with the limits that bound one step's memory; a line naming a fault of the machine
    makes it "host_fault", naming which part failed; anything else is "engine_died", naming how it
    stopped and vLLM's last exception line.
    """
    output, exit_code = failure.output, failure.exit_code
    lines = _serving_lines(output)
    text = "\n".join(lines)
    how = _how_it_stopped(exit_code)
    cpu = next((line for line in reversed(lines) if _RUNTIME_OOM_CPU.search(line)), None)
    gpu = next((line for line in reversed(lines) if _RUNTIME_OOM_GPU.search(line)), None)
    oom = cpu or gpu
    if oom is not None:
        device = "CPU" if cpu else "GPU"
        m = re.search(r"Tried to allocate ([\d.]+ [KMG]iB)", text)
        b = re.search(r"you tried to allocate (\d+) bytes", text)
        asked = f" (one allocation of {m.group(1)} failed)" if m else ""
        if not m and b:
            asked = f" (one allocation of {int(b.group(1)) / 2**30:.1f} GiB failed)"
        cause = (
            f"The engine ran out of {device} memory while serving requests{asked} and stopped. It had started "
            f"and served with these settings, so the KV cache is not the problem: one step needed more memory "
            f"than was left outside it, typically for a very long prompt or many prompts prefilled at once"
        )
        diagnosis = Diagnosis(
            kind="runtime_oom",
            message=compose(cause, (), _runtime_oom_fixes(output, failure.profile)),
            evidence=evidence_of(oom),
            facts={"device": device},
        )
    elif (fault := _machine_fault(lines)) is not None:
        detail = fault.rule.detail or "device"
        cause = f"The engine {how} while serving requests because of {host_fault_words(detail)}: {evidence_of(fault.line)}"
        diagnosis = Diagnosis(
            kind=MACHINE_FAULT, message=cause.rstrip(".") + ".", evidence=evidence_of(fault.line), detail=detail
        )
    else:
        root = _root_line(lines)
        last = f"; its last error was: {evidence_of(root)}" if root else ""
        cause = f"The engine {how} while serving requests{last}"
        diagnosis = Diagnosis(kind="engine_died", message=cause.rstrip(".") + ".", evidence=evidence_of(root or ""))
    if exit_code is not None:
        diagnosis.facts["exit_code"] = str(exit_code)
    return scrubbed(diagnosis, failure.profile.env)


RESTARTING = "The worker is restarting the engine with the same settings; retry the request."


def restarting_sentence(step: Tried | None) -> str:
    """What running jobs hear after the cause: the engine comes back as it was, or on a ladder step."""
    if step is None:
        return RESTARTING
    return f"The worker is restarting the engine with {changes_text(step.changes)}; retry the request."


def fresh_worker_now(kind: str | None, earlier: Sequence[str]) -> bool:
    """Whether a failure while serving (a death, or a restart that failed to start) is answered by asking
    for a fresh worker instead of restarting the engine in place.

    kind: the failure's cause; earlier: the causes this worker saw before it, its start's failed launches
    included. A fault of the machine gets one relaunch in place on this machine, at start or while
    serving; at the second one a fresh worker, usually on another machine, is the fix.
    """
    return kind == MACHINE_FAULT and MACHINE_FAULT in earlier


def machine_fault_answer(diagnosis: Diagnosis, earlier: Sequence[str]) -> str | None:
    """The answer to a death while serving that a fresh worker is to fix (`fresh_worker_now`), before the
    fresh worker is asked for; None when the engine is to be restarted in place as usual."""
    if not fresh_worker_now(diagnosis.kind, earlier):
        return None
    return (
        f"{diagnosis.message} The engine was already relaunched once on this machine after a fault of the "
        f"machine, so it is not restarted here again: a fresh worker is the fix."
    )


def hang_diagnosis(seconds: float) -> Diagnosis:
    """Why a hung engine was killed: it answered nothing, not even /health, for ENGINE_HANG_TIMEOUT."""
    return Diagnosis(
        kind="engine_hung",
        message=(
            f"The engine stopped answering while serving: its health check gave no answer for {seconds:g} seconds "
            f"(ENGINE_HANG_TIMEOUT), so it was killed; a stuck GPU kernel, a deadlocked collective or a stopped "
            f"process does this."
        ),
        evidence="",
    )
