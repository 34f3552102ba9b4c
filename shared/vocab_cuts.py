"""Where a long text may be cut so that llama.cpp tokenizes the pieces as it tokenizes the
whole: the cut that keeps prompt tokenization linear in the text's length.

llama.cpp first splits a text at its special tokens (control and user-defined ones:
`<|im_start|>`, Gemma's `\\n` runs), longest special first, and for each special searches
from every fragment to the end of the whole text: time grows with fragments times length. A
1 MB body of 29,000 one-letter chat messages took 15 s to tokenize on SmolLM2's
vocabulary, a 1 MB prompt of short lines 94 s on Gemma 3's, in one tenant's request.

Cut just before a special that llama.cpp is sure to split at anyway, every few KB, and the
pieces tokenize to exactly the whole's tokens: a piece starts at a special, so what comes
before it cannot change how the piece is read (llama.cpp tokenizes each stretch of plain
text between specials on its own, SentencePiece's leading space included). A cut before
special `c` at `p` is safe when no special that llama.cpp looks for before `c` (one as long
or longer; `c` itself further left) overlaps `[p, p + len(c))` other than from `p`, and
when `c` does not strip the blanks to its left (llama.cpp's `lstrip` attribute).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

CHUNK_CHARS = 4096  # a piece's length at least, before its cut
# Cuts tried at candidates that turn out unsafe before a piece is left uncut to its end: a
# text made of nothing but one candidate's overlapping runs (Gemma's `\n\n\n...`) gives up.
MAX_TRIES = 64


class Cuts:
    """`specials`: every special's (text, lstrip) as llama.cpp caches them; `candidates`:
    the specials a chat text is made of (its template's markers, BOS and EOS), where cuts
    are looked for."""

    def __init__(self, specials: Iterable[tuple[str, bool]], candidates: Iterable[str],
                 chunk: int = CHUNK_CHARS):
        self.chunk = chunk
        table = {text: lstrip for text, lstrip in specials if text}
        self.any_lstrip = any(table.values())
        self.danger: dict[str, list[str]] = {}
        for c in sorted({c for c in candidates if c in table and not table[c]}):
            self.danger[c] = [t for t in table if _may_overlap(t, c)]
        self._find = re.compile("|".join(
            re.escape(c) for c in sorted(self.danger, key=len, reverse=True))) \
            if self.danger else None

    def pieces(self, text: str) -> Iterator[str]:
        """`text` in pieces that tokenize, one after another, to the whole's tokens."""
        start = 0
        for p in self._points(text):
            yield text[start:p]
            start = p
        yield text[start:]

    def _points(self, text: str) -> Iterator[int]:
        if self._find is None:
            return
        pos = self.chunk
        tries = 0
        while pos < len(text):
            m = self._find.search(text, pos)
            if m is None:
                return
            p = m.start()
            if self._safe(text, p, m.group()):
                yield p
                pos, tries = p + self.chunk, 0
            elif (tries := tries + 1) < MAX_TRIES:
                pos = p + 1
            else:
                pos, tries = p + self.chunk, 0

    def _safe(self, text: str, p: int, c: str) -> bool:
        if self.any_lstrip and p > 0 and text[p - 1].isspace():
            return False  # a longer special starting at p could strip what is left of it
        for t in self.danger[c]:
            lo, hi = max(0, p - len(t) + 1), p + len(c)
            q = text.find(t, lo, hi + len(t) - 1)
            while q != -1 and q < hi:
                if q != p:
                    return False
                q = text.find(t, q + 1, hi + len(t) - 1)
        return True


def _may_overlap(t: str, c: str) -> bool:
    """Whether special `t`, looked for before `c` (as long or longer, or `c` itself), could
    overlap an occurrence of `c` other than by starting where it starts."""
    if len(t) < len(c) or (c[0] not in t[1:] and t[0] not in c[1:]):
        return False
    for i in range(1, len(t)):  # t starts i characters left of c
        rest = t[i:]
        if rest.startswith(c) or c.startswith(rest):
            return True
    # t starts inside c, j characters after c's start
    return any(t.startswith(c[j:]) or c[j:].startswith(t) for j in range(1, len(c)))
