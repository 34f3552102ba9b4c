"""Domain errors, one line each, and their one mapping to OpenAI's error envelope.

Every error leaves the API as {"error": {message, type, code, param}} with its HTTP
status; `install` registers the handlers.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException as StarletteHTTPException


class TokenqError(Exception):
    """Base class: a message for the client, an OpenAI error type/code and an HTTP status."""

    status = 500
    type = "server_error"
    code: str | None = "internal_error"
    # False: the answer says `x-should-retry: false`, so the OpenAI SDK does not resend a
    # request whose job already ran to a terminal failure (a poison request would otherwise
    # run once per SDK retry). None: the SDK's own rule by status.
    should_retry: bool | None = None
    # Headers the answer carries beside the envelope (a job's error: X-Tokenq-Job-Id).
    headers: dict[str, str] | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code


class InvalidRequest(TokenqError):
    """The request cannot be served as written (400)."""

    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class ContextLengthExceeded(InvalidRequest):
    """Prompt plus max_tokens does not fit the model's context (400)."""

    code = "context_length_exceeded"


class Unauthorized(TokenqError):
    """Missing or unknown API key (401)."""

    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class NotFound(TokenqError):
    """Unknown job, model or file, or another tenant's (404)."""

    status = 404
    type = "invalid_request_error"
    code = "not_found"


class ModelNotFound(NotFound):
    """The model is not served here (404)."""

    code = "model_not_found"


class Conflict(TokenqError):
    """The object is not in a state that allows this (409)."""

    status = 409
    type = "invalid_request_error"
    code = "conflict"


class IdempotencyKeyReused(TokenqError):
    """An Idempotency-Key sent again with a different body (422)."""

    status = 422
    type = "invalid_request_error"
    code = "idempotency_key_reused"


class IdempotencyInProgress(Conflict):
    """The first request with this Idempotency-Key has not finished yet (409)."""

    code = "idempotency_key_in_progress"


class QuotaExceeded(TokenqError):
    """A tenant's stored files are at its quota (403: retrying does not help; delete some)."""

    status = 403
    type = "invalid_request_error"
    code = "quota_exceeded"


class PayloadTooLarge(TokenqError):
    """Body over the configured limit (413)."""

    status = 413
    type = "invalid_request_error"
    code = "payload_too_large"


class QueueFull(TokenqError):
    """The model's queue is over its limit; retry later (429)."""

    status = 429
    type = "rate_limit_error"
    code = "queue_full"

    def __init__(self, message: str, *, retry_after: int = 1, code: str | None = None):
        super().__init__(message, code=code)
        self.retry_after = retry_after


class RateLimited(QueueFull):
    """The tenant is over its request or token rate (429)."""

    code = "rate_limit_exceeded"


class Forbidden(TokenqError):
    """A valid key without the role this route needs (403)."""

    status = 403
    type = "permission_error"
    code = "permission_denied"


class RequestTimeout(TokenqError):
    """The request body arrived too slowly (408)."""

    status = 408
    type = "invalid_request_error"
    code = "request_timeout"


class Draining(TokenqError):
    """This API replica is shutting down; retry on another (503)."""

    status = 503
    type = "service_unavailable"
    code = "draining"
    retry_after = 1


class Unavailable(TokenqError):
    """Redis is unreachable for the moment; retry (503)."""

    status = 503
    type = "service_unavailable"
    code = "unavailable"
    retry_after = 1


class BudgetUnreachable(TokenqError):
    """No pool of the model is estimated to give the first token within the request's
    `ttft_budget_ms` (503, with when to retry)."""

    status = 503
    type = "service_unavailable"
    code = "budget_unreachable"

    def __init__(self, message: str, *, retry_after: int = 1):
        super().__init__(message, param="ttft_budget_ms")
        self.retry_after = retry_after


class NotReplicated(TokenqError):
    """Durable acceptance: the job did not reach enough Redis replicas in time (503)."""

    status = 503
    type = "service_unavailable"
    code = "not_replicated"
    retry_after = 1
    should_retry = True


class JobFailed(TokenqError):
    """The job ended in `failed` for a reason on the server side (500)."""

    code = "job_failed"


class ClientClosed(TokenqError):
    """The client went away before the reply (499, nginx's status for it): nobody reads
    the answer; the access log and the API's logs show what happened, not a 500."""

    status = 499
    type = "invalid_request_error"
    code = "client_closed_request"


class JobExpired(TokenqError):
    """The job passed its deadline before it could run (408)."""

    status = 408
    type = "timeout"
    code = "expired"


log = logging.getLogger(__name__)


def envelope(status: int, message: str, type_: str, code: str | None,
             param: str | None = None, headers: dict[str, str] | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": type_, "code": code, "param": param}}
    return JSONResponse(body, status_code=status, headers=headers)


# what pydantic puts in an error's location for the branch of a union it tried
TYPE_TAGS = frozenset({"str", "int", "float", "bool", "none", "dict", "list", "bytes"})


def _param(loc: tuple[Any, ...]) -> str | None:
    """The request field a location names, as OpenAI's `param` does: `stop`, not
    `body.stop.str` (a union's branch) nor `tool_choice.literal['none',...]`."""
    parts: list[str] = []
    for p in loc:
        s = str(p)
        if not parts and s in ("body", "query", "path", "header"):
            continue
        if not isinstance(p, int) and (s in TYPE_TAGS or "[" in s or s[:1].isupper()):
            break
        parts.append(s)
    return ".".join(parts) or None


def _where(e: Any) -> str | None:
    """An error's param: the field its validator names (a model's own check), else its
    location's."""
    named = (e.get("ctx") or {}).get("param")
    return str(named) if named else _param(tuple(e.get("loc", ())))


def _message(errs: Sequence[Any]) -> str:
    """Up to five errors, each once, as `param: what` (no pydantic 'Value error, ')."""
    out: list[str] = []
    for e in errs[:5]:
        msg = str(e.get("msg", "")).removeprefix("Value error, ")
        where = _where(e)
        line = msg if where is None or msg.startswith(f"{where}:") else f"{where}: {msg}"
        if line not in out:
            out.append(line)
    return "; ".join(out)


def install(app: FastAPI) -> None:
    @app.exception_handler(TokenqError)
    async def _domain(_: Request, exc: TokenqError) -> JSONResponse:
        retry_after = getattr(exc, "retry_after", None)
        headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
        if exc.should_retry is not None:
            headers["x-should-retry"] = "true" if exc.should_retry else "false"
        headers.update(exc.headers or {})
        if isinstance(exc, PayloadTooLarge | RequestTimeout):
            headers["Connection"] = "close"  # the rest of the body is not read (api/limits.py)
        return envelope(exc.status, exc.message, exc.type, exc.code, exc.param, headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errs = exc.errors()
        first = errs[0] if errs else {}
        if first.get("type") == "json_invalid":
            return envelope(400, "the request body is not valid JSON", "invalid_request_error",
                            "invalid_json")
        return envelope(400, _message(errs), "invalid_request_error", "invalid_request",
                        _where(first) if errs else None)

    @app.exception_handler(ValidationError)
    async def _model(_: Request, exc: ValidationError) -> JSONResponse:
        # A model built from the body inside a handler (an OpenAI request's native job, a
        # batch line): still the client's input, so 400, never a 500.
        errs = exc.errors()
        return envelope(400, _message(errs) or "invalid request", "invalid_request_error",
                        "invalid_request", _where(errs[0]) if errs else None)

    @app.exception_handler(RecursionError)
    async def _nested(_: Request, __: RecursionError) -> JSONResponse:
        return envelope(400, "the request is nested too deeply", "invalid_request_error",
                        "invalid_request")

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        type_ = "invalid_request_error" if exc.status_code < 500 else "server_error"
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        if exc.status_code == 400 and exc.detail == "There was an error parsing the body":
            # FastAPI's words for a body json.loads refused past its own checks (bytes
            # that are not UTF-8, nesting past the parser's depth): still bad JSON
            return envelope(400, "the request body is not valid JSON (UTF-8, nested at "
                            "most a few hundred deep)", type_, "invalid_json")
        return envelope(exc.status_code, str(exc.detail), type_, code)

    @app.exception_handler(RedisError)
    async def _redis(_: Request, exc: RedisError) -> JSONResponse:
        # Redis restarting or unreachable: a retryable 503, not a 500.
        log.warning("redis unavailable: %s", exc)
        return envelope(503, "the job store is unavailable for the moment; retry",
                        "service_unavailable", "unavailable", headers={"Retry-After": "1"})

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return envelope(500, "internal error", "server_error", "internal_error")
