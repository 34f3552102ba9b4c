"""One job traced API -> Redis -> worker -> engine (OpenTelemetry, in-memory exporter), and
JSON log lines that carry the job's context. The API runs in-process (TestClient) and the
worker's runtime in-process with the real llama.cpp engine, on their own Redis db."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
import redis
from fastapi.testclient import TestClient
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.conftest import SMOL
from tokenq.api.app import create_app
from tokenq.shared import logs
from tokenq.shared.redis_server import EmbeddedRedis
from tokenq.shared.settings import Settings
from tokenq.shared.settings_roles import WorkerSettings
from tokenq.workers.main import build_engine
from tokenq.workers.runtime import WorkerRuntime
from tokenq.workers.tasks import run_job

EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module")
def spans() -> InMemorySpanExporter:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
    trace.set_tracer_provider(provider)
    return EXPORTER


@pytest.fixture
def json_logs(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    monkeypatch.setenv("TOKENQ_LOG_FORMAT", "json")
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(logs.formatter())
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    yield buf
    root.removeHandler(handler)
    root.setLevel(old_level)


def test_a_job_is_one_trace_and_its_logs_carry_its_context(
        spans: InMemorySpanExporter, json_logs: io.StringIO, redis_server: EmbeddedRedis,
        r: redis.Redis, stack_settings: Settings) -> None:
    settings = Settings(redis_url=redis_server.url.rsplit("/", 1)[0] + "/15",
                        state_dir=stack_settings.state_dir, served_models=[SMOL],
                        tracing=True, worker=WorkerSettings(metrics_port=None))
    spans.clear()
    app = create_app(settings)
    with TestClient(app) as client:
        resp = client.post("/v1/jobs", json={"model": SMOL, "prompt": "Say hi",
                                             "max_tokens": 8, "temperature": 0})
        assert resp.status_code == 202, resp.text
        job_id = resp.json()["id"]
    assert r.hget(f"tokenq:job:{job_id}", "traceparent")
    rt = WorkerRuntime(settings=settings, model=SMOL, cfg=settings.models()[SMOL],
                       engine=build_engine(settings, SMOL),
                       r=redis.Redis.from_url(settings.redis_url or "", decode_responses=True))
    rt.start()
    try:
        assert run_job(rt, job_id) == "succeeded"
    finally:
        rt.close()
    got = {s.name: s for s in spans.get_finished_spans()}
    names = {"job.submit", "job.attempt", "job.queue_wait", "job.lease", "engine.prefill",
             "engine.decode", "job.publish"}
    assert names <= set(got), sorted(got)
    root = got["job.submit"]
    assert {s.context.trace_id for n, s in got.items() if n in names} == {root.context.trace_id}
    assert got["job.attempt"].parent is not None
    assert got["job.attempt"].parent.span_id == root.context.span_id
    for n in names - {"job.submit", "job.attempt"}:
        span = got[n]
        assert span.parent is not None and span.parent.span_id == got["job.attempt"].context.span_id
        assert span.end_time is not None and span.start_time is not None
        assert span.end_time >= span.start_time, n
    assert got["job.attempt"].attributes["tokenq.job_id"] == job_id
    assert got["job.queue_wait"].start_time < got["job.lease"].start_time
    assert got["engine.prefill"].end_time <= got["engine.decode"].end_time
    # JSON log lines: the API's `queued` line and access line, the worker's attempt line
    lines = [json.loads(line) for line in json_logs.getvalue().splitlines()]
    queued = [ln for ln in lines if ln["msg"] == f"job {job_id}: queued"]
    assert queued and queued[0]["tenant"] == "default" and queued[0]["model"] == SMOL
    access = [ln for ln in lines if ln["logger"] == "tokenq.access"]
    assert access and access[0]["method"] == "POST" and access[0]["status"] == 202
    started = [ln for ln in lines if ln["msg"] == f"job {job_id}: attempt 1 started"]
    assert started and started[0] | {"job_id": job_id, "attempt": 1, "tenant": "default",
                                     "model": SMOL, "worker": rt.worker_id} == started[0]
