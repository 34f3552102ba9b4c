"""The model's text -> tool calls, whole or as it streams (in the style of vLLM's
entrypoints/openai/tool_parsers).

The text is read with a tolerant JSON reader that also takes a prefix of a JSON value:
every value gets its span in the text, open-ended where the text stops inside it. A
call's `arguments` is the raw text of its arguments value, so what a stream sends as
argument fragments adds up to exactly what the whole-text answer holds.

A stream re-reads its text at each token (a call's text is short; strings, most of it,
are scanned by one regular expression).

Shapes read (see api/openai/tools.py for which request gets which):
- `named`: the text is the named function's arguments;
- `required`: `[{"name": ..., "parameters": {...}}, ...]` (vLLM's shape);
- `auto` + `generic`: `{"tool_calls": [{"name", "arguments"}]}` or `{"response": "..."}`;
- `auto` + `hermes`: free text with `<tool_call>{"name", "arguments"}</tool_call>` blocks
  (content: the text before the first block, or all of it when no call can be read, as
  vLLM's Hermes2ProToolParser answers; tests/vllm/test_hermes_differential.py compares
  the two on the same texts, and pins where they differ).
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from tokenq.api.openai.tools import Plan

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
_WS = " \t\r\n"
_SURROGATE = re.compile("[\ud800-\udfff]")
_STRING_BODY = re.compile(r'[^"\\]*(?:\\.[^"\\]*)*', re.DOTALL)


@dataclass(slots=True)
class Node:
    kind: str  # object, array, string, scalar
    start: int
    end: int | None = None  # exclusive; None: the text stops inside this value
    keys: dict[str, Node] = field(default_factory=dict)
    items: list[Node] = field(default_factory=list)


class _Reader:
    def __init__(self, text: str):
        self.t = text

    def skip(self, i: int) -> int:
        while i < len(self.t) and self.t[i] in _WS:
            i += 1
        return i

    def value(self, i: int) -> Node | None:
        """The value starting at i (after whitespace); None: nothing there, or not JSON."""
        i = self.skip(i)
        if i >= len(self.t):
            return None
        c = self.t[i]
        if c == "{":
            return self.container(i, "object")
        if c == "[":
            return self.container(i, "array")
        if c == '"':
            return self.string(i)
        j = i
        while j < len(self.t) and self.t[j] not in _WS + ",]}":
            j += 1
        if j == i:
            return None
        return Node("scalar", i, j if j < len(self.t) else None)

    def string(self, i: int) -> Node:
        m = _STRING_BODY.match(self.t, i + 1)  # in C: strings are most of the text
        j = m.end() if m else i + 1
        if j < len(self.t) and self.t[j] == '"':
            return Node("string", i, j + 1)
        return Node("string", i, None)

    def container(self, i: int, kind: str) -> Node:
        node, j = Node(kind, i), i + 1
        close = "}" if kind == "object" else "]"
        while True:
            j = self.skip(j)
            if j >= len(self.t):
                return node
            if self.t[j] == close:
                node.end = j + 1
                return node
            if self.t[j] == ",":
                j += 1
                continue
            if kind == "object":
                key = self.value(j)
                if key is None or key.kind != "string" or key.end is None:
                    return node
                j = self.skip(key.end)
                if j >= len(self.t) or self.t[j] != ":":
                    return node
                child = self.value(j + 1)
                if child is None:
                    return node
                node.keys[json.loads(self.t[key.start:key.end])] = child
            else:
                child = self.value(j)
                if child is None:
                    return node
                node.items.append(child)
            if child.end is None:
                return node
            j = child.end


@dataclass(slots=True)
class Call:
    name: str | None  # None: not read yet
    arguments: str  # the raw text so far
    done: bool


@dataclass(slots=True)
class Parsed:
    content: str | None
    calls: list[Call]
    ok: bool = True  # False: not the expected shape (the text is then plain content)


def _raw(text: str, n: Node | None) -> str:
    if n is None:
        return ""
    return text[n.start:n.end if n.end is not None else len(text)]


def _string(text: str, n: Node | None) -> str | None:
    """A (maybe unfinished) JSON string's value so far."""
    if n is None or n.kind != "string":
        return None
    raw = text[n.start + 1:n.end - 1 if n.end is not None else len(text)]
    for cut in range(min(6, len(raw)) + 1):  # drop an escape the text stops inside
        try:
            out: str = json.loads('"' + raw[:len(raw) - cut] + '"')
        except ValueError:
            continue
        if n.end is None and out and "\ud800" <= out[-1] <= "\udbff":
            out = out[:-1]  # a pair's first half (`\\ud83d`): the second may come next
        # A half without its other half (the decoder joins whole pairs) can be no text
        # on the wire: it becomes U+FFFD, as an invalid byte does in decoded output.
        return _SURROGATE.sub("\ufffd", out)
    return None


def _calls(text: str, items: list[Node], key: str) -> list[Call]:
    out = []
    for it in items:
        if it.kind != "object":
            break
        name_node = it.keys.get("name")
        name = _string(text, name_node) if name_node and name_node.end is not None else None
        args = it.keys.get(key)
        out.append(Call(name, _raw(text, args), args is not None and args.end is not None))
    return out


def _hermes(text: str, final: bool) -> Parsed:
    head, sep, rest = text.partition(HERMES_OPEN)
    if not sep:
        if not final:  # hold back a marker the text may be starting
            for k in range(len(HERMES_OPEN) - 1, 0, -1):
                if head.endswith(HERMES_OPEN[:k]):
                    head = head[:-k]
                    break
        return Parsed(head, [])  # no call: the text as it is, even empty (as vLLM)
    calls = []
    for block in rest.split(HERMES_OPEN):
        body = block.split(HERMES_CLOSE)[0]
        root = _Reader(body).value(0)
        if root is None or root.kind != "object":
            continue
        calls += _calls(body, [root], "arguments")
    if final and all(c.name is None for c in calls):
        return Parsed(text, [])  # no call could be read: all of it is content (as vLLM)
    return Parsed(head or None, calls)  # as vLLM: not stripped


def parse(p: Plan, text: str, final: bool = True) -> Parsed:
    """`text` so far (`final`: all of it) -> content and calls."""
    if p.fmt == "hermes" and p.mode == "auto":
        got = _hermes(text, final)
        if not p.parallel:
            got.calls = got.calls[:1]
        return got
    if p.mode == "named":
        root = _Reader(text).value(0)
        return Parsed(None, [Call(p.named, _raw(text, root).rstrip(),
                                  root is not None and root.end is not None)])
    root = _Reader(text).value(0)
    if root is None:
        return Parsed(None, [], ok=not final)
    if p.mode == "required":
        return Parsed(None, _calls(text, root.items, "parameters"), ok=root.kind == "array")
    if root.kind == "object" and "tool_calls" in root.keys:
        return Parsed(None, _calls(text, root.keys["tool_calls"].items, "arguments"))
    if root.kind == "object" and "response" in root.keys:
        return Parsed(_string(text, root.keys["response"]), [])
    if root.kind == "object":  # the wrapper, cut before a key was whole: no content yet
        return Parsed(None, [], ok=not final)
    return Parsed(text, [], ok=False)


def call_id(job_id: str | None, i: int) -> str:
    """The id of a job's i-th call: the same on every read of the job (a batch output file
    is rendered from the record on each download; a stream and the record agree), and
    unique as job ids are. Without a job, a random one."""
    if job_id is None:
        return "call_" + uuid.uuid4().hex[:24]
    return "call_" + hashlib.sha256(f"{job_id}/{i}".encode()).hexdigest()[:24]


def tool_calls(p: Plan, text: str, job_id: str | None = None
               ) -> tuple[str | None, list[dict[str, Any]]]:
    """A whole text -> (message content, OpenAI tool_calls)."""
    got = parse(p, text)
    calls = [{"id": call_id(job_id, i), "type": "function",
              "function": {"name": c.name, "arguments": c.arguments}}
             for i, c in enumerate(c for c in got.calls if c.name is not None)]
    return got.content, calls


class ToolStream:
    """One choice's text as it streams -> chat deltas (`content` or `tool_calls`)."""

    def __init__(self, plan: Plan, job_id: str | None = None):
        self.plan, self.job_id = plan, job_id
        self.text = ""
        self.content = 0  # characters of content sent
        self.sent: list[int] = []  # per call: argument characters sent
        self.ids: list[str] = []

    @property
    def called(self) -> bool:
        return bool(self.sent)

    def feed(self, text: str, final: bool = False) -> list[dict[str, Any]]:
        self.text += text
        got = parse(self.plan, self.text, final)
        out: list[dict[str, Any]] = []
        if got.content is not None and len(got.content) > self.content:
            out.append({"content": got.content[self.content:]})
            self.content = len(got.content)
        for i, c in enumerate(got.calls):
            if c.name is None:
                break
            if i == len(self.sent):
                self.ids.append(call_id(self.job_id, i))
                self.sent.append(0)
                out.append({"tool_calls": [{"index": i, "id": self.ids[i], "type": "function",
                                            "function": {"name": c.name, "arguments": ""}}]})
            args = c.arguments if c.done or final else c.arguments.rstrip()
            if len(args) > self.sent[i]:
                out.append({"tool_calls": [{"index": i, "function": {
                    "arguments": args[self.sent[i]:]}}]})
                self.sent[i] = len(args)
        return out

    def finish(self) -> list[dict[str, Any]]:
        return self.feed("", final=True)
