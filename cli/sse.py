"""A small SSE client (used by the demo, the benchmark and the tests)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass(slots=True)
class Event:
    id: str | None
    event: str
    data: dict[str, Any]


def parse_lines(lines: Iterator[str]) -> Iterator[Event]:
    """SSE framing: fields until a blank line; comments (":") are keep-alives."""
    eid: str | None = None
    event = "message"
    data: list[str] = []
    for line in lines:
        if line == "":
            if data:
                yield Event(eid, event, json.loads("\n".join(data)))
            eid, event, data = None, "message", []
        elif line.startswith(":"):
            continue
        else:
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "id":
                eid = value
            elif name == "event":
                event = value
            elif name == "data":
                data.append(value)


def stream_events(client: httpx.Client, job_id: str, last_event_id: str | None = None,
                  timeout: float | None = None) -> Iterator[Event]:
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    with client.stream("GET", f"/v1/jobs/{job_id}/events", headers=headers,
                       timeout=timeout) as resp:
        resp.raise_for_status()
        yield from parse_lines(resp.iter_lines())
