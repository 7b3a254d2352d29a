"""Continuing a job on the relaunched engine after the one serving it died or hung; pure, no I/O.

What it rests on (vLLM 0.32, read from its sources):

- A request with `return_token_ids: true` names its prompt's token ids (`prompt_token_ids`,
  in the first streamed chunk: in the choice for completions, at the top for chat) and the
  ids each chunk adds (`token_ids`). The worker asks for them on every streamed completion
  and chat completion it could continue, reads them off the events it relays, and gives the
  client the events it would have had without them (the fields set to null, as vLLM writes
  them when not asked; chat's empty chunks sent only for the ids dropped).
- `/v1/completions` takes token ids as its prompt and does not tokenize them again. The
  continuation is one completion whose prompt is the original prompt's ids (a chat's after
  its template) followed by every id the client was sent; it asks for what remains of
  `max_tokens` and `min_tokens`, with the same sampling fields. At temperature 0 the model
  then sees exactly the tokens an undisturbed run would have fed back, so the rest is the
  same greedy choice, up to vLLM's CPU kernels, which are not batch-invariant (a different
  batch can flip a near tie). Continuing by text instead would tokenize the generated text
  again, which need not give back the ids the model chose.
- vLLM's detokenizer starts the continuation's text with the prompt's last ids as context,
  so the first characters join the text already sent as one run would have written them.

A request is continued only where that continuation is the same request; `refusal` names why
not (several choices, a fixed seed, structured output, tools, logprobs, penalties on output
tokens, stop strings whose text vLLM holds back). A plain (not streamed) job has sent
nothing, so it is sent again whole, which is the same request whatever its fields.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from vllm_worker.serving.stream_relay import event_data, split_events

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
ROUTES = frozenset({CHAT, COMPLETIONS})

# Why a streamed request is not continued: the key counted in the status job, and the clause
# the job's answer ends with ("It was not continued on the restarted engine: <clause>.").
REASONS: dict[str, str] = {
    "choices": "it asks for several choices (n > 1 or several prompts), which a continuation cannot keep in step",
    "seed": "it fixes a seed, and a continuation would draw from another random stream than the undisturbed run",
    "structured": "it asks for structured output (response_format or structured_outputs), whose grammar state a continuation cannot resume",
    "tools": "it offers tools, and a tool call parsed mid-call cannot be resumed",
    "logprobs": "it asks for logprobs, which a continuation cannot supply in the same form",
    "penalties": "it sets presence or frequency penalties, which count only the tokens of one request",
    "stop": "it has stop strings, and the engine holds back the text that may begin one",
    "echo": "it echoes its prompt or has a suffix or prompt embeddings, which a continuation would change",
    "beam": "it uses beam search, which a continuation cannot resume",
    "thinking": "it sets a thinking budget, which counts only the tokens of one request",
    "parsed": "the engine parsed its output into reasoning or tool calls, which a plain continuation would not do",
    "timeout": "it had run past REQUEST_TIMEOUT",
    "again": "it had been continued once already and the engine stopped again, so it is not continued a second time",
    "stopping": "the platform is stopping the worker",
    "spent": "the engine is not restarted",  # the death's own sentence says so: answered as it is
    "unknown": "the engine had not said which tokens it had sent",
}

# Fields a chat request shares with a completion and that mean the same there (vLLM 0.32).
_CARRIED = (
    "model", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "length_penalty",
    "stop_token_ids", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
    "include_stop_str_in_output", "logit_bias", "allowed_token_ids", "bad_words", "priority",
    "stream_options", "user", "vllm_xargs", "cache_salt", "request_id", "stop", "repetition_detection",
)  # fmt: skip


def refusal(path: str, body: dict[str, Any]) -> str | None:
    """Why this streamed request would not be the same request when continued (a REASONS key), or None."""
    if path not in ROUTES:
        return "choices"  # never asked: the handler continues only these two routes
    n = body.get("n")
    prompt = body.get("prompt")
    if (isinstance(n, int) and n > 1) or (isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) and len(prompt) > 1):
        return "choices"
    if body.get("use_beam_search"):
        return "beam"
    if body.get("seed") is not None:
        return "seed"
    response_format = body.get("response_format")
    if body.get("structured_outputs") or (
        isinstance(response_format, dict) and response_format.get("type") not in (None, "text")
    ):
        return "structured"
    if body.get("tools") and body.get("tool_choice") != "none":
        return "tools"
    if body.get("logprobs") or body.get("top_logprobs") or body.get("prompt_logprobs") or body.get("logprob_token_ids"):
        return "logprobs"
    if body.get("presence_penalty") or body.get("frequency_penalty"):
        return "penalties"
    if body.get("echo") or body.get("suffix") or body.get("prompt_embeds"):
        return "echo"
    if body.get("thinking_token_budget") is not None:
        return "thinking"
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else []
    if not body.get("include_stop_str_in_output") and any(isinstance(s, str) and len(s) > 1 for s in stops):
        return "stop"
    return None


def not_continued_sentence(death: str, reason: str) -> str:
    """The answer of a job that was not continued: the death's sentence, then why."""
    if reason == "spent":
        return death
    return f"{death} It was not continued on the restarted engine: {REASONS[reason]}."


def for_stream(path: str, body: dict[str, Any] | None) -> tuple[str | None, "StreamLedger | None"]:
    """For a streamed job: why it could not be continued (None: it could), and the ledger that reads its events."""
    if body is None:
        return None, None
    refused = refusal(path, body)
    return refused, (StreamLedger(path == CHAT, bool(body.get("return_token_ids"))) if refused is None else None)


def asking_for_ids(body: dict[str, Any]) -> dict[str, Any]:
    """The body sent to the engine for a streamed job that could be continued: with the token ids."""
    if body.get("return_token_ids"):
        return body
    return {**body, "return_token_ids": True}


_PROMPT_IDS = re.compile(r'"prompt_token_ids":\[([0-9,\s]*)\]')
_TOKEN_IDS = re.compile(r'"token_ids":\[([0-9,\s]*)\]')


def _ids(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def _dump(payload: Any) -> str:
    return "data: " + json.dumps(payload, ensure_ascii=False, separators=(",", ":")) + "\n\n"


def _usage_with(usage: Any, prompt_tokens: int, kept: int) -> Any:
    if not isinstance(usage, dict):
        return usage
    completion = kept + int(usage.get("completion_tokens") or 0)
    fixed = {**usage, "prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}
    if fixed.get("prompt_tokens_details") is not None:
        fixed["prompt_tokens_details"] = None  # the continuation's prompt cache hits are not the job's
    return fixed


@dataclass
class StreamLedger:
    """What a streamed job's client has been sent, read off the events as they pass.

    `first` relays the original request's events; `second` turns the continuation's (a
    completion on the original prompt's and the sent tokens' ids) into the events the client's
    own stream would have carried next: same id, created time and shape, usage adding up.
    """

    chat: bool
    client_ids: bool  # the client asked for return_token_ids itself
    prompt_ids: list[int] | None = None
    ids: list[int] = field(default_factory=list)
    events: int = 0
    parsed: bool = False  # reasoning or tool calls seen in a chat delta
    stream_id: str | None = None
    created: int | None = None
    model: str | None = None
    continued: bool = False
    kept: int = 0  # ids sent before the continuation
    continuation_prompt: int = 0

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids or ())

    def first(self, batch: str) -> str:
        """The client's text for `batch` (whole SSE events) of the original request.

        Read without a JSON round trip (a few regular expressions an event): token ids are plain
        digit lists, and a JSON string holds no unescaped quote, so `"token_ids":[` is only ever
        the field. The first event, and any a parser may have shaped, are read as JSON.
        """
        if self.stream_id is not None and '_ids":[' not in batch and not (self.chat and ('"reasoning' in batch or '"tool_calls"' in batch)):
            self.events += 1
            return batch  # nothing to read or hide (an engine that names no ids)
        out: list[str] = []
        for event in split_events(batch):
            if self.stream_id is None or (self.chat and ('"reasoning' in event or '"tool_calls"' in event)):
                data = event_data(event)
                try:
                    payload = json.loads(data) if data and data != "[DONE]" else None
                except ValueError:
                    payload = None
                if isinstance(payload, dict):
                    self._note_parsed(payload)
            if '_ids":[' not in event:
                self.events += 1
                out.append(event)
                continue
            prompt = _PROMPT_IDS.search(event)
            if prompt is not None:
                self.prompt_ids = _ids(prompt.group(1))
            for found in _TOKEN_IDS.finditer(event):
                self.ids.extend(_ids(found.group(1)))
            if not self.client_ids and (prompt is not None or '"token_ids":[' in event):
                event = _TOKEN_IDS.sub('"token_ids":null', _PROMPT_IDS.sub('"prompt_token_ids":null', event))
                if self.chat and '"delta":{}' in event and '"finish_reason":null' in event and '"usage"' not in event:
                    continue  # sent only because ids were asked for
            if event.startswith("data:"):
                self.events += 1
            out.append(event)
        return "".join(out)

    def _note_parsed(self, payload: dict[str, Any]) -> None:
        if self.stream_id is None and isinstance(payload.get("id"), str):
            self.stream_id, self.created, self.model = payload.get("id"), payload.get("created"), payload.get("model")
        for choice in payload.get("choices") or ():
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if isinstance(delta, dict) and (delta.get("reasoning") or delta.get("reasoning_content") or delta.get("tool_calls")):
                self.parsed = True

    def blocker(self) -> str | None:
        """Why what was sent cannot be continued (a REASONS key), or None."""
        if self.parsed:
            return "parsed"
        if self.prompt_ids is None:
            return None if self.events == 0 and not self.ids else "unknown"
        return None

    def second(self, batch: str) -> str:
        """The client's text for the continuation's `batch` (whole SSE events)."""
        out: list[str] = []
        for event in split_events(batch):
            data = event_data(event)
            if not data or data == "[DONE]":
                out.append(event)
                continue
            try:
                payload = json.loads(data)
            except ValueError:
                out.append(event)
                continue
            if not isinstance(payload, dict):
                out.append(event)
                continue
            view = self._rewrite(payload)
            if view is not None:
                out.append(_dump(view))
                self.events += 1
        return "".join(out)

    def _rewrite(self, payload: dict[str, Any]) -> dict[str, Any] | None:
        choices = [c for c in payload.get("choices") or () if isinstance(c, dict)]
        for choice in choices:
            if isinstance(choice.get("token_ids"), list):
                self.ids.extend(choice["token_ids"])
        usage = payload.get("usage")
        if usage is not None:
            usage = _usage_with(usage, self.prompt_tokens, self.kept)
        if not self.chat:
            rewritten = {**payload, "id": self.stream_id or payload.get("id"), "created": self.created or payload.get("created")}
            if usage is not None:
                rewritten["usage"] = usage
            for choice in choices:
                if "prompt_token_ids" in choice:  # the client had the job's own prompt ids already
                    choice["prompt_token_ids"] = None
                if not self.client_ids and "token_ids" in choice:
                    choice["token_ids"] = None
            return rewritten
        chunk: dict[str, Any] = {
            "id": self.stream_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model or payload.get("model"),
            "choices": [],
        }
        for choice in choices:
            text = choice.get("text") or ""
            finish = choice.get("finish_reason")
            if not text and finish is None and not self.client_ids:
                continue
            delta: dict[str, Any] = {"content": text} if text else {}
            chat_choice: dict[str, Any] = {"index": choice.get("index", 0), "delta": delta, "logprobs": None, "finish_reason": finish}
            if finish is not None:
                chat_choice["stop_reason"] = choice.get("stop_reason")
            chat_choice["token_ids"] = choice.get("token_ids") if self.client_ids else None
            chunk["choices"].append(chat_choice)
        if usage is not None:
            chunk["usage"] = usage
        if not chunk["choices"] and usage is None:
            return None
        return chunk


    def closing(self, body: dict[str, Any]) -> str:
        """The events that end a stream whose every asked-for token was sent before the engine died."""
        kept = len(self.ids)
        ids: list[int] | None = [] if self.client_ids else None
        if self.chat:
            choice: dict[str, Any] = {
                "index": 0, "delta": {}, "logprobs": None, "finish_reason": "length", "stop_reason": None, "token_ids": ids
            }
            obj = "chat.completion.chunk"
        else:
            choice = {
                "index": 0, "text": "", "logprobs": None, "finish_reason": "length", "stop_reason": None,
                "prompt_token_ids": None, "token_ids": ids,
            }
            obj = "text_completion"
        head = {"id": self.stream_id, "object": obj, "created": self.created, "model": self.model}
        out = _dump({**head, "choices": [choice]})
        options = body.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            usage = {"prompt_tokens": self.prompt_tokens, "completion_tokens": kept, "total_tokens": self.prompt_tokens + kept}
            out += _dump({**head, "choices": [], "usage": usage})
        return out + "data: [DONE]\n\n"


def continuation_body(body: dict[str, Any], chat: bool, ledger: StreamLedger, context_length: int | None = None) -> dict[str, Any]:
    """The /v1/completions body that asks for the rest of a streamed job (prompt ids + sent ids).

    A job that named no max_tokens ran to the end of the context (chat's default); a completion's
    default is 16 tokens, so the continuation names the context length (vLLM caps it at what the
    context has left) where it is known.
    """
    assert ledger.prompt_ids is not None
    kept = len(ledger.ids)
    if chat:
        rest: dict[str, Any] = {key: body[key] for key in _CARRIED if key in body}
        wanted = body.get("max_completion_tokens", body.get("max_tokens"))
    else:
        rest = {key: value for key, value in body.items() if key not in ("prompt", "add_special_tokens")}
        wanted = body.get("max_tokens")
    if wanted is not None:
        rest["max_tokens"] = max(int(wanted) - kept, 1)
    elif context_length is not None:
        rest["max_tokens"] = context_length
    else:
        rest.pop("max_tokens", None)
    if body.get("min_tokens"):
        rest["min_tokens"] = max(int(body["min_tokens"]) - kept, 0)
    rest["prompt"] = list(ledger.prompt_ids) + list(ledger.ids)
    rest["stream"] = True
    rest["return_token_ids"] = True
    rest.pop("max_completion_tokens", None)
    return rest


def remaining_tokens(body: dict[str, Any], kept: int) -> int | None:
    """What is left of the job's max_tokens once `kept` tokens were sent (None: no bound named)."""
    wanted = body.get("max_completion_tokens", body.get("max_tokens"))
    return None if wanted is None else int(wanted) - kept


def notice(kept: int, cause: str, profile: dict[str, Any] | None) -> dict[str, Any]:
    """The `worker` object of a continued job's response (with the degraded profile, where there is one)."""
    worker: dict[str, Any] = {"continued": {"tokens_kept": kept, "after": cause}}
    if profile is not None:
        worker.update(degraded=True, profile=profile)
    return worker


def notice_comment(kept: int, cause: str, profile: dict[str, Any] | None) -> str:
    """The `: worker` SSE comment a continued stream carries before the continuation's events."""
    return ": worker " + json.dumps(notice(kept, cause, profile)) + "\n\n"
