"""OpenTelemetry tracing of one job, API -> Redis -> worker -> engine (opt-in).

Off unless TOKENQ_TRACING=1 and the `otel` extra (opentelemetry-api/sdk) is installed.
The API starts a `job.submit` span and stores its W3C `traceparent` in the job record
(field `traceparent`, written by CREATE with the rest of the record); the worker that
runs the job continues that trace with one `job.attempt` span and, under it,
`job.queue_wait` (creation -> lease, first attempt), `job.lease` (the ACQUIRE script),
`engine.prefill` (submit -> first token written), `engine.decode` (first -> last token
written) and `job.publish` (the Redis write that carried the terminal event). Worker
spans are recorded after the fact with the times measured while the job ran, so the
engine loop carries no tracing code.

Export: OTLP over HTTP when OTEL_EXPORTER_OTLP_ENDPOINT is set (the otlp exporter
package must be installed), the console otherwise. A process that already installed a
tracer provider (tests: the SDK's in-memory exporter) keeps it.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

try:
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the `otel` extra is not installed: tracing stays off
    trace = None  # type: ignore[assignment]

_enabled = False
TRACER = "tokenq"


def setup(enabled: bool, service: str) -> bool:
    """Turn tracing on for this process (once); False when off or not installed."""
    global _enabled
    if not enabled:
        return False
    if trace is None:
        log.warning("TOKENQ_TRACING=1 but opentelemetry is not installed (pip install "
                    "'tokenq[otel]'); tracing stays off")
        return False
    if type(trace.get_tracer_provider()).__name__ == "ProxyTracerProvider":
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

        provider = TracerProvider(resource=Resource.create({"service.name": service}))
        exporter: Any = ConsoleSpanExporter()
        if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
            try:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                    OTLPSpanExporter,
                )
                exporter = OTLPSpanExporter()
            except ImportError:
                log.warning("OTEL_EXPORTER_OTLP_ENDPOINT is set but the OTLP exporter is not "
                            "installed; spans go to the console")
        provider.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
    _enabled = True
    return True


def enabled() -> bool:
    return _enabled


@contextlib.contextmanager
def span(name: str, **attributes: str | int | float) -> Iterator[Any]:
    """A span around a block (nothing when tracing is off)."""
    if not _enabled:
        yield None
        return
    with trace.get_tracer(TRACER).start_as_current_span(name, attributes=attributes) as sp:
        yield sp


def traceparent() -> str | None:
    """The current span's W3C traceparent, to store with the job."""
    if not _enabled:
        return None
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier.get("traceparent")


def _ns(t: float) -> int:
    return int(t * 1e9)


@dataclass(slots=True)
class AttemptTimes:
    """What a worker measured while running one attempt (time.time() seconds)."""

    created: float | None
    acquire_start: float
    acquire_end: float
    first_token: float | None
    last_write: tuple[float, float] | None  # the terminal write: start, end
    writes: int
    write_s: float


def record_attempt(parent: str | None, attrs: dict[str, str | int], t: AttemptTimes,
                   end: float) -> None:
    """The worker's spans for one attempt, children of the API's span via `parent`."""
    if not _enabled:
        return
    tracer = trace.get_tracer(TRACER)
    ctx = TraceContextTextMapPropagator().extract({"traceparent": parent} if parent else {})
    root = tracer.start_span("job.attempt", context=ctx, attributes=attrs,
                             start_time=_ns(t.acquire_start))
    inner = trace.set_span_in_context(root, ctx)

    def child(name: str, start: float, stop: float, **extra: int | float) -> None:
        tracer.start_span(name, context=inner, start_time=_ns(start),
                          attributes={**attrs, **extra}).end(end_time=_ns(max(start, stop)))

    if t.created is not None and attrs.get("tokenq.attempt") == 1:
        child("job.queue_wait", t.created, t.acquire_start)
    child("job.lease", t.acquire_start, t.acquire_end)
    if t.first_token is not None:
        child("engine.prefill", t.acquire_end, t.first_token)
        child("engine.decode", t.first_token, t.last_write[0] if t.last_write else end)
    if t.last_write is not None:
        child("job.publish", *t.last_write, **{"tokenq.writes": t.writes,
                                              "tokenq.write_s": t.write_s})
    root.end(end_time=_ns(end))
