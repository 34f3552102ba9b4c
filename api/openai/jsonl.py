"""The lines of a JSONL file read a piece at a time (a batch's input file).

Memory stays within one line's limit plus one piece, whatever the file holds: a line's
parts are kept in a list and joined once when its newline comes (each byte is copied at
most twice, never once per piece), and a line over the limit is dropped as soon as it
passes it; the reader then skips to the next newline and reports that line as too long.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Line:
    """Line `n` (from 1) of the file; `data` is empty where it was over the limit."""

    n: int
    data: bytes
    too_long: bool = False


class _Partial:
    """The line being read: its parts so far, or only that it is already too long."""

    def __init__(self, limit: int):
        self.limit = limit
        self.parts: list[bytes] = []
        self.size = 0
        self.over = False

    def add(self, part: memoryview) -> None:
        if self.over or not part:
            return
        self.size += len(part)
        if self.size > self.limit:
            self.parts, self.over = [], True
        else:
            self.parts.append(bytes(part))

    def end(self, n: int) -> Line | None:
        """The line as complete (None: blank); then empty for the next one."""
        if self.over:
            line: Line | None = Line(n, b"", too_long=True)
        else:
            data = self.parts[0] if len(self.parts) == 1 else b"".join(self.parts)
            line = Line(n, data) if data.strip() else None
        self.parts, self.size, self.over = [], 0, False
        return line


async def lines(pieces: AsyncIterator[bytes], limit: int) -> AsyncIterator[Line]:
    """Each non-blank line of `pieces` (numbered as in the file, blank ones counted), at
    most `limit` bytes each without its newline; a longer one comes as `too_long`."""
    n = 0
    line = _Partial(limit)
    async for piece in pieces:
        view = memoryview(piece)
        start = 0
        while (end := piece.find(b"\n", start)) >= 0:
            n += 1
            line.add(view[start:end])
            if (done := line.end(n)) is not None:
                yield done
            start = end + 1
        line.add(view[start:])
    if line.size or line.over:
        if (done := line.end(n + 1)) is not None:
            yield done
