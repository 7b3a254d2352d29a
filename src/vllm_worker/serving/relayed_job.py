"""A job as the handler relays it: what it sends next, and what its client has been sent.

Why: after an engine death a job is sent again, continued from its kept tokens, or finished
(serving.after_death decides which); the body, the route and the ledger of sent tokens change
with that step. They live here, changed only by `take(step)`, so the handler's loop holds no
state of its own and the decision reads them as typed facts (`facts`).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import aiohttp

from vllm_worker.serving import after_death, continuation
from vllm_worker.serving.answers import answered_error_sentence, worker_notice
from vllm_worker.serving.exchange import Relay, Send, client_timeout
from vllm_worker.serving.job_input import EngineRequest, audio_form_fields, with_context_budget
from vllm_worker.serving.state import WorkerState

log = logging.getLogger(__name__)

_READ_ERRORS = (aiohttp.ClientError, TimeoutError, ValueError)


class RelayedJob:
    """One job's request and its continuation ledger, across the sends a death may add."""

    def __init__(self, request: EngineRequest, job: Any) -> None:
        self.request = request
        self.job_id = job.get("id") if isinstance(job, dict) else None
        body = request.body
        self.is_json = body is not None and not request.form
        # A stream that could be continued asks for token ids, read off its events as they pass.
        self.continuable = self.is_json and request.path in continuation.ROUTES
        self.refused, self.ledger = (
            continuation.for_stream(request.path, body) if self.continuable and request.stream else (None, None)
        )
        self.sent_body = continuation.asking_for_ids(body) if self.ledger is not None and body is not None else body
        self.effective = self.sent_body  # the body as sent, max_tokens filled in
        self.path = request.path
        self.data: Any = json.dumps(self.sent_body).encode() if self.is_json and not request.fill_max_tokens else None
        self.retried = False
        self.resent = 0  # continuations sent (at most one)
        self.began = time.monotonic()

    async def next_send(self, state: WorkerState, session: aiohttp.ClientSession) -> Send:
        """The request to send now (the engine is ready): the job's own, or its continuation."""
        body = self.request.body
        if self.ledger is not None and self.ledger.continued:
            if self.data is None:
                assert self.effective is not None
                context = await context_length(state, session)
                self.data = json.dumps(continuation.continuation_body(self.effective, self.ledger.chat, self.ledger, context)).encode()
        elif self.request.fill_max_tokens and self.sent_body is not None:
            self.effective = with_context_budget(self.sent_body, await context_length(state, session))
            self.data = json.dumps(self.effective).encode()
        elif self.request.form and body is not None:
            self.data = _form(body)  # aiohttp sends a FormData only once
        left = state.request_timeout - (time.monotonic() - self.began) if self.resent else None
        return Send(self.request.method, state.host, state.port, self.path, self.data, self.is_json, state.request_timeout, left)

    def relay(self, state: WorkerState) -> Relay:
        """How this send's stream reaches the client: a continued notice or the degraded profile first."""
        ledger = self.ledger
        if self.resent:  # continued, or sent again whole where its client had been sent nothing
            opening: str | None = continuation.notice_comment(ledger.kept if ledger else 0, _cause(state), state.profile)
        elif state.profile is not None:
            opening = ": worker " + json.dumps(worker_notice(state.profile)) + "\n\n"
        else:
            opening = None
        rewrite = (lambda batch: batch) if ledger is None else ledger.second if ledger.continued else ledger.first
        return Relay(opening, rewrite, lambda: _engine_done(state, self.job_id))

    def facts(self) -> after_death.Job:
        ledger = self.ledger
        remaining = None
        if ledger is not None and self.effective is not None:
            remaining = continuation.remaining_tokens(self.effective, len(ledger.ids))
        return after_death.Job(
            continuable=self.continuable,
            stream=self.request.stream,
            refused=self.refused,
            blocker=ledger.blocker() if ledger is not None else "unknown",
            sent_ids=ledger is not None and ledger.prompt_ids is not None,
            remaining=remaining,
            retried=self.retried,
            resent=self.resent,
            elapsed=time.monotonic() - self.began,
        )

    def take(self, step: after_death.Retry | after_death.SendWhole | after_death.Continue) -> None:
        """Carry out a step that sends again."""
        if isinstance(step, after_death.Retry):
            self.retried = True
            return
        if isinstance(step, after_death.SendWhole):
            self.resent += 1
            log.warning("job %s sent again whole to the restarted engine (it had received nothing yet)", self.job_id)
            return
        self._keep()
        assert self.ledger is not None and self.effective is not None
        remaining = continuation.remaining_tokens(self.effective, self.ledger.kept)
        log.warning(
            "job %s continued on the restarted engine: %d tokens kept, %s to go",
            self.job_id, self.ledger.kept, "the rest" if remaining is None else remaining,
        )
        self.path, self.data = continuation.COMPLETIONS, None  # the body needs the restarted engine's context

    def finish(self, state: WorkerState) -> str:
        """The end of a stream whose every asked-for token was sent before the engine died."""
        self._keep()
        assert self.ledger is not None and self.effective is not None
        return continuation.notice_comment(self.ledger.kept, _cause(state), state.profile) + self.ledger.closing(self.effective)

    def _keep(self) -> None:
        """The job is continued: what its client was sent is kept, and the rest comes from the restarted engine."""
        assert self.ledger is not None
        self.resent += 1
        self.ledger.continued, self.ledger.kept = True, len(self.ledger.ids)

    def plain_answer(self, raw: bytes, state: WorkerState) -> Any:
        """A plain answer as the job's output: an error body as a sentence, the worker's notice added."""
        output = _decode_body(raw)
        if isinstance(output, dict) and output.get("error"):
            return {"error": answered_error_sentence(output)}
        if self.resent and isinstance(output, dict):
            output["worker"] = continuation.notice(0, _cause(state), state.profile)
        elif state.profile is not None and isinstance(output, dict):
            output["worker"] = worker_notice(state.profile)
        return output


def _cause(state: WorkerState) -> str:
    """What the continued notice says the job came through: the last death's cause."""
    return state.death.cause if state.death is not None else "engine_died"


def _engine_done(state: WorkerState, job_id: Any) -> None:
    """The engine has sent the job's whole response: its KV cache is free while the answer is posted."""
    if state.engine_done is not None and isinstance(job_id, str):
        state.engine_done.add(job_id)


def _decode_body(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace") if raw.strip() else {}


def _form(body: dict[str, Any]) -> aiohttp.FormData:
    """A fresh multipart body."""
    form = aiohttp.FormData()
    for name, value in audio_form_fields(body):
        if isinstance(value, bytes):
            form.add_field(name, value, filename="audio", content_type="application/octet-stream")
        else:
            form.add_field(name, value)
    return form


def _max_model_len(listing: Any) -> int | None:
    data = listing.get("data") if isinstance(listing, dict) else None
    for entry in data if isinstance(data, list) else []:
        length = entry.get("max_model_len") if isinstance(entry, dict) else None
        if isinstance(length, int) and not isinstance(length, bool) and length > 0:
            return length
    return None


async def context_length(state: WorkerState, session: aiohttp.ClientSession) -> int | None:
    """The engine's max_model_len, read from /v1/models once per engine life (a restarted engine may differ)."""
    cached = state.context_length
    if cached is not None and cached[0] == state.deaths:
        return cached[1]
    deaths = state.deaths
    try:
        url = f"http://{state.host}:{state.port}/v1/models"
        async with session.get(url, timeout=client_timeout(state.request_timeout)) as response:
            listing = await response.json(content_type=None) if response.status == 200 else None
    except _READ_ERRORS:
        listing = None
    length = _max_model_len(listing)
    if length is None:
        log.warning("the engine's /v1/models gave no max_model_len; a job without max_tokens gets the engine's default")
        return None
    state.context_length = (deaths, length)
    return length
