"""What a job does when its request fails (serving.after_death.decide), case by case and over every input.

The handler only carries out the step; these tests are the rules: a request that failed for its own
reasons is answered with its sentence; one that failed the way a dying engine fails waits for the
monitor's record; one that never reached the engine is sent again once; a completion or chat that was
running is continued on the restarted engine when that is the same request, once, and otherwise
answered with the death's sentence and why not.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from vllm_worker.serving import continuation
from vllm_worker.serving.after_death import (
    CONFIRM,
    Answer,
    Continue,
    Failed,
    Finish,
    Job,
    Retry,
    SendWhole,
    Worker,
    decide,
    why_not,
)
from vllm_worker.serving.state import STOPPED, Death

DEATH = Death("The engine was killed (signal 9) while serving requests. The worker is restarting it; retry the request.")
DROPPED = Failed("The engine closed the connection in the middle of its response.", dying=True, connected=True)
REFUSED = Failed("The engine is not reachable (connection refused).", dying=True, connected=False)
TIMEOUT = Failed("The engine did not finish answering within REQUEST_TIMEOUT=900 seconds.", dying=False, connected=True)
STREAM = Job(continuable=True, stream=True, refused=None, blocker=None, sent_ids=True, remaining=50, retried=False, resent=0, elapsed=2.0)
PLAIN = replace(STREAM, stream=False, sent_ids=False, remaining=None)
READY = Worker(ready=True, stopping=False, spent=False, request_timeout=900.0)
RESTARTING = replace(READY, ready=False)


def test_a_request_that_failed_for_its_own_reasons_is_answered_with_its_sentence() -> None:
    assert decide(TIMEOUT, STREAM, READY) == Answer(TIMEOUT.sentence)
    assert decide(TIMEOUT, STREAM, READY, DEATH, confirmed=True) == Answer(TIMEOUT.sentence)


def test_a_dropped_request_waits_for_the_record_of_the_death() -> None:
    assert decide(DROPPED, STREAM, READY) is CONFIRM
    assert decide(DROPPED, STREAM, READY, None, confirmed=True) == Answer(DROPPED.sentence)  # no death: the drop's sentence


def test_a_request_that_never_reached_a_restarting_engine_is_sent_there_without_waiting() -> None:
    assert decide(REFUSED, STREAM, RESTARTING) == Retry()
    assert decide(REFUSED, STREAM, READY) is CONFIRM
    assert decide(REFUSED, STREAM, READY, DEATH, confirmed=True) == Retry()
    retried = replace(STREAM, retried=True)
    assert decide(REFUSED, retried, RESTARTING) is CONFIRM  # once only
    assert decide(REFUSED, retried, READY, DEATH, confirmed=True) == Continue()


def test_a_running_stream_is_continued_a_plain_job_sent_again_and_a_finished_stream_closed() -> None:
    assert decide(DROPPED, STREAM, READY, DEATH, confirmed=True) == Continue()
    assert decide(DROPPED, PLAIN, READY, DEATH, confirmed=True) == SendWhole()
    nothing_sent = replace(STREAM, sent_ids=False)
    assert decide(DROPPED, nothing_sent, READY, DEATH, confirmed=True) == SendWhole()
    assert decide(DROPPED, replace(STREAM, remaining=0), READY, DEATH, confirmed=True) == Finish()
    assert decide(DROPPED, replace(STREAM, remaining=1), READY, DEATH, confirmed=True) == Continue()  # one token still to make
    assert decide(DROPPED, replace(STREAM, remaining=None), READY, DEATH, confirmed=True) == Continue()


def test_the_drains_cut_and_a_route_that_cannot_be_continued_end_with_the_death_uncounted() -> None:
    cut = Death("The platform stopped the worker; send the job again.", STOPPED, restarted=False)
    assert decide(DROPPED, STREAM, READY, cut, confirmed=True) == Answer(cut.sentence)
    embeddings = replace(PLAIN, continuable=False)
    assert decide(DROPPED, embeddings, READY, DEATH, confirmed=True) == Answer(DEATH.sentence)


def test_why_not_names_each_reason_and_the_answer_counts_it() -> None:
    cases = [
        (STREAM, replace(READY, stopping=True), "stopping"),
        (STREAM, replace(READY, spent=True), "spent"),
        (replace(STREAM, resent=1), READY, "again"),
        (replace(PLAIN, elapsed=900.0), READY, "timeout"),
        (replace(STREAM, refused="seed"), READY, "seed"),
        (replace(STREAM, blocker="unknown"), READY, "unknown"),
        (replace(STREAM, blocker="parsed"), READY, "parsed"),
    ]
    for job, worker, reason in cases:
        assert why_not(job, worker, spent=worker.spent) == reason
        expected = Answer(continuation.not_continued_sentence(DEATH.sentence, reason), reason)
        assert decide(DROPPED, job, worker, DEATH, confirmed=True) == expected
    assert why_not(PLAIN, READY, spent=False) is None  # a plain job is sent again whole
    spent = Death(DEATH.sentence, "oom", restarted=False)
    assert decide(DROPPED, STREAM, READY, spent, confirmed=True) == Answer(DEATH.sentence, "spent")


# --------------------------------------------------------------------------- every input


def handler_before(failed: Failed, job: Job, worker: Worker, death: Death | None, stop_cut: str | None) -> object:
    """The rules as the handler's loop carried them out before they were one function (ee29c03), kept as the
    oracle: the decision must take the same step for every input."""
    if not failed.dying:
        return Answer(failed.sentence)
    if not failed.connected and not job.retried and not worker.ready:
        return Retry()
    if death is None:
        return Answer(failed.sentence)
    if not failed.connected and not job.retried:
        return Retry()
    if not (job.continuable and death.sentence != stop_cut):
        return Answer(death.sentence)
    spent = worker.spent or not death.restarted
    if worker.stopping:
        reason: str | None = "stopping"
    elif spent:
        reason = "spent"
    elif job.resent:
        reason = "again"
    elif job.elapsed >= worker.request_timeout:
        reason = "timeout"
    elif not job.stream:
        reason = None
    elif job.refused is not None:
        reason = job.refused
    else:
        reason = job.blocker
    if reason is not None:
        return Answer(continuation.not_continued_sentence(death.sentence, reason), reason)
    if job.stream and job.sent_ids:
        return Finish() if job.remaining is not None and job.remaining <= 0 else Continue()
    return SendWhole()


reasons = st.sampled_from(sorted(continuation.REASONS))
jobs = st.builds(
    Job,
    continuable=st.booleans(),
    stream=st.booleans(),
    refused=st.none() | reasons,
    blocker=st.none() | st.sampled_from(["unknown", "parsed"]),
    sent_ids=st.booleans(),
    remaining=st.none() | st.integers(-3, 3),
    retried=st.booleans(),
    resent=st.integers(0, 2),
    elapsed=st.sampled_from([0.0, 5.0, 899.9, 900.0, 1000.0]),
)
workers = st.builds(Worker, ready=st.booleans(), stopping=st.booleans(), spent=st.booleans(), request_timeout=st.just(900.0))
failures = st.builds(Failed, sentence=st.sampled_from(["dropped.", "timed out."]), dying=st.booleans(), connected=st.booleans())
deaths = st.none() | st.builds(
    Death,
    sentence=st.sampled_from(["killed.", "cut by the stop."]),
    cause=st.sampled_from(["engine_died", "oom", STOPPED]),
    restarted=st.booleans(),
)


@given(failures, jobs, workers, deaths)
def test_the_decision_takes_the_handlers_former_step_for_every_input(
    failed: Failed, job: Job, worker: Worker, death: Death | None
) -> None:
    stop_cut = death.sentence if death is not None and death.cause == STOPPED else None
    first = decide(failed, job, worker)
    step = decide(failed, job, worker, death, confirmed=True) if first is CONFIRM else first
    assert step == handler_before(failed, job, worker, death, stop_cut)


@given(failures, jobs, workers, deaths)
def test_a_job_is_sent_again_only_once_and_never_after_the_worker_stops(
    failed: Failed, job: Job, worker: Worker, death: Death | None
) -> None:
    step = decide(failed, job, worker, death, confirmed=True)
    assert step is not CONFIRM
    if isinstance(step, Retry):
        assert not failed.connected and not job.retried
    if isinstance(step, (SendWhole, Continue, Finish)):
        assert death is not None and death.restarted and death.cause != STOPPED
        assert not (worker.stopping or worker.spent or job.resent) and job.continuable
        assert job.elapsed < worker.request_timeout
    if isinstance(step, Answer) and step.not_continued is not None:
        assert step.not_continued in continuation.REASONS and death is not None
        assert step.sentence.startswith(death.sentence)
