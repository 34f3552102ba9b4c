"""TextStream: one event per token, UTF-8 safe, stop strings never leak."""

from __future__ import annotations

from tokenq.workers.engines.detok import TextStream


def run(stream: TextStream, pieces: list[bytes]) -> list[tuple[int, str]]:
    out = []
    for i, p in enumerate(pieces):
        out += [(r.index, r.text) for r in stream.push(100 + i, p)]
        if stream.stopped:
            return out
    return out + [(r.index, r.text) for r in stream.finish()]


def test_plain_tokens_release_immediately() -> None:
    s = TextStream(stop=[])
    assert [(r.index, r.text) for r in s.push(1, b"Hello")] == [(0, "Hello")]
    assert [(r.index, r.text) for r in s.push(2, b" world")] == [(1, " world")]


def test_utf8_split_across_tokens_is_held_until_complete() -> None:
    data = "안녕".encode()  # 6 bytes, split unevenly
    s = TextStream(stop=[])
    assert s.push(1, data[:2]) == []  # no complete character yet
    # "안" completes inside token 1, so token 0 carries no text; token 1 waits for "녕"'s bytes
    assert [(r.index, r.text) for r in s.push(2, data[2:4])] == [(0, "")]
    assert [(r.index, r.text) for r in s.push(3, data[4:])] == [(1, "안"), (2, "녕")]


def test_stop_string_across_tokens_is_cut_and_stops() -> None:
    out = run(TextStream(stop=["\nUser:"]), [b"Sure", b".", b"\nUs", b"er:", b" more"])
    assert [i for i, _ in out] == [0, 1, 2, 3]
    assert "".join(t for _, t in out) == "Sure."


def test_partial_stop_prefix_is_released_when_it_diverges() -> None:
    s = TextStream(stop=["END"])
    assert [r.text for r in s.push(1, b"the E")] == []
    assert [r.text for r in s.push(2, b"ND")] == ["the ", ""]
    s = TextStream(stop=["END"])
    s.push(1, b"the E")
    assert [r.text for r in s.push(2, b"nd")] == ["the E", "nd"]


def test_finish_flushes_held_prefix() -> None:
    out = run(TextStream(stop=["STOP"]), [b"a", b"ST"])
    assert out == [(0, "a"), (1, "ST")]


def test_indices_continue_from_resume_offset() -> None:
    s = TextStream(stop=[], next_index=7)
    assert [r.index for r in s.push(1, b"x")] == [7]
