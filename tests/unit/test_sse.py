"""SSEFramer: whole events out, whatever the TCP chunk boundaries were."""

from __future__ import annotations

import random

import pytest

from vllm_worker.serving.stream_relay import SSEFramer, event_data, split_events

CHAT_EVENTS = [
    'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n',
    'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Zürich 東京 🙂"}}]}\n\n',
    ": keep-alive comment\n\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\"}\n\n",
    "data: first line\ndata: second line\n\n",
    "id: 7\r\ndata: crlf event\r\n\r\n",
    "data: [DONE]\n\n",
]
STREAM = "".join(CHAT_EVENTS).encode()


def _run(framer: SSEFramer, pieces: list[bytes]) -> list[str]:
    out: list[str] = []
    for piece in pieces:
        out.extend(framer.feed(piece))
    return out


def _run_batches(framer: SSEFramer, pieces: list[bytes]) -> list[str]:
    out: list[str] = []
    for piece in pieces:
        batch = framer.feed_batch(piece)
        if batch:
            out.append(batch)
    return out


def test_one_read_gives_every_event() -> None:
    framer = SSEFramer()
    assert framer.feed(STREAM) == CHAT_EVENTS
    assert framer.close() == ""


def test_every_single_split_point() -> None:
    for cut in range(len(STREAM) + 1):
        framer = SSEFramer()
        assert _run(framer, [STREAM[:cut], STREAM[cut:]]) == CHAT_EVENTS, cut
        assert framer.close() == ""


def test_every_pair_of_split_points_in_batches() -> None:
    # Each yielded batch must be whole events, and together they must be the stream.
    n = len(STREAM)
    for first in range(0, n + 1, 3):
        for second in range(first, n + 1, 5):
            framer = SSEFramer()
            batches = _run_batches(framer, [STREAM[:first], STREAM[first:second], STREAM[second:]])
            assert "".join(batches) == STREAM.decode()
            for batch in batches:
                assert "".join(split_events(batch)) == batch
                assert batch.endswith(("\n\n", "\r\n\r\n"))
            assert framer.close() == ""


def test_byte_by_byte() -> None:
    framer = SSEFramer()
    pieces = [STREAM[i : i + 1] for i in range(len(STREAM))]
    assert _run(framer, pieces) == CHAT_EVENTS


@pytest.mark.parametrize("seed", range(50))
def test_random_chunkings(seed: int) -> None:
    rng = random.Random(seed)
    pieces, i = [], 0
    while i < len(STREAM):
        size = rng.choice([1, 2, 3, 7, 64, 300, 4096])
        pieces.append(STREAM[i : i + size])
        i += size
    framer = SSEFramer()
    assert _run(framer, pieces) == CHAT_EVENTS


def test_no_event_is_emitted_before_its_blank_line() -> None:
    framer = SSEFramer()
    assert framer.feed(b"data: a\n") == []
    assert framer.feed(b"data: b") == []
    assert framer.feed(b"\n") == []
    assert framer.feed(b"\n") == ["data: a\ndata: b\n\n"]


def test_crlf_boundary_split_inside_the_terminator() -> None:
    event = b"data: x\r\n\r\n"
    for cut in range(len(event) + 1):
        framer = SSEFramer()
        assert _run(framer, [event[:cut], event[cut:]]) == ["data: x\r\n\r\n"], cut


def test_multibyte_character_split_across_reads() -> None:
    event = "data: 🙂 ok\n\n".encode()
    for cut in range(len(event) + 1):
        framer = SSEFramer()
        assert _run(framer, [event[:cut], event[cut:]]) == ["data: 🙂 ok\n\n"]


def test_close_returns_an_unterminated_event() -> None:
    framer = SSEFramer()
    assert framer.feed(b"data: 1\n\ndata: [DONE]\n") == ["data: 1\n\n"]
    assert framer.close() == "data: [DONE]\n"
    assert framer.close() == ""


def test_large_event_across_many_reads() -> None:
    payload = b"data: " + b"x" * 200_000 + b"\n\n"
    framer = SSEFramer()
    out = _run(framer, [payload[i : i + 1000] for i in range(0, len(payload), 1000)])
    assert out == [payload.decode()]


def test_split_events_keeps_terminators() -> None:
    assert split_events("data: a\n\n: c\r\n\r\ndata: b\n\n") == ["data: a\n\n", ": c\r\n\r\n", "data: b\n\n"]


def test_each_event_is_given_by_the_read_that_completes_it() -> None:
    # Byte by byte: after each read, exactly the events that have ended so far (none held back for a later read).
    ends = [sum(len(e.encode()) for e in CHAT_EVENTS[: i + 1]) for i in range(len(CHAT_EVENTS))]
    framer, given = SSEFramer(), []
    for i in range(len(STREAM)):
        given += framer.feed(STREAM[i : i + 1])
        assert given == [e for e, end in zip(CHAT_EVENTS, ends) if end <= i + 1], i


@pytest.mark.parametrize(
    "reads, events",
    [
        ([b"data: a\r\n\r\ndata: b\r\n\r\ndata: c"], ["data: a\r\n\r\n", "data: b\r\n\r\n"]),  # the last boundary, not the first
        ([b"\r\n\r\nx"], ["\r\n\r\n"]),  # a boundary at the very start
        ([b"\n\nx"], ["\n\n"]),
        ([b"\n", b"\nx"], ["\n\n"]),  # a boundary across two reads, from the start
        ([b"data: a\n", b"\ndata: b"], ["data: a\n\n"]),
        ([b"data: a\r\n", b"\r\ndata: b"], ["data: a\r\n\r\n"]),
    ],
)
def test_boundaries_anywhere_in_a_read(reads: list[bytes], events: list[str]) -> None:
    framer = SSEFramer()
    assert _run(framer, reads) == events


def test_bytes_that_are_not_utf8_become_replacement_characters() -> None:
    framer = SSEFramer()
    assert framer.feed(b"data: \xff\n\ndata: \xfe") == ["data: \ufffd\n\n"]
    assert framer.close() == "data: \ufffd"


def test_event_data_joins_data_lines_without_the_one_space_after_the_colon() -> None:
    assert event_data('data:{"a":1}\n\n') == '{"a":1}'
    assert event_data('data: {"a":\ndata:  1}\n\n') == '{"a":\n 1}'
    assert event_data(": comment\n\n") == ""
