"""The synchronous client: `Client(base_url, api_key=...)`. The I/O only: what to send,
what answers mean, when to retry and where to resume are decided in _core and _calls."""

from __future__ import annotations

import builtins
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import httpx

from tokenq.client import _calls
from tokenq.client._calls import Call
from tokenq.client._core import (
    TRANSPORT_ERRORS,
    APIError,
    BatchWatch,
    ClientCore,
    Deadline,
    StreamGaveUp,
)
from tokenq.client.models import Batch, Event, FileObject, Job, JobList, TokenEvent

ProgressFn = Callable[[Batch], None]
T = TypeVar("T")


class Client(ClientCore[httpx.Client]):
    """tokenq's jobs and batches over HTTP.

    `base_url` may name several API replicas (a list, or comma-separated): requests and
    streams move to the next one when one stops answering. The API key comes from
    `api_key` or TOKENQ_API_KEY."""

    def __init__(self, base_url: str | Sequence[str] | None = None, *,
                 api_key: str | None = None, timeout: float = 30.0,
                 stream_read_timeout: float = 60.0, max_retries: int = 5,
                 max_stream_failures: int = 20, http_client: httpx.Client | None = None):
        super().__init__(base_url, api_key, timeout, stream_read_timeout, max_retries,
                         max_stream_failures, http_client or httpx.Client(timeout=timeout))

    # -- plumbing ---------------------------------------------------------------------

    def _request(self, method: str, path: str, *, retry: bool = True,
                 **kw: Any) -> httpx.Response:
        """One call; a dropped connection or a 429/502/503/504 is retried on the next base
        URL (up to `max_retries` times) when `retry`."""
        attempts = self._attempts(retry)
        while True:
            try:
                resp = self._http.request(method, self.base_url + path, **kw)
            except TRANSPORT_ERRORS:
                if (wait := attempts.failed()) is None:
                    raise
            else:
                if (wait := attempts.answered(resp)) is None:
                    return resp
            time.sleep(wait)

    def _call(self, call: Call[T]) -> T:
        return call.decode(self._request(call.method, call.path, **call.kwargs))

    # -- jobs -------------------------------------------------------------------------

    def submit(self, model: str, prompt: str | None = None, *,
               messages: builtins.list[dict[str, Any]] | None = None,
               idempotency_key: str | None = None, **params: Any) -> Job:
        """POST /v1/jobs. Retried safely: every submit carries an Idempotency-Key (one is
        made up when not given), so a retry after a lost answer returns the same job."""
        return self._call(_calls.submit(model, prompt, messages, idempotency_key, params))

    def get(self, job_id: str) -> Job:
        return self._call(_calls.get_job(job_id))

    def cancel(self, job_id: str) -> Job:
        return self._call(_calls.cancel_job(job_id))

    def list(self, *, state: str | None = None, model: str | None = None,
             metadata: dict[str, str] | None = None, limit: int = 20,
             after: str | None = None) -> JobList:
        """One page of this API key's jobs, newest first."""
        return self._call(_calls.list_jobs(state, model, metadata, limit, after))

    def iter_jobs(self, **filters: Any) -> Iterator[Job]:
        """Every job matching the filters, page after page."""
        after = filters.pop("after", None)
        while True:
            page = self.list(after=after, **filters)
            yield from page.data
            if (after := _calls.next_after(page)) is None:
                return

    def stream(self, job_id: str, *, last_event_id: str | None = None) -> Iterator[Event]:
        """The job's events to its terminal one, each delivered once and in order. A dropped
        connection or a replica that goes away is resumed with Last-Event-ID, on the next
        base URL; StreamGaveUp after `max_stream_failures` failures in a row."""
        session = self._open_stream(job_id, last_event_id)
        while not session.finished:
            url, headers = session.connect()
            try:
                with self._http.stream("GET", url, headers=headers,
                                       timeout=self._stream_timeout) as resp:
                    answer = session.opened(resp)
                    if answer == "end":
                        return
                    if answer == "error":
                        resp.read()
                        raise APIError.from_response(resp)
                    if answer == "read":
                        for chunk in resp.iter_text():
                            yield from session.feed(chunk)
                            if session.finished:
                                return
            except TRANSPORT_ERRORS:
                pass
            if session.may_have_ended() and self._job_done(job_id):
                return
            time.sleep(session.retry_in())

    def _job_done(self, job_id: str) -> bool:
        try:
            return self.get(job_id).done
        except (APIError, StreamGaveUp):
            return False

    def tokens(self, job_id: str, *, last_event_id: str | None = None) -> Iterator[str]:
        """Just the text, token by token (see `stream`)."""
        for ev in self.stream(job_id, last_event_id=last_event_id):
            if isinstance(ev, TokenEvent):
                yield ev.text

    def wait(self, job_id: str, timeout: float | None = None) -> Job:
        """Block until the job ends; its final record. TimeoutError after `timeout` s."""
        deadline = Deadline(f"job {job_id}", timeout)
        for _ in self.stream(job_id):
            deadline.check()
        return self.get(job_id)

    # -- files and batches ------------------------------------------------------------

    def upload_file(self, content: bytes | str | Path, *, purpose: str = "batch",
                    filename: str | None = None) -> FileObject:
        return self._call(_calls.upload_file(content, purpose, filename))

    def create_batch(self, input_file_id: str, *, endpoint: str = "/v1/chat/completions",
                     metadata: dict[str, str] | None = None,
                     idempotency_key: str | None = None) -> Batch:
        return self._call(_calls.create_batch(input_file_id, endpoint, metadata,
                                              idempotency_key))

    def get_batch(self, batch_id: str) -> Batch:
        return self._call(_calls.get_batch(batch_id))

    def cancel_batch(self, batch_id: str) -> Batch:
        return self._call(_calls.cancel_batch(batch_id))

    def wait_batch(self, batch_id: str, *, on_progress: ProgressFn | None = None,
                   poll_s: float = 1.0, timeout: float | None = None) -> Batch:
        """Poll until the batch ends; `on_progress(batch)` whenever its status or counts
        change (and once at the start)."""
        watch = BatchWatch(batch_id, timeout)
        while True:
            b = self.get_batch(batch_id)
            if on_progress is not None and watch.changed(b):
                on_progress(b)
            if watch.ended(b):
                return b
            time.sleep(poll_s)

    def submit_batch(self, requests: Path | Iterable[dict[str, Any]], *,
                     endpoint: str = "/v1/chat/completions",
                     metadata: dict[str, str] | None = None,
                     on_progress: ProgressFn | None = None, wait: bool = False) -> Batch:
        """Upload a JSONL file (a path, or request bodies to wrap as lines) and start a
        batch over it; with `wait`, follow it to the end."""
        data, name = _calls.batch_input(requests, endpoint)
        f = self.upload_file(data, filename=name)
        b = self.create_batch(f.id, endpoint=endpoint, metadata=metadata)
        return self.wait_batch(b.id, on_progress=on_progress) if wait else b

    def batch_results(self, batch: Batch) -> builtins.list[dict[str, Any]]:
        """The output file's lines (one per request that succeeded), parsed."""
        call = _calls.batch_results(batch)
        return [] if call is None else self._call(call)

    # -- lifecycle --------------------------------------------------------------------

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()
