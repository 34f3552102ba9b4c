"""The asyncio client: `AsyncClient(base_url, api_key=...)`, the same calls as `Client`.
The I/O only: what to send, what answers mean, when to retry and where to resume are
decided in _core and _calls."""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
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

ProgressFn = Callable[[Batch], Awaitable[None] | None]
T = TypeVar("T")


class AsyncClient(ClientCore[httpx.AsyncClient]):
    """See `tokenq.client.Client`; every call is a coroutine and `stream` an async
    iterator."""

    def __init__(self, base_url: str | Sequence[str] | None = None, *,
                 api_key: str | None = None, timeout: float = 30.0,
                 stream_read_timeout: float = 60.0, max_retries: int = 5,
                 max_stream_failures: int = 20, http_client: httpx.AsyncClient | None = None):
        super().__init__(base_url, api_key, timeout, stream_read_timeout, max_retries,
                         max_stream_failures, http_client or httpx.AsyncClient(timeout=timeout))

    async def _request(self, method: str, path: str, *, retry: bool = True,
                       **kw: Any) -> httpx.Response:
        attempts = self._attempts(retry)
        while True:
            try:
                resp = await self._http.request(method, self.base_url + path, **kw)
            except TRANSPORT_ERRORS:
                if (wait := attempts.failed()) is None:
                    raise
            else:
                if (wait := attempts.answered(resp)) is None:
                    return resp
            await asyncio.sleep(wait)

    async def _call(self, call: Call[T]) -> T:
        return call.decode(await self._request(call.method, call.path, **call.kwargs))

    # -- jobs -------------------------------------------------------------------------

    async def submit(self, model: str, prompt: str | None = None, *,
                     messages: list[dict[str, Any]] | None = None,
                     idempotency_key: str | None = None, **params: Any) -> Job:
        return await self._call(_calls.submit(model, prompt, messages, idempotency_key,
                                              params))

    async def get(self, job_id: str) -> Job:
        return await self._call(_calls.get_job(job_id))

    async def cancel(self, job_id: str) -> Job:
        return await self._call(_calls.cancel_job(job_id))

    async def list(self, *, state: str | None = None, model: str | None = None,
                   metadata: dict[str, str] | None = None, limit: int = 20,
                   after: str | None = None) -> JobList:
        return await self._call(_calls.list_jobs(state, model, metadata, limit, after))

    async def iter_jobs(self, **filters: Any) -> AsyncIterator[Job]:
        after = filters.pop("after", None)
        while True:
            page = await self.list(after=after, **filters)
            for job in page.data:
                yield job
            if (after := _calls.next_after(page)) is None:
                return

    async def stream(self, job_id: str, *,
                     last_event_id: str | None = None) -> AsyncIterator[Event]:
        session = self._open_stream(job_id, last_event_id)
        while not session.finished:
            url, headers = session.connect()
            try:
                async with self._http.stream("GET", url, headers=headers,
                                             timeout=self._stream_timeout) as resp:
                    answer = session.opened(resp)
                    if answer == "end":
                        return
                    if answer == "error":
                        await resp.aread()
                        raise APIError.from_response(resp)
                    if answer == "read":
                        async for chunk in resp.aiter_text():
                            for ev in session.feed(chunk):
                                yield ev
                            if session.finished:
                                return
            except TRANSPORT_ERRORS:
                pass
            if session.may_have_ended() and await self._job_done(job_id):
                return
            await asyncio.sleep(session.retry_in())

    async def _job_done(self, job_id: str) -> bool:
        try:
            return (await self.get(job_id)).done
        except (APIError, StreamGaveUp):
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
            raise Deadline(f"job {job_id}", timeout).error() from None
        return await self.get(job_id)

    # -- files and batches ------------------------------------------------------------

    async def upload_file(self, content: bytes | str | Path, *, purpose: str = "batch",
                          filename: str | None = None) -> FileObject:
        return await self._call(_calls.upload_file(content, purpose, filename))

    async def create_batch(self, input_file_id: str, *,
                           endpoint: str = "/v1/chat/completions",
                           metadata: dict[str, str] | None = None,
                           idempotency_key: str | None = None) -> Batch:
        return await self._call(_calls.create_batch(input_file_id, endpoint, metadata,
                                                     idempotency_key))

    async def get_batch(self, batch_id: str) -> Batch:
        return await self._call(_calls.get_batch(batch_id))

    async def cancel_batch(self, batch_id: str) -> Batch:
        return await self._call(_calls.cancel_batch(batch_id))

    async def wait_batch(self, batch_id: str, *, on_progress: ProgressFn | None = None,
                         poll_s: float = 1.0, timeout: float | None = None) -> Batch:
        watch = BatchWatch(batch_id, timeout)
        while True:
            b = await self.get_batch(batch_id)
            if on_progress is not None and watch.changed(b):
                res = on_progress(b)
                if res is not None:
                    await res
            if watch.ended(b):
                return b
            await asyncio.sleep(poll_s)

    async def submit_batch(self, requests: Path | Iterable[dict[str, Any]], *,
                           endpoint: str = "/v1/chat/completions",
                           metadata: dict[str, str] | None = None,
                           on_progress: ProgressFn | None = None, wait: bool = False) -> Batch:
        data, name = _calls.batch_input(requests, endpoint)
        f = await self.upload_file(data, filename=name)
        b = await self.create_batch(f.id, endpoint=endpoint, metadata=metadata)
        return await self.wait_batch(b.id, on_progress=on_progress) if wait else b

    async def batch_results(self, batch: Batch) -> builtins.list[dict[str, Any]]:
        call = _calls.batch_results(batch)
        return [] if call is None else await self._call(call)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: type[BaseException] | BaseException | TracebackType
                        | None) -> None:
        await self.aclose()
