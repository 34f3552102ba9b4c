"""The synchronous client: `Client(base_url, api_key=...)`."""

from __future__ import annotations

import builtins
import json
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from tokenq.client import _core
from tokenq.client._batch import encode_lines, progress_changed
from tokenq.client._core import (
    RETRY_STATUSES,
    TRANSPORT_ERRORS,
    APIError,
    Backoff,
    Resume,
    SSEDecoder,
)
from tokenq.client.models import Batch, Event, FileObject, Job, JobList, TokenEvent

ProgressFn = Callable[[Batch], None]


class Client:
    """tokenq's jobs and batches over HTTP.

    `base_url` may name several API replicas (a list, or comma-separated): requests and
    streams move to the next one when one stops answering. The API key comes from
    `api_key` or TOKENQ_API_KEY."""

    def __init__(self, base_url: str | Sequence[str] | None = None, *,
                 api_key: str | None = None, timeout: float = 30.0,
                 stream_read_timeout: float = 60.0, max_retries: int = 5,
                 max_stream_failures: int = 20, http_client: httpx.Client | None = None):
        self.urls = _core.base_urls(base_url)
        self._current = 0
        self._timeout = timeout
        self._stream_timeout = httpx.Timeout(timeout, read=stream_read_timeout)
        self.max_retries = max_retries
        self.max_stream_failures = max_stream_failures
        self._http = http_client or httpx.Client(timeout=timeout)
        self._http.headers.update(_core.headers_for(api_key))
        # The latest stream's resume state (connections made, URLs used): for diagnostics.
        self.last_stream: Resume | None = None

    # -- plumbing ---------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return self.urls[self._current]

    def _rotate(self) -> None:
        self._current = (self._current + 1) % len(self.urls)

    def _request(self, method: str, path: str, *, retry: bool = True,
                 **kw: Any) -> httpx.Response:
        """One call; a dropped connection or a 429/502/503/504 is retried on the next base
        URL (up to `max_retries` times) when `retry`."""
        tries = 0
        while True:
            try:
                resp = self._http.request(method, self.base_url + path, **kw)
            except TRANSPORT_ERRORS:
                self._rotate()
                if not retry or tries >= self.max_retries:
                    raise
                tries += 1
                time.sleep(_core.delay_s(tries))
                continue
            if resp.status_code in RETRY_STATUSES and retry and tries < self.max_retries:
                tries += 1
                self._rotate()
                time.sleep(max(_core.delay_s(tries), _core.retry_after_s(resp, 0.0)))
                continue
            if resp.status_code >= 400:
                raise APIError.from_response(resp)
            return resp

    # -- jobs -------------------------------------------------------------------------

    def submit(self, model: str, prompt: str | None = None, *,
               messages: builtins.list[dict[str, Any]] | None = None,
               idempotency_key: str | None = None, **params: Any) -> Job:
        """POST /v1/jobs. Retried safely: every submit carries an Idempotency-Key (one is
        made up when not given), so a retry after a lost answer returns the same job."""
        body = _core.job_body(model, prompt, messages, params)
        key = idempotency_key or _core.new_idempotency_key()
        resp = self._request("POST", "/v1/jobs", json=body, headers={"Idempotency-Key": key})
        return Job.model_validate(resp.json())

    def get(self, job_id: str) -> Job:
        return Job.model_validate(self._request("GET", f"/v1/jobs/{job_id}").json())

    def cancel(self, job_id: str) -> Job:
        return Job.model_validate(self._request("DELETE", f"/v1/jobs/{job_id}").json())

    def list(self, *, state: str | None = None, model: str | None = None,
             metadata: dict[str, str] | None = None, limit: int = 20,
             after: str | None = None) -> JobList:
        """One page of this API key's jobs, newest first."""
        q = _core.list_params(state, model, metadata, limit, after)
        return JobList.model_validate(self._request("GET", "/v1/jobs", params=q).json())

    def iter_jobs(self, **filters: Any) -> Iterator[Job]:
        """Every job matching the filters, page after page."""
        after = filters.pop("after", None)
        while True:
            page = self.list(after=after, **filters)
            yield from page.data
            if not page.has_more or page.last_id is None:
                return
            after = page.last_id

    def stream(self, job_id: str, *, last_event_id: str | None = None) -> Iterator[Event]:
        """The job's events to its terminal one, each delivered once and in order. A dropped
        connection or a replica that goes away is resumed with Last-Event-ID, on the next
        base URL; StreamGaveUp after `max_stream_failures` failures in a row."""
        st = self.last_stream = Resume(job_id, last_id=last_event_id)
        backoff = Backoff(max_failures=self.max_stream_failures)
        while not st.finished:
            delay = 0.0
            got = 0
            try:
                with self._http.stream("GET", f"{self.base_url}/v1/jobs/{job_id}/events",
                                       headers=st.request_headers(),
                                       timeout=self._stream_timeout) as resp:
                    st.connections += 1
                    st.urls_tried.append(self.base_url)
                    if resp.status_code == 204:
                        return
                    if resp.status_code in RETRY_STATUSES:
                        delay = _core.retry_after_s(resp, 0.0)
                    elif resp.status_code >= 400:
                        resp.read()
                        raise APIError.from_response(resp)
                    else:
                        dec = SSEDecoder()
                        for line in resp.iter_lines():
                            raw = dec.feed(line)
                            if raw is None:
                                continue
                            got += 1
                            backoff.progressed()
                            ev = st.accept(raw)
                            if ev is not None:
                                yield ev
                            if st.finished:
                                return
            except TRANSPORT_ERRORS:
                pass
            if got == 0 and delay == 0.0 and self._ended(job_id, st):
                return
            self._rotate()
            time.sleep(max(delay, backoff.failed()))

    def _ended(self, job_id: str, st: Resume) -> bool:
        """After a connection that brought nothing: a job already past its terminal event
        for this caller (Last-Event-ID given at or after it) has nothing more to send."""
        if st.last_id is None:
            return False
        try:
            return self.get(job_id).done and st.connections > 1
        except (APIError, _core.StreamGaveUp):
            return False

    def tokens(self, job_id: str, *, last_event_id: str | None = None) -> Iterator[str]:
        """Just the text, token by token (see `stream`)."""
        for ev in self.stream(job_id, last_event_id=last_event_id):
            if isinstance(ev, TokenEvent):
                yield ev.text

    def wait(self, job_id: str, timeout: float | None = None) -> Job:
        """Block until the job ends; its final record. TimeoutError after `timeout` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for _ in self.stream(job_id):
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} did not end within {timeout} s")
        return self.get(job_id)

    # -- files and batches ------------------------------------------------------------

    def upload_file(self, content: bytes | str | Path, *, purpose: str = "batch",
                    filename: str | None = None) -> FileObject:
        if isinstance(content, Path):
            filename, content = filename or content.name, content.read_bytes()
        data = content.encode() if isinstance(content, str) else content
        resp = self._request("POST", "/v1/files", data={"purpose": purpose},
                             files={"file": (filename or "input.jsonl", data)})
        return FileObject.model_validate(resp.json())

    def create_batch(self, input_file_id: str, *, endpoint: str = "/v1/chat/completions",
                     metadata: dict[str, str] | None = None,
                     idempotency_key: str | None = None) -> Batch:
        body = {"input_file_id": input_file_id, "endpoint": endpoint,
                "completion_window": "24h", "metadata": metadata}
        key = idempotency_key or _core.new_idempotency_key()
        resp = self._request("POST", "/v1/batches", json=body,
                             headers={"Idempotency-Key": key})
        return Batch.model_validate(resp.json())

    def get_batch(self, batch_id: str) -> Batch:
        return Batch.model_validate(self._request("GET", f"/v1/batches/{batch_id}").json())

    def cancel_batch(self, batch_id: str) -> Batch:
        resp = self._request("POST", f"/v1/batches/{batch_id}/cancel")
        return Batch.model_validate(resp.json())

    def wait_batch(self, batch_id: str, *, on_progress: ProgressFn | None = None,
                   poll_s: float = 1.0, timeout: float | None = None) -> Batch:
        """Poll until the batch ends; `on_progress(batch)` whenever its status or counts
        change (and once at the start)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        last: Batch | None = None
        while True:
            b = self.get_batch(batch_id)
            if on_progress is not None and progress_changed(last, b):
                on_progress(b)
            last = b
            if b.done:
                return b
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"batch {batch_id} did not end within {timeout} s")
            time.sleep(poll_s)

    def submit_batch(self, requests: Path | Iterable[dict[str, Any]], *,
                     endpoint: str = "/v1/chat/completions",
                     metadata: dict[str, str] | None = None,
                     on_progress: ProgressFn | None = None, wait: bool = False) -> Batch:
        """Upload a JSONL file (a path, or request bodies to wrap as lines) and start a
        batch over it; with `wait`, follow it to the end."""
        data = requests.read_bytes() if isinstance(requests, Path) else encode_lines(
            requests, endpoint)
        f = self.upload_file(data, filename=requests.name if isinstance(requests, Path)
                             else "batch.jsonl")
        b = self.create_batch(f.id, endpoint=endpoint, metadata=metadata)
        return self.wait_batch(b.id, on_progress=on_progress) if wait else b

    def batch_results(self, batch: Batch) -> builtins.list[dict[str, Any]]:
        """The output file's lines (one per request that succeeded), parsed."""
        if batch.output_file_id is None:
            return []
        resp = self._request("GET", f"/v1/files/{batch.output_file_id}/content")
        return [json.loads(line) for line in resp.text.splitlines() if line.strip()]

    # -- lifecycle --------------------------------------------------------------------

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()
