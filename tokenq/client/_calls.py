"""Each endpoint as a `Call`: the request to make and how its answer reads, built the same
for both clients (no network here; the clients send the call and hand its answer to
`decode`). Batch input encoding too."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import httpx
from pydantic import BaseModel

from tokenq.client._core import new_idempotency_key
from tokenq.client.models import Batch, FileObject, Job, JobList

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One request (`kwargs` go to httpx's `request`) and the decoder of its answer."""

    method: str
    path: str
    decode: Callable[[httpx.Response], T]
    kwargs: dict[str, Any] = field(default_factory=dict)


def _as(model: type[M]) -> Callable[[httpx.Response], M]:
    def decode(resp: httpx.Response) -> M:
        return model.model_validate(resp.json())
    return decode


def _jsonl(resp: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(line) for line in resp.text.splitlines() if line.strip()]


def job_body(model: str, prompt: str | None, messages: list[dict[str, Any]] | None,
             params: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, **{k: v for k, v in params.items()
                                               if v is not None}}
    if prompt is not None:
        body["prompt"] = prompt
    if messages is not None:
        body["messages"] = messages
    return body


def submit(model: str, prompt: str | None, messages: list[dict[str, Any]] | None,
           idempotency_key: str | None, params: dict[str, Any]) -> Call[Job]:
    """Every submit carries an Idempotency-Key (one is made up when not given), so a retry
    after a lost answer returns the same job."""
    key = idempotency_key or new_idempotency_key()
    return Call("POST", "/v1/jobs", _as(Job), {
        "json": job_body(model, prompt, messages, params),
        "headers": {"Idempotency-Key": key}})


def get_job(job_id: str) -> Call[Job]:
    return Call("GET", f"/v1/jobs/{job_id}", _as(Job))


def cancel_job(job_id: str) -> Call[Job]:
    return Call("DELETE", f"/v1/jobs/{job_id}", _as(Job))


def list_params(state: str | None, model: str | None, metadata: dict[str, str] | None,
                limit: int, after: str | None) -> dict[str, str]:
    q: dict[str, str] = {"limit": str(limit)}
    if state:
        q["state"] = state
    if model:
        q["model"] = model
    if after:
        q["after"] = after
    for k, v in (metadata or {}).items():
        q[f"metadata[{k}]"] = v
    return q


def list_jobs(state: str | None, model: str | None, metadata: dict[str, str] | None,
              limit: int, after: str | None) -> Call[JobList]:
    return Call("GET", "/v1/jobs", _as(JobList),
                {"params": list_params(state, model, metadata, limit, after)})


def next_after(page: JobList) -> str | None:
    """The `after` of the page that follows this one; None on the last page."""
    return page.last_id if page.has_more else None


def upload_file(content: bytes | str | Path, purpose: str,
                filename: str | None) -> Call[FileObject]:
    if isinstance(content, Path):
        filename, content = filename or content.name, content.read_bytes()
    data = content.encode() if isinstance(content, str) else content
    return Call("POST", "/v1/files", _as(FileObject), {
        "data": {"purpose": purpose}, "files": {"file": (filename or "input.jsonl", data)}})


def create_batch(input_file_id: str, endpoint: str, metadata: dict[str, str] | None,
                 idempotency_key: str | None) -> Call[Batch]:
    body = {"input_file_id": input_file_id, "endpoint": endpoint,
            "completion_window": "24h", "metadata": metadata}
    key = idempotency_key or new_idempotency_key()
    return Call("POST", "/v1/batches", _as(Batch),
                {"json": body, "headers": {"Idempotency-Key": key}})


def get_batch(batch_id: str) -> Call[Batch]:
    return Call("GET", f"/v1/batches/{batch_id}", _as(Batch))


def cancel_batch(batch_id: str) -> Call[Batch]:
    return Call("POST", f"/v1/batches/{batch_id}/cancel", _as(Batch))


def batch_results(batch: Batch) -> Call[list[dict[str, Any]]] | None:
    """The output file's lines, parsed; None when the batch has no output file."""
    if batch.output_file_id is None:
        return None
    return Call("GET", f"/v1/files/{batch.output_file_id}/content", _jsonl)


def encode_lines(requests: Iterable[dict[str, Any]], endpoint: str) -> bytes:
    """Request bodies -> the Batch API's JSONL (custom_id, method, url, body). A dict that
    already has `body` is taken as a whole line."""
    lines = []
    for n, req in enumerate(requests):
        line = req if "body" in req else {"custom_id": f"request-{n}", "method": "POST",
                                          "url": endpoint, "body": req}
        lines.append(json.dumps(line, ensure_ascii=False))
    return ("\n".join(lines) + "\n").encode()


def batch_input(requests: Path | Iterable[dict[str, Any]],
                endpoint: str) -> tuple[bytes, str]:
    """A batch's input file: its bytes and its name."""
    if isinstance(requests, Path):
        return requests.read_bytes(), requests.name
    return encode_lines(requests, endpoint), "batch.jsonl"

