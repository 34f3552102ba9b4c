"""The asyncio client: `AsyncClient(base_url, api_key=...)`, the same calls as `Client`."""

from __future__ import annotations

import asyncio
import builtins
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
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

ProgressFn = Callable[[Batch], Awaitable[None] | None]


class AsyncClient:
    """See `tokenq.client.Client`; every call is a coroutine and `stream` an async
    iterator."""

    def __init__(self, base_url: str | Sequence[str] | None = None, *,
                 api_key: str | None = None, timeout: float = 30.0,
                 stream_read_timeout: float = 60.0, max_retries: int = 5,
                 max_stream_failures: int = 20, http_client: httpx.AsyncClient | None = None):
        self.urls = _core.base_urls(base_url)
        self._current = 0
        self._stream_timeout = httpx.Timeout(timeout, read=stream_read_timeout)
        self.max_retries = max_retries
        self.max_stream_failures = max_stream_failures
        self._http = http_client or httpx.AsyncClient(timeout=timeout)
        self._http.headers.update(_core.headers_for(api_key))
        # The latest stream's resume state (connections made, URLs used): for diagnostics.
        self.last_stream: Resume | None = None

    @property
    def base_url(self) -> str:
        return self.urls[self._current]

    def _rotate(self) -> None:
        self._current = (self._current + 1) % len(self.urls)

    async def _request(self, method: str, path: str, *, retry: bool = True,
                       **kw: Any) -> httpx.Response:
        tries = 0
        while True:
            try:
                resp = await self._http.request(method, self.base_url + path, **kw)
            except TRANSPORT_ERRORS:
                self._rotate()
                if not retry or tries >= self.max_retries:
                    raise
                tries += 1
                await asyncio.sleep(_core.delay_s(tries))
                continue
            if resp.status_code in RETRY_STATUSES and retry and tries < self.max_retries:
                tries += 1
                self._rotate()
                await asyncio.sleep(max(_core.delay_s(tries), _core.retry_after_s(resp, 0.0)))
                continue
            if resp.status_code >= 400:
                raise APIError.from_response(resp)
            return resp

    # -- jobs -------------------------------------------------------------------------

    async def submit(self, model: str, prompt: str | None = None, *,
                     messages: list[dict[str, Any]] | None = None,
                     idempotency_key: str | None = None, **params: Any) -> Job:
        body = _core.job_body(model, prompt, messages, params)
        key = idempotency_key or _core.new_idempotency_key()
        resp = await self._request("POST", "/v1/jobs", json=body,
                                   headers={"Idempotency-Key": key})
        return Job.model_validate(resp.json())

    async def get(self, job_id: str) -> Job:
        return Job.model_validate((await self._request("GET", f"/v1/jobs/{job_id}")).json())

    async def cancel(self, job_id: str) -> Job:
        resp = await self._request("DELETE", f"/v1/jobs/{job_id}")
        return Job.model_validate(resp.json())

    async def list(self, *, state: str | None = None, model: str | None = None,
                   metadata: dict[str, str] | None = None, limit: int = 20,
                   after: str | None = None) -> JobList:
        q = _core.list_params(state, model, metadata, limit, after)
        return JobList.model_validate((await self._request("GET", "/v1/jobs", params=q)).json())

    async def iter_jobs(self, **filters: Any) -> AsyncIterator[Job]:
        after = filters.pop("after", None)
        while True:
            page = await self.list(after=after, **filters)
            for job in page.data:
                yield job
            if not page.has_more or page.last_id is None:
                return
            after = page.last_id

    async def stream(self, job_id: str, *,
                     last_event_id: str | None = None) -> AsyncIterator[Event]:
        st = self.last_stream = Resume(job_id, last_id=last_event_id)
        backoff = Backoff(max_failures=self.max_stream_failures)
        while not st.finished:
            delay = 0.0
            got = 0
            try:
                async with self._http.stream(
                        "GET", f"{self.base_url}/v1/jobs/{job_id}/events",
                        headers=st.request_headers(), timeout=self._stream_timeout) as resp:
                    st.connections += 1
                    st.urls_tried.append(self.base_url)
                    if resp.status_code == 204:
                        return
                    if resp.status_code in RETRY_STATUSES:
                        delay = _core.retry_after_s(resp, 0.0)
                    elif resp.status_code >= 400:
                        await resp.aread()
                        raise APIError.from_response(resp)
                    else:
                        dec = SSEDecoder()
                        async for line in resp.aiter_lines():
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
            if got == 0 and delay == 0.0 and await self._ended(job_id, st):
                return
            self._rotate()
            await asyncio.sleep(max(delay, backoff.failed()))

    async def _ended(self, job_id: str, st: Resume) -> bool:
        if st.last_id is None:
            return False
        try:
            return (await self.get(job_id)).done and st.connections > 1
        except (APIError, _core.StreamGaveUp):
            return False

    async def tokens(self, job_id: str, *,
                     last_event_id: str | None = None) -> AsyncIterator[str]:
        async for ev in self.stream(job_id, last_event_id=last_event_id):
            if isinstance(ev, TokenEvent):
                yield ev.text

    async def wait(self, job_id: str, timeout: float | None = None) -> Job:
        async def drain() -> None:
            async for _ in self.stream(job_id):
                pass

        try:
            await asyncio.wait_for(drain(), timeout)
        except TimeoutError:
            raise TimeoutError(f"job {job_id} did not end within {timeout} s") from None
        return await self.get(job_id)

    # -- files and batches ------------------------------------------------------------

    async def upload_file(self, content: bytes | str | Path, *, purpose: str = "batch",
                          filename: str | None = None) -> FileObject:
        if isinstance(content, Path):
            filename, content = filename or content.name, content.read_bytes()
        data = content.encode() if isinstance(content, str) else content
        resp = await self._request("POST", "/v1/files", data={"purpose": purpose},
                                   files={"file": (filename or "input.jsonl", data)})
        return FileObject.model_validate(resp.json())

    async def create_batch(self, input_file_id: str, *,
                           endpoint: str = "/v1/chat/completions",
                           metadata: dict[str, str] | None = None,
                           idempotency_key: str | None = None) -> Batch:
        body = {"input_file_id": input_file_id, "endpoint": endpoint,
                "completion_window": "24h", "metadata": metadata}
        key = idempotency_key or _core.new_idempotency_key()
        resp = await self._request("POST", "/v1/batches", json=body,
                                   headers={"Idempotency-Key": key})
        return Batch.model_validate(resp.json())

    async def get_batch(self, batch_id: str) -> Batch:
        resp = await self._request("GET", f"/v1/batches/{batch_id}")
        return Batch.model_validate(resp.json())

    async def cancel_batch(self, batch_id: str) -> Batch:
        resp = await self._request("POST", f"/v1/batches/{batch_id}/cancel")
        return Batch.model_validate(resp.json())

    async def wait_batch(self, batch_id: str, *, on_progress: ProgressFn | None = None,
                         poll_s: float = 1.0, timeout: float | None = None) -> Batch:
        deadline = None if timeout is None else time.monotonic() + timeout
        last: Batch | None = None
        while True:
            b = await self.get_batch(batch_id)
            if on_progress is not None and progress_changed(last, b):
                res = on_progress(b)
                if res is not None:
                    await res
            last = b
            if b.done:
                return b
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"batch {batch_id} did not end within {timeout} s")
            await asyncio.sleep(poll_s)

    async def submit_batch(self, requests: Path | Iterable[dict[str, Any]], *,
                           endpoint: str = "/v1/chat/completions",
                           metadata: dict[str, str] | None = None,
                           on_progress: ProgressFn | None = None, wait: bool = False) -> Batch:
        data = requests.read_bytes() if isinstance(requests, Path) else encode_lines(
            requests, endpoint)
        f = await self.upload_file(data, filename=requests.name
                                   if isinstance(requests, Path) else "batch.jsonl")
        b = await self.create_batch(f.id, endpoint=endpoint, metadata=metadata)
        return await self.wait_batch(b.id, on_progress=on_progress) if wait else b

    async def batch_results(self, batch: Batch) -> builtins.list[dict[str, Any]]:
        if batch.output_file_id is None:
            return []
        resp = await self._request("GET", f"/v1/files/{batch.output_file_id}/content")
        return [json.loads(line) for line in resp.text.splitlines() if line.strip()]

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: type[BaseException] | BaseException | TracebackType
                        | None) -> None:
        await self.aclose()
