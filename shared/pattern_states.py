r"""How many grammar states a JSON schema `pattern` can keep alive at once.

llama.cpp turns a bounded repetition `X{m,n}` into a chain of n nested rules, and its
grammar sampler follows every way the text so far can be read at once (one "stack" per
reading). When X is itself variable in length (or can match nothing), the text can be
split between the repetitions in many ways, and the readings multiply: on SmolLM2's
vocabulary, one token through `(a{1,10}){1,10}` costs ~1 ms, through
`((a{1,10}){1,10}){1,10}` ~150 ms, and through `((a{0,20}){0,20}){0,20}` (34 characters,
every count far under the repetition budget) one token did not finish within 20 s. The
sampler runs on the engine's thread, so such a job would stall every job on its worker,
and no cancel can interrupt it. The API refuses a pattern whose `states` are over budget.

Bounded repetitions of a class cost more than the states say: when llama.cpp constrains
the whole vocabulary (a sampled token the grammar refused), every token whose characters
the class takes walks them through each reading. One such apply over SmolLM2's 49,152
tokens, after the first character of the string, for `([a-z ]{1,n}){1,k}`: n 4, k 8:
0.23 s; n 8, k 4: 0.06 s; n 6, k 8: 3.0 s; n 8, k 8: 24-31 s; n 4, k 16: over 100 s; an
outside tester's `^(.{1,16}){1,16}$`: 26 s, and 7 such jobs held every stream of the
worker up to 49 s a token. So a bounded repetition over a variable-length part that holds
a class (`[...]`, `.`, `\d`, `\w`, `\s`, ...) may multiply its bounded counts (k x n
above; an unbounded `+` or `*` is one recursive rule and counts 1: `^(\w+\s?){1,20}$` is
0.04 s) only up to the budget / OPEN_SHARE, unless a literal starts or ends the part
(`^([a-z]{1,20} ){1,5}$`: 0.03 s).

The estimate, per regex node: an atom (a character, a class, an escape) is 1 state;
a sequence or an alternation adds its parts' states; `X{m,n}` (`*` and `+` count as 2,
`?` as 1, `{m,}` as m + 1) has states(X) x n, and x n again when X can match the empty
string (then any repetition may be empty, and the split is free). A repetition of a
fixed-length X (`[0-9]{4}`, `(ab){3}`) is one reading however long: its states only
matter when an outer repetition wraps it. docs/reliability.md has the figures.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

QUANT = re.compile(r"\{\s*(\d+)\s*(,\s*(\d*)\s*)?\}")
GROUP_MARK = re.compile(r"\?(?::|=|!|<=|<!|P?<\w*>)?")  # after "(": (?: (?= (?<name> ...
MAX_GROUP_DEPTH = 64
OPEN_SHARE = 8  # budget / 8 (32 at the default 256) for bounded counts over a class


@dataclass(frozen=True, slots=True)
class Node:
    states: int
    nullable: bool
    length: int | None  # fixed length in characters; None when it varies
    open: bool = False  # holds a class (matches more than one character)
    bounded: int = 1  # the product of the bounded repetition counts inside


EMPTY = Node(1, True, 0)
ATOM = Node(1, False, 1)
CLASS = Node(1, False, 1, open=True)


class PatternTooAmbiguous(ValueError):
    """A repetition of the pattern would keep more than the budget's grammar states."""


def pattern_states(pattern: str, limit: int) -> int:
    """The pattern's estimated states; PatternTooAmbiguous where a repetition over a
    variable-length part passes `limit`. A pattern this walk cannot read is left to the
    grammar compiler (it refuses what it cannot parse)."""
    walk = _Walk(pattern, limit)
    states = walk.alternation(0).states
    while walk.i < len(pattern):  # past an unbalanced ')': the rest is walked too
        walk.i += 1
        states += walk.alternation(0).states
    return states


class _Walk:
    def __init__(self, pattern: str, limit: int):
        self.p = pattern
        self.i = 0
        self.limit = limit

    def alternation(self, depth: int) -> Node:
        if depth > MAX_GROUP_DEPTH:
            raise PatternTooAmbiguous(f"groups nest more than {MAX_GROUP_DEPTH} deep")
        branches = [self.sequence(depth)]
        while self.i < len(self.p) and self.p[self.i] == "|":
            self.i += 1
            branches.append(self.sequence(depth))
        if len(branches) == 1:
            return branches[0]
        lengths = {b.length for b in branches}
        return Node(sum(b.states for b in branches), any(b.nullable for b in branches),
                    lengths.pop() if len(lengths) == 1 else None,
                    any(b.open for b in branches), max(b.bounded for b in branches))

    def sequence(self, depth: int) -> Node:
        states, nullable, count, is_open, bounded = 0, True, 0, False, 1
        length: int | None = 0
        ends: list[Node] = []
        while self.i < len(self.p) and self.p[self.i] not in "|)":
            item = self.quantified(self.atom(depth))
            states += item.states
            nullable = nullable and item.nullable
            length = None if length is None or item.length is None else length + item.length
            is_open, bounded = is_open or item.open, max(bounded, item.bounded)
            ends = [ends[0] if ends else item, item]
            count += 1
        if count == 0:
            return EMPTY
        # a literal first or last (`([a-z]{1,20} ){1,5}`: words and a blank) marks where
        # one repetition ends and the next begins: one reading again (0.03 s measured)
        delimited = ATOM in ends
        return Node(max(1, states), nullable, length, is_open and not delimited, bounded)

    def atom(self, depth: int) -> Node:
        c = self.p[self.i]
        self.i += 1
        if c == "(":
            # (?:...), (?=...), (?!...), (?<=...), (?<name>...), (?P<name>...): the marks
            # are skipped, what follows is walked (never skipped past)
            mark = GROUP_MARK.match(self.p, self.i)
            self.i = mark.end() if mark else self.i
            inner = self.alternation(depth + 1)
            if self.i < len(self.p) and self.p[self.i] == ")":
                self.i += 1
            return inner
        if c == "[":
            self._skip_class()
            return CLASS
        if c == "\\":
            self.i += 1
            return CLASS if self.p[self.i - 1:self.i] in tuple("dDwWsS") else ATOM
        if c in "^$":
            return EMPTY
        return CLASS if c == "." else ATOM

    def _skip_class(self) -> None:
        if self.p.startswith("^", self.i):
            self.i += 1
        if self.p.startswith("]", self.i):
            self.i += 1
        while self.i < len(self.p) and self.p[self.i] != "]":
            self.i += 2 if self.p[self.i] == "\\" else 1
        self.i += 1

    def quantified(self, x: Node) -> Node:
        if self.i >= len(self.p):
            return x
        c = self.p[self.i]
        m = QUANT.match(self.p, self.i)
        if c in "*+?":
            self.i += 1
            low, times = (0 if c != "+" else 1), (1 if c == "?" else 2)
            fixed = False
        elif m:
            self.i = m.end()
            low = int(m.group(1))
            high = low if m.group(2) is None else (int(m.group(3)) if m.group(3) else low + 1)
            times, fixed = max(1, high, low), m.group(2) is None
        else:
            return x
        if self.i < len(self.p) and self.p[self.i] in "?+":  # lazy or possessive
            self.i += 1
        states = x.states * times * (times if x.nullable else 1)
        bounded = x.bounded * (times if c not in "*+" else 1)
        if x.length is None or x.nullable:
            if states > self.limit:
                raise PatternTooAmbiguous(
                    f"a repetition over a variable-length part would keep ~{states} grammar "
                    f"states at once (at most {self.limit}); nest fewer or smaller "
                    "repetitions")
            if x.open and self.limit and bounded > self.limit // OPEN_SHARE:
                raise PatternTooAmbiguous(
                    f"bounded repetitions of a character class nest to {bounded} (at most "
                    f"{self.limit // OPEN_SHARE}): too many grammar states to follow at "
                    "once; use + or * inside, or smaller counts")
        length = x.length * times if fixed and x.length is not None else None
        return Node(states, x.nullable or low == 0, length, x.open, bounded)
