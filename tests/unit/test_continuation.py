"""serving.continuation: which requests a relaunched engine may continue, the continuation's body,
and the one stream a client sees across the two requests (events as vLLM 0.32 writes them)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from vllm_worker.serving import continuation
from vllm_worker.serving.continuation import StreamLedger, continuation_body, refusal

PROMPT_IDS = [1, 15043, 3186]


def event(payload: dict[str, Any]) -> str:
    return "data: " + json.dumps(payload, separators=(",", ":")) + "\n\n"


def payloads(text: str) -> list[Any]:
    out = []
    for line in text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[6:]))
    return out


def completion_chunk(text: str, ids: list[int], first: bool = False, finish: str | None = None) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}
    choice["prompt_token_ids"] = PROMPT_IDS if first else None
    choice["token_ids"] = ids
    return {"id": "cmpl-1", "object": "text_completion", "created": 100, "model": "m", "choices": [choice]}


def chat_chunk(content: str | None, ids: list[int] | None, first: bool = False, finish: str | None = None) -> dict[str, Any]:
    delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else ({"content": content} if content else {})
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, "token_ids": None if first else ids}
    chunk: dict[str, Any] = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 100, "model": "m", "choices": [choice]}
    if first:
        chunk["prompt_token_ids"] = PROMPT_IDS
    return chunk


# --------------------------------------------------------------------------- refusal


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"prompt": "x", "n": 2}, "choices"),
        ({"prompt": ["a", "b"]}, "choices"),
        ({"prompt": "x", "seed": 0}, "seed"),
        ({"prompt": "x", "structured_outputs": {"json": {}}}, "structured"),
        ({"messages": [], "response_format": {"type": "json_object"}}, "structured"),
        ({"messages": [], "tools": [{"type": "function"}]}, "tools"),
        ({"prompt": "x", "logprobs": 2}, "logprobs"),
        ({"messages": [], "logprobs": True, "top_logprobs": 2}, "logprobs"),
        ({"prompt": "x", "presence_penalty": 0.5}, "penalties"),
        ({"prompt": "x", "echo": True}, "echo"),
        ({"prompt": "x", "use_beam_search": True}, "beam"),
        ({"prompt": "x", "stop": ["\n\n"]}, "stop"),
        ({"prompt": "x", "stop": "END"}, "stop"),
        ({"messages": [], "thinking_token_budget": 10}, "thinking"),
    ],
)
def test_a_request_whose_continuation_would_not_be_the_same_request_is_refused(body: dict[str, Any], reason: str) -> None:
    path = continuation.CHAT if "messages" in body else continuation.COMPLETIONS
    assert refusal(path, body) == reason
    assert reason in continuation.REASONS


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": "x", "max_tokens": 600, "temperature": 0},
        {"prompt": [1, 2, 3], "max_tokens": 5},  # one prompt of token ids
        {"prompt": "x", "stop": ["\n"]},  # a one-character stop holds nothing back
        {"prompt": "x", "stop": ["END"], "include_stop_str_in_output": True},
        {"messages": [], "tools": [{"type": "function"}], "tool_choice": "none"},
        {"messages": [], "response_format": {"type": "text"}, "temperature": 0.7},
        {"prompt": "x", "n": 1, "seed": None, "presence_penalty": 0},
    ],
)
def test_a_request_a_continuation_can_carry_on_is_not_refused(body: dict[str, Any]) -> None:
    path = continuation.CHAT if "messages" in body else continuation.COMPLETIONS
    assert refusal(path, body) is None


def test_every_reason_reads_as_a_clause_after_the_death() -> None:
    death = "The engine was killed (signal 9) while serving requests."
    assert continuation.not_continued_sentence(death, "spent") == death  # the death says it already
    for reason in set(continuation.REASONS) - {"spent"}:
        sentence = continuation.not_continued_sentence(death, reason)
        assert sentence.startswith(death + " It was not continued on the restarted engine: ")
        assert sentence.endswith(".") and not sentence.endswith("..")


# --------------------------------------------------------------------------- the ledger


def test_a_completion_stream_keeps_its_ids_and_shows_the_client_the_events_it_would_have_had() -> None:
    ledger = StreamLedger(chat=False, client_ids=False)
    sent = ledger.first("".join([event(completion_chunk(" Hello", [22557], first=True)), event(completion_chunk(" world", [3186]))]))

    assert ledger.prompt_ids == PROMPT_IDS and ledger.ids == [22557, 3186]
    shown = payloads(sent)
    assert [c["choices"][0]["text"] for c in shown] == [" Hello", " world"]
    assert all(c["choices"][0]["token_ids"] is None and c["choices"][0]["prompt_token_ids"] is None for c in shown)
    assert ledger.blocker() is None


def test_a_client_that_asked_for_ids_gets_the_events_untouched() -> None:
    ledger = StreamLedger(chat=False, client_ids=True)
    events = [event(completion_chunk(" Hello", [22557], first=True))]
    assert ledger.first("".join(events)) == events[0]


def test_chat_drops_the_empty_chunks_sent_only_for_the_ids_and_notes_parsed_output() -> None:
    ledger = StreamLedger(chat=True, client_ids=False)
    sent = ledger.first("".join([event(chat_chunk(None, None, first=True)), event(chat_chunk(None, [5])), event(chat_chunk("Hi", [6]))]))
    shown = payloads(sent)
    assert [c["choices"][0]["delta"] for c in shown] == [{"role": "assistant", "content": ""}, {"content": "Hi"}]
    assert shown[0]["prompt_token_ids"] is None
    assert ledger.ids == [5, 6] and ledger.prompt_ids == PROMPT_IDS

    reasoning = chat_chunk("x", [7])
    reasoning["choices"][0]["delta"] = {"reasoning": "think"}
    ledger.first("".join([event(reasoning)]))
    assert ledger.blocker() == "parsed"


def test_a_stream_cut_before_its_first_event_may_be_sent_again_and_one_without_ids_may_not() -> None:
    assert StreamLedger(chat=False, client_ids=False).blocker() is None
    ledger = StreamLedger(chat=False, client_ids=False)
    ledger.first("".join([event({"id": "cmpl-1", "choices": [{"index": 0, "text": "a"}]})]))
    assert ledger.blocker() == "unknown"


def test_the_continuation_of_a_completion_sends_the_prompt_and_sent_ids_and_what_remains() -> None:
    ledger = StreamLedger(chat=False, client_ids=False)
    ledger.first("".join([event(completion_chunk(" Hello", [22557], first=True)), event(completion_chunk(" world", [3186]))]))
    body = {"model": "m", "prompt": "Say", "max_tokens": 600, "min_tokens": 600, "temperature": 0, "stream": True}

    rest = continuation_body(body, False, ledger)

    assert rest["prompt"] == PROMPT_IDS + [22557, 3186]
    assert (rest["max_tokens"], rest["min_tokens"], rest["temperature"], rest["model"]) == (598, 598, 0, "m")
    assert rest["stream"] is True and rest["return_token_ids"] is True


def test_the_continuation_of_a_chat_is_a_completion_with_the_shared_sampling_fields_only() -> None:
    ledger = StreamLedger(chat=True, client_ids=False)
    ledger.first("".join([event(chat_chunk(None, None, first=True)), event(chat_chunk("Hi", [6]))]))
    body = {
        "model": "m", "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 10, "top_k": 1,
        "stream": True, "stream_options": {"include_usage": True}, "chat_template_kwargs": {},
    }  # fmt: skip

    rest = continuation_body(body, True, ledger)

    assert rest == {
        "model": "m", "top_k": 1, "stream_options": {"include_usage": True}, "max_tokens": 9,
        "prompt": PROMPT_IDS + [6], "stream": True, "return_token_ids": True,
    }  # fmt: skip


def test_a_chat_that_named_no_max_tokens_runs_on_to_the_end_of_the_context() -> None:
    ledger = StreamLedger(chat=True, client_ids=False)
    ledger.first(event(chat_chunk(None, None, first=True)) + event(chat_chunk("Hi", [6])))
    body = {"model": "m", "messages": [], "stream": True}
    assert continuation_body(body, True, ledger, 2048)["max_tokens"] == 2048
    assert "max_tokens" not in continuation_body(body, True, ledger)
    assert continuation.remaining_tokens(body, 1) is None
    assert continuation.remaining_tokens({"max_tokens": 5}, 5) == 0


def test_a_continued_chat_stream_carries_on_in_the_chat_shape_and_its_usage_adds_up() -> None:
    ledger = StreamLedger(chat=True, client_ids=False)
    ledger.first("".join([event(chat_chunk(None, None, first=True)), event(chat_chunk("Hi", [6])), event(chat_chunk(" there", [7]))]))
    ledger.continued, ledger.kept = True, len(ledger.ids)
    cont = [
        {"id": "cmpl-9", "object": "text_completion", "created": 200, "model": "m",
         "choices": [{"index": 0, "text": " you", "logprobs": None, "finish_reason": None, "stop_reason": None,
                      "prompt_token_ids": PROMPT_IDS + [6, 7], "token_ids": [8]}]},
        {"id": "cmpl-9", "object": "text_completion", "created": 200, "model": "m",
         "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": "length", "stop_reason": None, "token_ids": [9]}]},
        {"id": "cmpl-9", "object": "text_completion", "created": 200, "model": "m", "choices": [],
         "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}},
    ]  # fmt: skip

    shown = payloads(ledger.second("".join([event(c) for c in cont] + ["data: [DONE]\n\n"])))

    assert {c["id"] for c in shown} == {"chatcmpl-1"} and {c["created"] for c in shown} == {100}
    assert {c["object"] for c in shown} == {"chat.completion.chunk"}
    assert shown[0]["choices"][0]["delta"] == {"content": " you"} and shown[0]["choices"][0]["token_ids"] is None
    assert shown[1]["choices"][0]["finish_reason"] == "length"
    assert shown[2]["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    assert ledger.ids == [6, 7, 8, 9]


def test_a_continued_completion_stream_keeps_the_first_requests_id_and_no_second_prompt() -> None:
    ledger = StreamLedger(chat=False, client_ids=True)
    ledger.first("".join([event(completion_chunk(" Hello", [22557], first=True))]))
    ledger.continued, ledger.kept = True, 1
    cont = completion_chunk(" world", [3186], first=True)
    cont["id"], cont["created"] = "cmpl-2", 200

    shown = payloads(ledger.second("".join([event(cont)])))

    assert shown[0]["id"] == "cmpl-1" and shown[0]["created"] == 100
    assert shown[0]["choices"][0]["prompt_token_ids"] is None and shown[0]["choices"][0]["token_ids"] == [3186]


def test_a_stream_that_had_every_token_ends_with_a_finish_its_usage_and_done() -> None:
    ledger = StreamLedger(chat=False, client_ids=False)
    ledger.first("".join([event(completion_chunk(" Hello", [22557], first=True)), event(completion_chunk(" world", [3186]))]))
    text = ledger.closing({"max_tokens": 2, "stream_options": {"include_usage": True}})
    shown = payloads(text)
    assert shown[0]["choices"][0]["finish_reason"] == "length"
    assert shown[1]["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    assert text.endswith("data: [DONE]\n\n")


STREAMS = [
    [(" Hello", 22557), (" world", 3186), ("", 13), ("!", 29991)],
    [("\u00e9", 1), ("", 2), ("\u4e2d\u6587", 3), (" a", 4), ("\n", 5), ("b", 6)],
    [("x", n) for n in range(12)],
]
CUTS = [(stream, cut, chat, ids) for stream in STREAMS for cut in range(len(stream) + 1) for chat in (False, True) for ids in (False, True)]


@pytest.mark.parametrize(("pieces", "cut", "chat", "ids"), CUTS)
def test_one_stream_across_a_cut_has_every_token_once_and_the_same_text(
    pieces: list[tuple[str, int]], cut: int, chat: bool, ids: bool
) -> None:
    """Any stream cut after any event and continued: the client's text and ids are the undisturbed run's."""
    cut = min(cut, len(pieces))
    make = (lambda t, i, first=False: chat_chunk(t, [i], first)) if chat else (lambda t, i, first=False: completion_chunk(t, [i], first))
    head = [chat_chunk(None, None, first=True)] if chat else []
    whole = head + [make(t, i) for t, i in pieces]
    if not chat:
        whole[0]["choices"][0]["prompt_token_ids"] = PROMPT_IDS
    before, after = (whole[: len(head) + cut], whole[len(head) + cut :]) if chat else (whole[:cut], whole[cut:])

    ledger = StreamLedger(chat=chat, client_ids=ids)
    client = ledger.first("".join([event(p) for p in before]))
    if ledger.prompt_ids is None:
        return  # nothing was sent: the job is sent again whole
    ledger.continued, ledger.kept = True, len(ledger.ids)
    rest = [completion_chunk(p["choices"][0].get("text", p["choices"][0].get("delta", {}).get("content") or ""), p["choices"][0]["token_ids"]) for p in after]
    client += ledger.second("".join([event(p) for p in rest]))

    def text_of(chunks: list[Any]) -> str:
        return "".join((c["choices"][0].get("delta", {}).get("content") or "") if chat else c["choices"][0]["text"] for c in chunks if c["choices"])

    undisturbed = [p for p in whole if not chat or p["choices"][0]["delta"] or p["choices"][0]["token_ids"] is None]
    assert text_of(payloads(client)) == text_of(undisturbed)
    assert ledger.ids == [i for _, i in pieces]
