from __future__ import annotations

from tokenq.cli.sse import parse_lines


def test_parse_events_and_skip_pings() -> None:
    lines = iter([": ping", "", "id: 1-0", "event: token", 'data: {"text": "a", "index": 0}', "",
                  "id: 2-0", "event: done", "data: {}", ""])
    events = list(parse_lines(lines))
    assert [(e.id, e.event) for e in events] == [("1-0", "token"), ("2-0", "done")]
    assert events[0].data == {"text": "a", "index": 0}
