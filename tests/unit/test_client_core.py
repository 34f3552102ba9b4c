"""tokenq.client's shared core, without a server: the retry and failover decisions, the
resume state machine, request building and answer decoding; and both clients driven
through it over httpx.MockTransport (cuts mid-message, replicas down, error envelopes)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest

from tokenq.client import (
    APIError,
    AsyncClient,
    Client,
    DoneEvent,
    QueuedEvent,
    StreamGaveUp,
    TokenEvent,
    _calls,
)
from tokenq.client._core import Attempts, BatchWatch, ClientCore, Resume, StreamSession
from tokenq.client.models import Batch
from tokenq.client.sse import Message

Handler = Callable[[httpx.Request], httpx.Response]
JOB = {"id": "j", "status": "running", "model": "m", "created_at": 1.0}


def sse(*events: tuple[str, str, dict[str, Any]]) -> str:
    return "".join(f"id: {i}\r\nevent: {e}\r\ndata: {json.dumps(d)}\r\n\r\n"
                   for i, e, d in events)


class Body(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A response body that sends `text`, then drops the connection when `cut`."""

    def __init__(self, text: str, cut: bool = False) -> None:
        self.text, self.cut = text.encode(), cut

    def __iter__(self) -> Iterator[bytes]:
        yield self.text
        if self.cut:
            raise httpx.ReadError("connection cut")

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.text
        if self.cut:
            raise httpx.ReadError("connection cut")


def sync_client(handler: Handler, urls: str | list[str] = "http://a", **kw: Any) -> Client:
    return Client(urls, http_client=httpx.Client(transport=httpx.MockTransport(handler)), **kw)


def async_client(handler: Handler, urls: str | list[str] = "http://a",
                 **kw: Any) -> AsyncClient:
    return AsyncClient(urls, http_client=httpx.AsyncClient(
        transport=httpx.MockTransport(handler)), **kw)


def core(urls: list[str], **kw: Any) -> ClientCore[httpx.Client]:
    return ClientCore(urls, "k", 1.0, 1.0, kw.get("max_retries", 2),
                      kw.get("max_stream_failures", 2), httpx.Client())


# -- sans-IO decisions ---------------------------------------------------------------------


def test_attempts_rotate_and_give_up_after_the_budget() -> None:
    c = core(["http://a", "http://b"])
    tries = Attempts(c, 2)
    assert tries.failed() == 0.1 and c.base_url == "http://b"
    assert tries.answered(httpx.Response(503, headers={"Retry-After": "1.5"})) == 1.5
    assert c.base_url == "http://a"
    assert tries.failed() is None  # the budget is spent: the caller raises
    assert tries.answered(httpx.Response(200)) is None


def test_attempts_decode_the_error_envelope() -> None:
    err = {"error": {"message": "no such job", "code": "not_found", "param": "id",
                     "type": "invalid_request_error"}}
    with pytest.raises(APIError) as exc:
        Attempts(core(["http://a"]), 0).answered(httpx.Response(404, json=err))
    assert (exc.value.status, exc.value.code, exc.value.param, exc.value.message) == (
        404, "not_found", "id", "no such job")
    with pytest.raises(APIError) as exc:
        Attempts(core(["http://a"]), 0).answered(httpx.Response(503, text="busy"))
    assert exc.value.status == 503 and exc.value.message == "busy"


def test_resume_drops_duplicates_and_remembers_the_last_id() -> None:
    r = Resume("j")
    assert isinstance(r.accept(Message("token", '{"text": "a", "index": 0}', "1-0")),
                      TokenEvent)
    assert r.accept(Message("token", '{"text": "a", "index": 0}', "2-0")) is None
    assert r.accept(Message("mystery", "{}", "3-0")) is None and r.last_id == "3-0"
    assert r.request_headers() == {"Last-Event-ID": "3-0"}
    assert isinstance(r.accept(Message("done", "{}", "4-0")), DoneEvent) and r.finished


def test_stream_session_answers_and_delays() -> None:
    c = core(["http://a", "http://b"])
    s = StreamSession(c, "j", "5-0")
    assert s.connect() == ("http://a/v1/jobs/j/events", {"Last-Event-ID": "5-0"})
    assert s.opened(httpx.Response(503, headers={"Retry-After": "3"})) == "retry"
    assert not s.may_have_ended()  # the server asked for a pause: not a sign of the end
    assert s.retry_in() == 3.0 and c.base_url == "http://b"
    s.connect()
    assert s.opened(httpx.Response(200)) == "read"
    assert s.feed('id: 6-0\nevent: done\ndata: {}\n\nid: 7-0\nevent: token\ndata: {}\n\n') \
        == [DoneEvent(id="6-0")]  # nothing after the terminal event
    assert s.finished and s.resume.urls_tried == ["http://a", "http://b"]
    assert s.opened(httpx.Response(204)) == "end" and s.opened(httpx.Response(401)) == "error"


def test_stream_session_gives_up_after_failures_in_a_row() -> None:
    s = StreamSession(core(["http://a"], max_stream_failures=2), "j", None)
    s.retry_in()
    s.retry_in()
    with pytest.raises(StreamGaveUp):
        s.retry_in()


def test_calls_build_requests() -> None:
    call = _calls.submit("m", "hi", None, None, {"max_tokens": 4, "seed": None})
    assert (call.method, call.path, call.kwargs["json"]) == (
        "POST", "/v1/jobs", {"model": "m", "max_tokens": 4, "prompt": "hi"})
    assert call.kwargs["headers"]["Idempotency-Key"].startswith("tq-")
    assert _calls.list_jobs("queued", None, {"t": "x"}, 5, "a1").kwargs["params"] == {
        "limit": "5", "state": "queued", "after": "a1", "metadata[t]": "x"}
    data, name = _calls.batch_input([{"model": "m"}, {"body": {}, "custom_id": "z"}], "/e")
    assert name == "batch.jsonl" and [json.loads(x) for x in data.splitlines()] == [
        {"custom_id": "request-0", "method": "POST", "url": "/e", "body": {"model": "m"}},
        {"body": {}, "custom_id": "z"}]


def test_batch_watch_reports_changes_and_times_out() -> None:
    b = Batch(id="b", status="in_progress", endpoint="/e", input_file_id="f")
    watch = BatchWatch("b", -1.0)  # past its deadline already
    assert watch.changed(b) and not watch.changed(b)
    with pytest.raises(TimeoutError, match=r"^batch b did not end within -1\.0 s$"):
        watch.ended(b)
    assert watch.ended(b.model_copy(update={"status": "completed"}))


# -- both clients over a mock transport ----------------------------------------------------


def cut_then_resume() -> tuple[Handler, list[str | None]]:
    """The first connection is cut in the middle of token 2; the second resumes after
    token 1 (and sends it again: the client drops it)."""
    asked: list[str | None] = []

    def handler(req: httpx.Request) -> httpx.Response:
        asked.append(req.headers.get("Last-Event-ID"))
        if len(asked) == 1:
            text = sse(("1-0", "queued", {"position": 0}),
                       ("2-0", "token", {"text": "a", "index": 0}),
                       ("3-0", "token", {"text": "b", "index": 1}))
            cut = "id: 4-0\r\nevent: token\r\n"  # its data line never arrives
            return httpx.Response(200, stream=Body(text + cut, cut=True))
        return httpx.Response(200, stream=Body(sse(
            ("3-0", "token", {"text": "b", "index": 1}),
            ("4-0", "token", {"text": "c", "index": 2}),
            ("5-0", "done", {"finish_reason": "stop"}))))
    return handler, asked


def test_sync_stream_resumes_after_a_cut_mid_message() -> None:
    handler, asked = cut_then_resume()
    with sync_client(handler) as c:
        events = list(c.stream("j"))
        assert c.last_stream is not None and c.last_stream.connections == 2
    assert asked == [None, "3-0"]
    assert isinstance(events[0], QueuedEvent) and isinstance(events[-1], DoneEvent)
    assert [e.text for e in events if isinstance(e, TokenEvent)] == ["a", "b", "c"]


def test_async_stream_resumes_after_a_cut_mid_message() -> None:
    handler, asked = cut_then_resume()

    async def run() -> list[str]:
        async with async_client(handler) as c:
            return [t async for t in c.tokens("j")]

    assert asyncio.run(run()) == ["a", "b", "c"] and asked == [None, "3-0"]


def replicas_a_down(req: httpx.Request) -> httpx.Response:
    if req.url.host == "a":
        raise httpx.ConnectError("refused")
    if req.url.path.endswith("/events"):
        return httpx.Response(200, stream=Body(sse(("1-0", "done", {}))))
    if req.url.path == "/v1/jobs" and req.method == "POST":
        assert req.headers["Idempotency-Key"] == "k1"
        return httpx.Response(202, json={**JOB, "status": "queued"})
    return httpx.Response(200, json=JOB)


def test_sync_requests_and_streams_move_to_the_next_replica() -> None:
    with sync_client(replicas_a_down, ["http://a", "http://b"], api_key="s3") as c:
        assert c.submit("m", "hi", idempotency_key="k1").status == "queued"
        assert c.base_url == "http://b"
        c._current = 0
        assert [e.type for e in c.stream("j")] == ["done"]
        assert c.last_stream is not None and c.last_stream.urls_tried == ["http://b"]


def test_async_requests_move_to_the_next_replica() -> None:
    async def run() -> str:
        async with async_client(replicas_a_down, "http://a,http://b") as c:
            return (await c.get("j")).status

    assert asyncio.run(run()) == "running"


def test_transport_errors_past_the_budget_are_raised() -> None:
    with sync_client(replicas_a_down, max_retries=1) as c, pytest.raises(httpx.ConnectError):
        c.get("j")
    with sync_client(replicas_a_down, max_stream_failures=1) as c, \
            pytest.raises(StreamGaveUp):
        list(c.stream("j"))


def test_retry_statuses_then_success_and_errors_not_retried() -> None:
    answers = [httpx.Response(503, headers={"Retry-After": "0"}), httpx.Response(200, json=JOB),
               httpx.Response(404, json={"error": {"message": "gone", "code": "not_found"}})]
    with sync_client(lambda _: answers.pop(0)) as c:
        assert c.get("j").id == "j"
        with pytest.raises(APIError) as exc:
            c.cancel("j")
    assert exc.value.status == 404 and exc.value.code == "not_found" and not answers


def test_stream_ends_on_204_and_raises_error_statuses() -> None:
    with sync_client(lambda _: httpx.Response(204)) as c:
        assert list(c.stream("j", last_event_id="9-0")) == []
    with sync_client(lambda _: httpx.Response(
            403, json={"error": {"message": "no", "code": "forbidden"}})) as c, \
            pytest.raises(APIError, match="403 forbidden: no"):
        list(c.stream("j"))


def test_stream_of_a_finished_job_asked_from_its_end_stops() -> None:
    """Connections that bring nothing, the job done: the caller has it all already."""
    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path.endswith("/events"):
            return httpx.Response(200, stream=Body(": ping\r\n\r\n"))
        return httpx.Response(200, json={**JOB, "status": "succeeded"})

    with sync_client(handler) as c:
        assert list(c.stream("j", last_event_id="9-0")) == []
        assert c.last_stream is not None and c.last_stream.connections == 2


def batch_server() -> Handler:
    polls = iter(["in_progress", "in_progress", "completed"])
    counts = iter([0, 1, 2])

    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/v1/files":
            assert b"request-1" in req.content
            return httpx.Response(200, json={"id": "f", "bytes": 9, "filename": "batch.jsonl",
                                             "purpose": "batch"})
        if req.url.path.endswith("/content"):
            return httpx.Response(200, text='{"custom_id": "request-0"}\n\n')
        batch = {"id": "b", "endpoint": "/e", "input_file_id": "f", "output_file_id": "o",
                 "status": "validating" if req.method == "POST" else next(polls),
                 "request_counts": {"total": 2, "completed": 0 if req.method == "POST"
                                    else next(counts)}}
        return httpx.Response(200, json=batch)
    return handler


def test_sync_batch_helpers() -> None:
    seen: list[tuple[str, int]] = []
    with sync_client(batch_server()) as c:
        b = c.submit_batch([{"model": "m"}, {"model": "m"}], endpoint="/e")
        b = c.wait_batch(b.id, poll_s=0, on_progress=lambda b: seen.append(
            (b.status, b.request_counts.completed)))
        assert b.status == "completed" and c.batch_results(b) == [{"custom_id": "request-0"}]
    assert seen == [("in_progress", 0), ("in_progress", 1), ("completed", 2)]


def test_async_batch_helpers() -> None:
    seen: list[str] = []

    async def report(b: Batch) -> None:
        seen.append(b.status)

    async def run() -> Batch:
        async with async_client(batch_server()) as c:
            b = await c.submit_batch([{"model": "m"}, {"model": "m"}], endpoint="/e")
            b = await c.wait_batch(b.id, poll_s=0, on_progress=report)
            assert await c.batch_results(b) == [{"custom_id": "request-0"}]
            return b

    assert asyncio.run(run()).status == "completed"
    assert seen == ["in_progress", "in_progress", "completed"]
