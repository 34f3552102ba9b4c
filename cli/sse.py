"""Moved: the one SSE parser and the raw event reader are tokenq.client.sse. This name is
kept only for code written against it before the move; import tokenq.client.sse."""

from tokenq.client.sse import RawEvent as Event
from tokenq.client.sse import parse_lines, stream_events

__all__ = ["Event", "parse_lines", "stream_events"]
