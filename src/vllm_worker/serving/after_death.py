"""What a job does when its request to the engine failed: answer, send again, continue, or finish; pure.

Why one function: a request that fails the way a dying engine fails (a dropped connection, vLLM's
EngineDeadError) may be the engine's death, which the monitor records a moment later; a request
that never reached the engine can go to the restarted one; a completion or chat that was running
is continued there when that is the same request (serving.continuation), once. Those rules were
spread through the handler's loop; here they are one decision over typed facts, and the handler
only carries out the step it returns (tests/unit/test_after_death.py walks every case).
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_worker.serving import continuation
from vllm_worker.serving.state import STOPPED, Death


@dataclass(frozen=True)
class Failed:
    """How one request to the engine failed."""

    sentence: str  # what the job is told if nothing better is known
    dying: bool  # the way a dying engine fails (not a timeout, not an answer of the engine's)
    connected: bool  # the request reached the engine


@dataclass(frozen=True)
class Job:
    """What the job has done so far, as far as a death decides its next step."""

    continuable: bool  # a completion or chat completion with a JSON body
    stream: bool
    refused: str | None  # why its stream could not be continued (continuation.refusal), or None
    blocker: str | None  # why what its client was sent cannot be continued (StreamLedger.blocker)
    sent_ids: bool  # its client was sent tokens whose ids are known: a continuation, not a resend
    remaining: int | None  # of max_tokens, once those tokens are kept (None: no bound named)
    retried: bool  # sent again once already because it never reached the engine
    resent: int  # continuations sent
    elapsed: float  # seconds since the job's first request


@dataclass(frozen=True)
class Worker:
    """The worker's facts at the decision."""

    ready: bool  # an engine answers now
    stopping: bool  # the platform is stopping the worker
    spent: bool  # the engine is not restarted (a fatal answer is set)
    request_timeout: float


@dataclass(frozen=True)
class Answer:
    """End the job with `sentence`; `not_continued` is the reason counted for the status job (None: not counted)."""

    sentence: str
    not_continued: str | None = None


@dataclass(frozen=True)
class Confirm:
    """Wait a moment for the monitor's record of a death, then decide again with it."""


@dataclass(frozen=True)
class Retry:
    """The request never reached the engine: send it again as it was, once it is back (not a continuation)."""


@dataclass(frozen=True)
class SendWhole:
    """Send the job again whole to the restarted engine (a plain job, or a stream whose client had nothing)."""


@dataclass(frozen=True)
class Continue:
    """Continue the stream on the restarted engine from the tokens its client was sent."""


@dataclass(frozen=True)
class Finish:
    """Every token the job asked for was sent before the death: end the stream as the engine would have."""


Step = Answer | Confirm | Retry | SendWhole | Continue | Finish
CONFIRM = Confirm()


def decide(failed: Failed, job: Job, worker: Worker, death: Death | None = None, confirmed: bool = False) -> Step:
    """The next step of a job whose request failed. `confirmed`: `death` is what the monitor recorded since
    the request was sent (None: no death within the wait), rather than not yet asked for."""
    if not failed.dying:
        return Answer(failed.sentence)
    if not failed.connected and not job.retried and not worker.ready:
        return Retry()  # the engine is restarting already: no need to wait for its record
    if not confirmed:
        return CONFIRM
    if death is None:
        return Answer(failed.sentence)
    if not failed.connected and not job.retried:
        return Retry()
    if not job.continuable or death.cause == STOPPED:
        return Answer(death.sentence)
    reason = why_not(job, worker, spent=worker.spent or not death.restarted)
    if reason is not None:
        return Answer(continuation.not_continued_sentence(death.sentence, reason), reason)
    if not job.stream or not job.sent_ids:
        return SendWhole()
    if job.remaining is not None and job.remaining <= 0:
        return Finish()
    return Continue()


def why_not(job: Job, worker: Worker, spent: bool) -> str | None:
    """Why a job running at a death is answered rather than continued (a continuation.REASONS key), or None."""
    if worker.stopping:
        return "stopping"
    if spent:
        return "spent"
    if job.resent:
        return "again"
    if job.elapsed >= worker.request_timeout:
        return "timeout"
    if not job.stream:
        return None
    if job.refused is not None:
        return job.refused
    return job.blocker
