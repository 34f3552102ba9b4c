"""A request body read, parsed and validated as a dependency: a large one on the CPU pool,
in its tenant's share, after the key is checked.

FastAPI parses and validates a body on the event loop. A valid 945 kB chat of 27,000
one-word messages takes 0.1-0.2 s of it here (json.loads, then pydantic over every
message), so sixteen at once stood every other tenant's stream and request still for
1.3-1.9 s; and the tenant's `cpu_busy` 429 came only after its bodies were parsed. A body
over INLINE_BODY_BYTES now goes to the pool: one parse still holds the GIL for its C calls,
but the loop gets its turn between them, and a tenant's flood waits in its own queue.

Errors are FastAPI's: the app's handler answers them in OpenAI's envelope (api/errors.py).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from tokenq.api.deps import StateDep, TenantDep

INLINE_BODY_BYTES = 64 * 1024

M = TypeVar("M", bound=BaseModel)


def parsed(model: type[M]) -> Callable[..., Awaitable[M]]:
    """A dependency giving the request's body as `model`."""

    async def body(request: Request, state: StateDep, tenant: TenantDep) -> M:
        raw = await request.body()
        if len(raw) <= INLINE_BODY_BYTES:
            return parse(model, raw)
        return await state.counter.pool.run(tenant, parse, model, raw)

    return body


def parse(model: type[M], raw: bytes) -> M:
    """`raw` as `model`; raises RequestValidationError as FastAPI's own parse does."""
    if not raw.strip():
        raise RequestValidationError([{"type": "missing", "loc": ("body",),
                                       "msg": "Field required", "input": None}])
    try:
        obj: Any = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise RequestValidationError([{
            "type": "json_invalid", "loc": ("body", getattr(exc, "pos", 0)),
            "msg": "JSON decode error", "input": {}, "ctx": {"error": str(exc)}}]) from None
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])}
                                      for e in exc.errors()]) from None
