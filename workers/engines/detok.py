"""Incremental detokenisation with stop strings: one released event per generated token.

A token's text is released only when it is final: its UTF-8 bytes are
complete and no stop string could still begin inside it. Until then the token
waits (in order) with the ones before it. So every token yields exactly one
event, indices have no gaps, the concatenated texts equal the output, and a
stop string never leaks to the client.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Released:
    index: int
    token_id: int
    text: str


def _incomplete_utf8_tail(buf: bytes) -> int:
    """How many bytes at the end of `buf` start a UTF-8 sequence that is not yet complete."""
    for back in range(1, min(4, len(buf)) + 1):
        b = buf[-back]
        if b & 0xC0 == 0x80:  # continuation byte: keep looking for the lead byte
            continue
        need = 2 if b & 0xE0 == 0xC0 else 3 if b & 0xF0 == 0xE0 else 4 if b & 0xF8 == 0xF0 else 1
        return back if need > back else 0
    return 0


@dataclass
class TextStream:
    stop: list[str]
    next_index: int = 0
    stopped: bool = False
    _bytes: bytes = b""
    _pending: list[Released] = field(default_factory=list)

    def push(self, token_id: int, piece: bytes) -> list[Released]:
        """Add one generated token; returns the tokens whose text is now final."""
        if self.stopped:
            return []
        self._bytes += piece
        cut = len(self._bytes) - _incomplete_utf8_tail(self._bytes)
        text = self._bytes[:cut].decode("utf-8", errors="replace")
        self._bytes = self._bytes[cut:]
        self._pending.append(Released(self.next_index, token_id, text))
        self.next_index += 1
        return self._release()

    def finish(self) -> list[Released]:
        """End of generation: release everything still held (no stop string completed)."""
        if self._bytes and self._pending:
            self._pending[-1].text += self._bytes.decode("utf-8", errors="replace")
        self._bytes = b""
        out, self._pending = self._pending, []
        return out

    def _release(self) -> list[Released]:
        held = "".join(p.text for p in self._pending)
        hit = min((i for i in (held.find(s) for s in self.stop if s) if i >= 0), default=-1)
        if hit >= 0:
            self.stopped = True
            return self._take(len(self._pending), keep_chars=hit)
        safe = len(held) - self._stop_prefix_len(held)
        # Release whole tokens that end at or before `safe`; a token whose bytes are
        # still incomplete stays (it is the last one and _bytes is non-empty).
        n, end = 0, 0
        for p in self._pending:
            if end + len(p.text) > safe:
                break
            end += len(p.text)
            n += 1
        if self._bytes and n == len(self._pending):
            n -= 1
        return self._take(n, keep_chars=None)

    def _take(self, n: int, keep_chars: int | None) -> list[Released]:
        out, self._pending = self._pending[:n], self._pending[n:]
        if keep_chars is not None:
            budget = keep_chars
            for p in out:
                p.text = p.text[:budget]
                budget -= len(p.text)
        return out

    def _stop_prefix_len(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
        best = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:k]):
                    best = k
                    break
        return best
