"""The batch input reader (api/openai/jsonl.py): lines numbered as in the file whatever
the pieces, blank ones skipped, a line over the limit reported as too long without being
held, and a long line assembled in linear time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from tokenq.api.openai.jsonl import Line, lines


async def _pieces(data: bytes, size: int) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i:i + size]


def read(data: bytes, size: int, limit: int) -> list[Line]:
    async def collect() -> list[Line]:
        return [line async for line in lines(_pieces(data, size), limit)]

    return asyncio.run(collect())


def test_lines_are_the_same_whatever_the_pieces() -> None:
    data = b'{"a":1}\n\n  \n{"b":22}\r\n{"c":333}'
    want = [Line(1, b'{"a":1}'), Line(4, b'{"b":22}\r'), Line(5, b'{"c":333}')]
    for size in (1, 2, 3, 7, 64):
        assert read(data, size, 100) == want, size


def test_a_line_over_the_limit_is_reported_and_the_next_one_read() -> None:
    data = b"x" * 50 + b"\n" + b'{"ok":1}\n' + b"y" * 11 + b"\n" + b"z" * 10
    for size in (1, 4, 1000):
        got = read(data, size, 10)
        assert got == [Line(1, b"", too_long=True), Line(2, b'{"ok":1}'),
                       Line(3, b"", too_long=True), Line(4, b"z" * 10)], size


def test_a_file_without_newline_over_the_limit_is_one_long_line() -> None:
    assert read(b"q" * 5000, 64, 1000) == [Line(1, b"", too_long=True)]
    assert read(b"", 64, 10) == [] and read(b"\n\n", 1, 10) == []


def test_a_long_line_in_small_pieces_is_linear() -> None:
    """8 MB in 1 KiB pieces: a copy of the line so far per piece would move ~32 GB."""
    data = b"a" * (8 << 20)
    started = time.perf_counter()
    got = read(data, 1024, 16 << 20)
    assert got == [Line(1, data)]
    assert time.perf_counter() - started < 10
