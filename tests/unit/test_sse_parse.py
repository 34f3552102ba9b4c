"""tokenq.client.sse: the one SSE parser (the clients, the CLI and the tests read with it)."""

from __future__ import annotations

import pytest

from tokenq.client.sse import Message, RawEvent, SSEParser, iter_messages, parse_lines

STREAM = (": ping\r\n\r\n"
          "id: 1-0\r\nevent: token\r\ndata: {\"text\": \"a\", \"index\": 0}\r\n\r\n"
          "id: 2-0\r\nevent: done\r\ndata: {}\r\n\r\n")
EXPECTED = [Message("token", '{"text": "a", "index": 0}', "1-0"), Message("done", "{}", "2-0")]


def feed_all(parser: SSEParser, chunks: list[str] | list[bytes]) -> list[Message]:
    return [m for chunk in chunks for m in parser.feed(chunk)]


def test_parse_events_and_skip_pings() -> None:
    lines = iter([": ping", "", "id: 1-0", "event: token", 'data: {"text": "a", "index": 0}', "",
                  "id: 2-0", "event: done", "data: {}", ""])
    events = list(parse_lines(lines))
    assert [(e.id, e.event) for e in events] == [("1-0", "token"), ("2-0", "done")]
    assert events[0].data == {"text": "a", "index": 0}


@pytest.mark.parametrize("eol", ["\n", "\r\n", "\r"])
def test_every_line_end(eol: str) -> None:
    assert list(iter_messages([STREAM.replace("\r\n", eol)])) == EXPECTED


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 64])
def test_chunks_cut_anywhere(size: int) -> None:
    """Text cut at every size, CRLF split across chunks included: the same messages."""
    chunks = [STREAM[i:i + size] for i in range(0, len(STREAM), size)]
    assert feed_all(SSEParser(), chunks) == EXPECTED


def test_cr_then_lf_in_the_next_chunk_is_one_line_end() -> None:
    parser = SSEParser()
    assert parser.feed("data: x\r") == []
    assert parser.feed("\n\r") == [Message(data="x")]  # LF ends nothing; the CR ends the block
    assert parser.feed("\ndata: y\n\n") == [Message(data="y")]


def test_utf8_bytes_split_inside_a_character() -> None:
    raw = "data: héllo ✓\n\n".encode()
    assert feed_all(SSEParser(), [raw[i:i + 1] for i in range(len(raw))]) == [
        Message(data="héllo ✓")]


def test_data_lines_join_with_lf_and_fields_parse_per_standard() -> None:
    text = ("data: one\ndata\ndata:  two spaces\n"  # no colon: an empty value
            "event\n"  # an empty event name: "message"
            "unknown: ignored\n: comment\n\n")
    assert list(iter_messages([text])) == [Message("message", "one\n\n two spaces")]


def test_message_without_data_is_not_dispatched_but_its_id_is_kept() -> None:
    parser = SSEParser()
    assert parser.feed("id: 7\nevent: token\n\n") == []
    assert parser.last_event_id == "7"
    # The event name did not carry over; the id field belongs to the message that has it.
    assert parser.feed("data: x\n\n") == [Message("message", "x", None)]
    assert parser.last_event_id == "7"


def test_id_with_nul_is_ignored() -> None:
    parser = SSEParser()
    assert parser.feed("id: 1\n\nid: a\0b\ndata: x\n\n") == [Message(data="x")]
    assert parser.last_event_id == "1"


def test_retry_sets_reconnection_time_when_digits_only() -> None:
    parser = SSEParser()
    parser.feed("retry: 2500\n\nretry: 1.5\n\nretry: x\n\n")
    assert parser.retry_ms == 2500


def test_a_trailing_message_without_its_blank_line_is_not_dispatched() -> None:
    parser = SSEParser()
    assert parser.feed("data: a\n\ndata: cut mid-message\n") == [Message(data="a")]
    assert list(iter_messages(["id: 1\ndata: {}"])) == []
    assert list(parse_lines(["data: {}"])) == []


def test_a_leading_bom_is_stripped_once() -> None:
    assert list(iter_messages(["\ufeff", "data: a\n\n\ufeffdata: b\n\n"])) == [
        Message(data="a")]  # a BOM later on starts an unknown field name


def test_raw_event_decodes_json() -> None:
    assert RawEvent.from_message(Message("token", '{"index": 3}', "5-0")) == RawEvent(
        "5-0", "token", {"index": 3})
